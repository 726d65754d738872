"""Bounded open-loop load generator for the sandbox router.

Requests are *scheduled* at a fixed rate (request ``i`` is due at ``i / rate_per_s``) whatever the
latency, so a slow router shows up as higher latency, not as silently lower offered load. Every run is
bounded three ways: ``duration_s``, ``max_requests`` and ``max_in_flight`` (when that many requests
are outstanding the sender waits). A request sent more than one interval (``1 / rate_per_s``) after it was due is
counted in ``LoadReport.late``, whatever held it: no free slot, or the sender itself starved of CPU on a loaded
machine (a run offered 243/s for 300 so, 2026-12-05), so a run that fell behind its schedule says so. Each request has its
own timeout, so the run ends at most ``duration_s + timeout_s`` after it starts.

``failover`` spreads the requests over more router instances: request ``i`` goes to instance ``i mod n``, and a
request whose connection an instance refused or reset before any response came is sent once more to the next one,
as behind a load balancer that retries on connect failure and reset (Envoy's ``retry_on: connect-failure,reset``):
the fault drills' ``router-loss``.

Use it in-process (``await LoadGenerator(spec).run()``, with :meth:`LoadGenerator.report` readable
while it runs, e.g. for an updater's gates) or from a test (:func:`run_load_sync`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from serving.stats import nearest_rank

if TYPE_CHECKING:
    import aiohttp

DEFAULT_BODY: Mapping[str, Any] = {"text": "hello world", "sampling_params": {"max_new_tokens": 8}}
TRANSPORT_ERROR = 0  # status recorded when no HTTP response arrived (refused, reset, timeout)
ERROR_BODY_CHARS = 200  # of an error response's body, kept in RequestResult.error


@dataclass(frozen=True)
class LoadSpec:
    url: str
    rate_per_s: float
    duration_s: float
    max_requests: int = 100_000
    max_in_flight: int = 256
    path: str = "/generate"
    body: Mapping[str, Any] = field(default_factory=lambda: dict(DEFAULT_BODY))
    timeout_s: float = 10.0
    failover: tuple[str, ...] = ()  # more instances beside ``url``: round robin, refused or reset retried once

    def __post_init__(self) -> None:
        problems = [
            f"{name}={getattr(self, name)}: must be > 0"
            for name in ("rate_per_s", "duration_s", "max_requests", "max_in_flight", "timeout_s")
            if not getattr(self, name) > 0
        ]
        if problems:
            raise ValueError("invalid load spec: " + "; ".join(problems))

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(u.rstrip("/") + self.path for u in (self.url, *self.failover))

    @property
    def planned_requests(self) -> int:
        return min(self.max_requests, max(1, math.ceil(self.rate_per_s * self.duration_s)))


@dataclass(frozen=True)
class RequestResult:
    sent_at_s: float  # seconds after the run started
    latency_s: float
    status: int  # HTTP status, or TRANSPORT_ERROR
    error: str | None = None  # a transport error, or an HTTP error (>= 400) with the head of its body


def latency_quantile(results: Iterable[RequestResult], q: float) -> float:
    """Nearest-rank ``q``-quantile of the successful (2xx) requests' latency in seconds; NaN with none."""
    latencies = sorted(r.latency_s for r in results if 200 <= r.status < 300)
    if not latencies:
        return math.nan
    return latencies[nearest_rank(q, len(latencies)) - 1]


@dataclass(frozen=True)
class LoadReport:
    results: tuple[RequestResult, ...]
    wall_s: float
    late: int = 0  # requests sent more than one interval after they were due (the module's docstring)

    @property
    def count(self) -> int:
        return len(self.results)

    @property
    def status_counts(self) -> dict[int, int]:
        return dict(Counter(r.status for r in self.results))

    @property
    def ok(self) -> int:
        return sum(200 <= r.status < 300 for r in self.results)

    @property
    def error_statuses(self) -> dict[int, int]:
        """The statuses counted as errors, with their counts: server errors (5xx) and transport errors
        (:data:`TRANSPORT_ERROR`); 4xx are the client's fault and not counted."""
        return {code: n for code, n in self.status_counts.items() if code >= 500 or code == TRANSPORT_ERROR}

    @property
    def errors(self) -> int:
        return sum(self.error_statuses.values())

    @property
    def error_rate(self) -> float:
        return self.errors / self.count if self.results else 0.0

    @property
    def qps(self) -> float:
        """Successful responses per second of wall time."""
        return self.ok / self.wall_s if self.wall_s > 0 else 0.0

    def latency_quantile(self, q: float) -> float:
        """Nearest-rank quantile of successful requests' latency in seconds; NaN with none."""
        return latency_quantile(self.results, q)

    @property
    def p50_s(self) -> float:
        return self.latency_quantile(0.50)

    @property
    def p99_s(self) -> float:
        return self.latency_quantile(0.99)

    def window(self, start_s: float, end_s: float) -> LoadReport:
        """Requests sent in ``[start_s, end_s)`` (run-relative seconds), as a report of that window."""
        picked = tuple(r for r in self.results if start_s <= r.sent_at_s < end_s)
        return LoadReport(picked, max(0.0, end_s - start_s))

    def summary(self) -> str:
        return (
            f"{self.count} requests in {self.wall_s:.2f} s: {self.qps:.1f} ok/s, errors {self.errors} "
            f"({self.error_rate:.2%}), p50 {self.p50_s * 1000:.1f} ms, p99 {self.p99_s * 1000:.1f} ms, "
            f"statuses {dict(sorted(self.status_counts.items()))}, {self.late} sent late"
            + "".join(f"; {n} × {error}" for error, n in self.distinct_errors().items())
        )

    def distinct_errors(self, most: int = 5) -> dict[str, int]:
        """The ``most`` commonest error texts among the requests counted as errors (:attr:`error_statuses`), with
        their counts: what a failed run's message names, e.g. ``HTTP 503: {"error": ...}`` or a client timeout."""
        counted = Counter(
            r.error or f"HTTP {r.status}" for r in self.results if r.status >= 500 or r.status == TRANSPORT_ERROR
        )
        return dict(counted.most_common(most))


class LoadGenerator:
    """One bounded run against ``spec.url + spec.path``; :meth:`report` may be read while it runs."""

    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        self._results: list[RequestResult] = []
        self._late = 0
        self._started = 0.0

    def report(self) -> LoadReport:
        elapsed = time.monotonic() - self._started if self._started else 0.0
        return LoadReport(tuple(self._results), elapsed, self._late)

    async def run(self, stop: asyncio.Event | None = None) -> LoadReport:
        """Send until the duration, the request budget or ``stop`` ends it; then await in-flight ones."""
        import aiohttp  # noqa: PLC0415 - imported on first use: importing serving.rollout stays free of aiohttp

        spec = self.spec
        connector = aiohttp.TCPConnector(limit=spec.max_in_flight, force_close=False)
        timeout = aiohttp.ClientTimeout(total=spec.timeout_s)
        slots = asyncio.Semaphore(spec.max_in_flight)
        tasks: list[asyncio.Task[None]] = []
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            self._started = time.monotonic()
            for i in range(spec.planned_requests):
                due = self._started + i / spec.rate_per_s
                if await _sleep_until(due, stop):
                    break
                await slots.acquire()
                tasks.append(asyncio.create_task(self._one(session, slots, i, due)))
            await asyncio.gather(*tasks)
        return LoadReport(tuple(self._results), time.monotonic() - self._started, self._late)

    async def _one(self, session: aiohttp.ClientSession, slots: asyncio.Semaphore, i: int, due: float) -> None:
        import aiohttp  # noqa: PLC0415 - already loaded by run()

        targets = self.spec.targets
        sent = time.monotonic()
        if sent - due > 1 / self.spec.rate_per_s:
            self._late += 1
        status, error = TRANSPORT_ERROR, None
        try:
            for attempt in range(min(2, len(targets))):
                try:
                    async with session.post(targets[(i + attempt) % len(targets)], json=self.spec.body) as response:
                        body = await response.read()
                        status = response.status
                        error = (
                            None
                            if status < 400
                            else f"HTTP {status}: {body[:ERROR_BODY_CHARS].decode(errors='replace')}"
                        )
                    break
                except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as exc:  # refused or reset: next, once
                    error = f"{type(exc).__name__}: {exc}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        finally:
            slots.release()
        self._results.append(RequestResult(sent - self._started, time.monotonic() - sent, status, error))


async def _sleep_until(due: float, stop: asyncio.Event | None) -> bool:
    """Sleep until ``due`` (monotonic); True if ``stop`` was set first."""
    delay = due - time.monotonic()
    if stop is None:
        if delay > 0:
            await asyncio.sleep(delay)
        return False
    if stop.is_set():
        return True
    if delay > 0:
        try:
            await asyncio.wait_for(stop.wait(), timeout=delay)
        except TimeoutError:
            return False
        return True
    return False


async def run_load(spec: LoadSpec, stop: asyncio.Event | None = None) -> LoadReport:
    return await LoadGenerator(spec).run(stop)


def run_load_sync(spec: LoadSpec) -> LoadReport:
    """Run one bounded load in a fresh event loop (for tests)."""
    return asyncio.run(run_load(spec))
