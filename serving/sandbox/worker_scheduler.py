"""The scheduler of a SIMULATED SGLang worker (:mod:`serving.sandbox.worker`): its data-parallel ranks' queues, the
requests it runs and the KV-pool tokens they hold, and the fault a drill puts on the worker (``PUT /sim/fault``,
SIMULATION ONLY: no such route on a real server)."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from serving.sandbox.worker_config import WorkerConfig


@dataclass(frozen=True)
class InjectedFault:
    """A fault a drill puts on a running simulated worker (``PUT /sim/fault``), SIMULATION ONLY.

    ``delay_ms`` ± ``jitter_ms`` (uniform) delays every answer, health checks and metrics included (an in-path delay);
    ``errors`` fails every answer, as a broken proxy in front of the server would: generations with HTTP 500,
    ``/health`` with 503 (the only failure SGLang's ``/health`` answers); ``generation_errors`` fails generations
    with HTTP 500 while the scheduler still runs, so ``/health`` stays 200 as on a real server whose requests fail
    (SGLang counts no such failure: ``sglang:num_aborted_requests_total`` counts aborts, ``abort_request``; the
    routers' per-worker outcomes and circuit breakers see them); ``wedged`` stops the simulated scheduler
    (a hung forward batch): HTTP, ``/metrics`` and ``/model_info`` answer, generations and ``/health`` never
    complete (``/health`` answers 503 after ``health_timeout_s``); memory pressure: ``token_usage`` is the KV-cache usage reported as
    ``sglang:token_usage``, ``admit`` the requests that still fit the pool (the rest wait in the queue, as SGLang's
    scheduler holds what it cannot admit: ``num_queue_reqs`` and ``/v1/loads`` show them) and ``slowdown``
    multiplies the generation latency; ``flap_stall_s`` (> 0) makes the scheduler flap: the 1st, 3rd, 5th …
    generating health check after the fault (``/health_generate``, the node agents' probe) finds it stalled for that
    long — no request, the check's own one-token generation included, finishes meanwhile, so the check gets no output
    (SGLang's 503 after its timeout, or the caller's timeout first) and every generation in flight waits — and the
    2nd, 4th … find it running: one check in two fails, through the same path as a wedged scheduler's, with the
    clients' requests held up by each stall."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    errors: bool = False
    generation_errors: bool = False
    wedged: bool = False
    token_usage: float | None = None
    admit: int | None = None
    slowdown: float = 1.0
    flap_stall_s: float = 0.0

    def __post_init__(self) -> None:
        problems = [
            f"{n}={getattr(self, n)}: must be >= 0"
            for n in ("delay_ms", "jitter_ms", "flap_stall_s")
            if getattr(self, n) < 0
        ]
        if self.jitter_ms > self.delay_ms:
            problems.append(f"jitter_ms={self.jitter_ms} > delay_ms={self.delay_ms}: a delay cannot go below 0")
        if self.token_usage is not None and not 0.0 <= self.token_usage <= 1.0:
            problems.append(f"token_usage={self.token_usage}: must be a share in [0, 1]")
        if self.admit is not None and self.admit < 1:
            problems.append(f"admit={self.admit}: must be >= 1 (requests running at once under the fault)")
        if self.slowdown < 1.0:
            problems.append(f"slowdown={self.slowdown}: must be >= 1 (a multiplier of the generation latency)")
        if problems:
            raise ValueError("invalid fault: " + "; ".join(problems))

    @classmethod
    def from_json(cls, data: Any) -> InjectedFault:
        if not isinstance(data, dict):
            raise ValueError(f'the fault is {type(data).__name__}; send a JSON object such as {{"errors": true}}')
        known = {f.name for f in dataclasses.fields(cls)}
        if unknown := sorted(set(data) - known):
            raise ValueError(f"unknown fault field(s) {unknown}; use {sorted(known)}")
        try:
            return cls(**data)
        except TypeError as exc:
            raise ValueError(f"invalid fault: {exc}") from exc

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


NO_FAULT = InjectedFault()


@dataclass(frozen=True)
class LoadSnapshot:
    """The load figures a scheduler publishes: what ``/v1/loads`` and its ``/metrics`` gauges show. SGLang's
    scheduler loop publishes them (``Scheduler.publish_load_snapshot`` after each batch, at least every
    ``LOAD_STALL_REFRESH_S``, 50 ms, while not idle: sglang/srt/managers/scheduler.py) and the tokenizer's ``/v1/loads``
    reads the last one from shared memory (``load_snapshot.py``): a scheduler that stops publishes nothing, so its
    figures, timestamp included, freeze at the moment it stopped while its queue grows unseen."""

    timestamp: float  # wall clock, when published
    running: int
    waiting: int
    tokens_in_flight: int
    kv_usage: float
    load: Mapping[tuple[int, str, str], int]  # requests per (DP rank, priority, "running" | "waiting")


class SimulatedScheduler:
    """One worker's simulated scheduler: requests wait in their DP rank's queue for a slot, hold KV-pool tokens while
    they run, and finish only while the scheduler makes progress; the fault on the worker (:attr:`fault`) can wedge
    or stall it, hold requests back and report the pool's usage."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self._slots = asyncio.Semaphore(config.max_running_requests)
        self.running = 0
        self.waiting = 0
        # Requests per (DP rank, priority, "running" | "waiting"): what each rank's scheduler exports.
        self.load: collections.Counter[tuple[int, str, str]] = collections.Counter()
        self._admitted = 0  # requests so far; the n-th goes to DP rank n % dp_size
        self.last_output = float("-inf")  # when the simulated scheduler last finished a request (monotonic)
        self.tokens_in_flight = 0
        self._finished = asyncio.Condition()  # a request ended: one held back by a fault's ``admit`` may start
        self.fault = NO_FAULT
        self._stalled_until = float("-inf")  # the flapping scheduler's current stall ends then (monotonic)
        self._wakers: set[asyncio.Task[None]] = set()  # the tasks that end the stalls (held: the loop keeps weak refs)
        self._frozen: LoadSnapshot | None = None  # what it published last before it stopped

    def published(self) -> LoadSnapshot:
        """The load figures as last published (:class:`LoadSnapshot`): the live ones while the scheduler runs (SGLang's
        are at most 50 ms old), those of the moment it stopped while it is wedged or stalled."""
        if self._stopped():
            if self._frozen is None:  # stopped before anything was published (a fault given at start)
                self._frozen = self._snapshot()
            return self._frozen
        self._frozen = None
        return self._snapshot()

    def _snapshot(self) -> LoadSnapshot:
        return LoadSnapshot(time.time(), self.running, self.waiting, self.tokens_in_flight, self.kv_usage(),
                            dict(self.load))  # fmt: skip

    def _freeze(self) -> None:
        """The scheduler is about to stop: what it published last is what it shows until it runs again."""
        if not self._stopped():
            self._frozen = self._snapshot()

    async def set_fault(self, fault: InjectedFault) -> None:
        """Put ``fault`` on the worker (:data:`NO_FAULT` clears it), ending any flapping stall; a fault admitting
        more, or none, lets the requests held back start."""
        if fault.wedged:
            self._freeze()
        self.fault = fault
        self._stalled_until = float("-inf")
        async with self._finished:
            self._finished.notify_all()

    def kv_usage(self) -> float:
        """The KV-cache share in use: the fault's figure while memory pressure is injected, else the tokens in flight
        over the simulated pool."""
        usage = self.fault.token_usage
        return usage if usage is not None else min(1.0, self.tokens_in_flight / self.config.kv_pool_tokens)

    def _stopped(self) -> bool:
        """The scheduler makes no progress: wedged, or in a flapping stall."""
        return self.fault.wedged or time.monotonic() < self._stalled_until

    async def stall(self, seconds: float) -> None:
        """Stall the scheduler for ``seconds`` from now, waking what waits on it when the stall ends."""
        self._freeze()
        self._stalled_until = time.monotonic() + seconds

        async def wake() -> None:
            await asyncio.sleep(seconds)
            async with self._finished:
                self._finished.notify_all()

        self._wakers.add(task := asyncio.create_task(wake()))
        task.add_done_callback(self._wakers.discard)

    async def schedule(
        self,
        tokens: int,
        duration_s: float,
        priority: str,
        *,
        outputs: int = 1,
        emit: Callable[[int], Awaitable[None]] | None = None,
    ) -> float:
        """One request through the simulated scheduler: it waits in its DP rank's queue until a slot (and, under
        memory pressure, the pool) admits it and the scheduler runs, holds ``tokens`` of the KV pool for
        ``duration_s``, and produces ``outputs`` outputs evenly over it, each only while the scheduler is not wedged
        (a stall holds the next one); each is the scheduler's output, handed to ``emit`` (a stream's chunk) with the
        count so far. Returns the seconds from its admission to its last output (its generation, a stall included;
        its queueing not). An ``emit`` that raises (the client went away) aborts the request."""
        rank = self._admitted % self.config.dp_size
        self._admitted += 1

        def admissible() -> bool:
            return not self._stopped() and (self.fault.admit is None or self.running < self.fault.admit)

        self.waiting += 1
        self.load[rank, priority, "waiting"] += 1
        try:
            await self._slots.acquire()
            try:
                async with self._finished:
                    await self._finished.wait_for(admissible)
                    self.running += 1
            except BaseException:
                self._slots.release()
                raise
        finally:
            self.waiting -= 1
            self.load[rank, priority, "waiting"] -= 1
        self.load[rank, priority, "running"] += 1
        self.tokens_in_flight += tokens
        admitted = time.monotonic()
        try:
            for produced in range(1, outputs + 1):
                await asyncio.sleep(duration_s / outputs)
                async with self._finished:
                    await self._finished.wait_for(lambda: not self._stopped())
                self.last_output = time.monotonic()
                if emit is not None:
                    await emit(produced)
            return self.last_output - admitted
        finally:
            self.tokens_in_flight -= tokens
            self.load[rank, priority, "running"] -= 1
            self._slots.release()
            async with self._finished:
                self.running -= 1
                self._finished.notify_all()
