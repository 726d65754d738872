"""`exaserve plan` as users run it: the console script in a subprocess, exit codes, the JSON contract."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.support.cli import exaserve as run
from tests.support.paths import REPO
from tests.support.stacks import SOURCE_PLAN


@pytest.mark.parametrize("stack", ["prod", "dev", "sandbox"])
def test_plan_exits_0_on_shipped_stacks(stack: str) -> None:
    r = run("plan", "--stack", stack)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "plan OK" in r.stdout and "Capacity chain" in r.stdout


@pytest.mark.parametrize("model", ["sglang", "source"])
def test_every_memory_figure_is_shown_in_the_unit_its_formula_ends_in(model: str) -> None:
    """Issue 28, item 7: the weights row showed 38.43 GB beside a formula ending "= 36.03 GiB" (a value in GB, the
    arithmetic in GiB, and the load overhead, a row of its own, added in). Each row now shows the figure its formula
    ends in, in that unit: GiB for SGLang's arithmetic, GB for the source heuristic."""
    r = run("plan", "--stack", "prod", "--memory-model", model)
    table = r.stdout.split("Memory per GPU", 1)[1].split("\n\n", 1)[0]
    rows = [[c.strip() for c in line.strip("│ ").split("│")] for line in table.splitlines() if line.startswith("│")]
    checked = 0
    for name, value, how in (row for row in rows if len(row) == 3 and row[0]):
        ends = re.search(r"= ([\d,.]+) (GiB|GB)$", how)
        if ends is not None and re.fullmatch(r"[\d,.]+ (GiB|GB)", value):
            assert value == " ".join(ends.groups()), f"{name}: {value} beside {how}"
            checked += 1
    assert checked >= 3, table


def test_plan_json_contract() -> None:
    r = run("plan", "--stack", "prod", "--json")
    assert r.returncode == 0, r.stderr
    doc: dict[str, Any] = json.loads(r.stdout)
    assert doc["stack"] == "prod" and doc["ok"] is True
    assert all(set(v) >= {"rule", "path", "message"} for v in doc["violations"])
    cap = doc["capacity"]
    for key in (
        "weights_bytes",
        "kv_cache_bytes_per_token",
        "gpus_per_replica",
        "replicas",
        "replicas_per_node",
        "nodes",
        "per_gpu_memory_bytes",
        "max_concurrent_sequences_per_replica",
        "sustained_concurrency",
        "requests_per_second",
        "heartbeat_messages_per_second",
        "failure_detection_s",
        "recovery_s",
    ):
        assert key in cap, key
    assert cap["replicas"] == 2048 and cap["nodes"] == 256 and cap["gpus_per_replica"] == 1
    assert cap["kv_cache_bytes_per_token"] == 327_680
    assert cap["heartbeat_messages_per_second"] == {"direct": 409.6, "aggregated": 51.2}
    assert set(cap["per_gpu_memory_bytes"]) == {
        "weights",
        "load_overhead",
        "kv_cache",
        "activations_and_graphs",
        "cuda_context",
        "total",
    }
    # SGLang's memory model (issue 12): the static fraction, the KV pool in tokens and in bytes.
    assert cap["memory_model"] == "sglang"
    assert 0 < cap["mem_fraction_static"] < 1
    pool_tokens, pool_bytes = cap["kv_pool_tokens_per_replica"], cap["kv_pool_bytes_per_gpu"]
    assert pool_tokens == int(pool_bytes // 327_680), (
        "the pool in tokens is the pool in bytes over the KV bytes per token"
    )
    assert cap["max_concurrent_sequences_per_replica"] == pool_tokens // 4096  # sequences the KV pool admits
    assert (cap["failure_detection_s"], cap["recovery_s"]) == (18, 28)
    assert doc["memory"]["kv_per_token"]["formula"].startswith("2 × 80 layers × 8 KV heads")
    # Issue 25, finding 6: the declared system pool and the least size derived from its pods' requests.
    pool = doc["system_pool"]
    assert (pool["nodes"], pool["min_nodes"], pool["cpu_per_node"], pool["memory_gb_per_node"]) == (3, 3, 14, 56)
    assert pool["pods"] == [
        {"name": "sglang-router", "replicas": 3, "cpu": "2", "memory": "2Gi", "one_per_node": True},
        {"name": "exaserve-controller", "replicas": 3, "cpu": "500m", "memory": "256Mi", "one_per_node": False},
    ]


def test_source_plan_exits_1_with_the_arithmetic() -> None:
    r = run("plan", "--stack-file", str(SOURCE_PLAN), "--json")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert doc["ok"] is False
    msgs = {v["rule"]: v["message"] for v in doc["violations"] if v["severity"] == "error"}
    assert "needs 96 GPUs, the node has 8" in msgs["placement.gpus-per-node"]


def test_malformed_spec_exits_2_with_path_and_value_no_traceback(tmp_path: Path) -> None:
    text = SOURCE_PLAN.read_text().replace("replicas: 3072", "replicas: three-thousand")
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text(text)
    r = run("plan", "--stack-file", str(bad))
    assert r.returncode == 2
    assert "serving.replicas: got 'three-thousand'" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("plan", "--stack", "nope"), "no stack named 'nope'"),
        (("plan", "--stack-file", "/nonexistent/Pulumi.x.yaml"), "file not found"),
        (("plan", "--bogus"), "No such option"),
    ],
)
def test_bad_input_exits_2(args: tuple[str, ...], needle: str) -> None:
    r = run(*args)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr


def test_schema_is_json_schema_of_the_spec() -> None:
    r = run("schema")
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["title"] == "FleetSpec" and "cluster" in doc["required"]


def test_the_pulumi_file_schema_validates_the_stack_files_and_names_their_mistakes() -> None:
    """Issue 28: validating Pulumi.prod.yaml against `schema` failed on its `config:` wrapper; `schema --pulumi-file`
    is the schema of the file an editor opens."""
    r = run("schema", "--pulumi-file")
    assert r.returncode == 0, r.stderr
    file_schema = json.loads(r.stdout)
    validator = jsonschema.Draft202012Validator(file_schema)
    for path in sorted(REPO.glob("Pulumi.*.yaml")):
        if path.name == "Pulumi.yaml":
            continue
        doc = yaml.safe_load(path.read_text())
        assert not list(validator.iter_errors(doc)), path.name
    prod = yaml.safe_load((REPO / "Pulumi.prod.yaml").read_text())
    assert list(jsonschema.Draft202012Validator(json.loads(run("schema").stdout)).iter_errors(prod))  # the old way
    typo = {**prod, "config": {**prod["config"], "exaserve:rolout": {"batches": 5}}}
    assert any("exaserve:rolout" in e.message for e in validator.iter_errors(typo))
    wrong = yaml.safe_load((REPO / "Pulumi.prod.yaml").read_text())
    wrong["config"]["exaserve:rollout"]["batches"] = "five"
    assert [list(e.absolute_path) for e in validator.iter_errors(wrong)] == [["config", "exaserve:rollout", "batches"]]
    other = {**prod, "config": {**prod["config"], "aws:region": "eu-west-1"}, "secretsprovider": "passphrase"}
    assert not list(validator.iter_errors(other))  # other namespaces and Pulumi's own keys are not ours to judge
