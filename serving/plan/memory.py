"""SGLang's memory model (the pinned 0.5.23), reproduced offline: what a replica's KV pool will hold.

Three steps, each mirroring SGLang's own code (read in the SGLang venv of ``scripts/sglang-manifest.sh``; ``docs/planner.md`` maps them):

1. ``mem_fraction_static`` — ``sglang/srt/arg_groups/memory_hook.py: handle_gpu_memory_settings``: the
   chunked-prefill size and CUDA-graph batch sizes follow the GPU's memory (nvidia-smi ``memory.total``,
   MiB) and TP; ``reserved = 512 + max(chunked_prefill, 2048) × 1.5 + tp × pp / 8 × 1024 + graph reserve``
   MiB, at least 10 GiB on GPUs over 60 GiB; ``(gpu_mem − reserved) / gpu_mem`` rounded to 3 decimals.
2. The KV budget — ``mem_cache/kv_cache_configurator.py: _profile_available_bytes``: free memory after
   the weights minus ``free_at_start × (1 − mem_fraction_static)``, i.e. ``free_at_start × mfs − weights``.
3. Tokens — ``model_executor/pool_configurator.py: DefaultPoolConfigurator``: budget // bytes per token
   on this GPU (KV heads split by TP, never below one; MLA's latent whole on every rank; layers by PP).

The free-at-start figure and the weights' load-time overhead come from public start-up logs
(:data:`CALIBRATION_LOGS`); every constant is derived from them here, none is typed in twice. Other public logs
(:data:`HELD_OUT_LOGS`) are kept out of the fit and predicted, to measure the model's accuracy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from serving.plan.divisibility import SourceCheck, rejections
from serving.spec.schema import GIB, Architecture, CheckpointWeights, SpeculativeSpec, count_parameters

MIB = 2**20

# --------------------------------------------------------------------------------------- GPU products


@dataclass(frozen=True)
class GpuProduct:
    """A GPU as SGLang sees it: ``memory.total`` in MiB (what ``get_nvgpu_memory_capacity`` reads)."""

    label: str
    memory_total_mib: int
    source: str
    nvlink: bool = False
    """The product's GPUs talk over NVLink inside a node (SXM/HGX boards): at TP > 1 SGLang's custom all-reduce
    and NCCL's peer buffers are set up before the weights load (:data:`NVLINK_LOGS`)."""


GPU_PRODUCTS: dict[str, GpuProduct] = {
    g.label: g
    for g in (
        GpuProduct(
            "NVIDIA-A100-SXM4-40GB", 40_960, "NVIDIA A100 datasheet: 40 GiB HBM2 (nvidia-smi 40960MiB)", nvlink=True
        ),
        GpuProduct(
            "NVIDIA-A100-SXM4-80GB", 81_920, "NVIDIA A100 datasheet: 80 GiB HBM2e (nvidia-smi 81920MiB)", nvlink=True
        ),
        GpuProduct("NVIDIA-H100-80GB-HBM3", 81_559, "nvidia-smi on H100 SXM5: 81559MiB", nvlink=True),
        GpuProduct("NVIDIA-H20", 97_871, "nvidia-smi on H20: 97871MiB", nvlink=True),
        GpuProduct("NVIDIA-H200", 143_771, "nvidia-smi on H200 SXM: 143771MiB", nvlink=True),
        GpuProduct("NVIDIA-B200", 183_359, "nvidia-smi on B200: 183359MiB", nvlink=True),
        GpuProduct("NVIDIA-L40S", 46_068, "nvidia-smi in https://github.com/sgl-project/sglang/pull/13023: 46068MiB"),
        GpuProduct("NVIDIA-L4", 23_034, "nvidia-smi on L4: 23034MiB"),
        GpuProduct(
            "NVIDIA-GeForce-RTX-4090",
            24_564,
            "https://github.com/sgl-project/sglang-omni/issues/1168: 'RTX 4090, 24,564 MiB'",
        ),
    )
}


class UnknownGpuError(ValueError):
    """A GPU product the table does not know."""


def gpu_product(label: str) -> GpuProduct:
    try:
        return GPU_PRODUCTS[label]
    except KeyError:
        raise UnknownGpuError(
            f"unknown GPU product {label!r}; use one of {', '.join(sorted(GPU_PRODUCTS))} "
            "(cluster.gpu.product, the nvidia.com/gpu.product label), or add it to "
            "serving/plan/memory.py GPU_PRODUCTS with its nvidia-smi memory.total"
        ) from None


# ------------------------------------------------------------------------------------ calibration logs

PRECISION_BYTES: dict[str, float] = {"bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


@dataclass(frozen=True)
class StartupLog:
    """One public SGLang start-up log: what the hardware and the checkpoint gave, and the pool it got."""

    name: str
    source: str
    """The public address of the log."""
    sglang: str
    """The SGLang version that wrote it, as far as the source tells."""
    gpu: str
    tp: int
    mem_fraction_static: float
    free_at_start_gib: float | None
    """``Load weight begin. avail mem=`` (or ``Load weight end`` avail + mem usage); None where not logged."""
    weights_gib: float | None
    """``Load weight end. … mem usage=``; None where not logged."""
    kv_pool_tokens: int
    """``KV Cache is allocated. #tokens:`` / ``max_total_num_tokens=``."""
    config: dict[str, object]
    """The checkpoint's config.json fields the model reads."""
    precision: str = "bf16"
    """The checkpoint's weight precision (a key of :data:`PRECISION_BYTES`); KV cache is 16-bit in every log."""


CALIBRATION_LOGS: tuple[StartupLog, ...] = (
    StartupLog(
        name="QwQ-32B bf16, 4 × L4, TP 4",
        source="https://github.com/didier-durand/llms-in-clouds/blob/b001c8690e894d234cf3a2e2345d259173acf293/"
        "docs/sglang.md (section 'SGLang start sequence with Qwen QwQ-32B', AWS g6.12xlarge)",
        sglang="0.4.3.post4 (the Dockerfile quoted in the same page)",
        gpu="NVIDIA-L4",
        tp=4,
        mem_fraction_static=0.85,
        free_at_start_gib=21.63,
        weights_gib=15.54,
        kv_pool_tokens=46_611,
        config={
            "hidden_size": 5120,
            "intermediate_size": 27648,
            "num_attention_heads": 40,
            "num_hidden_layers": 64,
            "num_key_value_heads": 8,
            "vocab_size": 152064,
        },
    ),
    StartupLog(
        name="Qwen3-14B bf16, 4 × RTX 4090, TP 4",
        source="a public repository document ('项目A-v2-服务基线', Qwen3-14B service baseline on 4 × RTX 4090 24564 MiB, "
        "section 5 '关键启动日志'); the search index holds its text but not its repository address",
        sglang="main at ebaf86d441447cb37dac92b7bd0838832fcdef48 (2026-06, per the same document)",
        gpu="NVIDIA-GeForce-RTX-4090",
        tp=4,
        mem_fraction_static=0.80,
        free_at_start_gib=16.00 + 7.08,
        weights_gib=7.08,
        kv_pool_tokens=298_447,
        config={
            "hidden_size": 5120,
            "intermediate_size": 17408,
            "num_attention_heads": 40,
            "num_hidden_layers": 40,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "vocab_size": 151936,
        },
    ),
)
"""The logs the two constants below are fitted on."""

HELD_OUT_LOGS: tuple[StartupLog, ...] = (
    StartupLog(
        name="Llama-3.1-8B-Instruct bf16, 1 × H100 80 GB, TP 1",
        source="https://github.com/sgl-project/sglang/pull/4760 (description, 'Test Results'); the GPU is inferred: "
        "the FlashAttention 3 backend under test runs on Hopper only, and 78.59 GiB free fits an 80 GB card; "
        "mem_fraction_static is not logged: 0.88 is that version's default for TP 1 and reproduces the logged pool",
        sglang="0.4.4 (2025-03-25)",
        gpu="NVIDIA-H100-80GB-HBM3",
        tp=1,
        mem_fraction_static=0.88,
        free_at_start_gib=63.48 + 15.11,
        weights_gib=15.11,
        kv_pool_tokens=442_750,
        config={
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_attention_heads": 32,
            "num_hidden_layers": 32,
            "num_key_value_heads": 8,
            "vocab_size": 128256,
        },
    ),
    StartupLog(
        name="Qwen3-30B-A3B-FP8 (MoE), 1 × H100 80 GB, TP 1",
        source="https://github.com/mystous/vllm_hybrid/blob/f056911769698c5dec4cbea558d4fbd019509de7/"
        "shadow_assists/features/IDE_023/whitepaper/IDE_023_TSK_043_RAW_DATA.md (§10, t1_gpu_only/server.log; "
        "the kernel-config lines name NVIDIA_H100_80GB_HBM3)",
        sglang="main of 2026-08 (decode graphs 'full', prefill graphs 'breakable', as the pinned 0.5.23)",
        gpu="NVIDIA-H100-80GB-HBM3",
        tp=1,
        mem_fraction_static=0.83,
        free_at_start_gib=78.48,
        weights_gib=29.15,
        kv_pool_tokens=392_920,
        config={
            "hidden_size": 2048,
            "intermediate_size": 6144,
            "moe_intermediate_size": 768,
            "num_attention_heads": 32,
            "num_hidden_layers": 48,
            "num_key_value_heads": 4,
            "head_dim": 128,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "vocab_size": 151936,
            "tie_word_embeddings": False,
        },
        precision="fp8",
    ),
    StartupLog(
        name="Qwen3-235B-A22B-FP8 (MoE), 4 × H100 80 GB, TP 4",
        source="https://github.com/vllm-project/vllm/issues/21348 (the SGLang command and its 'KV Cache is allocated' "
        "line; the issue quotes no 'Load weight' line, so free-at-start and weights are not known)",
        sglang="0.4.9 era (2025-07-22)",
        gpu="NVIDIA-H100-80GB-HBM3",
        tp=4,
        mem_fraction_static=0.93,
        free_at_start_gib=None,
        weights_gib=None,
        kv_pool_tokens=367_404,
        config={
            "hidden_size": 4096,
            "intermediate_size": 12288,
            "moe_intermediate_size": 1536,
            "num_attention_heads": 64,
            "num_hidden_layers": 94,
            "num_key_value_heads": 4,
            "head_dim": 128,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "vocab_size": 151936,
            "tie_word_embeddings": False,
        },
        precision="fp8",
    ),
)
"""Logs the constants were NOT fitted on: the planner predicts them (free at start from the GPU table, weights
from config.json) and ``tests/test_memory_model.py`` compares; ``docs/planner.md`` reports each error."""


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _logged(c: StartupLog) -> tuple[float, float]:
    """A calibration log's free-at-start and weights figures (both needed to fit the constants)."""
    if c.free_at_start_gib is None or c.weights_gib is None:
        raise ValueError(
            f"calibration log {c.name!r} lacks its free-at-start or weights figure; list it in HELD_OUT_LOGS"
        )
    return c.free_at_start_gib, c.weights_gib


def runtime_overhead_gib() -> float:
    """CUDA context + NCCL + allocator before the weights: memory.total − free at start, mean over the logs."""
    return _mean([GPU_PRODUCTS[c.gpu].memory_total_mib * MIB / GIB - _logged(c)[0] for c in CALIBRATION_LOGS])


def load_overhead_gib() -> float:
    """What SGLang's ``mem usage`` at load adds to the parameters' bytes (rotary caches, vocab padding,
    allocator rounding): logged weights − counted parameter bytes per GPU, mean over the logs."""
    deltas = []
    for c in CALIBRATION_LOGS:
        params = count_parameters(dict(c.config))
        if params is None:
            raise ValueError(f"calibration log {c.name!r}: its config lacks a shape count_parameters needs")
        deltas.append(_logged(c)[1] - params * PRECISION_BYTES[c.precision] / c.tp / GIB)
    return _mean(deltas)


RUNTIME_OVERHEAD_GIB = runtime_overhead_gib()
LOAD_OVERHEAD_GIB = load_overhead_gib()
OBSERVED_FREE_AT_START_GIB = {c.gpu: _logged(c)[0] for c in CALIBRATION_LOGS}


@dataclass(frozen=True)
class FreeAtStartLog:
    """A public log of free memory before the weights load (``Load weight begin. avail mem=``, or ``Load weight
    end`` avail + mem usage) on an NVLink node at TP > 1."""

    name: str
    source: str
    sglang: str
    gpu: str
    tp: int
    pp: int
    free_at_start_gib: float


NVLINK_LOGS: tuple[FreeAtStartLog, ...] = (
    FreeAtStartLog(
        name="8 × H200, TP 8",
        source="https://github.com/sgl-project/sglang/pull/11716 (description: 'Init torch distributed ends. mem "
        "usage=2.01 GB', 'Load weight begin. avail mem=137.29 GB' on six of the eight ranks, 137.34 and 137.52 on "
        "the others; the pool takes the minimum over ranks)",
        sglang="main of 2025-10-16",
        gpu="NVIDIA-H200",
        tp=8,
        pp=1,
        free_at_start_gib=137.29,
    ),
    FreeAtStartLog(
        name="4 nodes × 8 H200, PP 4 × TP 8",
        source="https://github.com/sgl-project/sglang/issues/8337 (description: TP0 PP0 'Load weight end. "
        "type=Qwen3MoeForCausalLM, dtype=torch.bfloat16, avail mem=124.19 GB, mem usage=13.73 GB')",
        sglang="0.4.9 era (2025-07-24)",
        gpu="NVIDIA-H200",
        tp=8,
        pp=4,
        free_at_start_gib=124.19 + 13.73,
    ),
)
"""The NVLink TP > 1 logs :data:`NVLINK_TP_OVERHEAD_GIB` is fitted on."""


def nvlink_tp_overhead_gib() -> float:
    """What an NVLink node at TP > 1 takes before the weights beyond the PCIe/TP-1 runtime overhead: SGLang's
    custom all-reduce (disabled on more than two PCIe-only GPUs, as the PCIe calibration logs say) and NCCL's
    peer buffers, set up at distributed init, before ``measure_pre_model_load_memory``. Mean over the logs."""
    gaps = [GPU_PRODUCTS[c.gpu].memory_total_mib * MIB / GIB - c.free_at_start_gib for c in NVLINK_LOGS]
    return _mean(gaps) - RUNTIME_OVERHEAD_GIB


NVLINK_TP_OVERHEAD_GIB = nvlink_tp_overhead_gib()


def runtime_overhead_for(gpu: GpuProduct, tp: int) -> tuple[float, str]:
    """Memory gone before the weights load, GiB, and why: the CUDA context and allocator (the PCIe logs' mean), plus
    the NVLink all-reduce buffers when the product has NVLink and TP > 1."""
    if gpu.nvlink and tp > 1:
        v = RUNTIME_OVERHEAD_GIB + NVLINK_TP_OVERHEAD_GIB
        return v, (
            f"{RUNTIME_OVERHEAD_GIB:.2f} GiB runtime + {NVLINK_TP_OVERHEAD_GIB:.2f} GiB NVLink all-reduce buffers at "
            f"TP {tp}, fitted on the NVLink logs"
        )
    why = "TP 1" if tp == 1 else "no NVLink"
    return RUNTIME_OVERHEAD_GIB, f"{RUNTIME_OVERHEAD_GIB:.2f} GiB runtime; {why}, no all-reduce buffers"


def free_at_start_bytes(gpu: GpuProduct, tp: int = 1) -> float:
    """Free memory when SGLang starts loading weights: logged where a (PCIe) log of the product exists, else
    memory.total less the runtime overhead for this product and TP (:func:`runtime_overhead_for`)."""
    observed = OBSERVED_FREE_AT_START_GIB.get(gpu.label)
    if observed is not None:
        return observed * GIB
    return gpu.memory_total_mib * MIB - runtime_overhead_for(gpu, tp)[0] * GIB


# ---------------------------------------------------------------------- handle_gpu_memory_settings


def _prefill_graph_sizes(max_bs: int) -> list[int]:
    """``cuda_graph_hook.generate_prefill_cuda_graph_batch_sizes``."""
    sizes = [
        *range(4, 33, 4),
        *range(48, 257, 16),
        *range(288, 513, 32),
        *range(576, 1024 + 1, 64),
        *range(1280, 4096 + 1, 256),
        *range(4608, max_bs + 1, 512),
    ]
    return [s for s in sizes if s <= max_bs]


DP_GRAPH_RESERVE = SourceCheck(
    "arg_groups/memory_hook.py", 376, "reserved_mem += decode_cuda_graph_config.max_bs * cfg.attn_dp_size * 3"
)
"""``reserve_for_graph_mb``: attention DP pads the decode graphs, ``max_bs × attn_dp_size × 3`` MiB (and
``× 1.5`` more above a max_bs of 300)."""


@dataclass(frozen=True)
class StaticFraction:
    """SGLang's default ``mem_fraction_static`` and the figures it came from (MiB)."""

    gpu_memory_mib: float
    chunked_prefill_size: int
    decode_graph_max_bs: int
    activation_mib: float
    parallel_mib: float
    graph_mib: float
    reserved_mib: float
    value: float
    attn_dp: int = 1

    @property
    def formula(self) -> str:
        bs = self.decode_graph_max_bs
        dp = f" + {bs} × attn DP {self.attn_dp} × {4.5 if bs > 300 else 3:g}" if self.attn_dp > 1 else ""
        return (
            f"(gpu {self.gpu_memory_mib:,.0f} MiB − reserved {self.reserved_mib:,.0f} MiB) / gpu = {self.value:.3f}; "
            f"reserved = max(512 + {self.activation_mib:,.0f} activations (max(chunked prefill "
            f"{self.chunked_prefill_size}, 2048) × 1.5) + {self.parallel_mib:,.0f} (tp × pp / 8 × 1024) + "
            f"{self.graph_mib:,.0f} CUDA graphs (decode max bs {bs} × 2{dp} + prefill), "
            "10240 on GPUs over 60 GiB)"
        )


def sglang_mem_fraction_static(
    gpu_memory_mib: float,
    tp: int,
    pp: int,
    chunked_prefill_size: int | None,
    max_running_requests: int | None,
    mla: bool,
    attn_dp: int = 1,
) -> StaticFraction:
    """``handle_gpu_memory_settings`` of SGLang 0.5.23 for a model (not multimodal, no DeepEP, no disaggregation)
    on CUDA, where SGLang's defaults are decode graphs ``full`` and prefill graphs ``breakable``, disabled by
    default when ``pp > 1``. With attention DP (``attn_dp`` > 1) the decode graphs reserve ``max_bs × attn_dp × 3``
    MiB more, × 4.5 above a max_bs of 300 (:data:`DP_GRAPH_RESERVE`); the chunked prefill size is divided by
    ``attn_dp`` only afterwards (``handle_data_parallelism``), so the activation term uses the whole size."""
    gib = 1024
    if gpu_memory_mib < 20 * gib:
        cps, max_bs = 2048, 8
    elif gpu_memory_mib < 35 * gib:
        cps, max_bs = 4096, 48 if tp < 4 else 160
    elif gpu_memory_mib < 60 * gib:
        cps, max_bs = 4096, 32 if tp < 4 else 160
    elif gpu_memory_mib < 160 * gib:
        cps, max_bs = 8192, 256 if tp < 4 else 512
    else:
        cps, max_bs = 16384, 512
    if chunked_prefill_size is not None:
        cps = chunked_prefill_size
    if max_running_requests is not None:
        max_bs = min(max_bs, max_running_requests)
    activation = max(cps, 2048) * 1.5
    parallel = tp * pp / 8 * 1024
    graph = max_bs * 2.0
    if attn_dp > 1:
        graph += max_bs * attn_dp * (4.5 if max_bs > 300 else 3)
    if pp == 1:  # prefill CUDA graphs: breakable by default, off under PP
        graph += 1.5 * 1024 if mla else len(_prefill_graph_sizes(cps)) * 8
    reserved = 512 + activation + parallel + graph
    if gpu_memory_mib > 60 * gib:
        reserved = max(reserved, 10 * gib)
    value = round((gpu_memory_mib - reserved) / gpu_memory_mib, 3)
    return StaticFraction(gpu_memory_mib, cps, max_bs, activation, parallel, graph, reserved, value, attn_dp)


# ------------------------------------------------------------------------------------------ weights

PP_PARTITION = SourceCheck(
    "distributed/utils.py", 139, "# Distribute the extra layers to the last 'remainder' partitions"
)
"""``get_pp_indices``: ``layers // pp`` layers a stage, the ``layers % pp`` extra ones to the last stages."""
PP_MIN_TOKENS = SourceCheck("mem_cache/kv_cache_configurator.py", 3107, "# Sync across PP ranks")
"""``_apply_token_constraints``: the pool's token count is all-reduced with ``ReduceOp.MIN`` over the PP ranks."""


def pp_stage_layers(num_layers: int, pp: int) -> list[range]:
    """The layers of each pipeline stage, as SGLang's ``get_pp_indices`` splits them (without
    ``SGLANG_PP_LAYER_PARTITION``): every stage ``num_layers // pp``, one more on each of the last
    ``num_layers % pp`` stages."""
    base, extra = divmod(num_layers, pp)
    out, start = [], 0
    for rank in range(pp):
        n = base + (1 if rank >= pp - extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


def stage_parameters(arch: Architecture, layers: range) -> float:
    """Parameters of the decoder layers ``layers`` (everything but the embedding and LM head tables). A MoE
    model's leading dense layers (``first_k_dense_replace``) hold a dense MLP instead of the experts; where both
    widths are known that difference is taken out of the count, else every layer weighs the mean."""
    tables = 1 if arch.tie_word_embeddings else 2
    total = arch.parameter_count - arch.vocab_size * arch.hidden_size * tables
    n, moe = arch.num_layers, arch.moe
    if moe is None or not moe.dense_layers or moe.intermediate_size is None or arch.intermediate_size is None:
        return total * len(layers) / n
    h = arch.hidden_size
    moe_mlp = (moe.num_experts + moe.shared_experts) * 3 * h * moe.intermediate_size + h * moe.num_experts
    delta = moe_mlp - 3 * h * arch.intermediate_size
    dense_here = len(range(layers.start, min(layers.stop, moe.dense_layers)))
    return (total + min(moe.dense_layers, n) * delta) * len(layers) / n - dense_here * delta


GROUP_SCALES = SourceCheck("layers/quantization/awq/schemes/awq_linear.py", 80, "scales = GroupQuantScaleParameter(")
GROUP_ZEROS = SourceCheck("layers/quantization/awq/schemes/awq_linear.py", 67, "qzeros = PackedvLLMParameter(")
DEFAULT_GROUP_SIZE = 128
"""The group size assumed for a 4-bit checkpoint whose config.json the planner has not read (AWQ's and GPTQ's
usual one); a config.json's ``quantization_config.group_size`` replaces it."""


def group_overhead_bytes_per_param(group_size: int) -> float:
    """A 4-bit group-quantised linear layer (AWQ, GPTQ) stores, per group of ``group_size`` input rows and per output
    column, one 16-bit scale (``scales``: [in / g, out] in the activations' dtype) and one 4-bit zero (``qzeros``:
    [in / g, out / 8] int32), so 2.5 / g bytes per parameter on top of the 0.5 B of the weight itself."""
    return 2.5 / group_size


SKIPPED_LAYER = SourceCheck(
    "layers/quantization/utils.py", 48, "def _module_path_match(ignored: str, prefix: str) -> bool:"
)
"""How SGLang's ``is_layer_skipped`` matches a module against the checkpoint's ignored names (dotted boundaries)."""


def module_path_match(ignored: str, prefix: str) -> bool:
    """SGLang's ``_module_path_match`` (:data:`SKIPPED_LAYER`): ``ignored`` names ``prefix`` itself, a parent of it,
    or a run of its dotted parts (``mlp.gate`` matches ``model.layers.3.mlp.gate`` but not ``mlp.gate_up_proj``)."""
    ignored, prefix = ignored.rstrip("."), prefix.rstrip(".")
    return ignored == prefix or prefix.startswith(ignored + ".") or f".{ignored}." in f".{prefix}."


def is_layer_skipped(prefix: str, ignored: tuple[str, ...]) -> bool:
    """SGLang's ``is_layer_skipped`` for one (unfused) projection or a MoE layer's ``experts``: an ignored name
    matching it (:func:`module_path_match`), or, for the experts, any ignored name naming one of them."""
    if any(module_path_match(m, prefix) for m in ignored):
        return True
    return prefix.endswith(".experts") and any(prefix in m for m in ignored if "experts" in m)


def layer_linears(arch: Architecture, i: int) -> list[tuple[str, int]]:
    """Layer ``i``'s quantisable linear projections as a checkpoint names them, with their parameters: attention
    q, k, v, o (not MLA's, whose low-rank shapes the architecture does not carry) and the MLP (dense gate, up, down;
    MoE: the routed experts as one module and the shared experts' projections)."""
    h, p = arch.hidden_size, f"model.layers.{i}."
    out: list[tuple[str, int]] = []
    if arch.mla is None:
        q, kv = arch.num_attention_heads * arch.head_dim * h, arch.num_kv_heads * arch.head_dim * h
        out += [(p + "self_attn.q_proj", q), (p + "self_attn.k_proj", kv), (p + "self_attn.v_proj", kv)]
        out.append((p + "self_attn.o_proj", q))
    moe = arch.moe
    if moe is not None and i >= moe.dense_layers and moe.intermediate_size is not None:
        out.append((p + "mlp.experts", moe.num_experts * 3 * h * moe.intermediate_size))
        out += [(f"{p}mlp.shared_experts.{n}", moe.shared_experts * h * moe.intermediate_size) for n in _MLP]
    elif arch.intermediate_size is not None:
        out += [(f"{p}mlp.{n}", h * arch.intermediate_size) for n in _MLP]
    return out


_MLP = ("gate_proj", "up_proj", "down_proj")


def unquantized_parameters(arch: Architecture, layers: range) -> tuple[int, list[str]]:
    """Parameters of ``layers``' projections the checkpoint keeps in 16 bit (``arch.unquantized_modules``), and
    which: each projection SGLang's ``is_layer_skipped`` would leave unquantised (:func:`is_layer_skipped`)."""
    names: list[str] = []
    params = 0
    if not arch.unquantized_modules:
        return 0, names
    for i in layers:
        for prefix, n in layer_linears(arch, i):
            if n and is_layer_skipped(prefix, arch.unquantized_modules):
                names.append(prefix)
                params += n
    return params, names


@dataclass(frozen=True)
class WeightShare:
    """The weights on one GPU of a pipeline stage: quantised layers plus 16-bit embedding and LM head."""

    stage: int
    layers: range
    layer_bytes: float
    embedding_bytes: float
    load_overhead_bytes: float
    formula: str

    @property
    def total(self) -> float:
        return self.layer_bytes + self.embedding_bytes + self.load_overhead_bytes

    @property
    def loaded_formula(self) -> str:
        """:attr:`formula` (the weights alone) with the load overhead added: what the KV pool's budget subtracts."""
        return f"{self.formula} + {self.load_overhead_bytes / GIB:.2f} GiB load overhead = {self.total / GIB:,.2f} GiB"


def checkpoint_stage_bytes(
    arch: Architecture, ckpt: CheckpointWeights, layers: range, tables: int
) -> tuple[float, float, str]:
    """A stage's bytes as the checkpoint declares them, before TP: its decoder layers and ``tables`` vocabulary
    tables (embedding / LM head). From the shard headers each layer's own bytes (whatever it keeps in 16 bit, its
    scales included) and the tables' own; from the index alone ``total_size`` less the tables (16 bit) split over
    the checkpoint's layers, a stage taking its layers' share of the counted parameters (:func:`stage_parameters`).
    Layers past ``num_hidden_layers`` (multi-token-prediction / draft layers) are not loaded with the model
    (deepseek-ai/DeepSeek-V3 ``README_WEIGHTS.md``, "Layer Loading Rules": the main model by ``num_hidden_layers``,
    the MTP modules by ``num_nextn_predict_layers``)."""
    n = arch.num_layers
    extra = [i for i in ckpt.layer_indices if i >= n]
    if ckpt.layers is not None:
        layer_bytes = float(sum(ckpt.layers.get(i, 0) for i in layers))
        emb, head = ckpt.embedding or 0, ckpt.lm_head or 0
        # One table: the first stage's embedding, or the last stage's head (the embedding's copy when tied).
        one = emb if layers.start == 0 else head or emb
        table_bytes = float(0 if tables == 0 else one if tables == 1 else emb + head)
        if layers.stop == n:
            layer_bytes += ckpt.other or 0
        skipped = float(sum(ckpt.layers.get(i, 0) for i in extra))
        how = f"{ckpt.method} of {ckpt.source}: layers {layers.start}–{layers.stop - 1} {layer_bytes / GIB:,.2f} GiB"
    else:
        table = arch.vocab_size * arch.hidden_size * 2
        body = ckpt.total_size - len(ckpt.table_tensors) * table
        loaded = body * (len(ckpt.layer_indices) - len(extra)) / len(ckpt.layer_indices)
        layer_bytes = loaded * stage_parameters(arch, layers) / stage_parameters(arch, range(n))
        table_bytes = float(tables * table)
        skipped = body - loaded
        how = (
            f"{ckpt.method} of {ckpt.source}: ({ckpt.total_size:,} B − {len(ckpt.table_tensors)} tables × "
            f"{table:,} B) × {len(ckpt.layer_indices) - len(extra)}/{len(ckpt.layer_indices)} layers loaded, "
            f"layers {layers.start}–{layers.stop - 1}'s share {layer_bytes / GIB:,.2f} GiB"
        )
    if extra:
        how += f" (layers {extra[0]}–{extra[-1]}, {skipped / GIB:,.2f} GiB: MTP/draft, not loaded)"
    return layer_bytes, table_bytes, how


def stage_weights(
    arch: Architecture,
    bytes_per_param: float,
    tp: int,
    pp: int,
    group_size: int | None = None,
    checkpoint: CheckpointWeights | None = None,
    attn_dp: int = 1,
) -> list[WeightShare]:
    """Each stage's weights per GPU: its layers' parameters (every expert) in the checkpoint's precision over
    TP, plus a group-quantised checkpoint's scales and zeros (``group_size``: 4-bit AWQ/GPTQ, see
    :func:`group_overhead_bytes_per_param`); the embedding on the first stage and the LM head on the last (kept 16-bit by every quantised
    checkpoint SGLang loads), over TP. Without PP one GPU holds both tables (one when tied); with PP the last
    stage holds its own LM head even when tied (SGLang builds ``embed_tokens`` there to tie it).

    With attention DP (``attn_dp`` > 1) the attention projections and the input embedding are split over the
    attention-TP group (TP / attn_dp GPUs) only, so each attention-DP group holds a whole copy
    (:func:`attention_dp_extra`); the MLP, the experts and the LM head stay over TP."""
    table = arch.vocab_size * arch.hidden_size
    load = LOAD_OVERHEAD_GIB * GIB
    per_param, bpp = bytes_per_param, f"{bytes_per_param:g} B"
    if group_size is not None:
        per_param += group_overhead_bytes_per_param(group_size)
        bpp = (
            f"({bytes_per_param:g} + 2.5 / group {group_size} = {per_param:.4f}) B (scales and zeros, "
            f"{GROUP_SCALES.where})"
        )
    out = []
    stages = pp_stage_layers(arch.num_layers, pp)
    for rank, layers in enumerate(stages):
        on_gpu = (1 if arch.tie_word_embeddings else 2) if pp == 1 else int(rank in (0, pp - 1))
        stage = (
            f"stage {rank + 1}/{pp}, layers {layers.start}–{layers.stop - 1} ({PP_PARTITION.where}): " if pp > 1 else ""
        )
        if checkpoint is not None:
            ckpt_layers, ckpt_tables, how = checkpoint_stage_bytes(arch, checkpoint, layers, on_gpu)
            layer_bytes, emb = ckpt_layers / tp, ckpt_tables / tp
            dp_bytes, dp_text = attention_dp_extra(
                arch, layers, ckpt_layers, ckpt_tables / on_gpu if on_gpu else 0, rank, tp, attn_dp
            )
            formula = (
                f"{stage}{how}; + {on_gpu} table(s) {ckpt_tables / GIB:,.2f} GiB; / TP {tp} = "
                f"{(layer_bytes + emb) / GIB:,.2f} GiB{dp_text}"
            )
            out.append(WeightShare(rank, layers, layer_bytes + dp_bytes, emb, load, formula))
            continue
        params = stage_parameters(arch, layers)
        kept, kept_names = unquantized_parameters(arch, layers) if per_param < 2 else (0, [])
        layer_bytes = (params * per_param + kept * (2 - per_param)) / tp
        emb = table * on_gpu * 2 / tp
        dp_bytes, dp_text = attention_dp_extra(arch, layers, params * per_param, table * 2, rank, tp, attn_dp)
        params_text = f"{params:,.0f} params × {bpp}"
        if kept:
            params_text = (
                f"({params - kept:,.0f} params × {bpp} + {kept:,} params of {len(kept_names)} projections the "
                f"checkpoint keeps in 16 bit (quantization_config, {SKIPPED_LAYER.where}) × 2 B)"
            )
        formula = (
            f"{stage}{params_text} / TP {tp} = {layer_bytes / GIB:,.2f} GiB + {on_gpu} × "
            f"{table:,} embedding params × 2 B / TP {tp} = {emb / GIB:,.2f} GiB = {(layer_bytes + emb) / GIB:,.2f} GiB"
            f"{dp_text}"
        )
        out.append(WeightShare(rank, layers, layer_bytes + dp_bytes, emb, load, formula))
    return out


ATTN_TP_HEADS = SourceCheck("models/deepseek_v2.py", 2058, "self.num_local_heads = num_heads // attn_tp_size")
"""DeepSeek's attention projections are built over the attention-TP group (``parallel_group="attn_tp"``)."""
ATTN_TP_EMBEDDING = SourceCheck(
    "layers/vocab_parallel_embedding.py",
    185,
    'return {"enable_tp": True, "use_attn_tp_group": is_dp_attention_enabled()}',
)
"""The input embedding is vocab-sharded over the attention-TP group under DP attention."""


def layer_attention_parameters(arch: Architecture) -> int:
    """One layer's attention parameters: counted from config.json (:attr:`Architecture.attention_parameters`),
    else GQA's q, k, v, o from the heads. An MLA model without the count is refused by the spec under DP
    attention (its low-rank shapes are not in :class:`Architecture`)."""
    if arch.attention_parameters is not None:
        return arch.attention_parameters
    q, kv = arch.num_attention_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    return arch.hidden_size * (2 * q + 2 * kv)


def attention_dp_extra(
    arch: Architecture,
    layers: range,
    layer_bytes: float,
    table_bytes: float,
    rank: int,
    tp: int,
    attn_dp: int,
) -> tuple[float, str]:
    """What attention DP adds to a stage's GPU over an even TP split (``layer_bytes``: the stage's layers before
    TP; ``table_bytes``: one vocabulary table): its attention share, ``layer_bytes`` × the attention parameters'
    fraction of the layers (:func:`layer_attention_parameters`), over attention-TP instead of TP
    (:data:`ATTN_TP_HEADS`), and the embedding (first stage) likewise (:data:`ATTN_TP_EMBEDDING`). Zero
    without attention DP."""
    if attn_dp == 1:
        return 0.0, ""
    attn_tp = tp // attn_dp
    share = layer_attention_parameters(arch) * len(layers) / stage_parameters(arch, layers)
    attn = layer_bytes * share
    emb = table_bytes if rank == 0 else 0.0
    extra = (attn + emb) * (1 / attn_tp - 1 / tp)
    text = (
        f"; attention DP {attn_dp}: attention {attn / GIB:,.2f} GiB ({share:.1%} of the layers, {ATTN_TP_HEADS.where})"
        + (f" and embedding {emb / GIB:,.2f} GiB ({ATTN_TP_EMBEDDING.where})" if emb else "")
        + f" over attention-TP {attn_tp}, not TP {tp}: + {extra / GIB:,.2f} GiB"
    )
    return extra, text


KV_HEADS_ATTN_TP = SourceCheck("model_executor/pool_configurator.py", 356, "tp_size = get_parallel().attn_tp_size")
"""``_compute_cell_size`` splits the KV heads over the attention-TP size (TP / attn_dp), not TP."""


def kv_cell_bytes(arch: Architecture, bytes_per_element: int, tp: int, layers: int) -> int:
    """SGLang's cell size on one GPU holding ``layers`` layers: MLA's latent whole on every TP rank, else K and V
    of max(1, KV heads // ``tp``) heads (``ModelConfig.get_num_kv_heads``); ``tp`` is the attention-TP size
    (:data:`KV_HEADS_ATTN_TP`)."""
    if arch.mla is not None:
        return layers * (arch.mla.kv_lora_rank + arch.mla.qk_rope_head_dim) * bytes_per_element
    return 2 * layers * max(1, arch.num_kv_heads // tp) * arch.head_dim * bytes_per_element


def kv_token_bytes_per_gpu(arch: Architecture, bytes_per_element: int, tp: int, pp: int) -> int:
    """The cell size on the fullest stage's GPUs (⌈layers / PP⌉ layers: the last stage's, per ``get_pp_indices``)."""
    return kv_cell_bytes(arch, bytes_per_element, tp, math.ceil(arch.num_layers / pp))


# ------------------------------------------------------------------------------ speculative decoding

DRAFT_WEIGHTS = SourceCheck(
    "mem_cache/kv_cache_configurator.py", 3042, "# Loaded weights (target + draft) can exceed the static budget"
)
"""The KV budget is what is free after the target's AND the draft's weights loaded."""
DRAFT_KV = SourceCheck(
    "model_executor/pool_configurator.py", 312, "self._cell_size * draft_num_layers / int(num_layers)"
)
"""EAGLE family: the cell grows by ``int(cell × draft layers / layers)``: the draft's KV beside the target's."""
NEXTN_DRAFT_LAYERS = SourceCheck(
    "model_executor/model_runner_components/spec_aux_hidden_state.py",
    174,
    "config.eagle_draft_num_layers = int(num_nextn_predict_layers)",
)
"""NEXTN's draft KV layers are config.json's ``num_nextn_predict_layers``; a separate draft's its layers."""
DRAFT_TABLES_FREED_LATE = SourceCheck("speculative/eagle_worker_v2.py", 258, "self.init_lm_head()")
"""The draft's own embedding and LM head are swapped for the target's (``set_embed_and_head``, ``:378``; EAGLE3
``set_embed``, ``:363``, keeps its head) in ``alloc_memory_pool`` → ``init_lm_head``, which the scheduler calls only
after it sized the target's pool (``managers/scheduler.py: init_memory_pools``): the pool is sized with them held."""
NEXTN_EMBED = SourceCheck("models/deepseek_nextn.py", 83, "self.embed_tokens = VocabParallelEmbedding(")
"""DeepSeek's MTP layer builds its own embedding (split as the target's: over attention-TP under attention DP)."""
NEXTN_HEAD = SourceCheck("models/deepseek_nextn.py", 294, "self.lm_head = ParallelLMHead(")
"""… and its own LM head, over TP (``use_attn_tp_group`` only with ``--enable-dp-lm-head``)."""
NEXTN_EH_PROJ = SourceCheck("models/deepseek_nextn.py", 102, "self.eh_proj = nn.Linear(")
"""DeepSeek's MTP layer joins the embedding and hidden state with an unquantised, unsharded 2h → h projection."""


@dataclass(frozen=True)
class DraftShare:
    """A speculative draft on one GPU: its weights and the KV layers it adds to the cell."""

    weights: float
    kv_layers: int
    formula: str


def draft_share(
    arch: Architecture, spec: SpeculativeSpec, bytes_per_param: float, tp: int, attn_dp: int = 1
) -> DraftShare:
    """The draft's weights per GPU when SGLang 0.5.23 sizes the pool (:data:`DRAFT_WEIGHTS`), and its KV layers.

    The draft is whole then, its own vocabulary tables included: they are swapped for the target's only after
    the pool is sized (:data:`DRAFT_TABLES_FREED_LATE`), so they take pool memory for good.
    NEXTN (MTP): ``nextn_layers`` decoder layers shaped as the target's last (a MoE layer for DeepSeek), in the
    target's precision over TP (the attention over attention-TP under attention DP), plus the 16-bit 2h × h
    ``eh_proj`` whole on every GPU (:data:`NEXTN_EH_PROJ`), its 16-bit embedding over attention-TP
    (:data:`NEXTN_EMBED`, :data:`ATTN_TP_EMBEDDING`) and LM head over TP (:data:`NEXTN_HEAD`). EAGLE / EAGLE3:
    the draft config's parameters in 16 bit over TP (its embedding and head built over TP; EAGLE3's head has
    ``draft_vocab_size`` rows), plus its unsharded ``fc`` (2h → h; EAGLE3 3h → h). KV layers:
    :data:`NEXTN_DRAFT_LAYERS`, or the draft's."""
    h = arch.hidden_size
    if spec.algorithm == "NEXTN":
        n = arch.num_layers
        layer = stage_parameters(arch, range(n - 1, n)) * bytes_per_param
        dp_extra, dp_text = attention_dp_extra(arch, range(n - 1, n), layer, 0.0, 1, tp, attn_dp)
        layers_bytes = arch.nextn_layers * (layer / tp + dp_extra)
        eh = 2 * h * h * 2.0 * arch.nextn_layers
        table = arch.vocab_size * h * 2.0
        tables = table / (tp // attn_dp) + table / tp
        total = layers_bytes + eh + tables
        return DraftShare(
            total,
            arch.nextn_layers,
            f"NEXTN draft: {arch.nextn_layers} MTP layer(s) × (one decoder layer {layer / GIB:,.2f} GiB / TP {tp}"
            f"{dp_text}) + eh_proj 2 × {h} × {h} × 2 B unsharded ({NEXTN_EH_PROJ.where}) + its own embedding "
            f"{table / GIB:,.2f} GiB / attention-TP {tp // attn_dp} ({NEXTN_EMBED.where}) and LM head / TP {tp} "
            f"({NEXTN_HEAD.where}), held while the pool is sized ({DRAFT_TABLES_FREED_LATE.where}) "
            f"= {total / GIB:,.2f} GiB",
        )
    draft = spec.draft_architecture
    if draft is None:  # the spec refuses an EAGLE draft without its architecture
        raise ValueError(f"speculative.algorithm {spec.algorithm} needs speculative.draft_architecture")
    dh = draft.hidden_size
    tables = draft.vocab_size * dh * (1 if draft.tie_word_embeddings else 2)
    head_rows = (spec.draft_vocab_size or draft.vocab_size) if spec.algorithm == "EAGLE3" else draft.vocab_size
    own = draft.vocab_size * dh + (0 if draft.tie_word_embeddings else head_rows * dh)
    fc = (3 if spec.algorithm == "EAGLE3" else 2) * dh * dh
    params = draft.parameter_count - tables + own
    total = params * 2.0 / tp + fc * 2.0
    return DraftShare(
        total,
        draft.num_layers,
        f"{spec.algorithm} draft: {params:,} params (its own embedding"
        + ("" if draft.tie_word_embeddings else f" and {head_rows:,}-row LM head")
        + f", held while the pool is sized, {DRAFT_TABLES_FREED_LATE.where}) × 2 B / TP {tp} "
        f"+ fc {fc:,} params × 2 B unsharded = {total / GIB:,.2f} GiB",
    )


def draft_cell_bytes(cell: int, stage_layers: int, draft_layers: int) -> int:
    """The cell with the draft's KV: ``cell + int(cell × draft_layers / stage_layers)`` (:data:`DRAFT_KV`)."""
    return cell + int(cell * draft_layers / stage_layers) if draft_layers and stage_layers else cell


# ------------------------------------------------------------------------------------------ the pool


@dataclass(frozen=True)
class KvPool:
    free_at_start: float
    mem_fraction_static: float
    weights: float
    budget: float
    tokens: int
    formula: str


def kv_pool(free_at_start: float, mem_fraction_static: float, weights: float, kv_bytes_per_token_gpu: int) -> KvPool:
    """``_profile_available_bytes`` + ``DefaultPoolConfigurator.calculate_pool_sizes`` (page size 1)."""
    budget = free_at_start * mem_fraction_static - weights
    tokens = max(0, int(budget // kv_bytes_per_token_gpu)) if kv_bytes_per_token_gpu else 0
    formula = (
        f"{free_at_start / GIB:,.2f} GiB free at start × {mem_fraction_static:.3f} − {weights / GIB:,.2f} GiB weights "
        f"and load overhead = {budget / GIB:,.2f} GiB / {kv_bytes_per_token_gpu:,} B per token = {tokens:,} tokens"
    )
    return KvPool(free_at_start, mem_fraction_static, weights, budget, tokens, formula)


@dataclass(frozen=True)
class ReplicaPool:
    """The replica's pool: each stage's, and the stage whose token count SGLang keeps (the minimum)."""

    stages: list[tuple[WeightShare, int, KvPool]]
    """Per stage: its weights, its cell size per token, its pool."""
    binding: int
    """The stage with the fewest tokens."""

    @property
    def weights(self) -> WeightShare:
        return self.stages[self.binding][0]

    @property
    def cell_bytes(self) -> int:
        return self.stages[self.binding][1]

    @property
    def pool(self) -> KvPool:
        return self.stages[self.binding][2]

    @property
    def tokens(self) -> int:
        return self.pool.tokens

    @property
    def formula(self) -> str:
        text = self.pool.formula
        if len(self.stages) > 1:
            others = ", ".join(f"stage {w.stage + 1} {p.tokens:,}" for w, _, p in self.stages)
            text += f"; min over stages ({PP_MIN_TOKENS.where}): {others}"
        return text


def replica_pool(
    arch: Architecture,
    bytes_per_param: float,
    kv_bytes_per_element: int,
    tp: int,
    pp: int,
    free_at_start: float,
    mem_fraction_static: float,
    group_size: int | None = None,
    checkpoint: CheckpointWeights | None = None,
    attn_dp: int = 1,
    draft: DraftShare | None = None,
) -> ReplicaPool:
    """Every stage's pool by its own weights and layers (counted from ``checkpoint`` where the stack names one);
    the replica's token count is the minimum over the stages, as SGLang's PP ranks agree on it. With attention
    DP that count is each attention-DP group's own pool, its KV heads split over attention-TP
    (:data:`KV_HEADS_ATTN_TP`)."""
    stages = []
    for share in stage_weights(arch, bytes_per_param, tp, pp, group_size, checkpoint, attn_dp):
        cell = kv_cell_bytes(arch, kv_bytes_per_element, tp // attn_dp, len(share.layers))
        weights = share.total
        if draft is not None:
            cell = draft_cell_bytes(cell, len(share.layers), draft.kv_layers)
            weights += draft.weights
        stages.append((share, cell, kv_pool(free_at_start, mem_fraction_static, weights, cell)))
    binding = min(range(len(stages)), key=lambda i: (stages[i][2].tokens, -i))
    return ReplicaPool(stages, binding)


# ------------------------------------------------------------------------------------------ fit


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
    attn_dp: int = 1
    """Attention-DP groups inside the TP group (``--attn-dp-size``); each has its own pool of ``kv_pool_tokens``."""
    rank_reason: str = ""
    """Why the layout ranks where it does: against the one above it."""

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp


@dataclass(frozen=True)
class Excluded:
    """A precision × TP size SGLang refuses to start, and why (each reason with the source check it mirrors)."""

    precision: str
    tp: int
    reasons: tuple[str, ...]
    attn_dp: int = 1


@dataclass(frozen=True)
class FitResult:
    layouts: list[Layout]
    """Ranked: most served sequences first; at equal capacity more bits, fewer GPUs, fewer PP stages, 16-bit KV."""
    excluded: list[Excluded]


KV_DTYPES: dict[str, int] = {"auto": 2, "fp8_e4m3": 1}


RUNNING_PER_WORKER = SourceCheck(
    "mem_cache/kv_cache_configurator.py", 3128, "requested_per_worker = max(1, max_num_reqs // self.attn_dp_size)"
)
"""Each attention-DP worker takes ``max(1, --max-running-requests // attn_dp)`` of the requests."""


def running_requests_per_replica(max_running_requests: int, attn_dp: int) -> int:
    """The requests a replica runs at most: each of its ``attn_dp`` workers ``max(1, max_running_requests //
    attn_dp)`` (:data:`RUNNING_PER_WORKER`), so ``max_running_requests`` itself without attention DP, and
    neither less (a remainder is dropped) nor fewer than ``attn_dp``."""
    return max(1, max_running_requests // attn_dp) * attn_dp


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


def _rank_key(lay: Layout) -> tuple[int, float, int, int, int, int]:
    return (
        -lay.served_sequences,
        -PRECISION_BYTES[lay.precision],
        lay.gpus_per_replica,
        lay.pp,
        lay.attn_dp,
        -KV_DTYPES[lay.kv_cache_dtype],
    )


def _rank_reason(rank: int, lay: Layout, above: Layout | None) -> str:
    """Why ``lay`` (at ``rank``, from 1) ranks below ``above``: the first ranking field that differs."""
    if above is None:
        return f"#1: most served sequences ({lay.served_sequences:,})"
    if lay.served_sequences < above.served_sequences:
        return f"serves {lay.served_sequences:,} < #{rank - 1}'s {above.served_sequences:,}"
    tie = f"ties #{rank - 1} at {lay.served_sequences:,}"
    if PRECISION_BYTES[lay.precision] < PRECISION_BYTES[above.precision]:
        return f"{tie}; {lay.precision} weights: fewer bits than {above.precision}"
    if lay.gpus_per_replica > above.gpus_per_replica:
        return f"{tie}; {lay.gpus_per_replica} GPUs a replica, not {above.gpus_per_replica}"
    if lay.pp > above.pp:
        return f"{tie}; PP {lay.pp} > PP {above.pp}: pipeline bubbles, more latency"
    if lay.attn_dp > above.attn_dp:
        return f"{tie}; attention DP {lay.attn_dp} > {above.attn_dp}: replicated attention, larger graph reserve"
    if KV_DTYPES[lay.kv_cache_dtype] < KV_DTYPES[above.kv_cache_dtype]:
        return f"{tie}; FP8 KV cache below 16-bit (accuracy)"
    return f"{tie} on every ranked field"


def enumerate_layouts(
    arch: Architecture,
    gpu: GpuProduct,
    gpus_per_node: int,
    nodes: int,
    context_length: int,
    max_running_requests: int,
    chunked_prefill_size: int,
    precisions: tuple[str, ...],
    checkpoint: CheckpointWeights | None = None,
) -> FitResult:
    """Every precision × KV dtype × TP × PP (powers of two, a replica within a node or over whole nodes)
    that SGLang starts (:func:`serving.plan.divisibility.rejections`) and whose KV pool holds at least one
    full-length sequence, ranked (:class:`FitResult`); the TP sizes SGLang rejects with their reasons. With
    ``checkpoint`` the weights are that checkpoint's bytes (one precision). A model whose attention splits over
    attention-TP (DeepSeek, Qwen-MoE) is also tried with
    full attention DP (``attn_dp`` = TP, attention-TP 1: DeepSeek's published ``--tp 8 --dp 8
    --enable-dp-attention``), where each GPU runs its own scheduler and pool and takes ``max_running_requests /
    attn_dp`` of the requests (``resolve_max_num_reqs``); intermediate sizes are not searched."""
    out: list[Layout] = []
    excluded: list[Excluded] = []
    total_gpus = gpus_per_node * nodes
    for precision in precisions:
        bpp = PRECISION_BYTES[precision]
        for tp, attn_dp in ((t, d) for t in _powers_of_two(min(total_gpus, 64)) for d in _attn_dp_sizes(arch, t)):
            reasons = rejections(arch, tp, precision, attn_dp=attn_dp)
            if reasons:
                # a TP size refused without attention DP is listed once, not again for each attention-DP size
                if not any(e.precision == precision and e.tp == tp for e in excluded):
                    excluded.append(Excluded(precision, tp, tuple(reasons), attn_dp))
                continue
            free = free_at_start_bytes(gpu, tp)
            running = running_requests_per_replica(max_running_requests, attn_dp)
            for pp in _powers_of_two(min(total_gpus // tp, 16, arch.num_layers)):
                gpr = tp * pp
                if gpr > gpus_per_node and gpr % gpus_per_node:
                    continue
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
                for kv_dtype, kv_bytes in KV_DTYPES.items():
                    rp = replica_pool(arch, bpp, kv_bytes, tp, pp, free, fraction, group, checkpoint, attn_dp)
                    seqs = min(running, rp.tokens // context_length * attn_dp)
                    if seqs < 1:
                        continue
                    if gpr <= gpus_per_node:
                        rpn: int | None = gpus_per_node // gpr
                        replicas, span = nodes * (gpus_per_node // gpr), 1
                    else:
                        rpn, span = None, gpr // gpus_per_node
                        replicas = nodes // span
                    out.append(
                        Layout(
                            precision,
                            kv_dtype,
                            tp,
                            pp,
                            replicas,
                            rpn,
                            span,
                            fraction,
                            max(w.total for w, _, _ in rp.stages),
                            rp.tokens,
                            seqs,
                            seqs * replicas,
                            f"weights {rp.weights.loaded_formula}; KV pool {rp.formula}"
                            + (f"; × {attn_dp} attention-DP pools" if attn_dp > 1 else ""),
                            attn_dp,
                        )
                    )
    out.sort(key=_rank_key)
    ranked = [
        replace(lay, rank_reason=_rank_reason(i + 1, lay, out[i - 1] if i else None)) for i, lay in enumerate(out)
    ]
    return FitResult(ranked, excluded)
