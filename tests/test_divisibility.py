"""The shape checks and the pipeline partition the planner mirrors, against the pinned SGLang's own code.

``tests/support/sglang_divisibility.py`` runs SGLang's ``get_pp_indices``, ``check_quantized_moe_compatibility``
and ``Fp8LinearMethod.validate_block_quant_shapes`` (their bodies from the installed source) over grids of
shapes; the planner's verdict must be SGLang's, case for case. The head rules are asserts inside model
constructors that need a GPU process group: those are checked against the source lines they quote."""

from __future__ import annotations

import itertools
import json
import math
import re
from typing import Any

import pytest

from serving.plan import divisibility as div
from serving.plan.calibration import FREE_AT_START_SOURCE, LOAD_OVERHEAD_GIB
from serving.plan.fit import EXPERTS_PER_GPU
from serving.plan.latency import PP_MICRO_BATCH_SIZE, PP_MICRO_BATCHES
from serving.plan.memory import (
    DP_GRAPH_RESERVE,
    DRAFT_KV,
    KV_HEADS_ATTN_TP,
    PP_MIN_TOKENS,
    RUNNING_PER_WORKER,
    replica_pool,
)
from serving.plan.weights import (
    ATTN_TP_EMBEDDING,
    ATTN_TP_HEADS,
    DEFAULT_GROUP_SIZE,
    DRAFT_TABLES_FREED_LATE,
    DRAFT_WEIGHTS,
    GROUP_SCALES,
    GROUP_ZEROS,
    MLA_W_KC,
    MLA_W_VC,
    MOE_GATE_WHOLE,
    NEXTN_DRAFT_LAYERS,
    NEXTN_EH_PROJ,
    NEXTN_EMBED,
    NEXTN_HEAD,
    PP_PARTITION,
    REPLICATED_A_PROJ,
    SKIPPED_LAYER,
    layer_linears,
    pp_stage_layers,
    stage_weights,
    unquantized_parameters,
)
from serving.spec.schema import GIB, Architecture, architecture_from_hf_config
from tests.support.sglang_parsers import ROOT, SGLANG_PYTHON, SGLANG_VENV, run_json_script_args

TPS = (1, 2, 4, 8, 16, 32, 64)
BLOCK = (128, 128)


def _sglang(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return run_json_script_args(SGLANG_PYTHON, [str(ROOT / "tests" / "support" / "sglang_divisibility.py")], cases)


def _arch(**fields: Any) -> Architecture:
    base: dict[str, Any] = {"num_layers": 8, "hidden_size": 4096, "num_attention_heads": 64, "num_kv_heads": 64}
    return Architecture.model_validate({**base, **fields})


def test_the_quoted_source_lines_are_sglangs() -> None:
    """Every check the planner cites is at the quoted line of the installed 0.5.23 source (a moved or changed
    check fails here, and the citations in the reasons with it)."""
    srt = next(SGLANG_VENV.glob("lib/python*/site-packages/sglang/srt"))
    checks = (
        *div.SOURCE_CHECKS,
        *FREE_AT_START_SOURCE,
        EXPERTS_PER_GPU,
        PP_MICRO_BATCHES,
        PP_MICRO_BATCH_SIZE,
        PP_PARTITION,
        PP_MIN_TOKENS,
        GROUP_SCALES,
        GROUP_ZEROS,
        SKIPPED_LAYER,
        DP_GRAPH_RESERVE,
        KV_HEADS_ATTN_TP,
        ATTN_TP_HEADS,
        ATTN_TP_EMBEDDING,
        DRAFT_WEIGHTS,
        DRAFT_KV,
        NEXTN_DRAFT_LAYERS,
        DRAFT_TABLES_FREED_LATE,
        NEXTN_EMBED,
        NEXTN_HEAD,
        NEXTN_EH_PROJ,
        RUNNING_PER_WORKER,
        REPLICATED_A_PROJ,
        MOE_GATE_WHOLE,
        MLA_W_KC,
        MLA_W_VC,
    )
    for check in checks:
        line = (srt / check.path).read_text().splitlines()[check.line - 1]
        assert check.fragment in line, f"{check.where}: {line.strip()!r} does not hold {check.fragment!r}"
    version = next(SGLANG_VENV.glob("lib/python*/site-packages/sglang-*.dist-info")).name
    assert version.startswith("sglang-0.5.23."), version


def test_pp_partition_is_sglangs_get_pp_indices() -> None:
    cases = [{"kind": "pp", "layers": n, "pp": pp} for n in (7, 24, 32, 61, 80, 94, 126) for pp in (1, 2, 3, 4, 8, 16)]
    cases = [c for c in cases if c["pp"] <= c["layers"]]
    for r in _sglang(cases):
        ours = [[s.start, s.stop] for s in pp_stage_layers(r["layers"], r["pp"])]
        assert ours == r["stages"], r
    # The extra layers go to the last stages: DeepSeek-V3's 61 layers over 8 stages are 7 × 3 then 8 × 5.
    assert [len(s) for s in pp_stage_layers(61, 8)] == [7, 7, 7, 8, 8, 8, 8, 8]


def test_block_fp8_moe_rule_is_sglangs() -> None:
    """check_quantized_moe_compatibility over expert widths × TP × EP (every EP dividing TP and some that do not)."""
    cases = [
        {"kind": "moe", "tp": tp, "ep": ep, "moe_intermediate_size": moe_i, "block": list(BLOCK)}
        for moe_i, tp, ep in itertools.product((768, 1408, 1536, 2048, 2560), TPS, (1, 2, 3, 4, 8, 16))
        if ep <= tp
    ]
    verdicts = _sglang(cases)
    rejected = 0
    for r in verdicts:
        arch = _arch(
            weight_block_size=BLOCK,
            moe={"num_experts": 64, "experts_per_token": 8, "intermediate_size": r["moe_intermediate_size"]},
        )
        ours = [x for x in div.rejections(arch, r["tp"], "fp8", r["ep"]) if "moe_intermediate_size" in x or "EP" in x]
        assert bool(ours) == (r["error"] is not None), r
        rejected += bool(ours)
    assert 0 < rejected < len(verdicts)


def test_block_fp8_dense_mlp_rule_is_sglangs() -> None:
    """validate_block_quant_shapes for a Llama MLP (merged gate/up, row-parallel down) over widths × TP."""
    widths = (11008, 12288, 14336, 18432, 27648, 28672, 53248)
    cases = [
        {"kind": "linear", "tp": tp, "hidden": 4096, "intermediate": i, "block": list(BLOCK)}
        for i, tp in itertools.product(widths, TPS)
        if i % tp == 0
    ]
    verdicts = _sglang(cases)
    rejected = 0
    for r in verdicts:
        ours = div.rejections(_arch(weight_block_size=BLOCK, intermediate_size=r["intermediate"]), r["tp"], "fp8")
        assert bool(ours) == (r["error"] is not None), r
        rejected += bool(ours)
    assert 0 < rejected < len(verdicts)


@pytest.mark.parametrize(
    ("heads", "kv", "tp", "rejected_by"),
    [
        (64, 4, 8, None),  # KV heads replicated: 8 is a multiple of 4
        (64, 8, 8, None),
        (40, 8, 16, div.HEADS),  # Qwen3-14B: 40 heads over 16 ranks
        (48, 12, 8, div.KV_SPLIT),  # 12 KV heads over 8 ranks
        (48, 6, 8, div.KV_REPLICATED),  # 6 KV heads cannot be replicated evenly over 8 ranks
    ],
)
def test_head_rules(heads: int, kv: int, tp: int, rejected_by: div.SourceCheck | None) -> None:
    reasons = div.rejections(_arch(num_attention_heads=heads, num_kv_heads=kv), tp, "bf16")
    if rejected_by is None:
        assert reasons == []
    else:
        assert len(reasons) == 1 and rejected_by.where in reasons[0] and str(tp) in reasons[0], reasons


MOE = {"num_experts": 128, "experts_per_token": 8, "intermediate_size": 1536}


@pytest.mark.parametrize(
    ("kv", "tp", "attn_dp", "rejected_by"),
    [
        (4, 8, 2, None),  # attention-TP 4 over 4 KV heads
        (4, 8, 8, None),  # attention-TP 1: every GPU holds the 4 heads
        (6, 8, 2, div.MOE_KV_SPLIT),  # 6 KV heads over attention-TP 4
        (3, 16, 2, div.MOE_KV_REPLICATED),  # 3 KV heads cannot be replicated evenly over attention-TP 8
        (4, 8, 3, div.ATTN_DP_DIVIDES),
    ],
)
def test_attention_dp_head_rules_use_the_attention_tp_size(
    kv: int, tp: int, attn_dp: int, rejected_by: div.SourceCheck | None
) -> None:
    """Qwen3-MoE splits (or replicates) its KV heads over attention-TP = TP / attn_dp (qwen3_moe.py:512, :516), and
    SGLang asserts attn_dp divides TP (parallel_hook.py:326)."""
    reasons = div.rejections(_arch(num_attention_heads=96, num_kv_heads=kv, moe=MOE), tp, "bf16", attn_dp=attn_dp)
    if rejected_by is None:
        assert reasons == []
    else:
        assert any(rejected_by.where in r for r in reasons), reasons


def test_block_rules_apply_only_to_a_block_fp8_checkpoint() -> None:
    """Online FP8 of a 16-bit checkpoint has no blocks; bf16 layouts are never checked for them."""
    moe = {"num_experts": 128, "experts_per_token": 8, "intermediate_size": 1536}
    blocked = _arch(weight_block_size=BLOCK, moe=moe)
    assert div.rejections(blocked, 8, "bf16") == []
    assert div.rejections(_arch(moe=moe), 8, "fp8") == []
    (reason,) = div.rejections(blocked, 8, "fp8")
    assert re.search(r"1536 / \(TP 8 / EP 1\) = 192 is not a multiple of the 128-wide weight block", reason)
    assert div.MOE_BLOCK.where in reason and "--ep-size 2 passes" in reason


def _deepseek() -> Architecture:
    cfg = json.loads((ROOT / "models" / "deepseek-v3" / "config.json").read_text())
    return Architecture.model_validate(architecture_from_hf_config(cfg, "deepseek-v3"))


def test_pipeline_stages_hold_their_own_layers_and_the_pool_is_their_minimum() -> None:
    """DeepSeek-V3 FP8 at TP 1 × PP 8: the three dense layers sit on stage 1, the five extra layers on the last
    stages, the LM head on the last; so the last stage is the fullest, heavier than ⌈61/8⌉ mean layers (the
    planner's former split), and the replica's pool is that stage's, the minimum over stages."""
    arch = _deepseek()
    stages = stage_weights(arch, 1.0, 1, 8)
    assert [len(s.layers) for s in stages] == [7, 7, 7, 8, 8, 8, 8, 8]
    tables = 2 * arch.vocab_size * arch.hidden_size
    # every layer's parameters at 1 B, but the MoE gates at 2 B and kv_b_proj's 16-bit w_kc/w_vc copies (TP 1)
    assert arch.mla is not None and arch.moe is not None
    gates = (arch.num_layers - arch.moe.dense_layers) * arch.moe.num_experts * arch.hidden_size * (2 - 1)
    copies = arch.num_layers * arch.mla.kv_b_parameters(arch.num_attention_heads) * 2
    assert sum(s.layer_bytes for s in stages) == pytest.approx(arch.parameter_count - tables + gates + copies)
    former = math.ceil(61 / 8) * (arch.parameter_count - tables) / 61 + tables / 2 * 2 + LOAD_OVERHEAD_GIB * GIB
    last = stages[-1]
    assert last.total > max(s.total for s in stages[:-1])
    assert 3.5 * GIB < last.total - former < 4.5 * GIB  # 8 MoE layers of 11.5 B parameters, not 8 of the 10.97 B mean
    assert stages[0].total < stages[1].total  # stage 1 holds the small dense layers
    rp = replica_pool(arch, 1.0, 2, 1, 8, 140 * GIB, 0.9)
    assert rp.binding == 7 and rp.tokens == min(pool.tokens for _, _, pool in rp.stages)
    assert len({pool.tokens for _, _, pool in rp.stages}) > 1


def test_int4_weights_carry_the_group_scales_and_zeros() -> None:
    """AWQ/GPTQ store per group of g input rows one 16-bit scale and one 4-bit zero per output column
    (awq_linear.py, quoted above): 0.5 + 2.5 / g bytes a parameter, +3.9 % at g = 128. Before, int4 layers
    were counted at 0.5 B flat. The group size comes from config.json when it declares one."""
    cfg = json.loads((ROOT / "models" / "llama-3-70b" / "config.json").read_text())
    arch = Architecture.model_validate(architecture_from_hf_config(cfg, "llama-3-70b"))
    assert arch.quant_group_size is None
    flat = stage_weights(arch, 0.5, 1, 1)[0]
    grouped = stage_weights(arch, 0.5, 1, 1, DEFAULT_GROUP_SIZE)[0]
    assert grouped.layer_bytes == pytest.approx(flat.layer_bytes * (0.5 + 2.5 / 128) / 0.5)
    assert grouped.layer_bytes / flat.layer_bytes - 1 == pytest.approx(0.039, abs=0.001)
    assert "2.5 / group 128" in grouped.formula and GROUP_SCALES.where in grouped.formula
    declared = {**cfg, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 64}}
    arch64 = Architecture.model_validate(architecture_from_hf_config(declared, "awq"))
    assert arch64.quant_group_size == 64
    with pytest.raises(ValueError, match="group_size = 'x' is not a positive integer"):
        architecture_from_hf_config({**cfg, "quantization_config": {"quant_method": "awq", "group_size": "x"}}, "bad")
    # a quantization_config without its quant_method: loaded quantised or quantised online cannot be told
    with pytest.raises(ValueError, match=r"names no quant_method.*as the model repository publishes it"):
        architecture_from_hf_config({**cfg, "quantization_config": {"group_size": 64}}, "bad")
    assert arch64.quant_method == "awq" and not arch64.fp8_checkpoint


def test_first_stage_weights_match_a_public_pp_log() -> None:
    """https://github.com/sgl-project/sglang/issues/8337: Qwen3-235B-A22B bf16 at PP 4 × TP 8 on H200, rank TP0 PP0
    logs ``Load weight end. … mem usage=13.73 GB``. SGLang's partition gives that stage 23 of the 94 layers (the
    two extra ones go to the last stages) and the embedding: the planner's stage 1 is within 0.5 %, where ⌈94/4⌉ =
    24 mean layers would be 4 % over."""
    cfg = json.loads((ROOT / "models" / "qwen3-235b-a22b" / "config.json").read_text())
    arch = Architecture.model_validate(architecture_from_hf_config(cfg, "qwen3-235b-a22b"))
    stages = stage_weights(arch, 2.0, 8, 4)
    assert [len(s.layers) for s in stages] == [23, 23, 24, 24]
    logged = 13.73
    assert stages[0].total / GIB == pytest.approx(logged, rel=0.005)
    assert stages[-1].total / GIB > logged * 1.035  # the fullest stage is not the one that logged


_SKIP_ARCH = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 128,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "num_hidden_layers": 4,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "num_experts_per_tok": 2,
    "vocab_size": 1000,
}
SKIP_LISTS: dict[str, list[str]] = {
    "every attention projection and the end layers' MLPs (Meta's FP8 layout)": [
        *(f"model.layers.{i}.self_attn.{p}" for i in range(4) for p in ("q_proj", "k_proj", "v_proj", "o_proj")),
        *(f"model.layers.{i}.mlp.{p}" for i in (0, 3) for p in ("gate_proj", "up_proj", "down_proj")),
        "lm_head",
    ],
    "a whole layer, without the model. prefix": ["layers.0"],
    "the MoE router name that must not catch gate_up_proj": ["mlp.gate"],
    "every attention block by a dotted run": ["self_attn"],
    "one layer's MLP": ["model.layers.2.mlp"],
    "one expert's projection": ["model.layers.1.mlp.experts.3.down_proj"],
    "shared experts only": ["shared_experts"],
    "nothing inside the layers": ["lm_head"],
}
FUSED = {"self_attn.qkv_proj": "self_attn.q_proj", "mlp.gate_up_proj": "mlp.gate_proj"}


def test_unquantized_modules_are_the_layers_sglang_skips() -> None:
    """For each ignore list (as config.json's quantization_config gives it, read like SGLang's ``Fp8Config``),
    every projection SGLang builds (fused names, as its model code passes them) is left in 16 bit by SGLang's own
    ``is_layer_skipped`` exactly when the planner counts it at 2 bytes."""
    cases, mine = [], []
    for ignored in SKIP_LISTS.values():
        cfg = {
            **_SKIP_ARCH,
            "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "ignored_layers": ignored},
        }
        arch = Architecture.model_validate(architecture_from_hf_config(cfg, "config.json"))
        for i in range(arch.num_layers):
            planner_names = {p: n for p, n in layer_linears(arch, i)}
            skipped = set(unquantized_parameters(arch, range(i, i + 1))[1])
            for name in planner_names:
                short = name.removeprefix(f"model.layers.{i}.")
                fused = next((f for f, first in FUSED.items() if short.endswith(first)), None)
                if short.endswith(("k_proj", "v_proj", "up_proj")):
                    continue  # judged with their fused projection
                sg_name = name.replace(short, short.replace(FUSED[fused], fused)) if fused else name
                cases.append({"kind": "skipped", "prefix": sg_name, "ignored": list(arch.unquantized_modules)})
                mine.append(name in skipped)
    answers = _sglang(cases)
    wrong = [
        (c["prefix"], c["ignored"][:2], m) for c, a, m in zip(cases, answers, mine, strict=True) if a["skipped"] != m
    ]
    assert not wrong, wrong[:5]
    # SGLang's Fp8Config takes the first key present: an empty ignored_layers leaves modules_to_not_convert unread.
    both = {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "ignored_layers": [],
        "modules_to_not_convert": ["self_attn"],
    }
    assert "unquantized_modules" not in architecture_from_hf_config({**_SKIP_ARCH, "quantization_config": both}, "c")
    # Every list changes something, and some leave something quantised: the grid is not degenerate.
    assert sum(mine) and not all(mine)


def test_deepseeks_replicated_projection_and_gates_are_whole_on_every_gpu() -> None:
    """Issue 41 item 4 (and its review): SGLang builds DeepSeek's fused_qkv_a_proj_with_mqa as a ReplicatedLinear (whole on every GPU,
    in the checkpoint's precision) and its MoE router gate as a 16-bit parameter, also whole; the planner split both
    over TP. DeepSeek-V3 (block FP8) at TP 8: 61 × 7168 × (1536 + 512 + 64) params × 1 B whole instead of / 8 adds
    0.75 GiB; the 58 MoE layers' 256 × 7168 gates at 2 B whole instead of 1 B / 8, 0.19 GiB. Under attention DP 8
    (attention-TP 1) the projection was already whole, so only the gates add."""
    cfg = json.loads((ROOT / "models/deepseek-v3/config.json").read_text())
    arch = Architecture.model_validate(architecture_from_hf_config(cfg, "deepseek-v3"))
    assert arch.mla is not None and arch.mla.q_lora_rank == 1536
    split = {dp: stage_weights(arch, 1.0, 8, 1, attn_dp=dp)[0] for dp in (1, 8)}
    flat = arch.model_copy(update={"mla": None})  # the same bytes split over TP, attention DP aside
    proj = 61 * 7168 * (1536 + 512 + 64) * 1.0 * (1 - 1 / 8)
    gates = 58 * 256 * 7168 * (2 - 1.0 / 8)
    # and post_load_weights' 16-bit w_kc/w_vc copies of each kv_b_proj (512 × 128 heads × (128 + 128)), over
    # attention-TP: 8 without attention DP, 1 with attention DP 8
    copies = {dp: 61 * 512 * 128 * (128 + 128) * 2 / (8 // dp) for dp in (1, 8)}
    even = stage_weights(flat, 1.0, 8, 1)[0].total
    assert split[1].total - even == pytest.approx(proj + gates + copies[1], rel=1e-9)
    assert (round(proj / GIB, 2), round(gates / GIB, 2), round(copies[1] / GIB, 2), round(copies[8] / GIB, 2)) == (
        0.75,
        0.19,
        0.24,
        1.91,
    )
    assert MLA_W_KC.where in split[1].formula and MLA_W_VC.where in split[8].formula
    assert "fused_qkv_a_proj_with_mqa" in split[1].formula and REPLICATED_A_PROJ.where in split[1].formula
    assert "fused_qkv_a_proj_with_mqa" not in split[8].formula and MOE_GATE_WHOLE.where in split[8].formula
    # a dense GQA model has neither: nothing added
    llama = json.loads((ROOT / "models/llama-3-70b/config.json").read_text())
    gqa = Architecture.model_validate(
        {**architecture_from_hf_config(llama, "llama"), "parameter_count": 70_553_706_496}
    )
    assert "whole on every GPU" not in stage_weights(gqa, 2.0, 8, 1)[0].formula


def test_experts_that_do_not_divide_over_ep_are_refused() -> None:
    """SGLang asserts the routed experts divide over EP (layers/moe/fused_moe_triton/layer.py:413): Mixtral's 8 at
    TP 16 / EP 16 is refused naming the check; EP 8 passes; EP 1 never trips it."""
    mixtral = _arch(
        num_layers=32, num_attention_heads=32, num_kv_heads=8, moe={"num_experts": 8, "experts_per_token": 2}
    )
    assert any("8 experts are not divisible by EP 16" in r and div.EXPERTS_DIVIDE.where in r
               for r in div.rejections(mixtral, 16, "bf16", ep=16))  # fmt: skip
    assert not [r for r in div.rejections(mixtral, 8, "bf16", ep=8) if "experts" in r]
    assert not [r for r in div.rejections(mixtral, 16, "bf16", ep=1) if "experts are not" in r]
