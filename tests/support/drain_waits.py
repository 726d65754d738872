"""A migration's drain on the simulated worker (serving.router.client.RouterClient.wait_until_idle with
``while_healthy``): a request on a healthy replica is waited for, the requests of a wedged one are not. Shared by the
CI test (tests/test_runtime_agent.py: what the waits returned or raised, in what order) and the rehearsal
(tests/rehearsal/test_runtime_timing.py: how long each took)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer

from serving.router.client import WORKER_QUEUED, WORKER_RUNNING, RouterClient
from serving.sandbox.worker import SimulatedWorker
from serving.sandbox.worker_config import WorkerConfig
from serving.sandbox.worker_scheduler import InjectedFault
from tests.support.patience import PATIENCE_S, eventually

REQUEST_MS = 600.0  # the healthy replica's request, longer than one of its health checks (0.1 s poll, 0.3 s timeout)


@dataclass(frozen=True)
class DrainWaits:
    waited_s: float  # the wait on the healthy replica, started once it held the request
    finished: int  # that request's status
    gave_up: str  # what the wait on the wedged replica raised
    gave_up_s: float  # and after how long


def drain_waits(tmp_path: Path) -> DrainWaits:
    config = WorkerConfig(
        port=1, model_path=str(tmp_path / "model"), latency_ms=REQUEST_MS, jitter_ms=0.0, health_poll_s=0.1,
        health_timeout_s=0.3,
    )  # fmt: skip
    worker = SimulatedWorker(config)

    async def run() -> DrainWaits:
        async with TestClient(TestServer(worker.build_app())) as client, RouterClient("http://127.0.0.1:1", "") as rc:
            url = str(client.make_url("")).rstrip("/")

            async def holds_one() -> bool:
                """The worker counts a request running or queued (a wedged scheduler's stays queued)."""
                snap = await rc.worker_metrics(url)
                busy = sum(snap.per_scheduler(WORKER_RUNNING).values()) + sum(
                    snap.per_scheduler(WORKER_QUEUED).values()
                )
                return busy >= 1

            finishing = asyncio.create_task(client.post("/generate", json={"text": "a"}))
            await eventually(holds_one, what="the worker holding the request")
            waited_s = await rc.wait_until_idle(url, timeout_s=PATIENCE_S, while_healthy=True)
            finished = (await finishing).status
            # the scheduler wedges with a request in its batch (a hung forward): its gauges freeze showing it running
            # (SGLang's are what its loop last published); a request sent after the wedge would never show
            held = asyncio.create_task(client.post("/generate", json={"text": "a"}))

            async def running() -> bool:
                return worker.scheduler.running >= 1

            await eventually(running, what="the request running")
            await worker.scheduler.set_fault(InjectedFault(wedged=True))  # in this loop: before it can finish
            await eventually(holds_one, what="the wedged worker holding a request")
            started = time.monotonic()
            try:
                await rc.wait_until_idle(url, timeout_s=PATIENCE_S, while_healthy=True)
                gave_up = "waited until idle"
            except TimeoutError as exc:
                gave_up = str(exc)
            gave_up_s = time.monotonic() - started
            held.cancel()
        return DrainWaits(waited_s, finished, gave_up, gave_up_s)

    return asyncio.run(run())
