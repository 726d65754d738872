"""Rules that reject infeasible or unsafe plans before merge.

Each rule is a named pure function over the spec and its computed plan that yields
:class:`Violation` records naming the rule, the spec path, the arithmetic and the fix. Errors make
``exaserve plan`` exit 1; warnings are shown but do not fail the plan.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Literal

from serving.plan.planner import Plan, fmt_bytes, rollout_groups
from serving.spec.schema import FabricKind, FleetSpec, LogLevel

Severity = Literal["error", "warning"]
MIN_HEALTH_TIMEOUT_S = 3.0
MIN_TP_FABRIC_GBPS = 100
MIN_SCHEDULER_PERIOD_MS = 100
MIN_HA_INSTANCES = 3
MAX_RESTART_S = 30.0


@dataclass(frozen=True)
class Violation:
    rule: str
    path: str
    message: str
    severity: Severity = "error"

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


RuleFn = Callable[[FleetSpec, Plan], Iterator[Violation]]
RULES: dict[str, RuleFn] = {}


def rule(name: str) -> Callable[[RuleFn], RuleFn]:
    def register(fn: RuleFn) -> RuleFn:
        RULES[name] = fn
        return fn

    return register


@rule("placement.gpus-per-node")
def _gpus_per_node(spec: FleetSpec, plan: Plan) -> Iterator[Violation]:
    """GPUs per replica × replicas per node must fit in the node's GPUs."""
    p = plan.placement
    rpn = spec.serving.replicas_per_node
    if p.nodes_per_replica == 1 and rpn is not None and rpn * p.gpus_per_replica > p.gpus_per_node:
        yield Violation(
            "placement.gpus-per-node",
            "serving.replicas_per_node",
            f"Got {rpn}: {rpn} replicas × {p.gpus_per_replica} GPUs each (TP {spec.parallelism.tp} × PP "
            f"{spec.parallelism.pp} × DP {spec.parallelism.dp}) needs {rpn * p.gpus_per_replica} GPUs, the node has "
            f"{p.gpus_per_node}. Use at most {p.max_replicas_per_node}, or lower tp/pp.",
        )
    if p.nodes_per_replica > 1 and rpn is not None:
        yield Violation(
            "placement.gpus-per-node",
            "serving.replicas_per_node",
            f"Got {rpn}: a replica of {p.gpus_per_replica} GPUs spans {p.nodes_per_replica} nodes of "
            f"{p.gpus_per_node} GPUs, so no node holds a whole replica. Set replicas_per_node to null "
            f"(multi-node replicas), or lower tp × pp to at most {p.gpus_per_node}.",
        )


@rule("placement.whole-nodes")
def _whole_nodes(spec: FleetSpec, plan: Plan) -> Iterator[Violation]:
    """A replica that spans nodes must use whole nodes (GPUs per replica a multiple of GPUs per node)."""
    p = plan.placement
    if p.gpus_per_replica > p.gpus_per_node and p.gpus_per_replica % p.gpus_per_node:
        yield Violation(
            "placement.whole-nodes",
            "parallelism",
            f"Got {p.gpus_per_replica} GPUs per replica: it spans nodes but is not a multiple of "
            f"{p.gpus_per_node} GPUs per node, stranding {p.nodes_per_replica * p.gpus_per_node - p.gpus_per_replica} "
            f"GPUs per replica. Make tp × pp × dp a multiple of {p.gpus_per_node}.",
        )


@rule("placement.fleet-capacity")
def _fleet_capacity(spec: FleetSpec, plan: Plan) -> Iterator[Violation]:
    """The cluster must hold every replica the spec asks for."""
    p = plan.placement
    per_node = p.replicas_per_node if p.nodes_per_replica == 1 and p.replicas_per_node else p.max_replicas_per_node
    holds = p.nodes * min(per_node, p.max_replicas_per_node) if p.nodes_per_replica == 1 else p.max_replicas
    if spec.serving.replicas > holds:
        yield Violation(
            "placement.fleet-capacity",
            "serving.replicas",
            f"Got {spec.serving.replicas:,}: {p.nodes} nodes hold at most {holds:,} replicas ({p.formula}). "
            f"Use at most {holds:,} replicas, or add nodes.",
        )


@rule("memory.per-gpu")
def _memory(spec: FleetSpec, plan: Plan) -> Iterator[Violation]:
    """The per-GPU memory budget (weights + KV + activations + overhead + margin) must fit usable memory."""
    m = plan.memory
    need, have = m.per_gpu["total"].value, m.usable_per_gpu.value
    if need > have:
        yield Violation(
            "memory.per-gpu",
            "model",
            f"Each GPU needs {fmt_bytes(need)} ({m.per_gpu['total'].formula}) but only {fmt_bytes(have)} is usable "
            f"({m.usable_per_gpu.formula}); the KV pool admits {int(m.max_concurrent_sequences.value)} sequences of "
            f"{spec.limits.context_length:,} tokens against max_running_requests {spec.limits.max_running_requests}. "
            "Raise tp/pp, quantise (model.precision), or lower limits.max_running_requests/context_length.",
        )


@rule("network.tp-across-nodes")
def _tp_fabric(spec: FleetSpec, plan: Plan) -> Iterator[Violation]:
    """Tensor parallelism across nodes needs at least 100 Gb/s (source §3.3)."""
    rate = spec.cluster.fabric.link_rate_gbps
    if plan.placement.tp_crosses_nodes and rate < MIN_TP_FABRIC_GBPS:
        yield Violation(
            "network.tp-across-nodes",
            "cluster.fabric.link_rate_gbps",
            f"Got {rate}: TP {spec.parallelism.tp} crosses nodes of {plan.placement.gpus_per_node} GPUs and moves "
            f"{plan.network.fabric_bytes_per_forward.formula}; below {MIN_TP_FABRIC_GBPS} Gb/s that takes "
            f"{plan.network.fabric_time_per_forward_s.formula}. Keep tp ≤ {plan.placement.gpus_per_node} or use ≥ 100 Gb/s RDMA.",
        )
    if plan.placement.tp_crosses_nodes and spec.cluster.fabric.kind is FabricKind.ETHERNET:
        yield Violation(
            "network.tp-across-nodes",
            "cluster.fabric.kind",
            f"Got {spec.cluster.fabric.kind.value}: all-reduce over TCP adds far more than the tens of µs the source "
            "allows per collective. Use InfiniBand/RoCE or keep TP inside a node.",
        )


@rule("network.utilisation")
def _utilisation(spec: FleetSpec, plan: Plan) -> Iterator[Violation]:
    """Warn where the link rate predicts a low GPU utilisation (source's link-rate table)."""
    _, hi, _ = plan.network.utilisation_band
    if hi <= 0.25 and plan.network.fabric_bytes_per_forward.value > 0:
        yield Violation(
            "network.utilisation",
            "cluster.fabric.link_rate_gbps",
            f"{plan.network.utilisation_formula}; replicas that span nodes will idle their GPUs. Use ≥ 100 Gb/s.",
            "warning",
        )


@rule("heartbeat.central-jitter")
def _jitter(spec: FleetSpec, plan: Plan) -> Iterator[Violation]:
    """A central scheduler taking direct heartbeats jittered above ≈ 1,500 replicas (source §3.4)."""
    hb = plan.heartbeats
    if hb.active_per_s.value > hb.central_limit_per_s.value:
        yield Violation(
            "heartbeat.central-jitter",
            "serving.heartbeat_mode",
            f"Got {spec.serving.heartbeat_mode!r}: the scheduler would take {hb.active_per_s.formula}, above the "
            f"jitter limit {hb.central_limit_per_s.formula}. Use 'aggregated' (node agents: "
            f"{hb.aggregated_per_s.formula}).",
        )


@rule("health.check-timeout")
def _timeout(spec: FleetSpec, plan: Plan) -> Iterator[Violation]:
    """A 1 s health-check timeout restarted replicas every 10 minutes; 3 s fixed it (source §3.4)."""
    t = spec.serving.health_check_timeout_s
    if t < MIN_HEALTH_TIMEOUT_S:
        yield Violation(
            "health.check-timeout",
            "serving.health_check_timeout_s",
            f"Got {t:g}: below {MIN_HEALTH_TIMEOUT_S:g} s a loaded replica's /health misses the deadline and is "
            f"restarted (the source's 1 s timeout caused a restart every 10 minutes). Use at least {MIN_HEALTH_TIMEOUT_S:g}.",
        )
    if t >= spec.serving.heartbeat_interval_s:
        yield Violation(
            "health.check-timeout",
            "serving.health_check_timeout_s",
            f"Got {t:g}: a probe must end before the next one starts every {spec.serving.heartbeat_interval_s:g} s. "
            "Lower the timeout or lengthen heartbeat_interval_s.",
        )


@rule("health.recovery-target")
def _recovery(spec: FleetSpec, plan: Plan) -> Iterator[Violation]:
    """Detection + migration must finish within the recovery target."""
    hb = plan.heartbeats
    target = spec.serving.recovery_target_s
    if hb.recovery_s.value > target:
        yield Violation(
            "health.recovery-target",
            "serving.recovery_target_s",
            f"Recovery takes {hb.recovery_s.formula} ({hb.failure_detection_s.formula}), above the {target:g} s target. "
            "Shorten heartbeat_interval_s or failure_threshold, or migration_timeout_s.",
        )


@rule("storage.restart-time")
def _restart(spec: FleetSpec, plan: Plan) -> Iterator[Violation]:
    """A restarted replica must reload from the local cache within 30 s (source §7)."""
    r = plan.restart_from_cache_s
    if r.value > MAX_RESTART_S:
        yield Violation(
            "storage.restart-time",
            "storage.local_cache.load_bandwidth_gbps",
            f"Reloading takes {r.formula}, above {MAX_RESTART_S:g} s. Use faster local NVMe or spread weights over more GPUs.",
        )


@rule("rollout.batches-cover")
def _batches(spec: FleetSpec, plan: Plan) -> Iterator[Violation]:
    """Rollout batches must cover every replica exactly once, none empty."""
    replicas = min(spec.serving.replicas, plan.placement.max_replicas)
    groups = rollout_groups(replicas, spec.rollout.batches)
    covered = sorted(i for g in groups for i in g)
    if covered != list(range(replicas)) or any(not g for g in groups):
        yield Violation(
            "rollout.batches-cover",
            "rollout.batches",
            f"Got {spec.rollout.batches}: {replicas} replicas cannot fill {spec.rollout.batches} non-empty batches "
            f"(sizes {[len(g) for g in groups]}). Use at most {replicas} batches.",
        )


@rule("rollout.gate-window")
def _gate_window(spec: FleetSpec, plan: Plan) -> Iterator[Violation]:
    """A batch must soak at least as long as the warm-up, or the gates judge a half-warm batch."""
    r, s = spec.rollout, spec.serving
    if r.interval_s < s.warmup_duration_s:
        yield Violation(
            "rollout.gate-window",
            "rollout.interval_s",
            f"Got {r.interval_s:g}: shorter than serving.warmup_duration_s {s.warmup_duration_s:g}; the next batch "
            "would start before the last one takes full traffic. Use at least the warm-up duration.",
        )


@rule("scheduler.ha")
def _ha(spec: FleetSpec, plan: Plan) -> Iterator[Violation]:
    """At least 3 scheduler instances with leader election (source §4.3); one alone is a single point of failure."""
    n = spec.scheduler.instances
    if n < MIN_HA_INSTANCES and plan.placement.nodes > 1:
        yield Violation(
            "scheduler.ha",
            "scheduler.instances",
            f"Got {n}: a quorum that survives one failure needs {MIN_HA_INSTANCES} instances. Use {MIN_HA_INSTANCES}.",
            "error" if n == 1 else "warning",
        )


@rule("scheduler.period")
def _period(spec: FleetSpec, plan: Plan) -> Iterator[Violation]:
    """A 10 ms scheduling period saturated the CPU; 100 ms balanced as well (source §4.3)."""
    ms = spec.scheduler.period_ms
    if ms < MIN_SCHEDULER_PERIOD_MS:
        yield Violation(
            "scheduler.period",
            "scheduler.period_ms",
            f"Got {ms}: {MIN_SCHEDULER_PERIOD_MS / ms:.0f}× the scheduling work of {MIN_SCHEDULER_PERIOD_MS} ms for no "
            f"better balance. Use {MIN_SCHEDULER_PERIOD_MS}.",
            "warning",
        )


@rule("ops.log-level")
def _log_level(spec: FleetSpec, plan: Plan) -> Iterator[Violation]:
    """DEBUG only while debugging: thousands of replicas log tens of MB/s (source §5)."""
    if spec.serving.log_level in (LogLevel.DEBUG, LogLevel.INFO) and plan.placement.replicas > 100:
        yield Violation(
            "ops.log-level",
            "serving.log_level",
            f"Got {spec.serving.log_level.value!r} on {plan.placement.replicas:,} replicas. Use 'warning' outside debugging.",
            "warning",
        )


@rule("health.score-consistency")
def _score(spec: FleetSpec, plan: Plan) -> Iterator[Violation]:
    """The health score must stop routing no later than the failure threshold marks a node unhealthy."""
    hb = plan.heartbeats
    if hb.timeouts_to_stop_routing.value > spec.serving.failure_threshold:
        yield Violation(
            "health.score-consistency",
            "health.timeout_penalty",
            f"The score stops routing after {hb.timeouts_to_stop_routing.formula}, but "
            f"{spec.serving.failure_threshold} misses already mark the replica unhealthy: the score only matters "
            "for flapping nodes. Intended, or raise timeout_penalty to "
            f"{math.ceil((spec.health.start - spec.health.stop_routing_below) / spec.serving.failure_threshold) + 1}.",
            "warning",
        )


def check(spec: FleetSpec, plan: Plan) -> list[Violation]:
    return [v for fn in RULES.values() for v in fn(spec, plan)]
