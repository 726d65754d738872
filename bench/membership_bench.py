"""Benchmark: what one membership change costs the REAL gateway (smg 1.13) at the prod fleet's size.

    PYTHONPATH=. .venv/bin/python bench/membership_bench.py [--workers 2048] [--changes 100] [--json]

One ``python -m smg.launch_router`` with the prod stack's rendered flags (listeners on loopback free ports; the first
two simulated workers as its ``--worker-urls``: ``power_of_two`` refuses to start with fewer) in front of
``--workers`` SIMULATED SGLang workers (``serving.sandbox.worker_host``, 256 per process: no GPU here). Router CPU is
read from ``/proc/<pid>/stat`` (user + system); each figure is the router's CPU over its span minus what it spends
meanwhile anyway (its health checks and load polls of the fleet: the steady rate, measured first) and minus the
bench's own status reads during the span (each read's cost measured too):

* register the fleet: ``POST /workers`` for every other worker at once, until ``GET /workers`` lists all of them
  healthy: router CPU (with the health checks of the workers registered so far) and wall time;
* one removal: ``DELETE /workers/{id}`` of ``--changes`` workers at once, until each answers 404 (drained, then
  removed from the registry after ``drain_settle_secs``): router CPU per removal, and the wall time;
* one addition: the same workers added back at once, until each answers ready and healthy with no job left: router
  CPU per addition, and the wall time;
* a read: ``GET /workers`` (the whole list) and ``GET /workers/{id}`` (one worker or its job's status): router CPU
  and wall time per read, and the list's size.

sglang-router 0.3.2's figures (docs/scale.md: one router, 2,048 workers, the same 100 changes at once; no longer installed):
71 ms per removal, 76 ms per addition, 86 s of CPU to register 2,048 workers, 209 ms in its handler per list.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bench.smg_fleet import STATIC, start_fleet
from serving.router.client import RouterClient, WorkerInfo
from serving.sandbox.processes import StateDir, cpu_seconds, stop_all

POLL_S = 1.0  # between two rounds of status reads while waiting for a change
STEADY_S = 20.0  # the window the steady rate is measured over
READS = 200  # job-status reads timed
LISTS = 10  # full lists timed
CONCURRENCY = 64  # requests the bench has in flight at once
OLD = {"removal_ms": 71.0, "addition_ms": 76.0, "register_cpu_s": 86.0, "list_ms": 209.0}  # sglang-router 0.3.2


class Router:
    """The router process: its client, and its CPU time."""

    def __init__(self, client: RouterClient, pid: int) -> None:
        self.client = client
        self.pid = pid

    def cpu(self) -> float:
        return cpu_seconds(self.pid)


async def bounded(calls: list[Callable[[], Awaitable[Any]]]) -> list[Any]:
    """Run ``calls`` with at most :data:`CONCURRENCY` in flight; their results in order."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(call: Callable[[], Awaitable[Any]]) -> Any:
        async with gate:
            return await call()

    return await asyncio.gather(*(one(c) for c in calls))


async def until(
    router: Router, ids: list[str], done: Callable[[WorkerInfo | None], bool], timeout_s: float
) -> tuple[float, int]:
    """Poll each worker's ``GET /workers/{id}`` every :data:`POLL_S` until ``done`` holds for all; (seconds, reads)."""
    started, reads, left = time.monotonic(), 0, list(ids)
    while left:
        answers = await bounded([lambda i=i: router.client.get_worker(i) for i in left])
        reads += len(left)
        left = [i for i, w in zip(left, answers, strict=True) if not done(w)]
        if left and time.monotonic() - started > timeout_s:
            raise TimeoutError(f"{len(left)} workers not done after {timeout_s:g} s: {left[:4]}")
        if left:
            await asyncio.sleep(POLL_S)
    return time.monotonic() - started, reads


def _ready(w: WorkerInfo | None) -> bool:
    return w is not None and w.status == "ready" and w.is_healthy and w.job_status is None


async def measure(router: Router, urls: list[str], changes: int) -> dict[str, Any]:
    c = router.client
    out: dict[str, Any] = {"workers": len(urls), "changes": changes}

    # register the fleet (all but the static workers)
    cpu0, t0 = router.cpu(), time.monotonic()
    await bounded([lambda u=u: c.add_worker(u) for u in urls[STATIC:]])
    while sum(w.is_healthy for w in await c.list_workers()) < len(urls):
        if time.monotonic() - t0 > 1800:
            raise TimeoutError("the fleet did not register within 30 min")
        await asyncio.sleep(2.0)
    out["register"] = {"wall_s": round(time.monotonic() - t0, 1), "router_cpu_s": round(router.cpu() - cpu0, 1)}

    # steady state with the fleet registered
    await asyncio.sleep(5.0)
    cpu0, t0 = router.cpu(), time.monotonic()
    await asyncio.sleep(STEADY_S)
    steady = (router.cpu() - cpu0) / (time.monotonic() - t0)
    out["steady_cores"] = round(steady, 4)

    # reads
    workers = await c.list_workers()
    cpu0, t0 = router.cpu(), time.monotonic()
    for w in workers[:READS]:
        await c.get_worker(w.id)
    span = time.monotonic() - t0
    read_cpu = max(0.0, (router.cpu() - cpu0 - steady * span) / READS)
    out["job_status_read"] = {"router_cpu_ms": round(1000 * read_cpu, 3), "wall_ms": round(1000 * span / READS, 2)}
    async with httpx.AsyncClient(timeout=60) as raw:
        size = len((await raw.get(c.base_url + "/workers")).content)
    cpu0, t0 = router.cpu(), time.monotonic()
    for _ in range(LISTS):
        await c.list_workers()
    span = time.monotonic() - t0
    list_cpu = max(0.0, (router.cpu() - cpu0 - steady * span) / LISTS)
    out["list_read"] = {
        "router_cpu_ms": round(1000 * list_cpu, 1),
        "wall_ms": round(1000 * span / LISTS, 1),
        "bytes": size,
    }

    # removals, then the same workers added back
    chosen = [w for w in workers if w.url in set(urls[STATIC:])][:changes]
    cpu0 = router.cpu()
    await bounded([lambda w=w: c.remove_worker(w.id) for w in chosen])
    wall, reads = await until(router, [w.id for w in chosen], lambda w: w is None, 120)
    spent = router.cpu() - cpu0 - steady * wall - reads * read_cpu
    out["removal"] = {"router_cpu_ms": round(1000 * spent / changes, 2), "wall_s": round(wall, 2)}

    cpu0 = router.cpu()
    ids = await bounded([lambda w=w: c.add_worker(w.url) for w in chosen])
    wall, reads = await until(router, ids, _ready, 300)
    spent = router.cpu() - cpu0 - steady * wall - reads * read_cpu
    out["addition"] = {"router_cpu_ms": round(1000 * spent / changes, 2), "wall_s": round(wall, 2)}
    return out


def table(r: dict[str, Any]) -> str:
    """The figures beside sglang-router 0.3.2's, as docs/rollout.md carries them."""
    rows = [
        ("CPU per removal", f"{OLD['removal_ms']:g} ms", f"{r['removal']['router_cpu_ms']:g} ms"),
        ("CPU per addition", f"{OLD['addition_ms']:g} ms", f"{r['addition']['router_cpu_ms']:g} ms"),
        (
            f"{r['changes']} changes at once, until done",
            "9.5 s out, 11.3 s back",
            f"{r['removal']['wall_s']:g} s out (with the 5 s drain), {r['addition']['wall_s']:g} s back",
        ),
        (
            f"register {r['workers']:,} workers",
            f"{OLD['register_cpu_s']:g} s CPU",
            f"{r['register']['router_cpu_s']:g} s CPU, {r['register']['wall_s']:g} s wall",
        ),
        (
            "one `GET /workers` (the list)",
            f"{OLD['list_ms']:g} ms in its handler",
            f"{r['list_read']['router_cpu_ms']:g} ms CPU, {r['list_read']['wall_ms']:g} ms wall, "
            f"{r['list_read']['bytes'] / 1e6:.1f} MB",
        ),
        (
            "one `GET /workers/{id}` (a job status)",
            "no such read",
            f"{r['job_status_read']['router_cpu_ms']:g} ms CPU, {r['job_status_read']['wall_ms']:g} ms wall",
        ),
        ("steady state (health checks, load polls)", "5 % of a core", f"{100 * r['steady_cores']:.1f} % of a core"),
    ]
    lines = [f"| at {r['workers']:,} workers, one router | sglang-router 0.3.2 (2,048) | smg 1.13.0 |", "|---|---|---|"]
    return "\n".join([*lines, *(f"| {a} | {b} | {c} |" for a, b, c in rows)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--workers", type=int, default=2048)
    parser.add_argument("--changes", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.workers < STATIC + args.changes:
        parser.error(f"--workers {args.workers}: need at least {STATIC} static workers + --changes {args.changes}")
    with tempfile.TemporaryDirectory(prefix="membership-bench-") as tmp:
        state = StateDir(Path(tmp) / "state")
        try:
            configs, _, record = start_fleet(state, args.workers)

            async def run() -> dict[str, Any]:
                async with RouterClient(record.url, record.metrics_url, timeout_s=60) as client:
                    return await measure(Router(client, record.pid), [c.url for c in configs], args.changes)

            result = asyncio.run(run())
        finally:
            stop_all(state)
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
