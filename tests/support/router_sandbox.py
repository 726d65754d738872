"""The sandbox's process layer, the REAL smg 1.13 gateway in front of SIMULATED SGLang workers (tests/
test_sandbox_processes.py's module docstring says what runs), and the scenarios both tiers run on it: the CI tests
judge what the router and the workers did and in what order, the rehearsal (tests/rehearsal/test_router_timing.py)
how soon, against the budgets the flags give. Each scenario returns what it saw and the seconds it measured.

Every wait here is on an event, bounded by the patience (tests/support/patience.py): a bound a thing this late
cannot meet, which fails as a hang, never a judged figure."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import httpx

from serving.router.client import (
    ROUTER_DURATION,
    ROUTER_WORKER_HEALTH,
    ROUTER_WORKER_RETRIES,
    WORKER_E2E_LATENCY,
    WORKER_REQUESTS,
    HistogramSnapshot,
    MetricsSnapshot,
    RouterApiError,
    RouterClient,
    WorkerInfo,
)
from serving.router.loadgen import LoadGenerator, LoadReport, LoadSpec, run_load
from serving.sandbox.processes import (
    RouterSpec,
    StateDir,
    free_ports,
    start_router,
    start_worker,
    stop_all,
    stop_process,
)
from serving.sandbox.worker_config import WorkerConfig
from serving.spec.schema import FleetSpec
from tests.support.patience import PATIENCE_S, eventually
from tests.support.sandbox import Sandbox, until_each
from tests.support.stacks import request_timeout_of

T = TypeVar("T")

# Two simulated workers behind the real router, round robin, health probed every second; 5 ms simulated latency
# (scheduling noise aside, the requests' own time stays small next to the load tests' rates). The router takes
# serving.failure_threshold for both its health checker and its circuit breaker: 5 consecutive failures keep a
# 5 % error rate from opening the breaker (p ≈ 1e-4 over a 600-request run) at the cost of a slower detection.
# The 1 s timeout is below checks.rules' health minimum on purpose: the stack is never checked, only run.
TWO_WORKERS: dict[str, Any] = {
    "scheduler.strategy": "round_robin",
    "serving.heartbeat_interval_s": 1,
    "serving.health_check_timeout_s": 1,
    "serving.failure_threshold": 5,
    **request_timeout_of(5),  # its detection window (5 × 1 s), as before the timeout fit a generation
    "sandbox.versions.v1.latency_ms": 5,
}
NEVER_READY_STARTUP_TIMEOUT_S = 2  # the never-ready worker's router: --worker-startup-timeout-secs


def detection_budget_s(spec: FleetSpec) -> float:
    """How long the router's health checker may take to mark a dead worker unhealthy: interval × threshold +
    one probe's timeout, plus 1.5 s of slack for a loaded machine."""
    serving = spec.serving
    return serving.heartbeat_interval_s * serving.failure_threshold + serving.health_check_timeout_s + 1.5


def run(factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(factory())


async def worker_requests(rc: RouterClient, url: str) -> float:
    return (await rc.worker_metrics(url)).value(WORKER_REQUESTS)


async def listed_healthy(rc: RouterClient, url: str) -> WorkerInfo:
    """Poll the router's list until ``url`` is in it healthy: for a worker the test did not add (no id known)."""

    async def healthy() -> WorkerInfo | None:
        worker = await rc.find_worker(url)
        return worker if worker is not None and worker.is_healthy else None

    return await eventually(healthy, what=f"{url} listed healthy", every_s=0.1)


async def load(url: str, rate: float, count: int) -> LoadReport:
    """Exactly ``count`` requests at ``rate`` per second."""
    return await run_load(LoadSpec(url, rate, duration_s=count / rate, max_requests=count))


def removal_and_readdition(sandbox: Sandbox) -> dict[str, Any]:
    """DELETE the second worker, load the router meanwhile, wait until smg drops it, add it back and load again:
    what each step showed, and ``removal_s``, from the DELETE until the worker was gone from the registry."""
    removed = sandbox.configs[1]
    seen: dict[str, Any] = {}

    async def body() -> None:
        async with sandbox.client() as rc:
            target = await rc.find_worker(removed.url)
            assert target is not None
            seen["target"] = target
            started = time.monotonic()
            await rc.remove_worker(target.id)
            seen["draining"] = await rc.get_worker(target.id)
            seen["health_while_draining"] = (await rc.metrics()).worker_gauge(ROUTER_WORKER_HEALTH).get(removed.url)
            seen["before"] = {c.url: await worker_requests(rc, c.url) for c in sandbox.configs}
            seen["report"] = await load(sandbox.router_url, 200, 30)
            seen["during"] = {c.url: await worker_requests(rc, c.url) for c in sandbox.configs}
            await rc.wait_for_removal(target.id, timeout_s=PATIENCE_S)
            seen["removal_s"] = time.monotonic() - started
            seen["health_after_removal"] = (await rc.metrics()).worker_gauge(ROUTER_WORKER_HEALTH)
            seen["readded_id"] = readded = await rc.add_worker(removed.url)
            await rc.wait_for_worker(readded, timeout_s=PATIENCE_S)
            try:
                seen["added_again"] = await rc.add_worker(removed.url)  # a URL that is registered
            except RouterApiError as exc:
                seen["added_again"] = str(exc)
            seen["report_back"] = await load(sandbox.router_url, 200, 40)
            seen["after"] = {c.url: await worker_requests(rc, c.url) for c in sandbox.configs}
            seen["listed"] = await rc.list_workers()

    run(body)
    return seen


COUNTED_RATE, COUNTED_REQUESTS = 300, 600  # the counted load: 2 s of sends on a quiet machine


@dataclass(frozen=True)
class CountedLoad:
    report: LoadReport  # COUNTED_REQUESTS requests at COUNTED_RATE per second through the router
    before: MetricsSnapshot  # the router's metrics before the load
    after: MetricsSnapshot  # and after it

    @property
    def histogram(self) -> HistogramSnapshot:
        """The router's own timing of the load's requests (its ``/generate`` duration histogram, after − before)."""
        return self.after.histogram(ROUTER_DURATION, path="/generate") - self.before.histogram(
            ROUTER_DURATION, path="/generate"
        )

    @property
    def client_extra_s(self) -> float:
        """The clients' mean time per request beyond the router's own (their HTTP stack), exact from the two sums."""
        return (sum(r.latency_s for r in self.report.results) - self.histogram.sum) / self.report.count

    def pace(self) -> float:
        """The offered rate as the sends kept it (count / wall also counts the last responses' latency: 600 at 300/s
        took 2.1 s of wall for 2.0 s of sends on a quiet machine)."""
        sent = sorted(r.sent_at_s for r in self.report.results)
        return (len(sent) - 1) / (sent[-1] - sent[0])

    def late_by_the_stamps(self) -> tuple[int, int]:
        """How many requests left more than one interval after they were due, recounted from the generator's own send
        stamps (request ``i``, the ``i``-th sent, is due ``i / rate`` after the start: serving.router.loadgen), with a
        microsecond either way for the rounding: (surely late, at most late)."""
        interval = 1 / COUNTED_RATE
        behind = [s - i * interval for i, s in enumerate(sorted(r.sent_at_s for r in self.report.results))]
        return sum(b > interval + 1e-6 for b in behind), sum(b > interval - 1e-6 for b in behind)

    def medians_apart(self) -> tuple[float, float]:
        """How far the router's median is from the clients' (the seconds between them), and how far they may be: the
        width of the router's histogram bucket holding the clients' median (the fleet's fine buckets, ratio
        1 + max_p99_rise / 3) plus the clients' mean extra time."""
        histogram, client = self.histogram, self.report.p50_s
        bounds = [0.0] + [le for le, _ in histogram.buckets]
        upper = next(b for b in bounds[1:] if b >= client)
        lower = bounds[bounds.index(upper) - 1]
        return abs(histogram.quantile(0.5) - client), upper - lower + self.client_extra_s


def counted_load(sandbox: Sandbox) -> CountedLoad:
    """COUNTED_REQUESTS requests at COUNTED_RATE per second through the router, its metrics read before and after."""

    async def body() -> CountedLoad:
        async with sandbox.client() as rc:
            before = await rc.metrics()
            report = await load(sandbox.router_url, COUNTED_RATE, COUNTED_REQUESTS)
            return CountedLoad(report, before, await rc.metrics())

    return run(body)


@dataclass(frozen=True)
class Killed:
    detected_s: float  # from the SIGKILL until the router listed the worker unhealthy
    report: LoadReport  # the clients' load across the kill
    retries: float  # the router's retries meanwhile
    still_listed: bool  # the unhealthy worker stayed registered


def kill_a_loaded_worker(sandbox: Sandbox) -> Killed:
    """A third worker (300 ms a request) added, 240 requests at 60/s through the router, the worker SIGKILLed after
    1 s (requests in flight cut); wait until the router lists it unhealthy; then remove it."""
    (port,) = free_ports(1)
    victim = replace(sandbox.configs[0], port=port, version="victim", latency_ms=300, jitter_ms=0)
    record = start_worker(sandbox.processes, f"worker-{port}", victim)

    async def body() -> Killed:
        async with sandbox.client() as rc:
            victim_id = await rc.add_worker(victim.url)
            await rc.wait_for_worker(victim_id, timeout_s=PATIENCE_S)
            before = await rc.metrics()
            generator = LoadGenerator(LoadSpec(sandbox.router_url, 60, duration_s=4.0, max_requests=240))
            task = asyncio.create_task(generator.run())
            await asyncio.sleep(1.0)
            os.kill(record.pid, signal.SIGKILL)
            killed = time.monotonic()
            last: list[WorkerInfo | None] = []

            async def unhealthy() -> bool:
                last[:] = [await rc.get_worker(victim_id)]
                return last[0] is None or not last[0].is_healthy

            await eventually(unhealthy, what="the router marking the killed worker unhealthy", seen=lambda: last)
            detected = time.monotonic() - killed
            report = await task
            retries = (await rc.metrics()).value(ROUTER_WORKER_RETRIES) - before.value(ROUTER_WORKER_RETRIES)
            await rc.remove_worker(victim_id)
            await rc.wait_for_removal(victim_id, timeout_s=PATIENCE_S)
        return Killed(detected, report, retries, last[0] is not None)

    try:
        return run(body)
    finally:
        stop_process(sandbox.processes, f"worker-{port}")


def worker_latency_median_s(url: str, metrics: str | None = None) -> float:
    """The median of the worker's ``sglang:e2e_request_latency_seconds`` (its /metrics, or the text given)."""
    text = metrics if metrics is not None else httpx.get(url + "/metrics", timeout=5).text
    return MetricsSnapshot.parse(text).histogram(WORKER_E2E_LATENCY).quantile(0.5)


def sigterm_drain(tmp_path: Path) -> tuple[int, float, bool]:
    """A worker holding a 1.5 s request is sent SIGTERM (stop_process): the request's status, the seconds the stop
    took, and whether a live process was stopped."""
    state = StateDir(tmp_path / "state")
    (port,) = free_ports(1)
    config = WorkerConfig(port=port, latency_ms=1500, jitter_ms=0, model_path=str(tmp_path / "model"))
    start_worker(state, "w", config)

    async def body() -> tuple[int, float, bool]:
        async with httpx.AsyncClient(timeout=PATIENCE_S) as http:
            request = asyncio.create_task(http.post(config.url + "/generate", json={"text": "hi"}))
            # the SIGTERM once the worker holds the request (a fixed 0.3 s wait: on a loaded machine the request had
            # not reached it, and the worker closed the connection it had not read a request on)
            await until_each([config.url], busy=True)
            assert not request.done(), "the 1.5 s request ended before the SIGTERM"
            started = time.monotonic()
            stopped = await asyncio.to_thread(stop_process, state, "w")
            response = await request
        return response.status_code, time.monotonic() - started, stopped

    return run(body)


@dataclass(frozen=True)
class NeverReady:
    pending: WorkerInfo | None  # the registration just after the POST
    listed_while_pending: list[WorkerInfo]
    routed: LoadReport  # 5 requests while it was pending
    gave_up: str  # what wait_for_worker raised (RouterApiError: the router dropped the registration)
    gave_up_s: float  # from the first wait until the router dropped it
    listed_after: list[WorkerInfo]
    health: int  # the worker's own /health after


def never_ready_registration(tmp_path: Path) -> NeverReady:
    """A worker whose /health never answers 200, added to its own router with --worker-startup-timeout-secs 2."""
    state = StateDir(tmp_path / "state")
    ports = free_ports(3)
    worker = WorkerConfig(port=ports[0], never_ready=True, model_path=str(tmp_path / "model"))
    spec = RouterSpec(
        port=ports[1], prometheus_port=ports[2], worker_startup_timeout_secs=NEVER_READY_STARTUP_TIMEOUT_S
    )
    start_worker(state, "never", worker, wait="listening")
    try:
        router = start_router(state, spec.to_argv())

        async def body() -> NeverReady:
            async with RouterClient(router.url, router.metrics_url) as rc:
                worker_id = await rc.add_worker(worker.url)
                pending = await rc.get_worker(worker_id)
                listed = await rc.list_workers()
                routed = await load(router.url, 50, 5)
                started = time.monotonic()
                try:
                    await rc.wait_for_worker(worker_id, timeout_s=PATIENCE_S)
                    gave_up = "admitted"
                except RouterApiError as exc:
                    gave_up = str(exc)
                gave_up_s = time.monotonic() - started
                return NeverReady(pending, listed, routed, gave_up, gave_up_s, await rc.list_workers(), 0)

        seen = run(body)
        return replace(seen, health=httpx.get(worker.url + "/health", timeout=PATIENCE_S).status_code)
    finally:
        stop_all(state)
