"""The updater's I/O shell: runs the state machine's steps against the router, the workers and a backend.

For each step the runner does the I/O, turns the result into an :class:`~serving.rollout.machine.Event`,
advances the pure state, and writes the event to the journal *before* it acts on the new state.
Membership goes through the backend's model (:mod:`serving.rollout.membership`) on EVERY router instance: a
removal or readmission is done only when each instance shows it, and its event names each instance's seconds.
Before each step the runner puts every instance in line with the state (a restarted router comes back with its
command-line workers, or with what its discovery selects). Router calls that fail at the transport level are
retried for ``router_grace_s``; after that the rollout pauses with the reason (``router_lost``).

Warm-up. The source ramps a new replica at 10 % of traffic for 30 s. The gateway (smg 1.13) has no
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
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Literal, TypeVar

import httpx

from serving.fleet_http import FleetHttp, HttpFailure
from serving.rollout.backends import Backend, BackendError, PodsStuck
from serving.rollout.gates.findings import MIN_REQUESTS
from serving.rollout.gates.judge import canary_budget_spent, judge, traffic_needed
from serving.rollout.gates.verdict import Basis, Gates, with_kv_pool
from serving.rollout.gates.window import (
    ROUTER_GATE_METRICS,
    WORKER_GATE_METRICS,
    GroupStats,
    ReplicaReading,
    ReplicaWindow,
    RouterReading,
    WindowStats,
    group_stats,
    replica_windows,
    window_break,
    window_stats,
)
from serving.rollout.journal import Journal
from serving.rollout.kvpool import check as check_kv_pool
from serving.rollout.machine import Event, EventKind, Phase, RolloutState, Step, advance
from serving.rollout.membership import Membership
from serving.rollout.plan import warmup_requests
from serving.router.client import WORKER_QUEUED, WORKER_RUNNING, MetricsSnapshot, RouterApiError, parse_only
from serving.router.loadgen import DEFAULT_BODY, TRANSPORT_ERROR, LoadSpec, run_load
from serving.router.membership import MembershipTimeout, Observed
from serving.sglang_health import SCHEDULER_HEALTH_PATH

T = TypeVar("T")
MAX_WINDOW_RESTARTS = 3  # router restarts tolerated inside one measurement window
SOAK_CHECK_S = 0.25  # router-only reads inside a soak, for the canary's error budget (the window's ends are exact)
VERDICT_EVENT: Mapping[str, EventKind] = {"pass": "done", "rollback": "failed", "pause": "outside"}


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


@dataclass(frozen=True)
class Reading:
    """One read for the gates: every router instance's reading (by API URL), each replica's figures summed over
    them, when (monotonic: the middle of the read, when the scrapes sampled the counters) and how long it took."""

    routers: dict[str, RouterReading]
    replicas: dict[str, ReplicaReading]
    at: float
    took: float
    asked_again: tuple[str, ...] = ()  # replicas whose scrape timed out once and answered when asked again

    def due(self, seconds: float) -> float:
        """When to start the read that ends a window of at least ``seconds`` from this one: a read's time is its
        middle, never before its start, so the window is ``seconds`` plus half the end read. (Started half of this
        read earlier, a faster end read made the window short of ``seconds``: a 10 s soak measured 9.99 s, under
        the two load polls its QPS gate needs, and was not judged.)"""
        return self.at + seconds


class ErrorMeter:
    """Cumulative client-facing errors of every router instance since the rollout began, across restarts."""

    def __init__(self, total: float) -> None:
        self.total = total
        self._last: dict[str, float] = {}

    def observe(self, routers: Mapping[str, RouterReading]) -> float:
        for router, reading in routers.items():
            now = reading.counters.client_errors
            if (last := self._last.get(router)) is not None:
                self.total += now - last if now >= last else now
            self._last[router] = now
        return self.total


# The first ask of each replica's /metrics in a read of every replica, at once. A scrape's time-out is there to find a
# replica that does not answer, so the updater's own work on the answers in flight must stay well inside it: each
# answer costs its event loop about 0.2 ms of CPU (aiohttp and the parse), and 256 in flight at once were a wave of
# ~50 ms of work, seconds of wall time when a saturated machine gave the updater a tenth of a core (2,048 replicas on
# two cores, docs/scale.md), while every one of them counted its 3 s. Second asks, the routers' metrics, health probes
# and drain reads go through the other session (FleetHttp's 256): they do not queue behind the first asks, and a hung
# replica's second ask starts once its first timed out. A read of H hung replicas among N therefore takes about
# 3 s × ceil(H / 64) for the first asks (beside the N − H that answer) plus 3 s for the second ones, where one session
# of 256 for both took about 3 s × ceil(2H / 256): 410 hung (a wedged batch) ~24 s a read instead of ~12 s, all
# 2,048 ~99 s instead of ~48 s, so a pause comes later when the whole fleet stops answering the updater. On a fleet,
# where each replica's SGLang renders its /metrics on every scrape (prometheus_client's multiprocess collector), a
# read of 2,048 is 32 rounds of 64 such renders.
SCRAPES_AT_ONCE = 64


def spread(replicas: Sequence[str]) -> list[str]:
    """``replicas`` in a shuffled order, the same one for the same list (a fixed seed: two reads of a window's ends
    take the same path)."""
    order = list(replicas)
    random.Random(len(order)).shuffle(order)
    return order


async def asked_again_after_a_timeout(
    scrape: Callable[[], Awaitable[MetricsSnapshot]], again: Callable[[], Awaitable[MetricsSnapshot]]
) -> tuple[MetricsSnapshot | str, int]:
    """A replica's scrape, or why it did not answer, and how many times it was asked. One that timed out is asked once
    more (``again``): a replica is read as down (which pauses a rollout as evidence outside its batch) only on a second
    time-out, or at once when it refuses the connection or answers an error. At 2,048 replicas on two cores single
    scrapes ran past 3 s while the replica served: one of 2,048 paused a soak that every other figure passed
    (docs/scale.md)."""
    try:
        return await scrape(), 1
    except HttpFailure as exc:
        if not exc.why.startswith("Timeout"):
            return exc.why, 1
    try:
        return await again(), 2
    except HttpFailure as exc:
        return f"{exc.why}, asked twice", 2


def asked_again_note(start: Reading, end: Reading) -> str:
    """What a window's two reads owe to a second ask (empty: nothing): the replicas whose scrape timed out once and
    answered when asked again, at the window's start and at its end. The journal keeps it for the window it judges
    (not for a window measured again after a router restart, nor an early read on a spent error budget), so that how
    close that window came to reading a serving replica as down is on record, not only the windows that did."""
    if not start.asked_again and not end.asked_again:
        return ""

    def named(reading: Reading) -> str:
        names = ", ".join(reading.asked_again[:5]) + (", …" if len(reading.asked_again) > 5 else "")
        return f"{len(reading.asked_again)} of {len(reading.replicas)}" + (f" ({names})" if names else "")

    return f"; answered only when asked again after a time-out: {named(start)} at the start, {named(end)} at the end"


class Runner:
    def __init__(
        self,
        state: RolloutState,
        journal: Journal,
        backend: Backend,
        membership: Membership,
        *,
        progress: ProgressFn | None = None,
        router_grace_s: float = 30.0,
        poll_s: float = 0.05,
        accept_inconclusive: bool = False,
    ) -> None:
        self.state = state
        self.journal = journal
        self.backend = backend
        self.membership = membership  # every router instance: its worker list, and its metrics for the gates
        self.progress = progress or (lambda _p: None)
        self.router_grace_s = router_grace_s
        self.poll_s = poll_s
        self.accept_inconclusive = accept_inconclusive  # gates too little traffic leaves unjudged pass (said so)
        self.errors = ErrorMeter(state.client_errors)
        self._pause = asyncio.Event()
        self._pause_recorded = False
        self.readmitted_at: dict[int, float] = {}  # batch → wall time its readmission finished
        self.rollback_started_at: float | None = None
        # the routers' metrics, the batch's health probes, drain reads and second asks of a replica's metrics
        self._http = FleetHttp(timeout_s=5.0)
        self._first_asks = FleetHttp(timeout_s=5.0, at_once=SCRAPES_AT_ONCE)  # a read's first ask of each replica

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
        await self._first_asks.aclose()
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
        text = {
            "done": "done",
            "failed": "FAILED",
            "blocked": "BLOCKED:",
            "baseline": "baseline measured",
            "outside": "PAUSED on evidence outside the batch:",
        }.get(ev.kind, ev.kind)
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
            except (httpx.HTTPError, HttpFailure) as exc:
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.router_grace_s
                    self._say(f"router not answering ({what}: {exc!r}); retrying for {self.router_grace_s:.0f} s")
                if now >= deadline:
                    raise RouterUnavailable(
                        f"{what}: no answer from {_target(exc)} for {self.router_grace_s:.0f} s ({exc!r})"
                    ) from None
                await asyncio.sleep(min(1.0, self.poll_s * 2))

    # ----- the gates' readings -------------------------------------------------------------------
    async def _scrape(
        self, url: str, names: tuple[str, ...], timeout_s: float = 5.0, via: FleetHttp | None = None
    ) -> MetricsSnapshot:
        """One Prometheus scrape, only the families the gates read (:func:`serving.router.client.parse_only`), through
        ``via`` (default: the session of the routers' metrics and the probes)."""
        response = await (via or self._http).get(url, timeout_s=timeout_s)
        if response.status != 200:
            raise HttpFailure(url, f"HTTP {response.status}")
        return parse_only(response.text, names)

    async def _worker_scrape(self, url: str) -> tuple[MetricsSnapshot | str, int]:
        """A replica's own ``/metrics``, or why it did not answer, and the asks it took
        (:func:`asked_again_after_a_timeout`); each ask bounded by ``serving.health_check_timeout_s`` so that a hung
        worker cannot hold the end of a window."""
        timeout_s = self.state.plan.timings.health_check_timeout_s
        return await asked_again_after_a_timeout(
            lambda: self._scrape(url + "/metrics", WORKER_GATE_METRICS, timeout_s, self._first_asks),
            lambda: self._scrape(url + "/metrics", WORKER_GATE_METRICS, timeout_s),
        )

    async def _read(self, urls: Mapping[str, str], *, workers: bool) -> Reading:
        """A scrape of EVERY router instance (all of them or none: one that does not answer is retried for the grace
        period, then the rollout pauses) and, with ``workers``, every replica's own scrape at the same time."""
        ids = list(urls)
        routers = self.membership.routers
        started = time.monotonic()

        async def scrape_all() -> list[tuple[MetricsSnapshot | str, int]]:
            # in a shuffled order: the first asks in flight at once (SCRAPES_AT_ONCE) would otherwise be consecutive
            # replicas, which share nodes (a node's NIC and CPU on a fleet, one worker process of 256 in the scale
            # sandbox, whose replicas then waited on each other past the time-out, twice)
            if not workers:
                return []
            order = spread(ids)
            by_id = dict(zip(order, await asyncio.gather(*(self._worker_scrape(urls[r]) for r in order)), strict=True))
            return [by_id[r] for r in ids]

        async def scrape_routers() -> dict[str, RouterReading]:
            instances = await routers.urls()
            snaps = await asyncio.gather(
                *(self._scrape(routers.metrics_url(u), ROUTER_GATE_METRICS) for u in instances)
            )
            worker_urls = list(urls.values())
            return {u: RouterReading.read(snap, worker_urls) for u, snap in zip(instances, snaps, strict=True)}

        readings, scraped = await asyncio.gather(
            self._router_call("metrics of every router instance", scrape_routers), scrape_all()
        )
        self.errors.observe(readings)
        found: list[MetricsSnapshot | str | None] = [w for w, _ in scraped] if workers else [None] * len(ids)
        replicas = {r: ReplicaReading.read(readings, urls[r], w) for r, w in zip(ids, found, strict=True)}
        again = tuple(ids[i] for i, (w, asks) in enumerate(scraped) if asks > 1 and not isinstance(w, str))
        done = time.monotonic()
        return Reading(readings, replicas, (started + done) / 2, done - started, again)

    def _in_router(self, replicas: list[str]) -> dict[str, str]:
        out = self.state.out_of_router()
        return {r: self.backend.worker_url(r) for r in replicas if r not in out}

    def _groups(self, batch: int) -> tuple[list[str], list[str], Basis, dict[str, str]]:
        """The canary (the batch), its peers and their basis (see :mod:`serving.rollout.gates.judge`), and the URL of
        every replica measured: every one in the router, with those found on the target before the plan."""
        s = self.state
        plan = s.plan
        canary = list(plan.batch(batch).replicas)
        others = [rec for rec in s.batches if rec.index != batch]
        old = [r for rec in others if rec.version in (None, plan.from_version) for r in plan.batch(rec.index).replicas]
        updated = [
            r for rec in others if rec.passed and rec.version == plan.to_version for r in plan.batch(rec.index).replicas
        ]
        before_plan = [r for r, v in plan.observed.items() if r not in set(plan.replicas) and v == plan.to_version]
        urls = self._in_router([*canary, *(r for r in plan.replicas if r not in canary), *before_plan])
        old = [r for r in old if r in urls]
        updated = [r for r in (*updated, *before_plan) if r in urls]
        if old:
            return canary, old, "not-updated", urls
        if updated:
            return canary, updated, "updated", urls
        return canary, [], "pre-rollout", urls

    def _urls(self, step: Step) -> dict[str, str]:
        assert step.batch is not None
        return {r: self.backend.worker_url(r) for r in self.state.plan.batch(step.batch).replicas}

    def _ids(self, step: Step) -> list[str]:
        assert step.batch is not None
        return list(self.state.plan.batch(step.batch).replicas)

    async def _reconcile(self) -> None:
        """Put every router instance in line with the state (the batch being removed or readmitted is left as it
        is: that step moves it)."""
        s = self.state
        moving: set[str] = set()
        if s.step is not None and s.step.batch is not None and s.step.phase in (Phase.REMOVE, Phase.READMIT):
            moving = set(s.plan.batch(s.step.batch).replicas)
        others = [r for r in s.plan.replicas if r not in moving]
        fix = partial(self.membership.reconcile, others, s.out_of_router())
        try:
            notes = await self._router_call("reconcile", fix)
        except (MembershipTimeout, RouterApiError, BackendError) as exc:
            notes = [f"could not put every router in line yet: {exc}"]  # the next step's proof decides
        for note in notes:
            self._say(note)

    async def _move(self, step: Step, what: str, change: Callable[[], Awaitable[Observed]]) -> Event:
        """One membership change of the batch: done once every router instance shows it, its event naming each
        instance's seconds; failed when one does not in time, or the platform refused the change."""
        try:
            seen = await self._router_call(what, change)
        except (MembershipTimeout, RouterApiError, BackendError) as exc:
            return self._event("failed", step, f"{what}: {exc}")
        return self._event("done", step, seen.summary())

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

    async def _measure(
        self, seconds: float, urls: Mapping[str, str]
    ) -> tuple[WindowStats, dict[str, ReplicaWindow], str]:
        """Router-wide and per-replica figures over ``seconds`` (measured again if the router restarts), and the
        window's :func:`asked_again_note`."""
        for _ in range(MAX_WINDOW_RESTARTS + 1):
            before = await self._read(urls, workers=True)
            await asyncio.sleep(max(0.0, before.due(seconds) - time.monotonic()))
            after = await self._read(urls, workers=True)
            stats = window_stats(before.routers, after.routers, after.at - before.at)
            if stats is not None:
                return stats, replica_windows(before.replicas, after.replicas), asked_again_note(before, after)
            self._say(f"{window_break(before.routers, after.routers)}: measuring the window again")
        raise RouterUnavailable(
            f"router instances restarted or changed {MAX_WINDOW_RESTARTS + 1} times while measuring"
        )

    async def _baseline(self, step: Step) -> Event:
        """The fleet before the rollout, router-wide and per replica: the warm-up's request rate, the canary's
        error budget, the reference of a single-batch rollout and the measure of later traffic dips."""
        seconds = self.state.plan.timings.baseline_window_s
        self._say(f"measuring the baseline over {seconds:g} s")
        stats, windows, asked = await self._measure(seconds, self._in_router(list(self.state.plan.replicas)))
        down = {r: "; ".join(w.problems) for r, w in windows.items() if w.problems}
        stats = replace(stats, replicas=group_stats(windows, stats.seconds, down))
        per = stats.replicas
        assert per is not None
        detail = (
            (
                f"{stats.qps:.1f} req/s ({per.qps_per_replica:.2f} per replica), P99 {stats.p99_s * 1000:.1f} ms "
                f"(replicas' own {'n/a' if per.p99_s is None else f'{per.p99_s * 1000:.1f} ms'}), "
                f"error rate {stats.error_rate:.3%}"
                if stats.p99_s is not None
                else f"no traffic in {seconds:g} s: QPS and P99 gates cannot be evaluated"
            )
            + (f"; down: {', '.join(f'{r} ({why})' for r, why in down.items())}" if down else "")
            + asked
        )
        blind = self._blind(per)
        if blind:
            return self._event("outside", step, f"{detail}. {blind}")
        return self._event("baseline", step, detail, baseline=stats)

    def _blind(self, per: GroupStats) -> str:
        """Why the first batch's soak could not be judged at the baseline's traffic (empty: it could, there is no
        soak, or the operator accepts inconclusive gates): too few requests to reach :data:`MIN_REQUESTS`."""
        plan = self.state.plan
        interval = plan.timings.interval_s
        canary = len(plan.batch(0).replicas)
        expected = per.qps_per_replica * canary * interval
        if self.accept_inconclusive or interval <= 0 or expected >= MIN_REQUESTS:
            return ""
        need, total = traffic_needed(canary, len(plan.replicas), interval)
        return (
            f"inconclusive: at this traffic batch 0 ({canary} replicas) would get {expected:.0f} requests in its "
            f"{interval:g} s soak and its QPS, P99 and error gates need {MIN_REQUESTS}: send at least {need:.2f} req/s "
            f"per replica ({total:.1f} req/s through the routers) and resume (the baseline is measured again), or "
            "resume with --accept-inconclusive to roll out without judging the gates. Nothing was changed"
        )

    async def _remove(self, step: Step) -> Event:
        ids = self._ids(step)
        timeout = self.state.plan.timings.drain_timeout_s
        return await self._move(step, "removal", partial(self.membership.take_out, ids, timeout))

    async def _in_flight(self, url: str) -> float | str:
        """Running + queued requests as the worker itself reports them (SGLang's gauges), or why that is unknown:
        a worker that does not answer, or answers without the gauges, is never counted as idle."""
        try:
            snap = await self._scrape(
                url + "/metrics", (WORKER_RUNNING, WORKER_QUEUED), self.state.plan.timings.health_check_timeout_s
            )
        except HttpFailure as exc:
            return f"no answer from {url}/metrics ({exc.why})"
        if not snap.select(WORKER_RUNNING):
            return f"{url}/metrics has no {WORKER_RUNNING}"
        return sum(snap.per_scheduler(WORKER_RUNNING).values()) + sum(snap.per_scheduler(WORKER_QUEUED).values())

    async def _drain(self, step: Step) -> Event:
        """Wait until the batch's workers report no running or queued request (SGLang's own gauges).

        The router's per-worker ``smg_worker_requests_active`` counts only what that one instance sent, so the
        workers' ``sglang:num_running_reqs`` + ``sglang:num_queue_reqs``, which count every instance's requests,
        decide; the routers stopped sending new requests when the removal step saw the worker draining (or gone)
        on every instance.
        A count that cannot be read is unknown, not 0: the drain then runs to its timeout and says so.
        """
        urls = self._urls(step)
        timeout = self.state.plan.timings.drain_timeout_s
        t0 = time.monotonic()
        while True:
            counts = dict(zip(urls, await asyncio.gather(*(self._in_flight(u) for u in urls.values())), strict=True))
            busy = sum(n for n in counts.values() if isinstance(n, float))
            unknown = {r: why for r, why in counts.items() if isinstance(why, str)}
            waited = time.monotonic() - t0
            if busy <= 0 and not unknown:
                return self._event("done", step, f"drained in {waited:.2f} s")
            also = f"; in flight unknown on {len(unknown)}: " + ", ".join(f"{r} ({w})" for r, w in unknown.items())
            if waited >= timeout:
                return self._event(
                    "done",
                    step,
                    f"drain timeout: {busy:.0f} requests still running after {timeout:g} s"
                    + (also if unknown else "")
                    + "; updating anyway",
                )
            self._say(f"draining: {busy:.0f} requests in flight on the batch's workers" + (also if unknown else ""))
            await asyncio.sleep(self.poll_s)

    async def _update(self, step: Step, version: str) -> Event:
        """Update the batch's replicas. Pods the platform cannot bring back without an operator (:class:`PodsStuck`:
        a dead node's pod Terminating, a replacement unschedulable) are named at once and waited on, the update
        retried (idempotent: each try holds the new pods out of the routers) until the health timeout: an operator's
        fix in that time lets the rollout go on by itself. Still stuck past it, or on a pause request, the rollout
        pauses at this step (``blocked``), never rolls back: the restore would wait on the same pods. Any other
        failure, stuck pods before it or not, is the update's (``failed``): a crash-looping release rolls back."""
        ids = list(self._urls(step))
        self._say(f"updating {len(ids)} replicas to {version} via {self.backend.name}")
        timeout = self.state.plan.timings.health_timeout_s
        deadline = time.monotonic() + timeout
        stuck = ""
        while True:
            try:
                await self.backend.update(ids, version, max(deadline - time.monotonic(), self.poll_s))
            except PodsStuck as exc:
                if str(exc) != stuck:
                    self._say(f"waiting for an operator until the {timeout:g} s health timeout: {exc}")
                stuck = str(exc)
                if time.monotonic() >= deadline or self._pause.is_set():
                    return self._event("blocked", step, stuck)
                await asyncio.sleep(self.poll_s)
                continue
            except BackendError as exc:  # not stuck pods (any more): the update failed, whatever came before
                return self._event("failed", step, str(exc) + (f" (before that: {stuck})" if stuck else ""))
            return self._event(
                "done", step, f"set to {version}" + (" (after pods stuck on an operator)" if stuck else "")
            )

    async def _probe(self, url: str) -> str:
        try:
            response = await self._http.get(
                url + SCHEDULER_HEALTH_PATH, timeout_s=self.state.plan.timings.health_check_timeout_s
            )
        except HttpFailure as exc:
            return exc.why
        return str(response.status)

    async def _health(self, step: Step, version: str) -> Event:
        urls = self._urls(step)
        timeout = self.state.plan.timings.health_timeout_s
        t0 = time.monotonic()
        last: dict[str, str] = {}
        pending = set(urls)
        last_reconcile = t0
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
            self._say(f"waiting for {SCHEDULER_HEALTH_PATH}: {len(pending)} of {len(urls)} not healthy yet")
            if time.monotonic() - last_reconcile >= 1.0:
                await self._reconcile()
                last_reconcile = time.monotonic()
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
                     body=DEFAULT_BODY, timeout_s=max(t.request_timeout_s, t.health_check_timeout_s, 1.0))
            for u in urls.values()
        ]  # fmt: skip
        reports = await asyncio.gather(*(run_load(s) for s in specs))
        sent = sum(r.count for r in reports)
        failed = {rid: r.errors for rid, r in zip(urls, reports, strict=True) if r.errors}
        p99 = max((r.p99_s for r in reports if r.ok), default=float("nan"))
        if failed:
            rate = sum(failed.values()) / sent
            statuses: Counter[str] = Counter()
            for r in reports:
                statuses.update(r.errors_by_status)
            breach = (
                f"warm-up error rate {rate:.2%} > {plan.limits.max_error_rate:.2%}: failed synthetic requests "
                f"per replica {failed}, {n} sent to each; by status {dict(statuses)} ({TRANSPORT_ERROR}: no answer within "
                f"{specs[0].timeout_s:g} s or the connection failed)"
            )
            gates = Gates(None, None, rate, rate, rate, 0.0, (breach,))
            return self._event("failed", step, breach, gates=gates)
        return self._event("done", step, f"warm-up: {sent} synthetic requests, 0 errors, P99 {p99 * 1000:.1f} ms")

    async def _readmit(self, step: Step) -> Event:
        ids = self._ids(step)
        timeout = self.state.plan.timings.health_timeout_s
        event = await self._move(step, "readmission", partial(self.membership.bring_back, ids, timeout))
        if event.kind == "done" and step.batch is not None and not step.rollback:
            self.readmitted_at[step.batch] = time.time()
        return event

    async def _soak(self, step: Step) -> Event | None:
        """Soak the batch for ``rollout.interval_s`` and judge it against its peers over the same window
        (:func:`serving.rollout.gates.judge.judge`): pass, roll back, or pause on evidence outside the batch. Between the
        window's two full reads (router and every replica) only the router is read, every ``SOAK_CHECK_S``. Once the
        canary's error budget for the interval is spent, the window so far is read in full and judged: a rollback
        verdict ends the soak at once; any other (evidence outside the batch, such as a traffic dip that leaves the
        window too thin) is no verdict on the interval, so the soak goes on and judges again once the window has
        doubled, and at its end. Only a window of the whole interval, or an early rollback, is returned."""
        plan = self.state.plan
        interval = plan.timings.interval_s
        before = self.state.baseline
        if before is None or interval <= 0 or step.batch is None:
            return self._event("done", step, "no soak (rollout.interval_s is 0 or no baseline)")
        canary, peers, basis, urls = self._groups(step.batch)
        expected = _attempt_rate(before, len(plan.replicas)) * len(canary) * interval
        note = ""
        for restarts in range(1, MAX_WINDOW_RESTARTS + 2):
            start = await self._read(urls, workers=True)
            budget_from, watch_breaks = start.at, True  # when a spent budget may end the window; router-only breaks
            while True:
                ended = await self._soak_until_due(start, interval, urls, canary, peers, expected, budget_from,
                                                   watch_breaks)  # fmt: skip
                if ended is None:
                    return None
                end = await self._read(urls, workers=True)
                fleet = window_stats(start.routers, end.routers, end.at - start.at)
                if fleet is None:
                    break
                gates = judge(
                    canary, peers, replica_windows(start.replicas, end.replicas), basis=basis,
                    seconds=end.at - start.at, fleet=fleet, before=before, limits=plan.limits,
                    accept_inconclusive=self.accept_inconclusive,
                )  # fmt: skip
                assert gates.verdict is not None
                if end.at < start.due(interval) and not (ended == "budget" and gates.verdict.decision == "rollback"):
                    if ended == "budget":  # judged again once the window is twice as long (and at its end)
                        budget_from = start.at + 2 * (end.at - start.at)
                        self._say(
                            f"soak {end.at - start.at:.1f}/{interval:g} s: the canary's error budget is spent, but "
                            f"the window so far is no rollback ({gates.verdict.decision}): soaking on"
                        )
                    else:  # a router-only read saw a change the full read does not: the end read checks again
                        watch_breaks = False
                    continue
                if plan.kv is not None:  # the canary checks the plan: its KV pool against kv_pool_tokens_per_replica
                    gates = with_kv_pool(
                        gates, check_kv_pool(plan.kv, {r: end.replicas[r].kv for r in canary if r in end.replicas})
                    )
                assert gates.verdict is not None
                return self._event(
                    VERDICT_EVENT[gates.verdict.decision],
                    step,
                    note + gates.verdict.summary() + asked_again_note(start, end),
                    gates=gates,
                )
            why = window_break(start.routers, end.routers)
            note = (
                f"router restarted during the soak ({restarts}×: {why}): worker lists re-checked, window re-measured; "
            )
            self._say(note)
            await self._reconcile()
        raise RouterUnavailable(
            f"router instances restarted or changed {MAX_WINDOW_RESTARTS + 1} times during the soak"
        )

    async def _soak_until_due(
        self,
        start: Reading,
        interval: float,
        urls: Mapping[str, str],
        canary: Sequence[str],
        peers: Sequence[str],
        expected: float,
        budget_from: float,
        watch_breaks: bool,
    ) -> Literal["due", "budget", "break"] | None:
        """Router-only reads every ``SOAK_CHECK_S`` until the window from ``start`` is due (``"due"``), the canary's
        error budget is spent at a read from ``budget_from`` on (``"budget"``), or, with ``watch_breaks``, a router
        instance changed (``"break"``: the full read that follows sees it); None: a pause was requested."""
        last_reconcile = time.monotonic()
        while (left := start.due(interval) - time.monotonic()) > 0:
            await asyncio.sleep(min(SOAK_CHECK_S, left))
            if self._pause.is_set():
                return None
            if start.due(interval) - time.monotonic() <= SOAK_CHECK_S / 2:
                continue  # too close to the end for a check: sleep the rest
            now = await self._read(urls, workers=False)
            if watch_breaks and window_break(start.routers, now.routers) is not None:
                return "break"
            windows = replica_windows(start.replicas, now.replicas)
            if now.at >= budget_from and canary_budget_spent(canary, peers, windows, expected, self.state.plan.limits):
                return "budget"
            failed = sum(windows[r].failures for r in canary if r in windows)
            tried = sum(windows[r].requests for r in canary if r in windows)
            self._say(f"soak {now.at - start.at:.1f}/{interval:g} s: canary {failed:.0f}/{tried:.0f} failed")
            if now.at - last_reconcile >= 1.0:
                await self._reconcile()
                last_reconcile = time.monotonic()
        return "due"


def _attempt_rate(before: WindowStats, replicas: int) -> float:
    """Upstream attempts per replica and second before the rollout (per replica when measured so)."""
    per = before.replicas
    if per is not None and per.replica_seconds > 0:
        return per.requests / per.replica_seconds
    return before.upstream_responses / before.seconds / replicas if before.seconds > 0 and replicas else 0.0


def _target(exc: httpx.HTTPError | HttpFailure) -> str:
    """The URL a failed call went to (the router instance, or a worker)."""
    if isinstance(exc, HttpFailure):
        return exc.url
    try:
        return str(exc.request.url)
    except RuntimeError:  # an error raised without its request
        return "the router"
