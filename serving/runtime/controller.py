"""The fleet controller's state machine: pure, driven by agent reports and an injected clock.

Per node and per replica it keeps the plan's health score (:mod:`serving.runtime.score`) and decides, on
each :meth:`Controller.tick`, what the leader must do: take a replica out of rotation, migrate it (drain,
restart through the deployment backend), or readmit it after warm-up. The side effects (router
membership, restarts, warm-up traffic) belong to :mod:`serving.runtime.service`, which reports each
action's outcome back with :meth:`Controller.complete`. Nothing here reads a clock or does I/O.

Decisions (docs/runtime.md):

* A replica's effective score is ``min(replica score, node score)``. The replica score moves with its
  own probes; the node score moves per report: a failed heartbeat when more than half the node's
  replicas failed their probes (a node-wide fault), a good one otherwise.
* The node score is a node decision, carried out once per replica: a replica restarted while its node's
  score was out of the OK band is judged on its own score until the node's score is back in that band, so
  a node-wide fault cannot restart the same fresh replicas again and again (a restart storm).
* A restarted replica is *loading* until its warm-up ends: its probes (a loading SGLang does not answer
  ``/health``) move neither its score nor its node's; the warm-up, which waits up to
  ``serving.startup_budget_s`` for it, judges it.
* Restarts back off: the n-th restart in a row waits ``runtime.restart_backoff_s`` × 2^(n−2) after the one
  before (at most ``runtime.restart_backoff_max_s``; kubelet's crash-loop back-off); the run of restarts ends
  after the replica served for twice the longest back-off (client-go's back-off reset). A replica whose
  ``runtime.quarantine_after`` restarts since it last passed a warm-up failed to bring it back is
  *quarantined*: out of rotation, not restarted again, named by an alert; it returns only through a passed
  warm-up. A restart that worked (the warm-up passed) is no failure, however many came before it.
* Missed reports do not move any score: after ``serving.failure_threshold`` intervals without a report
  the node is *suspect* and its replicas keep their rotation state. A dead agent is no evidence against
  replicas the router still reaches; the router's own health check (interval × failure threshold)
  removes those that are really dead.
* Eviction cap: at most ``max_evicted`` replicas out of rotation (out, migrating, warming) at once;
  a removal past the cap is refused and counted.
* A replica returns to rotation only through a passed warm-up (:attr:`Kind.READMIT`), and only once
  its score is at least ``health.readmit_at`` (hysteresis); a restarted replica starts at ``health.start``.
* Load moves (source §4.3, "migrate when load exceeds 1.5 × the mean"): a serving replica whose weighted load is
  above ``scheduler.migration_load_ratio`` × the fleet's mean, and at least ``scheduler.shed_min_load`` in
  ``serving.failure_threshold`` reports in a row (a burst is not an overload), is *shed*:
  taken out of every router like a failing one (no restart: nothing is broken, SGLang cannot move its KV), and
  readmitted through the warm-up once its load is under half the floor. The router cannot take a weight per worker,
  so moving load means moving membership; per replica, not per node, because the router picks replicas.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from serving.plan.model import Plan, Replica
from serving.runtime.reports import NodeReport, Rejection, ReportRejected
from serving.runtime.score import Band, above_mean, band, may_readmit, next_score, weighted_load
from serving.spec.schema import FleetSpec, HealthScoreSpec, LoadMetric

FUTURE_SKEW_S = 1.0  # accepted clock skew between agent and controller (chrony keeps nodes ≤ 100 ms apart)
MIN_WARMUP_RATE_PER_S = 1.0  # a warm-up needs requests to judge, even when the fleet is idle


def replica_urls(plan: Plan) -> dict[str, str]:
    """Replica id → the URL the routers know it by (the plan's :attr:`~serving.plan.model.Replica.url`)."""
    return {r.id: r.url for r in plan.replicas}


class ReplicaState(StrEnum):
    SERVING = "serving"
    OUT = "out"
    MIGRATING = "migrating"
    WARMING = "warming"


class Kind(StrEnum):
    REMOVE = "remove"
    MIGRATE = "migrate"
    READMIT = "readmit"


_RUNNING = {Kind.MIGRATE: ReplicaState.MIGRATING, Kind.READMIT: ReplicaState.WARMING}


@dataclass(frozen=True)
class Action:
    """What the leader must do to one replica; ``rate_per_s`` is the warm-up rate of a readmission."""

    kind: Kind
    replica: str
    url: str
    reason: str
    rate_per_s: float = 0.0


@dataclass(frozen=True)
class ControllerConfig:
    health: HealthScoreSpec
    interval_s: float
    missed_to_suspect: int
    max_evicted: int
    max_age_s: float
    weights: Mapping[LoadMetric, float]
    warmup_share: float
    warmup_s: float
    move_ratio: float
    shed_min_load: float
    shed_after: int  # reports in a row at or above shed_min_load before a replica is shed
    restart_backoff_s: float
    restart_backoff_max_s: float
    quarantine_after: int

    @classmethod
    def from_spec(cls, spec: FleetSpec, replicas: int) -> ControllerConfig:
        iv = spec.serving.heartbeat_interval_s
        return cls(
            health=spec.health,
            interval_s=iv,
            missed_to_suspect=spec.serving.failure_threshold,
            max_evicted=max(1, math.floor(spec.runtime.max_eviction_share * replicas)),
            max_age_s=spec.runtime.report_max_age_s or 3 * iv,
            weights=dict(spec.scheduler.weights),
            warmup_share=spec.serving.warmup_share,
            warmup_s=spec.serving.warmup_duration_s,
            move_ratio=spec.scheduler.migration_load_ratio,
            shed_min_load=spec.scheduler.shed_min_load,
            shed_after=spec.serving.failure_threshold,
            restart_backoff_s=spec.runtime.restart_backoff_s,
            restart_backoff_max_s=spec.runtime.restart_backoff_max_s,
            quarantine_after=spec.runtime.quarantine_after,
        )

    def backoff_s(self, restarts: int) -> float:
        """The wait after the ``restarts``-th restart in a row before the next one may start."""
        return min(self.restart_backoff_max_s, self.restart_backoff_s * 2.0 ** max(0, restarts - 1))


@dataclass
class ReplicaRecord:
    id: str
    node: str
    url: str
    score: int
    state: ReplicaState = ReplicaState.SERVING
    pending: Kind | None = None
    figures: dict[LoadMetric, float] = field(default_factory=dict)
    requests_total: float | None = None
    rate_per_s: float = 0.0
    shed: bool = False  # out of rotation for its load, not for failing
    hot: int = 0  # reports in a row with its load at or above the shed floor
    restarts: int = 0  # restarts in a row without stable service since (the back-off's exponent)
    unproven: int = 0  # restarts since the replica last passed a warm-up: failed ones (quarantine counts these)
    restarted_at: float | None = None
    serving_since: float | None = None
    loading: bool = False  # restarted, its warm-up not over: its probes move no score
    node_forgiven: bool = False  # restarted for its node's score: that score no longer counts until the node recovers
    quarantined: bool = False
    # the lowest score a report put it at since the leader's last decision on it: a flapping replica dips under a
    # line for one report (59, then 60 at the next pass), and a tick that came after the pass missed it (the
    # replica-flapping drill: out at the next failure, one pair of probes later than the plan)
    lowest: int | None = None

    @property
    def in_rotation(self) -> bool:
        return self.state is ReplicaState.SERVING and self.pending not in (Kind.REMOVE, Kind.MIGRATE)


@dataclass
class NodeRecord:
    name: str
    score: int
    last_report_at: float
    replicas: tuple[str, ...]
    last_key: tuple[str, int] | None = None  # (boot id, monotonic seq) of the last applied report
    boots: set[str] = field(default_factory=set)  # boot ids the node reported from: an earlier boot is over
    last_sent_at: float | None = None
    missed: int = 0

    def suspect(self, threshold: int) -> bool:
        return self.missed >= threshold


@dataclass
class Counters:
    accepted: int = 0
    replicas: int = 0  # the replica probes the accepted reports carried (accepted × replicas per node when aggregated)
    rejected: dict[Rejection, int] = field(default_factory=lambda: dict.fromkeys(Rejection, 0))
    actions: dict[Kind, int] = field(default_factory=lambda: dict.fromkeys(Kind, 0))
    capped: int = 0
    failed: dict[Kind, int] = field(default_factory=lambda: dict.fromkeys(Kind, 0))
    quarantined: int = 0  # replicas put in quarantine (each time)
    refused: int = 0  # restarts the deployment refused to start (a disruption budget)
    breakers: int = 0  # replicas put in the migrate band for a circuit breaker the routers hold open


class Controller:
    """One controller instance's view of the fleet; every instance applies every report (warm followers)."""

    def __init__(
        self,
        config: ControllerConfig,
        replicas: Sequence[Replica],
        urls: Mapping[str, str],
        now: float,
        *,
        discovered: bool = False,
    ) -> None:
        """``replicas`` from the plan; with ``discovered`` (Kubernetes: pods are placed by the scheduler, not the
        plan) the controller starts with the plan's nodes and no replica, and takes each node's replicas from its
        agent's reports (pod name and URL)."""
        self.config = config
        self.discovered = discovered
        by_node: dict[str, list[str]] = {}
        for r in replicas:
            by_node.setdefault(r.node.name, []).append(r.id)
        self.replicas: dict[str, ReplicaRecord] = (
            {}
            if discovered
            else {r.id: ReplicaRecord(r.id, r.node.name, urls[r.id], config.health.start) for r in replicas}
        )
        self.nodes = {
            n: NodeRecord(n, config.health.start, now, () if discovered else tuple(ids)) for n, ids in by_node.items()
        }
        self.counters = Counters()

    # ----- reports ---------------------------------------------------------------------------------
    def receive(self, report: NodeReport, now: float) -> None:
        """Apply one node's report, or raise :class:`ReportRejected` (counted, nothing applied)."""
        try:
            self._check(report, now)
        except ReportRejected as exc:
            self.counters.rejected[exc.reason] += 1
            raise
        node = self.nodes[report.node]
        if self.discovered:
            self._sync(node, report)
        failed = judged = 0
        for probe in report.replicas:
            rec = self.replicas[probe.id]
            if not rec.loading:
                rec.score = next_score(rec.score, probe.ok, self.config.health)
                rec.lowest = rec.score if rec.lowest is None else min(rec.lowest, rec.score)
                judged += 1
                failed += not probe.ok
            rec.figures = {
                "gpu_utilization": probe.gpu_utilization,
                "memory_usage": probe.memory_usage,
                "network_bandwidth": probe.network_bandwidth,
            }
            hot = weighted_load(rec.figures, self.config.weights) >= self.config.shed_min_load
            rec.hot = rec.hot + 1 if hot else 0
            if probe.ok and rec.requests_total is not None and node.last_sent_at is not None:
                dt = report.sent_at - node.last_sent_at
                if dt > 0 and probe.requests_total >= rec.requests_total:
                    rec.rate_per_s = (probe.requests_total - rec.requests_total) / dt
            if probe.ok:
                rec.requests_total = probe.requests_total
        if judged:  # replicas the controller restarted are no evidence against their node
            node.score = next_score(node.score, 2 * failed <= judged, self.config.health)
        if band(node.score, self.config.health) is Band.OK:
            for rid in node.replicas:
                self.replicas[rid].node_forgiven = False
        node.last_key = (report.boot_id, report.seq)
        node.boots.add(report.boot_id)
        node.last_sent_at = report.sent_at
        node.last_report_at = now
        node.missed = 0
        self.counters.accepted += 1
        self.counters.replicas += len(report.replicas)

    def _sync(self, node: NodeRecord, report: NodeReport) -> None:
        """Discovered replicas: the node's report lists its pods. A new pod starts serving (the router discovered it
        Ready); a pod that moved here (LeaderWorkerSet pods keep their names) follows, with its new URL; a pod no
        longer listed is forgotten unless an action on it is still running."""
        present = {p.id: p.url for p in report.replicas if p.url}
        for rid in node.replicas:
            if rid not in present and rid in self.replicas and self.replicas[rid].pending is None:
                del self.replicas[rid]
        for rid, url in present.items():
            rec = self.replicas.get(rid)
            if rec is None:
                self.replicas[rid] = ReplicaRecord(rid, node.name, url, self.config.health.start)
            elif rec.pending is None and (rec.node, rec.url) != (node.name, url):
                rec.node, rec.url = node.name, url
        for n in self.nodes.values():
            n.replicas = tuple(rid for rid, rec in self.replicas.items() if rec.node == n.name)

    def reject_malformed(self) -> None:
        """Count a body that did not parse (the service calls this; nothing else to apply)."""
        self.counters.rejected[Rejection.MALFORMED] += 1

    def _check(self, report: NodeReport, now: float) -> None:
        node = self.nodes.get(report.node)
        if node is None:
            raise ReportRejected(Rejection.UNKNOWN_NODE, f"node {report.node!r} is not in the stack's fleet")
        if node.last_key is not None:
            boot, seq = node.last_key
            if report.boot_id == boot and report.seq <= seq:
                raise ReportRejected(
                    Rejection.REPLAYED,
                    f"node {report.node!r} seq {report.seq} is not after the last applied seq {seq} of boot {boot}",
                )
            if report.boot_id != boot and report.boot_id in node.boots:
                raise ReportRejected(
                    Rejection.REPLAYED,
                    f"node {report.node!r} boot {report.boot_id} is over: the node reported since from boot {boot}",
                )
        if report.sent_at < now - self.config.max_age_s:
            raise ReportRejected(
                Rejection.STALE, f"sent {now - report.sent_at:.1f} s ago, more than {self.config.max_age_s:g} s"
            )
        if report.sent_at > now + FUTURE_SKEW_S:
            raise ReportRejected(
                Rejection.FUTURE, f"sent {report.sent_at - now:.1f} s in the future (check the node's clock)"
            )
        unknown = sorted({p.id for p in report.replicas} - set(node.replicas))
        if self.discovered:
            unknown = sorted(p.id for p in report.replicas if not p.url and p.id not in node.replicas)
        if unknown:
            raise ReportRejected(Rejection.UNKNOWN_REPLICA, f"replicas {unknown} do not run on node {report.node!r}")

    # ----- decisions -------------------------------------------------------------------------------
    def effective_score(self, replica_id: str) -> int:
        rec = self.replicas[replica_id]
        return rec.score if rec.node_forgiven else min(rec.score, self.nodes[rec.node].score)

    def evicted(self) -> int:
        """Replicas out of rotation now or about to be (the eviction cap counts these)."""
        return sum(not r.in_rotation for r in self.replicas.values())

    def breakers_open(self, urls: Collection[str]) -> list[str]:
        """Replicas in rotation whose circuit breaker a router holds open (smg's ``smg_worker_cb_state`` 1: its
        requests failed ``serving.failure_threshold`` times in a row): a replica failing every generation while its
        ``/health`` answers, which the agents' probes cannot see. Each is put in the migrate band, so the next tick
        removes and restarts it as any failed replica (eviction cap, back-off, quarantine). Returns their ids."""
        hit = []
        for rec in self.replicas.values():
            if rec.url in urls and rec.in_rotation and rec.pending is None:
                rec.score = min(rec.score, self.config.health.migrate_below - 1)
                self.counters.breakers += 1
                hit.append(rec.id)
        return hit

    def tick(self, now: float, *, acting: bool) -> list[Action]:
        """Count missed reports; when ``acting`` (the leader), the actions to take now, in place."""
        for node in self.nodes.values():
            node.missed = int(max(0.0, now - node.last_report_at) // self.config.interval_s)
        if not acting:
            for rec in self.replicas.values():
                rec.lowest = None
            return []
        actions = []
        loads = self.loads()
        overloaded = set(self.shed_candidates(loads))
        for rec in self.replicas.values():
            self._settle(rec, now)
            # what reports said since the last tick is this tick's to decide on; skipped (its action running, a
            # drain), it is no news for the decision after
            lowest, rec.lowest = rec.lowest, None
            if rec.pending is not None or self.nodes[rec.node].suspect(self.config.missed_to_suspect):
                continue
            action = self._decide(rec, lowest, loads[rec.id], rec.id in overloaded, now)
            if action is not None:
                rec.pending = action.kind
                rec.state = _RUNNING.get(action.kind, rec.state)
                self.counters.actions[action.kind] += 1
                if action.kind is Kind.MIGRATE:
                    rec.restarts += 1
                    rec.restarted_at = now
                actions.append(action)
        return actions

    def _settle(self, rec: ReplicaRecord, now: float) -> None:
        """Time in service: after twice the longest back-off serving, a replica's run of restarts is over."""
        if not rec.in_rotation or rec.pending is not None:
            rec.serving_since = None
        elif rec.serving_since is None:
            rec.serving_since = now
        elif now - rec.serving_since >= 2 * self.config.restart_backoff_max_s:
            rec.restarts = 0

    def _may_restart(self, rec: ReplicaRecord, now: float) -> bool:
        """Whether a restart may start now: not quarantined, its back-off over; puts the replica in quarantine when
        ``quarantine_after`` restarts since it last passed a warm-up did not bring it back."""
        if rec.unproven >= self.config.quarantine_after and not rec.quarantined:
            rec.quarantined = True
            self.counters.quarantined += 1
        if rec.quarantined:
            return False
        return rec.restarted_at is None or now >= rec.restarted_at + self.config.backoff_s(rec.restarts)

    def _decide(
        self, rec: ReplicaRecord, lowest: int | None, load: float, overloaded: bool, now: float
    ) -> Action | None:
        """On the replica's ``lowest`` score since its last decision (a dip a later report reversed counts), with the
        node's current one."""
        score = self.effective_score(rec.id)
        dipped = lowest is not None and lowest < score
        score = min(score, lowest) if lowest is not None else score
        where = band(score, self.config.health)
        reason = f"score {score} (replica {rec.score}, node {self.nodes[rec.node].score})"
        if dipped:
            now_at = f"replica now {rec.score}, node {self.nodes[rec.node].score}"
            reason = f"score {score}, the lowest since the last tick ({now_at})"
        if rec.state is ReplicaState.SERVING and (where is not Band.OK or overloaded):
            if self.evicted() >= self.config.max_evicted:
                self.counters.capped += 1
                return None
            if where is Band.OK:  # healthy but overloaded: shed its load
                rec.shed = True
                reason = (
                    f"load {load:.3f} above {self.config.move_ratio:g} × the mean and {self.config.shed_min_load:g}: "
                    "shed, not failed"
                )
            kind = Kind.MIGRATE if where is Band.MIGRATE and self._may_restart(rec, now) else Kind.REMOVE
            return Action(kind, rec.id, rec.url, reason)
        if rec.state is ReplicaState.OUT:
            if where is Band.MIGRATE:
                return Action(Kind.MIGRATE, rec.id, rec.url, reason) if self._may_restart(rec, now) else None
            if rec.shed and load >= self.config.shed_min_load / 2:
                return None  # still loaded: stays out (hysteresis: back under half the floor)
            if may_readmit(score, self.config.health):
                why = f"load {load:.3f} back under {self.config.shed_min_load / 2:g}" if rec.shed else reason
                return Action(Kind.READMIT, rec.id, rec.url, why, self.warmup_rate())
        return None

    def complete(self, action: Action, ok: bool, *, refused: bool = False, restart_made: bool = True) -> None:
        """The leader's report of what became of ``action``. ``refused``: a migration whose restart the deployment
        refused to start (Kubernetes: the pod's disruption budget allows none now); it backs off like a failed one
        but is no failed restart of the replica, so it does not count towards quarantine. ``restart_made`` False: a
        migration that failed before its restart was asked for (the leader's fencing check, the replica's removal from
        the routers or its drain failed): a failed action, backed off, but no restart of the replica either, so no
        step towards its quarantine."""
        rec = self.replicas[action.replica]
        rec.pending = None
        rec.loading = rec.loading and action.kind is not Kind.READMIT
        if refused and action.kind is Kind.MIGRATE:  # nothing failed: the back-off stands, the quarantine count not
            self.counters.refused += 1
        elif not ok:
            self.counters.failed[action.kind] += 1
        if action.kind is Kind.MIGRATE and restart_made and not refused:  # whether it brought the replica back or not
            rec.unproven += 1
        if action.kind is Kind.REMOVE:
            rec.state = ReplicaState.OUT if ok else rec.state
            # what its probes said while it drained was the removal's; the next decision is on what follows
            rec.lowest = None
            rec.shed = rec.shed and ok
        elif action.kind is Kind.MIGRATE:
            rec.state = ReplicaState.OUT
            if ok:  # a fresh process: its own history starts again, warm-up still stands between it and clients
                rec.score, rec.lowest = self.config.health.start, None
                rec.requests_total = None
                rec.shed = False
                rec.loading = True
                rec.node_forgiven = band(self.nodes[rec.node].score, self.config.health) is not Band.OK
        elif ok:
            rec.state = ReplicaState.SERVING
            rec.shed = False
            rec.quarantined = False
            rec.unproven = 0
        else:  # failed warm-up: earn the hysteresis margin again before the next try
            rec.state = ReplicaState.OUT
            rec.score = min(rec.score, self.config.health.stop_routing_below - 1)

    def adopt(self, registered: Iterable[str]) -> None:
        """A new leader's start: what every router lists is in rotation, anything else is out. A follower's score of a
        replica the routers route may be stale: the old leader restarted and readmitted it (resetting its score) and
        followers never see actions, only reports, so the new leader would take a freshly readmitted replica out on
        its first tick. The routers are the truth: a routed replica starts at least at ``health.readmit_at`` (its own
        probes take it out again if it fails)."""
        on_routers = set(registered)
        for rec in self.replicas.values():
            rec.pending = None
            rec.state = ReplicaState.SERVING if rec.url in on_routers else ReplicaState.OUT
            if rec.state is ReplicaState.SERVING:
                rec.score, rec.lowest = max(rec.score, self.config.health.readmit_at), None

    # ----- load ------------------------------------------------------------------------------------
    def loads(self) -> dict[str, float]:
        """Weighted load per replica from the latest reports (0.5 GPU + 0.3 memory + 0.2 network)."""
        return {rid: weighted_load(rec.figures, self.config.weights) for rid, rec in self.replicas.items()}

    def node_loads(self) -> dict[str, float]:
        loads = self.loads()
        return {
            n: sum(loads[r] for r in node.replicas) / len(node.replicas)
            for n, node in self.nodes.items()
            if node.replicas
        }

    def shed_candidates(self, loads: Mapping[str, float] | None = None) -> list[str]:
        """Serving replicas whose weighted load is above ``move_ratio`` × the fleet's mean, and at or above the floor
        in ``shed_after`` reports in a row, most loaded first."""
        loads = self.loads() if loads is None else loads
        return [
            rid
            for rid in above_mean(loads, self.config.move_ratio)
            if self.replicas[rid].hot >= self.config.shed_after and self.replicas[rid].in_rotation
        ]

    def move_candidates(self) -> list[str]:
        """The most loaded serving replica of each node above ``move_ratio`` × the mean node load: what to
        drain first when load must move."""
        loads = self.loads()
        out = []
        for name in above_mean(self.node_loads(), self.config.move_ratio):
            serving = [r for r in self.nodes[name].replicas if self.replicas[r].in_rotation]
            if serving:
                out.append(max(serving, key=lambda r: loads[r]))
        return out

    def warmup_rate(self) -> float:
        """Warm-up traffic: ``serving.warmup_share`` of the mean per-replica request rate (at least 1/s)."""
        rates = [r.rate_per_s for r in self.replicas.values() if r.in_rotation]
        mean = sum(rates) / len(rates) if rates else 0.0
        return max(MIN_WARMUP_RATE_PER_S, self.config.warmup_share * mean)

    # ----- status ----------------------------------------------------------------------------------
    def node_state(self, name: str) -> str:
        node = self.nodes[name]
        return "suspect" if node.suspect(self.config.missed_to_suspect) else band(node.score, self.config.health).value

    def replica_state(self, replica_id: str) -> str:
        rec = self.replicas[replica_id]
        if rec.pending is Kind.REMOVE:
            return "removing"
        if rec.shed and rec.state is ReplicaState.OUT:
            return "shed"
        if rec.quarantined and rec.state is ReplicaState.OUT:
            return "quarantined"
        if self.nodes[rec.node].suspect(self.config.missed_to_suspect):
            return f"suspect/{rec.state.value}"
        return rec.state.value

    def snapshot(self, now: float) -> dict[str, object]:
        """``nodes`` and ``replicas`` as ``exaserve status --json`` shows them."""
        loads = self.loads()
        return {
            "nodes": [
                {
                    "name": n.name,
                    "score": n.score,
                    "state": self.node_state(n.name),
                    "last_report_s": round(now - n.last_report_at, 3) if n.last_key is not None else None,
                }
                for n in self.nodes.values()
            ],
            "replicas": [
                {
                    "id": r.id,
                    "node": r.node,
                    "url": r.url,
                    "state": self.replica_state(r.id),
                    "score": r.score,
                    "in_rotation": r.in_rotation,
                    "load": round(loads[r.id], 4),
                    "restarts": r.restarts,
                }
                for r in self.replicas.values()
            ],
        }
