"""The updater's pure core: batch plan, gate arithmetic, the state machine, the journal and the lock."""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from serving.plan.planner import plan
from serving.render.router import duration_buckets
from serving.rollout.gates import (
    MIN_BASELINE_REQUESTS,
    Counters,
    Gates,
    WindowStats,
    error_budget_exhausted,
    evaluate,
    window_stats,
)
from serving.rollout.journal import Journal, JournalError, LockedError, StackLock, load_state
from serving.rollout.machine import (
    Event,
    Outcome,
    Phase,
    RolloutState,
    Step,
    TransitionError,
    advance,
    contract,
    initial,
    replay,
)
from serving.rollout.plan import GateLimits, RolloutPlan, plan_batches, plan_rollout
from serving.router.client import HistogramSnapshot, MetricsSnapshot
from serving.spec.stack import load_stack
from tests.support.stacks import spec_from

LIMITS = GateLimits(max_qps_drop=0.20, max_p99_rise=0.30, max_error_rate=0.001)


def sandbox_plan(kind: str = "rollout") -> RolloutPlan:
    spec = load_stack("sandbox").spec
    return plan_rollout(spec, plan(spec), "sandbox", from_version="v1", to_version="v2", kind=kind)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------- plan


def test_prod_batches_cover_every_replica_once_and_span_every_rack() -> None:
    spec = load_stack("prod").spec
    batches = plan_batches(plan(spec))
    assert len(batches) == spec.rollout.batches == 5
    ids = [r for b in batches for r in b.replicas]
    assert len(ids) == len(set(ids)) == 2048
    sizes = [len(b.replicas) for b in batches]
    assert max(sizes) - min(sizes) <= 1
    racks = {n.rack for n in spec.cluster.nodes}
    assert all(set(b.racks) == racks for b in batches), "each batch must be spread across all racks"
    # No batch takes more than ⌈8 per node / 5⌉ = 2 replicas of one node.
    for b in batches:
        per_node: dict[str, int] = {}
        for rid in b.replicas:
            node = rid.rsplit("-s", 1)[0]
            per_node[node] = per_node.get(node, 0) + 1
        assert max(per_node.values()) <= 2


def test_batch_count_follows_the_spec() -> None:
    spec = spec_from("sandbox", **{"rollout.batches": 3})
    assert [len(b.replicas) for b in plan_batches(plan(spec))] == [3, 3, 2]


def test_plan_survives_the_journal_round_trip() -> None:
    plan = sandbox_plan()
    assert RolloutPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    t = plan.timings
    assert plan.configured_wait_s() == t.baseline_window_s + 5 * (t.warmup_s + t.interval_s)


# ----------------------------------------------------------------------------------------- gates

ROUTER_TEXT = """\
# TYPE smg_router_requests_total counter
smg_router_requests_total{{router_type="http",backend_type="regular",connection_mode="http",model="default",endpoint="generate",streaming="false"}} {requests}
# TYPE smg_http_responses_total counter
smg_http_responses_total{{status_code="200",error_code=""}} {ok}
smg_http_responses_total{{status_code="503",error_code="no_available_workers"}} {client_err}
# TYPE smg_router_upstream_responses_total counter
smg_router_upstream_responses_total{{router_type="http",status_code="200",error_code=""}} {ok}
smg_router_upstream_responses_total{{router_type="http",status_code="500",error_code=""}} {upstream_err}
# TYPE smg_worker_retries_total counter
smg_worker_retries_total{{worker_type="regular",endpoint="generate"}} {upstream_err}
# TYPE smg_router_request_duration_seconds histogram
smg_router_request_duration_seconds_bucket{{endpoint="generate",le="0.1"}} {fast}
smg_router_request_duration_seconds_bucket{{endpoint="generate",le="0.2"}} {requests}
smg_router_request_duration_seconds_bucket{{endpoint="generate",le="+Inf"}} {requests}
smg_router_request_duration_seconds_sum{{endpoint="generate"}} 1.0
smg_router_request_duration_seconds_count{{endpoint="generate"}} {requests}
"""


def counters(requests: int, *, client_err: int = 0, upstream_err: int = 0, fast: int | None = None) -> Counters:
    text = ROUTER_TEXT.format(
        requests=requests,
        ok=requests - client_err,
        client_err=client_err,
        upstream_err=upstream_err,
        fast=requests if fast is None else fast,
    )
    return Counters.read(MetricsSnapshot.parse(text))


def test_window_stats_from_router_metric_text() -> None:
    w = window_stats(counters(1000), counters(1200, client_err=1, upstream_err=10, fast=1100), seconds=2.0)
    assert w is not None
    assert w.requests == 200 and w.client_errors == 1 and w.upstream_errors == 10 and w.retries == 10
    assert w.qps == pytest.approx(199 / 2)
    # 100 of the 200 new requests were ≤ 0.1 s, 100 in (0.1, 0.2]: P99 interpolates to 0.198 s.
    assert w.p99_s == pytest.approx(0.198)
    # The upstream share (10 of 209) is far above the client-facing one: it decides the error rate.
    assert w.error_rate == pytest.approx(10 / 209)


def test_counters_going_down_mean_a_router_restart_not_a_measurement() -> None:
    assert window_stats(counters(5000), counters(40), seconds=2.0) is None


def test_window_stats_subtract_every_counter_from_a_non_zero_start() -> None:
    h0 = HistogramSnapshot(((0.1, 50.0), (math.inf, 100.0)), 100.0, 5.0)
    h1 = HistogramSnapshot(((0.1, 150.0), (math.inf, 300.0)), 300.0, 25.0)
    before = Counters(requests=100, client_errors=2, upstream_responses=110, upstream_errors=3, retries=4, duration=h0)
    after = Counters(requests=300, client_errors=5, upstream_responses=330, upstream_errors=10, retries=9, duration=h1)
    w = window_stats(before, after, seconds=4.0)
    assert w is not None
    assert (w.requests, w.client_errors, w.upstream_responses, w.upstream_errors, w.retries) == (200, 3, 220, 7, 5)
    assert w.qps == pytest.approx(197 / 4)
    # Only the latency histogram went down (a router restart between two scrapes that kept the counters' order):
    assert (
        window_stats(
            before, replace(after, duration=HistogramSnapshot(((0.1, 10.0), (math.inf, 400.0)), 400.0, 30.0)), 4.0
        )
        is None
    )


def test_a_release_hidden_by_router_retries_still_breaches_the_error_gate() -> None:
    baseline = WindowStats(2.0, 200, 0, 200, 0, 0, 0.1)
    window = WindowStats(2.0, 200, 0, 210, 10, 10, 0.1)  # no client-facing error, 10 retried failures
    gates = evaluate(baseline, window, LIMITS)
    assert not gates.passed and gates.client_error_rate == 0
    assert gates.breaches[0].startswith("error rate 4.76% > 0.10%")


@pytest.mark.parametrize(
    ("window", "gate"),
    [
        (WindowStats(2.0, 150, 0, 150, 0, 0, 0.1), "QPS drop 25.0% > 20%"),
        (WindowStats(2.0, 200, 0, 200, 0, 0, 0.131), "P99 rise 31.0% > 30%"),
    ],
)
def test_qps_and_p99_gates_trip_just_past_their_limits(window: WindowStats, gate: str) -> None:
    baseline = WindowStats(2.0, 200, 0, 200, 0, 0, 0.1)
    gates = evaluate(baseline, window, LIMITS)
    assert [b.split(" (")[0] for b in gates.breaches] == [gate]


def test_gates_at_their_limits_pass() -> None:
    baseline = WindowStats(2.0, 200, 0, 200, 0, 0, 0.1)
    gates = evaluate(baseline, WindowStats(2.0, 160, 0, 160, 0, 0, 0.13), LIMITS)
    assert gates.passed and gates.qps_drop == pytest.approx(0.2) and gates.p99_rise == pytest.approx(0.3)


def test_no_baseline_traffic_means_qps_and_p99_are_not_evaluated() -> None:
    gates = evaluate(WindowStats(2.0, 0, 0, 0, 0, 0, None), WindowStats(2.0, 10, 0, 10, 0, 0, 0.2), LIMITS)
    assert gates.passed and gates.qps_drop is None and gates.p99_rise is None


@pytest.mark.parametrize(("requests", "evaluated"), [(19, False), (20, True)])
def test_qps_and_p99_need_the_minimum_baseline_requests(requests: int, evaluated: bool) -> None:
    """Below MIN_BASELINE_REQUESTS (20) a baseline is noise: 19 requests in 2 s and a window that halves both the
    traffic and the latency budget must not be judged; at 20 the same window breaches QPS (−50 %) and P99 (+100 %)."""
    assert MIN_BASELINE_REQUESTS == 20
    baseline = WindowStats(2.0, requests, 0, requests, 0, 0, 0.1)
    window = WindowStats(2.0, requests / 2, 0, requests / 2, 0, 0, 0.2)
    gates = evaluate(baseline, window, LIMITS)
    assert (gates.qps_drop is not None, gates.p99_rise is not None) == (evaluated, evaluated)
    assert gates.passed is not evaluated
    if evaluated:
        assert gates.qps_drop == pytest.approx(0.5) and gates.p99_rise == pytest.approx(1.0)
        assert [b.split(" >")[0] for b in gates.breaches] == ["QPS drop 50.0%", "P99 rise 100.0%"]


def test_gate_values_and_breach_wording_by_hand() -> None:
    """Baseline 200 req in 2 s, P99 100 ms; window 150 req (1 client error), P99 131 ms, 2 of 150 upstream
    responses failed with 3 retries: QPS (149/2 vs 100/s) drops 25.5 %, P99 rises 31 %, error rate 2/150."""
    baseline = WindowStats(2.0, 200, 0, 200, 0, 0, 0.1)
    window = WindowStats(2.0, 150, 1, 150, 2, 3, 0.131)
    g = evaluate(baseline, window, LIMITS)
    assert g.qps_drop == pytest.approx(0.255) and g.p99_rise == pytest.approx(0.31)
    assert (g.error_rate, g.client_error_rate, g.upstream_error_rate, g.retries) == pytest.approx(
        (2 / 150, 1 / 150, 2 / 150, 3)
    )
    assert g.breaches == (
        "QPS drop 25.5% > 20% (baseline 100.0/s, now 74.5/s)",
        "P99 rise 31.0% > 30% (baseline 100.0 ms, now 131.0 ms)",
        "error rate 1.33% > 0.10% (client-facing 1/150, upstream 2/150, 3 retries)",
    )
    assert g.summary() == "QPS drop +25.5%, P99 rise +31.0%, error rate 1.333% (upstream 1.333%, 3 retries)"
    assert g.contract() == {"qps_drop": g.qps_drop, "p99_rise": g.p99_rise, "error_rate": g.error_rate}
    assert Gates.from_json(json.loads(json.dumps(g.to_json()))) == g
    assert WindowStats.from_json(json.loads(json.dumps(window.to_json()))) == window


def test_429_is_a_client_facing_error_and_unevaluated_gates_read_n_a() -> None:
    snap = MetricsSnapshot.parse(
        'smg_http_responses_total{status_code="200"} 10\n'
        'smg_http_responses_total{status_code="429"} 3\n'
        'smg_http_responses_total{status_code="404"} 2\n'
    )
    assert Counters.read(snap).client_errors == 3
    g = evaluate(WindowStats(2.0, 0, 0, 0, 0, 0, None), WindowStats(2.0, 10, 0, 10, 0, 0, 0.2), LIMITS)
    assert g.summary() == "QPS drop n/a, P99 rise n/a, error rate 0.000% (upstream 0.000%, 0 retries)"


def test_error_rate_exactly_at_the_limit_passes() -> None:
    baseline = WindowStats(2.0, 2000, 0, 2000, 0, 0, 0.1)
    assert evaluate(baseline, WindowStats(2.0, 2000, 2, 2000, 2, 0, 0.1), LIMITS).passed  # 0.1 % is allowed
    assert not evaluate(baseline, WindowStats(2.0, 2000, 3, 2000, 3, 0, 0.1), LIMITS).passed


def test_a_baseline_without_successes_or_latency_judges_neither_qps_nor_p99() -> None:
    # 20 requests, all failed: QPS 0 (no drop can be computed); a baseline with traffic but no latency figure.
    failed = evaluate(WindowStats(2.0, 20, 20, 20, 20, 0, 0.1), WindowStats(2.0, 20, 0, 20, 0, 0, 0.1), LIMITS)
    assert failed.qps_drop is None and failed.p99_rise is None
    no_p99 = evaluate(WindowStats(2.0, 200, 0, 200, 0, 0, None), WindowStats(2.0, 200, 0, 200, 0, 0, 0.5), LIMITS)
    assert no_p99.qps_drop == 0.0 and no_p99.p99_rise is None and no_p99.passed
    # 1 req/s is enough traffic: 20 requests in 20 s is a baseline, and halving it breaches the QPS gate.
    slow = evaluate(WindowStats(20.0, 20, 0, 20, 0, 0, 0.1), WindowStats(20.0, 10, 0, 10, 0, 0, 0.1), LIMITS)
    assert slow.qps_drop == pytest.approx(0.5) and not slow.passed


def test_error_budget_boundaries_client_and_upstream() -> None:
    """Baseline 1,000 req/s and 1,000 upstream responses/s (10,000 in 10 s): a 300 s soak may hold 0.1 % of
    300,000 = 300 errors of each kind; the 301st ends it."""
    baseline = WindowStats(10.0, 10_000, 0, 10_000, 0, 0, 0.1)
    at = WindowStats(5.0, 5_000, 300, 5_000, 300, 0, 0.1)
    assert not error_budget_exhausted(baseline, at, LIMITS, 300.0)
    assert error_budget_exhausted(baseline, replace(at, upstream_errors=301), LIMITS, 300.0)
    assert error_budget_exhausted(baseline, replace(at, client_errors=301), LIMITS, 300.0)


def test_error_budget_ends_a_soak_only_once_the_interval_can_no_longer_pass() -> None:
    baseline = WindowStats(10.0, 10_000, 0, 10_000, 0, 0, 0.1)  # 1,000 req/s → 300,000 in a 300 s soak
    early = WindowStats(0.5, 500, 2, 500, 2, 0, 0.1)  # 0.4 % after half a second; the budget is 300 errors
    assert evaluate(baseline, early, LIMITS).passed is False  # the instantaneous rate is already high…
    assert not error_budget_exhausted(baseline, early, LIMITS, 300.0)  # …but the interval could still pass
    assert error_budget_exhausted(baseline, WindowStats(5.0, 5_000, 301, 5_000, 0, 0, 0.1), LIMITS, 300.0)


def test_duration_buckets_resolve_the_p99_gate() -> None:
    spec = load_stack("prod").spec
    buckets = duration_buckets(spec)
    assert buckets == sorted(set(buckets)) and buckets[0] == 0.001
    assert buckets[-1] == 10 * spec.limits.p99_target_s
    # At least three buckets inside any 30 % rise, so histogram_quantile sees it.
    assert all(b / a <= 1 + spec.rollout.max_p99_rise / 3 + 1e-3 for a, b in itertools.pairwise(buckets))


# ----------------------------------------------------------------------------------------- machine


def ev(state: RolloutState, kind: str = "done", **kw: object) -> RolloutState:
    if kind == "baseline":
        kw.setdefault("baseline", WindowStats(2.0, 200, 0, 200, 0, 0, 0.1))
    return advance(state, Event(kind, time.time(), step=state.step, **kw))  # type: ignore[arg-type]


def run_through(state: RolloutState, until: Step) -> RolloutState:
    while state.step != until:
        state = ev(state, "baseline" if state.step and state.step.phase is Phase.BASELINE else "done")
    return state


def test_healthy_rollout_visits_every_phase_of_every_batch_in_order() -> None:
    state = initial(sandbox_plan())
    seen = []
    while state.step is not None:
        seen.append((state.step.batch, state.step.phase))
        state = ev(state, "baseline" if state.step.phase is Phase.BASELINE else "done")
    assert state.outcome is Outcome.COMPLETED
    phases = [Phase.REMOVE, Phase.DRAIN, Phase.UPDATE, Phase.HEALTH, Phase.WARMUP, Phase.READMIT, Phase.SOAK]
    assert seen == [(None, Phase.BASELINE)] + [(b, p) for b in range(5) for p in phases]
    assert set(state.expected_versions().values()) == {"v2"}
    assert all(b.passed for b in state.batches)


def test_breach_in_batch_2_rolls_back_2_1_0_newest_first() -> None:
    state = run_through(initial(sandbox_plan()), Step(Phase.SOAK, 2))
    state = ev(state, "failed", detail="P99 rise 45% > 30%")
    order = []
    while state.step is not None:
        assert state.step.rollback
        if state.step.phase is Phase.REMOVE:
            order.append(state.step.batch)
        state = ev(state)
    assert order == [2, 1, 0]
    assert state.outcome is Outcome.ROLLED_BACK
    assert set(state.expected_versions().values()) == {"v1"}
    assert [b.passed for b in state.batches] == [True, True, False, None, None]
    assert "batch 2 (soak) failed: P99 rise 45% > 30%" in state.reason


def test_failure_before_the_update_only_readmits_the_batch() -> None:
    state = run_through(initial(sandbox_plan()), Step(Phase.DRAIN, 1))
    state = ev(state, "failed", detail="router refused")
    assert state.step == Step(Phase.READMIT, 1, rollback=True)
    assert state.rollback_queue == (0,)


def test_health_timeout_is_a_failure_that_restores_the_batch() -> None:
    state = run_through(initial(sandbox_plan()), Step(Phase.HEALTH, 0))
    assert state.out_of_router() == frozenset(sandbox_plan().batch(0).replicas)
    state = ev(state, "failed", detail="health timeout")
    assert state.step == Step(Phase.REMOVE, 0, rollback=True)


def test_pause_request_takes_effect_once_the_batch_is_back_in_the_router() -> None:
    state = run_through(initial(sandbox_plan()), Step(Phase.UPDATE, 1))
    state = advance(state, Event("pause", time.time()))
    assert state.active and state.pause_requested  # the batch is out: keep going
    state = run_through(state, Step(Phase.READMIT, 1))
    state = ev(state)
    assert state.outcome is Outcome.PAUSED and state.out_of_router() == frozenset()
    assert state.resume_step == Step(Phase.SOAK, 1)
    state = advance(state, Event("resume", time.time()))
    assert state.step == Step(Phase.SOAK, 1) and state.outcome is None and state.pause_requested is False


def test_operator_rollback_of_a_paused_rollout() -> None:
    state = run_through(initial(sandbox_plan()), Step(Phase.REMOVE, 2))
    state = advance(state, Event("pause", time.time()))
    assert state.outcome is Outcome.PAUSED
    state = advance(state, Event("rollback", time.time()))
    # Batch 2's removal may have begun before the pause: it is readmitted (a no-op if it never left),
    # then 1 and 0 are restored.
    assert state.step == Step(Phase.READMIT, 2, rollback=True) and state.rollback_queue == (1, 0)


def test_resume_clears_the_pause_and_a_resume_while_running_cancels_a_pause_request() -> None:
    state = run_through(initial(sandbox_plan()), Step(Phase.SOAK, 1))
    state = advance(state, Event("pause", time.time()))
    assert state.outcome is Outcome.PAUSED and state.reason.startswith("paused by the operator")
    state = advance(state, Event("resume", time.time()))
    assert (state.step, state.outcome, state.resume_step, state.pause_requested, state.reason) == (
        Step(Phase.SOAK, 1),
        None,
        None,
        False,
        "",
    )
    running = advance(run_through(initial(sandbox_plan()), Step(Phase.UPDATE, 1)), Event("pause", time.time()))
    assert running.pause_requested
    running = advance(running, Event("resume", time.time()))
    assert running.pause_requested is False and running.step == Step(Phase.UPDATE, 1)


def test_operator_rollback_reason_and_refusals() -> None:
    state = run_through(initial(sandbox_plan()), Step(Phase.SOAK, 1))
    rolled = advance(state, Event("rollback", time.time(), detail="latency looks wrong"))
    assert rolled.reason == "latency looks wrong" and rolled.step == Step(Phase.REMOVE, 1, rollback=True)
    assert rolled.rollback_queue == (0,)
    assert advance(rolled, Event("rollback", time.time())) == replace(rolled, events=rolled.events + 1)
    default = advance(state, Event("rollback", time.time()))
    assert default.reason == "rollback requested by the operator"
    ended = run_through(default, Step(Phase.REMOVE, 0, rollback=True))
    while ended.step is not None:
        ended = ev(ended)
    assert ended.outcome is Outcome.ROLLED_BACK
    with pytest.raises(TransitionError, match=r"already ended \(rolled_back\); plan a revert instead"):
        advance(ended, Event("rollback", time.time()))


def test_failed_restore_leaves_the_batch_out_and_pauses() -> None:
    state = run_through(initial(sandbox_plan()), Step(Phase.SOAK, 0))
    state = ev(state, "failed", detail="errors")
    state = run_through(state, Step(Phase.HEALTH, 0, rollback=True))
    state = ev(state, "failed", detail="v1 does not come up")
    assert state.outcome is Outcome.PAUSED
    assert state.out_of_router() == frozenset(sandbox_plan().batch(0).replicas)
    # `exaserve rollback` retries the restore.
    state = advance(state, Event("rollback", time.time()))
    assert state.step == Step(Phase.REMOVE, 0, rollback=True)


def test_a_failed_restore_pauses_before_another_batch_leaves_the_router() -> None:
    state = run_through(initial(sandbox_plan()), Step(Phase.REMOVE, 1))
    state = ev(state, "failed", detail="router refused the removal")  # batch 0 was updated: restore it after
    assert state.step == Step(Phase.READMIT, 1, rollback=True) and state.rollback_queue == (0,)
    state = ev(state, "failed", detail="router refused the readmission")  # batch 1 stays out
    assert state.outcome is Outcome.PAUSED and state.step is None
    assert state.out_of_router() == frozenset(sandbox_plan().batch(1).replicas)  # batch 0 still serves
    state = advance(state, Event("rollback", time.time()))  # the operator retries: batch 1 first, then 0
    assert state.step == Step(Phase.REMOVE, 1, rollback=True) and state.rollback_queue == (0,)


def test_revert_has_no_gates_and_pauses_on_failure() -> None:
    state = initial(sandbox_plan("revert"))
    assert state.step == Step(Phase.REMOVE, 0)
    state = run_through(state, Step(Phase.HEALTH, 3))
    state = ev(state, "failed", detail="timeout")
    assert state.outcome is Outcome.PAUSED and state.resume_step == Step(Phase.REMOVE, 3)
    with pytest.raises(
        TransitionError, match=r"^a revert cannot itself be rolled back; run `exaserve rollout --to` instead$"
    ):
        advance(state, Event("rollback", time.time()))


def test_a_failure_is_recorded_on_its_batch_and_a_failed_restore_adds_to_the_reason() -> None:
    gates = evaluate(WindowStats(2.0, 200, 0, 200, 0, 0, 0.1), WindowStats(2.0, 100, 0, 100, 0, 0, 0.1), LIMITS)
    state = run_through(initial(sandbox_plan()), Step(Phase.SOAK, 1))
    state = advance(state, Event("failed", 42.0, state.step, "QPS drop", gates))
    rec = state.batches[1]
    assert (rec.finished_at, rec.gates, rec.passed, rec.notes) == (
        42.0,
        gates,
        False,
        ("batch 1 (soak) failed: QPS drop",),
    )
    assert state.reason == "batch 1 (soak) failed: QPS drop"
    state = run_through(state, Step(Phase.HEALTH, 1, rollback=True))
    state = ev(state, "failed")
    assert state.reason == "batch 1 (soak) failed: QPS drop; rollback of batch 1 (health) failed"
    assert state.batches[1].notes[-1] == "rollback of batch 1 (health) failed"
    assert state.failed_restores == (1,) and state.outcome is Outcome.PAUSED


def test_a_pause_during_a_rollback_is_ignored() -> None:
    state = ev(run_through(initial(sandbox_plan()), Step(Phase.SOAK, 0)), "failed", detail="errors")
    assert state.rolling_back
    paused = advance(state, Event("pause", time.time()))
    assert paused == replace(state, events=state.events + 1)


def test_resuming_a_revert_retries_its_failed_batch() -> None:
    state = run_through(initial(sandbox_plan("revert")), Step(Phase.HEALTH, 3))
    state = ev(state, "failed", detail="timeout")
    assert state.failed_restores == (3,)
    state = advance(state, Event("resume", time.time()))
    assert state.step == Step(Phase.REMOVE, 3) and state.failed_restores == ()


def test_journal_lines_without_optional_fields_still_load() -> None:
    assert Event.from_json({"kind": "pause", "at": 1}) == Event("pause", 1.0)
    assert Event.from_json(Event("pause", 2.0).to_json()) == Event("pause", 2.0)
    assert Event("pause", 2.0).to_json()["step"] is None


def test_events_for_another_step_are_refused() -> None:
    state = initial(sandbox_plan())
    with pytest.raises(TransitionError, match="current step is"):
        advance(state, Event("done", time.time(), step=Step(Phase.SOAK, 4)))


def test_events_survive_the_journal_encoding() -> None:
    gates = evaluate(WindowStats(2.0, 200, 0, 200, 0, 0, 0.1), WindowStats(2.0, 150, 0, 150, 0, 0, 0.1), LIMITS)
    event = Event(
        "failed", 1.5, Step(Phase.SOAK, 2, rollback=True), "breach", gates, WindowStats(2.0, 1, 0, 1, 0, 0, None), 7.0
    )
    assert Event.from_json(json.loads(json.dumps(event.to_json()))) == event
    assert Step.from_json(Step(Phase.DRAIN, 0, rollback=True).to_json()).rollback is True


def test_contract_shape() -> None:
    state = run_through(initial(sandbox_plan()), Step(Phase.REMOVE, 1))
    doc = contract(state, {"sandbox-0-s0": "v2"})
    assert set(doc) == {"stack", "from_version", "to_version", "outcome", "batches", "client_errors", "final_versions"}
    b0 = doc["batches"][0]
    assert set(b0) == {"index", "replicas", "started_at", "finished_at", "gates", "passed"}
    assert set(b0["gates"]) == {"qps_drop", "p99_rise", "error_rate"} and b0["passed"] is True
    assert b0["started_at"].endswith("+00:00") and b0["finished_at"].endswith("+00:00")
    assert b0["started_at"] <= b0["finished_at"]
    assert doc["batches"][1]["finished_at"] is None
    gates = evaluate(WindowStats(2.0, 200, 0, 200, 0, 0, 0.1), WindowStats(2.0, 190, 0, 190, 0, 0, 0.11), LIMITS)
    soaked = advance(
        run_through(initial(sandbox_plan()), Step(Phase.SOAK, 0)), Event("done", 9.0, Step(Phase.SOAK, 0), gates=gates)
    )
    assert contract(soaked, {})["batches"][0]["gates"] == gates.contract()


OUTCOMES = st.lists(st.sampled_from(["done", "done", "done", "done", "failed", "pause", "router_lost"]), max_size=120)


@settings(max_examples=300, deadline=None)
@given(OUTCOMES)
# Found by this property under mutation testing: batch 1's removal fails, its readmission fails too; the
# rollback then removed batch 0 with batch 1 still out (two batches out). It now pauses instead.
@example(["done"] * 8 + ["failed", "failed", "done"])
def test_any_event_sequence_keeps_at_most_one_batch_out_and_ends_consistent(kinds: list[str]) -> None:
    """Whatever fails when: at most one batch is out of the router at a time; restores run newest
    first; a rollout that ends rolled back runs the old version everywhere with every replica in the
    router; and folding the recorded events (what a resume does) gives the same state."""
    plan = sandbox_plan()
    state = initial(plan)
    events: list[Event] = []
    restore_order: list[int] = []

    def apply(event: Event) -> None:
        nonlocal state
        state = advance(state, event)
        events.append(event)

    for drawn in kinds:
        kind = drawn
        step = state.step
        if step is None:
            if state.outcome is not Outcome.PAUSED or state.resume_step is None:
                break
            apply(Event("resume", time.time()))
            continue
        if kind == "pause":
            apply(Event("pause", time.time()))
            continue
        if step.phase is Phase.BASELINE:
            if kind == "failed":
                continue
            kind = "baseline" if kind == "done" else kind
        if step.rollback and step.phase is Phase.REMOVE and step.batch is not None:
            restore_order.append(step.batch)
        baseline = WindowStats(2.0, 200, 0, 200, 0, 0, 0.1) if kind == "baseline" else None
        apply(Event(kind, time.time(), step=step, baseline=baseline))  # type: ignore[arg-type]
        out_batches = {b.index for b in plan.batches if set(b.replicas) & state.out_of_router()}
        assert len(out_batches) <= 1
    assert restore_order == sorted(restore_order, reverse=True)
    if state.outcome is Outcome.ROLLED_BACK:
        assert set(state.expected_versions().values()) == {"v1"}
        assert state.out_of_router() == frozenset()
    if state.outcome is Outcome.COMPLETED:
        assert set(state.expected_versions().values()) == {"v2"}
    assert replay(plan, events) == state


# ----------------------------------------------------------------------------------------- journal


def test_journal_replays_to_the_same_state_and_drops_a_torn_last_line(tmp_path: Path) -> None:
    plan = sandbox_plan()
    path = tmp_path / "rollout" / "journal.jsonl"
    journal = Journal.create(path, plan)
    state = initial(plan)
    for _ in range(9):
        kind = "baseline" if state.step and state.step.phase is Phase.BASELINE else "done"
        event = Event(kind, time.time(), step=state.step,  # type: ignore[arg-type]
                      baseline=WindowStats(2.0, 200, 0, 200, 0, 0, 0.1) if kind == "baseline" else None)  # fmt: skip
        state = advance(state, event)
        journal.record(event)
    assert len(path.read_text().splitlines()) == 10  # the plan + one record per transition
    assert load_state(path) == state
    with path.open("a") as f:  # killed in the middle of a write
        f.write('{"seq":11,"event":{"kind":"do')
    journal2, plan2, events = Journal.open(path)
    assert plan2 == plan and replay(plan2, events) == state
    assert path.read_text().endswith("}\n"), "the torn line is cut off so appends start on a clean line"
    del journal2


def test_journal_damaged_in_the_middle_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    Journal.create(path, sandbox_plan())
    with path.open("a") as f:
        f.write("not json\n{}\n")
    with pytest.raises(JournalError, match=r"journal.jsonl:2: unreadable record"):
        load_state(path)


def test_new_journal_moves_the_old_one_to_history(tmp_path: Path) -> None:
    path = tmp_path / "rollout" / "journal.jsonl"
    Journal.create(path, sandbox_plan())
    Journal.create(path, sandbox_plan("revert"))
    assert len(list((tmp_path / "rollout" / "history").glob("*.jsonl"))) == 1
    state = load_state(path)
    assert state is not None and state.plan.kind == "revert"


HOLD_LOCK = """
import sys, time
from pathlib import Path
from serving.rollout.journal import StackLock
StackLock(Path(sys.argv[1])).acquire("test holder")
print("locked", flush=True)
time.sleep(60)
"""


def test_second_updater_is_refused_and_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    lock_path = tmp_path / "rollout.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(lock_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(LockedError, match=rf"pid {holder.pid}, test holder"):
            StackLock(lock_path).acquire("second")
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    lock = StackLock(lock_path)
    lock.acquire("after the holder died")  # the kernel dropped the dead holder's lock
    lock.release()


def test_nan_free_p99_when_window_is_empty() -> None:
    w = window_stats(counters(100), counters(100), seconds=1.0)
    assert w is not None and w.p99_s is None and not math.isnan(w.qps)
