"""The drill sandbox and what every drill's report must hold, for the CI suite's drills (tests/test_drill_run.py:
judged by order) and the rehearsal's (tests/rehearsal/test_drills.py: judged on the plan's targets).

The sandbox: 3 REAL smg 1.13 gateway instances, simulated SGLang workers (2 nodes × 4; the worker is the stand-in:
no GPU here), one agent per node, 3 controllers on a REAL etcd and a REAL Prometheus loading the rendered alert
rules. Faults are real signals to real processes (SIGKILL, SIGSTOP), except what a signal cannot do: slow answers,
HTTP 500s, memory pressure and jitter go through the simulated worker's fault route (this kernel has no netem).

Stack settings (the sandbox stack with :data:`CHANGES`): heartbeat 1 s, health timeout 0.8 s (the routers' checks
take whole seconds: 1 s), 3 failures, lease 3 s. The health timeout is under the heartbeat as on prod (3 s against
5 s): at 1 s against 1 s a node agent's round with a failing probe lasted the whole heartbeat and its report made the
next round late (the agents keep their schedule only when a round ends before the next is due), so the score moved
slower than one probe a heartbeat.

Each drill's PNG timeline is kept under ``test-output/drills/`` in the checkout (CI keeps that folder) and checked
for content: the markers the drill measured are drawn (their exact colours are in the picture) and the series are
there.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from serving.drill.report import MARKERS
from serving.drill.scenarios import SCENARIOS, Judging
from serving.sandbox.processes import free_port_block
from tests.support.ci import require_prometheus
from tests.support.cli import json_object
from tests.support.etcd import require_etcd
from tests.support.paths import REPO
from tests.support.sandbox import Sandbox, running_sandbox
from tests.support.stacks import request_timeout_of

OUTPUT = REPO / "test-output" / "drills"
GROUPS = 3  # fifteen drills of about 40 s each: three sandboxes, three workers (tests/conftest.py's SANDBOX_GROUPS)


def changes(base: int) -> dict[str, Any]:
    """The drill stack: the sandbox stack on the ports from ``base`` (40 of them), with the runtime and Prometheus."""
    return {
        "sandbox.worker_base_port": base,
        "sandbox.router_port": base + 8,
        "sandbox.prometheus_port": base + 9,
        "sandbox.runtime": True,
        "sandbox.prometheus": True,
        "sandbox.runtime_base_port": base + 10,
        "cluster.pools.0.count": 2,
        "serving.replicas_per_node": 4,
        "serving.heartbeat_interval_s": 1.0,
        **request_timeout_of(3),  # its detection window (3 × 1 s), as before the timeout fit a generation
        "serving.health_check_timeout_s": 0.8,
        "scheduler.instances": 3,
        "runtime.lease_ttl_s": 3,
        "runtime.max_eviction_share": 0.25,
    }


@contextmanager
def drill_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    require_etcd()
    require_prometheus()
    with running_sandbox(
        tmp_path_factory.mktemp("drills"), replicas=8, changes=changes(free_port_block(40))
    ) as sandbox:
        yield sandbox


def run(
    sandbox: Sandbox, scenario: str, report: Path, judging: Judging
) -> tuple[subprocess.CompletedProcess[str], Any]:
    """``exaserve drill --scenario SCENARIO --judge JUDGING --json --report REPORT``: the process and its JSON. The
    timeout is a liveness bound (judged by order the drill waits up to 3 × the plan's times for each event)."""
    r = sandbox.cli("drill", "--scenario", scenario, "--judge", judging, "--json", "--report", str(report),
                    timeout_s=900)  # fmt: skip
    return r, json_object(r)


def keep(report: Path, name: str) -> None:
    """The drill's picture and report under test-output/drills/ (CI keeps that folder)."""
    OUTPUT.mkdir(parents=True, exist_ok=True)
    if (report / "timeline.png").is_file():
        shutil.copy(report / "timeline.png", OUTPUT / f"{name}.png")
        shutil.copy(report / "drill.json", OUTPUT / f"{name}.json")


def summary(scenario: str, doc: dict[str, Any]) -> str:
    return (
        f"{scenario}: detection {doc.get('detection_s')} s, recovery {doc.get('recovery_s')} s, restoration "
        f"{doc.get('restoration_s')} s, takeover {doc.get('takeover_s')} s, client errors {doc.get('client_errors')}"
        f"/{doc.get('client_requests')}, alerts {[a['alertname'] for a in doc.get('alerts', {}).get('fired', [])]}"
    )


def check_what_every_drill_holds(scenario: str, r: subprocess.CompletedProcess[str], doc: dict[str, Any]) -> None:
    """What a passed drill says, however it was judged: its progress lines, its scenario, the client error share,
    out and back (or nothing out), the alerts that must fire and those that must not, the fleet whole again, the
    picture of what it measured and the report on disk."""
    # issue 28, item 9: piped, the drill says what it does as it goes (timestamped lines on stderr)
    assert re.search(r"^\d\d:\d\d:\d\d fault injected: ", r.stderr, re.M), r.stderr[-2000:]
    assert re.search(r"^\d\d:\d\d:\d\d settling after the drill$", r.stderr, re.M), r.stderr[-2000:]
    s = SCENARIOS[scenario]
    assert doc["scenario"] == scenario and doc["stack"] == "sandbox"
    targets = {t["name"]: t["value"] for t in doc["targets"]}
    assert doc["client_error_rate"] <= targets["client_error_rate"]
    assert doc["client_requests"] >= 1 / targets["client_error_rate"], "too few requests to judge the error gate"
    if s.evicts:
        assert doc["detection_s"] is not None and doc["restoration_s"] is not None  # out, then back
    else:
        # judged by order, a replica only shed for its load or latency is the rehearsal's to judge (its figures follow
        # the machine's speed); one failed or restarted is a false detection however the drill was judged
        forgiven = set(doc["shed"]) if any(c["judged"] == "order" for c in doc["checks"]) else set()
        assert set(doc["false_detections"]) <= forgiven, doc["false_detections"]
    fired = {a["alertname"] for a in doc["alerts"]["fired"]}
    # an alert the judge found not due (the replica back before its `for` could pass) is neither required nor forbidden
    [alert_check] = [c for c in doc["checks"] if c["name"] == "alerts_fired"]
    not_due = {a for a in s.alerts if f"{a} not due" in alert_check["reason"]}
    assert doc["alerts"]["checked"] and set(s.alerts) - not_due <= fired and not fired & set(s.quiet), fired
    assert doc["settled"], "the fleet was not whole again after the drill"
    check_timeline(doc)
    assert json.loads((Path(doc["timeline"]).parent / "drill.json").read_text())["ok"]


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
