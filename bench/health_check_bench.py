"""Benchmark: how fast the REAL gateway (smg 1.13) marks hung workers unhealthy when many hang at once.

    PYTHONPATH=. .venv/bin/python bench/health_check_bench.py [--workers 2048] [--hung 0.10] [--json]

smg keeps at most 128 health checks in flight per router and a hung worker (its connection accepted, no answer) holds
one for the whole timeout (``serving.plan.planner.ROUTER_PROBES_IN_FLIGHT``): the plan says how many may hang at once
before the checks queue (prod: 128 × 5 s / 3 s = 213, 10.4 % of 2,048) and how long detection takes below that
(3 misses × 5 s + the last probe's 3 s timeout = 18 s). This bench measures both on the real binary.

One router with the prod stack's flags in front of ``--workers`` SIMULATED SGLang workers (``bench/smg_fleet.py``),
all registered and healthy; then ``--hung`` of them (spread evenly over the fleet) hang at once: their worker host
stops them (the port closes) and the bench listens on each port at once with a server that accepts every connection
and never answers. The bench reads ``GET /workers`` every :data:`POLL_S` and records, for each hung worker, when the
router first showed it unhealthy or removed; healthy workers the router marked unhealthy are counted too (a check
that waited past its own timeout in the queue). It stops when every hung worker is detected or after
:data:`LIMIT_S`. Figures: detected within the plan's detection time, P50 / P90 / max detection time, not detected.
The detection times are upper bounds by up to one poll.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.smg_fleet import STATIC, register_all, start_fleet
from serving.plan.loader import load_fleet
from serving.router.client import RouterClient
from serving.sandbox.processes import StateDir, stop_all
from serving.sandbox.worker_host import STOP_PATH, control
from serving.spec.stack import load_stack

POLL_S = 1.0  # between two reads of the router's worker list
LIMIT_S = 120.0  # the longest the bench waits for detection
CONCURRENCY = 64  # registrations in flight at once


class Hung(asyncio.Protocol):
    """A hung server: every connection is accepted and whatever arrives is read; nothing is ever answered."""

    def data_received(self, data: bytes) -> None:
        pass


async def measure(
    router: RouterClient, urls: list[str], host_of: dict[int, str], hung: list[str], plan_s: float
) -> dict[str, Any]:
    await register_all(router, urls, timeout_s=600, concurrency=CONCURRENCY)
    await asyncio.sleep(10.0)  # a few rounds of checks with every worker healthy

    ports = [int(u.rsplit(":", 1)[1]) for u in hung]
    by_host: dict[str, list[int]] = {}
    for port in ports:
        by_host.setdefault(host_of[port], []).append(port)
    started = time.monotonic()
    await asyncio.gather(
        *(control(h, STOP_PATH, {"ports": p, "stop_timeout_s": 0}, timeout_s=60) for h, p in by_host.items())
    )
    loop = asyncio.get_running_loop()
    servers = [await loop.create_server(Hung, "127.0.0.1", port) for port in ports]
    switched = time.monotonic() - started
    detected: dict[str, float] = {}
    false_out: set[str] = set()
    reads = 0
    try:
        while len(detected) < len(hung) and time.monotonic() - started < LIMIT_S:
            await asyncio.sleep(POLL_S)
            workers = {w.url: w for w in await router.list_workers()}
            reads += 1
            now = time.monotonic() - started
            for url in hung:
                w = workers.get(url)
                if url not in detected and (w is None or not w.is_healthy):
                    detected[url] = now
            false_out |= {u for u, w in workers.items() if u not in set(hung) and not w.is_healthy}
    finally:
        for server in servers:
            server.close()
    times = sorted(detected.values())

    def q(p: float) -> float | None:
        return round(times[min(len(times) - 1, math.ceil(p * len(times)) - 1)], 1) if times else None

    return {
        "workers": len(urls),
        "hung": len(hung),
        "switch_s": round(switched, 2),
        "detected": len(times),
        "within_plan": sum(t <= plan_s for t in times),
        "not_detected": len(hung) - len(times),
        "p50_s": q(0.5),
        "p90_s": q(0.9),
        "max_s": q(1.0),
        "healthy_marked_unhealthy": len(false_out),
        "reads": reads,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--workers", type=int, default=2048)
    parser.add_argument("--hung", type=float, default=0.10, help="the share of the workers that hang at once")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not 0 < args.hung < 1:
        parser.error(f"--hung {args.hung}: a share in (0, 1), e.g. 0.10 for 10 %")
    fleet = load_fleet("prod", load_stack("prod").spec)
    hb = fleet.plan.heartbeats
    with tempfile.TemporaryDirectory(prefix="health-check-bench-") as tmp:
        state = StateDir(Path(tmp) / "state")
        try:
            configs, hosts, record = start_fleet(state, args.workers)
            host_of = {port: h.url for h in hosts for port in h.ports}
            count = max(1, round(args.hung * args.workers))
            hung = [configs[STATIC + i * (args.workers - STATIC) // count].url for i in range(count)]

            async def run() -> dict[str, Any]:
                async with RouterClient(record.url, record.metrics_url, timeout_s=60) as client:
                    return await measure(client, [c.url for c in configs], host_of, hung, hb.failure_detection_s.value)

            result = asyncio.run(run())
        finally:
            stop_all(state)
    result["plan_detection_s"] = hb.failure_detection_s.value
    result["plan_hung_capacity"] = hb.router_hung_capacity.value
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 0


def table(r: dict[str, Any]) -> str:
    return "\n".join(
        [
            "| workers | hung (plan holds) | detected (within the plan's time) | P50 / P90 / max | not detected | "
            "healthy marked unhealthy |",
            "|---|---|---|---|---|---|",
            f"| {r['workers']:,} | {r['hung']:,} ({r['plan_hung_capacity']:,}) | {r['detected']:,} ({r['within_plan']:,}) | "
            f"{r['p50_s']} / {r['p90_s']} / {r['max_s']} s (plan: {r['plan_detection_s']:g} s) | {r['not_detected']:,} "
            f"| {r['healthy_marked_unhealthy']:,} |",
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
