"""What a GPU has free when SGLang starts loading the weights, and what loading adds: the GPU products the planner knows
and the public start-up logs its constants are fitted on.

The free-at-start figure and the weights' load-time overhead come from public start-up logs
(:data:`CALIBRATION_LOGS`); every constant is derived from them here, none is typed in twice. Other public logs
(:data:`HELD_OUT_LOGS`) are kept out of the fit and predicted, to measure the model's accuracy
(:mod:`serving.plan.memory` holds the arithmetic they feed).
"""

from __future__ import annotations

from dataclasses import dataclass

from serving.plan.divisibility import SourceCheck
from serving.spec.schema import GIB, count_parameters

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
    speed: GpuSpeed | None = None
    """The datasheet's bandwidths and peaks (:mod:`serving.plan.latency` prices a decode step with them)."""


@dataclass(frozen=True)
class GpuSpeed:
    """A GPU's datasheet figures, dense (no sparsity), decimal units: what bounds one decode step from below."""

    hbm_gb_s: float
    """Memory bandwidth, GB/s."""
    tflops_16bit: float
    """Dense BF16/FP16 tensor-core peak, TFLOPS."""
    tflops_fp8: float | None
    """Dense FP8 tensor-core peak, TFLOPS; None before Ada/Hopper, where SGLang runs FP8 weights as W8A16 (Marlin,
    ``layers/quantization/fp8.py:512``) at the 16-bit peak."""
    tflops_int8: float
    """Dense INT8 tensor-core peak, TOPS (``w8a8_int8``)."""
    link_gb_s: float
    """GPU-to-GPU bandwidth inside a node, one direction, GB/s: NVLink on SXM/HGX boards, else PCIe."""
    source: str


_A100 = "NVIDIA A100 Tensor Core GPU datasheet (SXM4): BF16 312 TFLOPS, INT8 624 TOPS dense; NVLink 600 GB/s"
_HOPPER = "NVIDIA {} datasheet (SXM): BF16 989 TFLOPS, FP8 1,979 TFLOPS, INT8 1,979 TOPS dense ({}); NVLink 900 GB/s"
_ADA_PCIE = "PCIe Gen4 x16, 32 GB/s a direction"

GPU_PRODUCTS: dict[str, GpuProduct] = {
    g.label: g
    for g in (
        GpuProduct(
            "NVIDIA-A100-SXM4-40GB",
            40_960,
            "NVIDIA A100 datasheet: 40 GiB HBM2 (nvidia-smi 40960MiB)",
            nvlink=True,
            speed=GpuSpeed(1_555, 312, None, 624, 300, f"{_A100}; HBM2 1,555 GB/s"),
        ),
        GpuProduct(
            "NVIDIA-A100-SXM4-80GB",
            81_920,
            "NVIDIA A100 datasheet: 80 GiB HBM2e (nvidia-smi 81920MiB)",
            nvlink=True,
            speed=GpuSpeed(2_039, 312, None, 624, 300, f"{_A100}; HBM2e 2,039 GB/s"),
        ),
        GpuProduct(
            "NVIDIA-H100-80GB-HBM3",
            81_559,
            "nvidia-smi on H100 SXM5: 81559MiB",
            nvlink=True,
            speed=GpuSpeed(3_350, 989, 1_979, 1_979, 450, _HOPPER.format("H100 Tensor Core GPU", "HBM3 3.35 TB/s")),
        ),
        GpuProduct(
            "NVIDIA-H20",
            97_871,
            "nvidia-smi on H20: 97871MiB",
            nvlink=True,
            speed=GpuSpeed(
                4_000,
                148,
                296,
                296,
                450,
                "NVIDIA H20 product brief: BF16 148, FP8 296 TFLOPS, INT8 296 TOPS dense; HBM3 4.0 TB/s; NVLink 900 "
                "GB/s",
            ),
        ),
        GpuProduct(
            "NVIDIA-H200",
            143_771,
            "nvidia-smi on H200 SXM: 143771MiB",
            nvlink=True,
            speed=GpuSpeed(4_800, 989, 1_979, 1_979, 450, _HOPPER.format("H200 Tensor Core GPU", "HBM3e 4.8 TB/s")),
        ),
        GpuProduct(
            "NVIDIA-B200",
            183_359,
            "nvidia-smi on B200: 183359MiB",
            nvlink=True,
            speed=GpuSpeed(
                8_000,
                2_250,
                4_500,
                4_500,
                900,
                "NVIDIA HGX B200 datasheet, per GPU (8 a board): BF16 2.25, FP8 4.5 PFLOPS, INT8 4.5 POPS dense; HBM3e "
                "8 TB/s; NVLink 1.8 TB/s",
            ),
        ),
        GpuProduct(
            "NVIDIA-L40S",
            46_068,
            "nvidia-smi in https://github.com/sgl-project/sglang/pull/13023: 46068MiB",
            speed=GpuSpeed(
                864,
                362,
                733,
                733,
                32,
                f"NVIDIA L40S datasheet: BF16 362, FP8 733 TFLOPS, INT8 733 TOPS dense; 864 GB/s; {_ADA_PCIE}",
            ),
        ),
        GpuProduct(
            "NVIDIA-L4",
            23_034,
            "nvidia-smi on L4: 23034MiB",
            speed=GpuSpeed(
                300,
                121,
                242,
                242,
                32,
                f"NVIDIA L4 datasheet: BF16 121, FP8 242 TFLOPS, INT8 242 TOPS dense; 300 GB/s; {_ADA_PCIE}",
            ),
        ),
        GpuProduct(
            "NVIDIA-GeForce-RTX-4090",
            24_564,
            "https://github.com/sgl-project/sglang-omni/issues/1168: 'RTX 4090, 24,564 MiB'",
            speed=GpuSpeed(
                1_008,
                165,
                330,
                661,
                32,
                "NVIDIA Ada Lovelace architecture whitepaper, RTX 4090: FP16 165.2, FP8 330.3 TFLOPS (FP32 accumulate), "
                f"INT8 660.6 TOPS dense; 1,008 GB/s; {_ADA_PCIE}",
            ),
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
            "serving/plan/calibration.py GPU_PRODUCTS with its nvidia-smi memory.total"
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
            # an FP8 checkpoint (block 128, as models/qwen3-235b-a22b-fp8 records it): SGLang loads it as FP8
            "quantization_config": {
                "quant_method": "fp8",
                "activation_scheme": "dynamic",
                "weight_block_size": [128, 128],
            },
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
            # an FP8 checkpoint (block 128, as models/qwen3-235b-a22b-fp8 records it): SGLang loads it as FP8
            "quantization_config": {
                "quant_method": "fp8",
                "activation_scheme": "dynamic",
                "weight_block_size": [128, 128],
            },
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
    """A public log of free memory before the weights load (``Load weight begin. avail mem=``, the minimum over the
    ranks as SGLang takes it, or ``Load weight end`` avail + mem usage) on an NVLink node with more than one GPU in
    the world. SGLang prints GiB as "GB" (``utils/common.py``: ``free_gpu_memory / (1 << 30)``)."""

    name: str
    source: str
    sglang: str
    gpu: str
    tp: int
    pp: int
    free_at_start_gib: float
    rank0_gib: float | None = None
    """Where the log prints every rank: rank 0's figure beside the minimum (``free_at_start_gib``); None where it shows
    rank 0 alone, whose figure is then an upper bound of the minimum SGLang takes (:func:`rank0_spread_gib`)."""


_INDEXED = "the search index holds its text but not its address"

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
        rank0_gib=137.34,
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
    FreeAtStartLog(
        name="8 × H100 80 GB, TP 8 (Grok-2)",
        source="'Grok2 OnPrem Deployment via sglang' (Shivank Chaudhary, 2025-09-14; " + _INDEXED + "): image "
        "lmsysorg/sglang:v0.5.2rc2-cu126, --tp 8, the MoE kernel configs name NVIDIA_H100_80GB_HBM3; 'Init torch "
        "distributed ends. mem usage=1.25 GB', '[TP0] Load weight begin. avail mem=77.43 GB'",
        sglang="0.5.2rc2",
        gpu="NVIDIA-H100-80GB-HBM3",
        tp=8,
        pp=1,
        free_at_start_gib=77.43,
    ),
    FreeAtStartLog(
        name="8 × B200, TP 8 with attention DP 8",
        source="https://github.com/sgl-project/sglang/pull/5390 (description: 'Load weight begin. avail mem=175.25 "
        "GB' on most ranks, 175.37 on TP0, 175.87 on TP7); the GPU is inferred: the PR adds a Blackwell (SM100) MLA "
        "kernel and 175 GiB free fits only a B200 of the table",
        sglang="main of 2025-04",
        gpu="NVIDIA-B200",
        tp=8,
        pp=1,
        free_at_start_gib=175.25,
        rank0_gib=175.37,
    ),
    FreeAtStartLog(
        name="8 × H20, TP 8 (DeepSeek-V4-Flash-Base)",
        source="a public capacity-analyzer test fixture quoting a 2026-05-15 SGLang log (" + _INDEXED + "): "
        "'Load weight begin. avail mem=93.56 GB' on TP1–TP6 (93.61 on TP0), tp_size=8, its comment names the H20",
        sglang="main of 2026-05",
        gpu="NVIDIA-H20",
        tp=8,
        pp=1,
        free_at_start_gib=93.56,
        rank0_gib=93.61,
    ),
)
"""The NVLink logs :func:`nvlink_overhead_gib` is fitted on, each product on its own."""

NVLINK_HELD_OUT: tuple[FreeAtStartLog, ...] = (
    FreeAtStartLog(
        name="8 × H100 80 GB (GCP a3-megagpu-8g), TP 8 (GLM-5.2 W4AFP8)",
        source="https://github.com/anthony-chaudhary/fak (GLM52-GCP-DOGFOOD-BRINGUP-2026-07-05.md: 'launching sglang "
        "for PhalaCloud/GLM-5.2-W4AFP8 (tp=8 ...)', 'Load weight begin. avail mem=77.33 GB')",
        sglang="0.5.14",
        gpu="NVIDIA-H100-80GB-HBM3",
        tp=8,
        pp=1,
        free_at_start_gib=77.33,
    ),
    FreeAtStartLog(
        name="4 × B200, TP 4 (DeepSeek-V3 NVFP4)",
        source="https://github.com/sgl-project/sglang/pull/9162 (description: 'Load weight begin. avail mem=175.34 "
        "GB'); the GPU is inferred as for pull/5390: trtllm-gen NVFP4 MoE runs on Blackwell only",
        sglang="main of 2025-08",
        gpu="NVIDIA-B200",
        tp=4,
        pp=1,
        free_at_start_gib=175.34,
    ),
)
"""NVLink logs kept out of the fit: :func:`free_at_start_bytes` predicts them (``tests/test_memory_model.py``)."""

NVLINK_EXTRAPOLATED: dict[str, str] = {
    "NVIDIA-A100-SXM4-40GB": "NVIDIA-H100-80GB-HBM3",
    "NVIDIA-A100-SXM4-80GB": "NVIDIA-H100-80GB-HBM3",
}
"""NVLink products without a log, and the calibrated product whose figure they take: the A100s the H100's (the
nearest NVLink generation; an A100 node has fewer NVLink lanes a GPU, so NCCL sets up no more channels there)."""

TP_GROUP = SourceCheck("distributed/parallel_state.py", 2686, "_TP = init_model_parallel_group(")
"""The TP group: a PyNCCL communicator and SGLang's custom all-reduce (on NVLink)."""
PP_GROUP = SourceCheck("distributed/parallel_state.py", 2962, "_PP = init_model_parallel_group(")
"""The PP group: no custom all-reduce, but a PyNCCL communicator (``use_pynccl`` is not passed, so on for CUDA)."""
PYNCCL_ON_CUDA = SourceCheck("distributed/parallel_state.py", 2185, "use_pynccl = not (_is_npu or _is_xpu")
PYNCCL_EAGER = SourceCheck("distributed/parallel_state.py", 463, "if use_pynccl and self.world_size > 1:")
"""Each group of more than one GPU creates its PyNCCL communicator (and warms it up) as it is built."""
FREE_MIN_OVER_WORLD = SourceCheck("distributed/bootstrap.py", 207, "pre_model_load_memory = get_available_gpu_memory(")
"""Free memory before the weights is measured after the groups exist, the minimum over the world's ranks."""
FREE_AT_START_SOURCE = (TP_GROUP, PP_GROUP, PYNCCL_ON_CUDA, PYNCCL_EAGER, FREE_MIN_OVER_WORLD)


def rank0_spread_gib() -> float:
    """How much more rank 0 has free than the minimum over the ranks, the largest seen in the logs that print every
    rank: a rank-0-only figure less this is what the minimum may be."""
    return max(c.rank0_gib - c.free_at_start_gib for c in NVLINK_LOGS if c.rank0_gib is not None)


RANK0_SPREAD_GIB = rank0_spread_gib()


def _least_free(c: FreeAtStartLog) -> float:
    """A log's free memory at start as SGLang uses it: the minimum over ranks, or rank 0's less the spread."""
    return c.free_at_start_gib if c.rank0_gib is not None else c.free_at_start_gib - RANK0_SPREAD_GIB


def _nvlink_overhead(label: str) -> tuple[float, str]:
    """:func:`nvlink_overhead_gib` of one NVLink product, from its own logs or those of the product it borrows."""
    own = [c for c in NVLINK_LOGS if c.gpu == label]
    like = label if own else NVLINK_EXTRAPOLATED[label]
    logs = own or [c for c in NVLINK_LOGS if c.gpu == like]
    gap = max(GPU_PRODUCTS[c.gpu].memory_total_mib * MIB / GIB - _least_free(c) for c in logs)
    how = f"calibrated on {len(own)} {label} log(s)" if own else f"extrapolated from the {like} log(s)"
    return gap - RUNTIME_OVERHEAD_GIB, how


NVLINK_OVERHEAD_GIB: dict[str, tuple[float, str]] = {
    g.label: _nvlink_overhead(g.label) for g in GPU_PRODUCTS.values() if g.nvlink
}
"""Every NVLink product's extra and where it comes from, derived once from the logs (``fit`` asks per layout)."""


def nvlink_overhead_gib(gpu: GpuProduct) -> tuple[float, str]:
    """What an NVLink node with more than one GPU in the world takes before the weights beyond the TP-1/PCIe runtime
    overhead, GiB, and where the figure comes from: NCCL's peer buffers of the TP and PP groups' communicators and
    SGLang's custom all-reduce, all set up before the measurement (:data:`FREE_AT_START_SOURCE`). The widest gap
    (the least free memory, as SGLang takes the minimum over ranks: :func:`_least_free`) over the product's own
    :data:`NVLINK_LOGS` (calibrated), else over the product :data:`NVLINK_EXTRAPOLATED` names (extrapolated); every
    NVLink product of the table has one or the other (``tests/test_memory_model.py``)."""
    return NVLINK_OVERHEAD_GIB[gpu.label]


def runtime_overhead_for(gpu: GpuProduct, tp: int, pp: int = 1) -> tuple[float, str]:
    """Memory gone before the weights load, GiB, and why: the CUDA context and allocator (the PCIe logs' mean), plus
    on an NVLink product with more than one GPU in the world (TP × PP) the NCCL and all-reduce buffers
    (:func:`nvlink_overhead_gib`). SGLang takes the minimum over every rank of the world, all nodes included."""
    if gpu.nvlink and tp * pp > 1:
        extra, how = nvlink_overhead_gib(gpu)
        return RUNTIME_OVERHEAD_GIB + extra, (
            f"{RUNTIME_OVERHEAD_GIB:.2f} GiB runtime + {extra:.2f} GiB NCCL and all-reduce buffers of a "
            f"{tp * pp}-GPU world over NVLink ({how})"
        )
    why = "one GPU" if tp * pp == 1 else "no NVLink"
    return RUNTIME_OVERHEAD_GIB, f"{RUNTIME_OVERHEAD_GIB:.2f} GiB runtime; {why}, no NVLink peer buffers"


def free_at_start_bytes(gpu: GpuProduct, tp: int = 1, pp: int = 1) -> float:
    """Free memory when SGLang starts loading weights: logged where a (PCIe) log of the product exists, else
    memory.total less the runtime overhead for this product and world (:func:`runtime_overhead_for`)."""
    observed = OBSERVED_FREE_AT_START_GIB.get(gpu.label)
    if observed is not None:
        return observed * GIB
    return gpu.memory_total_mib * MIB - runtime_overhead_for(gpu, tp, pp)[0] * GIB
