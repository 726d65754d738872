"""Rules that reject infeasible or unsafe plans before merge.

Each rule is a named pure function over the fleet (the spec and its computed plan) that yields a
:class:`~serving.result.CheckResult` for each problem: the rule (``check``), the spec path
(``subject``), what the plan computes with its arithmetic (``observed``), what the rule asks for
(``expected``) and the fix. ``fail`` results make ``exaserve plan`` exit 1; ``warn`` results are shown
but do not fail the plan.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from serving.plan.divisibility import rejections
from serving.plan.model import Fleet, fmt_bytes
from serving.plan.planner import ROUTER_PROBES_IN_FLIGHT
from serving.render.k8s import system
from serving.render.k8s.common import TAINT_EFFECT, TAINT_KEY
from serving.result import CheckResult, Status
from serving.spec.schema import FabricKind, LogLevel

MIN_HEALTH_TIMEOUT_S = 3.0
MIN_TP_FABRIC_GBPS = 100
MIN_SCHEDULER_PERIOD_MS = 100
MIN_HA_INSTANCES = 3
MAX_RESTART_S = 30.0

RuleFn = Callable[[Fleet], Iterator[CheckResult]]
RULES: dict[str, RuleFn] = {}


def rule(name: str) -> Callable[[RuleFn], RuleFn]:
    def register(fn: RuleFn) -> RuleFn:
        RULES[name] = fn
        return fn

    return register


@rule("placement.gpus-per-node")
def _gpus_per_node(fleet: Fleet) -> Iterator[CheckResult]:
    """GPUs per replica × replicas per node must fit in the node's GPUs."""
    p = fleet.plan.placement
    rpn = fleet.spec.serving.replicas_per_node
    if p.nodes_per_replica == 1 and rpn is not None and rpn * p.gpus_per_replica > p.gpus_per_node:
        yield CheckResult(
            "placement.gpus-per-node",
            Status.FAIL,
            f"Got {rpn}: {rpn} replicas × {p.gpus_per_replica} GPUs each (TP {fleet.spec.parallelism.tp} × PP "
            f"{fleet.spec.parallelism.pp} × DP {fleet.spec.parallelism.dp}) needs {rpn * p.gpus_per_replica} GPUs, the node has "
            f"{p.gpus_per_node}",
            f"at most {p.max_replicas_per_node} per node ({p.gpus_per_node} GPUs / {p.gpus_per_replica} GPUs per replica)",
            f"Use at most {p.max_replicas_per_node}, or lower tp/pp.",
            "serving.replicas_per_node",
        )
    if p.nodes_per_replica > 1 and rpn is not None:
        yield CheckResult(
            "placement.gpus-per-node",
            Status.FAIL,
            f"Got {rpn}: a replica of {p.gpus_per_replica} GPUs spans {p.nodes_per_replica} nodes of "
            f"{p.gpus_per_node} GPUs, so no node holds a whole replica",
            "replicas_per_node null when a replica spans nodes",
            f"Set replicas_per_node to null (multi-node replicas), or lower tp × pp to at most {p.gpus_per_node}.",
            "serving.replicas_per_node",
        )


@rule("placement.whole-nodes")
def _whole_nodes(fleet: Fleet) -> Iterator[CheckResult]:
    """A replica that spans nodes must use whole nodes (GPUs per replica a multiple of GPUs per node)."""
    p = fleet.plan.placement
    if p.gpus_per_replica > p.gpus_per_node and p.gpus_per_replica % p.gpus_per_node:
        yield CheckResult(
            "placement.whole-nodes",
            Status.FAIL,
            f"Got {p.gpus_per_replica} GPUs per replica: it spans nodes but is not a multiple of "
            f"{p.gpus_per_node} GPUs per node, stranding {p.nodes_per_replica * p.gpus_per_node - p.gpus_per_replica} "
            "GPUs per replica",
            f"a multiple of {p.gpus_per_node} GPUs per replica once a replica spans nodes",
            f"Make tp × pp × dp a multiple of {p.gpus_per_node}.",
            "parallelism",
        )


@rule("placement.fleet-capacity")
def _fleet_capacity(fleet: Fleet) -> Iterator[CheckResult]:
    """The cluster must hold every replica the spec asks for."""
    p = fleet.plan.placement
    per_node = p.replicas_per_node if p.nodes_per_replica == 1 and p.replicas_per_node else p.max_replicas_per_node
    holds = p.nodes * min(per_node, p.max_replicas_per_node) if p.nodes_per_replica == 1 else p.max_replicas
    if fleet.spec.serving.replicas > holds:
        yield CheckResult(
            "placement.fleet-capacity",
            Status.FAIL,
            f"Got {fleet.spec.serving.replicas:,}: {p.nodes} nodes hold at most {holds:,} replicas ({p.formula})",
            f"at most {holds:,} replicas",
            f"Use at most {holds:,} replicas, or add nodes.",
            "serving.replicas",
        )


@rule("memory.per-gpu")
def _memory(fleet: Fleet) -> Iterator[CheckResult]:
    """The KV pool must hold at least one full-length sequence per DP rank. By SGLang's arithmetic (the default
    memory model): free at start × mem_fraction_static − weights, per token of this GPU; by the source's
    heuristic: weights + KV + activations + overhead + margin within the usable memory."""
    m = fleet.plan.memory
    ctx = fleet.spec.limits.context_length
    fix = "Raise tp/pp, quantise (model.precision), use fp8 KV (model.kv_cache_dtype), or lower limits.context_length."
    if m.model == "sglang":
        peak, free = m.load_peak_per_gpu, m.free_at_start
        if peak is not None and free is not None and peak.value > free.value:
            yield CheckResult(
                "memory.per-gpu",
                Status.FAIL,
                f"Online FP8 (model.precision fp8 on a 16-bit checkpoint): {peak.formula}, more than the "
                f"{fmt_bytes(free.value)} free at start ({free.formula}): SGLang runs out of memory loading it",
                f"a 16-bit shard within {fmt_bytes(free.value)} a GPU at load",
                "Serve an FP8 checkpoint (model.hf_config: its config.json names quantization_config.quant_method "
                "fp8), or raise tp/pp until the 16-bit shard loads.",
                "model",
            )
            return
        if m.max_total_tokens.value < ctx:
            yield CheckResult(
                "memory.per-gpu",
                Status.FAIL,
                f"SGLang's KV pool on the replica's first GPU: {m.kv_pool_per_gpu.formula}, with weights "
                f"{m.per_gpu['weights'].formula} and mem_fraction_static {m.mem_fraction_static.formula}; "
                f"that is less than one sequence of {ctx:,} tokens",
                f"a KV pool of at least {ctx:,} tokens per GPU",
                fix,
                "model",
            )
        return
    need, have = m.per_gpu["total"].value, m.usable_per_gpu.value
    if need > have:
        yield CheckResult(
            "memory.per-gpu",
            Status.FAIL,
            f"Each GPU needs {fmt_bytes(need)} ({m.per_gpu['total'].formula}) but only {fmt_bytes(have)} is usable "
            f"({m.usable_per_gpu.formula}); the KV pool admits {int(m.max_concurrent_sequences.value)} sequences of "
            f"{ctx:,} tokens against max_running_requests {fleet.spec.limits.max_running_requests}",
            f"at most {fmt_bytes(have)} per GPU",
            fix,
            "model",
        )


@rule("model.sglang-shapes")
def _sglang_shapes(fleet: Fleet) -> Iterator[CheckResult]:
    """SGLang must accept the model's shapes at this TP size: attention and KV heads divide (or are replicated
    evenly over) the TP ranks, and a block-FP8 checkpoint's MLP and expert widths split into whole blocks
    (:mod:`serving.plan.divisibility`, each reason citing the SGLang check it mirrors)."""
    spec = fleet.spec
    tp, attn_dp, ep = spec.parallelism.tp, spec.parallelism.attn_dp, spec.parallelism.ep
    reasons = rejections(spec.model.architecture, tp, spec.model.precision.value, ep=ep, attn_dp=attn_dp)
    if reasons:
        dp = (f" with attention DP {attn_dp}" if attn_dp > 1 else "") + (f" and EP {ep}" if ep > 1 else "")
        yield CheckResult(
            "model.sglang-shapes",
            Status.FAIL,
            f"Got TP {tp}{dp}: SGLang 0.5.23 refuses to start {spec.model.name}: {'; '.join(reasons)}",
            "a TP size SGLang accepts for this model",
            "Pick another parallelism.tp"
            + (" or parallelism.attn_dp" if attn_dp > 1 else "")
            + (" or parallelism.ep" if spec.model.architecture.moe is not None else "")
            + " (`exaserve fit` lists the sizes SGLang accepts).",
            "parallelism.tp",
        )


@rule("network.tp-across-nodes")
def _tp_fabric(fleet: Fleet) -> Iterator[CheckResult]:
    """Tensor parallelism across nodes needs at least 100 Gb/s (source §3.3)."""
    rate = fleet.spec.cluster.fabric.link_rate_gbps
    if fleet.plan.placement.tp_crosses_nodes and rate < MIN_TP_FABRIC_GBPS:
        yield CheckResult(
            "network.tp-across-nodes",
            Status.FAIL,
            f"Got {rate}: TP {fleet.spec.parallelism.tp} crosses nodes of {fleet.plan.placement.gpus_per_node} GPUs and moves "
            f"{fleet.plan.network.fabric_bytes_per_forward.formula}; below {MIN_TP_FABRIC_GBPS} Gb/s that takes "
            f"{fleet.plan.network.fabric_time_per_forward_s.formula}",
            f"at least {MIN_TP_FABRIC_GBPS} Gb/s when TP crosses nodes",
            f"Keep tp ≤ {fleet.plan.placement.gpus_per_node} or use ≥ {MIN_TP_FABRIC_GBPS} Gb/s RDMA.",
            "cluster.fabric.link_rate_gbps",
        )
    if fleet.plan.placement.tp_crosses_nodes and fleet.spec.cluster.fabric.kind is FabricKind.ETHERNET:
        yield CheckResult(
            "network.tp-across-nodes",
            Status.FAIL,
            f"Got {fleet.spec.cluster.fabric.kind.value}: all-reduce over TCP adds far more than the tens of µs the source "
            "allows per collective",
            "InfiniBand or RoCE when TP crosses nodes",
            "Use InfiniBand/RoCE or keep TP inside a node.",
            "cluster.fabric.kind",
        )


@rule("network.utilisation")
def _utilisation(fleet: Fleet) -> Iterator[CheckResult]:
    """Warn where the link rate predicts a low GPU utilisation (source's link-rate table)."""
    _, hi, _ = fleet.plan.network.utilisation_band
    if hi <= 0.25 and fleet.plan.network.fabric_bytes_per_forward.value > 0:
        yield CheckResult(
            "network.utilisation",
            Status.WARN,
            f"{fleet.plan.network.utilisation_formula}; replicas that span nodes will idle their GPUs",
            "a link rate that keeps GPU utilisation above 25 %",
            f"Use ≥ {MIN_TP_FABRIC_GBPS} Gb/s.",
            "cluster.fabric.link_rate_gbps",
        )


@rule("heartbeat.central-jitter")
def _jitter(fleet: Fleet) -> Iterator[CheckResult]:
    """A central scheduler taking direct heartbeats jittered above ≈ 1,500 replicas (source §3.4)."""
    hb = fleet.plan.heartbeats
    if hb.active_per_s.value > hb.central_limit_per_s.value:
        yield CheckResult(
            "heartbeat.central-jitter",
            Status.FAIL,
            f"Got {fleet.spec.serving.heartbeat_mode!r}: the scheduler would take {hb.active_per_s.formula}, above the "
            f"jitter limit {hb.central_limit_per_s.formula}",
            f"at most {hb.central_limit_per_s.value:,.1f} heartbeats/s at the central scheduler",
            f"Use 'aggregated' (node agents: {hb.aggregated_per_s.formula}).",
            "serving.heartbeat_mode",
        )


@rule("health.check-timeout")
def _timeout(fleet: Fleet) -> Iterator[CheckResult]:
    """A 1 s health-check timeout restarted replicas every 10 minutes; 3 s fixed it (source §3.4)."""
    t = fleet.spec.serving.health_check_timeout_s
    if t < MIN_HEALTH_TIMEOUT_S:
        yield CheckResult(
            "health.check-timeout",
            Status.FAIL,
            f"Got {t:g}: below {MIN_HEALTH_TIMEOUT_S:g} s a loaded replica's /health misses the deadline and is "
            "restarted (the source's 1 s timeout caused a restart every 10 minutes)",
            f"at least {MIN_HEALTH_TIMEOUT_S:g} s",
            f"Use at least {MIN_HEALTH_TIMEOUT_S:g}.",
            "serving.health_check_timeout_s",
        )
    if t >= fleet.spec.serving.heartbeat_interval_s:
        yield CheckResult(
            "health.check-timeout",
            Status.FAIL,
            f"Got {t:g}: a probe must end before the next one starts every {fleet.spec.serving.heartbeat_interval_s:g} s",
            f"less than serving.heartbeat_interval_s, {fleet.spec.serving.heartbeat_interval_s:g} s",
            "Lower the timeout or lengthen heartbeat_interval_s.",
            "serving.health_check_timeout_s",
        )


@rule("health.recovery-target")
def _recovery(fleet: Fleet) -> Iterator[CheckResult]:
    """Detection + migration must finish within the recovery target."""
    hb = fleet.plan.heartbeats
    target = fleet.spec.serving.recovery_target_s
    if hb.recovery_s.value > target:
        yield CheckResult(
            "health.recovery-target",
            Status.FAIL,
            f"Recovery takes {hb.recovery_s.formula} ({hb.failure_detection_s.formula}), above the {target:g} s target",
            f"detection + migration within {target:g} s",
            "Shorten heartbeat_interval_s or failure_threshold, or migration_timeout_s.",
            "serving.recovery_target_s",
        )


@rule("health.router-check-capacity")
def _router_checks(fleet: Fleet) -> Iterator[CheckResult]:
    """smg checks at most 128 workers at once per router, and a hung worker holds a check for the whole timeout: past
    that many hung workers the same workers are checked every round and the rest never (serving.plan.planner,
    ROUTER_PROBES_IN_FLIGHT). The fleet's failure reserve is how many it plans to lose at once."""
    hb, replicas = fleet.plan.heartbeats, fleet.plan.placement.replicas
    reserve = math.ceil(fleet.spec.limits.failure_reserve * replicas)
    if hb.router_hung_capacity.value < reserve:
        s = fleet.spec.serving
        interval = math.ceil(reserve * min(s.heartbeat_interval_s, s.health_check_timeout_s) / ROUTER_PROBES_IN_FLIGHT)
        yield CheckResult(
            "health.router-check-capacity",
            Status.WARN,
            f"Each router holds {hb.router_hung_capacity.formula}, fewer than the failure reserve "
            f"({fleet.spec.limits.failure_reserve:.0%} of {replicas:,} = {reserve:,}): with that many hung at once, "
            "part of the fleet goes unchecked by the routers (the controllers' agents still probe every replica)",
            f"at least {reserve:,} hung workers within one health-check interval",
            f"Lengthen serving.heartbeat_interval_s to at least {interval} s, shorten serving.health_check_timeout_s, "
            "or split the fleet over more router deployments.",
            "serving.heartbeat_interval_s",
        )


@rule("storage.restart-time")
def _restart(fleet: Fleet) -> Iterator[CheckResult]:
    """A restarted replica must reload from the local cache within 30 s (source §7)."""
    r = fleet.plan.restart_from_cache_s
    if r.value > MAX_RESTART_S:
        yield CheckResult(
            "storage.restart-time",
            Status.FAIL,
            f"Reloading takes {r.formula}, above {MAX_RESTART_S:g} s",
            f"a reload from the local cache within {MAX_RESTART_S:g} s",
            "Use faster local NVMe or spread weights over more GPUs.",
            "storage.local_cache.load_bandwidth_gbps",
        )


@rule("rollout.batches-cover")
def _batches(fleet: Fleet) -> Iterator[CheckResult]:
    """Rollout batches must cover every replica exactly once, none empty."""
    replicas = len(fleet.plan.replicas)
    groups = fleet.plan.rollout_groups
    covered = sorted(i for g in groups for i in g)
    if covered != list(range(replicas)) or any(not g for g in groups):
        yield CheckResult(
            "rollout.batches-cover",
            Status.FAIL,
            f"Got {fleet.spec.rollout.batches}: {replicas} replicas cannot fill {fleet.spec.rollout.batches} non-empty batches "
            f"(sizes {[len(g) for g in groups]})",
            "batches that cover every replica exactly once, none empty",
            f"Use at most {replicas} batches.",
            "rollout.batches",
        )


@rule("rollout.gate-window")
def _gate_window(fleet: Fleet) -> Iterator[CheckResult]:
    """A batch must soak at least as long as the warm-up, or the gates judge a half-warm batch."""
    r, s = fleet.spec.rollout, fleet.spec.serving
    if r.interval_s < s.warmup_duration_s:
        yield CheckResult(
            "rollout.gate-window",
            Status.FAIL,
            f"Got {r.interval_s:g}: shorter than serving.warmup_duration_s {s.warmup_duration_s:g}; the next batch "
            "would start before the last one takes full traffic",
            f"at least the warm-up, {s.warmup_duration_s:g} s",
            "Use at least the warm-up duration.",
            "rollout.interval_s",
        )


@rule("rollout.dry-run-gates")
def _dry_run_gates(fleet: Fleet) -> Iterator[CheckResult]:
    """Gates in dry run judge nothing: only a sandbox, whose throughput and latency are its machine's, may do that;
    a fleet that serves clients enforces every gate."""
    dry = fleet.spec.rollout.dry_run_gates
    if dry and fleet.spec.sandbox is None:
        yield CheckResult(
            "rollout.dry-run-gates",
            Status.FAIL,
            f"Got {list(dry)}: the {' and '.join(dry)} gate(s) would be measured but never pause or roll back a "
            "rollout of a fleet that serves clients",
            "every gate enforced outside a sandbox (a stack with a sandbox: section)",
            "Remove rollout.dry_run_gates.",
            "rollout.dry_run_gates",
        )


@rule("scheduler.ha")
def _ha(fleet: Fleet) -> Iterator[CheckResult]:
    """At least 3 scheduler instances with leader election (source §4.3); one alone is a single point of failure."""
    n = fleet.spec.scheduler.instances
    if n < MIN_HA_INSTANCES and fleet.plan.placement.nodes > 1:
        yield CheckResult(
            "scheduler.ha",
            Status.FAIL if n == 1 else Status.WARN,
            f"Got {n}: a quorum that survives one failure needs {MIN_HA_INSTANCES} instances",
            f"at least {MIN_HA_INSTANCES} instances with leader election",
            f"Use {MIN_HA_INSTANCES}.",
            "scheduler.instances",
        )


@rule("cluster.system-pool")
def _system_pool(fleet: Fleet) -> Iterator[CheckResult]:
    """The routers and controllers need untainted non-GPU nodes: a declared pool large enough for their requests."""
    spec, pool = fleet.spec, fleet.spec.cluster.system_pool
    pods = system.system_pods(spec)
    wants = ", ".join(
        f"{k.replicas} × {k.name} ({k.requests.quantities()['cpu']} CPU, {k.requests.quantities()['memory']}"
        + (", one per node)" if k.one_per_node else ")")
        for k in pods
    )
    if pool is None:
        yield CheckResult(
            "cluster.system-pool",
            Status.WARN,
            f"No system pool: {wants} tolerate no taint, and every GPU node carries {TAINT_KEY}:{TAINT_EFFECT}, so on "
            "Kubernetes they have nowhere to run",
            "cluster.system_pool declared (guard system-pool-placement refuses the render without it)",
            "Declare cluster.system_pool: count, name_pattern, subnet, first_address, cpu and memory_gb per node.",
            "cluster.system_pool",
        )
        return
    need = system.min_nodes(spec, pool)
    if need is None:
        yield CheckResult(
            "cluster.system-pool",
            Status.FAIL,
            f"Got cpu={pool.cpu:g}, memory_gb={pool.memory_gb:g} per node: one of {wants} does not fit on a node",
            "every system pod fits on one node",
            "Raise cluster.system_pool.cpu / memory_gb to what the nodes have allocatable (less the cluster's "
            "DaemonSets), or use larger nodes.",
            "cluster.system_pool",
        )
    elif pool.count < need:
        yield CheckResult(
            "cluster.system-pool",
            Status.FAIL,
            f"Got count={pool.count}: {wants} need {need} nodes of {pool.cpu:g} CPU and {pool.memory_gb:g} GB",
            f"at least {need} nodes",
            f"Set cluster.system_pool.count to {need} (or lower scheduler.instances, or raise the per-node cpu / "
            "memory_gb if the nodes have more).",
            "cluster.system_pool.count",
        )


@rule("scheduler.period")
def _period(fleet: Fleet) -> Iterator[CheckResult]:
    """A 10 ms scheduling period saturated the CPU; 100 ms balanced as well (source §4.3)."""
    ms = fleet.spec.scheduler.period_ms
    if ms < MIN_SCHEDULER_PERIOD_MS:
        yield CheckResult(
            "scheduler.period",
            Status.WARN,
            f"Got {ms}: {MIN_SCHEDULER_PERIOD_MS / ms:.0f}× the scheduling work of {MIN_SCHEDULER_PERIOD_MS} ms for "
            "no better balance",
            f"{MIN_SCHEDULER_PERIOD_MS} ms",
            f"Use {MIN_SCHEDULER_PERIOD_MS}.",
            "scheduler.period_ms",
        )


@rule("ops.log-level")
def _log_level(fleet: Fleet) -> Iterator[CheckResult]:
    """DEBUG only while debugging: thousands of replicas log tens of MB/s (source §5)."""
    if fleet.spec.serving.log_level in (LogLevel.DEBUG, LogLevel.INFO) and fleet.plan.placement.replicas > 100:
        yield CheckResult(
            "ops.log-level",
            Status.WARN,
            f"Got {fleet.spec.serving.log_level.value!r} on {fleet.plan.placement.replicas:,} replicas",
            "'warning' or quieter above 100 replicas (thousands of replicas log tens of MB/s)",
            "Use 'warning' outside debugging.",
            "serving.log_level",
        )


@rule("health.score-consistency")
def _score(fleet: Fleet) -> Iterator[CheckResult]:
    """The health score must stop routing no later than the failure threshold marks a node unhealthy."""
    hb = fleet.plan.heartbeats
    if hb.timeouts_to_stop_routing.value > fleet.spec.serving.failure_threshold:
        raise_to = (
            math.ceil(
                (fleet.spec.health.start - fleet.spec.health.stop_routing_below) / fleet.spec.serving.failure_threshold
            )
            + 1
        )
        yield CheckResult(
            "health.score-consistency",
            Status.WARN,
            f"The score stops routing after {hb.timeouts_to_stop_routing.formula}, but "
            f"{fleet.spec.serving.failure_threshold} misses already mark the replica unhealthy: the score only matters "
            "for flapping nodes",
            f"routing stopped within serving.failure_threshold = {fleet.spec.serving.failure_threshold} timeouts",
            f"Intended, or raise timeout_penalty to {raise_to}.",
            "health.timeout_penalty",
        )


def check(fleet: Fleet) -> list[CheckResult]:
    """Every rule's problems (``fail`` and ``warn`` results), in rule order; [] for a clean plan."""
    return [r for fn in RULES.values() for r in fn(fleet)]
