"""The one result record (serving.result): its JSON shape and text, and that every checker produces it —
plan rules, deployment policies (offline and as CrossGuard messages), preflight results and flag validation —
and that the CLI renders and serialises it the same way for all of them."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from typing import Any

import pytest
from rich.console import Console

from serving.checks import policy, preflight, rules
from serving.checks.policy.workloads import images_pinned
from serving.cli import report
from serving.flags import FlagValidationError, ProblemKind, check_argv, load_router_manifest, validate_argv
from serving.result import CheckResult, Status, failures
from serving.spec.stack import load_stack, load_stack_file
from tests.support.k8s import policy_pack
from tests.support.stacks import SOURCE_PLAN, fleet_of

FAILED = CheckResult(
    "health.check-timeout", Status.FAIL, "Got 1", "at least 3 s", "Use at least 3.", "serving.health_check_timeout_s"
)


# ------------------------------------------------------------------------------------------ the record


def test_json_shape_names_every_field_and_the_message() -> None:
    doc = FAILED.to_json()
    assert doc == {
        "check": "health.check-timeout",
        "status": "fail",
        "subject": "serving.health_check_timeout_s",
        "observed": "Got 1",
        "expected": "at least 3 s",
        "fix": "Use at least 3.",
        "message": "Got 1 (expected at least 3 s). Fix: Use at least 3.",
    }
    assert json.loads(json.dumps(doc)) == doc


def test_message_leaves_out_what_is_empty() -> None:
    assert CheckResult("kernel", Status.PASS, "6.8.0", ">= 5.15").message == "6.8.0 (expected >= 5.15)"
    assert CheckResult("ib_ports", Status.SKIP, "ethernet fabric", "").message == "ethernet fabric"
    assert CheckResult("x", Status.WARN, "seen", "", "Do this.").message == "seen. Fix: Do this."


@pytest.mark.parametrize("status", [Status.FAIL, Status.WARN])
def test_a_problem_without_a_fix_is_refused(status: Status) -> None:
    with pytest.raises(ValueError, match=r"'kernel' \w+ without a fix; every failing check says what to do"):
        CheckResult("kernel", status, "2.6.32", ">= 5.15")
    with pytest.raises(ValueError, match="without a fix"):
        CheckResult("kernel", status, "2.6.32", ">= 5.15", "")


@pytest.mark.parametrize("status", [Status.PASS, Status.SKIP])
def test_a_result_that_needs_nothing_carries_no_fix(status: Status) -> None:
    with pytest.raises(ValueError, match=f"a {status} result carries no fix"):
        CheckResult("kernel", status, "6.8.0", ">= 5.15", "reboot")


def test_failures_are_fail_results_only() -> None:
    warn = CheckResult("scheduler.period", Status.WARN, "Got 10", "100 ms", "Use 100.")
    passed = CheckResult("kernel", Status.PASS, "6.8.0", ">= 5.15")
    assert failures([warn, FAILED, passed]) == [FAILED]
    assert [s.value for s in Status] == ["pass", "warn", "fail", "skip"]


# ------------------------------------------------------------------------------------------ every checker produces it


def _all_records(results: list[Any]) -> None:
    assert results
    for r in results:
        assert isinstance(r, CheckResult), r
        assert r.check and r.observed and r.expected
        assert r.status in (Status.FAIL, Status.WARN) and r.fix


def test_plan_rules_return_records() -> None:
    spec = load_stack_file(SOURCE_PLAN).spec
    results = rules.check(fleet_of(spec))
    _all_records(results)
    assert {r.check for r in results} <= set(rules.RULES)
    assert all(r.subject for r in results)


def _pod(kind: str, name: str, image: str) -> dict[str, Any]:
    container = {"name": "c", "image": image, "securityContext": {"privileged": True}}
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": "exaserve"},
        "spec": {"template": {"metadata": {"labels": {}}, "spec": {"containers": [container]}}},
    }


def test_policies_return_records_named_by_rule_and_resource() -> None:
    bad = _pod("Deployment", "tools", "busybox:latest")
    results = policy.check([("kubernetes:apps/v1:Deployment", bad)], fleet_of(load_stack("dev").spec))
    _all_records(results)
    by_check = {r.check: r for r in results}
    assert by_check["images-pinned"].subject == "Deployment exaserve/tools"
    assert (
        by_check["images-pinned"].observed
        == "spec.template.containers[c].image is 'busybox:latest': not pinned (no tag, or 'latest')"
    )
    assert by_check["no-privileged-containers"].observed == "spec.template.containers[c] runs privileged"
    # No serving group rendered at all: the stack rule reports each missing group as its own subject.
    groups = [r for r in results if r.check == "serving-group-replicas"]
    assert [r.subject for r in groups] == [f"update group {g}" for g in range(load_stack("dev").spec.rollout.batches)]


def test_crossguard_message_is_the_resource_then_the_record_message() -> None:
    [result] = images_pinned("kubernetes:apps/v1:Deployment", _pod("Deployment", "tools", "busybox"))
    assert policy_pack().message(result) == f"Deployment exaserve/tools: {result.message}"
    assert policy_pack().message(CheckResult("c", Status.FAIL, "o", "e", "f")) == "o (expected e). Fix: f"


def test_preflight_results_map_onto_records_and_back() -> None:
    kernel = preflight.record("kernel", {"passed": False, "observed": "2.6.32", "expected": ">= 5.15", "fix": "boot"})
    assert kernel == CheckResult("kernel", Status.FAIL, "2.6.32", ">= 5.15", "boot")
    assert preflight.check_result("kernel", {"passed": True, "observed": "6.8", "expected": ">= 5.15", "fix": "x"}) == {
        "status": "pass",
        "observed": "6.8",
        "expected": ">= 5.15",
        "fix": None,
    }
    report_doc = preflight.build_report(
        "dev",
        {
            "n1": {"ssh": preflight.check_result("ssh", {"passed": True, "observed": "ok", "expected": "ssh"})},
            "n2": {
                "ssh": preflight.check_result("ssh", {"passed": True, "observed": "ok", "expected": "ssh"}),
                "kernel": preflight.entry(kernel),
                "ib_ports": preflight.check_result("ib_ports", {"skip": "ethernet fabric"}),
            },
        },
        aborted=["n1"],
    )
    records = preflight.results(report_doc)
    assert all(isinstance(r, CheckResult) for r in records)
    assert [(r.subject, r.check, r.status) for r in records] == [
        ("n1", "ssh", Status.PASS),
        ("n1", "play", Status.FAIL),
        ("n2", "ssh", Status.PASS),
        ("n2", "kernel", Status.FAIL),
        ("n2", "ib_ports", Status.SKIP),
    ]
    assert records[1] == replace(preflight.ABORTED, subject="n1")
    assert preflight.summary_lines(report_doc)[1:] == [
        f"n1 play: {preflight.ABORTED.message}",
        "n2 kernel: 2.6.32 (expected >= 5.15). Fix: boot",
    ]


def test_flag_validation_returns_records_and_the_error_carries_them() -> None:
    router = load_router_manifest()
    results = validate_argv(["--policy", "cache_awar", "--port", "x"], router)
    _all_records(results)
    assert [(r.check, r.subject) for r in results] == [
        (ProblemKind.BAD_CHOICE, "--policy"),
        (ProblemKind.BAD_TYPE, "--port"),
    ]
    assert results[0].to_json()["check"] == "bad-choice"
    with pytest.raises(FlagValidationError) as caught:
        check_argv(["--policy", "cache_awar", "--port", "x"], router)
    assert caught.value.results == tuple(results)
    assert str(caught.value).splitlines()[1:] == [f"  - {r.message}" for r in results]


# ------------------------------------------------------------------------------------------ rendered the same way


def test_plan_json_violations_are_records_with_the_first_contracts_names() -> None:
    stack = load_stack_file(SOURCE_PLAN)
    fleet = fleet_of(stack.spec, stack.name)
    doc = report.plan_json(fleet, stack.path, rules.check(fleet))
    assert doc["ok"] is False
    for v in doc["violations"]:
        assert set(v) == {
            "check",
            "status",
            "subject",
            "observed",
            "expected",
            "fix",
            "message",
            "rule",
            "path",
            "severity",
        }
        assert (v["rule"], v["path"]) == (v["check"], v["subject"])
        assert v["severity"] == {"fail": "error", "warn": "warning"}[v["status"]]


def test_print_results_keeps_each_line_whole_on_a_narrow_console() -> None:
    out = io.StringIO()
    warn = CheckResult(
        "scheduler.period", Status.WARN, "Got 10: " + "x" * 80, "100 ms", "Use 100.", "scheduler.period_ms"
    )
    report.print_results(Console(file=out, width=40, color_system=None), [FAILED, warn])
    assert out.getvalue().splitlines() == [
        "✗ fail [health.check-timeout] serving.health_check_timeout_s",
        "    observed: Got 1",
        "    expected: at least 3 s",
        "    fix:      Use at least 3.",
        "! warn [scheduler.period] scheduler.period_ms",
        "    observed: Got 10: " + "x" * 80,
        "    expected: 100 ms",
        "    fix:      Use 100.",
    ]
