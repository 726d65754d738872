"""scripts/rehearse.sh's report (tests/support/rehearsal.py): every record gathered, its verdict the worst of them —
a missed target fails it, an invalid measurement is never passed, nothing measured is no pass either — and the
scale bench's JSON read as a record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.rehearsal import OUT, figure, gather, main, scale_record, write_record


def _write(records: Path, name: str, verdict: str, ok: bool = True) -> None:
    doc = {"test": name, "kind": "drill", "verdict": verdict, "figures": [figure("detection_s", 3.2, 4.0, "s", ok)]}
    (records / f"{name}.json").write_text(json.dumps(doc))


@pytest.mark.parametrize(
    ("verdicts", "expected", "exit_code"),
    [
        (["passed", "passed"], "passed", 0),
        (["passed", "invalid"], "invalid", 3),
        (["invalid", "failed", "passed"], "failed", 1),
        ([], "failed", 1),  # nothing measured is no pass
    ],
)
def test_the_report_is_as_bad_as_its_worst_record(
    tmp_path: Path, verdicts: list[str], expected: str, exit_code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    records = tmp_path / "records"
    records.mkdir()
    for i, v in enumerate(verdicts):
        _write(records, f"t{i}", v, ok=v == "passed")
    doc = gather(records)
    assert doc["verdict"] == expected and sum(doc["counts"].values()) == len(verdicts)
    assert main(["gather", str(records), str(tmp_path / "report.json")]) == exit_code
    assert json.loads((tmp_path / "report.json").read_text())["verdict"] == expected
    missed = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  missed:")]
    assert len(missed) == sum(v != "passed" for v in verdicts)


def test_a_record_is_written_where_the_rehearsal_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OUT, str(tmp_path / "out"))
    write_record("tests/rehearsal/test_x.py::test_y[a b]", "timing", "passed", [figure("x", 1.0, 2.0, "s", True)])
    [written] = (tmp_path / "out").iterdir()
    assert json.loads(written.read_text())["test"] == "tests/rehearsal/test_x.py::test_y[a b]"
    with pytest.raises(ValueError, match="verdict 'ok'"):
        write_record("t", "timing", "ok", [])  # type: ignore[arg-type]


def test_the_scale_bench_is_read_as_a_record_every_batch_passed_and_no_client_error(tmp_path: Path) -> None:
    batches = [{"batch": b, "span_s": 100.0 + b, "passed": True} for b in range(5)]
    good = {"bring_up": {"replicas": 2048}, "rollout": {"per_batch": batches, "batches_run": 5, "batches_planned": 5,
            "client_errors": 0, "full_rollout_s": 534.0, "configured_wait_s": 53.5, "client_p99_ms": 5900.0}}  # fmt: skip
    assert scale_record(good)["verdict"] == "passed"
    paused = json.loads(json.dumps(good))
    paused["rollout"]["per_batch"][2]["passed"] = False
    paused["rollout"]["batches_run"] = 2
    rec = scale_record(paused)
    assert rec["verdict"] == "failed"
    assert {f["name"] for f in rec["figures"] if not f["ok"]} == {"batch 2 passed", "batches passed"}
    errors = json.loads(json.dumps(good))
    errors["rollout"]["client_errors"] = 3
    assert [f["name"] for f in scale_record(errors)["figures"] if not f["ok"]] == ["client errors"]
    # the bench died before writing its JSON: a failed record that says so, not a missing one
    assert main(["scale", str(tmp_path / "absent.json"), str(tmp_path / "records")]) == 0
    rec = json.loads((tmp_path / "records" / "scale.json").read_text())
    assert rec["verdict"] == "failed" and "left no JSON report" in rec["reason"]


def _junit(path: Path, cases: dict[str, str]) -> Path:
    """A JUnit XML as pytest writes it: each node id's case with its outcome's child element."""
    body = []
    for nodeid, outcome in cases.items():
        module, name = nodeid.split(".py::")
        child = {"passed": "", "failed": "<failure message='x'/>", "error": "<error message='x'/>",
                 "skipped": "<skipped message='x'/>"}[outcome]  # fmt: skip
        body.append(f'<testcase classname="{module.replace("/", ".")}" name="{name}">{child}</testcase>')
    path.write_text(f'<testsuites><testsuite name="pytest">{"".join(body)}</testsuite></testsuites>')
    return path


def test_a_test_that_failed_without_a_record_or_after_it_fails_the_report(tmp_path: Path) -> None:
    """A rehearsal whose sandbox never started writes no record: without pytest's outcomes the report would pass on
    the records that are there. A record passed whose test then failed an assert is failed too; a skip measured
    nothing. What the run left out is named."""
    records = tmp_path / "records"
    records.mkdir()
    write = {"tests/rehearsal/test_a.py::test_ok": "passed", "tests/rehearsal/test_a.py::test_late[x]": "passed"}
    for test, verdict in write.items():
        (records / f"{test.replace('/', '_')}.json").write_text(
            json.dumps({"test": test, "kind": "drill", "verdict": verdict, "figures": []})
        )
    junit = _junit(tmp_path / "j.xml", {"tests/rehearsal/test_a.py::test_ok": "passed",
                                        "tests/rehearsal/test_a.py::test_late[x]": "failed",
                                        "tests/rehearsal/test_b.py::test_no_sandbox": "error",
                                        "tests/rehearsal/test_b.py::test_skipped": "skipped"})  # fmt: skip
    doc = gather(records, junit, ["the scale rehearsal (--no-scale)"])
    verdicts = {d["test"]: d["verdict"] for d in doc["records"]}
    assert verdicts == {
        "tests/rehearsal/test_a.py::test_ok": "passed",
        "tests/rehearsal/test_a.py::test_late[x]": "failed",
        "tests/rehearsal/test_b.py::test_no_sandbox": "failed",
        "tests/rehearsal/test_b.py::test_skipped": "failed",
    }
    assert doc["verdict"] == "failed" and doc["not_run"] == ["the scale rehearsal (--no-scale)"]
    # the same records, every test passed in pytest: passed, and still saying what was not run
    clean = _junit(tmp_path / "k.xml", dict.fromkeys(write, "passed"))
    assert gather(records, clean)["verdict"] == "passed"
    # no JUnit report at all: pytest never ran them
    assert gather(records, tmp_path / "absent.xml")["verdict"] == "failed"
