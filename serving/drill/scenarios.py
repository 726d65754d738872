"""The fault drills' catalogue: what each scenario breaks, what the plan promises about it, which alerts must fire
and which must stay quiet. One source of truth for the drill engine (a running fleet) and for the Chaos Mesh
renderer (:mod:`serving.render.k8s.chaos`); docs/drills.md explains it.

The targets come from the plan, never from constants: **detection** is the plan's failure detection
(``heartbeats.failure_detection_s``: misses × interval + the last probe's timeout), **recovery** the plan's recovery
(``heartbeats.recovery_s``: detection + the migration budget), **restoration** the runtime's path back into rotation
(the probe that takes the score below ``health.migrate_below`` starts the migration, which the migration budget
bounds, then the warm-up), **takeover** a follower leading after the leader stopped (one lease, then at most one
campaign period, a third of the lease). Client errors during a drill are judged against the rollout's error gate.

Magnitudes come from the spec too (:func:`fault_sizes`): a slow replica answers later than the health-check
timeout, jitter stays inside the timeout's margin, a held fault lasts the plan's restoration time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, get_args

from serving.plan.model import Figure, Fleet
from serving.runtime.score import next_score
from serving.spec.schema import DrillName, HealthScoreSpec

# serving.runtime.service campaigns (and renews) every third of the lease.
CAMPAIGNS_PER_LEASE = 3
# etcd revokes expired leases (and deletes the leader key bound to one) in a loop that runs every 500 ms (its lessor's
# runLoop), so a dead leader's key outlives its lease by up to that much; a Kubernetes Lease has no such step
# (followers read renewTime + leaseDurationSeconds themselves): the target is the bare-metal one, kept for both.
ETCD_EXPIRY_CHECK_S = 0.5
# Memory pressure: the KV pool nearly full (SGLang queues new requests once it cannot admit them), and answers
# slower by twice the P99 gate, a breach routing has to move traffic away from.
MEMORY_TOKEN_USAGE = 0.95


class Component(StrEnum):
    """What a fault hits."""

    REPLICA = "replica"
    NODE = "node"  # the node agent and every replica on the node
    ROUTER = "router"  # one router instance
    CONTROLLER = "controller"  # the controller that leads


class FaultKind(StrEnum):
    SIGKILL = "sigkill"  # the process dies at once
    SIGSTOP = "sigstop"  # the process stops; the kernel still accepts connections, nothing answers
    LATENCY = "latency"  # every response arrives later than the health-check timeout
    ERRORS = "errors"  # every response fails: generations HTTP 500, health checks 503
    GENERATION_ERRORS = "generation-errors"  # generations fail with HTTP 500, /health still 200
    WEDGED = "wedged"  # the scheduler stops: HTTP answers, generations and /health (a generation) never complete
    FLAP = "flap"  # the scheduler stalls at every other health check of it, past the check's timeout; runs otherwise
    MEMORY = "memory"  # memory pressure: high KV usage and slower answers; stress-ng in the cgroup on real nodes
    JITTER = "jitter"  # network delay with jitter, inside the health-check timeout's margin


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    component: Component

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind.value, "component": self.component.value}


Judging = Literal["targets", "order"]  # exaserve drill --judge: the plan's targets, or what happened in what order


class TargetName(StrEnum):
    DETECTION = "detection_s"
    RECOVERY = "recovery_s"
    RESTORATION = "restoration_s"
    TAKEOVER = "takeover_s"
    CLIENT_ERRORS = "client_error_rate"


@dataclass(frozen=True)
class Target:
    """One figure a drill is judged against: the measured value must not exceed ``value``."""

    name: TargetName
    value: float
    unit: str
    formula: str
    meaning: str

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name.value,
            "value": self.value,
            "unit": self.unit,
            "formula": self.formula,
            "meaning": self.meaning,
        }


@dataclass(frozen=True)
class Scenario:
    """One drill. ``targets`` are the plan's figures that apply; ``evicts`` says whether replicas should leave
    rotation (when false, one that does is a false detection and fails the drill); ``alerts`` must fire while the
    fault lasts and ``quiet`` must not fire at all; ``alert_note`` says why."""

    name: DrillName
    description: str
    faults: tuple[Fault, ...]
    targets: tuple[TargetName, ...]
    evicts: bool
    alerts: tuple[str, ...]
    quiet: tuple[str, ...]
    alert_note: str
    # who takes the replica out first: "routers" (their health checks: heartbeats.failure_detection_s),
    # "controller" (a fault the routers' cheap /health does not see: the agents' /health_generate probes through the
    # score, timeouts_to_stop_routing × interval + the last probe's timeout) or "breakers" (requests fail while every
    # probe passes: the leader removes it once the routers' breakers stayed open runtime.breaker_dwell_s)
    detected_by: Literal["routers", "controller", "breakers"] = "routers"
    # which of the agents' probes the fault fails: every one, or every other one (a flapping replica: the score falls
    # by timeout_penalty − success_reward a pair, so it takes longer to reach each line: :func:`flapping_probes`)
    fails: Literal["every", "every other"] = "every"

    @property
    def components(self) -> tuple[Component, ...]:
        return tuple(dict.fromkeys(f.component for f in self.faults))

    @property
    def restarts(self) -> bool:
        """The runtime restarts the faulted replicas (their migration) before they come back: a replica's fault the
        scenario waits on to return (with a lost leader, its successor restarts it; a held node fault brings its
        replicas back with the node instead)."""
        return TargetName.RESTORATION in self.targets and any(f.component is Component.REPLICA for f in self.faults)


# Alert rules rendered by serving.render.k8s.monitoring and serving.render.k8s.runtime (a test checks each name).
ERROR_RATE = "ExaServeErrorRate"
WORKERS_UNHEALTHY = "ExaServeWorkersUnhealthy"
REPLICA_RESTARTS = "ExaServeReplicaRestarts"
NODE_SUSPECT = "ExaServeNodeSuspect"
NODE_HEALTH_LOW = "ExaServeNodeHealthLow"
NO_LEADER = "ExaServeNoControllerLeader"
SPLIT_BRAIN = "ExaServeControllerSplitBrain"
EVICTION_CAP = "ExaServeEvictionCapReached"
ACTIONS_FAILING = "ExaServeRuntimeActionsFailing"
ROUTER_DOWN = "ExaServeRouterInstanceDown"
OUT_OF_ROTATION = "ExaServeReplicaOutOfRotation"
QUARANTINED = "ExaServeReplicaQuarantined"

_SELF_HEALED = (
    "ExaServeReplicaOutOfRotation (a warning) fires while the controller holds the replica out. Nothing else: one "
    "replica is inside the failure reserve, the router's retries keep client errors under the gate, the replica is "
    "back long before ExaServeWorkersUnhealthy's 5 minutes, and the migration and warm-up succeed."
)
_REPLICA_QUIET = (ERROR_RATE, WORKERS_UNHEALTHY, ACTIONS_FAILING, EVICTION_CAP, QUARANTINED)
_EVICTING = (TargetName.DETECTION, TargetName.RECOVERY, TargetName.RESTORATION)


def _scenarios() -> dict[DrillName, Scenario]:
    replica = Component.REPLICA
    found = [
        Scenario(
            "replica-crash",
            "SIGKILL one replica's server: it is gone at once, connections are refused.",
            (Fault(FaultKind.SIGKILL, replica),),
            _EVICTING,
            True,
            (OUT_OF_ROTATION,),
            (*_REPLICA_QUIET, REPLICA_RESTARTS),
            _SELF_HEALED + " One restart stays under ExaServeReplicaRestarts' 3 per hour.",
        ),
        Scenario(
            "replica-hang",
            "SIGSTOP one replica's server: connections open, nothing answers; requests on it wait for the router's "
            "request timeout and are retried elsewhere.",
            (Fault(FaultKind.SIGSTOP, replica),),
            _EVICTING,
            True,
            (OUT_OF_ROTATION,),
            _REPLICA_QUIET,
            _SELF_HEALED,
        ),
        Scenario(
            "scheduler-wedged",
            "One replica's scheduler wedges (a hung forward batch): its HTTP server, /metrics and /model_info still "
            "answer, and so does the routers' /health (the servers render it without a generation), but generations "
            "never complete and /health_generate, which the node agents probe, answers 503 after its timeout: the "
            "controller takes the replica out through its score; requests on it wait for the router's request "
            "timeout and are retried elsewhere.",
            (Fault(FaultKind.WEDGED, replica),),
            _EVICTING,
            True,
            (OUT_OF_ROTATION,),
            _REPLICA_QUIET,
            _SELF_HEALED,
            "controller",
        ),
        Scenario(
            "replica-flapping",
            "One replica's scheduler flaps: at every other health check the node agents make (/health_generate) it "
            "stalls a quarter longer than the check's timeout, so that check gets no output and fails, and every "
            "request on the replica waits out the stall; between stalls it runs. The routers' cheap /health and "
            "their breakers see nothing (the requests are slow, not failed), so clients wait on it until the "
            "controller's score, falling by the penalty less the reward every two probes, takes it out below the "
            "stop-routing line; it stays out while it flaps (readmission needs readmit_at, a climb the flapping "
            "cannot make) and is restarted below the migrate line; the fresh process is warmed up and readmitted.",
            (Fault(FaultKind.FLAP, replica),),
            _EVICTING,
            True,
            (OUT_OF_ROTATION,),
            (*_REPLICA_QUIET, REPLICA_RESTARTS),
            _SELF_HEALED + " One restart stays under ExaServeReplicaRestarts' 3 per hour; none may be quarantined.",
            "controller",
            "every other",
        ),
        Scenario(
            "replica-slow",
            "One replica answers everything, health checks included, later than serving.health_check_timeout_s: "
            "alive but too slow to serve, so it must be treated as failed.",
            (Fault(FaultKind.LATENCY, replica),),
            _EVICTING,
            True,
            (OUT_OF_ROTATION,),
            _REPLICA_QUIET,
            _SELF_HEALED,
        ),
        Scenario(
            "error-burst",
            "One replica fails every answer for the length of the burst: generations with HTTP 500, health checks "
            "with 503 (the only failure SGLang's /health answers).",
            (Fault(FaultKind.ERRORS, replica),),
            _EVICTING,
            True,
            (OUT_OF_ROTATION,),
            _REPLICA_QUIET,
            _SELF_HEALED + " ExaServeErrorRate counts client-facing errors: it fires only if retries fail to hide "
            "the burst.",
        ),
        Scenario(
            "generation-errors",
            "One replica fails every generation with HTTP 500 while its /health answers 200 (its scheduler still "
            "runs, so SGLang's health_generate passes): the agents' probes see nothing; the routers' circuit breakers "
            "open on the failures, and the leader, which reads them, takes the replica out of rotation once they have "
            "stayed open runtime.breaker_dwell_s (request errors alone restart nothing); its warm-up's requests fail "
            "while /health answers, the controller's own evidence, and it restarts the replica.",
            (Fault(FaultKind.GENERATION_ERRORS, replica),),
            _EVICTING,
            True,
            (OUT_OF_ROTATION,),
            (ERROR_RATE, WORKERS_UNHEALTHY, EVICTION_CAP, QUARANTINED),
            _SELF_HEALED + " ExaServeRuntimeActionsFailing may fire: the readmission's warm-up failing on its requests "
            "is what tells the controller to restart it.",
            "breakers",
        ),
        Scenario(
            "memory-pressure",
            "One replica under memory pressure: it reports its KV cache nearly full, admits only what fits (the rest "
            "queues) and slows (on real nodes stress-ng in the replica's cgroup). The router's load-aware pick does "
            "not see it in time; the controller sheds the replica's load (out of every router, no restart) and "
            "readmits it after a warm-up once the pressure is gone.",
            (Fault(FaultKind.MEMORY, replica),),
            (TargetName.DETECTION, TargetName.RECOVERY),
            True,
            (OUT_OF_ROTATION,),
            _REPLICA_QUIET,
            "ExaServeReplicaOutOfRotation (a warning) fires while the replica is shed. No rule watches memory pressure "
            "itself (no KV-cache saturation alert, no host-memory alert on the serving cgroup): a replica the "
            "controller cannot shed (eviction cap) shows only as ExaServeP99LatencyHigh after 10 minutes, or "
            "ExaServeReplicaRestarts once OOM kills repeat. The drill holds the fault, so restoration is reported, "
            "not judged.",
        ),
        Scenario(
            "network-jitter",
            "Delay with jitter on one node's replicas, inside the health-check timeout's margin (the source's 1 s "
            "timeout flapped under such jitter, 3 s fixed it): nothing may leave rotation.",
            (Fault(FaultKind.JITTER, Component.NODE),),
            (),
            False,
            (),
            (OUT_OF_ROTATION, NODE_HEALTH_LOW, ERROR_RATE, EVICTION_CAP),
            "Jitter inside the timeout is not a failure: every alert stays quiet; ExaServeNodeHealthLow firing means "
            "the health-check timeout has no margin left.",
        ),
        Scenario(
            "node-loss",
            "SIGKILL one node's agent and every replica on it: a node gone at once. It comes back (a reboot) "
            "after the hold; its return is the node's repair, not the runtime's, so restoration is reported, not "
            "judged.",
            (Fault(FaultKind.SIGKILL, Component.NODE),),
            (TargetName.DETECTION, TargetName.RECOVERY),
            True,
            (NODE_SUSPECT,),
            (ERROR_RATE, EVICTION_CAP, ACTIONS_FAILING),
            "The node's agent stops reporting: ExaServeNodeSuspect fires after serving.failure_threshold missed "
            "reports plus its 'for'. The router's own checks take the replicas out (a suspect node's scores freeze).",
        ),
        Scenario(
            "node-stall",
            "SIGSTOP every replica of one node, its agent alive and reporting them failed, for the plan's "
            "restoration time (longer than the migrate line, as the 90 s fault of issue 24 was at prod settings): "
            "the node's score crosses the migrate line, each replica is restarted once at most (no restart storm), "
            "the eviction cap holds the rest out by the routers' own checks until the fault lifts.",
            (Fault(FaultKind.SIGSTOP, Component.NODE),),
            (TargetName.DETECTION, TargetName.RECOVERY),
            True,
            (OUT_OF_ROTATION,),
            (ERROR_RATE, QUARANTINED, ACTIONS_FAILING, REPLICA_RESTARTS),
            "ExaServeReplicaOutOfRotation fires for the replicas the controller takes out. No replica may be "
            "quarantined or restarted more than ExaServeReplicaRestarts allows (a restart storm would) and no action "
            "may fail. The drill holds the fault, so "
            "restoration is reported, not judged.",
        ),
        Scenario(
            "router-loss",
            "SIGKILL one router instance: clients of that instance fail over to the others; no replica leaves "
            "rotation.",
            (Fault(FaultKind.SIGKILL, Component.ROUTER),),
            (TargetName.RECOVERY,),
            False,
            (ROUTER_DOWN,),
            (OUT_OF_ROTATION, WORKERS_UNHEALTHY, ERROR_RATE),
            "ExaServeRouterInstanceDown fires while fewer router instances are up than scheduler.instances for "
            "longer than the plan's recovery time.",
        ),
        Scenario(
            "leader-loss",
            "SIGKILL the controller that leads: a follower must take over within the lease and act on nothing "
            "before it does; serving is untouched.",
            (Fault(FaultKind.SIGKILL, Component.CONTROLLER),),
            (TargetName.TAKEOVER,),
            False,
            (),
            (NO_LEADER, SPLIT_BRAIN, ACTIONS_FAILING, OUT_OF_ROTATION),
            "A takeover within the lease pages nobody: ExaServeNoControllerLeader waits two leases, so it fires "
            "only when no follower takes over.",
        ),
        Scenario(
            "double-fault",
            "replica-crash and leader-loss at the same instant: the routers take the replica out on their own, the "
            "follower that takes over must migrate and readmit it.",
            (Fault(FaultKind.SIGKILL, replica), Fault(FaultKind.SIGKILL, Component.CONTROLLER)),
            (*_EVICTING, TargetName.TAKEOVER),
            True,
            (OUT_OF_ROTATION,),
            (*_REPLICA_QUIET, NO_LEADER, SPLIT_BRAIN),
            "As replica-crash (ExaServeReplicaOutOfRotation, once the new leader takes the replica out) and "
            "leader-loss (no leaderless alert): both handled, nothing pages.",
        ),
        Scenario(
            "router-and-replica-loss",
            "SIGKILL one router instance and one replica at the same instant: the routers that answer take the "
            "replica out, the leader acts on them (the silent instance is marked unsynced, not waited for), and "
            "reconciles that instance when it comes back after the hold (it must not route to a replica the "
            "controller took out).",
            (Fault(FaultKind.SIGKILL, replica), Fault(FaultKind.SIGKILL, Component.ROUTER)),
            _EVICTING,
            True,
            (OUT_OF_ROTATION, ROUTER_DOWN),
            (*_REPLICA_QUIET, REPLICA_RESTARTS),
            "As replica-crash and router-loss together: ExaServeReplicaOutOfRotation while the replica is out and "
            "ExaServeRouterInstanceDown while the router is held down. ExaServeRouterUnsynced may fire (a membership "
            "change the silent instance missed) and is neither required nor forbidden: whether the leader's change "
            "lands while the instance is down depends on when the routers' own checks took the replica out.",
        ),
    ]
    return {s.name: s for s in found}


SCENARIOS: dict[DrillName, Scenario] = _scenarios()
NAMES: tuple[DrillName, ...] = get_args(DrillName)


def plan_targets(fleet: Fleet) -> dict[TargetName, Target]:
    """Every target a drill can be judged against, from the plan's heartbeat figures and the spec's budgets.

    The spec is needed besides the plan for what the plan does not carry: the heartbeat interval and timeout (the
    probe that starts a migration), the warm-up, the lease and the error gate."""
    s, hb = fleet.spec.serving, fleet.plan.heartbeats
    detect, recover = hb.failure_detection_s.value, hb.recovery_s.value
    migrate = int(hb.timeouts_to_migrate.value)
    start = migrate * s.heartbeat_interval_s + s.health_check_timeout_s
    restore = start + s.migration_timeout_s + s.warmup_duration_s
    ttl = fleet.spec.runtime.lease_ttl_s
    campaign = ttl / CAMPAIGNS_PER_LEASE
    gate = fleet.spec.rollout.max_error_rate
    return {
        TargetName.DETECTION: Target(
            TargetName.DETECTION,
            detect,
            "s",
            f"heartbeats.failure_detection_s: {hb.failure_detection_s.formula}",
            "fault → the replica out of every router instance",
        ),
        TargetName.RECOVERY: Target(
            TargetName.RECOVERY,
            recover,
            "s",
            f"heartbeats.recovery_s: {hb.recovery_s.formula}",
            "fault → traffic fully served by the others at the baseline rate and latency",
        ),
        TargetName.RESTORATION: Target(
            TargetName.RESTORATION,
            restore,
            "s",
            f"{migrate} timeouts to migrate × {s.heartbeat_interval_s:g} s + {s.health_check_timeout_s:g} s timeout "
            f"of the last probe + {s.migration_timeout_s:g} s migration + {s.warmup_duration_s:g} s warm-up "
            f"= {restore:g} s",
            "fault → the replica back in rotation after its warm-up",
        ),
        TargetName.TAKEOVER: Target(
            TargetName.TAKEOVER,
            ttl + ETCD_EXPIRY_CHECK_S + campaign,
            "s",
            f"{ttl:g} s lease + {ETCD_EXPIRY_CHECK_S:g} s etcd's expiry check + {campaign:.3g} s campaign period (a "
            f"third of the lease) = {ttl + ETCD_EXPIRY_CHECK_S + campaign:.3g} s",
            "leader stopped → another controller leads",
        ),
        TargetName.CLIENT_ERRORS: Target(
            TargetName.CLIENT_ERRORS,
            gate,
            "share",
            f"rollout.max_error_rate: {gate:.2%} of client requests",
            "client requests that failed during the drill",
        ),
    }


def flapping_probes(health: HealthScoreSpec, below: int) -> int:
    """The agents' probes that take a score from ``health.cap`` below ``below`` when every other probe fails, in the
    worst order: the first probe after the fault passes (one already under way when the fault came), then fail, pass,
    … (:func:`serving.runtime.score.next_score`, the controller's own step)."""
    score, probes = health.cap, 0
    while score >= below:
        probes += 1
        score = next_score(score, probes % 2 == 1, health)  # the 1st, 3rd, … pass
        if probes > 10 * (health.cap + 1):
            raise ValueError(
                f"health: a replica failing every other probe never falls below {below} (timeout_penalty "
                f"{health.timeout_penalty} ≤ success_reward {health.success_reward}); a flapping replica stays in "
                "rotation: make timeout_penalty larger than success_reward"
            )
    return probes


def _flapping_targets(fleet: Fleet, targets: dict[TargetName, Target]) -> None:
    """Detection, recovery and restoration of a replica failing every other probe: the same paths as the controller's
    for one failing every probe, through :func:`flapping_probes` instead of the plan's timeouts to each line. Its
    clients wait on the stalls until it leaves the routers, so recovery is the plan's (detection + the migration
    budget) counted from that detection, not the routers' own."""
    s, h = fleet.spec.serving, fleet.spec.health
    tick = s.heartbeat_interval_s / 2
    stop, migrate = flapping_probes(h, h.stop_routing_below), flapping_probes(h, h.migrate_below)
    # the first of those probes is the one under way when the fault came (it passes), so the last starts
    # (probes - 1) intervals after the fault at most; a fault that came between probes makes the first one after it
    # fail, and the score needs one probe fewer (a pass at the cap moves nothing), from up to an interval later: the
    # same bound
    detect = (stop - 1) * s.heartbeat_interval_s + s.health_check_timeout_s + 2 * tick
    recover = detect + s.migration_timeout_s
    targets[TargetName.RECOVERY] = Target(
        TargetName.RECOVERY,
        recover,
        "s",
        f"{detect:g} s detection (the score's, below) + {s.migration_timeout_s:g} s migration = {recover:g} s",
        "fault → traffic fully served by the others at the baseline rate and latency",
    )
    targets[TargetName.DETECTION] = Target(
        TargetName.DETECTION,
        detect,
        "s",
        f"{stop} probes from {h.cap} below {h.stop_routing_below}, one in two failing (−{h.timeout_penalty}, "
        f"+{h.success_reward}, the first passing, under way when the fault came): {stop - 1} intervals × "
        f"{s.heartbeat_interval_s:g} s + {s.health_check_timeout_s:g} s "
        f"timeout of the last probe + {tick:g} s the leader's tick + {tick:g} s its removal on every router = "
        f"{detect:g} s",
        "fault → the replica out of every router instance",
    )
    restore = (
        (migrate - 1) * s.heartbeat_interval_s + s.health_check_timeout_s + s.migration_timeout_s + s.warmup_duration_s
    )
    targets[TargetName.RESTORATION] = Target(
        TargetName.RESTORATION,
        restore,
        "s",
        f"{migrate} probes from {h.cap} below {h.migrate_below}, one in two failing, the first under way when the "
        f"fault came: {migrate - 1} intervals × {s.heartbeat_interval_s:g} s + "
        f"{s.health_check_timeout_s:g} s timeout of the last probe + {s.migration_timeout_s:g} s migration + "
        f"{s.warmup_duration_s:g} s warm-up = {restore:g} s",
        "fault → the replica restarted and back in rotation after its warm-up",
    )


def scenario_targets(scenario: Scenario, fleet: Fleet) -> tuple[Target, ...]:
    """The targets that apply to ``scenario``, client errors always last. When the leader is lost together with a
    replica, restoration waits for the takeover: the leader is what migrates and readmits. A fault only the
    controller sees is detected through the score (:attr:`Scenario.detected_by`)."""
    targets = plan_targets(fleet)
    if scenario.detected_by == "controller":
        s, hb = fleet.spec.serving, fleet.plan.heartbeats
        stop = int(hb.timeouts_to_stop_routing.value)
        # the leader decides every half interval (serving.runtime.service) and its removal, on every router instance
        # at once and proved on each, is done before the next decision
        tick = s.heartbeat_interval_s / 2
        detect = stop * s.heartbeat_interval_s + s.health_check_timeout_s + 2 * tick
        targets[TargetName.DETECTION] = Target(
            TargetName.DETECTION,
            detect,
            "s",
            f"{stop} timeouts to stop routing × {s.heartbeat_interval_s:g} s + {s.health_check_timeout_s:g} s timeout "
            f"of the last probe + {tick:g} s the leader's tick + {tick:g} s its removal on every router = {detect:g} s "
            "(the agents' /health_generate, through the score)",
            "fault → the replica out of every router instance",
        )
    if scenario.detected_by == "breakers":
        s = fleet.spec.serving
        dwell = fleet.spec.breaker_dwell_s()
        tick = s.heartbeat_interval_s / 2
        detect = dwell + 3 * tick
        targets[TargetName.DETECTION] = Target(
            TargetName.DETECTION,
            detect,
            "s",
            f"{tick:g} s until the leader's tick reads the routers' breakers open + {dwell:g} s runtime.breaker_dwell_s "
            f"+ {tick:g} s the tick that decides + {tick:g} s its removal on every router = {detect:g} s (request "
            "errors alone: the breakers open at the first failures under load, the dwell is the design's)",
            "fault → the replica out of every router instance",
        )
    if scenario.fails == "every other":
        _flapping_targets(fleet, targets)
    chosen = [targets[name] for name in scenario.targets]
    if len(scenario.faults) > 1 and Component.CONTROLLER in scenario.components:
        takeover = targets[TargetName.TAKEOVER]
        chosen = [
            Target(
                t.name, t.value + takeover.value, t.unit, f"{t.formula} + {takeover.value:.3g} s takeover", t.meaning
            )
            if t.name is TargetName.RESTORATION
            else t
            for t in chosen
        ]
    return (*chosen, targets[TargetName.CLIENT_ERRORS])


@dataclass(frozen=True)
class FaultSizes:
    """How big the faults are, from the spec: the same on every backend."""

    hold_s: Figure
    slow_latency_s: Figure
    jitter_delay_s: Figure
    jitter_s: Figure
    memory_token_usage: Figure
    memory_admit: Figure
    memory_slowdown: Figure
    flap_stall_s: Figure


def fault_sizes(fleet: Fleet) -> FaultSizes:
    timeout = fleet.spec.serving.health_check_timeout_s
    restore = plan_targets(fleet)[TargetName.RESTORATION]
    hold = math.ceil(restore.value)
    third = timeout / 3
    rise = fleet.spec.rollout.max_p99_rise
    batch = fleet.spec.limits.max_running_requests
    admit = max(1, math.floor((1 - MEMORY_TOKEN_USAGE) * batch))
    return FaultSizes(
        hold_s=Figure(hold, "s", f"a held fault lasts the plan's restoration time: ⌈{restore.value:g} s⌉ = {hold} s"),
        slow_latency_s=Figure(
            2 * timeout, "s", f"2 × {timeout:g} s health-check timeout = {2 * timeout:g} s: every probe times out"
        ),
        jitter_delay_s=Figure(third, "s", f"{timeout:g} s health-check timeout / 3 = {third:g} s"),
        jitter_s=Figure(
            third,
            "s",
            f"± {third:g} s: at most {2 * third:g} s, a third of the {timeout:g} s timeout left as margin",
        ),
        memory_token_usage=Figure(
            MEMORY_TOKEN_USAGE, "share", f"sglang:token_usage {MEMORY_TOKEN_USAGE:g}: the KV pool nearly full"
        ),
        memory_admit=Figure(
            admit,
            "requests",
            f"what fits the {1 - MEMORY_TOKEN_USAGE:.0%} of the pool left: max(1, ⌊{1 - MEMORY_TOKEN_USAGE:.2f} × "
            f"{batch} limits.max_running_requests⌋) = {admit} running, the rest queued",
        ),
        memory_slowdown=Figure(
            1 + 2 * rise, "×", f"1 + 2 × {rise:g} rollout.max_p99_rise = {1 + 2 * rise:g} × the generation latency"
        ),
        flap_stall_s=Figure(
            1.25 * timeout,
            "s",
            f"1.25 × {timeout:g} s health-check timeout = {1.25 * timeout:g} s: the check that starts the stall gets no "
            "output before it times out",
        ),
    )


def scenario_json(scenario: Scenario, fleet: Fleet) -> dict[str, Any]:
    """The scenario as ``exaserve drill --list --json`` prints it."""
    return {
        "name": scenario.name,
        "description": scenario.description,
        "faults": [f.to_json() for f in scenario.faults],
        "components": [c.value for c in scenario.components],
        "evicts": scenario.evicts,
        "targets": [t.to_json() for t in scenario_targets(scenario, fleet)],
        "alerts": {"fire": list(scenario.alerts), "quiet": list(scenario.quiet), "note": scenario.alert_note},
    }
