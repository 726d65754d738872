"""The canary checks the plan (issue 26): each canary's KV pool, as SGLang exports it, against the plan's
``kv_pool_tokens_per_replica``; beyond 5 % a warning, beyond ``rollout.max_kv_pool_miss`` (15 %) a hold naming the
planner input likely wrong. The metric names are read from the pinned SGLang source, not assumed; the simulated
worker's exposition is parsed by the same reader the rollout uses.

Each finding fails before the change: there was no ``sglang:max_total_num_tokens`` read, no comparison, no hold."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from serving.cli.report import plan_json
from serving.rollout.gates.verdict import Gates, Verdict, with_kv_pool
from serving.rollout.kvpool import (
    GIB,
    KV_CACHE_MEMORY_GB,
    KV_POOL_METRICS,
    KV_POOL_TOKENS,
    WARN_MISS,
    WEIGHT_MEMORY_GB,
    KvCheck,
    KvReading,
    attribute,
    check,
)
from serving.rollout.plan import RolloutPlan, kv_plan, plan_rollout
from serving.router.client import MetricsSnapshot
from serving.sandbox.backend import worker_config
from serving.sandbox.worker import SimulatedWorker
from tests.support.sglang_parsers import SGLANG_VENV
from tests.support.stacks import fleet_of, spec_from

_PROD = fleet_of(spec_from("prod"))
PLAN = kv_plan(_PROD.spec, _PROD.plan.memory)


def pinned(relative: str) -> str:
    """A file of the pinned SGLang (the venv scripts/sglang-manifest.sh builds)."""
    found = sorted(SGLANG_VENV.glob(f"lib/python*/site-packages/sglang/{relative}"))
    assert found, f"the pinned SGLang has no {relative} under {SGLANG_VENV}"
    return Path(found[0]).read_text()


def test_the_metric_names_are_the_pinned_sglangs_and_set_from_what_the_check_assumes() -> None:
    """metrics_collector.py declares each gauge and ``emit_constants`` sets it; scheduler.py passes the pool's token
    count, the weight load (ModelRunner.weight_load_mem_usage) and the pool's own bytes."""
    collector = pinned("srt/observability/metrics_collector.py")
    declared = set(re.findall(r'name="(sglang:[a-z_]+)"', collector))
    assert set(KV_POOL_METRICS) <= declared, set(KV_POOL_METRICS) - declared
    constants = collector[collector.index("def emit_constants") :]
    for name in KV_POOL_METRICS:
        attr = name.removeprefix("sglang:")
        assert f"self._log_gauge(self.{attr}, {attr})" in constants, attr
    scheduler = pinned("srt/managers/scheduler.py")
    call = scheduler[scheduler.index("self.metrics_collector.emit_constants(") :][:1500]
    assert "max_total_num_tokens=self.max_total_num_tokens" in call
    assert "weight_memory_usage_gb=self.tp_worker.model_runner.weight_load_mem_usage" in call
    assert "get_kvcache().mem_usage" in call
    runner = pinned("srt/model_executor/model_runner.py")
    assert "self.weight_load_mem_usage = before_avail_memory - after_avail_memory" in runner


def test_the_reader_takes_the_smallest_ranks_pool_and_not_the_swa_pool() -> None:
    """One series per scheduler (the collector's labels carry the ranks); the SWA pool is another family."""
    text = (
        "# TYPE sglang:max_total_num_tokens gauge\n"
        'sglang:max_total_num_tokens{model_name="m",tp_rank="0"} 1000.0\n'
        'sglang:max_total_num_tokens{model_name="m",tp_rank="1"} 990.0\n'
        "# TYPE sglang:max_total_num_tokens_swa gauge\n"
        'sglang:max_total_num_tokens_swa{model_name="m",tp_rank="0"} 10.0\n'
        "# TYPE sglang:weight_memory_usage_gb gauge\n"
        'sglang:weight_memory_usage_gb{model_name="m",tp_rank="0"} 1.5\n'
    )
    got = KvReading.read(MetricsSnapshot.parse(text))
    assert got == KvReading(990, 1.5 * GIB, None)
    assert KvReading.read(MetricsSnapshot.parse(text.replace("max_total_num_tokens{", "other{"))) is None


def test_the_plan_figure_is_the_reports_kv_pool_tokens_per_replica() -> None:
    spec = spec_from("prod")
    report = plan_json(fleet_of(spec), Path("Pulumi.prod.yaml"), [])
    assert PLAN.tokens == report["capacity"]["kv_pool_tokens_per_replica"] > 0
    assert PLAN.max_miss == spec.rollout.max_kv_pool_miss == 0.15


def reading(
    tokens: float, weights: float | None = PLAN.weights_bytes, cell: float = PLAN.kv_bytes_per_token
) -> KvReading:
    return KvReading(int(tokens), weights, int(tokens) * cell)


def test_within_five_percent_is_ok_beyond_it_warns_beyond_the_bound_holds() -> None:
    ok = check(PLAN, {"r0": reading(PLAN.tokens * (1 - WARN_MISS / 2))})
    assert ok.level == "ok" and ok.suspect is None and ok.miss == pytest.approx(-WARN_MISS / 2, abs=1 / PLAN.tokens)
    warn = check(PLAN, {"r0": reading(PLAN.tokens * 0.9)})
    assert warn.level == "warn" and "hold" not in warn.text and warn.miss == pytest.approx(-0.1, abs=1 / PLAN.tokens)
    held = check(PLAN, {"r0": reading(PLAN.tokens * 0.9), "r1": reading(PLAN.tokens * 0.8)})
    assert held.level == "hold" and held.miss == pytest.approx(-0.2, abs=1 / PLAN.tokens), held
    assert held.canary_tokens == {"r0": int(PLAN.tokens * 0.9), "r1": int(PLAN.tokens * 0.8)}
    assert "canary r1's KV pool" in held.text and f"the plan's {PLAN.tokens:,}" in held.text
    assert check(replace(PLAN, max_miss=0.25), {"r1": reading(PLAN.tokens * 0.8)}).level == "warn"


def test_the_input_named_is_the_one_whose_error_the_canary_shows() -> None:
    """Pool smaller with weights and cell as planned: the start-up overhead. Weights loaded heavier by Δ and the pool
    Δ smaller: the weights. The same pool bytes over twice the cell: the KV bytes per token."""
    short = check(PLAN, {"r0": reading(PLAN.tokens * 0.8)})
    assert short.suspect == "startup_overhead" and "start-up overhead" in short.text, short.text
    free = (PLAN.tokens * 0.8 * PLAN.kv_bytes_per_token + PLAN.weights_bytes) / PLAN.mem_fraction_static
    assert f"the canary implies {free / GIB:.2f} GiB free at start" in short.text

    extra = 0.3 * PLAN.tokens * PLAN.kv_bytes_per_token  # weights 30 % of the pool heavier than planned
    heavy = check(PLAN, {"r0": reading(PLAN.tokens - extra / PLAN.kv_bytes_per_token, PLAN.weights_bytes + extra)})
    assert heavy.level == "hold" and heavy.suspect == "weights", heavy.text
    assert f"{(PLAN.weights_bytes + extra) / GIB:.2f} GiB per GPU loaded" in heavy.text

    wide = check(PLAN, {"r0": reading(PLAN.tokens / 2, cell=PLAN.kv_bytes_per_token * 2)})
    assert wide.suspect == "kv_bytes_per_token" and f"{PLAN.kv_bytes_per_token * 2:,.0f} B per token" in wide.text

    blind = check(PLAN, {"r0": reading(PLAN.tokens * 0.8, weights=None)})
    assert blind.level == "hold" and blind.suspect is None and WEIGHT_MEMORY_GB in blind.text


def test_the_split_over_the_inputs_adds_up_to_the_miss() -> None:
    got = KvReading(
        int(PLAN.tokens * 0.7), PLAN.weights_bytes * 1.1, int(PLAN.tokens * 0.7) * PLAN.kv_bytes_per_token * 1.5
    )
    split = attribute(PLAN, got)
    assert split is not None and sum(split.values()) == pytest.approx(got.tokens - PLAN.tokens, rel=1e-9)
    # cell 1.5× wider: fewer tokens; weights heavier: fewer; 1.05× the planned pool bytes + the heavier weights: the
    # memory at start was more than planned
    assert split["kv_bytes_per_token"] < 0 and split["weights"] < 0 < split["startup_overhead"], split


def test_no_metric_is_unread_and_never_holds() -> None:
    c = check(PLAN, {"r0": None})
    assert c.level == "unread" and c.miss is None and KV_POOL_TOKENS in c.text and "r0" in c.text


def gates(decision: str, evidence: tuple[str, ...]) -> Gates:
    verdict = Verdict(decision, "not-updated", evidence, ())  # type: ignore[arg-type]
    return Gates(None, None, 0.0, 0.0, 0.0, 0.0, (), verdict=verdict)


def test_a_hold_pauses_a_passing_soak_and_keeps_a_rollback_and_a_warning_only_warns() -> None:
    held = check(PLAN, {"r0": reading(PLAN.tokens * 0.8)})
    paused = with_kv_pool(gates("pass", ("canary within every gate", "canary 1 replica")), held)
    assert paused.verdict is not None and paused.verdict.decision == "pause" and not paused.passed
    assert paused.verdict.evidence == (held.text, "canary 1 replica") and paused.kv_pool == held
    rolled = with_kv_pool(gates("rollback", ("breach confined to the canary: x",)), held)
    assert rolled.verdict is not None and rolled.verdict.decision == "rollback" and held.text in rolled.verdict.evidence
    warned = with_kv_pool(gates("pass", ("canary within every gate",)), check(PLAN, {"r0": reading(PLAN.tokens * 0.9)}))
    assert warned.verdict is not None and warned.verdict.decision == "pass" and warned.passed
    assert warned.verdict.evidence[-1].startswith(f"KV pool off the plan by more than {WARN_MISS:.0%}")


def test_the_check_and_the_plan_survive_the_journal() -> None:
    held = check(PLAN, {"r0": reading(PLAN.tokens * 0.8)})
    g = with_kv_pool(gates("pass", ("canary within every gate",)), held)
    assert Gates.from_json(g.to_json()) == g and KvCheck.from_json(held.to_json()) == held
    plan = plan_rollout(fleet_of(spec_from("prod")), from_version="v1", to_version="v2")
    assert plan.kv == PLAN and RolloutPlan.from_json(plan.to_json()) == plan
    old = {k: v for k, v in plan.to_json().items() if k != "kv"}  # a journal written before the check
    assert RolloutPlan.from_json(old).kv is None


def test_the_simulated_worker_exports_the_plan_with_its_releases_skew() -> None:
    """The sandbox stack's workers export the plan's pool × (1 + kv_skew), read back by the rollout's own reader."""
    spec = spec_from("sandbox", **{"sandbox__versions__v2": {"latency_ms": 100, "kv_skew": -0.2}})
    fleet = fleet_of(spec)
    planned = kv_plan(spec, fleet.plan.memory)
    for version, skew in (("v1", 0.0), ("v2", -0.2)):
        worker = SimulatedWorker(worker_config(spec, fleet.plan.replicas[0], version))
        got = KvReading.read(MetricsSnapshot.parse(generate_latest(worker.metrics.registry).decode()))
        assert got is not None and got.tokens == round(planned.tokens * (1 + skew))
        assert got.weights_bytes == pytest.approx(planned.weights_bytes, rel=1e-9)
        assert got.pool_bytes == pytest.approx(got.tokens * planned.kv_bytes_per_token, rel=1e-9)
        assert worker._server_info()["max_total_tokens"] == got.tokens
    skewed = check(planned, {"r": got})
    assert skewed.level == "hold" and skewed.suspect == "startup_overhead", skewed.text
    assert {KV_POOL_TOKENS, WEIGHT_MEMORY_GB, KV_CACHE_MEMORY_GB} == set(KV_POOL_METRICS)
