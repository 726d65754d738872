"""Real-time judgments on the real smg gateway and the simulated SGLang worker: how soon the router notices a dead
worker against the budget its flags give, how soon smg drops a removed worker and a registration that never gets
ready, how soon a worker stops on SIGTERM, how close the worker's latency keeps to its configuration, whether the load
generator keeps its pace and the router's timing the clients', and how soon its health answers come against SGLang's
poll and timeout. The CI tests (tests/test_render_router_live.py, tests/test_sandbox_processes.py,
tests/test_sandbox_worker_fidelity.py) run the same scenarios (tests/support/rendered_router.py, router_sandbox.py,
sim_worker.py) and judge what happened and in what order."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import rendered_router, router_sandbox, sim_worker
from tests.support.rehearsal import at_least, verdict, within
from tests.support.sandbox import Sandbox, running_sandbox
from tests.support.smg import DRAIN_SETTLE_S

Record = Callable[..., dict[str, Any]]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """tests/test_sandbox_processes.py's fleet: two simulated workers behind the real router (TWO_WORKERS)."""
    changes = router_sandbox.TWO_WORKERS
    with running_sandbox(tmp_path_factory.mktemp("sandbox"), replicas=2, changes=changes) as box:
        yield box


def test_the_rendered_heartbeat_flags_detect_a_dead_worker_within_their_budget(
    tmp_path: Path, rehearsal: Record
) -> None:
    """A 1 s heartbeat × 2 failures: out of the healthy list within failures × interval + timeout + 2 s of the stop,
    back within as long of the restart (the router's default 60 s interval would miss both)."""
    with rendered_router.running_workers(tmp_path) as workers:
        spec = rendered_router.heartbeat_spec(workers)
        budget = rendered_router.detection_budget_s(spec)
        seen = rendered_router.stop_and_restart_a_worker(spec, workers)
    figures = [within("detection", seen.detected_s, budget), within("readmission", seen.readmitted_s, budget)]
    rehearsal("router", verdict(figures), figures, survivor_healthy=seen.survivor_healthy)
    assert seen.detected_s <= budget and seen.readmitted_s <= budget, (seen, budget)


def test_a_removed_worker_is_gone_once_its_drain_settled(sandbox: Sandbox, rehearsal: Record) -> None:
    """smg keeps a removed worker draining for drain_settle_secs (5 s), then drops it: within 3 s more."""
    seen = router_sandbox.removal_and_readdition(sandbox)
    target = DRAIN_SETTLE_S + 3
    figures = [within("removal", seen["removal_s"], target)]
    rehearsal("router", verdict(figures), figures)
    assert DRAIN_SETTLE_S <= seen["removal_s"] < target, seen["removal_s"]


def test_a_killed_worker_is_marked_unhealthy_within_the_health_budget(sandbox: Sandbox, rehearsal: Record) -> None:
    """serving.heartbeat_interval_s × serving.failure_threshold (1 s × 5) + one probe's timeout + 1.5 s."""
    budget = router_sandbox.detection_budget_s(sandbox.spec)
    killed = router_sandbox.kill_a_loaded_worker(sandbox)
    figures = [within("detection", killed.detected_s, budget)]
    rehearsal("router", verdict(figures), figures, client_errors=killed.report.errors)
    assert 0.5 <= killed.detected_s <= budget, killed.detected_s


def test_the_workers_latency_keeps_to_its_configuration(sandbox: Sandbox, rehearsal: Record) -> None:
    """The simulated worker's median latency, after its own traffic, within 4 × the configured 5 ms (event-loop
    delay included)."""
    report = router_sandbox.run(lambda: router_sandbox.load(sandbox.router_url, 50, 10))
    config = sandbox.configs[0]
    median_s, configured_s = router_sandbox.worker_latency_median_s(config.url), config.latency_ms / 1000
    figures = [within("median latency", median_s, 4 * configured_s, configured_s=configured_s)]
    rehearsal("worker", verdict(figures), figures, client_errors=report.errors)
    assert 0.8 * configured_s <= median_s <= 4 * configured_s, (median_s, configured_s)


def test_the_load_generator_keeps_its_pace_and_the_routers_median_the_clients(
    sandbox: Sandbox, rehearsal: Record
) -> None:
    """600 requests at 300/s: the sends keep the rate within 10 % (a starved sender falls behind, counting the late
    ones: the CI test holds that count); the router's median of the same requests within its histogram bucket holding
    the clients' median plus the clients' mean extra time (their HTTP stack) of the clients' own."""
    counted = router_sandbox.counted_load(sandbox)
    pace, rate = counted.pace(), router_sandbox.COUNTED_RATE
    gap, allowed = counted.medians_apart()
    figures = [
        at_least("offered pace", pace, 0.9 * rate, "req/s", late=counted.report.late),
        within("offered pace, at most", pace, 1.1 * rate, "req/s"),
        within("router median from the clients'", gap, allowed, client_p50_s=counted.report.p50_s),
    ]
    rehearsal("router", verdict(figures), figures, client_errors=counted.report.errors)
    assert counted.report.ok == router_sandbox.COUNTED_REQUESTS, counted.report.summary()
    assert all(f["ok"] for f in figures), figures


def test_sigterm_stops_a_worker_once_its_request_finished(tmp_path: Path, rehearsal: Record) -> None:
    """The 1.5 s request in flight finishes, then the worker exits: within 5 s, no SIGKILL."""
    status, stop_s, stopped = router_sandbox.sigterm_drain(tmp_path)
    figures = [within("stop", stop_s, 5.0)]
    rehearsal("worker", verdict(figures), figures, status=status)
    assert stopped and status == 200
    assert 0.9 <= stop_s < 5, stop_s


def test_a_never_ready_registration_is_dropped_at_its_startup_timeout(tmp_path: Path, rehearsal: Record) -> None:
    """--worker-startup-timeout-secs 2, asked every --worker-startup-check-interval (1 s), plus a loaded machine's
    3 s."""
    seen = router_sandbox.never_ready_registration(tmp_path)
    target = router_sandbox.NEVER_READY_STARTUP_TIMEOUT_S + 1 + 3
    figures = [within("gave up", seen.gave_up_s, target)]
    rehearsal("router", verdict(figures), figures, gave_up=seen.gave_up)
    assert "dropped its registration" in seen.gave_up
    assert seen.gave_up_s < target, seen.gave_up_s


def test_a_wedged_schedulers_health_answers_503_at_its_timeout(tmp_path: Path, rehearsal: Record) -> None:
    """SGLang's /health with the scheduler wedged: 503 once the timeout (0.6 s here) passed, within a poll (0.2 s)
    and 0.5 s more."""
    seen = sim_worker.healthy_then_wedged(tmp_path, ["/health", "/health_generate"])
    status, took = seen["wedged"]
    target = sim_worker.TIMEOUT_S + sim_worker.POLL_S + 0.5
    figures = [within("wedged health", took, target)]
    rehearsal("worker", verdict(figures), figures, status=status)
    assert status == 503 and sim_worker.TIMEOUT_S <= took < target, seen


def test_the_cheap_health_answers_within_a_poll(tmp_path: Path, rehearsal: Record) -> None:
    """``/health`` without a generation (as rendered) needs no scheduler: it answers within one poll period (0.2 s),
    on a healthy worker and during a flapping scheduler's stall."""
    (tmp_path / "healthy").mkdir()
    (tmp_path / "flapping").mkdir()
    healthy = sim_worker.cheap_and_scheduler_health(tmp_path / "healthy")
    flapping = sim_worker.flapping_scheduler(tmp_path / "flapping")
    figures = [
        within("cheap health", healthy["cheap"][1], sim_worker.POLL_S),
        within("cheap health, scheduler stalled", flapping["cheap"][1], sim_worker.POLL_S),
    ]
    rehearsal("worker", verdict(figures), figures)
    assert healthy["cheap"][0] == flapping["cheap"][0] == 200
    assert all(f["ok"] for f in figures), figures
