"""Every fault drill, run for real: `exaserve drill --scenario NAME --json --report DIR` against a sandbox started with
the real `exaserve sandbox up` — 3 REAL smg 1.13 gateway instances, simulated SGLang workers (2 nodes × 4; the worker
is the stand-in: no GPU here), one agent per node, 3 controllers on a REAL etcd and a REAL Prometheus loading the
rendered alert rules. Faults are real signals to real processes (SIGKILL, SIGSTOP), except what a signal cannot do:
slow answers, HTTP 500s, memory pressure and jitter go through the simulated worker's fault route (this kernel has
no netem).

Stack settings (the sandbox stack with the changes below): heartbeat 1 s, health timeout 0.8 s (the routers' checks
take whole seconds: 1 s), 3 failures, lease 3 s. The targets each drill is judged on come from the plan (`exaserve
drill --list`): detection ≤ 3 × 1 s + 1 s = 4 s, recovery ≤ 4 s + 10 s migration = 14 s, restoration ≤ 15 × 1 s +
0.8 s + 10 s + 1 s warm-up = 26.8 s, takeover ≤ 3 s + 0.5 s + 1 s = 4.5 s, client errors ≤ 0.1 %. A drill that misses
one exits 1 and fails here with its figures. The health timeout is under the heartbeat as on prod (3 s against 5 s):
at 1 s against 1 s a node agent's round with a failing probe lasted the whole heartbeat and its report made the next
round late (the agents keep their schedule only when a round ends before the next is due), so the score moved slower
than one probe a heartbeat (replica-flapping: detection 22.2 s against 22 s, ten failing rounds late).

Each drill's PNG timeline is kept under ``test-output/drills/`` in the checkout (CI keeps that folder) and checked for
content: the markers the drill measured are drawn (their exact colours are in the picture) and the series are there.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from serving.drill.report import MARKERS
from serving.drill.scenarios import NAMES, SCENARIOS, TargetName
from serving.sandbox.processes import free_port_block
from tests.support.ci import require_prometheus
from tests.support.cli import exaserve, json_object
from tests.support.etcd import require_etcd
from tests.support.paths import REPO
from tests.support.sandbox import Sandbox, running_sandbox
from tests.support.stacks import sandbox_stack_file

OUTPUT = REPO / "test-output" / "drills"
# The drills judge client latency against the baseline measured before the fault: the rollout tests' client load
# would read as the fault's, so scripts/test.sh runs the drills in a phase of their own (three workers, one sandbox
# per group; CI: replica-crash "still degraded" beside the rollout tests, every probe on time; four groups saturate
# the two cores, and detections measured against the plan's worst case went over it).
pytestmark = pytest.mark.drill

SANDBOX_GROUPS = 3  # fifteen drills of about 40 s each: three sandboxes, three workers (tests/conftest.py)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    require_etcd()
    require_prometheus()
    base = free_port_block(40)
    changes = {
        "sandbox.worker_base_port": base,
        "sandbox.router_port": base + 8,
        "sandbox.prometheus_port": base + 9,
        "sandbox.runtime": True,
        "sandbox.prometheus": True,
        "sandbox.runtime_base_port": base + 10,
        "cluster.pools.0.count": 2,
        "serving.replicas_per_node": 4,
        "serving.heartbeat_interval_s": 1.0,
        "serving.health_check_timeout_s": 0.8,
        "scheduler.instances": 3,
        "runtime.lease_ttl_s": 3,
        "runtime.max_eviction_share": 0.25,
    }
    with running_sandbox(tmp_path_factory.mktemp("drills"), replicas=8, changes=changes) as sb:
        yield sb


def _colours(png: Path) -> set[tuple[int, int, int]]:
    with Image.open(png) as image:
        rgb = image.convert("RGB")
        found = rgb.getcolors(maxcolors=1 << 20) or []
    return {c for _n, c in found}


def _hex(colour: str) -> tuple[int, int, int]:
    return (int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16))


def check_timeline(doc: dict[str, Any]) -> None:
    """The PNG holds what the JSON says was measured: a marker for the fault and for every figure observed, in its
    own colour, and every series the timeline draws."""
    png = Path(doc["timeline"])
    assert png.is_file() and png.stat().st_size > 10_000, png
    with Image.open(png) as image:
        drawn = json.loads(image.info["Description"])
    expected = {"fault"} | {
        name
        for name, key in (
            ("detection", "detection_s"),
            ("recovery", "recovery_s"),
            ("restoration", "restoration_s"),
            ("takeover", "takeover_s"),
        )
        if doc[key] is not None
    }
    assert expected <= set(drawn["markers"]), drawn
    for name, key in (("detection", "detection_s"), ("takeover", "takeover_s")):
        if name in expected:
            assert drawn["markers"][name] == pytest.approx(doc[key], abs=1e-3)
    assert drawn["markers"]["fault"] == 0.0
    colours = _colours(png)
    missing = [m for m in expected if _hex(MARKERS[m]) not in colours]
    assert not missing, f"markers {missing} are not in the picture {png}"
    assert {"client served/s", "client failed/s", "client P99"} <= set(drawn["series"])
    assert sum(s.startswith("membership ") for s in drawn["series"]) == 3  # one line per router instance
    if doc["subject"]["urls"]:
        assert {f"score {u}" for u in doc["subject"]["urls"]} <= set(drawn["series"])


@pytest.mark.slow
@pytest.mark.parametrize("scenario", NAMES)
def test_each_drill_meets_the_plans_targets_on_the_sandbox(sandbox: Sandbox, scenario: str, tmp_path: Path) -> None:
    report = tmp_path / scenario
    for attempt in (1, 2):
        r = sandbox.cli("drill", "--scenario", scenario, "--json", "--report", str(report), timeout_s=300)
        doc = json_object(r)
        # An `invalid` run (exit 3) is no result: the prober was starved (its probes came further apart than the
        # judge's cadence bound), or a time was over its target only by what the probes cannot resolve (judged on
        # its upper bound, within the target on its lower one). It is measured again once, beside the other
        # sandboxes of a parallel run; a second invalid run fails below. Never a pass on the best case.
        if doc.get("verdict") != "invalid" or attempt == 2:
            break
        undecided = [f"{c['name']}: {c['reason']}" for c in doc.get("checks", []) if c.get("undecided")]
        print(f"{scenario}: attempt {attempt} invalid ({doc['cadence'].get('why')}; {undecided}); measured again")
        # kept beside the drill's report (CI keeps test-output/drills/): the table of a run names its invalid ones
        OUTPUT.mkdir(parents=True, exist_ok=True)
        (OUTPUT / f"{scenario}.invalid-attempt-{attempt}.json").write_text(json.dumps(doc, indent=1) + "\n")
        assert doc["settled"], "an invalid drill left the fleet not whole: it cannot be measured again"
        shutil.rmtree(report, ignore_errors=True)
    failed = [f"{c['name']}: {c['reason']}" for c in doc.get("checks", []) if not c["ok"]]
    print(
        f"{scenario}: detection {doc.get('detection_s')} s, recovery {doc.get('recovery_s')} s, restoration "
        f"{doc.get('restoration_s')} s, takeover {doc.get('takeover_s')} s, client errors {doc.get('client_errors')}"
        f"/{doc.get('client_requests')}, alerts {[a['alertname'] for a in doc.get('alerts', {}).get('fired', [])]}"
    )
    OUTPUT.mkdir(parents=True, exist_ok=True)
    if (report / "timeline.png").is_file():
        shutil.copy(report / "timeline.png", OUTPUT / f"{scenario}.png")
        shutil.copy(report / "drill.json", OUTPUT / f"{scenario}.json")
    cadence = doc.get("cadence", {}).get("why")
    assert r.returncode == 0 and doc["ok"], f"{scenario} {doc.get('verdict')}: {failed} {cadence}\n{r.stderr[-2000:]}"
    assert doc["verdict"] == "passed" and doc["cadence"]["gaps"] == []

    # issue 28, item 9: piped, the drill says what it does as it goes (timestamped lines on stderr)
    assert re.search(r"^\d\d:\d\d:\d\d fault injected: ", r.stderr, re.M), r.stderr[-2000:]
    assert re.search(r"^\d\d:\d\d:\d\d settling after the drill$", r.stderr, re.M), r.stderr[-2000:]
    s = SCENARIOS[scenario]
    assert doc["scenario"] == scenario and doc["stack"] == "sandbox"
    targets = {t["name"]: t["value"] for t in doc["targets"]}
    assert set(targets) == {t.value for t in s.targets} | {TargetName.CLIENT_ERRORS.value}
    for name in s.targets:  # judged on the upper bound: within the target itself (the judge's undecided is invalid)
        assert doc[name.value] is not None and doc[name.value] <= targets[name.value], (name, doc[name.value])
    assert doc["client_error_rate"] <= targets["client_error_rate"]
    assert doc["client_requests"] >= 1 / targets["client_error_rate"], "too few requests to judge the error gate"
    if s.evicts:
        assert doc["detection_s"] is not None and doc["restoration_s"] is not None  # out, then back
    else:
        assert doc["false_detections"] == []
    fired = {a["alertname"] for a in doc["alerts"]["fired"]}
    # an alert the judge found not due (the replica back before its `for` could pass) is neither required nor forbidden
    [alert_check] = [c for c in doc["checks"] if c["name"] == "alerts_fired"]
    not_due = {a for a in s.alerts if f"{a} not due" in alert_check["reason"]}
    assert doc["alerts"]["checked"] and set(s.alerts) - not_due <= fired and not fired & set(s.quiet), fired
    assert doc["settled"], "the fleet was not whole again after the drill"
    check_timeline(doc)
    assert (report / "drill.json").is_file() and json.loads((report / "drill.json").read_text())["ok"]


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
