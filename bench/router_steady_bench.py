"""Benchmark: the REAL gateway's (smg 1.13) steady-state CPU at the prod fleet's size, load monitoring on and off.

    PYTHONPATH=. .venv/bin/python bench/router_steady_bench.py [--workers 2048] [--json]

One ``python -m smg.launch_router`` in front of ``--workers`` SIMULATED SGLang workers (``bench/smg_fleet.py``), the
fleet registered, then the router's CPU (``/proc/<pid>/stat``) and the health checks it made (its own counter,
``smg_worker_health_checks_total``) over :data:`STEADY_S` with nothing else asked of it, its resident memory at the
end (what :data:`serving.sandbox.scale.ROUTER_MIB` models), and the workers' side: the worker hosts' CPU and the
requests they served (the router's ``/health`` checks and ``/v1/loads`` polls, as each host counts them), in up to
three runs (``--variants``):

* **on**: the prod stack's rendered flags: a health check of every worker every heartbeat, and ``power_of_two``'s
  ``/v1/loads`` poll of every worker every heartbeat (``--load-monitor-interval``);
* **off**: the same with ``--policy round_robin`` and ``--disable-worker-overload-protection``: nothing reads the
  loads, so with ``--disable-load-monitoring`` (rendered always) smg polls none; the health checks alone;
* **generating**: the prod flags in front of workers whose ``/health`` runs a generation (SGLang's default,
  ``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=true``: at least one 1 s poll), which the servers are rendered without.

This machine's speed against the reference machine (docs/scale.md) is measured as ``exaserve sandbox up`` measures it
(:func:`serving.sandbox.capacity.measure_costs`: an agent's probe), and the figures are given per worker on the
reference machine too (what :data:`serving.sandbox.capacity.REFERENCE_ROUTER_CORES_PER_WORKER` holds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.smg_fleet import STATIC, register_all, start_fleet
from serving.router.client import RouterClient
from serving.sandbox.capacity import measure_costs
from serving.sandbox.processes import StateDir, cpu_seconds, rss_mib, stop_all
from serving.sandbox.worker_host import request_counts
from serving.spec.stack import load_stack

STEADY_S = 30.0  # the window the steady rate is measured over
SETTLE_S = 10.0  # after the last registration: two health-check rounds and load polls at the prod heartbeat
VARIANTS: dict[str, tuple[dict[str, str], tuple[str, ...], bool]] = {
    "on": ({}, (), False),
    "off": ({"--policy": "round_robin"}, ("--disable-worker-overload-protection",), False),
    "generating": ({}, (), True),
}


async def health_checks(router: RouterClient) -> float:
    """The router's health checks so far, every result and worker type summed."""
    return (await router.metrics()).value("smg_worker_health_checks_total")


@dataclass(frozen=True)
class Steady:
    """One variant's window: the router's cores, its own health-check count a second, its resident memory at the end,
    the worker hosts' cores (what answering the router costs the workers' side) and what the workers served a second
    (``METHOD PATH CLIENT`` → rate: the router sends no User-Agent, ``-``)."""

    cores: float
    health_checks_per_s: float
    rss_mib: float
    host_cores: float
    served_per_s: dict[str, float]


def steady(workers: int, variant: str) -> Steady:
    """The router in front of ``workers`` registered and healthy workers over :data:`STEADY_S`, for ``variant``."""
    overrides, extra, generation = VARIANTS[variant]
    with tempfile.TemporaryDirectory(prefix="router-steady-bench-") as tmp:
        state = StateDir(Path(tmp) / "state")
        try:
            configs, hosts, record = start_fleet(state, workers, overrides, extra, generation)

            def host_cpu() -> float:
                return sum(cpu_seconds(h.pid) for h in hosts)

            async def run() -> Steady:
                async with RouterClient(record.url, record.metrics_url, timeout_s=60) as client:
                    await register_all(client, [c.url for c in configs])
                    await asyncio.sleep(SETTLE_S)
                    checks0, served0 = await health_checks(client), await request_counts(hosts)
                    cpu0, hosts0, t0 = cpu_seconds(record.pid), host_cpu(), time.monotonic()
                    await asyncio.sleep(STEADY_S)
                    cpu1, hosts1, span = cpu_seconds(record.pid), host_cpu(), time.monotonic() - t0
                    checks1, served1 = await health_checks(client), await request_counts(hosts)
                return Steady(
                    cores=(cpu1 - cpu0) / span,
                    health_checks_per_s=(checks1 - checks0) / span,
                    rss_mib=rss_mib(record.pid),
                    host_cores=(hosts1 - hosts0) / span,
                    served_per_s={
                        k: (n - served0.get(k, 0)) / span for k, n in served1.items() if n > served0.get(k, 0)
                    },
                )

            return asyncio.run(run())
        finally:
            stop_all(state)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--workers", type=int, default=2048)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.workers <= STATIC:
        parser.error(f"--workers {args.workers}: need more than the {STATIC} the router starts with")
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(chosen) - set(VARIANTS))
    if unknown or not chosen:
        parser.error(
            f"--variants {args.variants!r}: {', '.join(unknown) or 'none given'}; use some of {', '.join(VARIANTS)}"
        )
    speed = measure_costs().speed
    runs = {variant: steady(args.workers, variant) for variant in chosen}
    interval = load_stack("prod").spec.serving.heartbeat_interval_s  # rendered as --health-check-interval-secs
    out: dict[str, Any] = {
        "workers": args.workers,
        "speed": round(speed, 3),
        "health_checks_due_per_s": args.workers / interval,
        "variants": {
            k: {
                "cores": round(v.cores, 4),
                "reference_cores_per_worker": v.cores / speed / args.workers,
                "health_checks_per_s": round(v.health_checks_per_s, 1),
                "rss_mib": round(v.rss_mib, 1),
                "worker_host_cores": round(v.host_cores, 4),
                "served_per_s": {p: round(r, 1) for p, r in sorted(v.served_per_s.items(), key=lambda kv: -kv[1])},
            }
            for k, v in runs.items()
        },
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(
            f"| one smg 1.13.0 router, {args.workers:,} workers | router cores | health checks/s (due "
            f"{args.workers / interval:g}) | router RSS | worker hosts' cores | served /v1/loads/s, /health/s |"
        )
        print("|---|---|---|---|---|---|")
        for k, v in runs.items():
            loads = sum(r for p, r in v.served_per_s.items() if p.startswith("GET /v1/loads "))
            health = sum(r for p, r in v.served_per_s.items() if p.startswith("GET /health "))
            print(
                f"| {k} | {v.cores:.3f} | {v.health_checks_per_s:.1f} | {v.rss_mib:.0f} MiB | {v.host_cores:.3f} | "
                f"{loads:.1f}, {health:.1f} |"
            )
        print(f"this machine's speed against the reference: {speed:.2f} ×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
