"""`exaserve fit` through the installed console script: ranking, the JSON contract, --write-stack, bad input."""

from __future__ import annotations

from pathlib import Path

from serving.spec.stack import load_stack_file
from tests.support.cli import exaserve, json_object


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
    served = [lay["served_sequences"] for lay in layouts]
    assert served == sorted(served, reverse=True) and served[0] > 0
    # 405 B parameters at 2 B do not fit one 80 GB GPU: no bf16 layout with fewer than 16 GPUs survives.
    assert all(lay["gpus_per_replica"] >= 16 for lay in layouts if lay["precision"] == "bf16")
    best = doc["meets_target"][0]
    spec = load_stack_file(out).spec
    assert (spec.parallelism.tp, spec.parallelism.pp) == (best["tp"], best["pp"])
    assert spec.cluster.gpu.product == "NVIDIA-H100-80GB-HBM3"
    plan = exaserve("plan", "--stack-file", str(out), "--json")
    assert json_object(plan)["capacity"]["kv_pool_tokens_per_replica"] == best["kv_pool_tokens_per_replica"]


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
