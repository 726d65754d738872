"""Every fault drill, run for real and judged by what happened and in what order: `exaserve drill --scenario NAME
--judge order --json --report DIR` against a sandbox started with the real `exaserve sandbox up`
(tests/support/drills.py says what runs in it and how it is set).

Judged by order, a drill passes when every event its scenario is about was observed in its place: the faulted
replicas out of every router instance, then restarted (the leader journaled it, not before they were out), then back
in every router and in rotation, on a later probe than the restart; a new leader; clients served after the fault; not one client
request failed; no other replica out; the alerts that must fire fired and the quiet ones quiet; the fleet whole
again. How long each step took is the rehearsal's to judge against the plan's targets
(tests/rehearsal/test_drills.py, scripts/rehearse.sh): a verdict here does not depend on how fast or loaded the
machine is, only on what the fleet did.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from serving.drill.scenarios import NAMES, SCENARIOS, TargetName
from serving.sandbox.processes import free_port_block
from tests.support import drills
from tests.support.cli import exaserve
from tests.support.sandbox import Sandbox
from tests.support.stacks import sandbox_stack_file

# The drills share their phase of scripts/test.sh with nothing else: each has a sandbox of client load, probes and
# faults, and three at once keep both cores busy.
pytestmark = [pytest.mark.drill, pytest.mark.sandbox]

SANDBOX_GROUPS = drills.GROUPS

# the events the order judge names for each time target (serving.drill.measure.judge_order)
EVENTS = {
    TargetName.DETECTION: "out of rotation",
    TargetName.RESTORATION: "back in rotation",
    TargetName.TAKEOVER: "new leader",
    TargetName.RECOVERY: "served again",
}


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    with drills.drill_sandbox(tmp_path_factory) as sb:
        yield sb


@pytest.mark.slow
@pytest.mark.parametrize("scenario", NAMES)
def test_each_drill_does_what_its_scenario_says_in_order_on_the_sandbox(
    sandbox: Sandbox, scenario: str, tmp_path: Path
) -> None:
    report = tmp_path / scenario
    r, doc = drills.run(sandbox, scenario, report, "order")
    print(drills.summary(scenario, doc))
    drills.keep(report, f"{scenario}.order")
    failed = [f"{c['name']}: {c['reason']}" for c in doc.get("checks", []) if not c["ok"]]
    assert r.returncode == 0 and doc["ok"], f"{scenario} {doc.get('verdict')}: {failed}\n{r.stderr[-2000:]}"
    assert doc["verdict"] == "passed"
    checks = {c["name"]: c for c in doc["checks"]}
    s = SCENARIOS[scenario]
    # every event the scenario is about, observed and judged as an event, never against a time
    for target in s.targets:
        event = checks[EVENTS[target]]
        assert event["ok"] and event["judged"] == "order" and event["measured"] is not None, event
    assert not any(c["undecided"] for c in doc["checks"])
    if s.evicts:  # out, (restarted,) back: each after the one before
        assert checks["in_order"]["ok"], checks["in_order"]
        assert ("restart journaled" in checks["in_order"]["reason"]) is s.restarts, checks["in_order"]
    else:
        assert "in_order" not in checks
    assert {"client_errors", "client_error_rate", "false_detections", "alerts_fired", "alerts_quiet", "settled"} <= set(
        checks
    )
    assert doc["client_errors"] == 0, checks["client_errors"]  # none reaches a client, however few (issue 37)
    drills.check_what_every_drill_holds(scenario, r, doc)


def test_a_drill_without_a_running_sandbox_says_to_start_it(tmp_path: Path) -> None:
    """Bad input: the sandbox stack with nothing running (its own state directory) exits 2 naming the fix."""
    stack = sandbox_stack_file(tmp_path / "stack", ports_base=free_port_block(12), changes={"sandbox.runtime": True})
    r = exaserve(
        "drill",
        "--scenario",
        "replica-crash",
        "--stack-file",
        str(stack),
        env={"EXASERVE_STATE_DIR": str(tmp_path / "state")},
        timeout_s=120,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    assert "no router instance answers" in r.stderr and "exaserve sandbox up" in r.stderr, r.stderr
