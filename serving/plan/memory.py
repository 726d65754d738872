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

The free-at-start figure comes from public start-up logs (:mod:`serving.plan.calibration`), the weights on each GPU
from :mod:`serving.plan.weights`; :mod:`serving.plan.fit` ranks the layouts this arithmetic sizes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from serving.plan.divisibility import SourceCheck
from serving.plan.weights import DraftShare, WeightShare, stage_weights
from serving.spec.schema import GIB, Architecture, CheckpointWeights

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


# ------------------------------------------------------------------------------------------ KV cell

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


DRAFT_KV = SourceCheck(
    "model_executor/pool_configurator.py", 312, "self._cell_size * draft_num_layers / int(num_layers)"
)
"""EAGLE family: the cell grows by ``int(cell × draft layers / layers)``: the draft's KV beside the target's."""


def draft_cell_bytes(cell: int, stage_layers: int, draft_layers: int) -> int:
    """The cell with the draft's KV: ``cell + int(cell × draft_layers / stage_layers)`` (:data:`DRAFT_KV`)."""
    return cell + int(cell * draft_layers / stage_layers) if draft_layers and stage_layers else cell


# ------------------------------------------------------------------------------------------ the pool

PP_MIN_TOKENS = SourceCheck("mem_cache/kv_cache_configurator.py", 3107, "# Sync across PP ranks")
"""``_apply_token_constraints``: the pool's token count is all-reduced with ``ReduceOp.MIN`` over the PP ranks."""


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
    def fullest_at_load(self) -> WeightShare | None:
        """Online FP8: the stage whose GPU holds the most while SGLang loads and quantises it (its
        :attr:`~serving.plan.weights.WeightShare.load_peak_bytes`); None where the weights load as they stay."""
        peaks = [w for w, _, _ in self.stages if w.load_peak_bytes is not None]
        return max(peaks, key=lambda w: w.load_peak_bytes or 0.0) if peaks else None

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
    online_fp8: bool = False,
    shares: list[WeightShare] | None = None,
) -> ReplicaPool:
    """Every stage's pool by its own weights and layers (counted from ``checkpoint`` where the stack names one);
    the replica's token count is the minimum over the stages, as SGLang's PP ranks agree on it. With attention
    DP that count is each attention-DP group's own pool, its KV heads split over attention-TP
    (:data:`KV_HEADS_ATTN_TP`). ``online_fp8``: a 16-bit checkpoint quantised to FP8 at load, the weights as SGLang
    keeps them after quantising (:func:`serving.plan.weights.online_fp8_stage_weights`); whether its 16-bit shard
    fits at load is each stage's :attr:`~serving.plan.weights.WeightShare.load_peak_bytes`, for the caller to check.
    ``shares``: the stages' weights where the caller has them already (:func:`stage_weights` of the same arguments;
    ``fit`` sizes one layout's pool for each KV dtype)."""
    stages = []
    if shares is None:
        shares = stage_weights(arch, bytes_per_param, tp, pp, group_size, checkpoint, attn_dp, online_fp8)
    for share in shares:
        cell = kv_cell_bytes(arch, kv_bytes_per_element, tp // attn_dp, len(share.layers))
        weights = share.total
        if draft is not None:
            cell = draft_cell_bytes(cell, len(share.layers), draft.kv_layers)
            weights += draft.weights
        stages.append((share, cell, kv_pool(free_at_start, mem_fraction_static, weights, cell)))
    binding = min(range(len(stages)), key=lambda i: (stages[i][2].tokens, -i))
    return ReplicaPool(stages, binding)


# ------------------------------------------------------------------------------------------ concurrency

RUNNING_PER_WORKER = SourceCheck(
    "mem_cache/kv_cache_configurator.py", 3128, "requested_per_worker = max(1, max_num_reqs // self.attn_dp_size)"
)
"""Each attention-DP worker takes ``max(1, --max-running-requests // attn_dp)`` of the requests."""


def running_requests_per_replica(max_running_requests: int, attn_dp: int) -> int:
    """The requests a replica runs at most: each of its ``attn_dp`` workers ``max(1, max_running_requests //
    attn_dp)`` (:data:`RUNNING_PER_WORKER`), so ``max_running_requests`` itself without attention DP, and
    neither less (a remainder is dropped) nor fewer than ``attn_dp``."""
    return max(1, max_running_requests // attn_dp) * attn_dp
