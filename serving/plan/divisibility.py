"""The shape checks the pinned SGLang (0.5.23) makes before it serves a model at a TP size, mirrored offline.

A layout SGLang rejects at start-up (an assertion or a ``ValueError`` while the model is built) must not be
planned or ranked by ``exaserve fit``. Each rule names the check it mirrors, as
``file:line`` under ``sglang/srt/`` of the SGLang 0.5.23 wheel (the venv of ``scripts/sglang-manifest.sh``);
``tests/test_divisibility.py`` reads those lines from the installed source and fails where they moved or changed.

Rules, for tensor parallel size ``tp`` and expert parallel size ``ep`` (``--ep-size``; 1 unless set):

- attention heads: ``num_heads % tp == 0`` (:data:`HEADS`);
- KV heads: split when ``kv ≥ tp`` (``kv % tp == 0``), replicated when ``kv < tp`` (``tp % kv == 0``)
  (:data:`KV_SPLIT`, :data:`KV_REPLICATED`);
- EP > 1: the routed experts divide over EP (:data:`EXPERTS_DIVIDE`; Mixtral's 8 experts refuse EP 16);
- block-FP8 checkpoints (config.json ``quantization_config.weight_block_size = [n, k]``):
  - MoE: ``tp % ep == 0``, and with ``moe_tp = tp / ep`` the expert width ``moe_intermediate_size % moe_tp == 0``
    and ``(moe_intermediate_size / moe_tp) % n == 0`` (:data:`MOE_EP`, :data:`MOE_TP`, :data:`MOE_BLOCK`);
  - dense MLP (a model's dense layers): ``intermediate_size / tp`` a multiple of ``n`` (gate/up, one merged
    column-parallel GEMM, checked even at TP 1) and, with ``tp > 1``, of ``k`` (down, row parallel)
    (:data:`LINEAR_BLOCK_N`, :data:`LINEAR_BLOCK_K`).

- attention DP (``--attn-dp-size``, ``attn_dp`` > 1): ``tp % attn_dp == 0`` (:data:`ATTN_DP_DIVIDES`), and a
  MoE model's KV heads split or replicated over the attention-TP size ``tp / attn_dp`` as above
  (:data:`MOE_KV_SPLIT`, :data:`MOE_KV_REPLICATED`: Qwen3-MoE builds its attention over attention-TP).

Not mirrored: the block-FP8 shapes of the attention projections (q/k/v, and MLA's low-rank projections).
"""

from __future__ import annotations

from dataclasses import dataclass

from serving.spec.schema import Architecture


@dataclass(frozen=True)
class SourceCheck:
    """One check in SGLang's source: where it is and a fragment of its line, which the fidelity test reads."""

    path: str
    """Under ``sglang/srt/`` of the pinned wheel."""
    line: int
    fragment: str

    @property
    def where(self) -> str:
        return f"sglang/srt/{self.path}:{self.line}"


HEADS = SourceCheck("models/llama.py", 183, "assert self.total_num_heads % tp_size == 0")
KV_SPLIT = SourceCheck("models/llama.py", 189, "assert self.total_num_kv_heads % tp_size == 0")
KV_REPLICATED = SourceCheck("models/llama.py", 193, "assert tp_size % self.total_num_kv_heads == 0")
MOE_EP = SourceCheck("model_executor/model_runner_components/moe_ep_setup.py", 150, "if tp_size % moe_ep_size != 0:")
MOE_TP = SourceCheck(
    "model_executor/model_runner_components/moe_ep_setup.py", 162, "if moe_intermediate_size % moe_tp_size != 0:"
)
MOE_BLOCK = SourceCheck(
    "model_executor/model_runner_components/moe_ep_setup.py",
    169,
    "and (moe_intermediate_size // moe_tp_size) % weight_block_size_n != 0",
)
LINEAR_BLOCK_K = SourceCheck("layers/quantization/fp8.py", 594, "if input_size_per_partition % block_k != 0:")
LINEAR_BLOCK_N = SourceCheck("layers/quantization/fp8.py", 605, "if output_partition_size % block_n != 0:")

ATTN_DP_DIVIDES = SourceCheck("arg_groups/parallel_hook.py", 326, "assert cfg.tp_size % cfg.attn_dp_size == 0")
ATTN_DP_WITH_DP = SourceCheck("arg_groups/parallel_hook.py", 287, "if cfg.attn_dp_size > 1 and cfg.dp_size > 1:")
EXPERTS_DIVIDE = SourceCheck(
    "layers/moe/fused_moe_triton/layer.py", 414, "assert self._num_global_routed % storage_ep_size == 0"
)
MOE_KV_SPLIT = SourceCheck("models/qwen3_moe.py", 512, "assert self.total_num_kv_heads % attn_tp_size == 0")
MOE_KV_REPLICATED = SourceCheck("models/qwen3_moe.py", 516, "assert attn_tp_size % self.total_num_kv_heads == 0")

SOURCE_CHECKS: tuple[SourceCheck, ...] = (
    EXPERTS_DIVIDE,
    ATTN_DP_DIVIDES,
    ATTN_DP_WITH_DP,
    MOE_KV_SPLIT,
    MOE_KV_REPLICATED,
    HEADS,
    KV_SPLIT,
    KV_REPLICATED,
    MOE_EP,
    MOE_TP,
    MOE_BLOCK,
    LINEAR_BLOCK_K,
    LINEAR_BLOCK_N,
)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _moe_problem(moe_i: int, block_n: int, tp: int, ep: int) -> str | None:
    if tp % ep:
        return f"TP {tp} is not divisible by EP {ep} ({MOE_EP.where})"
    moe_tp = tp // ep
    if moe_i % moe_tp:
        return f"moe_intermediate_size {moe_i} is not divisible by TP {tp} / EP {ep} = {moe_tp} ({MOE_TP.where})"
    if (moe_i // moe_tp) % block_n:
        return (
            f"block FP8: moe_intermediate_size {moe_i} / (TP {tp} / EP {ep}) = {moe_i // moe_tp} is not a multiple "
            f"of the {block_n}-wide weight block ({MOE_BLOCK.where})"
        )
    return None


def rejections(arch: Architecture, tp: int, precision: str, ep: int = 1, attn_dp: int = 1) -> list[str]:
    """Why SGLang refuses to serve ``arch`` at this TP (and EP, attention-DP) size; empty when it starts.

    The block-FP8 rules apply only to a ``fp8`` layout of a checkpoint whose config.json declares
    ``weight_block_size`` (SGLang's online FP8 quantisation of a 16-bit checkpoint is per channel and has none).
    Each reason names the value, the check's source line and, where an EP size would pass, the fix."""
    out: list[str] = []
    heads, kv = arch.num_attention_heads, arch.num_kv_heads
    if heads % tp:
        out.append(f"{heads} attention heads are not divisible by TP {tp} ({HEADS.where})")
    if arch.mla is None:
        if kv >= tp and kv % tp:
            out.append(f"{kv} KV heads are not divisible by TP {tp} ({KV_SPLIT.where})")
        if kv < tp and tp % kv:
            out.append(f"TP {tp} is not a multiple of the {kv} KV heads it replicates ({KV_REPLICATED.where})")
    if attn_dp > 1:
        if tp % attn_dp:
            return [*out, f"attention DP {attn_dp} does not divide TP {tp} ({ATTN_DP_DIVIDES.where})"]
        atp = tp // attn_dp
        if arch.mla is None and arch.moe is not None:
            if kv >= atp and kv % atp:
                out.append(f"{kv} KV heads are not divisible by attention-TP {atp} ({MOE_KV_SPLIT.where})")
            if kv < atp and atp % kv:
                out.append(
                    f"attention-TP {atp} is not a multiple of the {kv} KV heads it replicates ({MOE_KV_REPLICATED.where})"
                )
    if ep > 1 and arch.moe is not None and arch.moe.num_experts % ep:
        out.append(f"{arch.moe.num_experts} experts are not divisible by EP {ep} ({EXPERTS_DIVIDE.where})")
    block = arch.weight_block_size
    if precision != "fp8" or block is None:
        return out
    block_n, block_k = block
    moe = arch.moe
    if moe is not None and moe.intermediate_size is not None:
        problem = _moe_problem(moe.intermediate_size, block_n, tp, ep)
        if problem is not None:
            passing = [e for e in _divisors(tp) if _moe_problem(moe.intermediate_size, block_n, tp, e) is None]
            fix = f"; --ep-size {passing[0]} passes" if passing and passing[0] != ep else ""
            out.append(problem + fix)
    has_dense = moe is None or moe.dense_layers > 0
    if has_dense and arch.intermediate_size is not None:
        dense = arch.intermediate_size
        if dense % tp:
            out.append(f"intermediate_size {dense} is not divisible by TP {tp}")
            return out
        part = dense // tp
        # gate and up are one merged column-parallel GEMM: each part a whole number of blocks, even at TP 1.
        if part % block_n:
            out.append(
                f"block FP8: intermediate_size {dense} / TP {tp} = {part} (gate/up output) is not a multiple of "
                f"block_n {block_n} ({LINEAR_BLOCK_N.where})"
            )
        if tp > 1 and part % block_k:
            out.append(
                f"block FP8: intermediate_size {dense} / TP {tp} = {part} (down input) is not a multiple of "
                f"block_k {block_k} ({LINEAR_BLOCK_K.where})"
            )
    return out
