"""The updater's I/O shell: runs the state machine's steps against the router, the workers and a backend.

For each step the runner does the I/O, turns the result into an :class:`~serving.rollout.machine.Event`,
advances the pure state, and writes the event to the journal *before* it acts on the new state.
Before each step it puts the router's worker list in line with the state (a restarted router comes
back with its command-line workers, or none). Router calls that fail at the transport level are
retried for ``router_grace_s``; after that the rollout pauses with the reason (``router_lost``).

Warm-up. The source ramps a new replica at 10 % of traffic for 30 s. The SGLang router 0.3.2 has no
per-worker weight: its policies (random, round_robin, cache_aware, power_of_two, manual) choose among
healthy workers alike, and the ``priority``/``cost`` fields of ``POST /workers`` only rank routers in
multi-model (``--enable-igw``) mode. So the updater approximates the ramp *before* readmission: it
sends the updated replicas synthetic ``/generate`` requests directly, at ``serving.warmup_share`` of
one replica's baseline request rate (at least 5 requests each) for ``serving.warmup_duration_s``;
any failure is an error-gate breach and the batch is rolled back before a client ever reaches it.
Only then is the batch readmitted for full traffic and soaked against the gates.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import TypeVar

import httpx

from serving.rollout.backends import Backend, BackendError
from serving.rollout.gates import (
    Counters,
    Gates,
    WindowStats,
    error_breach,
    error_budget_exhausted,
    evaluate,
    window_stats,
)
from serving.rollout.journal import Journal
from serving.rollout.machine import Event, EventKind, Phase, RolloutState, Step, advance
from serving.rollout.plan import warmup_requests
from serving.router.client import (
    WORKER_QUEUED,
    WORKER_RUNNING,
    RouterApiError,
    RouterClient,
)
from serving.router.loadgen import DEFAULT_BODY, LoadSpec, run_load

T = TypeVar("T")
MAX_WINDOW_RESTARTS = 3  # router restarts tolerated inside one measurement window


class RouterUnavailable(RuntimeError):
    """The router did not answer for the grace period."""


@dataclass(frozen=True)
class Progress:
    """What the live display shows: the state, what is happening now, the latest gate values, and
    the event when this update is a committed transition (None for a passing status line)."""

    state: RolloutState
    message: str
    gates: Gates | None = None
    event: Event | None = None


ProgressFn = Callable[[Progress], None]


class ErrorMeter:
    """Cumulative client-facing router errors since the rollout began, across router restarts."""

    def __init__(self, total: float) -> None:
        self.total = total
        self._last: float | None = None

    def observe(self, counters: Counters) -> float:
        now = counters.client_errors
        if self._last is not None:
            self.total += now - self._last if now >= self._last else now
        self._last = now
        return self.total


class Runner:
    def __init__(
        self,
        state: RolloutState,
        journal: Journal,
        backend: Backend,
        router: RouterClient,
        *,
        progress: ProgressFn | None = None,
        router_grace_s: float = 30.0,
        poll_s: float = 0.25,
    ) -> None:
        self.state = state
        self.journal = journal
        self.backend = backend
        self.router = router
        self.progress = progress or (lambda _p: None)
        self.router_grace_s = router_grace_s
        self.poll_s = poll_s
        self.errors = ErrorMeter(state.client_errors)
        self._pause = asyncio.Event()
        self._pause_recorded = False
        self.readmitted_at: dict[int, float] = {}  # batch → wall time its readmission finished
        self.rollback_started_at: float | None = None
        self._http = httpx.AsyncClient()

    # ----- driving the machine ------------------------------------------------------------------
    def request_pause(self) -> None:
        """Pause at the next point where every replica is in the router (SIGINT/SIGTERM)."""
        self._pause.set()
        self._say("pause requested: finishing the current step")

    def record(self, kind: EventKind, detail: str = "") -> None:
        """Record an operator event (resume, rollback) before :meth:`run`."""
        self._commit(Event(kind, time.time(), detail=detail, client_errors=self.errors.total))

    async def run(self) -> RolloutState:
        while self.state.active and self.state.step is not None:
            if self._pause.is_set() and not self._pause_recorded:
                self._pause_recorded = True
                self._commit(Event("pause", time.time(), client_errors=self.errors.total))
                continue
            step = self.state.step
            try:
                await self._reconcile()
                event = await self._execute(step)
            except RouterUnavailable as exc:
                event = self._event("router_lost", step, str(exc))
            if event is not None:
                self._commit(event)
        await self._http.aclose()
        self._say(self._summary())
        return self.state

    def _commit(self, event: Event) -> None:
        before = self.state
        after = advance(before, event)
        self.journal.record(event)
        self.state = after
        if after.rolling_back and not before.rolling_back and self.rollback_started_at is None:
            self.rollback_started_at = event.at
        self.progress(Progress(after, self._describe(event), event.gates, event))

    def _event(
        self,
        kind: EventKind,
        step: Step,
        detail: str = "",
        *,
        gates: Gates | None = None,
        baseline: WindowStats | None = None,
    ) -> Event:
        return Event(kind, time.time(), step, detail, gates, baseline, client_errors=self.errors.total)

    def _say(self, message: str, gates: Gates | None = None) -> None:
        self.progress(Progress(self.state, message, gates))

    def _describe(self, ev: Event) -> str:
        where = f"batch {ev.step.batch} {ev.step.phase.value}" if ev.step and ev.step.batch is not None else ""
        if ev.step and ev.step.rollback:
            where = "rollback: " + where
        text = {"done": "done", "failed": "FAILED", "baseline": "baseline measured"}.get(ev.kind, ev.kind)
        return " ".join(x for x in (where, text, ev.detail) if x)

    def _summary(self) -> str:
        s = self.state
        outcome = s.outcome.value if s.outcome else "stopped"
        return f"{outcome}{': ' + s.reason if s.reason else ''}"

    # ----- router access -------------------------------------------------------------------------
    async def _router_call(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """Retry transport failures for ``router_grace_s`` (a restarting router), then give up."""
        deadline: float | None = None
        while True:
            try:
                return await call()
            except httpx.HTTPError as exc:
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.router_grace_s
                    self._say(f"router not answering ({what}: {exc!r}); retrying for {self.router_grace_s:.0f} s")
                if now >= deadline:
                    raise RouterUnavailable(
                        f"{what}: no answer from {self.router.base_url} for {self.router_grace_s:.0f} s ({exc!r})"
                    ) from None
                await asyncio.sleep(min(1.0, self.poll_s * 2))

    async def _counters(self) -> Counters:
        snap = await self._router_call("metrics", self.router.metrics)
        counters = Counters.read(snap)
        self.errors.observe(counters)
        return counters

    async def _registered(self) -> dict[str, str]:
        """URL → worker id of the workers the router has registered."""
        workers = await self._router_call("GET /workers", self.router.list_workers)
        return {w.url: w.id for w in workers}

    async def _remove_worker(self, worker_id: str) -> None:
        """Queue a removal; an API refusal is reported and left to the caller's check of the list."""
        try:
            await self._router_call("DELETE /workers", partial(self.router.remove_worker, worker_id))
        except RouterApiError as exc:
            self._say(f"router refused the removal of {worker_id}: {exc}")

    async def _add_worker(self, url: str) -> None:
        try:
            await self._router_call("POST /workers", partial(self.router.add_worker, url))
        except RouterApiError as exc:
            self._say(f"router refused to add {url}: {exc}")

    def _urls(self, step: Step) -> dict[str, str]:
        assert step.batch is not None
        return {r: self.backend.worker_url(r) for r in self.state.plan.batch(step.batch).replicas}

    async def _reconcile(self) -> None:
        """Put the router's worker list in line with the state (the batch being removed or
        readmitted is left as it is: that step moves it)."""
        s = self.state
        out = s.out_of_router()
        moving: set[str] = set()
        if s.step is not None and s.step.batch is not None and s.step.phase in (Phase.REMOVE, Phase.READMIT):
            moving = set(s.plan.batch(s.step.batch).replicas)
        registered = await self._registered()
        for rid in s.plan.replicas:
            if rid in moving:
                continue
            url = self.backend.worker_url(rid)
            if rid in out and url in registered:
                self._say(f"router lists {rid}, which must be out of it now: removing it again")
                await self._remove_worker(registered[url])
            elif rid not in out and url not in registered:
                self._say(f"router lacks {rid}: adding it back")
                await self._add_worker(url)

    # ----- steps ---------------------------------------------------------------------------------
    async def _execute(self, step: Step) -> Event | None:
        plan = self.state.plan
        self._say(
            f"{'rollback: ' if step.rollback else ''}{step.phase.value}"
            + (
                f" batch {step.batch} ({len(plan.batch(step.batch).replicas)} replicas)"
                if step.batch is not None
                else ""
            )
        )
        if step.phase is Phase.BASELINE:
            return await self._baseline(step)
        target = plan.from_version if step.rollback else plan.to_version
        handlers = {
            Phase.REMOVE: self._remove,
            Phase.DRAIN: self._drain,
            Phase.HEALTH: lambda s: self._health(s, target),
            Phase.UPDATE: lambda s: self._update(s, target),
            Phase.WARMUP: self._warmup,
            Phase.READMIT: self._readmit,
            Phase.SOAK: self._soak,
        }
        return await handlers[step.phase](step)

    async def _measure(self, seconds: float) -> WindowStats:
        for _ in range(MAX_WINDOW_RESTARTS + 1):
            before, t0 = await self._counters(), time.monotonic()
            await asyncio.sleep(seconds)
            after = await self._counters()
            stats = window_stats(before, after, time.monotonic() - t0)
            if stats is not None:
                return stats
            self._say("router counters went back to zero (router restarted): measuring the window again")
        raise RouterUnavailable(f"router restarted {MAX_WINDOW_RESTARTS + 1} times while measuring")

    async def _baseline(self, step: Step) -> Event:
        seconds = self.state.plan.timings.baseline_window_s
        self._say(f"measuring the baseline over {seconds:g} s")
        stats = await self._measure(seconds)
        detail = (
            f"{stats.qps:.1f} req/s, P99 {stats.p99_s * 1000:.1f} ms, error rate {stats.error_rate:.3%}"
            if stats.p99_s is not None
            else f"no traffic in {seconds:g} s: QPS and P99 gates cannot be evaluated"
        )
        return self._event("baseline", step, detail, baseline=stats)

    async def _remove(self, step: Step) -> Event:
        urls = self._urls(step)
        registered = await self._registered()
        for url in urls.values():
            if url in registered:
                await self._remove_worker(registered[url])
        deadline = time.monotonic() + self.state.plan.timings.drain_timeout_s
        while still := set(urls.values()) & set(await self._registered()):
            if time.monotonic() >= deadline:
                return self._event("failed", step, f"router still lists {sorted(still)} after removal")
            await asyncio.sleep(self.poll_s / 4)
        return self._event("done", step)

    async def _in_flight(self, url: str) -> float:
        try:
            snap = await self.router.worker_metrics(url)
        except httpx.HTTPError:
            return 0.0  # not listening: nothing in flight there
        return snap.value(WORKER_RUNNING) + snap.value(WORKER_QUEUED)

    async def _drain(self, step: Step) -> Event:
        """Wait until the batch's workers report no running or queued request (SGLang's own gauges).

        The router's per-worker ``smg_worker_requests_active`` stays 0 in sglang-router 0.3.2 (checked
        under load), so the workers' ``sglang:num_running_reqs`` + ``sglang:num_queue_reqs`` decide; the
        router stopped sending new requests when the removal step saw the worker leave its list.
        """
        urls = list(self._urls(step).values())
        timeout = self.state.plan.timings.drain_timeout_s
        t0 = time.monotonic()
        while True:
            in_flight = sum(await asyncio.gather(*(self._in_flight(u) for u in urls)))
            waited = time.monotonic() - t0
            if in_flight <= 0:
                return self._event("done", step, f"drained in {waited:.2f} s")
            if waited >= timeout:
                return self._event(
                    "done",
                    step,
                    f"drain timeout: {in_flight:.0f} requests still running after {timeout:g} s; updating anyway",
                )
            self._say(f"draining: {in_flight:.0f} requests in flight on the batch's workers")
            await asyncio.sleep(self.poll_s)

    async def _update(self, step: Step, version: str) -> Event:
        ids = list(self._urls(step))
        self._say(f"updating {len(ids)} replicas to {version} via {self.backend.name}")
        try:
            await self.backend.update(ids, version, self.state.plan.timings.health_timeout_s)
        except BackendError as exc:
            return self._event("failed", step, str(exc))
        return self._event("done", step, f"set to {version}")

    async def _probe(self, url: str) -> str:
        try:
            response = await self._http.get(
                url + "/health_generate", timeout=self.state.plan.timings.health_check_timeout_s
            )
        except httpx.HTTPError as exc:
            return type(exc).__name__
        return str(response.status_code)

    async def _health(self, step: Step, version: str) -> Event:
        urls = self._urls(step)
        timeout = self.state.plan.timings.health_timeout_s
        t0 = time.monotonic()
        last: dict[str, str] = {}
        pending = set(urls)
        while pending:
            answers = await asyncio.gather(*(self._probe(urls[r]) for r in sorted(pending)))
            last.update(zip(sorted(pending), answers, strict=True))
            pending = {r for r in pending if last[r] != "200"}
            waited = time.monotonic() - t0
            if not pending:
                break
            if waited >= timeout:
                worst = ", ".join(f"{r} ({last[r]})" for r in sorted(pending))
                return self._event("failed", step, f"health timeout: {worst} not healthy after {timeout:g} s")
            self._say(f"waiting for /health_generate: {len(pending)} of {len(urls)} not healthy yet")
            await self._reconcile()
            await asyncio.sleep(self.poll_s)
        running = await self.backend.versions(list(urls))
        wrong = {r: v for r, v in running.items() if v != version}
        if wrong:
            return self._event("failed", step, f"healthy but running {wrong}, expected {version}")
        return self._event("done", step, f"healthy after {time.monotonic() - t0:.2f} s")

    async def _warmup(self, step: Step) -> Event:
        plan = self.state.plan
        t = plan.timings
        urls = self._urls(step)
        if t.warmup_s <= 0:
            return self._event("done", step, "no warm-up (serving.warmup_duration_s is 0)")
        baseline = self.state.baseline
        per_replica = baseline.qps / len(plan.replicas) if baseline else 0.0
        n = warmup_requests(per_replica, t.warmup_share, t.warmup_s)
        self._say(f"warm-up: {n} synthetic requests to each of {len(urls)} replicas over {t.warmup_s:g} s")
        specs = [
            LoadSpec(url=u, rate_per_s=n / t.warmup_s, duration_s=t.warmup_s, max_requests=n, max_in_flight=n,
                     body=DEFAULT_BODY, timeout_s=max(t.health_check_timeout_s, 1.0))
            for u in urls.values()
        ]  # fmt: skip
        reports = await asyncio.gather(*(run_load(s) for s in specs))
        sent = sum(r.count for r in reports)
        failed = {rid: r.errors for rid, r in zip(urls, reports, strict=True) if r.errors}
        p99 = max((r.p99_s for r in reports if r.ok), default=float("nan"))
        if failed:
            rate = sum(failed.values()) / sent
            breach = (
                f"warm-up error rate {rate:.2%} > {plan.limits.max_error_rate:.2%}: failed synthetic requests "
                f"per replica {failed}, {n} sent to each"
            )
            gates = Gates(None, None, rate, rate, rate, 0.0, (breach,))
            return self._event("failed", step, breach, gates=gates)
        return self._event("done", step, f"warm-up: {sent} synthetic requests, 0 errors, P99 {p99 * 1000:.1f} ms")

    async def _readmit(self, step: Step) -> Event:
        urls = self._urls(step)
        registered = await self._registered()
        for url in urls.values():
            if url not in registered:
                await self._add_worker(url)
        timeout = self.state.plan.timings.health_timeout_s
        t0 = time.monotonic()
        while True:
            workers = await self._router_call("GET /workers", self.router.list_workers)
            healthy = {w.url for w in workers if w.is_healthy}
            missing = sorted(r for r, u in urls.items() if u not in healthy)
            if not missing:
                break
            if time.monotonic() - t0 >= timeout:
                return self._event("failed", step, f"router did not admit {missing} within {timeout:g} s")
            await asyncio.sleep(self.poll_s / 2)
        if step.batch is not None and not step.rollback:
            self.readmitted_at[step.batch] = time.time()
        return self._event("done", step, f"readmitted in {time.monotonic() - t0:.2f} s")

    async def _soak(self, step: Step) -> Event | None:
        plan = self.state.plan
        interval = plan.timings.interval_s
        baseline = self.state.baseline
        if baseline is None or interval <= 0:
            return self._event("done", step, "no soak (rollout.interval_s is 0 or no baseline)")
        restarts = 0
        note = ""
        start, t0 = await self._counters(), time.monotonic()
        last_reconcile = t0
        while True:
            await asyncio.sleep(self.poll_s)
            if self._pause.is_set():
                return None
            now_c, elapsed = await self._counters(), time.monotonic() - t0
            stats = window_stats(start, now_c, elapsed)
            if stats is None:
                restarts += 1
                if restarts > MAX_WINDOW_RESTARTS:
                    raise RouterUnavailable(f"router restarted {restarts} times during the soak")
                note = f"router restarted during the soak ({restarts}×): worker list re-checked, window re-measured; "
                self._say(note)
                await self._reconcile()
                start, t0 = await self._counters(), time.monotonic()
                continue
            gates = evaluate(baseline, stats, plan.limits)
            self._say(f"soak {elapsed:.1f}/{interval:g} s", gates)
            if error_budget_exhausted(baseline, stats, plan.limits, interval):
                gates = replace(gates, breaches=(error_breach(stats, plan.limits),))
                return self._event("failed", step, note + "; ".join(gates.breaches), gates=gates)
            if elapsed >= interval:
                kind: EventKind = "done" if gates.passed else "failed"
                return self._event(kind, step, note + ("; ".join(gates.breaches) or gates.summary()), gates=gates)
            if time.monotonic() - last_reconcile >= 1.0:
                await self._reconcile()
                last_reconcile = time.monotonic()
