"""The simulated SGLang worker (serving.sandbox.worker) in-process, on a shortened poll and timeout, and its health
scenarios: shared by the CI tests (tests/test_sandbox_worker_fidelity.py: each answer's status, its lower bound in
time, the order of answers) and the rehearsal (tests/rehearsal/test_router_timing.py: how soon each came)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from serving.sandbox.worker import SimulatedWorker
from serving.sandbox.worker_config import WorkerConfig
from serving.sglang_health import HEALTH_PATH, SCHEDULER_HEALTH_PATH

POLL_S, TIMEOUT_S = 0.2, 0.6  # a shortened poll and timeout, so the test runs in seconds; the defaults are SGLang's
FLAP_STALL_S = TIMEOUT_S + POLL_S  # the flapping scheduler's stall: past a check's timeout


def make_worker(tmp_path: Path, **changes: Any) -> SimulatedWorker:
    fields: dict[str, Any] = {"health_poll_s": POLL_S, "health_timeout_s": TIMEOUT_S, "latency_ms": 5.0} | changes
    return SimulatedWorker(WorkerConfig(port=1, model_path=str(tmp_path / "model"), **fields))


def with_client(worker: SimulatedWorker, body: Callable[[TestClient[Any, Any]], Awaitable[Any]]) -> Any:
    async def run() -> Any:
        async with TestClient(TestServer(worker.build_app())) as client:
            return await body(client)

    return asyncio.run(run())


async def timed_health(client: TestClient[Any, Any], path: str = "/health") -> tuple[int, float]:
    """``GET path``: its status and the seconds it took."""
    started = time.monotonic()
    response = await client.get(path)
    return response.status, time.monotonic() - started


def healthy_then_wedged(tmp_path: Path, paths: Iterable[str]) -> dict[str, Any]:
    """Each health path healthy; the scheduler wedged (a generation sent then does not complete; /model_info and
    /metrics answer); healthy again once the fault is cleared. Status and seconds of each health answer."""
    worker = make_worker(tmp_path)

    async def body(client: TestClient[Any, Any]) -> dict[str, Any]:
        seen: dict[str, Any] = {"healthy": [await timed_health(client, p) for p in sorted(paths)]}
        await client.put("/sim/fault", json={"wedged": True})
        generation = asyncio.create_task(client.post("/generate", json={"text": "hello"}))
        seen["wedged"] = await timed_health(client)
        seen["model_info"] = (await client.get("/model_info")).status
        seen["metrics"] = (await client.get("/metrics")).status
        seen["generation_done"] = generation.done()
        await client.delete("/sim/fault")
        seen["generation"] = (await generation).status
        seen["again"] = await timed_health(client)
        return seen

    return with_client(worker, body)


def cheap_and_scheduler_health(tmp_path: Path) -> dict[str, Any]:
    """A worker as rendered (``/health`` without a generation): both paths healthy, then both with the scheduler
    wedged. Status and seconds of each."""
    worker = make_worker(tmp_path, health_generation=False)

    async def body(client: TestClient[Any, Any]) -> dict[str, Any]:
        seen: dict[str, Any] = {
            "cheap": await timed_health(client),
            "scheduler": await timed_health(client, SCHEDULER_HEALTH_PATH),
        }
        await client.put("/sim/fault", json={"wedged": True})
        seen["wedged_cheap"] = await timed_health(client)
        seen["wedged_scheduler"] = await timed_health(client, SCHEDULER_HEALTH_PATH)
        return seen

    return with_client(worker, body)


def flapping_scheduler(tmp_path: Path) -> dict[str, Any]:
    """A worker as rendered, with ``flap_stall_s``: the first scheduler check after the fault stalls the scheduler;
    meanwhile a generation and a cheap ``/health`` are sent; then four more checks; then two without the fault.
    Status and seconds of each, and ``order``: in what order the first check and the cheap answer came."""
    worker = make_worker(tmp_path, health_generation=False)

    async def body(client: TestClient[Any, Any]) -> dict[str, Any]:
        seen: dict[str, Any] = {"before": await timed_health(client, SCHEDULER_HEALTH_PATH)}
        await client.put("/sim/fault", json={"flap_stall_s": FLAP_STALL_S})
        order: list[str] = []
        first = asyncio.create_task(timed_health(client, SCHEDULER_HEALTH_PATH))
        first.add_done_callback(lambda _t: order.append("first"))
        await asyncio.sleep(0.05)  # the check has stalled the scheduler: a generation now waits it out
        cheap = asyncio.create_task(timed_health(client, HEALTH_PATH))
        cheap.add_done_callback(lambda _t: order.append("cheap"))
        started = time.monotonic()
        status = (await client.post("/generate", json={"text": "hello"})).status
        seen["generation"] = (status, time.monotonic() - started)
        seen["first"] = await first
        seen["cheap"] = await cheap
        seen["order"] = order
        seen["checks"] = [(await timed_health(client, SCHEDULER_HEALTH_PATH))[0] for _ in range(4)]
        await client.delete("/sim/fault")
        seen["after"] = [(await timed_health(client, SCHEDULER_HEALTH_PATH))[0] for _ in range(2)]
        return seen

    return with_client(worker, body)
