"""The planner's memory model against the pinned SGLang's own code and against public start-up logs."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from serving.checks import rules
from serving.checks.result import Status, failures
from serving.plan import memory as sgl
from serving.plan import planner
from serving.spec.schema import GIB, count_parameters
from serving.spec.stack import load_stack_file
from tests.sglang_parsers import ROOT, SGLANG_PYTHON, run_json_script_args
from tests.support.stacks import SOURCE_PLAN, spec_from

GRID_GPUS_MIB = (16_384, 23_034, 24_564, 40_960, 46_068, 81_559, 81_920, 97_871, 143_771, 183_359)
GRID_PARALLEL = ((1, 1), (2, 1), (4, 1), (8, 1), (16, 1), (2, 4), (8, 2), (4, 4))
GRID_CHUNKED = (None, 1024, 4096, 8192, 16384)
GRID_RUNNING = (None, 8, 64)


def _sglang_resolves(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    script = ROOT / "tests" / "support" / "sglang_mem_fraction.py"
    return run_json_script_args(SGLANG_PYTHON, [str(script)], cases, timeout_s=600)


def test_mem_fraction_static_equals_sglangs_handle_gpu_memory_settings(regenerated: Path) -> None:
    """The pinned SGLang's REAL handle_gpu_memory_settings (run in .venv-sglang by
    tests/support/sglang_mem_fraction.py, which documents the few stand-ins: the device-memory getter
    returns the grid's MiB, is_cuda is True, MLA/multimodal answered from the case) over GPU memory × TP × PP ×
    chunked prefill × max running requests × MLA: the planner's fraction is SGLang's, case for case."""
    cases = [
        {"gpu_mib": g, "tp": tp, "pp": pp, "chunked_prefill_size": c, "max_running_requests": r, "mla": mla}
        for g, (tp, pp), c, r, mla in itertools.product(
            GRID_GPUS_MIB, GRID_PARALLEL, GRID_CHUNKED, GRID_RUNNING, (False, True)
        )
    ]
    resolved = _sglang_resolves(cases)
    mismatches = []
    for r in resolved:
        ours = sgl.sglang_mem_fraction_static(
            r["gpu_mib"], r["tp"], r["pp"], r["chunked_prefill_size"], r["max_running_requests"], r["mla"]
        )
        theirs = (r["mem_fraction_static"], r["resolved_chunked_prefill_size"], r["decode_graph_max_bs"])
        if (ours.value, ours.chunked_prefill_size, ours.decode_graph_max_bs) != theirs:
            mismatches.append((r, ours))
    assert len(resolved) == len(cases) == 2_400
    assert not mismatches, mismatches[:5]
    # The grid is not degenerate: the floor, the bands and PP all move the fraction.
    assert len({r["mem_fraction_static"] for r in resolved}) > 200


@pytest.mark.parametrize("log", sgl.CALIBRATION_LOGS, ids=lambda c: c.name)
def test_startup_log_kv_pool_reproduced_within_5_percent(log: sgl.StartupLog, tmp_path: Path) -> None:
    """The whole chain through the planner: GPU product → free at start, config.json → parameters → weights
    per GPU, SGLang's pool arithmetic → tokens; within 5 % of the tokens the log reports."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(log.config))
    spec = spec_from(
        "dev",
        cluster__gpu={"product": log.gpu, "memory_gb": 24},
        model__hf_config=str(cfg),
        model__architecture={},
        model__precision="bf16",
        model__quantization=None,
        parallelism__tp=log.tp,
        serving__mem_fraction_static=log.mem_fraction_static,
        serving__replicas_per_node=None,
    )
    m = planner.memory_plan(spec)
    assert m.model == "sglang"
    tokens = m.max_total_tokens.value
    err = tokens / log.kv_pool_tokens - 1
    print(f"{log.name}: planner {tokens:,} tokens, log {log.kv_pool_tokens:,} ({err:+.2%}); source: {log.source}")
    assert abs(err) < 0.05, m.max_total_tokens.formula
    # The weights the planner puts on a GPU are the log's within 2 %.
    weights = m.per_gpu["weights"].value + m.per_gpu["load_overhead"].value
    assert weights / GIB == pytest.approx(log.weights_gib, rel=0.02)


def test_constants_derive_from_the_logs() -> None:
    """The runtime overhead (memory.total − free at start) and the load overhead are means over the logs."""
    gaps = [sgl.GPU_PRODUCTS[c.gpu].memory_total_mib / 1024 - c.free_at_start_gib for c in sgl.CALIBRATION_LOGS]
    assert min(gaps) <= sgl.RUNTIME_OVERHEAD_GIB <= max(gaps)
    assert 0 < sgl.LOAD_OVERHEAD_GIB < 0.5
    # An unlogged product: memory.total less the mean overhead.
    h100 = sgl.GPU_PRODUCTS["NVIDIA-H100-80GB-HBM3"]
    assert sgl.free_at_start_bytes(h100) == pytest.approx(81_559 * 2**20 - sgl.RUNTIME_OVERHEAD_GIB * GIB)


@pytest.mark.parametrize(
    ("name", "params"),
    [("llama-3-70b", 70_553_706_496), ("mixtral-8x7b", 46_702_792_704), ("deepseek-v3", 671_026_404_352)],
)
def test_parameters_counted_from_config_json(name: str, params: int) -> None:
    """Llama-3-70B and Mixtral count to their published totals exactly; DeepSeek-V3 to 671 B (no MTP layer)."""
    cfg = json.loads((ROOT / "models" / name / "config.json").read_text())
    assert count_parameters(cfg) == params
    assert count_parameters({"hidden_size": 8}) is None  # shapes missing: the stack must give the count


def _flagship(**changes: Any) -> tuple[planner.Plan, list[rules.CheckResult]]:
    base = {
        "cluster__gpu": {"product": "NVIDIA-H100-80GB-HBM3", "memory_gb": 80},
        "cluster__fabric": {"kind": "infiniband", "link_rate_gbps": 400, "hcas": ["mlx5_0"]},
        "model__architecture": {},
        "limits__max_running_requests": 256,
        "limits__p99_concurrency_per_replica": 256,
        "scheduler__instances": 3,
    }
    spec = spec_from("dev", **{**base, **changes})
    p = planner.plan(spec)
    return p, rules.check(spec, p)


FLAGSHIPS = {
    "llama-3.1-405b fp8, TP 8, one 8 × H100 node": {
        "model__hf_config": "models/llama-3.1-405b/config.json",
        "model__precision": "fp8",
        "model__quantization": "fp8",
        "parallelism__tp": 8,
        "serving__replicas": 16,
        "serving__replicas_per_node": 1,
    },
    "llama-3.1-405b bf16, TP 8 × PP 2, two nodes": {
        "model__hf_config": "models/llama-3.1-405b/config.json",
        "model__precision": "bf16",
        "model__quantization": None,
        "parallelism__tp": 8,
        "parallelism__pp": 2,
        "serving__replicas": 8,
        "serving__replicas_per_node": None,
    },
    "qwen3-235b-a22b fp8, TP 4": {
        "model__hf_config": "models/qwen3-235b-a22b/config.json",
        "model__precision": "fp8",
        "model__quantization": "fp8",
        "parallelism__tp": 4,
        "serving__replicas": 32,
        "serving__replicas_per_node": 2,
    },
}


@pytest.mark.parametrize("name", FLAGSHIPS)
def test_standard_recipes_plan_as_feasible_with_sglang_like_concurrency(name: str) -> None:
    """The recipes SGLang runs every day: feasible, tens of concurrent 4k sequences per replica."""
    p, found = _flagship(**FLAGSHIPS[name])
    m = p.memory
    seqs = int(m.max_concurrent_sequences.value)
    print(
        f"{name}: mem_fraction_static {m.mem_fraction_static.value:.3f}, weights/GPU "
        f"{m.per_gpu['weights'].value / GIB:.1f} GiB, KV pool {int(m.max_total_tokens.value):,} tokens, "
        f"{seqs} × 4k sequences"
    )
    assert not [r for r in found if r.check == "memory.per-gpu"], found
    assert not failures(found), [(r.check, r.observed) for r in failures(found)]
    assert 16 <= seqs <= 1024, m.max_concurrent_sequences.formula


def test_source_heuristic_rejects_what_sglang_serves() -> None:
    """The source's budget (15 % activations, 5 GB, 15 % margin) turns 405B FP8 on one node away."""
    spec = spec_from("dev", model__architecture={}, **FLAGSHIPS["llama-3.1-405b fp8, TP 8, one 8 × H100 node"])
    src = planner.plan(spec, "source")
    assert src.memory.model == "source"
    bad = [r for r in rules.check(spec, src) if r.check == "memory.per-gpu"]
    assert bad and bad[0].status is Status.FAIL


def test_source_configuration_still_rejected_with_the_arithmetic() -> None:
    """fp16 70B, TP 2 × PP 4, 12 replicas per node: 96 GPUs wanted on an 8-GPU node."""
    spec = load_stack_file(SOURCE_PLAN).spec
    found = failures(rules.check(spec, planner.plan(spec)))
    gpus = [r for r in found if r.check == "placement.gpus-per-node"]
    assert gpus and "12 replicas × 8 GPUs each" in gpus[0].observed and "96 GPUs" in gpus[0].observed


def test_a_pool_smaller_than_one_sequence_is_rejected_quoting_sglangs_arithmetic() -> None:
    """70B fp16 on one 80 GB GPU: weights exceed the static budget; the rule quotes the pool arithmetic."""
    spec = spec_from(
        "dev",
        model__precision="fp16",
        model__quantization=None,
        cluster__gpu={"product": "NVIDIA-A100-SXM4-80GB", "memory_gb": 80},
    )
    bad = [r for r in rules.check(spec, planner.plan(spec)) if r.check == "memory.per-gpu"]
    assert bad and bad[0].status is Status.FAIL
    assert "free at start ×" in bad[0].observed and "less than one sequence of 4,096 tokens" in bad[0].observed
