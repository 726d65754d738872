"""The REAL gateway (``smg``) started with the flags ``serving.render.router`` renders, in front of two SIMULATED
SGLang workers (``serving.sandbox.worker``), and the heartbeat scenario on it: shared by the CI tests
(tests/test_render_router_live.py: what the router did, in what order) and the rehearsal
(tests/rehearsal/test_router_timing.py: how soon, against the health-check budget the rendered flags give).

Only the listeners (loopback, free ports) and the worker URLs are overridden; every other flag is the rendered one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from serving.render.router import ROUTER_ENTRY, router_args
from serving.router.client import RouterClient
from serving.sandbox.processes import StateDir, free_ports, start_router, start_worker, stop_all, stop_process
from serving.sandbox.worker_config import WorkerConfig, health_answer_bound_s
from serving.spec.schema import FleetSpec
from tests.support.patience import eventually
from tests.support.stacks import fleet_of, spec_from

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Workers:
    state: StateDir
    configs: tuple[WorkerConfig, ...]


@contextmanager
def running_workers(tmp_path: Path) -> Iterator[Workers]:
    """Two simulated workers (5 ms ± 1 ms a request), stopped with everything else started under their state."""
    state = StateDir(tmp_path / "state")
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    configs = tuple(
        WorkerConfig(port=p, latency_ms=5, jitter_ms=1, seed=i, model_path=str(model_dir))
        for i, p in enumerate(free_ports(2))
    )
    try:
        for c in configs:
            start_worker(state, f"worker-{c.port}", c)
        yield Workers(state, configs)
    finally:
        stop_all(state)


def override(flags: Sequence[str], values: Mapping[str, Sequence[str]]) -> list[str]:
    """Replace the values of flags the rendered command already has (a missing one is a test bug)."""
    out: list[str] = []
    skipping = False
    seen: set[str] = set()
    for word in flags:
        if word.startswith("--"):
            skipping = word in values
            if skipping:
                out += [word, *values[word]]
                seen.add(word)
                continue
        if not skipping:
            out.append(word)
    assert seen == set(values), f"rendered router command lacks {set(values) - seen}"
    return out


def start_rendered_router(
    spec: FleetSpec, workers: Workers, flags: Mapping[str, Sequence[str]] | None = None, *, name: str = "router"
) -> RouterClient:
    argv = router_args(fleet_of(spec), worker_urls=[c.url for c in workers.configs]).to_argv()
    assert argv[: len(ROUTER_ENTRY)] == list(ROUTER_ENTRY)
    port, metrics_port = free_ports(2)
    flags = override(
        argv[len(ROUTER_ENTRY) :],
        {
            "--host": [LOOPBACK],
            "--port": [str(port)],
            "--prometheus-host": [LOOPBACK],
            "--prometheus-port": [str(metrics_port)],
            **(flags or {}),
        },
    )
    record = start_router(workers.state, flags, name=name, healthy_workers=len(workers.configs), timeout_s=60)
    return RouterClient(record.url, record.metrics_url)


def heartbeat_spec(workers: Workers) -> FleetSpec:
    """The dev stack with a 1 s heartbeat × 2 failures; the health timeout the least that a healthy /health of
    SGLang's (one poll period, 1 s) fits: 1 s failed every check of the faithful worker."""
    return spec_from(
        "dev",
        serving__heartbeat_interval_s=1,
        serving__failure_threshold=2,
        serving__success_threshold=1,
        serving__health_check_timeout_s=health_answer_bound_s(workers.configs[0]),
    )


def detection_budget_s(spec: FleetSpec) -> float:
    """How soon the router's checks must notice a dead worker with the spec's flags: failures × interval + one
    probe's timeout, plus 2 s; the router's own default (60 s interval) would not."""
    s = spec.serving
    return s.failure_threshold * s.heartbeat_interval_s + s.health_check_timeout_s + 2.0


@dataclass(frozen=True)
class Detection:
    detected_s: float  # from the stop until the router listed the victim unhealthy (or not at all)
    survivor_healthy: bool  # the other worker, then
    readmitted_s: float  # from the restart until the router listed the victim healthy again


def stop_and_restart_a_worker(spec: FleetSpec, workers: Workers) -> Detection:
    """The rendered router in front of both workers: stop the first, wait (patience) until the router no longer
    lists it healthy, start it again, wait until it does."""
    victim, survivor = workers.configs

    async def body() -> Detection:
        async with start_rendered_router(spec, workers) as rc:

            async def out() -> bool:
                worker = await rc.find_worker(victim.url)
                return worker is None or not worker.is_healthy

            async def back() -> bool:
                worker = await rc.find_worker(victim.url)
                return worker is not None and worker.is_healthy

            stop_process(workers.state, f"worker-{victim.port}")
            stopped = time.monotonic()
            await eventually(out, what=f"the router to stop listing the stopped {victim.url} healthy")
            detected = time.monotonic() - stopped
            other = await rc.find_worker(survivor.url)
            await asyncio.to_thread(start_worker, workers.state, f"worker-{victim.port}", victim)
            restarted = time.monotonic()
            await eventually(back, what=f"the router to list the restarted {victim.url} healthy")
            return Detection(detected, other is not None and other.is_healthy, time.monotonic() - restarted)

    return asyncio.run(body())
