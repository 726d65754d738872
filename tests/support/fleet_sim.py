"""The controller's pure state machine driven on a simulated clock, with the service's side effects modelled as the
real ones behave: agents report every ``serving.heartbeat_interval_s``, the leader ticks every half of it
(``service.py``'s tick loop), a removal completes at once, a restart is ``systemctl restart --no-block`` (it returns
at once and the process then loads for ``load_s``; a restart during loading starts the load again), and a readmission
is the service's warm-up: it waits up to ``serving.startup_budget_s`` for ``/health``, then needs
``serving.warmup_duration_s`` of service without a failure.

Whether a replica answers is a function of (replica id, time) given by the test: the fault it models; so is whether
the routers hold its circuit breaker open (its requests fail while it answers ``/health``), and whether the routers
answer a change of its membership (a removal, a migration's removal before its restart).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from serving.plan.model import Fleet
from serving.runtime.controller import Action, Controller, ControllerConfig, Kind, replica_urls
from serving.runtime.reports import NodeReport, ReplicaProbe

Up = Callable[[str, float], bool]  # (replica id, seconds since the start) → the replica answers /health


@dataclass
class _Warmup:
    action: Action
    started: float
    healthy_since: float | None = None


@dataclass
class FleetSim:
    fleet: Fleet
    up: Up
    load_s: float  # how long a restarted replica loads before it answers
    t0: float = 1_800_000_000.0
    now: float = 0.0  # seconds since t0
    restarts: Counter[str] = field(default_factory=Counter)
    refuse: Up | None = None  # (replica id, t) → the deployment refuses to restart it then (a disruption budget)
    refused: Counter[str] = field(default_factory=Counter)
    breaker: Up | None = None  # (replica id, t) → the routers hold its circuit breaker open then (requests failing)
    unroutable: Up | None = None  # (replica id, t) → no router instance answers a membership change for it then
    ready_at: dict[str, float] = field(default_factory=dict)
    seq: int = 0

    def __post_init__(self) -> None:
        plan = self.fleet.plan
        self.ctl = Controller(
            ControllerConfig.from_spec(self.fleet.spec, len(plan.replicas)), plan.replicas, replica_urls(plan), self.t0
        )
        self.nodes: dict[str, list[str]] = {}
        for r in plan.replicas:
            self.nodes.setdefault(r.node.name, []).append(r.id)
        self._warmups: list[_Warmup] = []

    def answers(self, rid: str, t: float) -> bool:
        return t >= self.ready_at.get(rid, 0.0) and self.up(rid, t)

    def _report(self, node: str) -> NodeReport:
        probes = tuple(
            ReplicaProbe(id=rid, ok=ok, latency_s=0.01 if ok else None)
            for rid in self.nodes[node]
            for ok in [self.answers(rid, self.now)]
        )
        return NodeReport(
            schema_version=2,
            node=node,
            seq=self.seq,
            boot_id="4f1c9a52-7d3e-4b8a-9c61-2e5d8f0a7b13",
            sent_at=self.t0 + self.now,
            replicas=probes,
        )

    def _start(self, action: Action) -> None:
        if action.kind in (Kind.REMOVE, Kind.MIGRATE) and self.unroutable and self.unroutable(action.replica, self.now):
            self.ctl.complete(action, ok=False, restart_made=False)  # the removal failed: a migration restarted nothing
        elif action.kind is Kind.REMOVE:
            self.ctl.complete(action, ok=True)
        elif action.kind is Kind.MIGRATE and self.refuse is not None and self.refuse(action.replica, self.now):
            self.refused[action.replica] += 1
            self.ctl.complete(action, ok=False, refused=True)
        elif action.kind is Kind.MIGRATE:
            self.restarts[action.replica] += 1
            self.ready_at[action.replica] = self.now + self.load_s
            self.ctl.complete(action, ok=True)
        else:
            self._warmups.append(_Warmup(action, self.now))

    def _warm(self) -> None:
        spec = self.fleet.spec.serving
        for w in list(self._warmups):
            rid = w.action.replica
            done: bool | None = None
            # the warm-up's own requests go to the replica: they fail where its breaker would open
            failing = self.breaker is not None and self.breaker(rid, self.now)
            if self.answers(rid, self.now) and not failing:
                w.healthy_since = self.now if w.healthy_since is None else w.healthy_since
                if self.now - w.healthy_since >= spec.warmup_duration_s:
                    done = True
            elif failing or w.healthy_since is not None or self.now - w.started > spec.startup_budget_s:
                done = False  # a failure during the warm-up, or never healthy within the startup budget
            if done is not None:
                self._warmups.remove(w)
                self.ctl.complete(w.action, ok=done)

    def run(self, until_s: float) -> None:
        """Advance to ``until_s`` in the service's tick steps."""
        iv = self.fleet.spec.serving.heartbeat_interval_s
        step = iv / 2
        while self.now + step <= until_s:
            self.now += step
            if round(self.now / step) % 2 == 0:  # every interval: each node's agent reports
                self.seq += 1
                for node in self.nodes:
                    self.ctl.receive(self._report(node), self.t0 + self.now)
            self._warm()
            if self.breaker is not None:  # the leader reads the routers' breakers before each tick (service.py)
                urls = replica_urls(self.fleet.plan)
                self.ctl.breakers_open({urls[rid] for rid in self.ctl.replicas if self.breaker(rid, self.now)})
            for action in self.ctl.tick(self.t0 + self.now, acting=True):
                self._start(action)

    def serving(self) -> set[str]:
        return {rid for rid, rec in self.ctl.replicas.items() if rec.in_rotation}
