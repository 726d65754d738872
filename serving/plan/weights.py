"""The weights on each GPU of a replica when SGLang sizes its KV pool: every pipeline stage's decoder layers and
vocabulary tables over TP (counted from config.json, or read from the checkpoint's own bytes), a 4-bit checkpoint's
scales and zeros and the projections it keeps in 16 bit, attention DP's replicated attention, and a speculative
draft's weights (:mod:`serving.plan.memory` subtracts them from the pool's budget).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from serving.plan.calibration import LOAD_OVERHEAD_GIB
from serving.plan.divisibility import SourceCheck
from serving.spec.schema import GIB, Architecture, CheckpointWeights, SpeculativeSpec

PP_PARTITION = SourceCheck(
    "distributed/utils.py", 139, "# Distribute the extra layers to the last 'remainder' partitions"
)
"""``get_pp_indices``: ``layers // pp`` layers a stage, the ``layers % pp`` extra ones to the last stages."""


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
    load_peak_bytes: float | None = None
    """Online FP8 only (:func:`online_fp8_stage_weights`): what the GPU holds while SGLang loads the 16-bit checkpoint
    and quantises it, which must fit in its free memory; None where the weights load as they stay."""
    load_formula: str = ""

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
    online_fp8: bool = False,
) -> list[WeightShare]:
    """Each stage's weights per GPU: its layers' parameters (every expert) in the checkpoint's precision over
    TP, plus a group-quantised checkpoint's scales and zeros (``group_size``: 4-bit AWQ/GPTQ, see
    :func:`group_overhead_bytes_per_param`); the embedding on the first stage and the LM head on the last (kept 16-bit by every quantised
    checkpoint SGLang loads), over TP. Without PP one GPU holds both tables (one when tied); with PP the last
    stage holds its own LM head even when tied (SGLang builds ``embed_tokens`` there to tie it).

    With attention DP (``attn_dp`` > 1) the attention projections and the input embedding are split over the
    attention-TP group (TP / attn_dp GPUs) only, so each attention-DP group holds a whole copy
    (:func:`attention_dp_extra`); the MLP, the experts and the LM head stay over TP.

    ``online_fp8``: a 16-bit checkpoint SGLang quantises to FP8 as it loads (``--quantization fp8`` without a
    ``quantization_config`` in config.json): :func:`online_fp8_stage_weights`, ``bytes_per_param`` ignored."""
    if online_fp8:
        return online_fp8_stage_weights(arch, tp, pp, checkpoint, attn_dp)
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
            # the checkpoint stores the projection in its precision and the gate in 16 bit
            rep_bytes, rep_text = replicated_extra(arch, layers, bytes_per_param, 2.0, tp, attn_dp)
            formula = (
                f"{stage}{how}; + {on_gpu} table(s) {ckpt_tables / GIB:,.2f} GiB; / TP {tp} = "
                f"{(layer_bytes + emb) / GIB:,.2f} GiB{dp_text}{rep_text}"
            )
            out.append(WeightShare(rank, layers, layer_bytes + dp_bytes + rep_bytes, emb, load, formula))
            continue
        params = stage_parameters(arch, layers)
        kept, kept_names = unquantized_parameters(arch, layers) if per_param < 2 else (0, [])
        layer_bytes = (params * per_param + kept * (2 - per_param)) / tp
        emb = table * on_gpu * 2 / tp
        dp_bytes, dp_text = attention_dp_extra(arch, layers, params * per_param, table * 2, rank, tp, attn_dp)
        rep_bytes, rep_text = replicated_extra(arch, layers, per_param, per_param, tp, attn_dp)
        params_text = f"{params:,.0f} params × {bpp}"
        if kept:
            params_text = (
                f"({params - kept:,.0f} params × {bpp} + {kept:,} params of {len(kept_names)} projections the "
                f"checkpoint keeps in 16 bit (quantization_config, {SKIPPED_LAYER.where}) × 2 B)"
            )
        formula = (
            f"{stage}{params_text} / TP {tp} = {layer_bytes / GIB:,.2f} GiB + {on_gpu} × "
            f"{table:,} embedding params × 2 B / TP {tp} = {emb / GIB:,.2f} GiB = {(layer_bytes + emb) / GIB:,.2f} GiB"
            f"{dp_text}{rep_text}"
        )
        out.append(WeightShare(rank, layers, layer_bytes + dp_bytes + rep_bytes, emb, load, formula))
    return out


# ------------------------------------------------------------------------------- replicated on every GPU

REPLICATED_A_PROJ = SourceCheck("models/deepseek_v2.py", 2070, "self.fused_qkv_a_proj_with_mqa = ReplicatedLinear(")
"""DeepSeek-V2/V3's low-rank q/kv input projection is whole on every GPU (``kv_a_proj_with_mqa`` without
``q_lora_rank``, :2095), in the checkpoint's precision (``quant_config=quant_config``)."""
MLA_W_KC = SourceCheck("models/deepseek_common/deepseek_weight_loader.py", 780, "self_attn.w_kc = bind_or_assign(")
MLA_W_VC = SourceCheck(
    "models/deepseek_common/deepseek_weight_loader.py", 786, "self_attn.w_vc = bind_or_assign(self_attn.w_vc, w_vc)"
)
"""``post_load_weights``: each layer's ``kv_b_proj`` (dequantised to 16 bit when block FP8, :703) is split into
``w_kc`` and ``w_vc``, each made contiguous (a copy) and kept beside ``kv_b_proj`` itself, which prefill still uses:
the layer's kv_b_proj once more in 16 bit, over attention-TP."""
MOE_GATE_WHOLE = SourceCheck("models/deepseek_v2.py", 509, "self.weight = nn.Parameter(")
"""``MoEGate``: the router is a plain ``n_routed_experts × hidden_size`` parameter in the default (16-bit) dtype,
whole on every GPU and never quantised."""


def replicated_extra(
    arch: Architecture, layers: range, a_proj_bytes: float, gate_counted: float, tp: int, attn_dp: int
) -> tuple[float, str]:
    """What DeepSeek's MLA layers hold beyond an even split of their parameters: each layer's
    ``fused_qkv_a_proj_with_mqa`` (:data:`REPLICATED_A_PROJ`, ``a_proj_bytes`` a parameter) whole, where it was
    counted over attention-TP (TP without attention DP, :func:`attention_dp_extra` otherwise); each MoE layer's
    router gate (:data:`MOE_GATE_WHOLE`, 2 B a parameter) whole, where it was counted at ``gate_counted`` bytes a
    parameter over TP; and the 16-bit ``w_kc``/``w_vc`` copies of each ``kv_b_proj`` made after loading
    (:data:`MLA_W_VC`), over attention-TP. Zero for a model without MLA."""
    mla, moe = arch.mla, arch.moe
    if mla is None:
        return 0.0, ""
    attn_tp = tp // attn_dp
    proj_params = mla.a_proj_parameters(arch.hidden_size) * len(layers)
    proj = proj_params * a_proj_bytes * (1 - 1 / attn_tp)
    moe_layers = sum(1 for i in layers if i >= moe.dense_layers) if moe is not None else 0
    gate_params = moe_layers * moe.num_experts * arch.hidden_size if moe is not None else 0
    gate = gate_params * (2 - gate_counted / tp)
    kv_b_params = mla.kv_b_parameters(arch.num_attention_heads) * len(layers)
    copies = kv_b_params * 2 / attn_tp
    if proj + gate + copies <= 0:
        return 0.0, ""
    parts = (
        [
            f"the {len(layers)} layers' fused_qkv_a_proj_with_mqa, {proj_params:,} params × {a_proj_bytes:g} B "
            f"({REPLICATED_A_PROJ.where}), not over attention-TP {attn_tp}: + {proj / GIB:,.2f} GiB"
        ]
        if proj > 0
        else []
    )
    if gate_params:
        parts.append(
            f"{moe_layers} MoE gates, {gate_params:,} params × 2 B ({MOE_GATE_WHOLE.where}), not × {gate_counted:g} B "
            f"/ TP {tp}: + {gate / GIB:,.2f} GiB"
        )
    text = "; whole on every GPU: " + ", ".join(parts) if parts else ""
    if copies:
        text += (
            f"; MLA's 16-bit w_kc/w_vc copies of kv_b_proj, {kv_b_params:,} params × 2 B / attention-TP {attn_tp} "
            f"({MLA_W_KC.where}, {MLA_W_VC.where}): + {copies / GIB:,.2f} GiB"
        )
    return proj + gate + copies, text


# ------------------------------------------------------------------------------------------ online FP8

FP8_CHECKPOINT = SourceCheck(
    "layers/quantization/fp8.py", 349, 'is_checkpoint_fp8_serialized = ("fp8" in quant_method) or use_mxfp8'
)
"""``Fp8Config.from_config``: a checkpoint is FP8 when its ``quantization_config.quant_method`` names fp8; with
``--quantization fp8`` and no ``quantization_config`` SGLang builds ``Fp8Config()``, ``is_checkpoint_fp8_serialized``
False: online FP8."""
ONLINE_LINEAR_16BIT = SourceCheck(
    "layers/quantization/fp8.py", 655, "torch.float8_e4m3fn if is_checkpoint_fp8_serialized else params_dtype"
)
"""``create_fp8_weight_``: an online-FP8 linear layer's weight is allocated in the 16-bit ``params_dtype``."""
ONLINE_MOE_16BIT = SourceCheck(
    "layers/quantization/fp8.py", 1566, "params_dtype = torch.uint32 if _use_hip_int4 else torch.float8_e4m3fn"
)
"""``create_fp8_moe_weight_``: the experts are FP8 only for an FP8 checkpoint, else in the 16-bit ``params_dtype``."""
LOAD_WHOLE_MODEL = SourceCheck("model_loader/loader.py", 1063, "model.load_weights(weights)")
"""``DefaultModelLoader.load_weights_only``: every weight of the stage is loaded first …"""
QUANTISE_AFTER_LOAD = SourceCheck("model_loader/loader.py", 1089, "quant_method.process_weights_after_loading(module)")
"""… and only then ``postprocess_weights`` quantises each module, one after the other."""
ONLINE_LINEAR_SCALES = SourceCheck(
    "layers/quantization/fp8.py", 1160, "qweight, weight_scale = per_token_group_quant_fp8("
)
"""A linear layer on CUDA (CUTLASS) is quantised per channel: one FP32 scale per output row."""
ONLINE_LINEAR_SWAP = SourceCheck(
    "layers/quantization/fp8.py", 1173, "layer.weight = Parameter(qweight.t(), requires_grad=False)"
)
"""The FP8 weight replaces the 16-bit parameter, whose tensor loses its last reference (freed)."""
ONLINE_MOE_COPY = SourceCheck(
    "layers/quantization/fp8.py", 2621, "w13_weight = torch.empty_like(layer.w13_weight.data, dtype=fp8_dtype)"
)
"""A MoE layer allocates the FP8 copies of all its experts (w13 and w2) before it quantises them, one FP32 scale an
expert each, and then replaces the 16-bit parameters (``:2641``)."""
ONLINE_MOE_SWAP = SourceCheck(
    "layers/quantization/fp8.py", 2641, "layer.w13_weight = torch.nn.Parameter(w13_weight, requires_grad=False)"
)
CACHE_RELEASED = SourceCheck("utils/common.py", 447, "empty_device_cache(torch.cuda)")
"""``get_available_gpu_memory`` (called after the load, before the pool is sized) returns the freed 16-bit blocks to
the device first, so the pool's budget sees the FP8 weights only."""
EPLB_TABLE_LAZY = SourceCheck("models/qwen3_moe.py", 1027, "self.routed_experts_weights_of_layer = LazyValue(")
"""0.5.23's Qwen3-MoE builds its EPLB table of expert tensors lazily (after quantisation); sglang#8337's 0.4.9-era
log came from a ``load_weights`` that built it eagerly, holding the 16-bit experts (see :data:`EXPERTS_HELD_AFTER_LOAD`)."""

EXPERTS_HELD_AFTER_LOAD: dict[str, SourceCheck] = {
    **dict.fromkeys(
        ("BailingMoEForCausalLM", "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM", "SarvamMoEForCausalLM"),
        SourceCheck("models/bailing_moe.py", 1082, "self.routed_experts_weights_of_layer = {"),
    ),
    "SarvamMLAForCausalLM": SourceCheck("models/sarvam_moe.py", 1355, "self.routed_experts_weights_of_layer = {"),
}
"""Model classes (config.json ``architectures``) whose 0.5.23 ``load_weights`` still keeps a table of every routed
expert's tensor (``get_moe_weights()``) built before ``process_weights_after_loading``: under online FP8 their 16-bit
experts stay on the GPU beside the FP8 copies, as sglang#8337 logged for the Qwen3-MoE of its day (19.99 GiB a GPU,
:func:`online_fp8_stage_weights`)."""

ONLINE_FP8_SOURCE = (
    FP8_CHECKPOINT,
    ONLINE_LINEAR_16BIT,
    ONLINE_MOE_16BIT,
    LOAD_WHOLE_MODEL,
    QUANTISE_AFTER_LOAD,
    ONLINE_LINEAR_SCALES,
    ONLINE_LINEAR_SWAP,
    ONLINE_MOE_COPY,
    ONLINE_MOE_SWAP,
    CACHE_RELEASED,
    EPLB_TABLE_LAZY,
)
"""The SGLang lines the online-FP8 arithmetic cites (``tests/test_memory_model.py`` reads each one)."""

_ROW_PARALLEL = ("self_attn.o_proj", "down_proj")


def online_fp8_modules(arch: Architecture, i: int) -> list[tuple[str, int]]:
    """Layer ``i``'s modules as SGLang quantises them one at a time, with their parameters: the fused ``qkv_proj``
    and ``gate_up_proj`` (a checkpoint's q/k/v and gate/up), ``o_proj``, ``down_proj``, and a MoE layer's routed
    experts (w13 and w2 together, :data:`ONLINE_MOE_COPY`)."""
    fused: dict[str, int] = {}
    for name, n in layer_linears(arch, i):
        key = name.rsplit(".", 1)[0] + ".qkv_proj" if name.endswith(("q_proj", "k_proj", "v_proj")) else name
        key = key.rsplit(".", 1)[0] + ".gate_up_proj" if key.endswith(("gate_proj", "up_proj")) else key
        fused[key] = fused.get(key, 0) + n
    return list(fused.items())


def online_fp8_scale_bytes(arch: Architecture, layers: range, tp: int) -> float:
    """The FP32 scales online FP8 adds on one GPU: one per output row of each linear layer (per channel,
    :data:`ONLINE_LINEAR_SCALES`; a column-parallel layer's rows split over TP, a row-parallel one's, ``o_proj`` and
    ``down_proj``, whole), and one per expert for each of w13 and w2 (per tensor, :data:`ONLINE_MOE_COPY`)."""
    rows = 0.0
    h = arch.hidden_size
    for i, count in _layer_kinds(arch, layers):
        for name, n in layer_linears(arch, i):
            if name.endswith(".experts"):
                rows += count * 2 * (arch.moe.num_experts if arch.moe is not None else 0)
            elif name.endswith(_ROW_PARALLEL):
                rows += count * h
            else:
                rows += count * n / h / tp
    return 4 * rows


def _layer_kinds(arch: Architecture, layers: range) -> list[tuple[int, int]]:
    """``layers`` as (one layer, how many of its kind): a MoE model's leading dense layers and its MoE layers have
    different projections (:func:`layer_linears`), every other layer is shaped alike."""
    moe = arch.moe
    split = min(max(moe.dense_layers if moe is not None else 0, layers.start), layers.stop)
    return [(r.start, len(r)) for r in (range(layers.start, split), range(split, layers.stop)) if len(r)]


def online_fp8_stage_weights(
    arch: Architecture,
    tp: int,
    pp: int,
    checkpoint: CheckpointWeights | None = None,
    attn_dp: int = 1,
) -> list[WeightShare]:
    """Each stage's weights per GPU under online FP8: a 16-bit checkpoint served with ``--quantization fp8``, as
    SGLang 0.5.23 loads it.

    At load (:attr:`WeightShare.load_peak_bytes`): every quantised layer is allocated in 16 bit
    (:data:`ONLINE_LINEAR_16BIT`, :data:`ONLINE_MOE_16BIT`) and the whole stage is loaded (:data:`LOAD_WHOLE_MODEL`)
    before any module is quantised (:data:`QUANTISE_AFTER_LOAD`), so the GPU holds the stage's 16-bit weights (from
    ``checkpoint``'s own bytes where given), the load overhead, and, while a module is quantised, its FP8 copy
    beside its 16-bit tensor: the largest module's (:func:`online_fp8_modules`) is added.

    Resident after (what the KV pool's budget subtracts): the FP8 weights, 1 B a parameter (tables in 16 bit, as an
    FP8 checkpoint's), plus their FP32 scales (:func:`online_fp8_scale_bytes`): each 16-bit tensor is replaced
    (:data:`ONLINE_LINEAR_SWAP`, :data:`ONLINE_MOE_SWAP`) and its blocks handed back before the budget is measured
    (:data:`CACHE_RELEASED`). A model class whose ``load_weights`` keeps its experts' 16-bit tensors
    (:data:`EXPERTS_HELD_AFTER_LOAD`) keeps those too."""
    loads = stage_weights(arch, 2.0, tp, pp, None, checkpoint, attn_dp)
    held = EXPERTS_HELD_AFTER_LOAD.get(arch.model_class or "")
    out = []
    for fp8, load in zip(stage_weights(arch, 1.0, tp, pp, None, None, attn_dp), loads, strict=True):
        kinds = _layer_kinds(arch, fp8.layers)
        modules = [m for i, _ in kinds for m in online_fp8_modules(arch, i)]
        name, largest = max(modules, key=lambda m: m[1]) if modules else ("", 0)
        copy = largest / tp
        scales = online_fp8_scale_bytes(arch, fp8.layers, tp)
        experts = sum(c * n for i, c in kinds for m, n in layer_linears(arch, i) if m.endswith(".experts")) * 2.0 / tp
        kept = experts if held is not None else 0.0
        peak = load.total + copy
        formula = (
            f"online FP8 (16-bit checkpoint quantised at load, {QUANTISE_AFTER_LOAD.where}): {fp8.formula} + FP32 "
            f"scales {scales / GIB:,.2f} GiB ({ONLINE_LINEAR_SCALES.where})"
            + (
                f" + the 16-bit experts {experts / GIB:,.2f} GiB, still referenced after quantisation ({held.where})"
                if held is not None
                else ""
            )
        )
        load_formula = (
            f"{peak / GIB:,.2f} GiB a GPU at load (stage {fp8.stage + 1}/{pp}): 16-bit weights "
            f"({ONLINE_LINEAR_16BIT.where}, loaded whole before quantising, {LOAD_WHOLE_MODEL.where}) "
            f"{load.loaded_formula} + the FP8 copy of its largest module {name.rsplit('.', 1)[-1]} "
            f"{copy / GIB:,.2f} GiB while it is quantised"
        )
        out.append(
            replace(
                fp8,
                layer_bytes=fp8.layer_bytes + scales + kept,
                formula=formula,
                load_peak_bytes=peak,
                load_formula=load_formula,
            )
        )
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


# ------------------------------------------------------------------------------ speculative decoding

DRAFT_WEIGHTS = SourceCheck(
    "mem_cache/kv_cache_configurator.py", 3042, "# Loaded weights (target + draft) can exceed the static budget"
)
"""The KV budget is what is free after the target's AND the draft's weights loaded."""
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
