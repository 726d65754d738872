"""Benchmark: the REAL gateway's (smg 1.13) steady-state CPU at the prod fleet's size, load monitoring on and off.

    PYTHONPATH=. .venv/bin/python bench/router_steady_bench.py [--workers 2048] [--json]

One ``python -m smg.launch_router`` in front of ``--workers`` SIMULATED SGLang workers (``bench/smg_fleet.py``), the
fleet registered, then the router's CPU (``/proc/<pid>/stat``) and the health checks it made (its own counter,
``smg_worker_health_checks_total``) over :data:`STEADY_S` with nothing else asked of it, in three runs:

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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.smg_fleet import STATIC, register_all, start_fleet
from serving.router.client import RouterClient
from serving.sandbox.capacity import measure_costs
from serving.sandbox.processes import StateDir, cpu_seconds, stop_all
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


def steady(workers: int, variant: str) -> tuple[float, float]:
    """(the router's cores, its health checks a second) over :data:`STEADY_S` with ``workers`` registered and
    healthy, for ``variant``."""
    overrides, extra, generation = VARIANTS[variant]
    with tempfile.TemporaryDirectory(prefix="router-steady-bench-") as tmp:
        state = StateDir(Path(tmp) / "state")
        try:
            configs, _, record = start_fleet(state, workers, overrides, extra, generation)

            async def run() -> tuple[float, float]:
                async with RouterClient(record.url, record.metrics_url, timeout_s=60) as client:
                    await register_all(client, [c.url for c in configs])
                    await asyncio.sleep(SETTLE_S)
                    checks0, cpu0, t0 = await health_checks(client), cpu_seconds(record.pid), time.monotonic()
                    await asyncio.sleep(STEADY_S)
                    span = time.monotonic() - t0
                    cores = (cpu_seconds(record.pid) - cpu0) / span
                    return cores, (await health_checks(client) - checks0) / span

            return asyncio.run(run())
        finally:
            stop_all(state)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--workers", type=int, default=2048)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.workers <= STATIC:
        parser.error(f"--workers {args.workers}: need more than the {STATIC} the router starts with")
    speed = measure_costs().speed
    runs = {variant: steady(args.workers, variant) for variant in VARIANTS}
    cores = {k: v[0] for k, v in runs.items()}
    interval = load_stack("prod").spec.serving.heartbeat_interval_s  # rendered as --health-check-interval-secs
    out: dict[str, Any] = {
        "workers": args.workers,
        "speed": round(speed, 3),
        "cores": {k: round(v, 4) for k, v in cores.items()},
        "health_checks_per_s": {k: round(v[1], 1) for k, v in runs.items()},
        "health_checks_due_per_s": args.workers / interval,
        "reference_cores_per_worker": {k: v / speed / args.workers for k, v in cores.items()},
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(
            f"| one smg 1.13.0 router, {args.workers:,} workers | cores | health checks/s (due {args.workers / interval:g}) |"
        )
        print("|---|---|---|")
        for k, (c, rate) in runs.items():
            print(f"| {k} | {c:.3f} | {rate:.1f} |")
        print(f"this machine's speed against the reference: {speed:.2f} ×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
