"""One REAL smg router (the prod stack's rendered flags, listeners on loopback) in front of many SIMULATED SGLang
workers (``serving.sandbox.worker_host``, :data:`~serving.sandbox.scale.WORKERS_PER_PROCESS` a process: no GPU here),
for the benches that measure smg itself at the prod fleet's size."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from serving.plan.loader import load_fleet
from serving.render.router import ROUTER_ENTRY, router_args
from serving.router.client import RouterClient
from serving.sandbox.backend import served_health
from serving.sandbox.processes import ProcessRecord, StateDir, free_port, free_port_block, free_ports, start_router
from serving.sandbox.scale import WORKERS_PER_PROCESS
from serving.sandbox.worker_config import WorkerConfig
from serving.sandbox.worker_host import start_host
from serving.sglang_health import HEALTH_ENDPOINT_GENERATION
from serving.spec.stack import load_stack

STATIC = 2  # --worker-urls the router starts with (power_of_two's minimum)


def start_fleet(
    state: StateDir,
    workers: int,
    overrides: Mapping[str, str] | None = None,
    extra: Sequence[str] = (),
    generation: bool = HEALTH_ENDPOINT_GENERATION,
) -> tuple[list[WorkerConfig], list[ProcessRecord], ProcessRecord]:
    """``workers`` simulated workers on a free block of ports, and one router with the prod stack's flags that knows
    the first :data:`STATIC` of them: (the workers' configs, their hosts' records, the router's record). The caller
    registers the rest and stops everything (``stop_all(state)``). ``overrides``: rendered flags given other values;
    ``extra``: flags added (smg's parser checks them at start). The workers' ``/health`` is the servers' as rendered
    (no generation: ``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false``), or SGLang's default with ``generation``."""
    fleet = load_fleet("prod", load_stack("prod").spec)
    base = free_port_block(workers)
    health = {**served_health(fleet.spec), "health_generation": generation}
    configs = [WorkerConfig(port=base + i, seed=i, **health) for i in range(workers)]
    hosts = [
        start_host(state, start // WORKERS_PER_PROCESS, configs[start : start + WORKERS_PER_PROCESS], free_port(),
                   timeout_s=120)
        for start in range(0, workers, WORKERS_PER_PROCESS)
    ]  # fmt: skip
    flags = router_args(fleet, worker_urls=[c.url for c in configs[:STATIC]]).to_argv()[len(ROUTER_ENTRY) :]
    port, metrics_port = free_ports(2)
    for flag, value in (("--host", "127.0.0.1"), ("--port", str(port)), ("--prometheus-host", "127.0.0.1"),
                        ("--prometheus-port", str(metrics_port)), *(overrides or {}).items()):  # fmt: skip
        flags[flags.index(flag) + 1] = value
    return configs, hosts, start_router(state, [*flags, *extra], healthy_workers=STATIC, timeout_s=120)


async def register_all(client: RouterClient, urls: list[str], timeout_s: float = 900.0, concurrency: int = 64) -> None:
    """``POST /workers`` for every worker but the :data:`STATIC` ones the router started with, ``concurrency`` at
    once, then wait until the router lists all of ``urls`` healthy (raises :class:`TimeoutError` after ``timeout_s``)."""
    gate = asyncio.Semaphore(concurrency)

    async def add(url: str) -> None:
        async with gate:
            await client.add_worker(url)

    await asyncio.gather(*(add(u) for u in urls[STATIC:]))
    started = time.monotonic()
    while sum(w.is_healthy for w in await client.list_workers()) < len(urls):
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"the fleet did not register within {timeout_s:g} s")
        await asyncio.sleep(2.0)
