"""What the fleet controller's state machine works on (:mod:`serving.runtime.controller`): its settings, read from the
stack (:class:`ControllerConfig`), its record of each replica and node, the actions it asks the leader to carry out,
its counters, the fleet-wide restart budget and the tally of replicas out of rotation."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from serving.plan.model import Plan
from serving.runtime.reports import Rejection
from serving.spec.schema import FleetSpec, HealthScoreSpec, LoadMetric

MIN_WARMUP_RATE_PER_S = 1.0  # a warm-up needs requests to judge, even when the fleet is idle
# The latency-outlier signal (runtime.latency_outlier_ratio): a replica's figure is the mean time per output token of
# the requests it finished over one report or more (at least LATENCY_MIN_REQUESTS, so a few requests are no verdict);
# the fleet's median needs LATENCY_MIN_REPLICAS replicas with a figure (Envoy's success_rate_minimum_hosts, 5); a
# replica is an outlier in LATENCY_HITS of its verdicts of the last LATENCY_WINDOW heartbeat intervals (2 in 12);
# older verdicts, and those of a process since restarted, count for nothing. A report with a stalled token
# (runtime.stall_gap_s) is an outlier verdict too, while fewer than half of the replicas with a figure stalled in
# their last report (a machine or fleet that stalls everywhere has no outlier: Envoy judges a host against the rest)
LATENCY_MIN_REQUESTS = 10
LATENCY_MIN_REPLICAS = 5
LATENCY_HITS = 2
LATENCY_WINDOW = 12
LATENCY_MAX_EJECTIONS = 10  # the ejection time grows with ejections in a row up to this many times the base


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
    warmup_s: float = 0.0  # a readmission's warm-up: serving.warmup_duration_s after a restart, else one interval


@dataclass(frozen=True)
class ControllerConfig:
    health: HealthScoreSpec
    interval_s: float
    missed_to_suspect: int
    max_evicted: int
    weights: Mapping[LoadMetric, float]
    warmup_share: float
    warmup_s: float
    move_ratio: float
    shed_min_load: float
    shed_after: int  # reports in a row at or above shed_min_load before a replica is shed
    restart_backoff_s: float
    restart_backoff_max_s: float
    quarantine_after: int
    quarantine_window_s: float = 3600.0
    startup_budget_s: float = 600.0
    restart_rate_per_s: float = math.inf  # the fleet-wide restart budget's refill (a token bucket)
    restart_burst: int = 1_000_000  # ... and its size
    disrupted_share: float = 0.55
    breaker_dwell_s: float = 0.0
    clock_skew_alert_s: float = 1.0
    latency_outlier_ratio: float = 3.0
    latency_ejection_s: float = 30.0
    stall_gap_s: float = 4.0

    @classmethod
    def from_spec(cls, spec: FleetSpec, replicas: int) -> ControllerConfig:
        iv = spec.serving.heartbeat_interval_s
        rt = spec.runtime
        max_evicted = max(1, math.floor(rt.max_eviction_share * replicas))
        per_node = spec.serving.replicas_per_node or 1
        return cls(
            health=spec.health,
            interval_s=iv,
            missed_to_suspect=spec.serving.failure_threshold,
            max_evicted=max_evicted,
            weights=dict(spec.scheduler.weights),
            warmup_share=spec.serving.warmup_share,
            warmup_s=spec.serving.warmup_duration_s,
            move_ratio=spec.scheduler.migration_load_ratio,
            shed_min_load=spec.scheduler.shed_min_load,
            shed_after=spec.serving.failure_threshold,
            restart_backoff_s=spec.runtime.restart_backoff_s,
            restart_backoff_max_s=spec.runtime.restart_backoff_max_s,
            quarantine_after=rt.quarantine_after,
            quarantine_window_s=rt.quarantine_window_s,
            startup_budget_s=spec.serving.startup_budget_s,
            restart_rate_per_s=(rt.restart_rate_per_min / 60 if rt.restart_rate_per_min else None)
            or max_evicted / spec.serving.startup_budget_s,
            restart_burst=rt.restart_burst or max(per_node, math.ceil(replicas / 100)),
            disrupted_share=rt.disrupted_share,
            breaker_dwell_s=spec.breaker_dwell_s(),
            clock_skew_alert_s=rt.clock_skew_alert_s,
            latency_outlier_ratio=rt.latency_outlier_ratio,
            latency_ejection_s=rt.latency_ejection_s,
            stall_gap_s=rt.stall_gap_s,
        )

    def backoff_s(self, restarts: int) -> float:
        """The wait after the ``restarts``-th restart in a row before the next one may start."""
        return min(self.restart_backoff_max_s, self.restart_backoff_s * 2.0 ** max(0, restarts - 1))


@dataclass
class Verdicts:
    """A replica's latency-outlier verdicts ((when, outlier), oldest first) and how many were outliers, counted as
    they come and go: every tick reads the count for every replica."""

    seen: deque[tuple[float, bool]] = field(default_factory=deque)
    hits: int = 0

    def add(self, at: float, outlier: bool) -> None:
        self.seen.append((at, outlier))
        self.hits += outlier

    def since(self, horizon: float) -> int:
        """The outliers at or after ``horizon``; older verdicts are dropped."""
        while self.seen and self.seen[0][0] < horizon:
            self.hits -= self.seen.popleft()[1]
        return self.hits

    def clear(self) -> None:
        self.seen.clear()
        self.hits = 0

    def __len__(self) -> int:
        return len(self.seen)


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
    shed: bool = False  # out of rotation for its load or its latency, not for failing
    # the latency-outlier signal: the cumulative (TPOT seconds, requests) of the process at the last figure, the figure
    # (its mean time per output token) and whether a tick has judged it yet, the recent verdicts ((when, outlier)), and
    # whether it is out for latency, until when, after how many ejections in a row
    tpot_at: tuple[float, float] | None = None
    per_token_s: float | None = None
    per_token_new: bool = False
    # the stall signal (runtime.stall_gap_s): the process's cumulative tokens over the bound at its last report, those
    # of the last report (its figure) and whether a tick has judged it yet
    gaps_at: float | None = None
    stalled: float | None = None
    stalled_new: bool = False
    slow_verdicts: Verdicts = field(default_factory=Verdicts)
    slow: bool = False
    slow_until: float | None = None
    ejections: int = 0
    hot: int = 0  # reports in a row with its load at or above the shed floor
    restarts: int = 0  # restarts in a row without stable service since (the back-off's exponent)
    # when each restart made within the last quarantine window started (quarantine counts these)
    restart_times: list[float] = field(default_factory=list)
    restarted_at: float | None = None
    serving_since: float | None = None
    loading: bool = False  # restarted, its warm-up not over: its probes move no score
    # its node booted (a new boot id, or a young one): loading until it answers or this time passes
    booting_until: float | None = None
    fresh: bool = False  # a new process (restarted, or its node booted) that has not passed a warm-up yet
    failed_in_row: int = 0  # judged probes failed in a row in a disrupted rack (its frozen score does not show them)
    answered: bool = True  # its last probe, judged or not (a loading replica's too)
    breaker_since: float | None = None  # since when every router tracking it has held its circuit breaker open
    failed_warmups: int = 0  # in a row: readmissions back off on these
    failed_removals: int = 0  # in a row: removals back off on these (routers that refuse every change)
    remove_after: float | None = None
    readmit_started: float | None = None
    warm_s: float = 0.0  # its readmission's warm-up
    readmit_after: float | None = None
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
    rack: str = ""
    failing: bool = False  # more than half of the replicas its last report judged failed their probes
    skew_s: float | None = None  # the last report's wall-clock send time minus the controller's wall clock at receipt
    last_key: tuple[str, int] | None = None  # (boot id, monotonic seq) of the last applied report
    boots: set[str] = field(default_factory=set)  # boot ids the node reported from: an earlier boot is over
    # (receive time − seq) of this boot's last reports, the controller's monotonic clock against the node's: their
    # least is the transit's floor, and a report's send time on the controller's clock is seq + that floor
    offsets: deque[float] = field(default_factory=deque)
    missed: int = 0

    def suspect(self, threshold: int) -> bool:
        return self.missed >= threshold


@dataclass
class Counters:
    accepted: int = 0
    late: int = 0  # of those, reports that arrived more than an interval after they were sent (transit, a queue)
    replicas: int = 0  # the replica probes the accepted reports carried (accepted × replicas per node when aggregated)
    answered: int = 0  # of those, the probes the replica answered (ok): each one a health call the replica served
    rejected: dict[Rejection, int] = field(default_factory=lambda: dict.fromkeys(Rejection, 0))
    actions: dict[Kind, int] = field(default_factory=lambda: dict.fromkeys(Kind, 0))
    capped: int = 0
    failed: dict[Kind, int] = field(default_factory=lambda: dict.fromkeys(Kind, 0))
    quarantined: int = 0  # replicas put in quarantine (each time)
    refused: int = 0  # restarts the deployment refused to start (a disruption budget)
    breakers: int = 0  # replicas taken out of rotation for a circuit breaker the routers held open past the dwell
    withheld: int = 0  # restarts not started: the replica's rack is disrupted (a partition or a rack outage)
    limited: int = 0  # restarts not started: the fleet-wide restart budget was spent


@dataclass
class Tally:
    """Replicas out of rotation: for a failure (``hard``: the eviction cap) and for load (``soft``: shed)."""

    hard: int
    soft: int


@dataclass
class Budget:
    """A token bucket: ``burst`` tokens, refilled at ``rate_per_s``; each restart takes one."""

    rate_per_s: float
    burst: int
    tokens: float
    at: float

    def refill(self, now: float) -> float:
        self.tokens = min(float(self.burst), self.tokens + max(0.0, now - self.at) * self.rate_per_s)
        self.at = max(self.at, now)
        return self.tokens

    def take(self, now: float) -> bool:
        if self.refill(now) < 1.0:
            return False
        self.tokens -= 1.0
        return True
