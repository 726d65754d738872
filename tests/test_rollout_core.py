"""The updater's pure core: batch plan, gate arithmetic, the state machine, the journal and the lock."""

from __future__ import annotations

import asyncio
import bisect
import itertools
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from serving.render.common import duration_buckets
from serving.rollout.backends import BackendError, PodsStuck
from serving.rollout.gates.findings import FAMILY_ALPHA, MIN_REQUESTS, p99_check, qps_check
from serving.rollout.gates.judge import canary_budget_spent, judge
from serving.rollout.gates.verdict import Basis, Gates
from serving.rollout.gates.window import (
    ROUTER_GATE_METRICS,
    Counters,
    GroupStats,
    ReplicaReading,
    ReplicaWindow,
    RouterReading,
    WindowStats,
    replica_window,
    window_break,
    window_stats,
)
from serving.rollout.journal import Journal, JournalError, LockedError, StackLock, StackState, load_state
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
from serving.rollout.runner import Reading, Runner
from serving.router.client import HistogramSnapshot, MetricsSnapshot, parse_only
from serving.spec.stack import load_stack
from serving.stats import betabinom_sf, binom_sf, p_slower_than_reference
from tests.support.cli import exaserve_in_process, json_object
from tests.support.stacks import fleet_of, spec_from

LIMITS = GateLimits(max_qps_drop=0.20, max_p99_rise=0.30, max_error_rate=0.001)


def sandbox_plan(kind: str = "rollout") -> RolloutPlan:
    spec = load_stack("sandbox").spec
    return plan_rollout(fleet_of(spec, "sandbox"), from_version="v1", to_version="v2", kind=kind)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------- plan


def test_prod_batches_cover_every_replica_once_and_span_every_rack() -> None:
    spec = load_stack("prod").spec
    batches = plan_batches(fleet_of(spec).plan)
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
    assert [len(b.replicas) for b in plan_batches(fleet_of(spec).plan)] == [3, 3, 2]


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
smg_http_responses_total{{path="/generate",status_code="200",error_code=""}} {ok}
smg_http_responses_total{{path="/generate",status_code="503",error_code="no_available_workers"}} {client_err}
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


def counters_text(requests: int, *, client_err: int = 0, upstream_err: int = 0, fast: int | None = None) -> str:
    return ROUTER_TEXT.format(
        requests=requests,
        ok=requests - client_err,
        client_err=client_err,
        upstream_err=upstream_err,
        fast=requests if fast is None else fast,
    )


def counters(requests: int, *, client_err: int = 0, upstream_err: int = 0, fast: int | None = None) -> Counters:
    return Counters.read(
        MetricsSnapshot.parse(counters_text(requests, client_err=client_err, upstream_err=upstream_err, fast=fast))
    )


def one(c: Counters) -> dict[str, RouterReading]:
    """A fleet with a single router instance."""
    return {"http://r0:30000": RouterReading(c)}


def test_window_stats_from_router_metric_text() -> None:
    w = window_stats(one(counters(1000)), one(counters(1200, client_err=1, upstream_err=10, fast=1100)), seconds=2.0)
    assert w is not None
    assert w.requests == 200 and w.client_errors == 1 and w.upstream_errors == 10 and w.retries == 10
    assert w.qps == pytest.approx(199 / 2)
    # 100 of the 200 new requests were ≤ 0.1 s, 100 in (0.1, 0.2]: P99 interpolates to 0.198 s.
    assert w.p99_s == pytest.approx(0.198)
    # The upstream share (10 of 209) is far above the client-facing one: it decides the error rate.
    assert w.error_rate == pytest.approx(10 / 209)


def test_clients_errors_count_on_the_generation_routes_and_408_429_with_5xx() -> None:
    """smg's ``smg_http_responses_total{path, status_code, error_code}`` (middleware/metrics.rs): 5xx, 408 and 429 on
    the generation routes are client errors; a stream cut mid-body is not among them (smg ends it with an error event
    and [DONE]: a 200 with no error code; its breaker counts the failure); 4xx and 499 are not errors here; the
    control API's and probes' answers are no client's."""
    text = counters_text(1000, client_err=2) + "".join(
        f'smg_http_responses_total{{path="{path}",status_code="{code}",error_code="{error}"}} {n}\n'
        for path, code, error, n in [
            ("/v1/chat/completions", "400", "", 5),
            ("/v1/completions", "408", "", 3),
            ("/generate", "429", "", 11),
            ("/generate", "499", "client_closed_request", 13),
            ("/workers/{worker_id}", "404", "WORKER_NOT_FOUND", 17),
            ("/workers", "500", "", 19),
            ("/health", "503", "", 23),
        ]
    )
    assert Counters.read(MetricsSnapshot.parse(text)).client_errors == 2 + 3 + 11


def test_a_worker_s_own_http_counts_give_its_refusals_on_the_generation_routes() -> None:
    """SGLang's HTTP middleware counts each answer by route and status (``sglang:http_responses_total``, with
    --enable-metrics): the replica's refusals are its 4xx but 408 and 429 on the generation routes; before its first
    answer (a restarted worker: the labelled family has no sample yet) it has answered and refused nothing."""
    lines = "".join(
        f'sglang:http_responses_total{{endpoint="{path}",status_code="{code}",method="POST"}} {n}\n'
        for path, code, n in [
            ("/generate", "200", 90),
            ("/v1/chat/completions", "400", 7),
            ("/generate", "429", 2),
            ("/v1/completions", "408", 1),
            ("/health_generate", "503", 30),
        ]
    )
    snap = MetricsSnapshot.parse("# TYPE sglang:http_responses_total counter\n" + lines)
    reading = ReplicaReading.read({}, "http://w:1", snap)
    assert reading.refusals == (100, 7)
    assert ReplicaReading.read({}, "http://w:1", MetricsSnapshot.parse("")).refusals == (0, 0)
    assert ReplicaReading.read({}, "http://w:1", "ConnectError").refusals is None, "not scraped: not measured"
    later = replace(reading, refusals=(160, 9))
    assert replica_window(reading, later).refusals == (60, 2)
    assert replica_window(later, reading).refusals is None, "counters that went back: it restarted, not measured"


def refusing(ok: int, refused: int) -> ReplicaWindow:
    return replace(replica(ok=ok), refusals=(ok + refused, refused))


def test_a_release_answering_400_is_rolled_back_though_smg_counts_its_4xx_as_successes() -> None:
    """Issue 39: smg counts a worker's 400 as a success (worker/resilience.rs), so every per-replica figure of a
    release refusing a tenth of its requests looked healthy and it passed every gate. The workers' own counts judge
    the canary against its peers over the same window; the clients' own bad requests, spread on every replica alike,
    do not roll a batch back."""
    peers = {r: refusing(50, 0) for r in PEERS}
    bad = verdict_of({**{r: refusing(45, 5) for r in CANARY}, **peers})
    assert bad.verdict is not None and bad.verdict.decision == "rollback", bad.verdict
    assert bad.breaches[0].startswith("canary refused 10 of 100 requests with a 4xx (10.00%) against its baseline's 0")
    assert bad.verdict.replicas == CANARY
    # the clients' own 2 % of bad requests on every replica, one more on the canary by chance: p = 0.3, no breach
    noisy = verdict_of(
        {**{r: refusing(48, 2) for r in CANARY}, "c0": refusing(47, 3), **{r: refusing(49, 1) for r in PEERS}}
    )
    assert noisy.verdict is not None and noisy.verdict.decision == "pass", noisy.verdict
    unmeasured = verdict_of({**{r: refusing(45, 5) for r in CANARY}, **{r: replica() for r in PEERS}})
    assert unmeasured.verdict is not None and unmeasured.verdict.decision == "pass", "no baseline figure: not judged"
    assert binom_sf(10, 10, 0.4) == pytest.approx(0.4**10) and binom_sf(0, 5, 0.5) == 1.0
    assert binom_sf(2, 4, 0.5) == pytest.approx(11 / 16)


def test_the_gates_parse_only_the_families_they_read() -> None:
    text = counters_text(1000, client_err=2, upstream_err=3) + (
        "# TYPE smg_http_request_duration_seconds histogram\n"
        'smg_http_request_duration_seconds_bucket{method="GET",path="/workers",le="+Inf"} 7\n'
        'smg_worker_cb_outcomes_total{worker="http://w:1",outcome="success"} 9\n'
    )
    kept = parse_only(text, ROUTER_GATE_METRICS)
    assert Counters.read(kept) == Counters.read(MetricsSnapshot.parse(text))
    assert kept.value("smg_worker_cb_outcomes_total", worker="http://w:1") == 9
    assert not kept.select("smg_http_request_duration_seconds_bucket")


def test_counters_going_down_mean_a_router_restart_not_a_measurement() -> None:
    assert window_stats(one(counters(5000)), one(counters(40)), seconds=2.0) is None


WORKERS = ["http://w:1", "http://w:2"]


def instance(requests: int, w1: tuple[int, int], w2: tuple[int, int], *, unhealthy: str = "") -> RouterReading:
    """One router instance's scrape: its router-wide counters and its upstream outcomes per worker."""
    outcomes = "".join(
        f'smg_worker_cb_outcomes_total{{worker="{u}",outcome="{o}"}} {n}\n'
        for u, pair in zip(WORKERS, (w1, w2), strict=True)
        for o, n in zip(("success", "failure"), pair, strict=True)
    )
    health = "".join(f'smg_worker_health{{worker="{u}"}} {0 if u == unhealthy else 1}\n' for u in WORKERS)
    return RouterReading.read(MetricsSnapshot.parse(counters_text(requests) + outcomes + health), WORKERS)


def test_every_router_instance_counts_its_share_and_the_window_sums_them() -> None:
    """Three instances, each seeing a third of the clients: the fleet's figures are the sum of each one's own
    window, per worker too (a single instance would show a third of the traffic, and a ClusterIP scrape a random
    third each time)."""
    before = {
        "r0": instance(100, (40, 0), (50, 1)),
        "r1": instance(10, (5, 0), (4, 0)),
        "r2": instance(0, (0, 0), (0, 0)),
    }
    after = {"r0": instance(160, (70, 0), (80, 1)), "r1": instance(70, (35, 1), (33, 0)),
             "r2": instance(60, (31, 0), (29, 0), unhealthy="http://w:2")}  # fmt: skip
    w = window_stats(before, after, seconds=2.0)
    assert w is not None and w.requests == 60 + 60 + 60 and w.qps == pytest.approx(90)
    replicas = {
        u: replica_window(ReplicaReading.read(before, u, None), ReplicaReading.read(after, u, None)) for u in WORKERS
    }
    assert (replicas["http://w:1"].successes, replicas["http://w:1"].failures) == (30 + 30 + 31, 1)
    assert (replicas["http://w:2"].successes, replicas["http://w:2"].failures) == (30 + 29 + 29, 0)
    for u in WORKERS:  # the sum is each instance's own window, added up
        expected = sum(after[r].outcomes[u][0] - before[r].outcomes[u][0] for r in after)
        assert replicas[u].successes == expected
    assert replicas["http://w:2"].problems == ("the router marks it unhealthy",)  # one instance says so: enough
    assert replicas["http://w:1"].problems == ()


def test_a_window_that_loses_gains_or_restarts_a_router_instance_is_no_measurement() -> None:
    """Never a part of the routers: an instance that went or came, or whose counters (router-wide or one worker's)
    went back, makes the window unknown, naming the instance."""
    before = {"r0": instance(100, (40, 0), (50, 0)), "r1": instance(100, (40, 0), (50, 0))}
    gone = {"r0": instance(200, (90, 0), (100, 0))}
    assert window_stats(before, gone, 2.0) is None
    assert window_break(before, gone) == "router instances changed during the window: gone r1"
    new = {**before, "r2": instance(0, (0, 0), (0, 0))}
    assert window_break(before, new) == "router instances changed during the window; new r2"
    restarted = {"r0": instance(200, (90, 0), (100, 0)), "r1": instance(150, (2, 0), (140, 0))}
    assert window_stats(before, restarted, 2.0) is None, "router-wide counters rose, one worker's went back"
    assert window_break(before, restarted) == "router r1 restarted during the window (its counters went back)"
    # A worker's series the instance dropped with the worker (removed from it) is not a restart.
    dropped = {"r0": instance(200, (90, 0), (100, 0)), "r1": RouterReading(counters(150), {"http://w:1": (60, 0)})}
    assert window_break(before, dropped) is None


@pytest.mark.parametrize(("requests", "judged"), [(MIN_REQUESTS - 1, False), (MIN_REQUESTS, True)])
def test_qps_and_p99_are_judged_from_min_requests_on(requests: int, judged: bool) -> None:
    """19 requests are too few to judge, 20 are judged: the QPS check on the reference's successes and on what the
    canary's exposure would see at the reference's rate (both exactly 20 here), the P99 check on the canary's
    latency count."""
    assert MIN_REQUESTS == 20
    windows = {"c0": replica(ok=requests), "p0": replica(ok=requests)}
    reference = GroupStats(("p0",), SECONDS, float(requests), 0.0, 0.1)
    drop, _ = qps_check("canary", ["c0"], windows, SECONDS, reference, LIMITS, 0.001, 1.0)
    rise, _ = p99_check("canary", ["c0"], windows, 0.1, LIMITS, 0.001, None, float(requests))
    assert (drop is not None, rise is not None) == (judged, judged)


def test_window_stats_subtract_every_counter_from_a_non_zero_start() -> None:
    h0 = HistogramSnapshot(((0.1, 50.0), (math.inf, 100.0)), 100.0, 5.0)
    h1 = HistogramSnapshot(((0.1, 150.0), (math.inf, 300.0)), 300.0, 25.0)
    before = Counters(requests=100, client_errors=2, upstream_responses=110, upstream_errors=3, retries=4, duration=h0)
    after = Counters(requests=300, client_errors=5, upstream_responses=330, upstream_errors=10, retries=9, duration=h1)
    w = window_stats(one(before), one(after), seconds=4.0)
    assert w is not None
    assert (w.requests, w.client_errors, w.upstream_responses, w.upstream_errors, w.retries) == (200, 3, 220, 7, 5)
    assert w.qps == pytest.approx(197 / 4)
    # Only the latency histogram went down (a router restart between two scrapes that kept the counters' order):
    assert (
        window_stats(
            one(before),
            one(replace(after, duration=HistogramSnapshot(((0.1, 10.0), (math.inf, 400.0)), 400.0, 30.0))),
            4.0,
        )
        is None
    )


# The canary gate. Replica windows are built from latencies on the sandbox's rendered buckets, as the workers'
# histograms hold them; 2 canary replicas against 6 peers, 4 s windows at ~12.5 requests/s per replica, the
# sandbox's traffic in the rollout tests.
BUCKETS = duration_buckets(load_stack("sandbox").spec)
CANARY = ("c0", "c1")
PEERS = ("p0", "p1", "p2", "p3", "p4", "p5")
SECONDS = 4.0


def histogram(latencies_s: list[float]) -> HistogramSnapshot:
    ordered = sorted(latencies_s)
    cumulative = tuple((le, float(bisect.bisect_right(ordered, le))) for le in [*BUCKETS, math.inf])
    return HistogramSnapshot(cumulative, float(len(ordered)), sum(ordered))


def replica(ok: int = 50, failed: int = 0, ms: float = 100.0, slow: int = 0, slow_ms: float = 150.0,
            problems: tuple[str, ...] = ()) -> ReplicaWindow:  # fmt: skip
    """``ok`` successes spread evenly over ``ms`` ± 10 %, ``slow`` of them at ``slow_ms`` instead."""
    fast = [ms / 1000 * (0.9 + 0.2 * i / max(1, ok - slow - 1)) for i in range(ok - slow)]
    return ReplicaWindow(ok, failed, histogram(fast + [slow_ms / 1000] * slow) if ok else None, problems)


def fleet_window(requests: float = 400, client_errors: float = 0) -> WindowStats:
    return WindowStats(SECONDS, requests, client_errors, requests, 0, 0, 0.11)


PRE = WindowStats(SECONDS, 400, 0, 400, 0, 0, 0.11, GroupStats(CANARY + PEERS, SECONDS, 400, 0, 0.108))


def verdict_of(windows: dict[str, ReplicaWindow], basis: str = "not-updated", **kw: object) -> Gates:
    peers = [r for r in windows if r not in CANARY]
    args: dict[str, object] = {"basis": basis, "seconds": SECONDS, "fleet": fleet_window(), "before": PRE,
                               "limits": LIMITS, **kw}  # fmt: skip
    return judge(list(CANARY), peers if basis != "pre-rollout" else [], windows, **args)  # type: ignore[arg-type]


def healthy(**changes: ReplicaWindow) -> dict[str, ReplicaWindow]:
    return {r: changes.get(r, replica()) for r in CANARY + PEERS}


def test_a_healthy_canary_passes_against_its_peers_over_the_same_window() -> None:
    g = verdict_of(healthy())
    assert g.verdict is not None and g.verdict.decision == "pass" and g.passed
    assert g.qps_drop == pytest.approx(0.0) and g.p99_rise == pytest.approx(0.0) and g.error_rate == 0
    assert g.canary is not None and g.baseline is not None
    assert (g.canary.replicas, g.baseline.replicas) == (CANARY, PEERS)
    assert g.canary.qps_per_replica == pytest.approx(50 / SECONDS)
    assert g.verdict.evidence[0] == "canary within every gate" and g.verdict.replicas == ()
    assert "the replicas not yet updated" in g.verdict.evidence[2]


def test_a_release_hidden_by_router_retries_still_rolls_back_on_its_own_upstream_failures() -> None:
    """The router retried every failure elsewhere (clients saw none): the canary's own outcomes decide."""
    g = verdict_of(healthy(c0=replica(ok=48, failed=3), c1=replica(ok=49, failed=2)))
    assert g.verdict is not None and g.verdict.decision == "rollback" and g.client_error_rate == 0
    assert g.error_rate == pytest.approx(5 / 102)
    assert g.verdict.replicas == ("c0", "c1")
    assert g.breaches == ("canary error rate 4.90% > 0.10% (5 of 102 upstream attempts failed: c0 3/51, c1 2/51)",)


@pytest.mark.parametrize(("failed", "decision"), [(2, "pass"), (3, "rollback")])
def test_the_error_gate_is_strict_at_its_limit(failed: int, decision: str) -> None:
    """2,000 upstream attempts on the canary: 0.1 % of them (2) may fail, the 3rd rolls back."""
    big = healthy(c0=replica(ok=1000 - failed, failed=failed), c1=replica(ok=1000))
    g = verdict_of(big)
    assert g.verdict is not None and g.verdict.decision == decision


def test_a_slower_canary_rolls_back_on_p99_and_one_slow_request_does_not() -> None:
    slow = verdict_of(healthy(c0=replica(ms=150), c1=replica(ms=150)))
    assert slow.verdict is not None and slow.verdict.decision == "rollback"
    assert slow.p99_rise is not None and slow.p99_rise > 0.3
    # histogram_quantile on the rendered buckets (ratio 1.1) reads 110 ms latencies as 116.8 ms, 165 ms as 171.4 ms.
    assert [b.split(":")[0] for b in slow.breaches] == ["canary P99 171.4 ms vs 116.8 ms"]
    # Two requests in 100 at 250 ms (a scheduling hiccup) put the point estimate past +30 %, but 2 % over the
    # bound where a P99 allows 1 % is chance at this size (p ≈ 0.26): no finding.
    hiccup = verdict_of(healthy(c0=replica(slow=2, slow_ms=250)))
    assert hiccup.verdict is not None and hiccup.verdict.decision == "pass"
    assert hiccup.p99_rise is not None and hiccup.p99_rise > 0.3, "the point estimate alone would have tripped"


@pytest.mark.parametrize(
    ("canary_ms", "canary_slow", "decision"),
    [(175, 2, "rollback"), (175, 0, "rollback"), (135, 2, "pass"), (135, 0, "pass")],
)
def test_a_release_slower_on_every_request_rolls_back_although_the_baselines_tail_is_noisy(
    canary_ms: float, canary_slow: int, decision: str
) -> None:
    """The CI case (test_fifty_percent_slower_release_trips_the_p99_gate paused in batch 1): load inflated the
    baseline's tail (here 6 of 300 requests at 175 ms, P99 about 175 ms for a bulk at 117 ms), so the tail test's
    bound, 1.3 × that, lay over a 50 % slower release's bulk (157–193 ms) and its 4 requests at 290 ms in 100 were
    not significant: the canary passed. The bulk test sees every request past 1.3 × the baseline's median. A release
    15 % slower with the same tail is within the gate: the median test is for a shift past the limit, not any. Without
    slow outliers of its own (a reviewer's case) the slower release's P99 is not even 30 % over the inflated
    reference's, and it still rolls back on its median."""
    peers = {r: replica(ms=117, slow=1, slow_ms=175) for r in PEERS}
    canary = {r: replica(ms=canary_ms, slow=canary_slow, slow_ms=290) for r in CANARY}
    g = verdict_of({**canary, **peers})
    assert g.p99_rise is not None and (g.p99_rise > 0.3) == (canary_slow > 0), g.p99_rise
    assert g.verdict is not None and g.verdict.decision == decision, g.verdict.evidence
    if decision == "rollback":
        assert g.verdict.replicas == CANARY
        assert "the whole distribution moved" in g.breaches[0] and "canary median 1" in g.breaches[0]
        median_s = g.baseline.median_s  # of the synthetic 117 ms requests above
        assert median_s is not None and 0.11 < median_s < 0.125  # not a timing judgment: a parsed synthetic value


@pytest.mark.parametrize(
    ("scale", "decision"),
    [(1, "pass"), (20, "rollback")],  # the same 30 % drop: chance at 50 requests a replica, not at 1,000
)
def test_a_qps_drop_must_be_past_the_limit_and_significant(scale: int, decision: str) -> None:
    windows = {r: replica(ok=(35 if r in CANARY else 50) * scale) for r in CANARY + PEERS}
    g = verdict_of(windows)
    assert g.qps_drop == pytest.approx(0.3)
    assert g.verdict is not None and g.verdict.decision == decision


def test_the_routers_uneven_split_is_not_evidence_and_widens_the_canary_qps_test() -> None:
    """As seen live (power_of_two with loads polled once per heartbeat): one healthy peer got a third of its peers'
    traffic for a whole window and the canary 27 % less than the rest. Neither is the replicas' doing."""
    counts = {"c0": 38, "c1": 38, "p0": 62, "p1": 57, "p2": 20, "p3": 60, "p4": 58, "p5": 59}
    g = verdict_of({r: replica(ok=n) for r, n in counts.items()})
    assert g.verdict is not None and g.verdict.decision == "pass", g.verdict
    assert g.qps_drop is not None and g.qps_drop > 0.2 and g.baseline is not None and g.baseline.excluded == {}
    # The same drop with peers as even as chance makes them is a finding.
    even = verdict_of({r: replica(ok=(38 if r in CANARY else 52) * 10) for r in counts})
    assert even.verdict is not None and even.verdict.decision == "rollback"


def test_a_window_shorter_than_two_load_polls_shows_the_canary_qps_but_does_not_judge_it() -> None:
    """As CI saw it (power_of_two, loads polled every 5 s, a 1.5 s soak): two healthy canaries that looked busiest
    at the last poll got 3 requests while their peer got 35. Within one poll the split is the router's ranking."""
    windows = {r: replica(ok=(2 if r in CANARY else 50) * 20) for r in CANARY + PEERS}
    judged = verdict_of(windows)
    assert judged.verdict is not None and judged.verdict.decision == "rollback" and judged.qps_drop is not None
    short = verdict_of(windows, limits=replace(LIMITS, qps_window_min_s=SECONDS * 2))
    assert short.verdict is not None and short.verdict.decision == "pass" and short.qps_drop is None
    assert short.verdict.evidence[-1].startswith(
        f"canary QPS per replica -96% against its baseline, not judged: the {SECONDS:.1f} s window is shorter than"
    )
    # What the window does show still counts: a failing canary rolls back however short the window.
    failing = verdict_of(healthy(c0=replica(ok=45, failed=5)), limits=replace(LIMITS, qps_window_min_s=SECONDS * 2))
    assert failing.verdict is not None and failing.verdict.decision == "rollback"


def test_the_qps_window_is_two_load_polls_under_power_of_two_and_any_window_otherwise() -> None:
    prod = load_stack("prod").spec
    assert GateLimits.from_spec(prod).qps_window_min_s == 2 * prod.serving.heartbeat_interval_s == 10
    cache = spec_from("prod", scheduler__strategy="cache_aware")
    assert GateLimits.from_spec(cache).qps_window_min_s == 0
    # the router polls every --worker-startup-check-interval, the heartbeat in whole seconds: 2.5 s polls every 3 s
    assert GateLimits.from_spec(spec_from("prod", serving__heartbeat_interval_s=2.5)).qps_window_min_s == 6


@given(st.floats(0, 2), st.floats(0, 2), st.floats(0.1, 600))
@example(0.2, 0.0, 10.0)  # as the sandbox measured it: a 10 s soak read as 9.99 s, its QPS gate "not judged"
def test_a_soak_window_is_never_shorter_than_the_soak_asked_for(start_took: float, end_took: float, s: float) -> None:
    """Issue 28: the read ending a window started half the first read early, so a faster end read made the window
    short of rollout.interval_s; at the minimum soak (two load polls) the QPS gate was then not judged."""
    start = Reading({}, {}, at=0.0, took=start_took)  # at 0: float rounding of at + s - at is not the question
    end_at = start.due(s) + end_took / 2  # a read's time is its middle
    assert end_at - start.at >= s


def test_a_canary_replica_down_rolls_back() -> None:
    down = replica(ok=2, failed=3, problems=("its /metrics does not answer (ConnectError)",))
    g = verdict_of(healthy(c1=down))
    assert g.verdict is not None and g.verdict.decision == "rollback"
    assert g.breaches[0] == "c1 down: its /metrics does not answer (ConnectError)"
    assert "c1" in g.verdict.replicas


def test_a_crashed_peer_pauses_names_it_and_is_left_out_of_the_baseline() -> None:
    crashed = replica(ok=3, failed=3, problems=("its /metrics does not answer (ConnectError)",
                                                "the router's circuit breaker for it is open"))  # fmt: skip
    g = verdict_of(healthy(p2=crashed))
    assert g.verdict is not None and g.verdict.decision == "pause" and not g.passed
    assert g.verdict.replicas == ("p2",)
    assert g.verdict.evidence[0].startswith("evidence outside the batch, the new version is not blamed: p2 down:")
    assert g.baseline is not None and "p2" not in g.baseline.replicas and g.baseline.excluded == {"p2": "down"}
    assert g.qps_drop == pytest.approx(0.0), "the canary is compared with the peers that are up"


def test_a_slow_or_failing_peer_pauses_naming_it() -> None:
    slow = verdict_of(healthy(p4=replica(ms=150)))
    assert slow.verdict is not None and slow.verdict.decision == "pause" and slow.verdict.replicas == ("p4",)
    assert slow.breaches[0].startswith("p4 P99 171.4 ms vs 116.8 ms: +46.7% > +30% (22 of 50 requests over 151.8 ms")
    failing = verdict_of(healthy(p0=replica(ok=45, failed=5)))
    assert failing.verdict is not None and failing.verdict.decision == "pause"
    assert failing.breaches == ("p0 error rate 10.00% > 0.10% (5 of 50 upstream attempts failed: p0 5/50)",)


def test_gates_in_dry_run_are_measured_and_shown_never_decisive() -> None:
    """rollout.dry_run_gates (Argo Rollouts' analysis dryRun; the CI suite's sandbox rollouts, whose latency is the
    shared machine's): a canary 50 % slower and a peer 50 % slower are measured, their findings shown as what the
    gate would have done, and the batch passes; the same windows enforced roll back and pause. The other gates are
    never dry run: a failing canary still rolls back."""
    dry = replace(LIMITS, dry_run=("qps", "p99"))
    slow = healthy(c0=replica(ms=150), c1=replica(ms=150))
    enforced, dry_run = verdict_of(slow), verdict_of(slow, limits=dry)
    assert enforced.verdict is not None and enforced.verdict.decision == "rollback"
    assert dry_run.verdict is not None and dry_run.verdict.decision == "pass" and dry_run.passed
    assert dry_run.p99_rise == enforced.p99_rise and dry_run.p99_rise is not None and dry_run.p99_rise > 0.3
    assert [e for e in dry_run.verdict.evidence if e.startswith("dry run")] == [
        "dry run, not enforced (rollout.dry_run_gates): would have rolled back: " + enforced.breaches[0]
    ]
    peer = healthy(p4=replica(ms=150))
    assert verdict_of(peer).verdict.decision == "pause"  # type: ignore[union-attr]
    shown = verdict_of(peer, limits=dry).verdict
    assert shown is not None and shown.decision == "pass" and shown.replicas == ()
    assert any(e.startswith("dry run, not enforced (rollout.dry_run_gates): would have paused: p4 P99") for e in
               shown.evidence)  # fmt: skip
    starved = verdict_of(healthy(c0=replica(ok=10), c1=replica(ok=10)), limits=replace(LIMITS, dry_run=("qps",)))
    assert starved.verdict is not None and starved.verdict.decision == "pass" and starved.qps_drop is not None
    assert any(e.startswith("dry run, not enforced (rollout.dry_run_gates): would have rolled back: canary QPS")
               for e in starved.verdict.evidence), starved.verdict.evidence  # fmt: skip
    failing = verdict_of(healthy(c0=replica(ok=48, failed=3)), limits=dry)
    assert failing.verdict is not None and failing.verdict.decision == "rollback"
    thin = verdict_of({r: replica(ok=2) for r in CANARY + PEERS}, limits=dry)
    assert thin.verdict is not None and thin.verdict.decision == "pause"  # too little traffic to judge: no dry run
    # a canary the traffic did not reach while the fleet's was ample: its QPS finding is all that shows the batch
    # does not serve (the error gate has no attempt to count), so it stays decisive
    unreached = verdict_of(healthy(c0=replica(ok=0), c1=replica(ok=0)), limits=dry)
    assert unreached.verdict is not None and unreached.verdict.decision == "rollback", unreached.verdict
    # a peer only a dry-run gate found slow stays in the reference: the dry run changes no enforced figure
    assert shown is not None and verdict_of(peer, limits=dry).baseline.excluded == {}  # type: ignore[union-attr]
    assert verdict_of(peer).baseline.excluded == {"p4": "slower than its peers"}  # type: ignore[union-attr]


def test_dry_run_gates_come_from_the_spec_and_survive_the_journal() -> None:
    spec = load_stack("sandbox").spec
    assert GateLimits.from_spec(spec).dry_run == ()
    dry = spec.model_copy(update={"rollout": spec.rollout.model_copy(update={"dry_run_gates": ("p99",)})})
    limits = GateLimits.from_spec(dry)
    assert limits.dry_run == ("p99",)
    assert GateLimits.from_json(json.loads(json.dumps(vars(limits)))) == limits
    old = {k: v for k, v in vars(limits).items() if k != "dry_run"}  # a journal written before the field
    assert GateLimits.from_json(old).dry_run == ()


def test_a_breach_with_evidence_outside_the_batch_pauses_rather_than_rolls_back() -> None:
    g = verdict_of(healthy(c0=replica(ok=45, failed=5), p0=replica(ok=45, failed=5)))
    assert g.verdict is not None and g.verdict.decision == "pause"
    assert g.verdict.evidence[1].startswith("the canary also breached, not attributable while the fleet is like this")


def test_weather_alike_passes_with_the_dip_named_and_a_dip_too_deep_to_judge_pauses() -> None:
    dip = verdict_of({r: replica(ok=25, ms=160) for r in CANARY + PEERS})  # half the traffic, all 45 % slower
    assert dip.verdict is not None and dip.verdict.decision == "pass"
    assert dip.qps_drop == pytest.approx(0.0) and dip.p99_rise == pytest.approx(0.0)
    assert dip.verdict.evidence[3:] == (
        "traffic per replica 50% below the pre-rollout baseline: weather, not the batch",
        "the replicas outside the batch are +74% slower (P99) than before the rollout: weather, not the batch",
    )
    thin = verdict_of({r: replica(ok=2) for r in CANARY + PEERS})
    assert thin.qps_drop is None and thin.verdict is not None and thin.verdict.decision == "pause"
    assert thin.breaches[0].startswith("traffic dip: 0.50 requests/s per replica vs 12.50/s before the rollout")
    # --accept-inconclusive accepts too little traffic to judge, whatever thinned it: the dip is said, not paused on
    # (a CI run's own clients, starved 59 %, paused a rollout run with it at 11d94b5)
    accepted = verdict_of({r: replica(ok=2) for r in CANARY + PEERS}, accept_inconclusive=True)
    assert accepted.verdict is not None and accepted.verdict.decision == "pass" and not accepted.breaches
    assert any(
        e.startswith("traffic dip: 0.50 requests/s per replica vs 12.50/s")
        and e.endswith("passed unjudged by --accept-inconclusive")
        for e in accepted.verdict.evidence
    ), accepted.verdict.evidence
    assert any(e.startswith("not judged, too little traffic, passed by") for e in accepted.verdict.evidence)


def test_a_canary_taking_more_than_its_share_is_no_traffic_dip() -> None:
    """Issue 28: a resumed soak paused on "traffic dip: 4.33 requests/s per replica vs 6.25/s (31% less)" while
    clients sent a steady 50/s. 6.25 is 50/s over all 8 replicas before the rollout; 4.33 was the rate of the 6
    replicas outside the batch alone, while the router sent the 2 freshly readmitted canaries 12/s each (power_of_two
    favours a replica polled with no load): the same 50/s, split differently. Before the fix this paused."""
    rates = {"c0": 12.0, "c1": 12.0, **dict.fromkeys(PEERS, 26.0 / 6)}  # 50 requests/s in all, as before the rollout
    pre = WindowStats(2.0, 100, 0, 100, 0, 0, 0.11, GroupStats(CANARY + PEERS, 2.0, 100, 0, 0.108))
    windows = {r: replica(ok=round(rate * 2.0)) for r, rate in rates.items()}
    g = verdict_of(windows, seconds=2.0, before=pre, fleet=WindowStats(2.0, 100, 0, 100, 0, 0, 0.11))
    assert g.verdict is not None and g.verdict.decision == "pass", g.verdict
    assert not any("traffic dip" in line for line in g.verdict.evidence)
    assert "qps_drop" in g.inconclusive  # the peers' 8.7 requests in 2 s are too few for the QPS test: named


def test_client_errors_that_no_replica_explains_pause() -> None:
    g = verdict_of(healthy(), fleet=fleet_window(client_errors=8))
    assert g.verdict is not None and g.verdict.decision == "pause" and g.verdict.replicas == ()
    assert g.breaches[0].startswith("clients got 8 errors of 400 requests (2.00%) while no replica failed")


def test_a_single_batch_is_judged_against_the_pre_rollout_figures() -> None:
    windows = {r: replica(ms=150) for r in CANARY}
    g = verdict_of(windows, basis="pre-rollout")
    assert g.verdict is not None and g.verdict.decision == "rollback" and g.verdict.basis == "pre-rollout"
    assert g.baseline == PRE.replicas


def test_no_pre_rollout_traffic_is_inconclusive_and_pauses_unless_accepted() -> None:
    """Issue 28: with too little traffic to judge, the gates passed ("canary within every gate … P99 n/a, errors
    0/0") and a slow release shipped blind. Now the soak pauses, naming each gate and the traffic it needs."""
    idle = WindowStats(SECONDS, 0, 0, 0, 0, 0, None, GroupStats(CANARY + PEERS, SECONDS, 0, 0, None))
    g = verdict_of({r: replica(ok=5) for r in CANARY}, basis="pre-rollout", before=idle)
    assert (g.qps_drop, g.p99_rise) == (None, None) and g.verdict is not None and g.verdict.decision == "pause"
    assert set(g.inconclusive) == {"qps_drop", "p99_rise", "error_rate"} and not g.passed
    assert g.inconclusive["error_rate"] == "10 upstream attempts reached the canary; its error rate needs 20"
    assert g.inconclusive["p99_rise"] == "10 of the canary's requests timed; the test needs 20"
    # 20 requests over the canary's 2 replicas in 4 s: 2.5 req/s each; the 2 replicas measured, 5.0 through the routers
    assert g.verdict.evidence[0].startswith("inconclusive, too little traffic to judge the canary: QPS: ")
    assert (
        "The soak needs at least 2.50 req/s per replica (5.0 req/s through the routers) over its 4.0 s"
        in (g.verdict.evidence[0])
    )
    accepted = verdict_of(
        {r: replica(ok=5) for r in CANARY}, basis="pre-rollout", before=idle, accept_inconclusive=True
    )
    assert accepted.verdict is not None and accepted.verdict.decision == "pass" and accepted.passed
    assert accepted.inconclusive == g.inconclusive
    assert accepted.verdict.evidence[-1].startswith("not judged, too little traffic, passed by --accept-inconclusive")


def test_thin_traffic_beside_a_breach_still_rolls_back_and_full_traffic_is_judged_on_every_gate() -> None:
    failing = verdict_of({"c0": replica(ok=3, failed=2), "c1": replica(ok=5), **{p: replica() for p in PEERS}})
    assert failing.verdict is not None and failing.verdict.decision == "rollback"
    assert "error_rate" in failing.inconclusive  # 10 attempts: shown, and the breach stands
    assert verdict_of(healthy()).inconclusive == {}


def test_a_soak_shorter_than_two_load_polls_names_the_qps_gate_inconclusive_without_pausing() -> None:
    g = verdict_of(healthy(), limits=replace(LIMITS, qps_window_min_s=SECONDS * 2))
    assert g.verdict is not None and g.verdict.decision == "pass"
    assert list(g.inconclusive) == ["qps_drop"] and "soak is shorter than 8 s" in g.inconclusive["qps_drop"]


def test_too_little_traffic_at_the_baseline_pauses_before_anything_changes_and_resume_measures_again() -> None:
    state = initial(sandbox_plan())
    assert state.step == Step(Phase.BASELINE, None)
    paused = advance(state, Event("outside", 1.0, state.step, "inconclusive: send traffic"))
    assert paused.outcome is Outcome.PAUSED and paused.resume_step == Step(Phase.BASELINE, None)
    assert paused.reason == "paused before the first batch: inconclusive: send traffic"
    assert all(rec.started_at is None for rec in paused.batches) and paused.baseline is None
    assert advance(paused, Event("resume", 2.0)).step == Step(Phase.BASELINE, None)


def test_replica_readings_from_router_and_worker_text() -> None:
    router = MetricsSnapshot.parse(
        'smg_worker_cb_outcomes_total{worker="http://w:1",outcome="success"} 40\n'
        'smg_worker_cb_outcomes_total{worker="http://w:1",outcome="failure"} 2\n'
        'smg_worker_health{worker="http://w:1"} 1\n'
        'smg_worker_cb_state{worker="http://w:1"} 1\n'
    )
    worker = MetricsSnapshot.parse(
        'sglang:e2e_request_latency_seconds_bucket{model_name="m",le="0.1"} 30.0\n'
        'sglang:e2e_request_latency_seconds_bucket{model_name="m",le="+Inf"} 40.0\n'
        'sglang:e2e_request_latency_seconds_count{model_name="m"} 40.0\n'
        'sglang:e2e_request_latency_seconds_sum{model_name="m"} 3.0\n'
    )
    empty = {"http://r0": RouterReading.read(MetricsSnapshot.parse(""), ["http://w:1"])}
    routers = {"http://r0": RouterReading.read(router, ["http://w:1"])}
    start = ReplicaReading.read(empty, "http://w:1", MetricsSnapshot.parse(""))
    end = ReplicaReading.read(routers, "http://w:1", worker)
    assert (end.successes, end.failures, end.healthy, end.circuit_open) == (40, 2, True, True)
    w = replica_window(start, end)
    assert (w.successes, w.failures, w.latency) == (40, 2, None)  # no histogram at the start: not measured
    assert w.problems == ("the router's circuit breaker for it is open",)
    gone = replica_window(end, ReplicaReading.read(routers, "http://w:1", "ConnectError"))
    assert gone.problems[0] == "its /metrics does not answer (ConnectError)"
    restarted = ReplicaReading.read(empty, "http://w:1", MetricsSnapshot.parse(
        'sglang:e2e_request_latency_seconds_bucket{le="+Inf"} 3.0\nsglang:e2e_request_latency_seconds_count 3.0\n'))  # fmt: skip
    assert replica_window(end, restarted).problems[0] == "it restarted during the window (its counters went back)"


def test_a_router_reading_groups_each_workers_series_and_ignores_workers_not_asked_about() -> None:
    """One pass per family (a router with 2,048 workers: 8.2 s a read per worker lookup, 0.01 s grouped)."""
    snap = MetricsSnapshot.parse(
        'smg_worker_cb_outcomes_total{worker="http://w:1",outcome="success",model="a"} 30\n'
        'smg_worker_cb_outcomes_total{worker="http://w:1",outcome="success",model="b"} 10\n'
        'smg_worker_cb_outcomes_total{worker="http://w:2",outcome="failure"} 4\n'
        'smg_worker_cb_outcomes_total{worker="http://other:9",outcome="failure"} 99\n'
        'smg_worker_health{worker="http://w:1"} 1\n'
        'smg_worker_health{worker="http://w:2"} 0\n'
        'smg_worker_health{worker="http://other:9"} 0\n'
        'smg_worker_cb_state{worker="http://w:1"} 2\n'
        'smg_worker_cb_state{worker="http://w:3"} 1\n'
    )
    reading = RouterReading.read(snap, ["http://w:1", "http://w:2", "http://w:3"])
    assert reading.outcomes == {"http://w:1": (40.0, 0.0), "http://w:2": (0.0, 4.0)}
    assert reading.unhealthy == {"http://w:2"}  # w:3 has no health series: not marked
    assert reading.circuit_open == {"http://w:3"}  # 2 is half-open
    assert set(snap.grouped("smg_worker_health", "worker")) == {"http://w:1", "http://w:2", "http://other:9"}


def _betabinom_pmf(i: int, n: int, a: int, b: int) -> float:
    """Exact in integers: C(n, i) · B(i + a, n − i + b) / B(a, b), B(x, y) = (x − 1)! (y − 1)! / (x + y − 1)!."""
    beta = lambda x, y: math.factorial(x - 1) * math.factorial(y - 1) / math.factorial(x + y - 1)  # noqa: E731
    return math.comb(n, i) * beta(i + a, n - i + b) / beta(a, b)


def test_beta_binomial_tails_are_exact_on_both_sides_of_the_mean() -> None:
    assert betabinom_sf(0, 10, 2, 3) == 1.0 and betabinom_sf(11, 10, 2, 3) == 0.0
    # U ~ Beta(1, 1) is uniform: every count of 0..n is as likely
    assert betabinom_sf(4, 9, 1, 1) == pytest.approx(6 / 10)
    for k in (3, 60, 61, 150):  # the mean is 400 · 3 / 20 = 60: summed from either side
        exact = sum(_betabinom_pmf(i, 400, 3, 17) for i in range(k, 401))
        assert betabinom_sf(k, 400, 3, 17) == pytest.approx(exact, rel=1e-9), k


def test_a_reference_quantile_counts_the_reference_s_own_noise() -> None:
    """The chance of 5 of 100 requests over the P99 of 20 reference requests, their 19th: each is over it with U ~
    Beta(2, 19) (mean 9.5 %), so 5 is unremarkable; the binomial at 1 % said p = 0.003. A reference of a million
    requests pins its P99: the binomial's answer."""
    assert p_slower_than_reference(5, 100, 19, 20) == pytest.approx(
        sum(_betabinom_pmf(i, 100, 2, 19) for i in range(5, 101)), rel=1e-9
    )
    assert p_slower_than_reference(5, 100, 19, 20) > 0.5
    binomial = 1 - sum(math.comb(100, i) * 0.01**i * 0.99 ** (100 - i) for i in range(5))
    assert p_slower_than_reference(5, 100, 990_000, 1_000_000) == pytest.approx(binomial, rel=0.01)


def test_a_small_reference_is_no_evidence_against_an_unchanged_release() -> None:
    """2,000 canary requests against 20 reference requests of the same latency (lognormal, σ = 0.6), 300 seeded
    trials: a binomial at 1 % treats the reference's "P99" (about its largest) as the distribution's, and 35 % of the
    trials found the canary's P99 risen, where each latency test runs at 0.025 %. What 20 requests can tell is
    coarse: a release 2.2 × slower at σ = 0.3 is found against them; 1.8 × at σ = 0.6 is found against 200."""
    rng = random.Random(7)

    def found(slower: float, reference: int, sigma: float) -> bool:
        baseline = histogram([0.1 * rng.lognormvariate(0, sigma) for _ in range(reference)])
        canary = histogram([slower * 0.1 * rng.lognormvariate(0, sigma) for _ in range(2000)])
        windows = {"c0": ReplicaWindow(2000.0, 0.0, canary)}
        p99, median = baseline.quantile(0.99), baseline.quantile(0.5)
        return p99_check("canary", ["c0"], windows, p99, LIMITS, FAMILY_ALPHA / 2, median, reference)[1] is not None

    false_alarms = sum(found(1.0, 20, 0.6) for _ in range(300))
    assert false_alarms <= 3, f"{false_alarms} of 300 trials of an unchanged release found slower"
    assert sum(found(2.2, 20, 0.3) for _ in range(20)) >= 19
    assert sum(found(1.8, 200, 0.6) for _ in range(20)) >= 19


def test_the_latency_gate_reads_the_baseline_s_timed_requests_and_needs_min_requests_of_them() -> None:
    """A peer whose worker exposes no latency histogram still counts in the router's successes: the baseline's
    quantiles are of the others' timed requests, and that is the count the latency test is given. Fewer than
    MIN_REQUESTS timed is no reference: the gate is inconclusive, and with the traffic ample the verdict is a pause
    that says the baseline's latency was not measured, never a pass of a release 2 × slower; an operator who knows
    passes it with --accept-inconclusive."""
    # the canary 2 × slower; one peer timed 3 requests, five served 240 each with no histogram (QPS alike)
    windows = {**{r: replica(ok=200, ms=200.0) for r in CANARY}, PEERS[0]: replica(ok=3)}
    windows |= {r: ReplicaWindow(240.0, 0.0, None) for r in PEERS[1:]}
    g = verdict_of(windows)
    assert g.baseline is not None and g.verdict is not None
    assert (g.baseline.timed, g.baseline.successes) == (3, 1203)
    assert g.p99_rise is None and g.verdict.decision == "pause", g.verdict
    why = f"3 of the baseline's requests timed; the test needs {MIN_REQUESTS} (a quantile of fewer is no reference)"
    assert g.inconclusive["p99_rise"] == why
    assert g.verdict.evidence[0].startswith(f"inconclusive, the baseline's latency was not measured: {why}. ")
    accepted = verdict_of(windows, accept_inconclusive=True)
    assert accepted.verdict is not None and accepted.verdict.decision == "pass"
    assert f"latency not judged, passed by --accept-inconclusive: {why}" in accepted.verdict.evidence
    # a baseline that served 3 requests in all is thin, not unmeasured: named inconclusive, no pause about /metrics
    thin = verdict_of({**{r: replica(ok=200, ms=200.0) for r in CANARY}, PEERS[0]: replica(ok=3)})
    assert thin.verdict is not None and thin.p99_rise is None and "p99_rise" in thin.inconclusive
    assert not any("latency was not measured" in e for e in thin.verdict.evidence), thin.verdict


def test_the_canary_error_budget_ends_a_soak_only_once_the_interval_cannot_pass() -> None:
    """300 s soak, 1,000 attempts expected: 0.1 % may fail (1); the 2nd ends the soak — unless the peers fail too."""
    one = healthy(c0=replica(ok=99, failed=1))
    assert not canary_budget_spent(list(CANARY), list(PEERS), one, 1000.0, LIMITS)
    two = healthy(c0=replica(ok=98, failed=2))
    assert canary_budget_spent(list(CANARY), list(PEERS), two, 1000.0, LIMITS)
    assert not canary_budget_spent(list(CANARY), list(PEERS), {**two, "p0": replica(ok=48, failed=2)}, 1000.0, LIMITS)


class ScriptedSoak(Runner):
    """The updater's soak over scripted reads (the router and every replica), from the moment the soak starts: each
    replica served ``BEFORE``, then ``thin`` attempts a second until ``thin_until_s``, then ``PER_REPLICA``; the canary's first
    replica failed one attempt from ``fail_at_s`` on; every attempt took 100 ms."""

    def __init__(
        self, state: RolloutState, *, fail_at_s: float, thin: float, thin_until_s: float, glitch_at_s: float | None
    ) -> None:
        super().__init__(state, None, None, None)  # type: ignore[arg-type]  # the soak reads through _read alone
        self.fail_at_s, self.thin, self.thin_until_s = fail_at_s, thin, thin_until_s
        self.glitch_at_s = glitch_at_s  # one router-only read from then on sees the router's counters at 0
        self.t0: float | None = None
        self.reads: list[float] = []  # the time into the soak of each full read

    def _groups(self, batch: int) -> tuple[list[str], list[str], Basis, dict[str, str]]:
        canary = list(self.state.plan.batch(batch).replicas)
        peers = [r for r in self.state.plan.replicas if r not in canary]
        return canary, peers, "not-updated", {r: f"http://{r}:30000" for r in [*canary, *peers]}

    async def _reconcile(self) -> None:
        return None

    async def _read(self, urls: Mapping[str, str], *, workers: bool) -> Reading:
        now = time.monotonic()
        self.t0 = now if self.t0 is None else self.t0
        t = now - self.t0
        served = BEFORE + self.thin * min(t, self.thin_until_s) + PER_REPLICA * max(0.0, t - self.thin_until_s)
        first = self.state.plan.batch(0).replicas[0]
        replicas, outcomes = {}, {}
        for r, url in urls.items():
            failed = float(r == first and t >= self.fail_at_s)
            outcomes[url] = (served, failed)
            latency = histogram([0.1] * int(served)) if workers else None
            replicas[r] = ReplicaReading(served, failed, True, False, latency, "scraped" if workers else "not scraped")
        if workers:
            self.reads.append(t)
        total = int(sum(a + b for a, b in outcomes.values()))
        if not workers and self.glitch_at_s is not None and t >= self.glitch_at_s:
            self.glitch_at_s, total = None, 0
        return Reading({"http://r0:30000": RouterReading(counters(total), outcomes)}, replicas, now, 0.0)


PER_REPLICA = 12.5
BEFORE = 100.0  # attempts each replica served before the soak (the counters are cumulative)


def soak(
    *, fail_at_s: float, thin: float, thin_until_s: float, interval_s: float = 4.0, glitch_at_s: float | None = None
) -> tuple[Event, ScriptedSoak]:
    """Batch 0's soak of the sandbox plan (``interval_s``) after a baseline of ``PER_REPLICA`` a second, scripted."""
    plan = sandbox_plan()
    plan = replace(plan, timings=replace(plan.timings, interval_s=interval_s))
    ids = tuple(plan.replicas)
    n = PER_REPLICA * len(ids) * 4.0
    baseline = WindowStats(4.0, n, 0, n, 0, 0, 0.1, GroupStats(ids, 4.0, n, 0, 0.1))
    state = run_through(ev(initial(plan), "baseline", baseline=baseline), Step(Phase.SOAK, 0))
    runner = ScriptedSoak(state, fail_at_s=fail_at_s, thin=thin, thin_until_s=thin_until_s, glitch_at_s=glitch_at_s)
    event = asyncio.run(runner._soak(state.step))  # type: ignore[arg-type]
    assert event is not None and event.gates is not None and event.gates.verdict is not None
    return event, runner


def test_a_spent_canary_budget_ends_the_soak_on_a_rollback_judged_from_the_window_so_far() -> None:
    """Steady traffic, the canary's one failure at once: the interval's budget (0.1 % of 100 attempts) is spent and the
    window so far already reads as a rollback, so the soak ends there rather than at its 4 s."""
    event, runner = soak(fail_at_s=0.01, thin=PER_REPLICA, thin_until_s=0.0)
    assert event.kind == "failed" and event.gates.verdict.decision == "rollback", event.detail  # type: ignore[union-attr]
    assert len(runner.reads) == 2 and runner.reads[-1] < 4.0, runner.reads


def test_a_spent_canary_budget_in_a_window_too_thin_to_judge_soaks_on_and_rolls_back() -> None:
    """Stop 31's CI: v2-broken's canary failed 1 of its first 10 attempts while the soak's first second was thin
    (8.24 requests/s per replica against 12.24 before); the budget ended the soak at 0.9 s and the judge, reading
    a traffic dip over 0.9 s, paused the rollout instead of rolling it back (the old loop fails here with exactly
    that verdict). The window so far is no verdict on the interval: the soak goes on, is judged again once its window
    has doubled, and rolls the release back once the window holds the traffic to judge it (here at the latest at its
    end, the dip averaged out; earlier where a loaded machine ran the second judgment late)."""
    event, runner = soak(fail_at_s=0.9, thin=2.0, thin_until_s=2.5)
    assert event.kind == "failed" and event.gates.verdict.decision == "rollback", event.detail  # type: ignore[union-attr]
    reads = runner.reads
    assert len(reads) >= 3 and reads[1] < 4.0, reads  # judged early once, and soaked on
    assert all(later >= 2 * earlier for earlier, later in itertools.pairwise(reads[1:-1])), reads  # at doubling windows
    if reads[-1] >= 4.0:  # judged at the end: over the whole window
        assert event.gates.canary is not None and event.gates.canary.seconds >= 4.0  # type: ignore[union-attr]


def test_a_router_change_only_a_router_only_read_saw_leaves_the_soak_whole() -> None:
    """A router-only read inside the soak that sees a router restart ends the wait for the full read, which judges
    the window; when the full read sees no change (a moment's answer), that window was short of the interval and
    was judged anyway: a healthy canary passed on 1 s of soak. Now the soak goes on and judges the whole window."""
    event, runner = soak(fail_at_s=math.inf, thin=PER_REPLICA, thin_until_s=0.0, glitch_at_s=1.0)
    assert event.kind == "done" and event.gates.verdict.decision == "pass", event.detail  # type: ignore[union-attr]
    assert event.gates.canary is not None and event.gates.canary.seconds >= 4.0, runner.reads  # type: ignore[union-attr]
    assert runner.glitch_at_s is None  # the glitch was read


def test_gates_and_baselines_survive_the_journal_and_old_lines_still_load() -> None:
    g = verdict_of(healthy(p2=replica(problems=("the router marks it unhealthy",))))
    assert Gates.from_json(json.loads(json.dumps(g.to_json()))) == g
    assert WindowStats.from_json(json.loads(json.dumps(PRE.to_json()))) == PRE
    old = {"seconds": 2.0, "requests": 200, "client_errors": 0, "upstream_responses": 200, "upstream_errors": 0,
           "retries": 0, "p99_s": 0.1}  # fmt: skip
    assert WindowStats.from_json(old).replicas is None
    old_gates = {"qps_drop": 0.1, "p99_rise": 0.0, "error_rate": 0.0, "client_error_rate": 0.0,
                 "upstream_error_rate": 0.0, "retries": 0.0, "breaches": []}  # fmt: skip
    assert Gates.from_json(old_gates).verdict is None


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
    gates = verdict_of({r: replica(ok=5 if r in CANARY else 50) for r in CANARY + PEERS})
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
    gates = verdict_of(healthy(c0=replica(ms=150)))
    event = Event(
        "failed", 1.5, Step(Phase.SOAK, 2, rollback=True), "breach", gates, WindowStats(2.0, 1, 0, 1, 0, 0, None), 7.0
    )
    assert Event.from_json(json.loads(json.dumps(event.to_json()))) == event
    assert Step.from_json(Step(Phase.DRAIN, 0, rollback=True).to_json()).rollback is True


def test_contract_shape() -> None:
    state = run_through(initial(sandbox_plan()), Step(Phase.REMOVE, 1))
    doc = contract(state, {"sandbox-0-s0": "v2"})
    assert set(doc) == {
        "stack",
        "from_version",
        "to_version",
        "outcome",
        "batches",
        "client_errors",
        "final_versions",
        "reason",
    }
    b0 = doc["batches"][0]
    assert set(b0) == {"index", "replicas", "started_at", "finished_at", "gates", "passed", "canary", "baseline",
                       "verdict", "inconclusive", "kv_pool"}  # fmt: skip
    assert set(b0["gates"]) == {"qps_drop", "p99_rise", "error_rate"} and b0["passed"] is True
    assert b0["started_at"].endswith("+00:00") and b0["finished_at"].endswith("+00:00")
    assert b0["started_at"] <= b0["finished_at"]
    assert doc["batches"][1]["finished_at"] is None
    gates = verdict_of(healthy())
    soaked = advance(
        run_through(initial(sandbox_plan()), Step(Phase.SOAK, 0)), Event("done", 9.0, Step(Phase.SOAK, 0), gates=gates)
    )
    b0 = contract(soaked, {})["batches"][0]
    assert b0["gates"] == gates.contract()
    assert b0["inconclusive"] == {"qps_drop": None, "p99_rise": None, "error_rate": None}  # every gate judged
    assert gates.canary is not None and gates.baseline is not None and gates.verdict is not None
    assert (b0["canary"], b0["baseline"], b0["verdict"]) == (
        gates.canary.to_json(),
        gates.baseline.to_json(),
        gates.verdict.to_json(),
    )
    assert b0["canary"]["qps_per_replica"] == pytest.approx(12.5) and b0["verdict"]["decision"] == "pass"


def test_evidence_outside_the_batch_pauses_at_the_soak_and_a_resume_soaks_again() -> None:
    gates = verdict_of(healthy(p2=replica(problems=("its /metrics does not answer (ConnectError)",))))
    state = run_through(initial(sandbox_plan()), Step(Phase.SOAK, 1))
    state = advance(state, Event("outside", 7.0, state.step, "p2 down", gates))
    assert state.outcome is Outcome.PAUSED and state.resume_step == Step(Phase.SOAK, 1)
    assert state.reason == "batch 1 (soak) paused: p2 down" and state.rollback_queue == ()
    assert state.batches[1].passed is None and state.batches[1].gates == gates
    assert state.expected_versions()[state.plan.batch(1).replicas[0]] == "v2", "nothing was rolled back"
    b1 = contract(state, {})["batches"][1]
    assert b1["verdict"]["decision"] == "pause" and b1["verdict"]["replicas"] == ["p2"]
    resumed = advance(state, Event("resume", 8.0))
    assert resumed.step == Step(Phase.SOAK, 1) and resumed.outcome is None
    with pytest.raises(TransitionError, match="an 'outside' verdict needs a forward soak or the baseline step"):
        advance(run_through(initial(sandbox_plan()), Step(Phase.WARMUP, 0)),
                Event("outside", 1.0, Step(Phase.WARMUP, 0), "x"))  # fmt: skip


def test_a_batch_that_failed_before_its_soak_reports_a_rollback_verdict_naming_the_step() -> None:
    state = run_through(initial(sandbox_plan()), Step(Phase.HEALTH, 0))
    state = ev(state, "failed", detail="health timeout: sandbox-0-s0 (503) not healthy after 5 s")
    b0 = contract(state, {})["batches"][0]
    assert b0["verdict"] == {"decision": "rollback", "basis": None, "replicas": [],
                             "evidence": ["batch 0 (health) failed: health timeout: sandbox-0-s0 (503) not healthy after 5 s"]}  # fmt: skip
    assert (b0["canary"], b0["baseline"]) == (None, None)


class StuckPlatform:
    """STAND-IN for a platform whose update meets pods only an operator can free for its first ``stuck`` tries, then
    completes: what the Kubernetes backend raises there is tests/test_rollout_backends.py's (PodsStuck, on the API
    stand-in's failed or cordoned node). Records the time left it was given on each try."""

    name = "stuck platform"

    def __init__(self, stuck: int, then: str = "") -> None:
        self.stuck = stuck
        self.then = then  # after the stuck tries: this failure of the update (none: it completes)
        self.given: list[float] = []

    def worker_url(self, replica_id: str) -> str:
        return f"http://127.0.0.1:9/{replica_id}"

    async def update(self, replica_ids: object, version: str, timeout_s: float) -> None:
        self.given.append(timeout_s)
        if len(self.given) <= self.stuck:
            raise PodsStuck(f"rollout of sglang-g1 is blocked by 1 pod(s): sglang-g1-0 (try {len(self.given)})")
        if self.then:
            raise BackendError(self.then)


def run_update(platform: StuckPlatform, health_timeout_s: float, *, pause: bool, tmp: Path) -> tuple[Event, list[str]]:
    """The runner's update step of batch 1 on ``platform``: its event and what it told the operator."""
    plan = sandbox_plan()
    plan = replace(plan, timings=replace(plan.timings, health_timeout_s=health_timeout_s))
    said: list[str] = []

    async def go() -> Event:
        runner = Runner(initial(plan), Journal.create(tmp / "journal.jsonl", plan), platform, None,  # type: ignore[arg-type]
                        progress=lambda p: said.append(p.message), poll_s=0.01)  # fmt: skip
        if pause:
            runner.request_pause()
        try:
            return await runner._update(Step(Phase.UPDATE, 1), "v2")
        finally:
            await runner._http.aclose()
            await runner._first_asks.aclose()

    return asyncio.run(go()), said


def test_an_update_waits_on_stuck_pods_and_goes_on_once_an_operator_freed_them(tmp_path: Path) -> None:
    """Issue 40, item 1: pods stuck on an operator are named at once and waited on, the update tried again (each try
    holds the new pods out of the routers) within the health timeout; freed in that time, the step is done."""
    platform = StuckPlatform(stuck=2)
    event, said = run_update(platform, 60.0, pause=False, tmp=tmp_path)
    assert (event.kind, event.detail) == ("done", "set to v2 (after pods stuck on an operator)")
    assert len(platform.given) == 3 and 60.0 >= platform.given[0] > platform.given[1] > platform.given[2]  # time left
    waiting = [m for m in said if m.startswith("waiting for an operator until the 60 s health timeout: ")]
    assert len(waiting) == 2 and "sglang-g1-0 (try 1)" in waiting[0], said


def test_an_update_that_fails_after_its_stuck_pods_were_freed_is_failed_and_rolls_back(tmp_path: Path) -> None:
    """Found by review: once pods had been stuck, any later failure read as ``blocked`` (a pause), so a release that
    never becomes ready after the operator's fix was never rolled back. The step's verdict is its last failure's."""
    platform = StuckPlatform(
        stuck=1, then="rollout of sglang-g1 not complete after 59 s: 0 of 26 updated replicas ready"
    )
    event, _said = run_update(platform, 60.0, pause=False, tmp=tmp_path)
    assert event.kind == "failed" and event.detail.startswith("rollout of sglang-g1 not complete after 59 s"), event
    assert "(before that: rollout of sglang-g1 is blocked by 1 pod(s)" in event.detail


@pytest.mark.parametrize("pause", [False, True], ids=["health-timeout", "pause-requested"])
def test_pods_still_stuck_at_the_health_timeout_or_a_pause_block_the_step_not_fail_it(
    pause: bool, tmp_path: Path
) -> None:
    """Still stuck when the health timeout ran out (or the operator asked to pause): the step is ``blocked`` (the
    rollout pauses there, the batch out), never ``failed`` (a rollback would wait on the same pods)."""
    platform = StuckPlatform(stuck=10**9)
    event, _said = run_update(platform, 60.0 if pause else 0.2, pause=pause, tmp=tmp_path)
    assert event.kind == "blocked" and event.detail.startswith("rollout of sglang-g1 is blocked by 1 pod(s)")
    assert len(platform.given) == 1 if pause else len(platform.given) >= 1


OUTCOMES = st.lists(
    st.sampled_from(["done", "done", "done", "done", "failed", "pause", "router_lost", "blocked", "rollback"]),
    max_size=120,
)


def test_an_update_blocked_on_stuck_pods_pauses_at_that_step_and_resume_or_rollback_carry_on_from_it() -> None:
    """Issue 40: an update the platform cannot finish without an operator (PodsStuck: a pod Terminating on a dead
    node, a replacement unschedulable) pauses at the step with the pods' story, not a rollback (whose restore would
    wait on the same pods). `--resume` runs the update again; `exaserve rollback` restores the touched batch."""
    plan = sandbox_plan()
    state = initial(plan)
    while state.step != Step(Phase.UPDATE, 1):
        assert state.step is not None
        kind = "baseline" if state.step.phase is Phase.BASELINE else "done"
        baseline = WindowStats(2.0, 200, 0, 200, 0, 0, 0.1) if kind == "baseline" else None
        state = advance(state, Event(kind, time.time(), step=state.step, baseline=baseline))  # type: ignore[arg-type]
    why = "rollout of sglang-g1 is blocked by 1 pod(s) that cannot come back on their own: sglang-g1-0 (…)"
    paused = advance(state, Event("blocked", time.time(), step=state.step, detail=why))
    assert paused.outcome is Outcome.PAUSED and paused.step is None
    assert paused.resume_step == Step(Phase.UPDATE, 1)
    assert paused.reason == f"batch 1 (update) blocked: {why}"
    resumed = advance(paused, Event("resume", time.time()))
    assert resumed.step == Step(Phase.UPDATE, 1)
    assert (
        set(plan.batch(1).replicas) <= resumed.out_of_router()
    )  # its pods are being replaced: kept out, not readmitted
    rolling_back = advance(paused, Event("rollback", time.time()))
    assert rolling_back.step == Step(Phase.REMOVE, 1, rollback=True) and rolling_back.outcome is None
    # The restore's own update blocked too; a second `exaserve rollback` goes on with that restore. Found by review:
    # it restarted the rollback, whose queue (from the batches' versions, set back by the restore's drain) skipped
    # batch 1, left out of the routers, and ended rolled_back.
    restoring = rolling_back
    while restoring.step != Step(Phase.UPDATE, 1, rollback=True):
        restoring = advance(restoring, Event("done", time.time(), step=restoring.step))
    blocked = advance(restoring, Event("blocked", time.time(), step=restoring.step, detail=why))
    assert blocked.outcome is Outcome.PAUSED and blocked.resume_step == Step(Phase.UPDATE, 1, rollback=True)
    again = advance(blocked, Event("rollback", time.time()))
    assert again.step == Step(Phase.UPDATE, 1, rollback=True) and again.outcome is None
    assert set(plan.batch(1).replicas) <= again.out_of_router()


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
            apply(Event("rollback" if kind == "rollback" else "resume", time.time()))
            continue
        if kind in (
            "pause",
            "rollback",
        ):  # the operator: a pause request, or `exaserve rollback` (a no-op once rolling back)
            apply(Event(kind, time.time()))  # type: ignore[arg-type]
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
    w = window_stats(one(counters(100)), one(counters(100)), seconds=1.0)
    assert w is not None and w.p99_s is None and not math.isnan(w.qps)


def test_history_lists_every_rollout_of_the_stack_from_its_journals(tmp_path: Path) -> None:
    """Issue 28: there was no rollout history. `exaserve history` reads the journals: the earlier ones moved to
    history/ when a new rollout started, then the latest, oldest first, each with its outcome and reason."""
    journal_path = StackState.for_stack("sandbox", tmp_path).journal_path
    journal_path.parent.mkdir(parents=True)
    for outcome in ("completed", "rolled back", "paused"):
        plan = sandbox_plan()
        journal = Journal.create(journal_path, plan)
        state = initial(plan)
        while state.step is not None and state.active:
            kind = "baseline" if state.step.phase is Phase.BASELINE else "done"
            if outcome != "completed" and state.step == Step(Phase.HEALTH, 1):
                kind = "failed" if outcome == "rolled back" else "router_lost"
            event = Event(kind, time.time(), step=state.step, detail="x" if kind != "done" else "",  # type: ignore[arg-type]
                          baseline=WindowStats(2.0, 200, 0, 200, 0, 0, 0.1) if kind == "baseline" else None)  # fmt: skip
            journal.record(event)
            state = advance(state, event)
            if kind == "router_lost":
                break
        time.sleep(1.1)  # history files are named by the second they were moved
    r = exaserve_in_process("history", "--stack", "sandbox", "--state-dir", str(tmp_path), "--json")
    assert r.returncode == 0, r.stderr
    rows = json_object(r)["rollouts"]
    assert [row["outcome"] for row in rows] == ["completed", "rolled_back", "paused"]
    assert [row["batches_passed"] for row in rows] == [5, 1, 1] and {row["batches"] for row in rows} == {5}
    assert rows[2]["journal"] == str(journal_path) and "router lost during batch 1 (health)" in rows[2]["reason"]
    assert all((row["from_version"], row["to_version"], row["kind"]) == ("v1", "v2", "rollout") for row in rows)
    table = exaserve_in_process("history", "--stack", "sandbox", "--state-dir", str(tmp_path))
    assert "v1 → v2" in table.stdout and "rolled_back" in table.stdout and "1/5" in table.stdout, table.stdout
    empty = exaserve_in_process("history", "--stack", "dev", "--state-dir", str(tmp_path))
    assert empty.returncode == 0 and "no rollout on stack dev yet" in empty.stdout
