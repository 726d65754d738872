"""The controller's pure state machine driven on a simulated clock, with the service's side effects modelled as the
real ones behave: agents report every ``serving.heartbeat_interval_s``, the leader ticks every half of it
(``service.py``'s tick loop), a removal completes at once, a restart is ``systemctl restart --no-block`` (it returns
at once and the process then loads for ``load_s``; a restart during loading starts the load again), and a readmission
is the service's warm-up (``ControllerService._warm_up``): it waits up to ``serving.startup_budget_s`` for ``/health``,
THEN runs its load for ``serving.warmup_duration_s`` and judges the error rate at the end (``rollout.max_error_rate``);
a replica that fails its generations fails the warm-up only once it answers ``/health``, never while still loading.

Whether a replica answers is a function of (replica id, time) given by the test: the fault it models; so is whether
the routers hold its circuit breaker open (its requests fail while it answers ``/health``), and whether the routers
answer a change of its membership (a removal, a migration's removal before its restart).

The correlated faults of issue 38 (tests/support/fleet_scenarios.py) add, all optional:

* ``reaches`` (node, t): whether the node's report reaches the controllers (a partition, a dead agent);
* ``ssh`` (node, t): whether a restart reaches the node (a restart that does not is an action failure; whether
  today's service counts it as a restart is :class:`ServiceModel`'s ``unreached_restart_counts``);
* ``reboots``: node → (down at, back at): no report meanwhile, then a NEW boot id, and the seq (the node's
  monotonic clock in ns, as the agent sends it) starts again from the boot; its replicas answer only once their load
  (``load_s``, per replica) after the reboot is over;
* ``latency`` (replica, t): the probe's ``latency_s`` (None: the probe timed out, so it fails); ``figures``
  (replica, t): its ``gpu_utilization`` and ``memory_usage``;
* ``per_token`` (replica, t): the mean time per output token of the requests it finished over the report's interval
  (the latency-outlier signal); a replica the routers list finishes :data:`REQUESTS_PER_REPORT` requests an interval,
  one they do not list none, and its agent reports the cumulative figures as SGLang's histogram sum and count (without
  the hook the probes carry none, as a version-2 agent's);
* ``gaps`` (replica, t): per stall bound (:data:`serving.sglang_metrics.STALL_BOUNDS_S`), the tokens of its streamed
  requests that came longer than it after their last output over the report's interval (the stall signal); a replica
  the routers do not list has none, and its agent reports them cumulative as SGLang's histogram gives them (without
  the hook the probes carry none, as an agent older than version 4's);
* ``skew_s``: the agents' ``sent_at`` is the controller's time plus this;
* ``router_error`` (t): one router instance answers HTTP 500 to membership calls; what the service then does is
  :class:`ServiceModel`'s (today: the change fails; a new leader cannot adopt, so it resigns);
* ``handover_at``: a second controller instance is fed the same reports (a warm follower, ``tick(acting=False)``);
  at that second it ``adopt()``s what the routers list and acts, and the first one stops acting (its warm-ups are
  cancelled, as ``_depose`` cancels the service's tasks);
* ``breaker_when_down``: a router holds the breaker of a replica it lists open while that replica does not answer
  (its requests fail);
* ``watch``: replicas whose time out of routing and whose "whole" time (every one listed by the routers and
  answering) the sim records at each step;
* ``cpu_budget_s``: :meth:`FleetSim.run` raises :class:`SimTooSlow` once it used that much CPU (a tick that is not
  O(n) must fail a test, not hang the suite).

The sim keeps the routers' own view, :attr:`FleetSim.routed` (what every router instance lists), and counts what
the leader asked and what came of it (:attr:`asked`, :attr:`restarts`, :attr:`unreached`, :attr:`failed_changes`,
:attr:`warmups_failed`, :attr:`log`), the most restarts asked in one tick and the CPU of the slowest tick.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from serving.plan.model import Fleet
from serving.runtime.controller import Action, Controller, ControllerConfig, Kind, replica_urls
from serving.runtime.reports import NodeReport, ReplicaProbe, ReportRejected
from serving.sglang_metrics import STALL_BOUNDS_S

Up = Callable[[str, float], bool]  # (replica id, seconds since the start) → the replica answers /health
NodeUp = Callable[[str, float], bool]  # (node name, seconds since the start) → true for the node then
Latency = Callable[
    [str, float], float | None
]  # (replica id, t) → probe latency_s of an answering replica; None: timeout
Figures = Callable[[str, float], tuple[float, float]]  # (replica id, t) → (gpu_utilization, memory_usage)
BOOT_ID = "4f1c9a52-7d3e-4b8a-9c61-2e5d8f0a7b13"  # every node's first boot
FIRST_BOOT_AT = -86_400.0  # every node had been up a day when the sim starts (its seq: ns since its boot)
PROBE_LATENCY_S = 0.01
REQUESTS_PER_REPORT = 50.0  # requests a routed replica finishes per heartbeat interval (``per_token``)


@dataclass(frozen=True)
class ServiceModel:
    """What ``serving/runtime/service.py`` (and ``serving/router/membership.py`` under it) makes of an action's
    outcome, in the parts issue 38 changed. The defaults are this checkout's code, which
    tests/test_runtime_correlated.py's ``test_the_sims_service_model_*`` check against it; True is the code before
    issue 38 (``bench/runtime_bench.py``'s before figures were measured so)."""

    # a restart that never reached the node (SSH failed) completes with restart_made: a step towards quarantine
    unreached_restart_counts: bool = False
    # an HTTP 500 from one router instance fails the change though the others applied it (a migration restarted
    # nothing)
    router_error_fails_change: bool = False
    # a new leader lists every router's workers before it takes office; a listing that failed resigns
    adopt_needs_every_router: bool = False


class SimTooSlow(RuntimeError):
    """The sim used its CPU budget; ``at_s`` is the simulated second it had reached."""

    def __init__(self, at_s: float, cpu_s: float, tick_cpu_max_s: float) -> None:
        super().__init__(
            f"CPU budget spent at t={at_s:g} s ({cpu_s:.1f} s of CPU; slowest tick {tick_cpu_max_s * 1000:.0f} ms)"
        )
        self.at_s = at_s
        self.cpu_s = cpu_s
        self.tick_cpu_max_s = tick_cpu_max_s


def boot_id(node: str, boot: int) -> str:
    """The node's ``boot``-th boot id (0: the first boot, the same for every node as before reboots were modelled)."""
    if boot == 0:
        return BOOT_ID
    return str(uuid.UUID(bytes=hashlib.md5(f"{node}/{boot}".encode(), usedforsecurity=False).digest()))


@dataclass
class _Warmup:
    action: Action
    started: float
    by: Controller
    healthy_since: float | None = None  # the warm-up's load started (the replica answered /health)
    requests: int = 0
    errors: int = 0


@dataclass
class FleetSim:
    fleet: Fleet
    up: Up
    load_s: float | Callable[[str], float]  # how long a (re)started replica loads before it answers; per replica
    t0: float = 1_800_000_000.0
    now: float = 0.0  # seconds since t0
    restarts: Counter[str] = field(default_factory=Counter)  # restarts made: they reached the node
    refuse: Up | None = None  # (replica id, t) → the deployment refuses to restart it then (a disruption budget)
    refused: Counter[str] = field(default_factory=Counter)
    breaker: Up | None = None  # (replica id, t) → its requests fail then: a router listing it holds its breaker open
    # (replica id, t) → a router listing it reads its breaker open though its requests succeed, until it is added
    # again: smg publishes the gauge only at a transition and closes a breaker only on requests that succeed (little
    # traffic: it stays open); a worker added again starts with a closed one (worker/registry.rs)
    stale_breaker: Up | None = None
    unroutable: Up | None = None  # (replica id, t) → no router instance answers a membership change for it then
    ready_at: dict[str, float] = field(default_factory=dict)
    seq: int = 0  # report rounds so far (a report's seq is its node's uptime in ns, as the agent's monotonic clock)
    # ----- correlated faults (issue 38) -----
    reaches: NodeUp | None = None  # (node, t) → its agent's report reaches the controllers
    ssh: NodeUp | None = None  # (node, t) → a restart reaches the node
    reboots: Mapping[str, tuple[float, float]] = field(default_factory=dict)  # node → (down at, back at)
    latency: Latency | None = None
    figures: Figures | None = None
    per_token: Latency | None = None  # (replica id, t) → mean time per output token over the interval
    gaps: Callable[[str, float], Mapping[float, float]] | None = None  # (replica id, t) → stalled tokens per bound
    skew_s: float = 0.0  # agent clock − controller clock
    router_error: Callable[[float], bool] | None = None  # t → one router instance answers 500 to membership calls
    service: ServiceModel = ServiceModel()
    handover_at: float | None = None
    breaker_when_down: bool = False
    watch: Collection[str] = ()
    cpu_budget_s: float | None = None

    def __post_init__(self) -> None:
        plan = self.fleet.plan
        self.urls = replica_urls(plan)
        self.ids = [r.id for r in plan.replicas]
        self.node_of = {r.id: r.node.name for r in plan.replicas}
        config = ControllerConfig.from_spec(self.fleet.spec, len(plan.replicas))
        self.ctl = Controller(config, plan.replicas, self.urls, self.t0)
        # every instance applies every report; a second one only when a hand-over is modelled (it doubles the cost)
        self.controllers = [self.ctl]
        if self.handover_at is not None:
            self.controllers.append(Controller(config, plan.replicas, self.urls, self.t0))
        self.leader: Controller | None = self.ctl
        self.nodes: dict[str, list[str]] = {}
        for r in plan.replicas:
            self.nodes.setdefault(r.node.name, []).append(r.id)
        self._warmups: list[_Warmup] = []
        self._booted_at: dict[str, float] = {}  # node → when its current boot started (FIRST_BOOT_AT before a reboot)
        self._boot: dict[str, int] = {}
        # the controller's API as this checkout has it: HEAD's (the BEFORE figures) or issue 38's
        self._breakers_take_now = "now" in inspect.signature(Controller.breakers_open).parameters
        self._complete_takes = set(inspect.signature(Controller.complete).parameters)
        self._rebooted: set[str] = set()
        self._probes: dict[str, ReplicaProbe] = {}
        self._generated: dict[str, tuple[float, float]] = {}  # replica → its (TPOT seconds, requests) so far
        self._gaps: dict[str, dict[float, float]] = {}  # replica → its stalled tokens so far, per bound
        self.routed: set[str] = set(self.ids)  # what every router instance lists
        self.added: set[str] = set()  # added to the routers again since the start (a fresh breaker)
        self.asked: Counter[str] = Counter()  # migrations (restarts) the leader asked for
        self.unreached: Counter[str] = Counter()  # ... whose restart did not reach the node
        self.failed_changes: Counter[str] = Counter()  # membership changes that failed (removal, migration, addition)
        self.warmups_failed: Counter[str] = Counter()
        self.log: list[tuple[float, Kind, str]] = []  # (t, kind, replica) of every action the leader started
        self.restarts_per_tick_max = 0
        self.tick_cpu_max_s = 0.0
        self.cpu_s = 0.0
        self.leaderless_s = 0.0
        self.handed_over = False
        self.whole_since: float | None = 0.0  # the watched replicas all listed and answering since then (None: not)
        self.out_s: dict[str, float] = defaultdict(float)  # watched replica → seconds the routers did not list it
        self.out_max = 0  # the most replicas the routers did not list at once

    # ----- the fault model ------------------------------------------------------------------------
    def _load(self, rid: str) -> float:
        return self.load_s(rid) if callable(self.load_s) else self.load_s

    def _rebooting(self, node: str, t: float) -> bool:
        window = self.reboots.get(node)
        return window is not None and window[0] <= t < window[1]

    def answers(self, rid: str, t: float) -> bool:
        return t >= self.ready_at.get(rid, 0.0) and not self._rebooting(self.node_of[rid], t) and self.up(rid, t)

    def failing(self, rid: str, t: float) -> bool:
        """Its requests fail then (it answers /health or not)."""
        return self.breaker is not None and self.breaker(rid, t)

    def breakers(self, t: float) -> set[str]:
        """URLs whose breaker the routers hold open: replicas they list whose requests fail."""
        return {
            self.urls[rid]
            for rid in self.routed
            if self.failing(rid, t)
            or (self.breaker_when_down and not self.answers(rid, t))
            or (self.stale_breaker is not None and rid not in self.added and self.stale_breaker(rid, t))
        }

    def _reaches(self, node: str, t: float) -> bool:
        return not self._rebooting(node, t) and (self.reaches is None or self.reaches(node, t))

    def _ssh(self, node: str, t: float) -> bool:
        return not self._rebooting(node, t) and (self.ssh is None or self.ssh(node, t))

    def _probe(self, rid: str) -> ReplicaProbe:
        ok = self.answers(rid, self.now)
        latency = PROBE_LATENCY_S if self.latency is None or not ok else self.latency(rid, self.now)
        ok = ok and latency is not None
        gpu, mem = self.figures(rid, self.now) if self.figures is not None else (0.0, 0.0)
        if self.per_token is not None or self.gaps is not None:  # cumulative counters: a new probe every report
            seconds, requests = self._generated.get(rid, (0.0, 0.0))
            # its counters move while it serves, whether this probe timed out or not (a stall's report)
            serves = rid in self.routed and self.answers(rid, self.now)
            per_token = self.per_token(rid, self.now) if serves and self.per_token is not None else None
            if per_token is not None:
                seconds, requests = seconds + REQUESTS_PER_REPORT * per_token, requests + REQUESTS_PER_REPORT
                self._generated[rid] = (seconds, requests)
            tpot = ok and self.per_token is not None
            gaps = self._gaps.setdefault(rid, dict.fromkeys(STALL_BOUNDS_S, 0.0)) if self.gaps is not None else None
            if gaps is not None and serves:
                for bound, tokens in self.gaps(rid, self.now).items():
                    gaps[bound] += tokens
            return ReplicaProbe.model_construct(
                id=rid, ok=ok, latency_s=latency if ok else None, gpu_utilization=gpu, memory_usage=mem,
                tpot_seconds_total=seconds if tpot else None, tpot_requests_total=requests if tpot else None,
                token_gaps_over_s=dict(gaps) if ok and gaps is not None else None,
            )  # fmt: skip
        last = self._probes.get(rid)
        if last is not None and (last.ok, last.latency_s, last.gpu_utilization, last.memory_usage) == (
            ok,
            latency,
            gpu,
            mem,
        ):
            return last  # frozen: one object serves every report that says the same
        probe = ReplicaProbe.model_construct(
            id=rid, ok=ok, latency_s=latency if ok else None, gpu_utilization=gpu, memory_usage=mem
        )
        self._probes[rid] = probe
        return probe

    def _report(self, node: str) -> NodeReport:
        return NodeReport.model_construct(
            schema_version=2,
            node=node,
            seq=int((self.now - self._booted_at.get(node, FIRST_BOOT_AT)) * 1e9),
            boot_id=boot_id(node, self._boot.get(node, 0)),
            sent_at=self.t0 + self.now + self.skew_s,
            replicas=tuple(self._probe(rid) for rid in self.nodes[node]),
        )

    def _reboot(self) -> None:
        """A node going down: its replicas answer only after the reboot and their load; back: a new boot id, its seq
        (uptime) from 0."""
        for node, (down, back) in self.reboots.items():
            if node not in self._rebooted and self.now >= down:
                self._rebooted.add(node)
                for rid in self.nodes[node]:
                    self.ready_at[rid] = back + self._load(rid)
            if self.now >= back and self._boot.get(node, 0) == 0 and node in self._rebooted:
                self._boot[node] = 1
                self._booted_at[node] = back

    # ----- the service's side effects -------------------------------------------------------------
    def _router_error(self) -> bool:
        return self.router_error is not None and self.router_error(self.now) and self.service.router_error_fails_change

    def _start(self, action: Action) -> None:
        assert self.leader is not None
        ctl = self.leader
        self.log.append((self.now, action.kind, action.replica))
        rid = action.replica
        if action.kind is Kind.MIGRATE:
            self.asked[rid] += 1
        if action.kind in (Kind.REMOVE, Kind.MIGRATE) and (
            (self.unroutable and self.unroutable(rid, self.now)) or self._router_error()
        ):
            self.failed_changes[rid] += 1
            self._complete(ctl, action, False, restart_made=False)  # the removal failed: a migration restarted nothing
        elif action.kind is Kind.REMOVE:
            self.routed.discard(rid)
            self._complete(ctl, action, True)
        elif action.kind is Kind.MIGRATE and self.refuse is not None and self.refuse(rid, self.now):
            self.routed.discard(rid)
            self.refused[rid] += 1
            self._complete(ctl, action, False, refused=True)
        elif action.kind is Kind.MIGRATE and not self._ssh(self.node_of[rid], self.now):
            self.routed.discard(rid)  # removed from the routers, then the restart did not reach the node
            self.unreached[rid] += 1
            self._complete(ctl, action, False, restart_made=self.service.unreached_restart_counts)
        elif action.kind is Kind.MIGRATE:
            self.routed.discard(rid)
            self.restarts[rid] += 1
            self.ready_at[rid] = self.now + self._load(rid)
            self._complete(ctl, action, True)
        else:
            self._warmups.append(_Warmup(action, self.now, ctl))

    def _complete(self, ctl: Controller, action: Action, ok: bool, **outcome: bool) -> None:
        """``Controller.complete`` as service.py calls it (``answered``: a warm-up failed after /health answered;
        ``fenced``: the leader's term ended), given what this checkout's controller takes (HEAD's takes neither, nor
        ``now``)."""
        complete: Any = ctl.complete
        given = {**outcome, "now": self.t0 + self.now}
        complete(action, ok, **{k: v for k, v in given.items() if k in self._complete_takes})

    def _warm(self) -> None:
        """``ControllerService._warm_up``: /health within the startup budget, then the load, judged at its end."""
        spec = self.fleet.spec
        for w in list(self._warmups):
            rid = w.action.replica
            done: bool | None = None
            if w.healthy_since is None:
                if self.answers(rid, self.now):
                    w.healthy_since = self.now
                elif self.now - w.started > spec.serving.startup_budget_s:
                    done = False  # never healthy within the startup budget
            else:
                w.requests += 1
                w.errors += not self.answers(rid, self.now) or self.failing(rid, self.now)
                # issue 38's controller gives each readmission its warm-up time; HEAD's service uses the spec's
                warm_s = getattr(w.action, "warmup_s", 0.0) or spec.serving.warmup_duration_s
                if self.now - w.healthy_since >= max(warm_s, 1.0 / w.action.rate_per_s):
                    done = w.errors <= spec.rollout.max_error_rate * w.requests
            if done is not None:
                self._warmups.remove(w)
                answered = False
                if not done:
                    self.warmups_failed[rid] += 1
                    answered = w.healthy_since is not None  # it answered /health; its warm-up requests failed
                elif self._router_error():  # the warm-up passed; the addition failed
                    self.failed_changes[rid] += 1
                    done = False
                else:
                    self.routed.add(rid)
                    self.added.add(rid)
                self._complete(w.by, w.action, done, answered=answered)

    def _hand_over(self) -> None:
        """The follower takes office: it lists the routers (fails while one answers 500, today) and adopts that."""
        if self.router_error is not None and self.router_error(self.now) and self.service.adopt_needs_every_router:
            self.leader = None  # campaigned, could not list a router: resigned; it campaigns again
            return
        new = self.controllers[1]
        for w in self._warmups:  # the old leader's tasks are cancelled: each completes as failed (service._execute)
            self._complete(w.by, w.action, False, fenced=True)
        self._warmups = []
        new.adopt(self.urls[rid] for rid in self.routed)
        self.leader = self.ctl = new
        self.handed_over = True

    def run(self, until_s: float) -> None:
        """Advance to ``until_s`` in the service's tick steps."""
        iv = self.fleet.spec.serving.heartbeat_interval_s
        step = iv / 2
        started = time.process_time()
        while self.now + step <= until_s:
            self.now += step
            if self.reboots:
                self._reboot()
            if round(self.now / step) % 2 == 0:  # every interval: each node's agent reports
                self.seq += 1
                for node in self.nodes:
                    if not self._reaches(node, self.now):
                        continue
                    report = self._report(node)
                    for ctl in self.controllers:
                        with contextlib.suppress(ReportRejected):  # counted by the controller
                            ctl.receive(report, self.t0 + self.now)
            self._warm()
            if self.handover_at is not None and not self.handed_over and self.now >= self.handover_at:
                self._hand_over()
            leader = self.leader
            read = leader is not None and (
                self.breaker is not None or self.breaker_when_down or self.stale_breaker is not None
            )
            urls = self.breakers(self.now) if read else None
            for ctl in self.controllers:
                tick0 = time.process_time()  # the controller's own CPU: the breakers' read, the tick (not the sim's)
                if ctl is leader and urls is not None:  # the leader reads the routers' breakers first (service.py)
                    breakers_open: Any = ctl.breakers_open  # HEAD's takes no ``now``
                    if self._breakers_take_now:
                        breakers_open(urls, self.t0 + self.now)
                    else:
                        breakers_open(urls)
                actions = ctl.tick(self.t0 + self.now, acting=ctl is leader)
                self.tick_cpu_max_s = max(self.tick_cpu_max_s, time.process_time() - tick0)
                for action in actions:
                    self._start(action)
                self.restarts_per_tick_max = max(
                    self.restarts_per_tick_max, sum(a.kind is Kind.MIGRATE for a in actions)
                )
            if leader is None:
                self.leaderless_s += step
            self.out_max = max(self.out_max, len(self.ids) - len(self.routed))
            if self.watch:
                self._measure(step)
            spent = self.cpu_s + time.process_time() - started
            if self.cpu_budget_s is not None and spent > self.cpu_budget_s:
                self.cpu_s = spent
                raise SimTooSlow(self.now, spent, self.tick_cpu_max_s)
        self.cpu_s += time.process_time() - started

    def _measure(self, step: float) -> None:
        whole = True
        for rid in self.watch:
            if rid not in self.routed:
                self.out_s[rid] += step
                whole = False
            elif whole and (not self.answers(rid, self.now) or self.failing(rid, self.now)):
                whole = False
        if not whole:
            self.whole_since = None
        elif self.whole_since is None:
            self.whole_since = self.now

    def serving(self) -> set[str]:
        return {rid for rid, rec in self.ctl.replicas.items() if rec.in_rotation}
