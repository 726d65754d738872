"""The model: its precision and quantisation, its architecture (read from Hugging Face ``config.json``, parameters
counted from its shapes), the checkpoint's weights as read, and speculative decoding's draft."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import Field, model_validator

from serving.flags import DATA_DIR
from serving.spec.schema.base import SpecModel


class Precision(StrEnum):
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    INT8 = "int8"
    INT4 = "int4"


BYTES_PER_PARAM: dict[Precision, float] = {
    Precision.FP16: 2.0,
    Precision.BF16: 2.0,
    Precision.FP8: 1.0,
    Precision.INT8: 1.0,
    Precision.INT4: 0.5,
}


class MlaSpec(SpecModel):
    """Multi-head latent attention (DeepSeek-V2/V3): the KV cache stores one compressed latent."""

    kv_lora_rank: int = Field(gt=0, description="Latent dimension cached per token per layer.")
    qk_rope_head_dim: int = Field(gt=0, description="Decoupled RoPE key dimension cached alongside.")
    q_lora_rank: int = Field(default=0, ge=0, description="The query's low-rank dimension; 0: a full-rank q_proj.")
    qk_nope_head_dim: int = Field(default=0, ge=0, description="Each head's key dimension without RoPE (kv_b_proj).")
    v_head_dim: int = Field(default=0, ge=0, description="Each head's value dimension (kv_b_proj).")

    def a_proj_parameters(self, hidden_size: int) -> int:
        """One layer's ``fused_qkv_a_proj_with_mqa`` (``kv_a_proj_with_mqa`` without ``q_lora_rank``): hidden ×
        (q_lora_rank + kv_lora_rank + qk_rope_head_dim), a ``ReplicatedLinear`` whole on every GPU."""
        return hidden_size * (self.q_lora_rank + self.kv_lora_rank + self.qk_rope_head_dim)

    def kv_b_parameters(self, heads: int) -> int:
        """One layer's ``kv_b_proj``: kv_lora_rank × heads × (qk_nope_head_dim + v_head_dim)."""
        return self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)


class MoeSpec(SpecModel):
    num_experts: int = Field(gt=1, description="Routed experts per MoE layer.")
    experts_per_token: int = Field(gt=0, description="Experts activated per token.")
    active_parameter_count: int | None = Field(default=None, gt=0, description="Parameters active per token.")
    intermediate_size: int | None = Field(
        default=None,
        gt=0,
        description="One expert's MLP width (config.json moe_intermediate_size; intermediate_size where the experts "
        "have no own field, as Mixtral's).",
    )
    shared_experts: int = Field(default=0, ge=0, description="Shared experts per MoE layer (n_shared_experts).")
    dense_layers: int = Field(
        default=0, ge=0, description="Leading layers with a dense MLP instead of experts (first_k_dense_replace)."
    )

    @model_validator(mode="after")
    def _topk(self) -> Self:
        """A token cannot activate more experts than exist."""
        if self.experts_per_token > self.num_experts:
            raise ValueError(f"experts_per_token={self.experts_per_token} exceeds num_experts={self.num_experts}")
        return self


ATTN_TP_ATTENTION: dict[str, str] = {
    "DeepseekV2ForCausalLM": "models/deepseek_v2.py:2051",
    "DeepseekV3ForCausalLM": "models/deepseek_v2.py:2051",
    "Qwen2MoeForCausalLM": "models/qwen2_moe.py:911",
    "Qwen3MoeForCausalLM": "models/qwen3_moe.py:502",
}
"""SGLang 0.5.23 model classes (config.json ``architectures``) whose attention splits its heads over the
attention-TP group (``attn_tp_size = get_parallel().attn_tp_size`` at the cited line, under ``sglang/srt/``), so
attention DP replicates it per group as the planner models. Others (Llama ``models/llama.py:181``, Mixtral
``models/mixtral.py:137``, Qwen2 ``models/qwen2.py:165``) split it over the whole TP group; ``tests/test_memory_model.py``
reads each model file's attention classes to check this table."""


class Architecture(SpecModel):
    model_class: str | None = Field(
        default=None,
        description="SGLang's model class, config.json's architectures[0] (e.g. DeepseekV3ForCausalLM): it decides "
        "how attention DP splits the attention.",
    )
    num_layers: int = Field(default=80, gt=0)
    hidden_size: int = Field(default=8192, gt=0)
    num_attention_heads: int = Field(default=64, gt=0)
    num_kv_heads: int = Field(
        default=8, gt=0, description="KV heads (GQA); equal to attention heads for MHA. Llama-3-70B: 8."
    )
    head_dim: int = Field(default=128, gt=0)
    vocab_size: int = Field(default=128_256, gt=0)
    parameter_count: int = Field(
        default=70_553_706_496,
        gt=0,
        description="Total parameters (counted from config.json when the stack gives none and it can be).",
    )
    tie_word_embeddings: bool = Field(
        default=False, description="The LM head shares the input embedding's weights (config.json)."
    )
    intermediate_size: int | None = Field(
        default=None, gt=0, description="The dense MLP's width (config.json intermediate_size); None when unknown."
    )
    weight_block_size: tuple[int, int] | None = Field(
        default=None,
        description="The checkpoint's block-FP8 block [n, k] (config.json quantization_config.weight_block_size).",
    )
    quant_method: str | None = Field(
        default=None,
        description="The checkpoint's quantisation (config.json quantization_config.quant_method); None: a 16-bit "
        "checkpoint, which SGLang quantises as it loads it when served with --quantization fp8 (online FP8).",
    )
    quant_group_size: int | None = Field(
        default=None,
        gt=0,
        description="The 4-bit checkpoint's group size (config.json quantization_config.group_size / q_group_size).",
    )
    unquantized_modules: tuple[str, ...] = Field(
        default=(),
        description="Modules a quantised checkpoint keeps in 16 bit (config.json quantization_config.ignored_layers "
        "or modules_to_not_convert, with and without the 'model.' prefix, as SGLang's Fp8Config reads them).",
    )
    nextn_layers: int = Field(
        default=0,
        ge=0,
        description="Multi-token-prediction layers the checkpoint carries past num_layers (config.json "
        "num_nextn_predict_layers): the draft of SGLang's NEXTN (MTP) speculative decoding.",
    )
    attention_parameters: int | None = Field(
        default=None,
        gt=0,
        description="One decoder layer's attention parameters (counted from config.json): what DP attention splits "
        "over the attention-TP group instead of TP. Without it GQA's q, k, v, o are counted from the heads.",
    )
    mla: MlaSpec | None = Field(default=None)
    moe: MoeSpec | None = Field(default=None)

    @property
    def attention_over_attn_tp(self) -> bool:
        """Whether SGLang splits this model's attention over the attention-TP group (:data:`ATTN_TP_ATTENTION`):
        the models attention DP is planned (and ``fit`` tries it) for."""
        return self.model_class in ATTN_TP_ATTENTION

    @property
    def fp8_checkpoint(self) -> bool:
        """The checkpoint is one SGLang loads as FP8 under ``--quantization fp8``: its ``quant_method`` is ``fp8``
        (``Fp8Config.from_config``, layers/quantization/fp8.py:349). Another method (``fbgemm_fp8``,
        ``compressed-tensors``, ``w8a8_fp8``…) with ``--quantization fp8`` is refused at start as a mismatch
        (configs/model_config.py:2143); none quantises a 16-bit checkpoint after loading it whole (online FP8)."""
        return self.quant_method == "fp8"

    @model_validator(mode="after")
    def _heads(self) -> Self:
        """KV heads must divide the attention heads (grouped-query attention)."""
        if self.num_kv_heads > self.num_attention_heads or self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads={self.num_kv_heads} must divide num_attention_heads="
                f"{self.num_attention_heads} (GQA groups); check the model's config.json"
            )
        return self


MULTIMODAL_ARCHS: frozenset[str] = frozenset(
    json.loads((DATA_DIR / "sglang-0.5.23-multimodal-archs.json").read_text())["architectures"]
)
"""The architectures SGLang 0.5.23 treats as multimodal (``configs/model_config.py: multimodal_model_archs``), pinned
as package data and compared with the installed source by ``tests/test_spec.py``."""

COMPATIBLE_CHECKPOINTS: dict[str, tuple[str, ...]] = {"w8a8_int8": ("compressed-tensors", "compressed_tensors")}
"""A ``--quantization`` SGLang 0.5.23 accepts over a checkpoint of another ``quant_method``
(``compatible_quantization_methods``, ``configs/model_config.py:2052``), for the methods the spec can name."""


def architecture_from_hf_config(cfg: dict[str, Any], source: str) -> dict[str, Any]:
    """Map a Hugging Face ``config.json`` to :class:`Architecture` fields.

    ``parameter_count`` is not in config.json: it is counted from the layer shapes when they are all there
    (:func:`count_parameters`); otherwise it must come from the stack (or the model card).
    """

    def need(*keys: str) -> Any:
        for k in keys:
            if k in cfg:
                return cfg[k]
        raise ValueError(f"{source}: none of {list(keys)} present; is this a transformer config.json?")

    classes = cfg.get("architectures")
    sub: list[str] = [k for k in ("text_config", "vision_config", "audio_config") if k in cfg]
    sub += [f"architecture {c}" for c in classes or () if c in MULTIMODAL_ARCHS]
    if sub:
        raise ValueError(
            f"{source}: a multimodal config.json (it has {', '.join(sub)}): SGLang lowers mem_fraction_static for its "
            "vision tower (arg_groups/memory_hook.py:331) and keeps a multimodal reservation out of the KV budget "
            "(mem_cache/kv_cache_configurator.py:202), neither of which the planner models; plan a text-only model"
        )
    heads = int(need("num_attention_heads", "n_head"))
    hidden = int(need("hidden_size", "n_embd", "d_model"))
    out: dict[str, Any] = {
        "num_layers": int(need("num_hidden_layers", "n_layer", "num_layers")),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": int(cfg.get("num_key_value_heads") or heads),
        "head_dim": int(cfg.get("head_dim") or hidden // heads),
        "vocab_size": int(need("vocab_size")),
    }
    if isinstance(classes, list) and classes and isinstance(classes[0], str):
        out["model_class"] = classes[0]
    if cfg.get("kv_lora_rank"):
        out["mla"] = {
            "kv_lora_rank": int(cfg["kv_lora_rank"]),
            "qk_rope_head_dim": int(need("qk_rope_head_dim")),
            "q_lora_rank": int(cfg.get("q_lora_rank") or 0),
            "qk_nope_head_dim": int(cfg.get("qk_nope_head_dim") or 0),
            "v_head_dim": int(cfg.get("v_head_dim") or 0),
        }
    experts = cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts")
    if cfg.get("intermediate_size"):
        out["intermediate_size"] = int(cfg["intermediate_size"])
    if experts:
        moe_i = cfg.get("moe_intermediate_size") or cfg.get("intermediate_size")
        out["moe"] = {
            "num_experts": int(experts),
            "experts_per_token": int(need("num_experts_per_tok")),
            "shared_experts": int(cfg.get("n_shared_experts") or 0),
            "dense_layers": int(cfg.get("first_k_dense_replace") or 0),
            **({"intermediate_size": int(moe_i)} if moe_i else {}),
        }
    quant = cfg.get("quantization_config")
    if quant is not None and not (isinstance(quant, dict) and isinstance(quant.get("quant_method"), str)):
        raise ValueError(
            f"{source}: quantization_config = {quant!r} names no quant_method, so whether SGLang loads the checkpoint "
            "quantised or quantises it online cannot be read; copy config.json as the model repository publishes it"
        )
    if isinstance(quant, dict):
        out["quant_method"] = quant["quant_method"]
        if quant["quant_method"] == "fp8":
            scheme = quant.get("activation_scheme")
            if scheme not in ("static", "dynamic"):
                raise ValueError(
                    f"{source}: quantization_config names quant_method fp8 but activation_scheme {scheme!r}; SGLang "
                    "0.5.23 requires static or dynamic (Fp8Config.from_config, layers/quantization/fp8.py:350, :285: "
                    "it refuses to start otherwise); copy config.json as the model repository publishes it"
                )
            if scheme == "static" and quant.get("weight_block_size"):
                raise ValueError(
                    f"{source}: quantization_config declares block FP8 (weight_block_size) with activation_scheme "
                    "static, which SGLang 0.5.23 refuses (block-wise quantization supports only dynamic, "
                    "layers/quantization/fp8.py:311)"
                )
    if isinstance(quant, dict) and quant.get("weight_block_size"):
        block = quant["weight_block_size"]
        if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
            raise ValueError(
                f"{source}: quantization_config.weight_block_size = {block!r} is not two positive integers [n, k]"
            )
        out["weight_block_size"] = (block[0], block[1])
    group = quant.get("group_size", quant.get("q_group_size")) if isinstance(quant, dict) else None
    if group is not None and group != -1:
        if not (isinstance(group, int) and group > 0):
            raise ValueError(f"{source}: quantization_config.group_size = {group!r} is not a positive integer")
        out["quant_group_size"] = group
    skip = (
        # The first key present, as Fp8Config's get_from_keys_or takes it (an empty ignored_layers wins).
        next((quant[k] for k in ("ignored_layers", "modules_to_not_convert") if k in quant), None)
        if isinstance(quant, dict)
        else None
    )
    if skip:
        if not (isinstance(skip, list) and all(isinstance(m, str) for m in skip)):
            raise ValueError(f"{source}: quantization_config's ignored modules {skip!r} are not a list of names")
        # layers/quantization/fp8.py Fp8Config.from_config: each name with and without the "model." prefix.
        names = (v for m in skip for v in (m.removeprefix("model."), f"model.{m.removeprefix('model.')}"))
        out["unquantized_modules"] = tuple(dict.fromkeys(names))
    out["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings", False))
    counted = count_parameters(cfg)
    if counted is not None:
        out["parameter_count"] = counted
    attn = attention_parameters(cfg)
    if attn is not None:
        out["attention_parameters"] = attn
    if cfg.get("num_nextn_predict_layers"):
        out["nextn_layers"] = int(cfg["num_nextn_predict_layers"])
    return out


def count_parameters(cfg: dict[str, Any]) -> int | None:
    """Parameters of a decoder-only transformer from its config.json, or None when a shape is missing.

    Embedding (+ LM head unless tied), per layer attention (GQA: q, k, v, o; MLA: the q/kv low-rank
    projections of DeepSeek-V2/V3), MLP (dense: gate, up, down; MoE: every routed and shared expert plus
    the router; the first ``first_k_dense_replace`` layers dense) and RMSNorm weights. Biases and
    multi-token-prediction layers are not counted (well under 0.1 % of any model here).
    """
    try:
        h, layers, vocab = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["vocab_size"])
        dense_i = int(cfg["intermediate_size"])
    except (KeyError, TypeError, ValueError):
        return None
    attn = attention_parameters(cfg)
    if attn is None:
        return None
    experts = int(cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts") or 0)
    dense_layers = layers
    moe = 0
    if experts:
        moe_i = int(cfg.get("moe_intermediate_size") or dense_i)
        shared = int(cfg.get("n_shared_experts") or 0)
        moe = (experts + shared) * 3 * h * moe_i + h * experts
        dense_layers = int(cfg.get("first_k_dense_replace") or 0)
    per_layer_norms = 2 * h
    body = layers * (attn + per_layer_norms) + dense_layers * 3 * h * dense_i + (layers - dense_layers) * moe
    embed = vocab * h * (1 if cfg.get("tie_word_embeddings") else 2)
    return body + embed + h


def attention_parameters(cfg: dict[str, Any]) -> int | None:
    """One decoder layer's attention parameters from config.json (GQA: q, k, v, o; MLA: DeepSeek's low-rank q and
    kv projections, their norms and o), or None when a shape is missing."""
    try:
        h, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        if cfg.get("kv_lora_rank"):
            nope, rope = int(cfg["qk_nope_head_dim"]), int(cfg["qk_rope_head_dim"])
            v, lora, q_lora = int(cfg["v_head_dim"]), int(cfg["kv_lora_rank"]), int(cfg.get("q_lora_rank") or 0)
            q = h * q_lora + q_lora + q_lora * heads * (nope + rope) if q_lora else h * heads * (nope + rope)
            return q + h * (lora + rope) + lora + lora * heads * (nope + v) + heads * v * h
        kv = int(cfg.get("num_key_value_heads") or heads)
        hd = int(cfg.get("head_dim") or h // heads)
    except (KeyError, TypeError, ValueError):
        return None
    return h * heads * hd + 2 * h * kv * hd + heads * hd * h


class CheckpointWeights(SpecModel):
    """A checkpoint's weights as its safetensors files declare them (``serving/spec/checkpoint.py`` reads them from
    ``model.checkpoint``): ``layers`` maps each decoder layer index to its bytes when every shard header was read;
    with the index alone it is None and only ``total_size`` and the tensor names are known."""

    source: str = Field(description="The index (or single .safetensors file) read.")
    total_size: int = Field(gt=0, description="Bytes of every tensor (index metadata.total_size).")
    shards: int = Field(gt=0, description="Shard files the index names.")
    headers_read: int = Field(ge=0, description="Shard headers read (all of them, or none).")
    layer_indices: tuple[int, ...] = Field(
        description="Every model.layers.N the checkpoint holds, past num_hidden_layers too (MTP/draft layers)."
    )
    table_tensors: tuple[str, ...] = Field(description="The vocabulary tables (embeddings and heads), wherever held.")
    layers: dict[int, int] | None = Field(default=None, description="Bytes of each decoder layer (shard headers).")
    embedding: int | None = Field(default=None, ge=0, description="Bytes of the input embedding (shard headers).")
    lm_head: int | None = Field(default=None, ge=0, description="Bytes of the LM head; 0 when tied (shard headers).")
    other: int | None = Field(default=None, ge=0, description="Bytes outside layers and tables: the final norm.")

    @property
    def method(self) -> str:
        return "shard headers" if self.layers is not None else "index total_size"


class SpeculativeSpec(SpecModel):
    """Speculative decoding (SGLang 0.5.23's EAGLE family): a draft proposes ``num_draft_tokens`` tokens a step,
    the target verifies them. The draft's weights and KV cache share each GPU with the target's."""

    algorithm: Literal["NEXTN", "EAGLE", "EAGLE3"] = Field(
        description="--speculative-algorithm: NEXTN (multi-token prediction, the MTP layers the target checkpoint "
        "carries: DeepSeek-V3's layer 61; SGLang runs it as EAGLE), EAGLE or EAGLE3 (a separate draft model)."
    )
    draft_path: str | None = Field(
        default=None,
        description="EAGLE/EAGLE3: the draft's directory under the model store (and the local cache); NEXTN: none, "
        "the draft is read from the target's checkpoint.",
    )
    draft_hf_config: str | None = Field(
        default=None,
        description="EAGLE/EAGLE3: path (relative to the stack file) of the draft's config.json, read into "
        "draft_architecture.",
    )
    draft_architecture: Architecture | None = Field(
        default=None, description="The draft's shapes (from draft_hf_config, or given); EAGLE/EAGLE3 only."
    )
    draft_vocab_size: int | None = Field(
        default=None, gt=0, description="EAGLE3: the draft's own LM head rows (config.json draft_vocab_size)."
    )
    num_steps: int = Field(default=3, gt=0, description="--speculative-num-steps: draft steps per verification.")
    eagle_topk: int = Field(default=1, gt=0, description="--speculative-eagle-topk: branches a draft step keeps.")
    num_draft_tokens: int | None = Field(
        default=None,
        gt=0,
        description="--speculative-num-draft-tokens; with eagle_topk 1 SGLang sets it to num_steps + 1 "
        "(arg_groups/speculative_hook.py:1265), so it is rendered as that; with eagle_topk > 1 it must be given.",
    )

    @model_validator(mode="after")
    def _draft(self) -> Self:
        separate = self.algorithm in ("EAGLE", "EAGLE3")
        if separate and (self.draft_path is None or self.draft_architecture is None):
            raise ValueError(
                f"speculative.algorithm {self.algorithm} loads a separate draft model: give speculative.draft_path "
                "(its directory in the model store) and speculative.draft_hf_config (its config.json)"
            )
        if not separate and (self.draft_path is not None or self.draft_architecture is not None):
            raise ValueError(
                "speculative.algorithm NEXTN reads its draft (the MTP layers) from the target's checkpoint; drop "
                "speculative.draft_path and speculative.draft_hf_config, or use EAGLE"
            )
        if self.eagle_topk == 1 and self.num_draft_tokens not in (None, self.num_steps + 1):
            raise ValueError(
                f"speculative.num_draft_tokens = {self.num_draft_tokens} with eagle_topk 1: SGLang resets it to "
                f"num_steps + 1 = {self.num_steps + 1} (arg_groups/speculative_hook.py:1265); drop it or set that"
            )
        if self.eagle_topk > 1 and self.num_draft_tokens is None:
            raise ValueError(
                f"speculative.eagle_topk = {self.eagle_topk} needs speculative.num_draft_tokens (the verified tree's "
                "size); give it"
            )
        return self

    @property
    def draft_tokens(self) -> int:
        """The tokens each step verifies: ``num_draft_tokens``, num_steps + 1 with eagle_topk 1."""
        return self.num_draft_tokens or self.num_steps + 1


MODEL_PATH_FIELDS = ("hf_config", "checkpoint")
"""The ``model:`` fields that name files (relative to the stack file), read when the stack loads."""


class ModelSpec(SpecModel):
    name: str = Field(default="llama-3-70b", description="Model name (served model name).")
    path: str = Field(
        default="meta-llama/Meta-Llama-3-70B-Instruct",
        description="Directory under the model store (and the local cache) holding the weights.",
    )
    precision: Precision = Field(default=Precision.FP16, description="Weight precision.")
    quantization: Literal["fp8", "awq", "gptq", "w8a8_int8"] | None = Field(
        default=None, description="SGLang --quantization method for quantised precisions."
    )
    kv_cache_dtype: Literal["auto", "fp8_e5m2", "fp8_e4m3"] = Field(
        default="auto", description="KV cache dtype; auto = 16-bit activations dtype."
    )
    hf_config: str | None = Field(
        default=None, description="Path (relative to the stack file) of a HF config.json to read the architecture from."
    )
    checkpoint: str | None = Field(
        default=None,
        description="Path (relative to the stack file) of the checkpoint's model.safetensors.index.json, a single "
        ".safetensors file or their directory: the weights are counted from it (shard headers where present).",
    )
    checkpoint_weights: CheckpointWeights | None = Field(
        default=None, description="What the stack loader read from model.checkpoint (not written by hand)."
    )
    architecture: Architecture = Field(default_factory=Architecture)
    speculative: SpeculativeSpec | None = Field(default=None, description="Speculative decoding; none by default.")
    activation_fraction: float = Field(
        default=0.15, ge=0, le=1, description="Activations as a share of weights (source: 10–20 %, 30 GB of 200)."
    )
    framework_overhead_gb: float = Field(
        default=5.0, ge=0, description="Framework overhead per GPU process (CUDA context, NCCL, allocator)."
    )
    safety_margin: float = Field(default=0.15, ge=0, lt=1, description="Margin on the summed budget (source: 15 %).")

    @model_validator(mode="after")
    def _quant(self) -> Self:
        """Quantised precisions need a quantisation method SGLang understands."""
        if self.precision in (Precision.INT4, Precision.INT8) and self.quantization is None:
            raise ValueError(
                f"precision {self.precision.value} needs model.quantization (awq/gptq for int4, w8a8_int8 for int8)"
            )
        method = self.architecture.quant_method
        if self.precision == Precision.FP8 and method not in (None, "fp8"):
            raise ValueError(
                f"precision fp8 with a checkpoint whose quantization_config.quant_method is {method!r}: SGLang 0.5.23 "
                "refuses --quantization fp8 for it (configs/model_config.py:2143, the checkpoint's method and the "
                "flag differ) and serves no such FP8 method this spec can name; use an FP8 checkpoint whose "
                "quant_method is fp8, or the 16-bit checkpoint (online FP8)"
            )
        if (
            method not in (None, "fp8")
            and self.quantization not in (None, method)
            and method not in COMPATIBLE_CHECKPOINTS.get(self.quantization or "", ())
        ):
            raise ValueError(
                f"model.quantization={self.quantization!r} with a checkpoint whose quantization_config.quant_method is "
                f"{method!r}: SGLang 0.5.23 refuses a --quantization other than the checkpoint's method "
                f"(configs/model_config.py:2143); set model.quantization to {method!r}"
            )
        if self.online_fp8 and self.quantization != "fp8":
            raise ValueError(
                f"precision fp8 with model.quantization={self.quantization!r}: the architecture names no FP8 "
                f"checkpoint (quantization_config.quant_method {method!r}), so SGLang serves "
                "it as FP8 only by quantising its 16-bit weights at load (--quantization fp8); set model.quantization "
                "fp8, or point model.hf_config at the FP8 checkpoint's config.json"
            )
        if self.precision in (Precision.FP16, Precision.BF16) and self.quantization is not None:
            raise ValueError(
                f"model.quantization={self.quantization!r} contradicts precision {self.precision.value}; "
                "drop quantization or pick a quantised precision"
            )
        return self

    @model_validator(mode="after")
    def _checkpoint_layers(self) -> Self:
        """The checkpoint holds every decoder layer config.json declares."""
        ckpt = self.checkpoint_weights
        if ckpt is None:
            return self
        missing = sorted(set(range(self.architecture.num_layers)) - set(ckpt.layer_indices))
        if missing:
            raise ValueError(
                f"model.checkpoint {ckpt.source} holds no tensors of layers {missing[0]}…{missing[-1]} "
                f"({len(missing)} of the architecture's num_layers={self.architecture.num_layers}); point "
                "model.checkpoint and model.hf_config at the same checkpoint"
            )
        return self

    @property
    def online_fp8(self) -> bool:
        """FP8 served from a 16-bit checkpoint: SGLang allocates and loads the 16-bit weights, then quantises them
        (:data:`serving.plan.weights.ONLINE_FP8_SOURCE`); planned by its load peak and what stays resident."""
        return self.precision == Precision.FP8 and not self.architecture.fp8_checkpoint

    @property
    def bytes_per_param(self) -> float:
        return BYTES_PER_PARAM[self.precision]

    @property
    def kv_bytes_per_element(self) -> int:
        return 1 if self.kv_cache_dtype.startswith("fp8") else 2


def load_hf_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ValueError(f"model.hf_config: {path} does not exist; fix the path (relative to the stack file)") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"model.hf_config: {path} is not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"model.hf_config: {path} must hold a JSON object")
    return architecture_from_hf_config(data, str(path))
