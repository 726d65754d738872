"""`exaserve fit` through the installed console script: ranking, the JSON contract, --write-stack, bad input."""

from __future__ import annotations

from pathlib import Path

import yaml

from serving.spec.stack import load_stack_file
from tests.support.cli import exaserve, json_object
from tests.support.paths import REPO


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
    # Issue 28: hf_config was written absolute; it is relative to the written file, as the loader reads it
    hf_config = yaml.safe_load(out.read_text())["config"]["exaserve:model"]["hf_config"]
    assert (
        not Path(hf_config).is_absolute()
        and (out.parent / hf_config).resolve() == (REPO / "models/llama-3.1-405b/config.json").resolve()
    ), hf_config
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
