"""Real-time judgments on the SSH test hosts (tests/support/hosts): the fan-out's timeouts honoured and its
concurrency paying off (the CI tests, tests/test_remote_fanout.py, judge what happened and in what order), a
blackholed host's connect timing out when it should (tests/test_testhosts.py), and a preflight over ten faulty hosts
ending in bounded time (tests/test_preflight_hosts.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.support import fanout, preflight
from tests.support.hosts.netns import HostFleet, HostPool
from tests.support.hosts.ssh import failed_connect
from tests.support.rehearsal import at_least, verdict, within

Record = Callable[..., dict[str, Any]]


@pytest.fixture(scope="module")
def fleet(ssh_hosts: HostPool) -> HostFleet:
    return fanout.fleet(ssh_hosts)


def test_an_unreachable_host_costs_the_call_its_connect_timeout_not_more(fleet: HostFleet, rehearsal: Record) -> None:
    """node01 answers, node03's replies are dropped: the call ends once node03's 2 s connect timeout ran out, well
    within the 5 s per-host timeout."""
    call = fanout.unreachable_call(fleet)
    figures = [within("call", call.seconds, fanout.UNREACHABLE_TIMEOUT_S)]
    rehearsal("fanout", verdict(figures), figures, statuses=[r.status for r in call.results])
    assert [r.status for r in call.results] == ["ok", "unreachable"]
    assert call.seconds < fanout.UNREACHABLE_TIMEOUT_S, call


def test_a_slow_host_is_cut_at_its_timeout(fleet: HostFleet, rehearsal: Record) -> None:
    """A 6 s command with a 1.5 s per-host timeout: the call ends within 4 s (the timeout, the session's close)."""
    call = fanout.slow_call(fleet)
    figures = [within("call", call.seconds, 4.0)]
    rehearsal("fanout", verdict(figures), figures, statuses=[r.status for r in call.results])
    assert [r.status for r in call.results] == ["timeout"]
    assert call.seconds < 4.0, call


def test_two_hosts_at_once_take_less_than_their_sum(fleet: HostFleet, rehearsal: Record) -> None:
    """One at a time the call lasts at least its hosts' seconds together; two at a time less than that."""
    hosts = ("node01", "node02")
    serial = fanout.waves(fleet, hosts, 1).call
    parallel = fanout.waves(fleet, hosts, 2).call
    figures = [
        within("parallel call", parallel.seconds, sum(r.seconds for r in parallel.results)),
        at_least("call one at a time", serial.seconds, sum(r.seconds for r in serial.results), note="a premise"),
    ]
    rehearsal("fanout", verdict(figures), figures, serial_s=serial.seconds)
    assert all(r.ok for r in serial.results + parallel.results)
    assert all(f["ok"] for f in figures), figures


def test_a_blackholed_host_fails_its_connect_at_its_timeout(fleet: HostFleet, rehearsal: Record) -> None:
    """node03's route drops the replies: a connect with a 1 s timeout fails within 3 s."""
    failed = failed_connect(fleet["node03"], timeout=1.0)
    figures = [within("connect", failed.seconds, 3.0)]
    rehearsal("hosts", verdict(figures), figures, error=repr(failed.error))
    assert failed.seconds < 3.0, failed


def test_a_preflight_over_ten_faulty_hosts_ends_in_bounded_time(
    ssh_hosts: HostPool, tmp_path_factory: pytest.TempPathFactory, rehearsal: Record
) -> None:
    """tests/test_preflight_hosts.py's scenario run (a dead node, a hung nvidia-smi, six other faults): one connect
    timeout for the dead node and one probe timeout for the hung tool, the rest in parallel."""
    with preflight.model_store() as store:
        scenario = preflight.deploy(preflight.scenario_fleet(ssh_hosts), store, tmp_path_factory.mktemp("scenario"))
        outcome = preflight.run_scenario(scenario, tmp_path_factory.mktemp("scenario-run"))
    figures = [within("preflight run", outcome.run.seconds, preflight.SCENARIO_RUN_TARGET_S)]
    rehearsal("preflight", verdict(figures), figures, rc=outcome.run.rc, summary=outcome.report["summary"])
    assert outcome.run.rc == 2, outcome.run.output[-3000:]
    assert outcome.run.seconds < preflight.SCENARIO_RUN_TARGET_S, outcome.run.seconds
