"""The capacity planner: pure functions from the fleet spec to figures, each with its formula.

Every number the plan shows is computed here from the spec; the source plan's own figures are
only used in tests and in :mod:`serving.plan.audit`, which compares them with these functions.
Units: bytes, seconds and messages per second internally; GB means 10^9 bytes, GiB 2^30.
"""

from __future__ import annotations

import math
from typing import Final

from serving.plan import calibration
from serving.plan.memory import (
    DRAFT_KV,
    RUNNING_PER_WORKER,
    kv_token_bytes_per_gpu,
    replica_pool,
    running_requests_per_replica,
    sglang_mem_fraction_static,
)
from serving.plan.model import (
    HOURS_PER_MONTH,
    LOOPBACK,
    CapacityChain,
    CostPlan,
    Endpoint,
    Figure,
    HeartbeatPlan,
    MemoryModel,
    MemoryPlan,
    NetworkPlan,
    Placement,
    Plan,
    Replica,
    fmt_bytes,
    fmt_gib,
    utilisation_band,
)
from serving.plan.weights import DEFAULT_GROUP_SIZE, draft_share
from serving.spec.schema import GB, GIB, Architecture, FleetSpec, Node, Precision

# ------------------------------------------------------------------------------------------ memory


def weights_bytes(parameter_count: int, bytes_per_param: float) -> Figure:
    v = parameter_count * bytes_per_param
    return Figure(v, "B", f"{parameter_count:,} params × {bytes_per_param:g} B = {fmt_bytes(v)}")


def kv_bytes_per_token(arch: Architecture, bytes_per_element: int) -> Figure:
    """KV cache bytes one token occupies across the whole model.

    GQA/MHA: 2 (K and V) × layers × KV heads × head_dim × bytes — the heads that count are the KV
    heads, not the attention heads. MLA: layers × (kv_lora_rank + qk_rope_head_dim) × bytes (one
    compressed latent plus the decoupled RoPE key, no separate V).
    """
    if arch.mla is not None:
        width = arch.mla.kv_lora_rank + arch.mla.qk_rope_head_dim
        v = arch.num_layers * width * bytes_per_element
        return Figure(
            v,
            "B",
            f"MLA: {arch.num_layers} layers × ({arch.mla.kv_lora_rank} + {arch.mla.qk_rope_head_dim}) × {bytes_per_element} B = {v:,} B",
        )
    v = 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * bytes_per_element
    return Figure(
        v,
        "B",
        f"2 × {arch.num_layers} layers × {arch.num_kv_heads} KV heads × {arch.head_dim} × {bytes_per_element} B = {v:,} B",
    )


def kv_bytes_per_token_per_gpu(arch: Architecture, bytes_per_element: int, tp: int, pp: int) -> Figure:
    """KV bytes per token held by one GPU of a TP×PP replica.

    Layers split over PP stages (the fullest stage, ⌈layers / PP⌉); KV heads split over TP ranks but never
    below one head per rank (with TP > KV heads each head is replicated). MLA's latent is not split by TP.
    """
    layers = math.ceil(arch.num_layers / pp)
    v = kv_token_bytes_per_gpu(arch, bytes_per_element, tp, pp)
    if arch.mla is not None:
        width = arch.mla.kv_lora_rank + arch.mla.qk_rope_head_dim
        return Figure(
            v, "B", f"MLA latent replicated per TP rank: {layers} layers × {width} × {bytes_per_element} B = {v:,} B"
        )
    return Figure(
        v,
        "B",
        f"2 × ⌈{arch.num_layers}/{pp}⌉ layers × max(1, {arch.num_kv_heads} // {tp}) KV heads × {arch.head_dim} × "
        f"{bytes_per_element} B = {v:,} B",
    )


def replica_memory_budget(
    weights: float, kv_cache: float, activation_fraction: float, overhead: float, safety_margin: float
) -> dict[str, Figure]:
    """The source's budget shape (§4.2): weights + KV + activations + overhead, plus a margin on the sum."""
    act = weights * activation_fraction
    subtotal = weights + kv_cache + act + overhead
    margin = subtotal * safety_margin
    total = subtotal + margin
    return {
        "weights": Figure(weights, "B", f"{fmt_bytes(weights)}"),
        "kv_cache": Figure(kv_cache, "B", f"{fmt_bytes(kv_cache)}"),
        "activations": Figure(act, "B", f"{activation_fraction:.0%} × {fmt_bytes(weights)} = {fmt_bytes(act)}"),
        "framework_overhead": Figure(overhead, "B", f"{fmt_bytes(overhead)}"),
        "safety_margin": Figure(margin, "B", f"{safety_margin:.0%} × {fmt_bytes(subtotal)} = {fmt_bytes(margin)}"),
        "total": Figure(total, "B", f"{fmt_bytes(subtotal)} + {fmt_bytes(margin)} = {fmt_bytes(total)}"),
    }


def gpu_product(spec: FleetSpec) -> calibration.GpuProduct:
    """The cluster's GPU from the product table; an unknown product falls back on cluster.gpu.memory_gb."""
    gpu = spec.cluster.gpu
    try:
        return calibration.gpu_product(gpu.product)
    except calibration.UnknownGpuError:
        return calibration.GpuProduct(gpu.product, round(gpu.memory_gb * GB / calibration.MIB), "cluster.gpu.memory_gb")


def static_fraction(spec: FleetSpec) -> Figure:
    """``serving.mem_fraction_static`` when set, else SGLang's default for this GPU, TP, PP and limits."""
    par, lim, m = spec.parallelism, spec.limits, spec.model
    default = sglang_mem_fraction_static(
        gpu_product(spec).memory_total_mib,
        par.tp,
        par.pp,
        lim.chunked_prefill_size,
        lim.max_running_requests,
        m.architecture.mla is not None,
        par.attn_dp,
    )
    if spec.serving.mem_fraction_static is not None:
        v = spec.serving.mem_fraction_static
        return Figure(v, "", f"serving.mem_fraction_static = {v:.3f} (SGLang's default here: {default.value:.3f})")
    return Figure(
        default.value,
        "",
        "SGLang 0.5.23's default (arg_groups/memory_hook.py: handle_gpu_memory_settings; other versions compute "
        f"another, so the rendered command pins this one): {default.formula}",
    )


def memory_plan(spec: FleetSpec, model: MemoryModel = "sglang") -> MemoryPlan:
    """Per-GPU memory of one replica by SGLang's arithmetic (``model="source"``: the source's heuristic).

    The GPUs of the stage with the fewest pool tokens, whose count SGLang keeps for the replica: normally the
    last stage, which gets the extra layers and holds the LM head (:func:`serving.plan.memory.replica_pool`)."""
    if model == "source":
        return source_memory_plan(spec)
    m, par, ctx = spec.model, spec.parallelism, spec.limits.context_length
    gpu = gpu_product(spec)
    total = gpu.memory_total_mib * calibration.MIB
    free = calibration.free_at_start_bytes(gpu, par.tp, par.pp)
    mfs = static_fraction(spec)
    group = (m.architecture.quant_group_size or DEFAULT_GROUP_SIZE) if m.precision == Precision.INT4 else None
    draft = (
        draft_share(m.architecture, m.speculative, m.bytes_per_param, par.tp, par.attn_dp)
        if m.speculative is not None
        else None
    )
    rp = replica_pool(
        m.architecture,
        m.bytes_per_param,
        m.kv_bytes_per_element,
        par.tp,
        par.pp,
        free,
        mfs.value,
        group,
        m.checkpoint_weights,
        par.attn_dp,
        draft,
        online_fp8=m.online_fp8,
    )
    share, pool = rp.weights, rp.pool
    ckpt = m.checkpoint_weights
    weights = (
        Figure(ckpt.total_size, "B", f"{ckpt.source}: metadata.total_size = {fmt_bytes(ckpt.total_size)}")
        if ckpt is not None
        else weights_bytes(m.architecture.parameter_count, m.bytes_per_param)
    )
    if m.online_fp8 and ckpt is None:
        weights = Figure(
            weights.value,
            "B",
            f"{weights.formula} once quantised (online FP8: the 16-bit checkpoint loads at 2 B a parameter)",
        )
    kv_tok = kv_bytes_per_token(m.architecture, m.kv_bytes_per_element)
    kv_tok_gpu = kv_bytes_per_token_per_gpu(m.architecture, m.kv_bytes_per_element, par.attn_tp, par.pp)
    if draft is not None:  # the spec plans a draft at PP 1 only: one stage, one cell
        kv_tok_gpu = Figure(
            rp.cell_bytes,
            "B",
            f"{kv_tok_gpu.formula} + the draft's {draft.kv_layers} layer(s): int(that × {draft.kv_layers} / "
            f"{m.architecture.num_layers}) ({DRAFT_KV.where}) = {rp.cell_bytes:,} B",
        )
    budget = max(0.0, pool.budget)
    slack = free * (1 - mfs.value)
    # Each attention-DP group has its own scheduler and pool (and --max-running-requests / attn_dp of the requests,
    # mem_cache/kv_cache_configurator.py: resolve_max_num_reqs), as each --dp-size replica does.
    workers = par.dp * par.attn_dp
    seqs = pool.tokens // ctx * workers
    per_gpu = {
        "weights": Figure(share.layer_bytes + share.embedding_bytes, "B", share.formula),
        "load_overhead": Figure(
            share.load_overhead_bytes, "B", f"{calibration.LOAD_OVERHEAD_GIB:.2f} GiB (mean of the calibration logs)"
        ),
        **({"draft_weights": Figure(draft.weights, "B", draft.formula)} if draft is not None else {}),
        "kv_cache": Figure(budget, "B", rp.formula),
        "activations_and_graphs": Figure(
            slack, "B", f"{free / GIB:,.2f} GiB free at start × (1 − {mfs.value:.3f}) = {slack / GIB:,.2f} GiB"
        ),
        "cuda_context": Figure(
            total - free,
            "B",
            f"{gpu.memory_total_mib:,} MiB − {free / GIB:,.2f} GiB free at start ("
            + (
                "logged for this product"
                if gpu.label in calibration.OBSERVED_FREE_AT_START_GIB
                else calibration.runtime_overhead_for(gpu, par.tp, par.pp)[1]
            )
            + ")",
        ),
        "total": Figure(total, "B", f"{gpu.label}: {gpu.memory_total_mib:,} MiB ({gpu.source})"),
    }
    gpr = par.gpus_per_replica
    static = free * mfs.value
    return MemoryPlan(
        model="sglang",
        weights=weights,
        per_gpu=per_gpu,
        usable_per_gpu=Figure(
            static,
            "B",
            f"{free / GIB:,.2f} GiB free at start × mem_fraction_static {mfs.value:.3f} = {static / GIB:,.2f} GiB",
        ),
        per_replica_total=Figure(total * gpr, "B", f"{fmt_gib(total)} × {gpr} GPUs = {fmt_gib(total * gpr)}"),
        usable_per_node=Figure(
            static * spec.cluster.gpu.count_per_node,
            "B",
            f"{fmt_gib(static)} × {spec.cluster.gpu.count_per_node} GPUs",
        ),
        kv_per_token=kv_tok,
        kv_per_token_per_gpu=kv_tok_gpu,
        kv_pool_per_gpu=Figure(budget, "B", pool.formula),
        max_concurrent_sequences=Figure(
            seqs,
            "seqs",
            f"⌊{pool.tokens:,} pool tokens / {ctx:,} context⌋ × DP {par.dp}"
            + (f" × attention DP {par.attn_dp} (a pool each)" if par.attn_dp > 1 else "")
            + f" = {seqs}",
        ),
        mem_fraction_static=mfs,
        max_total_tokens=Figure(
            pool.tokens,
            "tokens",
            pool.formula + (f" (each of the {par.attn_dp} attention-DP groups' own pool)" if par.attn_dp > 1 else ""),
        ),
        free_at_start=Figure(
            free, "B", f"{gpu.memory_total_mib:,} MiB − {fmt_gib(total - free)} CUDA context and NCCL"
        ),
        load_peak_per_gpu=(
            Figure(fullest.load_peak_bytes or 0.0, "B", fullest.load_formula)
            if (fullest := rp.fullest_at_load) is not None
            else None
        ),
    )


def source_memory_plan(spec: FleetSpec) -> MemoryPlan:
    """The source plan's heuristic (§4.2): activations 15 % of weights, 5 GB overhead, 15 % margin on all."""
    m, par, gpu = spec.model, spec.parallelism, spec.cluster.gpu
    shard = par.tp * par.pp
    weights = weights_bytes(m.architecture.parameter_count, m.bytes_per_param)
    kv_tok = kv_bytes_per_token(m.architecture, m.kv_bytes_per_element)
    kv_tok_gpu = kv_bytes_per_token_per_gpu(m.architecture, m.kv_bytes_per_element, par.tp, par.pp)
    seqs_per_rank = math.ceil(spec.limits.max_running_requests / par.dp)
    ctx = spec.limits.context_length
    kv_gpu = kv_tok_gpu.value * ctx * seqs_per_rank
    w_gpu = weights.value / shard
    overhead = m.framework_overhead_gb * GB
    per_gpu = replica_memory_budget(w_gpu, kv_gpu, m.activation_fraction, overhead, m.safety_margin)
    per_gpu["weights"] = Figure(
        w_gpu, "B", f"{fmt_bytes(weights.value)} / (TP {par.tp} × PP {par.pp}) = {fmt_bytes(w_gpu)}"
    )
    per_gpu["kv_cache"] = Figure(
        kv_gpu, "B", f"{kv_tok_gpu.value:,.0f} B/token × {ctx:,} tokens × {seqs_per_rank} seqs = {fmt_bytes(kv_gpu)}"
    )
    usable = gpu.memory_gb * GB * gpu.usable_memory_fraction
    usable_f = Figure(usable, "B", f"{gpu.memory_gb:g} GB × {gpu.usable_memory_fraction:.0%} = {fmt_bytes(usable)}")
    gpr = par.gpus_per_replica
    rep_total = per_gpu["total"].value * gpr
    # The KV pool the usable memory admits once weights, activations and overhead (with margin) are in.
    fixed = per_gpu["weights"].value + per_gpu["activations"].value + overhead
    pool = max(0.0, usable / (1 + m.safety_margin) - fixed)
    seq_bytes = kv_tok_gpu.value * ctx
    seqs = math.floor(pool / seq_bytes) * par.dp if seq_bytes else 0
    static = (per_gpu["weights"].value + pool) / (gpu.memory_gb * GB)
    tokens = math.floor(pool / kv_tok_gpu.value) if kv_tok_gpu.value else 0
    return MemoryPlan(
        model="source",
        weights=weights,
        per_gpu=per_gpu,
        usable_per_gpu=usable_f,
        per_replica_total=Figure(
            rep_total, "B", f"{fmt_bytes(per_gpu['total'].value)} × {gpr} GPUs = {fmt_bytes(rep_total)}"
        ),
        usable_per_node=Figure(
            usable * gpu.count_per_node,
            "B",
            f"{fmt_bytes(usable)} × {gpu.count_per_node} GPUs = {fmt_bytes(usable * gpu.count_per_node)}",
        ),
        kv_per_token=kv_tok,
        kv_per_token_per_gpu=kv_tok_gpu,
        kv_pool_per_gpu=Figure(
            pool,
            "B",
            f"{fmt_bytes(usable)} / (1 + {m.safety_margin:.0%}) − {fmt_bytes(fixed)} (weights+activations+overhead) = {fmt_bytes(pool)}",
        ),
        max_concurrent_sequences=Figure(
            seqs, "seqs", f"⌊{fmt_bytes(pool)} / ({kv_tok_gpu.value:,.0f} B × {ctx:,} tokens)⌋ × DP {par.dp} = {seqs}"
        ),
        mem_fraction_static=Figure(
            static,
            "",
            f"({fmt_bytes(per_gpu['weights'].value)} + {fmt_bytes(pool)}) / {gpu.memory_gb:g} GB = {static:.3f}",
        ),
        max_total_tokens=Figure(tokens, "tokens", f"⌊{fmt_bytes(pool)} / {kv_tok_gpu.value:,.0f} B⌋ = {tokens:,}"),
    )


# ------------------------------------------------------------------------------------------ placement


def placement(spec: FleetSpec) -> Placement:
    gpn = spec.cluster.gpu.count_per_node
    par = spec.parallelism
    gpr = par.gpus_per_replica
    nodes = spec.cluster.node_count
    if gpr <= gpn:
        max_per_node = gpn // gpr
        nodes_per_replica = 1
        max_replicas = nodes * max_per_node
        rpn = spec.serving.replicas_per_node or max_per_node
        nodes_used = math.ceil(spec.serving.replicas / rpn)
        formula = f"⌊{gpn} GPUs/node / {gpr} GPUs/replica⌋ = {max_per_node}/node × {nodes} nodes = {max_replicas:,}"
    else:
        max_per_node = 0
        nodes_per_replica = math.ceil(gpr / gpn)
        max_replicas = nodes // nodes_per_replica
        nodes_used = spec.serving.replicas * nodes_per_replica
        formula = f"{gpr} GPUs/replica spans ⌈{gpr}/{gpn}⌉ = {nodes_per_replica} nodes; {nodes} // {nodes_per_replica} = {max_replicas:,}"
    return Placement(
        gpus_per_node=gpn,
        gpus_per_replica=gpr,
        max_replicas_per_node=max_per_node,
        nodes_per_replica=nodes_per_replica,
        replicas_per_node=spec.serving.replicas_per_node,
        tp_crosses_nodes=par.tp > gpn,
        pp_crosses_nodes=par.tp <= gpn < par.tp * par.pp,
        nodes=nodes,
        max_replicas=max_replicas,
        replicas=spec.serving.replicas,
        nodes_used=nodes_used,
        formula=formula,
    )


def rollout_groups(replicas: int, batches: int) -> list[list[int]]:
    """Assign replica indices to exactly ``batches`` groups, each replica once.

    Round-robin over the placement order: placement fills node after node and rack after rack, so
    striding spreads every group over all racks and takes at most ⌈per-node/batches⌉ replicas of a
    node at a time. Sizes differ by at most one.
    """
    groups: list[list[int]] = [[] for _ in range(batches)]
    for i in range(replicas):
        groups[i % batches].append(i)
    return groups


def replica_endpoint(spec: FleetSpec, node: Node, port: int, index: int) -> Endpoint:
    """Where replica ``index`` answers: ``node``'s address and ``port``; in a sandbox stack its simulated worker on
    loopback, ``sandbox.worker_base_port`` + index (as ``sandbox up`` starts it)."""
    if spec.sandbox is not None:
        return Endpoint(LOOPBACK, spec.sandbox.worker_base_port + index)
    return Endpoint(str(node.address), port)


def fleet_replicas(spec: FleetSpec) -> list[Replica]:
    """The replica inventory in placement order (node by node), at most what the nodes hold."""
    p = placement(spec)
    nodes = spec.cluster.nodes
    gpr = p.gpus_per_replica
    batches = spec.rollout.batches
    out: list[Replica] = []
    count = min(spec.serving.replicas, p.max_replicas)
    if p.nodes_per_replica == 1:
        per_node = min(p.replicas_per_node or p.max_replicas_per_node, p.max_replicas_per_node)
        for i in range(count):
            node_i, slot = divmod(i, per_node)
            if node_i >= len(nodes):
                break
            node = nodes[node_i]
            out.append(
                Replica(
                    id=f"{node.name}-s{slot}",
                    index=i,
                    nodes=(node,),
                    gpu_ids=tuple(range(slot * gpr, (slot + 1) * gpr)),
                    group=i % batches,
                    port=spec.serving.port + slot,
                    endpoint=replica_endpoint(spec, node, spec.serving.port + slot, i),
                )
            )
    else:
        k = p.nodes_per_replica
        for i in range(count):
            span = tuple(nodes[i * k : (i + 1) * k])
            out.append(
                Replica(
                    id=f"{span[0].name}-x{k}",
                    index=i,
                    nodes=span,
                    gpu_ids=tuple(range(p.gpus_per_node)),
                    group=i % batches,
                    port=spec.serving.port,
                    endpoint=replica_endpoint(spec, span[0], spec.serving.port, i),
                )
            )
    return out


# ------------------------------------------------------------------------------------------ capacity


def capacity_chain(
    per_replica: int,
    replicas: int,
    balance_efficiency: float,
    failure_reserve: float,
    burst_buffer: float,
    mean_request_s: float,
    why: str = "",
) -> CapacityChain:
    """The source's chain (§3.2): concurrency × replicas × balance − reserve − burst; RPS by Little's law."""
    raw = per_replica * replicas
    bal = raw * balance_efficiency
    res = bal * (1 - failure_reserve)
    sus = res * (1 - burst_buffer)
    rps = sus / mean_request_s
    return CapacityChain(
        per_replica_concurrency=Figure(per_replica, "reqs", why or f"{per_replica}"),
        raw=Figure(raw, "reqs", f"{per_replica} × {replicas:,} replicas = {raw:,}"),
        balanced=Figure(bal, "reqs", f"{raw:,} × {balance_efficiency:.0%} balance efficiency = {bal:,.0f}"),
        after_reserve=Figure(
            res, "reqs", f"{bal:,.0f} × (1 − {failure_reserve:.0%} failure/rollout reserve) = {res:,.0f}"
        ),
        sustained=Figure(sus, "reqs", f"{res:,.0f} × (1 − {burst_buffer:.0%} burst buffer) = {sus:,.0f}"),
        requests_per_second=Figure(
            rps, "req/s", f"{sus:,.0f} in flight / {mean_request_s:g} s per request = {rps:,.0f} req/s (Little's law)"
        ),
    )


# ------------------------------------------------------------------------------------------ health

# smg keeps at most this many health checks in flight per router (``MAX_CONCURRENT_HEALTH_PROBES``,
# ``model_gateway/src/worker/manager.rs:44``); ``queue_due_probes`` (same file, :428-448) takes the due workers in its
# HashMap's order, ``take(capacity)``, and a worker's next deadline is its launch + the interval: past the cap, the
# same workers win every round and the rest are not checked at all.
ROUTER_PROBES_IN_FLIGHT: Final = 128


def request_timeout(spec: FleetSpec) -> Figure:
    """The routers' ``--request-timeout-secs``. smg 1.13 gives it to its upstream HTTP client as reqwest's total
    ``timeout`` (``model_gateway/src/worker/http_client.rs``, ``build``), which covers a streamed body too: a stream
    older than it is cut (its 200 already sent, so an in-band ``stream_error``, never retried; a request not yet
    answered gets a 504, retried on another worker). So it is the longest generation the spec allows — every one of
    ``limits.context_length`` tokens decoded at ``limits.min_decode_tokens_per_s`` — plus the P99 target for the rest
    (queueing, prefill), rounded up to whole seconds. What it costs (docs/units.md): a request on a replica that hangs
    is held until the replica's restart resets its connection (a stream then ends in an error, an unanswered request
    is retried) or, where no reset comes (a dead node, a partition), until this timeout; smg cancels nothing in flight
    when a worker turns unhealthy."""
    lim = spec.limits
    decode = lim.context_length / lim.min_decode_tokens_per_s
    total = math.ceil(decode + lim.p99_target_s)
    return Figure(
        total,
        "s",
        f"⌈{lim.context_length:,} tokens (limits.context_length) ÷ {lim.min_decode_tokens_per_s:g} tokens/s "
        f"(limits.min_decode_tokens_per_s) + {lim.p99_target_s:g} s (limits.p99_target_s)⌉ = {total:,} s",
    )


def heartbeat_plan(spec: FleetSpec, replicas: int, nodes: int) -> HeartbeatPlan:
    s, h = spec.serving, spec.health
    iv = s.heartbeat_interval_s
    limit = spec.scheduler.max_direct_heartbeat_replicas / iv
    active = replicas / iv if s.heartbeat_mode == "direct" else nodes / iv
    # The routers detect a dead replica, and their health checks take whole seconds (render.common.whole_seconds):
    # --health-check-interval-secs and --health-check-timeout-secs round up.
    router_iv = float(max(1, math.ceil(iv)))
    router_timeout = float(max(1, math.ceil(s.health_check_timeout_s)))
    detect = s.failure_threshold * router_iv + router_timeout
    rounded = (
        f" (the routers' checks take whole seconds: {iv:g} s → {router_iv:g} s, "
        f"{s.health_check_timeout_s:g} s → {router_timeout:g} s)"
        if (router_iv, router_timeout) != (iv, s.health_check_timeout_s)
        else ""
    )
    recover = detect + s.migration_timeout_s
    # A hung worker (connection accepted, no answer) holds a check slot for the whole timeout, once per interval (a
    # check still in flight is not launched again); a healthy one's cheap /health (the server renders
    # SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false, render.sglang) holds it for milliseconds, neglected here.
    hung = ROUTER_PROBES_IN_FLIGHT * router_iv / min(router_iv, router_timeout)
    to_stop = math.floor((h.start - h.stop_routing_below) / h.timeout_penalty) + 1
    to_migrate = math.floor((h.start - h.migrate_below) / h.timeout_penalty) + 1
    readmit = math.ceil((h.stop_routing_below - (h.start - to_stop * h.timeout_penalty)) / h.success_reward)
    return HeartbeatPlan(
        direct_per_interval=Figure(replicas, "msgs", f"{replicas:,} replicas × 1 per {iv:g} s interval"),
        aggregated_per_interval=Figure(nodes, "msgs", f"{nodes:,} node agents × 1 per {iv:g} s interval"),
        direct_per_s=Figure(replicas / iv, "msg/s", f"{replicas:,} / {iv:g} s = {replicas / iv:,.1f} msg/s"),
        aggregated_per_s=Figure(nodes / iv, "msg/s", f"{nodes:,} / {iv:g} s = {nodes / iv:,.1f} msg/s"),
        central_limit_per_s=Figure(
            limit,
            "msg/s",
            f"{spec.scheduler.max_direct_heartbeat_replicas:,} replicas (jitter onset) / {iv:g} s = {limit:,.1f} msg/s",
        ),
        active_per_s=Figure(active, "msg/s", f"{s.heartbeat_mode}: {active:,.1f} msg/s at the central scheduler"),
        failure_detection_s=Figure(
            detect,
            "s",
            f"{s.failure_threshold} misses × {router_iv:g} s + {router_timeout:g} s timeout of the last probe "
            f"= {detect:g} s{rounded}",
        ),
        recovery_s=Figure(
            recover, "s", f"{detect:g} s detection + {s.migration_timeout_s:g} s migration = {recover:g} s"
        ),
        timeouts_to_stop_routing=Figure(
            to_stop,
            "timeouts",
            f"⌊({h.start} − {h.stop_routing_below}) / {h.timeout_penalty}⌋ + 1 = {to_stop} ({to_stop * iv:g} s)",
        ),
        timeouts_to_migrate=Figure(
            to_migrate,
            "timeouts",
            f"⌊({h.start} − {h.migrate_below}) / {h.timeout_penalty}⌋ + 1 = {to_migrate} ({to_migrate * iv:g} s)",
        ),
        successes_to_readmit=Figure(
            readmit,
            "successes",
            f"from {h.start - to_stop * h.timeout_penalty} back to {h.stop_routing_below} at +{h.success_reward} = {readmit} ({readmit * iv:g} s)",
        ),
        router_hung_capacity=Figure(
            min(math.floor(hung), replicas),
            "workers",
            f"{ROUTER_PROBES_IN_FLIGHT} checks in flight (smg) × {router_iv:g} s interval / "
            f"{min(router_iv, router_timeout):g} s a hung worker holds one = {math.floor(hung):,} workers "
            + (f"({hung / replicas:.1%} of {replicas:,})" if hung < replicas else f"(all {replicas:,})"),
        ),
        request_timeout_s=request_timeout(spec),
        shed_load_ceiling=shed_load_ceiling(spec),
    )


def shed_load_ceiling(spec: FleetSpec) -> Figure:
    """The design's weighted load (``scheduler.weights``: 0.5 GPU, 0.3 memory, 0.2 network) as the deployed agents
    can measure it, and so the most it reaches. No render (Kubernetes DaemonSet, bare-metal unit) gives an agent
    ``--dcgm-url``, so GPU use is its running requests ÷ ``limits.max_running_requests``, memory SGLang's KV pool fill
    (``sglang:token_usage``), and network 0: that weight never counts. These figures decide only which replica the
    controller sheds (docs/runtime.md); the routers pick a worker by smg's own policy on their own in-flight counts."""
    w, sc = spec.scheduler.weights, spec.scheduler
    ceiling = w.get("gpu_utilization", 0.0) + w.get("memory_usage", 0.0)
    return Figure(
        ceiling,
        "load",
        f"{w.get('gpu_utilization', 0.0):g} × running ÷ {spec.limits.max_running_requests} (no DCGM exporter is "
        f"rendered) + {w.get('memory_usage', 0.0):g} × KV pool fill + {w.get('network_bandwidth', 0.0):g} × 0 (network: "
        f"unmeasured) ≤ {ceiling:g}; shed above {sc.migration_load_ratio:g} × the serving replicas' mean and at least "
        f"{sc.shed_min_load:g}; the routers pick workers by their own --policy on their own in-flight counts",
    )


# ------------------------------------------------------------------------------------------ network


def network_plan(spec: FleetSpec) -> NetworkPlan:
    a = spec.model.architecture
    tp, pp = spec.parallelism.tp, spec.parallelism.pp
    gpn = spec.cluster.gpu.count_per_node
    batch, seq = spec.limits.max_running_requests, spec.limits.context_length
    act_bytes = 2
    per_layer = a.hidden_size * batch * seq * act_bytes
    per_fwd = per_layer * a.num_layers
    # Megatron-style TP all-reduces twice per layer (after attention and after the MLP).
    tp_fwd = 2 * per_layer * a.num_layers if tp > 1 else 0
    ring = 2 * (tp - 1) / tp if tp > 1 else 0.0
    if tp > gpn:
        fabric = tp_fwd * ring
        how = f"TP {tp} crosses nodes: {fmt_bytes(tp_fwd)} × ring factor 2({tp}−1)/{tp} = {fmt_bytes(fabric)} per GPU"
    elif tp * pp > gpn:
        hops = pp - 1
        fabric = hops * a.hidden_size * batch * seq * act_bytes
        how = f"PP crosses nodes: {hops} stage hops × {a.hidden_size} × {batch} × {seq:,} × 2 B = {fmt_bytes(fabric)}"
    else:
        fabric = 0.0
        how = "replica fits in one node: TP/PP traffic stays on NVLink, the fabric carries none of it"
    rate = spec.cluster.fabric.link_rate_gbps
    secs = fabric * 8 / (rate * 1e9)
    lo, hi, note = utilisation_band(rate)
    return NetworkPlan(
        source_allreduce_per_layer=Figure(
            per_layer, "B", f"{a.hidden_size} hidden × {batch} batch × {seq:,} seq × 2 B = {per_layer / 2**20:,.0f} MiB"
        ),
        source_allreduce_per_forward=Figure(
            per_fwd,
            "B",
            f"{per_layer / 2**20:,.0f} MiB × {a.num_layers} layers = {per_fwd / 2**30:,.1f} GiB (source's figure, one all-reduce per layer)",
        ),
        tp_allreduce_per_forward=Figure(
            tp_fwd,
            "B",
            f"2 all-reduces/layer × {a.num_layers} layers × {per_layer / 2**20:,.0f} MiB = {tp_fwd / 2**30:,.1f} GiB"
            if tp > 1
            else "TP 1: no tensor-parallel all-reduce",
        ),
        fabric_bytes_per_forward=Figure(fabric, "B", how),
        fabric_time_per_forward_s=Figure(secs, "s", f"{fmt_bytes(fabric)} × 8 / {rate} Gb/s = {secs * 1e3:,.1f} ms"),
        utilisation_band=(lo, hi, note),
        utilisation_formula=f"{rate} Gb/s → {lo:.0%}–{hi:.0%} GPU utilisation ({note})",
    )


# ------------------------------------------------------------------------------------------ cost


def cost_plan(spec: FleetSpec) -> CostPlan:
    c = spec.cluster.cost
    n = spec.cluster.node_count
    kw = n * spec.cluster.gpu.power_kw_per_node

    def hw(price: float, share: float, tag: str) -> tuple[Figure, Figure, Figure]:
        nodes = n * price
        total = nodes / (1 - share)
        net = total - nodes
        return (
            Figure(nodes, c.currency, f"{n} nodes × {price:,.0f} = {nodes:,.0f}"),
            Figure(
                net,
                c.currency,
                f"network is {share:.0%} of total hardware: {nodes:,.0f} × {share:g}/(1 − {share:g}) = {net:,.0f}",
            ),
            Figure(total, c.currency, f"{nodes:,.0f} / (1 − {share:.0%}) = {total:,.0f} ({tag})"),
        )

    nl, netl, tl = hw(c.node_price_low, c.network_share_low, "low")
    nh, neth, th = hw(c.node_price_high, c.network_share_high, "high")
    kwh = kw * HOURS_PER_MONTH
    fails = n * c.annual_node_failure_rate / 12
    return CostPlan(
        currency=c.currency,
        nodes_low=nl,
        nodes_high=nh,
        network_low=netl,
        network_high=neth,
        hardware_low=tl,
        hardware_high=th,
        power_kw=Figure(kw, "kW", f"{n} nodes × {spec.cluster.gpu.power_kw_per_node:g} kW = {kw:,.0f} kW"),
        electricity_month_low=Figure(
            kwh * c.electricity_per_kwh_low,
            c.currency,
            f"{kw:,.0f} kW × {HOURS_PER_MONTH:g} h × {c.electricity_per_kwh_low:g}/kWh = {kwh * c.electricity_per_kwh_low:,.0f}",
        ),
        electricity_month_high=Figure(
            kwh * c.electricity_per_kwh_high,
            c.currency,
            f"{kw:,.0f} kW × {HOURS_PER_MONTH:g} h × {c.electricity_per_kwh_high:g}/kWh = {kwh * c.electricity_per_kwh_high:,.0f}",
        ),
        node_failures_per_month=Figure(
            fails, "nodes", f"{n} nodes × {c.annual_node_failure_rate:.0%}/year / 12 = {fails:.2f} a month"
        ),
    )


# ------------------------------------------------------------------------------------------ the plan


def restart_time(spec: FleetSpec) -> Figure:
    """Time to reload one GPU's weight shard from the node-local cache (source: restart ≤ 30 s)."""
    par = spec.parallelism
    shard = spec.model.architecture.parameter_count * spec.model.bytes_per_param / (par.tp * par.pp)
    per_node = shard * min(par.gpus_per_replica, spec.cluster.gpu.count_per_node)
    bw = spec.storage.local_cache.load_bandwidth_gbps * GB
    secs = per_node / bw
    return Figure(
        secs,
        "s",
        f"{fmt_bytes(per_node)} of weights on the node / {spec.storage.local_cache.load_bandwidth_gbps:g} GB/s local cache = {secs:.1f} s",
    )


def plan(spec: FleetSpec, memory_model: MemoryModel = "sglang") -> Plan:
    p = placement(spec)
    mem = memory_plan(spec, memory_model)
    deployable = min(spec.serving.replicas, p.max_replicas)
    lim = spec.limits
    attn_dp = spec.parallelism.attn_dp
    running = running_requests_per_replica(lim.max_running_requests, attn_dp)
    per_rep = min(lim.p99_concurrency_per_replica, running, int(mem.max_concurrent_sequences.value))
    runs = (
        f"max running {lim.max_running_requests}"
        if attn_dp == 1
        else f"max running {attn_dp} workers × max(1, {lim.max_running_requests} // {attn_dp}) = {running} "
        f"({RUNNING_PER_WORKER.where})"
    )
    why = (
        f"min(P99 concurrency {lim.p99_concurrency_per_replica}, {runs}, "
        f"KV admits {int(mem.max_concurrent_sequences.value)}) = {per_rep}"
    )
    chain = capacity_chain(
        per_rep, deployable, lim.balance_efficiency, lim.failure_reserve, lim.burst_buffer, lim.mean_request_s, why
    )
    nodes_used = min(p.nodes_used, p.nodes)
    replicas = fleet_replicas(spec)
    groups = rollout_groups(len(replicas), spec.rollout.batches)
    notes: list[str] = []
    if mem.model == "sglang" and spec.cluster.gpu.product not in calibration.GPU_PRODUCTS:
        notes.append(
            f"GPU product {spec.cluster.gpu.product!r} is not in the memory model's table: sized from "
            f"cluster.gpu.memory_gb = {spec.cluster.gpu.memory_gb:g} GB; use one of {', '.join(sorted(calibration.GPU_PRODUCTS))}"
        )
    target = spec.serving.target_replicas
    if target is not None and target != spec.serving.replicas:
        gpus = p.nodes * p.gpus_per_node
        notes.append(
            f"source target {target:,} replicas → this plan deploys {spec.serving.replicas:,} "
            f"({spec.serving.replicas / target:.1%}): {p.nodes} nodes × {p.gpus_per_node} GPUs = {gpus:,} GPUs "
            f"at {p.gpus_per_replica} GPU(s) per replica hold at most {p.max_replicas:,}; "
            f"{target:,} replicas would need {target * p.gpus_per_replica:,} GPUs"
        )
    heartbeats = heartbeat_plan(spec, deployable, nodes_used)
    longest = heartbeats.request_timeout_s.value
    if spec.rollout.drain_timeout_s < longest:
        notes.append(
            f"rollout.drain_timeout_s ({spec.rollout.drain_timeout_s:g} s) is shorter than the longest generation the "
            f"routers let run ({longest:,.0f} s, the request timeout): a rollout's drain cuts a generation older than "
            "the drain when it updates its replica; raise rollout.drain_timeout_s to keep every one"
        )
    return Plan(
        placement=p,
        memory=mem,
        capacity=chain,
        heartbeats=heartbeats,
        network=network_plan(spec),
        cost=cost_plan(spec),
        restart_from_cache_s=restart_time(spec),
        rollout_group_sizes=[len(g) for g in groups],
        replicas=tuple(replicas),
        rollout_groups=tuple(tuple(g) for g in groups),
        notes=notes,
    )
