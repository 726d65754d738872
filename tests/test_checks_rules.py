"""Each rule fires on a targeted spec variant, with its arithmetic, and stays quiet on the shipped stacks.
Every rule reports through the one result record (serving.result.CheckResult)."""

from __future__ import annotations

from typing import Any

import pytest

from serving.checks import rules
from serving.plan import planner
from serving.plan.calibration import LOAD_OVERHEAD_GIB
from serving.render.k8s import system
from serving.result import CheckResult, Status
from serving.spec.schema import FleetSpec
from serving.spec.stack import load_stack, load_stack_file, parse_spec
from tests.support.paths import REPO
from tests.support.stacks import SOURCE_PLAN, fleet_of, spec_from, stack_doc


def violations(spec: FleetSpec) -> list[CheckResult]:
    return rules.check(fleet_of(spec))


def errors(spec: FleetSpec) -> dict[str, CheckResult]:
    return {v.check: v for v in violations(spec) if v.status is Status.FAIL}


@pytest.mark.parametrize("stack", ["prod", "dev", "sandbox"])
def test_shipped_stacks_have_no_errors(stack: str) -> None:
    assert errors(load_stack(stack).spec) == {}


def test_source_plan_is_rejected_with_the_arithmetic() -> None:
    found = errors(load_stack_file(SOURCE_PLAN).spec)
    assert set(found) == {"placement.gpus-per-node", "placement.fleet-capacity"}
    r = found["placement.gpus-per-node"]
    assert r.observed == "Got 12: 12 replicas × 8 GPUs each (TP 2 × PP 4 × DP 1) needs 96 GPUs, the node has 8"
    assert r.expected == "at most 1 per node (8 GPUs / 8 GPUs per replica)"
    assert r.fix == "Use at most 1, or lower tp/pp."
    assert r.subject == "serving.replicas_per_node"
    assert r.message == f"{r.observed} (expected {r.expected}). Fix: {r.fix}"
    assert "256 nodes hold at most 256 replicas" in found["placement.fleet-capacity"].message


CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("prod", {"serving__replicas_per_node": 9}, "placement.gpus-per-node", "needs 9 GPUs, the node has 8"),
    (
        "prod",
        {"parallelism__tp": 12, "serving__replicas_per_node": None, "serving__replicas": 100},
        "placement.whole-nodes",
        "stranding 4 GPUs",
    ),
    ("prod", {"serving__replicas": 2049}, "placement.fleet-capacity", "hold at most 2,048"),
    (
        "prod",
        {"parallelism__tp": 3, "serving__replicas_per_node": 2},
        "model.sglang-shapes",
        "Got TP 3: SGLang 0.5.23 refuses to start llama-3-70b: 64 attention heads are not divisible by TP 3 "
        "(sglang/srt/models/llama.py:183); 8 KV heads are not divisible by TP 3 (sglang/srt/models/llama.py:189)",
    ),
    (
        "prod",  # a MoE model of 6 KV heads under attention DP 2: attention-TP 4 cannot split them
        {
            "parallelism__tp": 8,
            "parallelism__attn_dp": 2,
            "serving__replicas_per_node": 1,
            "model__architecture__num_attention_heads": 48,
            "model__architecture__num_kv_heads": 6,
            "model__architecture__moe": {"num_experts": 8, "experts_per_token": 2},
            "model__architecture__model_class": "Qwen3MoeForCausalLM",
        },
        "model.sglang-shapes",
        "Got TP 8 with attention DP 2: SGLang 0.5.23 refuses to start llama-3-70b: TP 8 is not a multiple of the 6 "
        "KV heads it replicates (sglang/srt/models/llama.py:193); 6 KV heads are not divisible by attention-TP 4 "
        "(sglang/srt/models/qwen3_moe.py:512)",
    ),
    (
        "prod",
        {"model__precision": "fp16", "model__quantization": None},
        "memory.per-gpu",
        "that is less than one sequence of 4,096 tokens",
    ),
    (
        "dev",
        {
            "parallelism__tp": 16,
            "serving__replicas_per_node": None,
            "serving__replicas": 8,
            "cluster__fabric__link_rate_gbps": 25,
        },
        "network.tp-across-nodes",
        "Got 25: TP 16 crosses nodes",
    ),
    (
        "dev",
        {"parallelism__tp": 16, "serving__replicas_per_node": None, "serving__replicas": 8},
        "network.tp-across-nodes",
        "all-reduce over TCP",
    ),
    ("prod", {"serving__heartbeat_mode": "direct"}, "heartbeat.central-jitter", "409.6 msg/s"),
    ("prod", {"serving__health_check_timeout_s": 1}, "health.check-timeout", "Use at least 3"),
    ("prod", {"serving__health_check_timeout_s": 5}, "health.check-timeout", "must end before the next one"),
    ("prod", {"serving__migration_timeout_s": 15}, "health.recovery-target", "18 s detection + 15 s migration = 33 s"),
    ("prod", {"storage__local_cache__load_bandwidth_gbps": 1}, "storage.restart-time", "35.28 GB of weights"),
    ("sandbox", {"rollout__batches": 9}, "rollout.batches-cover", "8 replicas cannot fill 9 non-empty batches"),
    ("prod", {"rollout__interval_s": 10}, "rollout.gate-window", "shorter than serving.warmup_duration_s 30"),
    ("prod", {"scheduler__instances": 1}, "scheduler.ha", "Use 3"),
    ("prod", {"rollout__dry_run_gates": ("p99",)}, "rollout.dry-run-gates", "never pause or roll back"),
]


@pytest.mark.parametrize(
    ("stack", "changes", "rule", "needle"), CASES, ids=[c[2] + ":" + str(i) for i, c in enumerate(CASES)]
)
def test_rule_fires_with_arithmetic(stack: str, changes: dict[str, Any], rule: str, needle: str) -> None:
    spec = spec_from(stack, **changes)
    found = [v for v in violations(spec) if v.check == rule]
    assert found, f"{rule} did not fire for {changes}"
    assert any(needle in v.message or needle == v.subject for v in found), [v.message for v in found]
    assert all(v.subject and v.observed and v.expected and v.fix for v in found)


@pytest.mark.parametrize(
    ("changes", "rule"),
    [
        ({"scheduler__period_ms": 10}, "scheduler.period"),
        ({"serving__log_level": "debug"}, "ops.log-level"),
        ({"scheduler__instances": 2}, "scheduler.ha"),
    ],
)
def test_warnings_do_not_fail_the_plan(changes: dict[str, Any], rule: str) -> None:
    spec = spec_from("prod", **changes)
    found = [v for v in violations(spec) if v.check == rule]
    assert found and all(v.status is Status.WARN for v in found)
    assert rule not in errors(spec)


def test_a_sandbox_may_dry_run_its_latency_and_throughput_gates() -> None:
    """The CI suite's sandbox rollouts: a sandbox stack with both gates in dry run plans clean."""
    assert "rollout.dry-run-gates" not in errors(spec_from("sandbox", rollout__dry_run_gates=("qps", "p99")))


def test_memory_rule_passes_when_quantised_and_fails_at_fp16_tp1() -> None:
    """SGLang's arithmetic (the default model): 70B in fp16 on one 80 GB GPU leaves a negative KV pool."""
    assert "memory.per-gpu" not in errors(load_stack("prod").spec)
    fp16 = spec_from("prod", model__precision="fp16", model__quantization=None)
    msg = errors(fp16)["memory.per-gpu"].message
    weights_gib = 70_553_706_496 * 2 / 2**30 + LOAD_OVERHEAD_GIB  # every parameter in 16 bit, plus the load overhead
    assert f"{weights_gib:,.2f} GiB weights" in msg and "less than one sequence of 4,096 tokens" in msg


def test_memory_rule_under_the_source_model_quotes_the_source_budget() -> None:
    """The source plan's heuristic (``--memory-model source``): weights × 1.15 + KV + 5 GB, then 15 % margin."""
    fp16 = spec_from("prod", model__precision="fp16", model__quantization=None)
    [result] = [r for r in rules.check(fleet_of(fp16, memory_model="source")) if r.check == "memory.per-gpu"]
    need = (70_553_706_496 * 2 * 1.15 + 327_680 * 4096 * 8 + 5e9) * 1.15
    assert f"Each GPU needs {need / 1e9:,.2f} GB" in result.message and "only 68.00 GB is usable" in result.message
    assert planner.memory_plan(fp16, "source").per_gpu["weights"].value == 70_553_706_496 * 2


def test_every_rule_reports_under_its_registered_name() -> None:
    """Each rule's results carry the name it is registered under (fired by the variants above)."""
    for stack, changes, rule, _ in CASES:
        spec = spec_from(stack, **changes)
        assert {r.check for r in rules.RULES[rule](fleet_of(spec))} == {rule}


def test_every_rule_has_a_docstring_naming_what_it_enforces() -> None:
    assert len(rules.RULES) >= 14
    assert all(fn.__doc__ and len(fn.__doc__) > 20 for fn in rules.RULES.values())


def test_router_check_capacity_warns_below_the_failure_reserve_and_its_fix_clears_it() -> None:
    """smg checks at most 128 workers at once; a hung one holds a check for the whole timeout (3 s of every 5 s at
    prod): 213 of 2,048 may hang at once, above prod's 10 % reserve (205). A 15 % reserve (308) is above it, and the
    interval the fix names holds it."""
    prod = fleet_of(load_stack("prod").spec)
    hb = prod.plan.heartbeats
    assert hb.router_hung_capacity.value == 128 * 5 // 3 and "(10.4% of 2,048)" in hb.router_hung_capacity.formula
    assert "health.router-check-capacity" not in {v.check for v in violations(prod.spec)}
    wider = spec_from("prod", limits__failure_reserve=0.15)
    found = [v for v in violations(wider) if v.check == "health.router-check-capacity"]
    assert len(found) == 1 and found[0].status is Status.WARN, found
    assert "fewer than the failure reserve (15% of 2,048 = 308)" in found[0].observed
    assert "at least 8 s" in found[0].fix  # ⌈308 × 3 s / 128⌉
    fixed = spec_from("prod", limits__failure_reserve=0.15, serving__heartbeat_interval_s=8)
    assert "health.router-check-capacity" not in {v.check for v in violations(fixed)}


# Issue 25, finding 6: the routers and controllers need a declared pool of untainted nodes, sized from their pods.
@pytest.mark.parametrize(
    ("changes", "need"),
    [
        ({}, 3),  # prod: 3 routers, one per node; 3 controllers fit beside them (2 + 0.5 CPU ≤ 14)
        ({"scheduler__instances": 5}, 5),  # the routers follow scheduler.instances, one per node
        # 2.4 CPU per node: a controller (0.5) no longer fits beside a router (2), so a fourth node holds all three
        ({"cluster__system_pool__cpu": 2.4}, 4),
        # 2.5 GB: a router (2 GiB = 2.15 GB) leaves 0.35 GB, a controller needs 0.27 GB: one beside each router
        ({"cluster__system_pool__memory_gb": 2.5}, 3),
        ({"cluster__system_pool__memory_gb": 2.3}, 4),
    ],
)
def test_system_pool_size_is_derived_from_the_pods(changes: dict[str, Any], need: int) -> None:
    spec = spec_from("prod", **changes)
    pool = spec.cluster.system_pool
    assert pool is not None
    assert system.min_nodes(spec, pool) == need
    short = spec_from("prod", cluster__system_pool__count=need - 1, **changes)
    r = errors(short)["cluster.system-pool"]
    assert r.subject == "cluster.system_pool.count" and r.expected == f"at least {need} nodes"
    assert r.observed.startswith(f"Got count={need - 1}: ") and f"need {need} nodes of" in r.observed
    assert r.fix.startswith(f"Set cluster.system_pool.count to {need} ")
    assert "cluster.system-pool" not in errors(spec_from("prod", cluster__system_pool__count=need, **changes))


def test_system_pool_too_small_for_one_router_and_undeclared() -> None:
    r = errors(spec_from("prod", cluster__system_pool__cpu=1.5))["cluster.system-pool"]
    assert r.observed.startswith(
        "Got cpu=1.5, memory_gb=56 per node: one of 3 × sglang-router (2 CPU, 2Gi, one per node)"
    )
    assert "Raise cluster.system_pool.cpu / memory_gb" in r.fix
    doc = stack_doc("prod")
    del doc["cluster"]["system_pool"]
    warned = [v for v in violations(parse_spec(doc, "nopool", REPO)) if v.check == "cluster.system-pool"]
    assert [v.status for v in warned] == [Status.WARN]
    assert "nowhere to run" in warned[0].observed and warned[0].fix.startswith("Declare cluster.system_pool")


def test_plan_says_which_of_the_design_weights_production_applies() -> None:
    """Issue 39, item 7: the design's 0.5 GPU / 0.3 memory / 0.2 network weighting is no router policy; the controller
    sheds on it, and no render gives its agents a DCGM exporter, so the network term is always 0 and GPU use is
    estimated from running requests. `plan` says so with the ceiling that leaves (0.8), from the spec's weights."""
    spec = spec_from("prod")
    figure = fleet_of(spec).plan.heartbeats.shed_load_ceiling
    weights = spec.scheduler.weights
    assert figure.value == weights["gpu_utilization"] + weights["memory_usage"] == 0.8
    assert (
        "0.2 × 0 (network: unmeasured)" in figure.formula and f"÷ {spec.limits.max_running_requests}" in figure.formula
    )
    lopsided = spec.model_copy(
        update={
            "scheduler": spec.scheduler.model_copy(
                update={"weights": {"gpu_utilization": 0.2, "memory_usage": 0.2, "network_bandwidth": 0.6}}
            )
        }
    )
    assert fleet_of(lopsided).plan.heartbeats.shed_load_ceiling.value == 0.4
