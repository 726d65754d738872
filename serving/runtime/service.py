"""The controller process: an HTTP endpoint for the agents' reports, the state machine's loops, leader
election, the leader's actions (router membership on every instance, migration through the deployment
backend, warm-up) and Prometheus metrics.

Every instance applies every report and counts missed ones (warm followers); only the leader acts, and
only while its term is valid and verified against the coordination service (:mod:`serving.runtime.leader`).
Losing the term cancels the actions in flight.

The leader acts on the router instances that answer (a :class:`~serving.router.membership.RouterSet` with
``answering_only``): one instance down, or answering errors (5xx, 408, 429), must not stall every removal and
readmission, nor keep a new leader from taking office: a won campaign resigns only when no instance answers. An
instance that missed a change is *unsynced* (``exaserve_runtime_router_unsynced``, alert ExaServeRouterUnsynced,
``status`` → ``unsynced_routers``); the leader lists it again every heartbeat interval and, once it answers, makes
its worker list match the controller's view (what is in rotation listed, what is out not), backing off while it
answers and fails those changes (``status`` → ``router_resync``).

Actions are counted as they happened. A migration's record says ``restarted``: whether its restart reached the
deployment; a restart that provably never reached the replica (:class:`~serving.rollout.backends.RestartUnreached`:
SSH never connected, the API server never answered before the eviction) or that the deployment refused is a failed
action with the restart back-off, no step towards quarantine. A removal the routers failed backs off the same way
before the controller decides it again (:meth:`~serving.runtime.controller.Controller.complete`, ``fenced``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict
from typing import Any, Protocol

import httpx
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from serving.fleet_http import http_client
from serving.plan.model import Fleet
from serving.rollout.backends import Backend, BackendError, ReplicaIndex, RestartUnreached
from serving.router.client import CIRCUIT_CLOSED, ROUTER_WORKER_CB_STATE, RouterApiError, RouterClient
from serving.router.loadgen import LoadSpec, run_load
from serving.router.membership import NoRouterAnswered, Observed, RouterSet, Silent, routed
from serving.runtime.agent import REPORTS_PATH
from serving.runtime.controller import Action, Controller, ControllerConfig, Kind, replica_urls
from serving.runtime.eviction import RestartRefused
from serving.runtime.leader import Election, ElectionError, Term
from serving.runtime.reports import Rejection, ReportRejected, parse_report
from serving.sglang_health import SCHEDULER_HEALTH_PATH
from serving.spec.schema import FleetSpec

STATUS_PATH = "/v1/status"
METRICS_PATH = "/metrics"
_RECENT_ACTIONS = 50
log = logging.getLogger(__name__)


class Restarter(Protocol):
    async def restart(self, replica_id: str, timeout_s: float) -> None:
        """Stop the replica's process (a hung one too) and start it again; raises BackendError."""
        ...


class BackendRestarter(ReplicaIndex):
    """Restart through a rollout backend (systemd over SSH): re-apply the version the stack says the replica's group
    runs. Kubernetes evicts the pod instead (:class:`serving.runtime.eviction.PodEvictionRestarter`): re-applying a
    version the pod already runs would restart nothing."""

    def __init__(self, fleet: Fleet, backend: Backend) -> None:
        super().__init__(list(fleet.plan.replicas))
        self.spec = fleet.spec
        self.backend = backend

    async def restart(self, replica_id: str, timeout_s: float) -> None:
        replica = self._replica(replica_id)
        await self.backend.update([replica_id], self.spec.group_version(replica.group), timeout_s)


class WarmupFailed(BackendError):
    """The replica answered ``/health`` and its warm-up requests failed: a live process whose generations fail, which
    :meth:`Controller.complete` is told (``answered``)."""


class WarmupSlow(BackendError):
    """The replica answered ``/health`` and its warm-up requests were too slow (or none was answered): no restart."""


class Deposed(RuntimeError):
    """This instance's term ended; it must not act."""


class ChangesFailed(RuntimeError):
    """A router instance answered its listing and then failed the changes that would make it match (the cause)."""


def _warmup_verdict(spec: FleetSpec, errors: float, p99_s: float, count: int) -> tuple[BackendError | None, str]:
    """Why a warm-up failed (None when it passed), and its figures: its requests failing is :class:`WarmupFailed`
    (generations fail in a live process: a restart is due), too slow or none answered is :class:`WarmupSlow`
    (latency alone restarts nothing: the readmission backs off)."""
    detail = (
        f"{count} warm-up requests: error rate {errors:.3%} (max {spec.rollout.max_error_rate:.3%}), "
        f"P99 {p99_s:.3f} s (max {spec.limits.p99_target_s:g} s)"
    )
    if count > 0 and errors > spec.rollout.max_error_rate:
        return WarmupFailed(f"warm-up failed: {detail}"), detail
    if count == 0 or p99_s > spec.limits.p99_target_s:
        return WarmupSlow(f"warm-up too slow: {detail}"), detail
    return None, detail


class ControllerService:
    """One controller instance."""

    def __init__(
        self,
        fleet: Fleet,
        *,
        identity: str,
        election: Election,
        routers: RouterSet,
        restarter: Restarter | None,
        discovered: bool = False,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """``clock`` times every decision (monotonic: a step of the wall clock moves none); ``wall_clock`` only
        stamps what people read (an action's ``at``) and measures the agents' clock skew."""
        self.spec = fleet.spec
        self.identity = identity
        self.election = election
        self.routers = routers
        self.restarter = restarter
        self.clock, self.wall_clock = clock, wall_clock
        self.controller = Controller(
            ControllerConfig.from_spec(fleet.spec, len(fleet.plan.replicas)),
            fleet.plan.replicas,
            replica_urls(fleet.plan),
            clock(),
            discovered=discovered,
        )
        self.term: Term | None = None
        self.leader: str | None = None
        self.recent: deque[dict[str, Any]] = deque(maxlen=_RECENT_ACTIONS)
        self._tasks: set[asyncio.Task[None]] = set()
        self._loads: dict[str, float] = {}
        self.unsynced: Silent = {}  # router instance → why it missed a membership change
        self.resync: dict[str, tuple[int, float]] = {}  # unsynced instance → (failed reconciliations, next try at)
        self.reconciled: deque[dict[str, Any]] = deque(maxlen=_RECENT_ACTIONS)
        self.routers_seen: set[str] = set()
        # replica → (its removals that failed in a row, time.monotonic() of the last failure)
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_Collector(self))

    # ----- HTTP ------------------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 20)
        app.router.add_post(REPORTS_PATH, self._on_report)
        app.router.add_get(STATUS_PATH, self._on_status)
        app.router.add_get(METRICS_PATH, self._on_metrics)
        return app

    async def _on_report(self, request: web.Request) -> web.Response:
        body = await request.read()
        try:
            report = parse_report(body)
        except ReportRejected as exc:
            self.controller.reject_malformed()
            return web.json_response({"rejected": exc.reason.value, "detail": exc.detail}, status=400)
        try:
            self.controller.receive(report, self.clock(), wall=self.wall_clock())
        except ReportRejected as exc:
            status = 404 if exc.reason in (Rejection.UNKNOWN_NODE, Rejection.UNKNOWN_REPLICA) else 409
            return web.json_response({"rejected": exc.reason.value, "detail": exc.detail}, status=status)
        return web.json_response({"accepted": True}, status=202)

    def status(self) -> dict[str, Any]:
        c = self.controller.counters
        return {
            "identity": self.identity,
            "leader": self.leader,
            "is_leader": self.acting(),
            "term": self.term.token if self.term else None,
            **self.controller.snapshot(self.clock()),
            "eviction_cap": self.controller.config.max_evicted,
            "move_candidates": self.controller.move_candidates(),
            "reports": {
                "accepted": c.accepted,
                "replicas": c.replicas,
                "answered": c.answered,
                "late": c.late,
                "rejected": {k.value: v for k, v in c.rejected.items()},
            },
            "actions": list(self.recent),
            "disrupted_racks": {
                rack: {"unhealthy_nodes": bad, "nodes": n}
                for rack, (bad, n) in sorted(self.controller.disrupted.items())
            },
            "restart_budget": {
                "tokens": round(self.controller.budget.refill(self.clock()), 2),
                "burst": self.controller.budget.burst,
                "per_min": round(self.controller.budget.rate_per_s * 60, 2),
                "withheld_disrupted": self.controller.counters.withheld,
                "withheld_budget": self.controller.counters.limited,
            },
            "unsynced_routers": dict(self.unsynced),
            "router_resync": {
                router: {"failed_tries": failed, "next_try_in_s": round(max(0.0, due - self.clock()), 1)}
                for router, (failed, due) in sorted(self.resync.items())
            },
            "reconciled_routers": list(self.reconciled),
        }

    async def _on_status(self, _request: web.Request) -> web.Response:
        return web.json_response(self.status())

    async def _on_metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    # ----- loops -----------------------------------------------------------------------------------
    def acting(self) -> bool:
        return self.term is not None and self.term.valid()

    async def run(self, host: str, port: int, stop: asyncio.Event) -> None:
        runner = web.AppRunner(self.app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        loops = [
            asyncio.create_task(self._lease_loop(stop)),
            asyncio.create_task(self._tick_loop(stop)),
            asyncio.create_task(self._load_loop(stop)),
            asyncio.create_task(self._reconcile_loop(stop)),
        ]
        try:
            await stop.wait()
        finally:
            for task in loops:
                task.cancel()
            self._cancel_actions()
            if self.term is not None:
                with contextlib.suppress(ElectionError, httpx.HTTPError):
                    await self.election.resign(self.term)
            await runner.cleanup()
            await self.election.aclose()

    async def _lease_loop(self, stop: asyncio.Event) -> None:
        """Renew every third of the lease. A renewal the coordination service did not answer keeps the term until its
        deadline and is asked again at a ninth of the lease (client-go: renew deadline, retry period): a slow etcd (a
        late fsync, a stalled process) must not hand leadership over, cancelling the actions under way, while the
        lease still holds."""
        period = self.spec.runtime.lease_ttl_s / 3
        while not stop.is_set():
            failed, term = False, self.term
            try:
                if term is None:
                    await self._lease_step()
                else:  # a renewal still unanswered at the term's deadline ends the term then, not a timeout later
                    await asyncio.wait_for(self._lease_step(), max(0.0, term.deadline - time.monotonic()))
            except (ElectionError, RouterApiError, httpx.HTTPError, OSError, TimeoutError) as exc:
                failed = True
                log.warning("%s: election: %s", self.identity, str(exc) or "no answer before the term's deadline")
            if self.term is not None and not self.term.valid():
                self._depose("term expired without renewal")
            wait = period / 3 if failed and self.term is not None else period
            if self.term is not None:  # awake at the deadline, to stand down on time (cancelling the actions under way)
                wait = min(wait, max(0.0, self.term.deadline - time.monotonic()))
            await _sleep(stop, wait)

    async def _lease_step(self) -> None:
        if self.term is None:
            term = await self.election.campaign()
            if term is not None:
                try:
                    listed, silent = await self.routers.membership()
                except (RouterApiError, httpx.HTTPError, OSError):
                    # no instance answered (NoRouterAnswered) or none was found (the routers' Service did not
                    # resolve): this instance cannot know what is in rotation, let another one lead. One instance that
                    # fails, in any way, is silent in the answering set's listing: never a reason to resign.
                    await self.election.resign(term)
                    raise
                registered = set.intersection(*(routed(workers) for workers in listed.values()))
                self._saw(listed, silent)
                self.controller.adopt(registered)
                self.term = term
                log.warning("%s: leader (term %d), %d replicas registered", self.identity, term.token, len(registered))
        else:
            renewed = await self.election.renew(self.term)
            if renewed is None:
                self._depose("lease lost")
            else:
                self.term = renewed
        self.leader = await self.election.leader()

    def _depose(self, why: str) -> None:
        log.warning("%s: no longer leader: %s", self.identity, why)
        self.term = None
        self._cancel_actions()
        # only the leader reads the routers' breakers: what it last read must not hold a follower's racks disrupted
        self.controller.breakers_open((), self.clock())

    def _cancel_actions(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    async def _tick_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            term = self.term if self.acting() else None
            if term is not None:
                open_urls = await self._open_breakers()
                for rid in self.controller.breakers_open(open_urls, self.clock()):
                    log.warning(
                        "%s: %s: every router holds its circuit breaker open: requests fail", self.identity, rid
                    )
            actions = self.controller.tick(self.clock(), acting=term is not None)
            if term is not None:
                for action in actions:
                    task = asyncio.create_task(self._execute(action, term))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
            await _sleep(stop, self.spec.serving.heartbeat_interval_s / 2)

    async def _open_breakers(self) -> set[str]:
        """Worker URLs whose circuit breaker every answering router instance that tracks them holds open
        (``smg_worker_cb_state`` 1, each router's own count of failed requests): a blip on one instance's path to a
        replica opens only that one's. An instance that does not answer shows nothing."""

        async def one(router: str) -> dict[str, float]:
            async with RouterClient(router, self.routers.metrics_url(router), timeout_s=self.routers.timeout_s) as c:
                try:
                    return (await c.metrics(only=(ROUTER_WORKER_CB_STATE,))).worker_gauge(ROUTER_WORKER_CB_STATE)
                except (httpx.HTTPError, TimeoutError) as exc:
                    log.debug("%s: router %s metrics: %s", self.identity, router, exc)
                    return {}

        seen = await asyncio.gather(*(one(r) for r in await self.routers.urls()))
        urls = set().union(*seen)
        # half-open (2) is not closed: smg moves an open breaker to half-open after its timeout (the rendered
        # --cb-timeout-duration-secs) to let trial requests through, and back to open when they fail; a replica whose
        # requests keep failing alternates between the two, and the dwell must not start again at each trial
        return {u for u in urls if all(states[u] != CIRCUIT_CLOSED for states in seen if u in states)}

    def _saw(self, answered: Iterable[str], silent: Silent) -> None:
        self.routers_seen.update(answered, silent)
        self.unsynced.update(silent)
        for router, why in silent.items():
            log.warning("%s: router %s did not answer (%s): unsynced until it does", self.identity, router, why)

    async def _reconcile_loop(self, stop: asyncio.Event) -> None:
        """Every heartbeat interval, while leading: :meth:`_reconcile_due`."""
        while not stop.is_set():
            if self.acting() and self.term is not None:
                await self._reconcile_due(self.term)
            await _sleep(stop, self.spec.serving.heartbeat_interval_s)

    async def _reconcile_due(self, term: Term) -> None:
        """Each unsynced router instance whose try is due is listed; one that answers is made to match the
        controller's view. A listing that fails (the instance silent, or answering errors) is tried again the next
        interval, so an instance that answers again is made whole within one. An instance that lists and then fails
        its changes (smg's job queue refusing them) has its next try (listing and changes) backed off: one interval
        after the first, doubling up to ``runtime.restart_backoff_max_s`` (a router failing its changes for an hour
        is asked ~12 times at prod, not 720), which starts again once it has taken its changes. This instance's own
        fencing failing is no try."""
        for router in sorted(self.unsynced):
            failed, due = self.resync.get(router, (0, float("-inf")))
            if self.clock() < due:
                continue
            try:
                await self._reconcile(router, term)
            except ChangesFailed as exc:
                wait = min(
                    self.spec.runtime.restart_backoff_max_s,
                    self.spec.serving.heartbeat_interval_s * 2.0 ** min(failed, 16),
                )
                self.resync[router] = (failed + 1, self.clock() + wait)
                log.warning(
                    "%s: router %s answers but failed its changes (%d tries; the next in %g s): %s",
                    self.identity, router, failed + 1, wait, exc.__cause__,
                )  # fmt: skip
            except (Deposed, RouterApiError, httpx.HTTPError, TimeoutError, ElectionError, OSError) as exc:
                log.warning("%s: router %s still unsynced: %s", self.identity, router, exc)
            else:
                self.resync.pop(router, None)

    async def _reconcile(self, router: str, term: Term) -> None:
        one = RouterSet([router], timeout_s=self.routers.timeout_s)
        listed = routed((await one.listed())[router])  # a draining entry is out already (never removed twice)
        settled = [rec for rec in self.controller.replicas.values() if rec.pending is None]
        extra = sorted(rec.url for rec in settled if not rec.in_rotation and rec.url in listed)
        missing = sorted(rec.url for rec in settled if rec.in_rotation and rec.url not in listed)
        await self._fence(term)
        try:
            if extra:
                await one.remove(*extra, timeout_s=self.spec.rollout.drain_timeout_s)
            if missing:
                await one.add(*missing, timeout_s=self.spec.serving.startup_budget_s)
        except (RouterApiError, httpx.HTTPError, TimeoutError, OSError) as exc:
            raise ChangesFailed(router) from exc
        del self.unsynced[router]
        self.reconciled.append({"router": router, "removed": extra, "added": missing, "at": self.wall_clock()})
        log.warning("%s: router %s answers again: removed %s, added %s", self.identity, router, extra, missing)

    async def _load_loop(self, stop: asyncio.Event) -> None:
        """The weighted load from the latest reports, every ``scheduler.period_ms``."""
        while not stop.is_set():
            self._loads = self.controller.loads()
            await _sleep(stop, self.spec.scheduler.period_ms / 1000)

    # ----- actions ---------------------------------------------------------------------------------
    def _still(self, term: Term) -> Term:
        """This instance's current term, if it is ``term``'s (a renewal replaces the object, not the token)."""
        if self.term is None or self.term.token != term.token:
            raise Deposed("term ended")
        return self.term

    async def _fence(self, term: Term) -> None:
        """Before each change: the term is this instance's, still valid, and the service names its token. A service
        that does not answer raises :class:`ElectionError`: no change is made, but the term stands (the lease loop
        judges it)."""
        current = self._still(term)
        # the term read again after the answer: the lease loop may have ended it while the check waited, and an answer
        # that came after the deadline confirms nothing
        if current.valid() and await self.election.verify(current) and self._still(term).valid():
            return
        self._depose("fencing token no longer current")
        raise Deposed("fencing token no longer current")

    async def _execute(self, action: Action, term: Term) -> None:
        started = time.monotonic()
        entry: dict[str, Any] = {**asdict(action), "term": term.token, "at": self.wall_clock()}
        if action.kind is Kind.MIGRATE:
            entry["restarted"] = False  # until the restart reached the deployment (_perform)
        ok = refused = False
        failure: BaseException | None = None
        try:
            await self._fence(term)
            entry["detail"] = await self._perform(action, term, entry)
            ok = True
        except asyncio.CancelledError as exc:
            entry["detail"] = "cancelled: leadership lost"
            failure = exc
            raise
        except (Deposed, RouterApiError, httpx.HTTPError, TimeoutError, BackendError, ElectionError, OSError) as exc:
            entry["detail"] = f"{type(exc).__name__}: {exc}"
            failure = exc
            if isinstance(exc, NoRouterAnswered):  # each instance missed this change: reconciled once it answers
                self._saw((), exc.silent)
            refused = isinstance(exc, RestartRefused)
            log.warning("%s: %s %s failed: %s", self.identity, action.kind.value, action.replica, exc)
        finally:
            entry.update(ok=ok, seconds=round(time.monotonic() - started, 3))
            self.recent.append(entry)
            # without a deployment backend no migration can restart anything: each one counts as a failed restart,
            # so quarantine ends the asking and ExaServeReplicaQuarantined names the replica
            made = entry.get("restarted", False) or self.restarter is None
            self.controller.complete(
                action,
                ok,
                refused=refused,
                restart_made=made,
                answered=isinstance(failure, WarmupFailed),
                fenced=isinstance(failure, Deposed | ElectionError | asyncio.CancelledError),
                now=self.clock(),
            )

    async def _perform(self, action: Action, term: Term, entry: dict[str, Any]) -> Any:
        """Carry ``action`` out; a migration's ``entry`` (its record) says ``restarted``: whether the restart reached
        the deployment (False until it is asked for: the fencing checks, the removal and the drain before it; False
        after it when the deployment provably never got it, :class:`RestartUnreached`, or refused it,
        :class:`RestartRefused`). A restart that reached the replica and then failed, or whose outcome is unknown
        (cancelled while under way, an error after the command was sent), counts as made."""
        timeout = self.spec.rollout.drain_timeout_s
        if action.kind is Kind.REMOVE:
            return asdict(self._observed(await self.routers.remove(action.url, timeout_s=timeout)))
        if action.kind is Kind.MIGRATE:
            removed = self._observed(await self.routers.remove(action.url, timeout_s=timeout))
            await self._drain(action.url)
            if self.restarter is None:
                raise BackendError("no deployment backend given to this controller; cannot restart the replica")
            await self._fence(term)
            entry["restarted"] = True
            try:
                await self.restarter.restart(action.replica, self.spec.serving.startup_budget_s)
            except (RestartUnreached, RestartRefused):
                entry["restarted"] = False  # nothing was restarted: a failed action, not a failed restart
                raise
            return {"removed": asdict(removed), "restarted": True}
        warm = await self._warm_up(action)
        await self._fence(term)
        added = self._observed(await self.routers.add(action.url, timeout_s=self.spec.serving.startup_budget_s))
        return {"warmup": warm, "added": asdict(added)}

    def _observed(self, observed: Observed) -> Observed:
        self._saw(observed.seconds_by_router, observed.silent)
        return observed

    async def _drain(self, url: str) -> None:
        """Wait for in-flight requests of a replica being migrated (each call bounded by the health timeout: a dead or
        hung replica has none to give back, and its clients' retries land elsewhere) while its /health still answers:
        a wedged scheduler's /metrics answers and shows requests that never finish."""
        async with RouterClient(url, url + METRICS_PATH, timeout_s=self.spec.serving.health_check_timeout_s) as c:
            with contextlib.suppress(httpx.HTTPError, TimeoutError):
                await c.wait_until_idle(url, timeout_s=self.spec.rollout.drain_timeout_s, while_healthy=True)

    async def _warm_up(self, action: Action) -> str:
        """Synthetic requests straight to the replica at ``serving.warmup_share`` of the mean rate for
        ``serving.warmup_duration_s`` (the router cannot ramp real traffic to one worker)."""
        # wait for the replica to answer its health check first (a restarted process is still loading)
        deadline = time.monotonic() + self.spec.serving.startup_budget_s
        async with http_client(timeout=self.spec.serving.health_check_timeout_s) as http:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get(action.url + SCHEDULER_HEALTH_PATH)).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{action.url} not healthy within serving.startup_budget_s")
                await asyncio.sleep(min(1.0, self.spec.serving.heartbeat_interval_s))
        duration = max(action.warmup_s or self.spec.serving.warmup_duration_s, 1.0 / action.rate_per_s)
        report = await run_load(LoadSpec(url=action.url, rate_per_s=action.rate_per_s, duration_s=duration))
        failure, detail = _warmup_verdict(self.spec, report.error_rate, report.p99_s, report.count)
        if failure is not None:
            raise failure
        return detail


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=max(0.0, seconds))


class _Collector:
    """Prometheus view of one controller, read at scrape time."""

    def __init__(self, service: ControllerService) -> None:
        self.s = service

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        ctl = self.s.controller
        node_score = GaugeMetricFamily("exaserve_runtime_node_score", "Node health score (0-100).", labels=["node"])
        node_suspect = GaugeMetricFamily(
            "exaserve_runtime_node_suspect", "1 when the node's agent missed its reports.", labels=["node"]
        )
        node_last = GaugeMetricFamily(
            "exaserve_runtime_node_last_report_age_seconds",
            "Seconds since the node's last report was sent (its receipt, less any delay in transit).",
            labels=["node"],
        )
        skew = GaugeMetricFamily(
            "exaserve_runtime_node_clock_skew_seconds",
            "The node's last report: its agent's wall-clock send time minus the controller's wall clock at receipt "
            "(its clock's offset, plus the transit).",
            labels=["node"],
        )
        now = self.s.clock()
        for name, node in ctl.nodes.items():
            node_score.add_metric([name], node.score)
            node_suspect.add_metric([name], float(node.suspect(ctl.config.missed_to_suspect)))
            node_last.add_metric([name], now - node.last_report_at)
            if node.skew_s is not None:
                skew.add_metric([name], node.skew_s)
        racks = GaugeMetricFamily(
            "exaserve_runtime_rack_disrupted",
            "1 while the rack is disrupted (more than 2 of its nodes, and runtime.disrupted_share of them, unhealthy): "
            "the controller restarts nothing there.",
            labels=["rack"],
        )
        for rack in sorted({n.rack for n in ctl.nodes.values()}):
            racks.add_metric([rack], float(rack in ctl.disrupted))
        yield from (skew, racks)
        score = GaugeMetricFamily(
            "exaserve_runtime_replica_score", "Replica health score (0-100).", labels=["replica", "node"]
        )
        rotation = GaugeMetricFamily(
            "exaserve_runtime_replica_in_rotation", "1 while the replica takes new requests.", labels=["replica"]
        )
        state = GaugeMetricFamily(
            "exaserve_runtime_replica_state", "1 for the replica's current state.", labels=["replica", "state"]
        )
        load = GaugeMetricFamily(
            "exaserve_runtime_replica_load", "Weighted load 0.5 GPU + 0.3 memory + 0.2 network.", labels=["replica"]
        )
        quarantined = GaugeMetricFamily(
            "exaserve_runtime_replica_quarantined",
            "1 while the replica is quarantined and out of rotation: runtime.quarantine_after restarts within "
            "runtime.quarantine_window_s, or a restart did not fix its failing generations.",
            labels=["replica"],
        )
        restarts = GaugeMetricFamily(
            "exaserve_runtime_replica_restarts_in_a_row",
            "Restarts of the replica without stable service since (the back-off's exponent).",
            labels=["replica"],
        )
        loads = self.s._loads
        for rid, rec in ctl.replicas.items():
            score.add_metric([rid, rec.node], rec.score)
            rotation.add_metric([rid], float(rec.in_rotation))
            state.add_metric([rid, ctl.replica_state(rid)], 1.0)
            load.add_metric([rid], loads.get(rid, 0.0))
            quarantined.add_metric([rid], float(rec.quarantined and not rec.in_rotation))
            restarts.add_metric([rid], rec.restarts)
        yield from (node_score, node_suspect, node_last, score, rotation, state, load, quarantined, restarts)
        evicted = GaugeMetricFamily("exaserve_runtime_evicted_replicas", "Replicas out of rotation now.")
        evicted.add_metric([], ctl.evicted())
        cap = GaugeMetricFamily("exaserve_runtime_eviction_cap", "Most replicas the controller may evict.")
        cap.add_metric([], ctl.config.max_evicted)
        capped = CounterMetricFamily("exaserve_runtime_evictions_capped", "Evictions refused by the cap.")
        capped.add_metric([], ctl.counters.capped)
        refused = CounterMetricFamily(
            "exaserve_runtime_restarts_refused",
            "Restarts the deployment refused to start (Kubernetes: the pod's disruption budget allowed none).",
        )
        refused.add_metric([], ctl.counters.refused)
        breakers = CounterMetricFamily(
            "exaserve_runtime_breakers_open",
            "Replicas taken out of rotation because every router held their circuit breaker open past "
            "runtime.breaker_dwell_s (requests failing); never restarted for it.",
        )
        breakers.add_metric([], ctl.counters.breakers)
        withheld = CounterMetricFamily(
            "exaserve_runtime_restarts_withheld",
            "Restart decisions not carried out, by why: the replica's rack is disrupted, or the fleet-wide restart "
            "budget (runtime.restart_rate_per_min) was spent.",
            labels=["reason"],
        )
        withheld.add_metric(["rack_disrupted"], ctl.counters.withheld)
        withheld.add_metric(["budget"], ctl.counters.limited)
        accepted = CounterMetricFamily("exaserve_runtime_reports_accepted", "Agent reports applied.")
        accepted.add_metric([], ctl.counters.accepted)
        late = CounterMetricFamily(
            "exaserve_runtime_reports_late",
            "Agent reports applied that arrived more than a heartbeat interval after they were sent (counted stale).",
        )
        late.add_metric([], ctl.counters.late)
        rejected = CounterMetricFamily(
            "exaserve_runtime_reports_rejected", "Agent reports refused, by reason.", labels=["reason"]
        )
        for reason, n in ctl.counters.rejected.items():
            rejected.add_metric([reason.value], n)
        actions = CounterMetricFamily("exaserve_runtime_actions", "Actions started, by kind.", labels=["kind"])
        failures = CounterMetricFamily("exaserve_runtime_action_failures", "Actions failed, by kind.", labels=["kind"])
        for kind in Kind:
            actions.add_metric([kind.value], ctl.counters.actions[kind])
            failures.add_metric([kind.value], ctl.counters.failed[kind])
        leader = GaugeMetricFamily(
            "exaserve_runtime_leader", "1 while this instance is the leader.", labels=["identity"]
        )
        leader.add_metric([self.s.identity], float(self.s.acting()))
        term = GaugeMetricFamily("exaserve_runtime_leader_term", "Fencing token of this instance's term (0: none).")
        term.add_metric([], float(self.s.term.token) if self.s.term else 0.0)
        unsynced = GaugeMetricFamily(
            "exaserve_runtime_router_unsynced",
            "1 while a router instance missed a membership change of the leader and has not been reconciled.",
            labels=["router"],
        )
        for router in sorted(self.s.routers_seen):
            unsynced.add_metric([router], float(router in self.s.unsynced))
        yield from (
            evicted,
            cap,
            capped,
            refused,
            breakers,
            withheld,
            accepted,
            late,
            rejected,
            actions,
            failures,
            leader,
            term,
            unsynced,
        )
