"""`exaserve fit` through the installed console script: ranking, the JSON contract, --write-stack, bad input."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from serving.plan.calibration import GPU_PRODUCTS
from serving.plan.fit import enumerate_layouts
from serving.plan.latency import Assumptions
from serving.spec.schema import Architecture, architecture_from_hf_config
from serving.spec.stack import load_stack_file
from tests.support.cli import exaserve, json_object
from tests.support.paths import REPO
from tests.support.safetensors_files import meta_fp8_checkpoint

WEIGHT_BITS = {"bf16": 16, "fp8": 8, "fp8-online": 8, "int8": 8, "int4": 4}


def assert_ranked(layouts: list[dict[str, Any]]) -> None:
    """fit's order: accuracy classes first (more weight bits, an FP8 checkpoint before online FP8, a 16-bit KV cache
    before FP8), inside a class the most output tokens a second at the load, and each figure what the step says."""
    classes = [(-WEIGHT_BITS[x["precision"]], x["online_quantization"], x["kv_cache_dtype"] != "auto") for x in layouts]
    assert classes == sorted(classes), classes
    for a, b in itertools.pairwise(layouts):
        if (a["precision"], a["kv_cache_dtype"]) == (b["precision"], b["kv_cache_dtype"]):
            assert a["output_tokens_per_second"] >= b["output_tokens_per_second"], (a, b)
    for x in layouts:
        tokens = x["replicas"] * x["sequences_per_replica"] / x["decode_step_s"]
        assert x["output_tokens_per_second"] == pytest.approx(tokens, abs=0.1) and x["decode_step_s"] > 0


def test_fit_ranks_layouts_and_writes_a_stack_that_plans(tmp_path: Path) -> None:
    out = tmp_path / "Pulumi.fit.yaml"
    r = exaserve(
        "fit",
        "--hf-config",
        "models/llama-3.1-405b/config.json",
        "--gpu",
        "NVIDIA-H100-80GB-HBM3",
        "--stack",
        "dev",
        "--write-stack",
        str(out),
        "--json",
    )
    assert r.returncode == 0, r.stderr
    doc = json_object(r)
    assert doc["stack"] == "dev" and doc["ok"] is True
    layouts = doc["layouts"]
    assert_ranked(layouts)
    assert layouts[0]["served_sequences"] > 0
    # 405 B parameters at 2 B do not fit one 80 GB GPU: no bf16 layout with fewer than 16 GPUs survives.
    assert all(lay["gpus_per_replica"] >= 16 for lay in layouts if lay["precision"] == "bf16")
    best = doc["meets_target"][0]
    spec = load_stack_file(out).spec
    assert (spec.parallelism.tp, spec.parallelism.pp) == (best["tp"], best["pp"])
    assert spec.cluster.gpu.product == "NVIDIA-H100-80GB-HBM3"
    # Issue 28: hf_config was written absolute; it is relative to the written file, as the loader reads it
    hf_config = yaml.safe_load(out.read_text())["config"]["exaserve:model"]["hf_config"]
    assert (
        not Path(hf_config).is_absolute()
        and (out.parent / hf_config).resolve() == (REPO / "models/llama-3.1-405b/config.json").resolve()
    ), hf_config
    plan = exaserve("plan", "--stack-file", str(out), "--json")
    assert json_object(plan)["capacity"]["kv_pool_tokens_per_replica"] == best["kv_pool_tokens_per_replica"]


def test_fit_counts_the_weights_from_a_checkpoint_and_writes_it_into_the_stack(tmp_path: Path) -> None:
    """--checkpoint: the weights per GPU are the checkpoint's (Llama-3.1-405B in Meta's FP8 layout: 47.98 GiB a GPU
    at TP 8 from config.json, 56.96 from the shard headers); the written stack names the checkpoint relative to
    itself and plans the same pool."""
    index = meta_fp8_checkpoint(tmp_path / "ckpt", REPO / "models/llama-3.1-405b/config.json")
    out = tmp_path / "stacks" / "Pulumi.fit.yaml"
    out.parent.mkdir()
    # the 16-bit config: an FP8 layout written into a stack would plan as online FP8 there, so it is refused
    bf16 = ["fit", "--hf-config", "models/llama-3.1-405b/config.json", "--gpu", "NVIDIA-H100-80GB-HBM3", "--stack",
            "dev", "--precision", "fp8"]  # fmt: skip
    refused = exaserve(*bf16, "--checkpoint", str(index.parent), "--write-stack", str(out))
    assert refused.returncode == 2 and not out.exists(), refused.stdout + refused.stderr
    assert "names none" in " ".join(refused.stderr.split()), refused.stderr
    # an FP8 checkpoint's config.json names its quantisation (quant_method fp8, as SGLang 0.5.23 loads it)
    config = tmp_path / "config.json"
    published = json.loads((REPO / "models/llama-3.1-405b/config.json").read_text())
    config.write_text(
        json.dumps({**published, "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}})
    )
    args = ["fit", "--hf-config", str(config), "--gpu", "NVIDIA-H100-80GB-HBM3", "--stack", "dev", "--precision",
            "fp8", "--json"]  # fmt: skip
    before = json_object(exaserve(*args))["layouts"][0]
    r = exaserve(*args, "--checkpoint", str(index.parent), "--write-stack", str(out))
    assert r.returncode == 0, r.stderr
    best = json_object(r)["layouts"][0]
    assert (best["tp"], best["pp"]) == (before["tp"], before["pp"]) == (8, 1)
    assert round(before["weights_bytes_per_gpu"] / 2**30, 2) == 47.98
    assert round(best["weights_bytes_per_gpu"] / 2**30, 2) == 56.96
    assert best["kv_pool_tokens_per_replica"] < before["kv_pool_tokens_per_replica"]
    model = yaml.safe_load(out.read_text())["config"]["exaserve:model"]
    assert model["checkpoint"] == "../ckpt" and "checkpoint_weights" not in model
    plan = exaserve("plan", "--stack-file", str(out), "--json")
    assert json_object(plan)["capacity"]["kv_pool_tokens_per_replica"] == best["kv_pool_tokens_per_replica"]
    two = exaserve(*args[:-3], "--checkpoint", str(index), "--precision", "fp8", "--precision", "bf16")
    assert two.returncode == 2 and "give its --precision once" in " ".join(two.stderr.split())  # rich wraps lines


def test_write_stack_keeps_the_base_stacks_comments_quoting_and_other_keys(tmp_path: Path) -> None:
    """Issue 28: `--write-stack` dropped the base file's comments (it re-serialised the parsed document). The base
    is edited round-trip: every comment, quoted value, other namespace's key and the secrets provider stay; only the
    layout's fields change."""
    base = tmp_path / "Pulumi.base.yaml"
    text = (REPO / "Pulumi.sandbox.yaml").read_text()
    moved = text.replace("config:\n", "config:\n  aws:region: eu-west-1\n", 1).replace(
        "hf_config: models/",
        f"hf_config: {REPO}/models/",  # the base sits in tmp_path, its model in the repo
    )
    base.write_text("secretsprovider: passphrase\nencryptedkey: c2VjcmV0\n" + moved)
    comments = [line.strip() for line in text.splitlines() if line.strip().startswith("#")]
    assert len(comments) >= 10  # the sandbox stack explains its ports, versions and soak in comments
    out = tmp_path / "Pulumi.fit.yaml"
    r = exaserve("fit", "--stack-file", str(base), "--gpu", "NVIDIA-H100-80GB-HBM3",
                 "--hf-config", "models/qwen2.5-0.5b/config.json", "--write-stack", str(out))  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    written = out.read_text()
    kept = [line.strip() for line in written.splitlines() if line.strip().startswith("#")]
    assert [c for c in comments if c not in kept] == [], written
    assert 'name_pattern: "sandbox-{index}"' in written  # quoted as the base quotes it
    doc = yaml.safe_load(written)
    assert (doc["secretsprovider"], doc["encryptedkey"], doc["config"]["aws:region"]) == (
        "passphrase", "c2VjcmV0", "eu-west-1"
    ), written  # fmt: skip
    model = doc["config"]["exaserve:model"]
    assert doc["config"]["exaserve:cluster"]["gpu"]["product"] == "NVIDIA-H100-80GB-HBM3"
    assert "quantization: null" in written and model["quantization"] is None
    spec = load_stack_file(out).spec
    assert spec.sandbox is not None and spec.rollout == load_stack_file(REPO / "Pulumi.sandbox.yaml").spec.rollout


def test_fit_exits_1_when_no_layout_meets_the_target() -> None:
    r = exaserve("fit", "--hf-config", "models/llama-3-70b/config.json", "--stack", "dev", "--concurrency", "10000000")
    assert r.returncode == 1 and "no layout meets the target" in r.stdout


def test_fit_bad_input_exits_2_naming_the_fix(tmp_path: Path) -> None:
    not_model = tmp_path / "config.json"
    not_model.write_text('{"foo": 1}')
    r = exaserve("fit", "--hf-config", str(not_model), "--json")
    assert r.returncode == 2
    err = json_object(r)
    assert err["ok"] is False and "is not a transformer config.json" in err["error"] and "config.json" in err["error"]
    r = exaserve("fit", "--hf-config", "models/llama-3-70b/config.json", "--gpu", "TPU-v9")
    assert r.returncode == 2 and "unknown GPU product 'TPU-v9'" in r.stderr and "GPU_PRODUCTS" in r.stderr
    r = exaserve("fit", "--hf-config", "models/deepseek-v3/config.json", "--precision", "fp4")
    assert r.returncode == 2 and "not a precision" in r.stderr


def test_a_target_no_layout_sustains_shows_the_table_and_says_by_how_much(tmp_path: Path) -> None:
    """Issue 28: with --concurrency 8000 the table showed layouts serving 8,192 and said "no layout meets the
    target" without why (the target is what a layout sustains after balance, reserve and burst buffer); with
    --write-stack the table disappeared and only the error was printed."""
    out = tmp_path / "Pulumi.fit.yaml"
    args = ["fit", "--stack", "prod", "--hf-config", "models/llama-3-70b/config.json", "--concurrency", "8000"]
    r = exaserve(*args, "--write-stack", str(out))
    assert r.returncode == 1 and not out.exists(), r.stdout + r.stderr
    text = " ".join(r.stdout.split())
    assert "sustained" in r.stdout and "8,192" in r.stdout  # the table is there, served and sustained side by side
    assert "no layout meets the target: the most any layout sustains is 5,308 concurrent sequences" in text
    assert "8,192 × 80% balance efficiency = 6,554" in text and "< --concurrency 8,000" in text
    assert "--write-stack: no layout meets the target" in r.stderr and "nothing written" in r.stderr
    j = exaserve(*args, "--write-stack", str(out), "--json")
    doc = json_object(j)  # one JSON object: the error's
    assert j.returncode == 1 and doc["ok"] is False and "5,308" in doc["error"]


# Published recipes: the layout each model's serving guide (or a published SGLang run) gives for one node.
# - DeepSeek-V3 on 8 × H200: sgl-project/sglang benchmark/deepseek_v3/README.md, "Hardware Recommendation: 8 x NVIDIA
#   H200 GPUs" and `launch_server --model deepseek-ai/DeepSeek-V3 --tp 8`; for throughput `--tp 8 --dp 8
#   --enable-dp-attention` (the same README, "Data Parallelism Attention").
# - Llama-3.1-405B FP8 on 8 × H100: sgl-project/sglang docs/references/llama_405B.md, "Run 405B (fp8) on a single
#   node": `--model-path meta-llama/Meta-Llama-3.1-405B-Instruct-FP8 --tp 8`.
# - Qwen3-235B-A22B-FP8 on 4 × H100: the SGLang command of https://github.com/vllm-project/vllm/issues/21348 (the
#   held-out log of tests/test_memory_model.py), TP 4; TP 8 needs --ep-size (SGLang's block-FP8 MoE check, below).
# Each at the prod stack's load (8 running requests a replica, 4K context) and at 1,024 running requests with an 8K
# context (issue 41: ranked for load, not only at ties). The third field is the attention DP expected.
RECIPES = [
    ("models/deepseek-v3/config.json", "NVIDIA-H200", 8, (8, 1, 1), (8, 1, 8)),
    ("models/llama-3.1-405b/config.json", "NVIDIA-H100-80GB-HBM3", 8, (8, 1, 1), (8, 1, 1)),
    ("models/qwen3-235b-a22b-fp8/config.json", "NVIDIA-H100-80GB-HBM3", 4, (4, 1, 1), (4, 1, 1)),
]
LOADED = ("--max-running-requests", "1024", "--context-length", "8192")


@pytest.mark.parametrize(
    ("config", "gpu", "gpus", "at_prod_load", "at_1024"), RECIPES, ids=[r[0].split("/")[1] for r in RECIPES]
)
def test_fit_top_answer_is_the_published_recipe(
    config: str, gpu: str, gpus: int, at_prod_load: tuple[int, int, int], at_1024: tuple[int, int, int]
) -> None:
    """On one node the published recipe ranks first at the prod stack's load and at 1,024 running requests: TP over
    the node, with DeepSeek's attention DP where the load fills its eight pools. The pipeline layouts of the same
    GPUs rank below it on a slower step (each stage reads its weights once a micro-batch), and the table says so.
    Before (issue 41): ranked by served sequences, ties broken by TP over PP, so under 1,024 requests fit put TP 2 ×
    PP 4 with attention DP first for DeepSeek-V3 and plain TP 8 12th–14th."""
    for load, expected in (((), at_prod_load), (LOADED, at_1024)):
        r = exaserve("fit", "--hf-config", config, "--gpu", gpu, "--nodes", "1", "--gpus-per-node", str(gpus),
                     "--precision", "fp8", *load, "--json")  # fmt: skip
        assert r.returncode == 0, r.stderr
        layouts = json_object(r)["layouts"]
        assert_ranked(layouts)
        best = layouts[0]
        assert (best["tp"], best["pp"], best["attn_dp"], best["precision"]) == (*expected, "fp8"), (load, best)
        assert best["rank_reason"].startswith("#1: most output tokens a second at this load")
        same_kv = [lay for lay in layouts if lay["kv_cache_dtype"] == best["kv_cache_dtype"]]
        piped = [lay for lay in same_kv if lay["pp"] > 1]
        assert piped and all(lay["output_tokens_per_second"] < best["output_tokens_per_second"] for lay in piped)
        assert any("each stage reads its weights once a micro-batch" in lay["rank_reason"] for lay in piped), load


def test_the_recipes_stay_first_when_the_latency_models_assumptions_move() -> None:
    """The decode step's constants that are assumptions, not datasheet figures (the collectives' fixed latency,
    the share of each bandwidth a step gets), halved, doubled and derated: each recipe still ranks first at both
    loads. A ranking that flipped inside that band would be the assumptions', not the model's."""
    for config, gpu_label, gpus, at_prod_load, at_1024 in RECIPES:
        arch = Architecture.model_validate(architecture_from_hf_config(json.loads((REPO / config).read_text()), config))
        gpu = GPU_PRODUCTS[gpu_label]
        assert gpu.speed is not None
        for scale, share in ((0.5, 1.0), (2.0, 1.0), (1.0, 0.6), (2.0, 0.6)):
            base = Assumptions()
            moved = Assumptions(
                nvlink_latency_s=base.nvlink_latency_s * scale,
                pcie_latency_s=base.pcie_latency_s * scale,
                fabric_latency_s=base.fabric_latency_s * scale,
                bandwidth_share=share,
            )
            for (running, context), expected in (((8, 4096), at_prod_load), ((1024, 8192), at_1024)):
                result = enumerate_layouts(
                    arch, gpu, gpu.speed, gpus, 1, context, running, 4096, ("fp8",), 50.0, assumptions=moved
                )
                best = next(lay for lay in result.layouts if lay.kv_cache_dtype == "auto")
                assert (best.tp, best.pp, best.attn_dp) == expected, (config, scale, share, running, best.rank_reason)


def test_fit_tries_full_attention_dp_for_a_moe_model() -> None:
    """DeepSeek-V3 on 8 × H200: fit also tries --attn-dp-size = TP (each GPU its own scheduler and pool, taking
    max_running_requests / attn_dp of the requests, resolve_max_num_reqs); each such layout serves attn_dp pools,
    weighs more per GPU (whole attention), and at equal capacity ranks below the same layout without it. A dense
    model (Llama) is not tried with it."""
    r = exaserve("fit", "--hf-config", "models/deepseek-v3/config.json", "--gpu", "NVIDIA-H200", "--nodes", "1",
                 "--gpus-per-node", "8", "--precision", "fp8", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json_object(r)
    layouts, limits = doc["layouts"], load_stack_file(REPO / "Pulumi.prod.yaml").spec.limits
    by = {(lay["tp"], lay["pp"], lay["attn_dp"], lay["kv_cache_dtype"]): lay for lay in layouts}
    dp8, plain = by[(8, 1, 8, "auto")], by[(8, 1, 1, "auto")]
    assert dp8["kv_pools_per_replica"] == 8 and dp8["weights_bytes_per_gpu"] > plain["weights_bytes_per_gpu"]
    per_worker = max(1, limits.max_running_requests // 8)
    assert (
        dp8["sequences_per_replica"] == min(per_worker, dp8["kv_pool_tokens_per_replica"] // limits.context_length) * 8
    )
    # at 8 running requests a replica each attention-DP worker runs one: the whole attention on every GPU makes
    # the step slower and nothing fills the eight pools, so it ranks below plain TP 8, saying so
    assert layouts.index(dp8) > layouts.index(plain) and dp8["decode_step_s"] > plain["decode_step_s"]
    assert re.search(r"a step 1\.\d\d× #\d+'s", dp8["rank_reason"]), dp8["rank_reason"]
    assert {lay["attn_dp"] for lay in layouts if lay["tp"] == 1} == {1}
    llama = exaserve("fit", "--hf-config", "models/llama-3-70b/config.json", "--json")
    assert {lay["attn_dp"] for lay in json_object(llama)["layouts"]} == {1}


def test_fit_refuses_deepseek_v3_tp_32_with_its_published_quantization_config() -> None:
    """Issue 41: models/deepseek-v3/config.json lacked the checkpoint's quantization_config, so no block-FP8 shape
    check ran and fit listed TP 32 on 4 × 8 H100, which SGLang refuses (2048 / 32 = 64 is not a multiple of the
    128-wide block). With DeepSeek's published quantization_config the config defaults to fp8 and TP 32 is excluded."""
    r = exaserve("fit", "--hf-config", "models/deepseek-v3/config.json", "--gpu", "NVIDIA-H100-80GB-HBM3", "--nodes",
                 "4", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json_object(r)
    assert {lay["precision"] for lay in doc["layouts"]} == {"fp8"} and doc["layouts"]
    assert not [lay for lay in doc["layouts"] if lay["tp"] == 32], doc["layouts"]
    tp32 = [e for e in doc["excluded"] if e["tp"] == 32]
    assert tp32 and any("moe_intermediate_size 2048 / (TP 32" in reason for reason in tp32[0]["reasons"]), tp32


def test_fit_excludes_what_sglang_refuses_naming_the_check() -> None:
    """Qwen3-235B-A22B-FP8 at TP 8: 1536 / 8 = 192 is not a multiple of the 128-wide FP8 block, so SGLang
    0.5.23 refuses to start (moe_ep_setup.py); fit excludes TP 8 without EP and says why, with the EP that passes,
    and lists TP 8 with full EP (each GPU 16 whole experts, 1536 / (8 / 8) wide) instead. Without a refusal no
    layout is listed with EP: it prices the same (issue 41)."""
    qwen_fp8 = ("fit", "--hf-config", "models/qwen3-235b-a22b-fp8/config.json", "--gpu", "NVIDIA-H100-80GB-HBM3")
    r = exaserve(*qwen_fp8, "--nodes", "1", "--json")
    assert r.returncode == 0, r.stderr
    doc = json_object(r)
    assert {lay["tp"] for lay in doc["layouts"]} == {1, 2, 4, 8}
    assert {lay["ep"] for lay in doc["layouts"] if lay["tp"] == 8} == {8}
    assert {lay["ep"] for lay in doc["layouts"] if lay["tp"] < 8} == {1}
    (excluded,) = doc["excluded"]
    assert (excluded["precision"], excluded["tp"]) == ("fp8", 8)
    (reason,) = excluded["reasons"]
    assert "1536 / (TP 8 / EP 1) = 192" in reason and "moe_ep_setup.py:169" in reason and "--ep-size 2" in reason
    text = exaserve(*qwen_fp8, "--nodes", "1", "-o", "wide", "--top", "40").stdout
    assert "excluded fp8 TP 8 (SGLang refuses it)" in text and re.search(r"\s8×1 EP 8\s", text), text


# Issue 41: online FP8. A config.json without quantization_config is a 16-bit checkpoint; SGLang 0.5.23 serves it as
# FP8 (--quantization fp8) by loading it whole in 16 bit and quantising afterwards (model_loader/loader.py:1063,
# :1089; layers/quantization/fp8.py:655), so its 16-bit shard must fit in the GPU at load.
LLAMA_405B = "models/llama-3.1-405b/config.json"
ONE_H100_NODE = ("--gpu", "NVIDIA-H100-80GB-HBM3", "--nodes", "1", "--gpus-per-node", "8")


def test_fit_refuses_online_fp8_of_llama_405b_on_one_h100_node_naming_the_load_peak() -> None:
    """Llama-3.1-405B's 16-bit config.json on 8 × H100: fit offered fp8 at TP 8 as if the checkpoint were FP8 (47.98
    GiB a GPU). SGLang loads the 16-bit shard first: 401.65 B layer params × 2 B / 8 = 93.52 GiB + the 16-bit tables
    0.98 + load overhead 0.24 + the FP8 copy of one layer's largest module (gate_up 2 × 16384 × 53248 / 8 = 0.20 GiB)
    = 94.94 GiB > 77.31 GiB free at start (an 8-GPU world on H100 NVLink): refused, with the figure and the fix."""
    r = exaserve("fit", "--hf-config", LLAMA_405B, *ONE_H100_NODE, "--json")
    doc = json_object(r)
    assert r.returncode == 1 and doc["ok"] is False, r.stdout + r.stderr  # neither bf16 nor online FP8 loads here
    assert not [lay for lay in doc["layouts"] if lay["precision"].startswith("fp8")], doc["layouts"]
    by = {(e["precision"], e["tp"], e.get("pp")): e for e in doc["excluded"]}
    (reason,) = by[("fp8-online", 8, 1)]["reasons"]
    assert "94.94 GiB a GPU at load" in reason and "> 77.31 GiB free at start" in reason, reason
    assert "model_loader/loader.py:1063" in reason and "layers/quantization/fp8.py:655" in reason, reason
    assert "use an FP8 checkpoint" in reason and "--precision fp8" in reason, reason
    text = " ".join(exaserve("fit", "--hf-config", LLAMA_405B, *ONE_H100_NODE).stdout.split())
    assert "excluded fp8-online TP 8 × PP 1 (out of GPU memory while SGLang loads it): " in text, text
    assert "94.94 GiB a GPU at load" in text


def test_an_fp8_checkpoint_is_still_planned_at_one_byte_a_parameter(tmp_path: Path) -> None:
    """A config.json declaring quantization_config.quant_method fp8 is an FP8 checkpoint (Fp8Config.from_config,
    layers/quantization/fp8.py:349): loaded as FP8, 1 B a parameter, no 16-bit load peak; fit offers only fp8 for it
    (not bf16, which the checkpoint does not have, nor online FP8), and TP 8 on 8 × H100 still fits at 47.98 GiB."""
    cfg = yaml.safe_load((REPO / LLAMA_405B).read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    r = exaserve("fit", "--hf-config", str(path), "--gpu", "NVIDIA-H100-80GB-HBM3", "--nodes", "2",
                 "--gpus-per-node", "8", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json_object(r)
    assert {lay["precision"] for lay in doc["layouts"]} == {"fp8"}, {lay["precision"] for lay in doc["layouts"]}
    best = doc["layouts"][0]
    assert (best["tp"], best["pp"], best["online_quantization"]) == (8, 1, False), best
    assert round(best["weights_bytes_per_gpu"] / 2**30, 2) == 47.98 and best["load_peak_bytes_per_gpu"] is None
    assert not any(e["precision"] == "fp8-online" for e in doc["excluded"])
    online = exaserve("fit", "--hf-config", str(path), "--precision", "fp8-online", "--json")
    assert online.returncode == 2 and "already FP8" in online.stderr and "--precision fp8" in online.stderr


def test_fit_labels_checkpoint_fp8_and_online_fp8_apart() -> None:
    """On 2 × 8 H100 both load at 16 GPUs; the table and the JSON name which is which, the online layout's breakdown
    gives its load peak, and every FP8-checkpoint layout ranks before online FP8, the reason saying why."""
    args = ("fit", "--hf-config", LLAMA_405B, "--gpu", "NVIDIA-H100-80GB-HBM3", "--nodes", "2", "--gpus-per-node", "8",
            "--precision", "fp8", "--precision", "fp8-online")  # fmt: skip
    doc = json_object(exaserve(*args, "--json"))
    layouts = doc["layouts"]
    assert {(lay["precision"], lay["online_quantization"]) for lay in layouts} == {("fp8", False), ("fp8-online", True)}
    online = [lay for lay in layouts if lay["precision"] == "fp8-online"]
    assert online and all(lay["gpus_per_replica"] == 16 and lay["quantization"] == "fp8" for lay in online), online
    assert all(lay["load_peak_bytes_per_gpu"] > lay["weights_bytes_per_gpu"] for lay in online)
    assert all("at load" in lay["breakdown"] for lay in online)
    twin = next(lay for lay in layouts if lay["precision"] == "fp8" and lay["gpus_per_replica"] == 16)
    first_online = online[0]
    assert layouts.index(first_online) > layouts.index(twin)
    assert all(layouts.index(lay) < layouts.index(first_online) for lay in layouts if lay["precision"] == "fp8")
    assert first_online["rank_reason"].startswith(
        "fp8-online (16-bit checkpoint quantised at load) after an FP8 checkpoint: its 16-bit shard must fit at load"
    ), first_online["rank_reason"]
    text = exaserve(*args, "--top", "40", "-o", "wide").stdout
    assert re.search(r"^\s*fp8-online\s", text, re.M) and re.search(r"^\s*fp8\s", text, re.M), text


def test_qwen3_fp8_on_eight_h100_lists_tp_8_with_ep_and_says_why_it_beats_two_tp_4_replicas() -> None:
    """Issue 41: fit never tried EP, though its own refusal of Qwen3-235B-A22B-FP8 at TP 8 says --ep-size passes. At
    1,024 running requests and an 8K context on 8 × H100 it lists TP 8 with EP 8 with its figures, above two TP 4
    replicas: 4 KV heads split 1 a GPU at TP 4 and are replicated (1 a GPU) at TP 8, so a GPU's cell is the same,
    while TP 8 leaves each GPU about 28 GiB of weights where TP 4 leaves 55: more pool, more sequences, a shorter
    step. The score is the product of the two, and each row says which one it lost on."""
    r = exaserve("fit", "--hf-config", "models/qwen3-235b-a22b-fp8/config.json", *ONE_H100_NODE, *LOADED, "--json")
    assert r.returncode == 0, r.stderr
    layouts = [lay for lay in json_object(r)["layouts"] if lay["kv_cache_dtype"] == "auto"]
    by = {(lay["tp"], lay["pp"], lay["attn_dp"]): lay for lay in layouts}
    ep8, tp4 = by[(8, 1, 1)], by[(4, 1, 1)]
    assert (ep8["ep"], ep8["replicas"], tp4["ep"], tp4["replicas"]) == (8, 1, 1, 2)
    assert ep8["served_sequences"] > 1.5 * tp4["served_sequences"]
    assert ep8["decode_step_s"] < tp4["decode_step_s"]
    assert ep8["output_tokens_per_second"] > 1.5 * tp4["output_tokens_per_second"]
    assert layouts.index(ep8) < layouts.index(tp4)
    assert "tok/s" in tp4["rank_reason"] and "served sequences" in tp4["rank_reason"] + "".join(
        lay["rank_reason"] for lay in layouts[layouts.index(ep8) + 1 : layouts.index(tp4) + 1]
    )
    assert ep8["weights_bytes_per_gpu"] < 0.55 * tp4["weights_bytes_per_gpu"]


@pytest.mark.parametrize(
    ("quant", "precisions", "quantization"),
    [
        ({"quant_method": "gptq", "bits": 4, "group_size": 128}, {"int4"}, "gptq"),
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}, {"int4"}, "awq"),
        ({"quant_method": "w8a8_int8"}, {"int8"}, "w8a8_int8"),
    ],
)
def test_fit_searches_a_quantised_checkpoints_own_precision_and_writes_its_method(
    quant: dict[str, Any], precisions: set[str], quantization: str, tmp_path: Path
) -> None:
    """Issue 41: a config.json whose quant_method is not fp8 defaulted to bf16 and fp8, neither of which the
    checkpoint has. fit now searches the checkpoint's own precision and writes its method as model.quantization
    (SGLang refuses any other --quantization for it, configs/model_config.py:2143); the written stack plans."""
    cfg = {**json.loads((REPO / "models/llama-3-70b/config.json").read_text()), "quantization_config": quant}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    out = tmp_path / "Pulumi.fit.yaml"
    r = exaserve("fit", "--hf-config", str(path), "--write-stack", str(out), "--json")
    assert r.returncode == 0, r.stderr
    layouts = json_object(r)["layouts"]
    assert {lay["precision"] for lay in layouts} == precisions
    assert {lay["quantization"] for lay in layouts} == {quantization}
    assert load_stack_file(out).spec.model.quantization == quantization


def test_fit_refuses_a_quantisation_method_it_does_not_plan_asking_for_the_precision(tmp_path: Path) -> None:
    cfg = {
        **json.loads((REPO / "models/llama-3-70b/config.json").read_text()),
        "quantization_config": {"quant_method": "compressed-tensors"},
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    r = exaserve("fit", "--hf-config", str(path))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "quant_method 'compressed-tensors' is not a method fit plans" in r.stderr and "--precision" in r.stderr
