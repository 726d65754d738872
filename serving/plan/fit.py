"""``exaserve fit``'s search: every precision × KV dtype × TP × PP × attention DP × EP that SGLang starts and whose KV
pool (:mod:`serving.plan.memory`) holds a full-length sequence, ranked by the output tokens a second the fleet makes
at the stack's load (:mod:`serving.plan.latency`).

Precisions are the checkpoint's (``bf16``, ``fp8``, ``int8``, ``int4``: the weights load as they stay) and
:data:`ONLINE_FP8`, a 16-bit checkpoint SGLang quantises to FP8 as it loads it: planned with its 16-bit load peak
checked against the GPU's free memory and the FP8 weights SGLang keeps after
(:func:`serving.plan.weights.online_fp8_stage_weights`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final

from serving.plan.calibration import PRECISION_BYTES, GpuProduct, GpuSpeed, free_at_start_bytes
from serving.plan.divisibility import SourceCheck, rejections
from serving.plan.latency import DEFAULT_ASSUMPTIONS, Assumptions, DecodeStep, decode_step
from serving.plan.memory import replica_pool, running_requests_per_replica, sglang_mem_fraction_static
from serving.plan.weights import DEFAULT_GROUP_SIZE, FP8_CHECKPOINT, WeightShare, stage_weights
from serving.spec.schema import GIB, Architecture, CheckpointWeights

ONLINE_FP8: Final = "fp8-online"
"""A 16-bit checkpoint served as FP8 (``--quantization fp8``; config.json without ``quantization_config``): SGLang
loads it in 16 bit and quantises it afterwards. ``fp8`` is an FP8 checkpoint (``quant_method`` fp8,
:data:`~serving.plan.weights.FP8_CHECKPOINT`), loaded as FP8."""
WEIGHT_BYTES: dict[str, float] = {**PRECISION_BYTES, ONLINE_FP8: 1.0}
"""Bytes a parameter of each precision ``fit`` searches, once loaded (online FP8: after quantisation)."""


@dataclass(frozen=True)
class Layout:
    """One way to serve a model on the cluster, and what SGLang would make of it."""

    precision: str
    kv_cache_dtype: str
    tp: int
    pp: int
    replicas: int
    replicas_per_node: int | None
    nodes_per_replica: int
    mem_fraction_static: float
    weights_per_gpu: float
    kv_pool_tokens: int
    sequences_per_replica: int
    served_sequences: int
    breakdown: str
    step: DecodeStep
    """One decode step of a replica at this load (:func:`serving.plan.latency.decode_step`)."""
    attn_dp: int = 1
    """Attention-DP groups inside the TP group (``--attn-dp-size``); each has its own pool of ``kv_pool_tokens``."""
    ep: int = 1
    """Expert parallelism (``--ep-size``): each GPU holds ``num_experts / ep`` experts, split over TP / EP."""
    rank_reason: str = ""
    """Why the layout ranks where it does: against the one above it."""
    load_peak_per_gpu: float | None = None
    """Online FP8: the fullest stage's GPU while SGLang loads the 16-bit checkpoint and quantises it; else None."""

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def tokens_per_s(self) -> float:
        """Output tokens a second the whole fleet makes at this load: replicas × sequences / step."""
        return self.replicas * self.step.tokens_per_s

    @property
    def online(self) -> bool:
        """SGLang quantises a 16-bit checkpoint to FP8 at load (:data:`ONLINE_FP8`)."""
        return self.precision == ONLINE_FP8


@dataclass(frozen=True)
class Excluded:
    """A precision × TP size SGLang refuses to start, and why (each reason with the source check it mirrors)."""

    precision: str
    tp: int
    reasons: tuple[str, ...]
    attn_dp: int = 1
    pp: int | None = None
    """The PP size refused with this TP, where the refusal depends on it (online FP8's load peak); None: every PP."""
    why: str = "SGLang refuses it"


@dataclass(frozen=True)
class FitResult:
    layouts: list[Layout]
    """Ranked: accuracy first (more weight bits, an FP8 checkpoint before online FP8, a 16-bit KV cache before FP8),
    then most output tokens a second at the load; at equal throughput fewer GPUs, fewer PP stages, no attention DP,
    no EP."""
    excluded: list[Excluded]


KV_DTYPES: dict[str, int] = {"auto": 2, "fp8_e4m3": 1}


def _powers_of_two(limit: int) -> list[int]:
    out, n = [], 1
    while n <= limit:
        out.append(n)
        n *= 2
    return out


def _attn_dp_sizes(arch: Architecture, tp: int) -> tuple[int, ...]:
    """The attention-DP sizes ``fit`` tries at ``tp``: none, and at TP > 1 full attention DP for a model whose
    attention SGLang splits over attention-TP (:attr:`Architecture.attention_over_attn_tp`)."""
    return (1, tp) if arch.attention_over_attn_tp and tp > 1 else (1,)


EXPERTS_PER_GPU = SourceCheck(
    "layers/moe/fused_moe_triton/layer.py", 415, "self._num_local_routed = self._num_global_routed // storage_ep_size"
)
"""Under EP a GPU holds ``experts / ep`` experts, each ``width / (tp / ep)`` wide: the bytes of TP alone."""


def _ep_sizes(arch: Architecture, tp: int) -> tuple[int, ...]:
    """The EP sizes ``fit`` tries at ``tp``, in order: none, and for a MoE model at TP > 1 full EP (``--ep-size`` =
    TP: each GPU holds whole experts, ``num_experts / tp`` of them, so no expert width is split over TP). A GPU holds
    the same expert bytes either way (``3 × experts × width × hidden / TP`` a layer, :data:`EXPERTS_PER_GPU`), and
    the default ``moe_a2a_backend`` none keeps every token on every rank with the same all-reduce; but under EP a step
    waits for the GPU whose whole experts were touched most (:func:`serving.plan.latency.ep_imbalance`), never
    faster than TP. So EP is listed only where it makes a layout start."""
    return (1, tp) if arch.moe is not None and tp > 1 else (1,)


def _rank_key(lay: Layout) -> tuple[float, bool, int, float, int, int, int, int]:
    return (
        -WEIGHT_BYTES[lay.precision],
        lay.online,
        -KV_DTYPES[lay.kv_cache_dtype],
        -lay.tokens_per_s,
        lay.gpus_per_replica,
        lay.pp,
        lay.attn_dp,
        lay.ep,
    )


def _throughput(lay: Layout) -> str:
    return (
        f"{lay.tokens_per_s:,.0f} tok/s ({lay.replicas:,} replica{'s' if lay.replicas != 1 else ''} × "
        f"{lay.sequences_per_replica:,} sequences / "
        f"{lay.step.seconds * 1e3:,.1f} ms a step)"
    )


def _rank_reason(rank: int, lay: Layout, above: Layout | None) -> str:
    """Why ``lay`` (at ``rank``, from 1) ranks below ``above``: accuracy first (fewer weight bits, online FP8, an FP8
    KV cache each rank below every layout without them), then fewer output tokens a second at the load, and whether
    that is fewer served sequences or a slower step; at equal throughput the first tie-break that differs."""
    if above is None:
        return f"#1: most output tokens a second at this load, {_throughput(lay)}"
    prev = f"#{rank - 1}"
    if WEIGHT_BYTES[lay.precision] < WEIGHT_BYTES[above.precision]:
        return f"{lay.precision} weights: fewer bits than {above.precision}, ranked after it (accuracy); {_throughput(lay)}"
    if lay.online and not above.online:
        return (
            f"{ONLINE_FP8} (16-bit checkpoint quantised at load) after an FP8 checkpoint: its 16-bit shard must fit "
            f"at load; {_throughput(lay)}"
        )
    if KV_DTYPES[lay.kv_cache_dtype] < KV_DTYPES[above.kv_cache_dtype]:
        return f"FP8 KV cache, ranked after every 16-bit one (accuracy); {_throughput(lay)}"
    if lay.tokens_per_s < above.tokens_per_s:
        served = lay.served_sequences / above.served_sequences
        slower = lay.step.seconds / above.step.seconds
        why = (
            f"{served:.2f}× {prev}'s served sequences ({lay.served_sequences:,} against {above.served_sequences:,})"
            if served < 1 and 1 / served >= slower
            else f"a step {slower:.2f}× {prev}'s ({lay.step.seconds * 1e3:,.1f} against "
            f"{above.step.seconds * 1e3:,.1f} ms, {lay.step.bound}-bound"
            + (f"; PP {lay.pp}: each stage reads its weights once a micro-batch" if lay.pp > above.pp else "")
            + ")"
        )
        return f"{lay.tokens_per_s:,.0f} < {prev}'s {above.tokens_per_s:,.0f} tok/s: {why}"
    tie = f"ties {prev} at {lay.tokens_per_s:,.0f} tok/s"
    if lay.gpus_per_replica > above.gpus_per_replica:
        return f"{tie}; {lay.gpus_per_replica} GPUs a replica, not {above.gpus_per_replica}"
    if lay.pp > above.pp:
        return f"{tie}; PP {lay.pp} > PP {above.pp}"
    if lay.attn_dp > above.attn_dp:
        return f"{tie}; attention DP {lay.attn_dp} > {above.attn_dp}: replicated attention, larger graph reserve"
    if lay.ep > above.ep:
        return f"{tie}; EP {lay.ep} > {above.ep}: whole experts a GPU, unevenly loaded as routing skews"
    return f"{tie} on every ranked field"


LOAD_REFUSED = "out of GPU memory while SGLang loads it"


def _load_refusal(
    tp: int, pp: int, share: WeightShare, free: float, gpu: GpuProduct, loads: list[tuple[int, int, int]]
) -> str:
    """Why an online-FP8 layout cannot start, with the figure and the fix: the fullest stage's load peak against
    the GPU's free memory at start, an FP8 checkpoint, or the smallest layout of the search whose shard loads."""
    more = (
        f"; or TP {loads[0][2]} × PP {loads[0][1]} ({loads[0][0]} GPUs a replica), the smallest layout here whose "
        "16-bit shard loads"
        if loads
        else "; no layout of this cluster loads its 16-bit shard"
    )
    return (
        f"{share.load_formula} > {free / GIB:,.2f} GiB free at start on "
        f"{gpu.label} (memory.total less the CUDA context and NCCL buffers): SGLang would run out of memory loading "
        f"the 16-bit checkpoint; use an FP8 checkpoint (its config.json's quantization_config.quant_method fp8, "
        f"{FP8_CHECKPOINT.where}: --hf-config that config.json, or --precision fp8){more}"
    )


def enumerate_layouts(
    arch: Architecture,
    gpu: GpuProduct,
    speed: GpuSpeed,
    gpus_per_node: int,
    nodes: int,
    context_length: int,
    max_running_requests: int,
    chunked_prefill_size: int,
    precisions: tuple[str, ...],
    fabric_gb_s: float,
    checkpoint: CheckpointWeights | None = None,
    assumptions: Assumptions = DEFAULT_ASSUMPTIONS,
) -> FitResult:
    """Every precision × KV dtype × TP × PP (powers of two, a replica within a node or over whole nodes)
    that SGLang starts (:func:`serving.plan.divisibility.rejections`) and whose KV pool holds at least one
    full-length sequence, ranked (:class:`FitResult`) by the output tokens a second the fleet makes with each
    replica running what ``max_running_requests`` and its pool allow (:func:`serving.plan.latency.decode_step` on
    ``gpu``'s datasheet figures ``speed``, ``fabric_gb_s`` a GPU between nodes); the TP sizes SGLang rejects with
    their reasons. With ``checkpoint`` the weights are that checkpoint's bytes (one precision).

    A model whose attention splits over attention-TP (DeepSeek, Qwen-MoE) is also tried with full attention DP
    (``attn_dp`` = TP, attention-TP 1: DeepSeek's published ``--tp 8 --dp 8 --enable-dp-attention``), where each GPU
    runs its own scheduler and pool and takes ``max_running_requests / attn_dp`` of the requests
    (``resolve_max_num_reqs``); a MoE model whose TP size SGLang refuses without EP also with full EP (``ep`` = TP,
    :func:`_ep_sizes`), which passes its block-FP8 expert-width check (Qwen3-235B-A22B-FP8 at TP 8); intermediate
    sizes of either are not searched.

    :data:`ONLINE_FP8` layouts whose 16-bit shard does not fit a GPU's free memory at load are excluded, each with
    its load peak and the fix (:func:`_load_refusal`)."""
    out: list[Layout] = []
    excluded: list[Excluded] = []
    too_big: list[tuple[int, int, int, WeightShare, float]] = []  # online FP8: tp, pp, attn_dp, fullest stage, free
    total_gpus = gpus_per_node * nodes
    for precision in precisions:
        bpp = WEIGHT_BYTES[precision]
        online = precision == ONLINE_FP8
        for tp, attn_dp in ((t, d) for t in _powers_of_two(min(total_gpus, 64)) for d in _attn_dp_sizes(arch, t)):
            # the first EP size SGLang starts: without EP where it can, else full EP (a layout with EP where one
            # without starts would price the same, so it is not listed twice)
            refused = {ep: rejections(arch, tp, precision, ep=ep, attn_dp=attn_dp) for ep in _ep_sizes(arch, tp)}
            if refused[1] and not any(e.precision == precision and e.tp == tp for e in excluded):
                # listed once (without EP), not again for each attention-DP size; its reasons say which EP passes
                excluded.append(Excluded(precision, tp, tuple(refused[1]), attn_dp))
            ep = next((e for e, reasons in refused.items() if not reasons), 0)
            if not ep:
                continue
            running = running_requests_per_replica(max_running_requests, attn_dp)
            for pp in _powers_of_two(min(total_gpus // tp, 16, arch.num_layers)):
                gpr = tp * pp
                if gpr > gpus_per_node and gpr % gpus_per_node:
                    continue
                free = free_at_start_bytes(gpu, tp, pp)
                fraction = sglang_mem_fraction_static(
                    gpu.memory_total_mib,
                    tp,
                    pp,
                    chunked_prefill_size,
                    max_running_requests,
                    arch.mla is not None,
                    attn_dp,
                ).value
                group = (arch.quant_group_size or DEFAULT_GROUP_SIZE) if precision == "int4" else None
                shares = stage_weights(arch, bpp, tp, pp, group, checkpoint, attn_dp, online)
                for kv_dtype, kv_bytes in KV_DTYPES.items():
                    rp = replica_pool(
                        arch, bpp, kv_bytes, tp, pp, free, fraction, group, checkpoint, attn_dp, online_fp8=online,
                        shares=shares,
                    )  # fmt: skip
                    peak = rp.fullest_at_load
                    if peak is not None and (peak.load_peak_bytes or 0.0) > free:
                        too_big.append((tp, pp, attn_dp, peak, free))
                        break  # the KV dtype does not change what loads
                    seqs = min(running, rp.tokens // context_length * attn_dp)
                    if seqs < 1:
                        continue
                    if gpr <= gpus_per_node:
                        rpn: int | None = gpus_per_node // gpr
                        replicas, span = nodes * (gpus_per_node // gpr), 1
                    else:
                        rpn, span = None, gpr // gpus_per_node
                        replicas = nodes // span
                    step = decode_step(
                        arch,
                        gpu,
                        speed,
                        rp,
                        precision=precision,
                        tp=tp,
                        pp=pp,
                        attn_dp=attn_dp,
                        ep=ep,
                        sequences=seqs,
                        context_length=context_length,
                        gpus_per_node=gpus_per_node,
                        fabric_gb_s=fabric_gb_s,
                        assumptions=assumptions,
                    )
                    breakdown = (
                        (f"load {peak.load_formula} ≤ {free / GIB:,.2f} GiB free at start; " if peak else "")
                        + f"weights {rp.weights.loaded_formula}; KV pool {rp.formula}"
                        + (f"; × {attn_dp} attention-DP pools" if attn_dp > 1 else "")
                        + f"; decode step {step.formula}"
                    )
                    out.append(
                        Layout(
                            precision=precision,
                            kv_cache_dtype=kv_dtype,
                            tp=tp,
                            pp=pp,
                            replicas=replicas,
                            replicas_per_node=rpn,
                            nodes_per_replica=span,
                            mem_fraction_static=fraction,
                            weights_per_gpu=max(w.total for w, _, _ in rp.stages),
                            kv_pool_tokens=rp.tokens,
                            sequences_per_replica=seqs,
                            served_sequences=seqs * replicas,
                            breakdown=breakdown,
                            step=step,
                            attn_dp=attn_dp,
                            ep=ep,
                            load_peak_per_gpu=peak.load_peak_bytes if peak else None,
                        )
                    )
    loads = sorted({(lay.gpus_per_replica, lay.pp, lay.tp) for lay in out if lay.online})
    excluded += [
        Excluded(ONLINE_FP8, tp, (_load_refusal(tp, pp, share, free, gpu, loads),), attn_dp, pp, LOAD_REFUSED)
        for tp, pp, attn_dp, share, free in too_big
    ]
    out.sort(key=_rank_key)
    ranked = [
        replace(lay, rank_reason=_rank_reason(i + 1, lay, out[i - 1] if i else None)) for i, lay in enumerate(out)
    ]
    return FitResult(ranked, excluded)
