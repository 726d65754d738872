"""What one decode step of a replica costs, from below: the roofline ``exaserve fit`` ranks layouts by.

A decode step moves every running sequence one token. On each GPU it is bounded by the bytes it must read from HBM
(its weights, the experts the step's tokens touch, the KV cache its sequences attend over) and by the FLOPs of its
share of the linear layers, whichever is slower; TP adds two all-reduces a layer, and PP hands each micro-batch from
stage to stage. That is the decode model of Pope et al., *Efficiently Scaling Transformer Inference* (MLSys 2023,
arXiv:2211.05102, §2 and §3.1: a step's time is the larger of weight/KV loading and compute, plus communication),
with SGLang's own pipeline schedule (:data:`PP_MICRO_BATCHES`).

What it is for: ranking. Every figure is a lower bound from the datasheet's peaks
(:class:`~serving.plan.calibration.GpuSpeed`), not a prediction of SGLang's TPOT, and it is not calibrated on a GPU:
kernel efficiency, scheduling, prefill chunks and CUDA-graph padding are left out, so a real step is slower by a
factor that is about the same for every layout of one model. The ranking's conclusions are tested to hold when the
bandwidths are derated and the latencies doubled (``tests/test_fit.py``). The constants that are assumptions, not
datasheet figures, are :class:`Assumptions`'s."""

from __future__ import annotations

import math
from dataclasses import dataclass

from serving.plan.calibration import GpuProduct, GpuSpeed
from serving.plan.divisibility import SourceCheck
from serving.plan.memory import ReplicaPool
from serving.plan.weights import stage_parameters
from serving.spec.schema import GIB, Architecture

PP_MICRO_BATCHES = SourceCheck("managers/scheduler_pp_mixin.py", 562, "self.pp_loop_size: int = (")
"""SGLang's PP scheduler keeps ``pp_size`` micro-batches in flight (``pp_loop_size = pp_size +
pp_async_batch_depth``), each of at most ``max_running_requests // pp_size`` requests (:data:`PP_MICRO_BATCH_SIZE`)."""
PP_MICRO_BATCH_SIZE = SourceCheck("managers/scheduler.py", 1240, "pp_max_micro_batch_size=max(")

FP8 = ("fp8", "fp8-online")
"""Precisions whose linear layers run on the FP8 tensor cores where the GPU has them (``int8`` on the INT8 ones)."""


@dataclass(frozen=True)
class Assumptions:
    """The constants that are not datasheet figures: the fixed cost of one collective and the share of a datasheet
    bandwidth a step gets. Chosen, not measured (no GPU has been lent to calibrate them); the ranking's tests vary
    them (halved and doubled latency, 60 % of the bandwidths) and the published recipes stay first."""

    nvlink_latency_s: float = 10e-6
    """One all-reduce or hand-off inside an NVLink node (SGLang's custom all-reduce on small messages)."""
    pcie_latency_s: float = 25e-6
    """The same over PCIe (NCCL; SGLang disables its custom all-reduce on more than two PCIe-only GPUs)."""
    fabric_latency_s: float = 30e-6
    """The same between nodes, over the cluster's fabric (InfiniBand/RoCE, NCCL)."""
    bandwidth_share: float = 1.0
    """The share of every datasheet bandwidth (HBM, NVLink/PCIe, fabric) a step gets: 1.0 is the roofline's bound."""


DEFAULT_ASSUMPTIONS = Assumptions()


@dataclass(frozen=True)
class DecodeStep:
    """One decode step of a replica (every running sequence one token), per :func:`decode_step`."""

    seconds: float
    """The step's time: the time per output token (TPOT) every running sequence sees, at least."""
    sequences: int
    """Running sequences the step advances (the replica's ``sequences_per_replica``)."""
    bound: str
    """What bounds the slowest stage: ``weights``, ``kv cache`` or ``compute``."""
    formula: str

    @property
    def tokens_per_s(self) -> float:
        """Output tokens a second the replica makes at this load."""
        return self.sequences / self.seconds if self.seconds else 0.0


def _routed_parameters(arch: Architecture, layers: range) -> float:
    """The routed experts' parameters in ``layers`` (0 for a dense model or where the expert width is unknown)."""
    moe = arch.moe
    if moe is None or moe.intermediate_size is None:
        return 0.0
    moe_layers = len(range(max(layers.start, moe.dense_layers), layers.stop))
    return float(moe_layers * moe.num_experts * 3 * arch.hidden_size * moe.intermediate_size)


def experts_touched(arch: Architecture, tokens: float) -> float:
    """The expected share of a layer's routed experts that ``tokens`` tokens activate, each picking ``k`` of ``E``
    uniformly: 1 − (1 − k/E)^tokens (1 for a dense model). A step reads only the experts it touches."""
    moe = arch.moe
    if moe is None:
        return 1.0
    untouched: float = (1.0 - moe.experts_per_token / moe.num_experts) ** max(tokens, 0.0)
    return 1.0 - untouched


def ep_imbalance(arch: Architecture, tokens: float, ep: int) -> float:
    """How many times the mean a GPU's share of touched experts the busiest GPU reads under EP: with ``ep`` > 1 each
    GPU holds ``E / ep`` whole experts, so a step waits for the GPU whose experts its ``tokens`` touched most, where
    under TP every GPU holds a slice of every expert and reads the mean. Each expert is taken as touched independently
    with :func:`experts_touched`'s probability p, so a GPU's count is Binomial(E / ep, p) and the busiest of ``ep`` has
    E[max] = Σ_{m ≥ 1} (1 − F(m − 1)^ep); the factor is E[max] / (E / ep × p), 1 without EP. Qwen3-235B (128
    experts, 8 a token) at EP 8: 2.5 at 1 token, 1.4 at 8, 1.0 at 64 and above."""
    moe = arch.moe
    if moe is None or ep <= 1:
        return 1.0
    n, p = moe.num_experts // ep, experts_touched(arch, tokens)
    if n < 1 or p <= 0.0 or p >= 1.0:
        return 1.0
    cdf, total, expected_max = [], 0.0, 0.0
    for k in range(n + 1):
        total += math.comb(n, k) * p**k * (1.0 - p) ** (n - k)
        cdf.append(min(total, 1.0))
    for m in range(1, n + 1):
        expected_max += 1.0 - cdf[m - 1] ** ep
    return expected_max / (n * p)


def _link(
    gpu: GpuSpeed, group_gpus: int, gpus_per_node: int, nvlink: bool, fabric_gb_s: float, a: Assumptions
) -> tuple[float, float, str]:
    """Bandwidth (B/s) and fixed latency (s) of a collective over ``group_gpus`` GPUs, and its name: inside a node
    NVLink or PCIe, across nodes the fabric (the slowest link of the ring)."""
    if group_gpus > gpus_per_node:
        return fabric_gb_s * 1e9 * a.bandwidth_share, a.fabric_latency_s, "fabric"
    if nvlink:
        return gpu.link_gb_s * 1e9 * a.bandwidth_share, a.nvlink_latency_s, "NVLink"
    return gpu.link_gb_s * 1e9 * a.bandwidth_share, a.pcie_latency_s, "PCIe"


def decode_step(
    arch: Architecture,
    gpu: GpuProduct,
    speed: GpuSpeed,
    pool: ReplicaPool,
    *,
    precision: str,
    tp: int,
    pp: int,
    attn_dp: int,
    ep: int = 1,
    sequences: int,
    context_length: int,
    gpus_per_node: int,
    fabric_gb_s: float,
    assumptions: Assumptions = DEFAULT_ASSUMPTIONS,
) -> DecodeStep:
    """The time of one decode step of a replica running ``sequences`` sequences on ``gpu`` (its datasheet figures
    ``speed``), each attending over half its ``context_length`` on average (a full-length request, read over its
    whole decode).

    Per stage, on each of its GPUs, with ``b`` the tokens of one micro-batch (``sequences / pp``,
    :data:`PP_MICRO_BATCHES`):

    - **bytes read**: the stage's weights (``pool``'s, as the KV budget subtracts them) but the routed experts no
      token of the micro-batch picks (:func:`experts_touched`; under EP the busiest GPU's share,
      :func:`ep_imbalance`), plus the KV cache of the sequences its attention
      group holds (``b / attn_dp``) × the mean context × the stage's cell bytes on one GPU; over the HBM bandwidth;
    - **FLOPs**: 2 × ``b`` × the stage's parameters a token activates (its ``k`` of ``E`` experts) / TP (attention
      DP splits the tokens, not the FLOPs a GPU does), over the 16-bit, FP8 or INT8 peak (FP8 at the 16-bit peak
      on a GPU without FP8 tensor cores);
    - **TP**: two all-reduces a layer (attention and MLP outputs; attention DP gathers and scatters the same bytes) of
      ``b`` × hidden × 2 B, a ring's 2 (TP − 1) / TP of them over the link, plus its fixed latency.

    The replica's step: one stage's time without PP. With PP each stage runs PP micro-batches a step and each
    micro-batch crosses PP stages and PP hand-offs (``b`` × hidden × 2 B): the step is the larger of the slowest
    stage's PP micro-batches and one micro-batch's way through every stage. So PP reads each stage's weights once
    a micro-batch, PP times a step, where TP over the same GPUs reads its shard once: the pipeline's price in
    decode."""
    a = assumptions
    hbm = speed.hbm_gb_s * 1e9 * a.bandwidth_share
    peak = (
        speed.tflops_int8
        if precision == "int8"
        else speed.tflops_fp8
        if precision in FP8 and speed.tflops_fp8
        else speed.tflops_16bit
    ) * 1e12
    b = sequences / pp
    touched = experts_touched(arch, b)
    busiest = min(1.0, touched * ep_imbalance(arch, b, ep))
    k_share = arch.moe.experts_per_token / arch.moe.num_experts if arch.moe else 1.0
    tp_bw, tp_lat, tp_link = _link(speed, tp, gpus_per_node, gpu.nvlink, fabric_gb_s, a)
    allreduce = (tp_lat + 2 * (tp - 1) / tp * b * arch.hidden_size * 2 / tp_bw) if tp > 1 else 0.0
    times: list[float] = []
    parts: list[tuple[str, float, float, float, float]] = []
    for share, cell, _ in pool.stages:
        params = stage_parameters(arch, share.layers)
        routed = _routed_parameters(arch, share.layers)
        resident = share.total - share.load_overhead_bytes
        expert_bytes = share.layer_bytes * (routed / params if params else 0.0)
        weights_read = resident - expert_bytes * (1.0 - busiest)
        kv_read = b / attn_dp * context_length / 2 * cell
        memory_s = (weights_read + kv_read) / hbm
        compute_s = 2 * b * (params - routed * (1.0 - k_share)) / tp / peak
        comm_s = 2 * len(share.layers) * allreduce
        times.append(max(memory_s, compute_s) + comm_s)
        bound = "compute" if compute_s > memory_s else "kv cache" if kv_read > weights_read else "weights"
        parts.append((bound, weights_read, kv_read, compute_s, comm_s))
    slowest = max(range(len(times)), key=lambda i: times[i])
    bound, weights_read, kv_read, compute_s, comm_s = parts[slowest]
    text = (
        f"stage {slowest + 1}/{pp}: " if pp > 1 else ""
    ) + f"({weights_read / GIB:,.2f} GiB weights + {kv_read / GIB:,.2f} GiB KV) / {speed.hbm_gb_s:,.0f} GB/s"
    if arch.moe is not None:
        text += f" ({touched:.0%} of the experts touched by {b:,.1f} tokens"
        text += f"; the busiest of EP {ep}'s GPUs {busiest:.0%} of its own)" if ep > 1 else ")"
    text += f", compute {compute_s * 1e3:,.2f} ms"
    if tp > 1:
        text += f", TP all-reduces {comm_s * 1e3:,.2f} ms over {tp_link}"
    if pp == 1:
        seconds = times[0]
    else:
        hop_bw, hop_lat, hop_link = _link(speed, tp * pp, gpus_per_node, gpu.nvlink, fabric_gb_s, a)
        hop = hop_lat + b * arch.hidden_size * 2 / hop_bw
        seconds = max(pp * times[slowest], sum(times) + pp * hop)
        text += (
            f"; × {pp} micro-batches of {b:,.1f} ({PP_MICRO_BATCHES.where}), {pp} hand-offs of {hop * 1e6:,.0f} µs "
            f"over {hop_link}"
        )
    return DecodeStep(seconds, sequences, bound, f"{text} = {seconds * 1e3:,.2f} ms a step")
