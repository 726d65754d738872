"""Real-time judgments on the runtime layer: a migration's drain gives up on a wedged replica within a health check,
a leader stands down at its term's deadline when etcd stalls, a deposed leader stops claiming within a renewal
period, and the routers stop routing to a killed replica within their health checks. The CI tests
(tests/test_runtime_agent.py, tests/test_runtime_core.py, tests/test_runtime_sandbox.py) run the same scenarios
(tests/support/drain_waits.py, election.py, runtime_sandbox.py) and judge what happened and in what order."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import runtime_sandbox as rt
from tests.support.drain_waits import drain_waits
from tests.support.election import leader_through_etcd_stalls
from tests.support.etcd import Etcd, running_etcd
from tests.support.rehearsal import at_least, verdict, within
from tests.support.sandbox import Sandbox

pytestmark = pytest.mark.sandbox

Record = Callable[..., dict[str, Any]]


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Etcd]:
    with running_etcd(tmp_path_factory.mktemp("etcd")) as server:
        yield server


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    with rt.runtime_sandbox(tmp_path_factory.mktemp("runtime")) as sb:
        yield sb


def test_a_drain_waits_for_a_request_and_gives_up_on_a_wedged_replica_within_a_health_check(
    tmp_path: Path, rehearsal: Record
) -> None:
    """A 0.6 s request on a healthy replica is waited for (its end: within 1.5 s); a wedged replica's wait gives up
    once its /health fails (0.3 s timeout), within 1 s."""
    waits = drain_waits(tmp_path)
    figures = [
        within("waited for the request", waits.waited_s, 1.5),
        within("gave up on the wedged replica", waits.gave_up_s, 1.0),
    ]
    rehearsal("runtime", verdict(figures), figures, gave_up=waits.gave_up)
    assert waits.finished == 200 and "/health_generate answers 503" in waits.gave_up, waits
    assert 0.3 < waits.waited_s < 1.5 and 0.3 <= waits.gave_up_s < 1.0, waits


def test_a_leader_stands_down_at_its_deadline_when_etcd_stalls(etcd: Etcd, rehearsal: Record) -> None:
    """A stall longer than the 4 s lease: the leader stands down at its term's deadline (within 0.5 s), not a client
    timeout (1 s) later."""
    stalls = leader_through_etcd_stalls(etcd)
    figures = [
        within("stood down after the deadline", stalls.late_s, 0.5),
        at_least("stood down after the deadline, at least", stalls.late_s, -0.05),
    ]
    rehearsal("runtime", verdict(figures), figures, held=all(stalls.held))
    assert -0.05 <= stalls.late_s <= 0.5, f"stood down {stalls.late_s:+.2f} s from its term's deadline"


def test_a_deposed_leader_stops_claiming_within_a_renewal_period(sandbox: Sandbox, rehearsal: Record) -> None:
    """The leader key deleted: the old leader's next renewal (lease / 3) fails its fencing check; the claims overlap
    for at most that period, plus the time its etcd calls take (2 heartbeats)."""
    rt.healthy_fleet(sandbox)
    deposed = rt.depose_the_leader(sandbox)
    target = sandbox.spec.runtime.lease_ttl_s / 3 + 2 * rt.INTERVAL_S
    figures = [within("stopped claiming", deposed.stepped_down_s, target)]
    rehearsal("runtime", verdict(figures), figures, old_term=deposed.first["term"], new_term=deposed.new["term"])
    assert deposed.new["term"] > deposed.first["term"]
    assert deposed.stepped_down_s < target, deposed.stepped_down_s


def test_the_routers_stop_routing_to_a_killed_replica_within_their_checks(sandbox: Sandbox, rehearsal: Record) -> None:
    """Every router's view of a SIGKILLed replica turns unhealthy or absent within 8 heartbeats (their checks: 2
    failures 1 s apart), while the controller's score still keeps it in rotation (at or above the stop-routing line,
    60: it falls below at the 9th failed probe), so `status` shows the two views disagree (the CI test,
    tests/test_runtime_sandbox.py, holds what it shows, not which came first)."""
    rt.healthy_fleet(sandbox)
    views = rt.kill_and_read_the_router_views(sandbox, "sandbox-0-s2")
    target = 8 * rt.INTERVAL_S
    line = sandbox.spec.health.stop_routing_below
    figures = [
        within("every router out", views.seen_s, target),
        at_least("the controller's score then", views.replica["score"], line, "points"),
    ]
    rehearsal("runtime", verdict(figures), figures, controller_in_rotation=views.replica["in_rotation"])
    assert views.seen_s < target, views
    assert views.replica["score"] >= line and views.replica["in_rotation"] is True, views.replica
