"""What a rehearsal test records (tests/rehearsal/conftest.py's ``rehearsal`` fixture) and how scripts/rehearse.sh
gathers the records into one report: every figure with its target and verdict."""

from __future__ import annotations

import json
import os
import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

OUT = "EXASERVE_REHEARSAL_OUT"  # where each test's record goes (scripts/rehearse.sh sets it)

Verdict = Literal["passed", "failed", "invalid"]
VERDICTS: tuple[Verdict, ...] = ("passed", "failed", "invalid")


def figure(name: str, measured: float | None, target: float | None, unit: str, ok: bool, **more: Any) -> dict[str, Any]:
    """One measured figure against its target (``target`` None: reported, not judged)."""
    return {"name": name, "measured": measured, "target": target, "unit": unit, "ok": ok, **more}


def verdict(figures: Sequence[dict[str, Any]]) -> Verdict:
    """A record's verdict from its figures: passed when every one met its target, else failed."""
    return "passed" if all(f["ok"] for f in figures) else "failed"


def within(name: str, measured: float, target: float, unit: str = "s", **more: Any) -> dict[str, Any]:
    """A figure judged on its upper bound: ``measured`` ≤ ``target``."""
    return figure(name, measured, target, unit, measured <= target, **more)


def at_least(name: str, measured: float, target: float, unit: str = "s", **more: Any) -> dict[str, Any]:
    """A figure judged on its lower bound: ``measured`` ≥ ``target`` (``bound`` says so in the record)."""
    return figure(name, measured, target, unit, measured >= target, bound="at least", **more)


def write_record(
    test: str, kind: str, verdict: Verdict, figures: Sequence[dict[str, Any]], **detail: Any
) -> dict[str, Any]:
    """The record of one rehearsal test: printed, and written to ``$EXASERVE_REHEARSAL_OUT/<test id>.json`` when set."""
    if verdict not in VERDICTS:
        raise ValueError(f"verdict {verdict!r}: one of {', '.join(VERDICTS)}")
    doc = {"test": test, "kind": kind, "verdict": verdict, "figures": list(figures), **detail}
    print(json.dumps(doc))
    if out := os.environ.get(OUT):
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', test)}.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def junit_outcomes(junit: Path) -> dict[str, str]:
    """Each test pytest ran, by node id, and its outcome (passed, failed, error, skipped), from its JUnit XML."""
    outcomes = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        module, name = case.get("classname", ""), case.get("name", "")
        nodeid = f"{module.replace('.', '/')}.py::{name}"
        found = {child.tag for child in case}
        outcomes[nodeid] = next((o for o in ("error", "failure", "skipped") if o in found), "passed")
    return {k: "failed" if v == "failure" else v for k, v in outcomes.items()}


def gather(records: Path, junit: Path | None = None, not_run: Sequence[str] = ()) -> dict[str, Any]:
    """One report from the records in ``records``: every record, the count of each verdict, and the report's
    verdict: failed when any failed, else invalid when any was invalid (never passed), else passed; no record at all
    is failed (nothing was measured). With pytest's ``junit``: a test that ran and wrote no record (it failed before
    it measured, or was skipped: no measurement) is a failed record, and a record whose test failed afterwards (an
    assert after the figures) is failed too. ``not_run`` names what the run left out (the report says so)."""
    docs = [json.loads(p.read_text()) for p in sorted(records.glob("*.json"))]
    if junit is not None:
        outcomes = junit_outcomes(junit) if junit.is_file() else {}
        recorded = {d["test"] for d in docs}
        for d in docs:
            if outcomes.get(d["test"], "passed") != "passed" and d["verdict"] == "passed":
                d["verdict"], d["pytest"] = "failed", outcomes[d["test"]]
        docs += [
            {
                "test": t,
                "kind": "test",
                "verdict": "failed",
                "figures": [],
                "pytest": o,
                "reason": f"pytest: {o}, and no record: it did not measure",
            }
            for t, o in sorted(outcomes.items())
            if t not in recorded and o != "passed"
        ]
        if not outcomes:
            docs.append({"test": str(junit), "kind": "test", "verdict": "failed", "figures": [],
                         "reason": "pytest left no JUnit report: the rehearsal tests did not run"})  # fmt: skip
    counts = {v: sum(d["verdict"] == v for d in docs) for v in VERDICTS}
    verdict = "failed" if counts["failed"] or not docs else "invalid" if counts["invalid"] else "passed"
    return {"verdict": verdict, "counts": counts, "not_run": list(not_run), "records": docs}


def scale_record(doc: dict[str, Any]) -> dict[str, Any]:
    """The scale rehearsal's record from ``bench/scale_bench.py --sections reference,rollout --rollout-batches 0
    --json``: every batch of the rollout passed its gates, no client error, the size the machine held (reported: the
    bench takes the largest that fits). Its times are reported, not judged (docs/scale.md holds them against smg's)."""
    rollout = doc.get("rollout") or {}
    batches = rollout.get("per_batch", [])
    figures = [
        figure("replicas", doc.get("bring_up", {}).get("replicas"), None, "replicas", True),
        *(figure(f"batch {b['batch']} passed", b.get("span_s"), None, "s", bool(b["passed"])) for b in batches),
        figure("batches passed", rollout.get("batches_run"), rollout.get("batches_planned"), "batches",
               rollout.get("batches_run") == rollout.get("batches_planned") and bool(batches)),
        figure("client errors", rollout.get("client_errors"), 0, "requests", rollout.get("client_errors") == 0),
        figure("full rollout", rollout.get("full_rollout_s"), None, "s", True,
               configured_wait_s=rollout.get("configured_wait_s"), overhead_ratio=rollout.get("overhead_ratio")),
        figure("client P99", rollout.get("client_p99_ms"), None, "ms", True),
    ]  # fmt: skip
    verdict: Verdict = "passed" if all(f["ok"] for f in figures) else "failed"
    return {"test": "bench/scale_bench.py", "kind": "scale", "verdict": verdict, "figures": figures,
            "outcome": rollout.get("outcome"), "reason": rollout.get("reason")}  # fmt: skip


def main(argv: Sequence[str]) -> int:
    """``python -m tests.support.rehearsal scale SCALE.json RECORDS_DIR``: the scale bench's JSON as a record;
    ``python -m tests.support.rehearsal gather RECORDS_DIR REPORT [JUNIT.xml [NOT_RUN…]]``: the report (checked
    against pytest's JUnit XML, naming what was not run), exit 0 when passed, 1 when a target was missed (or a test
    failed, or nothing was measured), 3 when only invalid measurements stand in the way of a pass."""
    match argv:
        case ["scale", scale, records]:
            try:
                doc = json.loads(Path(scale).read_text())
            except (OSError, ValueError) as exc:
                doc = {"rollout": {"reason": f"the scale bench left no JSON report: {exc}"}}
            rec = scale_record(doc)
            Path(records).mkdir(parents=True, exist_ok=True)
            (Path(records) / "scale.json").write_text(json.dumps(rec, indent=1) + "\n")
            return 0
        case ["gather", records, report, *more]:
            junit = Path(more[0]) if more else None
            out = gather(Path(records), junit, more[1:])
            Path(report).write_text(json.dumps(out, indent=1) + "\n")
            partial = f" (partial: not run: {'; '.join(out['not_run'])})" if out["not_run"] else ""
            print(f"rehearsal: {out['verdict']}{partial}: {out['counts']}; report {report}")
            for d in out["records"]:
                for f in d["figures"]:
                    if not f["ok"]:
                        print(f"  missed: {d['test']}: {f['name']} {f['measured']} (target {f['target']} {f['unit']})")
                if not d["figures"] and d["verdict"] != "passed":
                    print(f"  failed: {d['test']}: {d.get('reason')}")
            return {"passed": 0, "failed": 1, "invalid": 3}[out["verdict"]]
    print(
        "usage: python -m tests.support.rehearsal scale SCALE.json RECORDS_DIR"
        " | gather RECORDS_DIR REPORT [JUNIT.xml [NOT_RUN…]]"
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
