"""Every fault drill judged on the plan's targets, in real time: `exaserve drill --scenario NAME --json --report DIR`
against the drill sandbox (tests/support/drills.py). The targets come from the plan (`exaserve drill --list`):
detection ≤ 3 × 1 s + 1 s = 4 s, recovery ≤ 4 s + 10 s migration = 14 s, restoration ≤ 15 × 1 s + 0.8 s + 10 s +
1 s warm-up = 26.8 s, takeover ≤ 3 s + 0.5 s + 1 s = 4.5 s, client errors ≤ 0.1 %. A drill that misses one exits 1
and fails here with its figures; one whose probes slipped is `invalid` (exit 3), measured once more, and fails when
invalid again: never passed. The CI suite runs the same drills judged by order (tests/test_drill_run.py).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from serving.drill.scenarios import NAMES, SCENARIOS
from tests.support import drills
from tests.support.rehearsal import figure
from tests.support.sandbox import Sandbox

pytestmark = [pytest.mark.drill, pytest.mark.sandbox]

SANDBOX_GROUPS = drills.GROUPS


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    with drills.drill_sandbox(tmp_path_factory) as sb:
        yield sb


@pytest.mark.parametrize("scenario", NAMES)
def test_each_drill_meets_the_plans_targets_on_the_sandbox(
    sandbox: Sandbox, scenario: str, tmp_path: Path, rehearsal: Callable[..., dict[str, Any]]
) -> None:
    report = tmp_path / scenario
    attempts = []
    for attempt in (1, 2):
        r, doc = drills.run(sandbox, scenario, report, "targets")
        attempts.append(doc.get("verdict"))
        # An `invalid` run (exit 3) is no result: the prober was starved (its probes came further apart than the
        # judge's cadence bound), or a time was over its target only by what the probes cannot resolve (judged on
        # its upper bound, within the target on its lower one). It is measured again once; a second invalid run
        # fails below. Never a pass on the best case.
        if doc.get("verdict") != "invalid" or attempt == 2:
            break
        drills.OUTPUT.mkdir(parents=True, exist_ok=True)
        (drills.OUTPUT / f"{scenario}.invalid-attempt-{attempt}.json").write_text(json.dumps(doc, indent=1) + "\n")
        assert doc["settled"], "an invalid drill left the fleet not whole: it cannot be measured again"
        shutil.rmtree(report, ignore_errors=True)
    print(drills.summary(scenario, doc))
    drills.keep(report, scenario)
    rehearsal(
        "drill",
        doc.get("verdict", "failed"),
        [
            figure(
                c["name"],
                c["measured"],
                c["target"] if c["unit"] else None,
                c["unit"],
                c["ok"],
                undecided=c["undecided"],
                reason=c["reason"],
            )
            for c in doc.get("checks", [])
        ],
        scenario=scenario,
        attempts=attempts,
        cadence=doc.get("cadence"),
    )
    failed = [f"{c['name']}: {c['reason']}" for c in doc.get("checks", []) if not c["ok"]]
    cadence = doc.get("cadence", {}).get("why")
    assert r.returncode == 0 and doc["ok"], f"{scenario} {doc.get('verdict')}: {failed} {cadence}\n{r.stderr[-2000:]}"
    assert doc["verdict"] == "passed" and doc["cadence"]["gaps"] == []
    s = SCENARIOS[scenario]
    targets = {t["name"]: t["value"] for t in doc["targets"]}
    assert set(targets) == {t.value for t in s.targets} | {"client_error_rate"}
    for name in s.targets:  # judged on the upper bound: within the target itself (the judge's undecided is invalid)
        assert doc[name.value] is not None and doc[name.value] <= targets[name.value], (name, doc[name.value])
    drills.check_what_every_drill_holds(scenario, r, doc)
