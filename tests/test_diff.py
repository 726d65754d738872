"""`exaserve diff`: what changed between a git revision and the working tree, as a reviewer reads it.

The pure parts (flag-by-flag comparison of command lines, grouping of identical changes, capacity figures in their
units) on hand-made objects; then the command itself against a throwaway repository holding this working tree.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from serving.pulumi.diff import (
    FieldChange,
    FleetDiff,
    ObjectChange,
    argv_flags,
    diff_objects,
    field_changes,
    human,
    identical_changes,
    markdown_report,
    text_report,
)
from serving.pulumi.program import RenderedObject
from tests.support.cli import exaserve, json_object
from tests.support.k8s import render_file
from tests.support.paths import REPO
from tests.support.repo import working_tree_repo
from tests.support.stacks import SOURCE_PLAN

NEW_IMAGE = "lmsysorg/sglang:v0.5.24-cu126"
MIRROR = "registry.exaserve.internal/mirror"  # prod pulls through its mirror (kubernetes.image_registry)
SERVER = ["--model-path", "/models/m", "--context-length", "4096", "--enable-metrics", "--tp-size", "8"]


def _pod(args: list[str]) -> dict[str, Any]:
    return {"spec": {"template": {"spec": {"containers": [{"name": "sglang", "image": "i", "args": args}]}}}}


# ------------------------------------------------------------------------------------------ pure


def test_argv_flags_reads_values_switches_equals_and_lists() -> None:
    entry, flags = argv_flags(
        ["python3", "-m", "smg.launch_router", "--policy=cache_aware", "--worker-urls", "http://a", "http://b",
         "--log-json", "--port", "-1"]
    )  # fmt: skip
    assert entry == ["python3", "-m", "smg.launch_router"]
    assert flags == {
        "--policy": "cache_aware",
        "--worker-urls": "http://a http://b",
        "--log-json": True,
        "--port": "-1",
    }


def test_a_changed_flag_is_named_by_flag_not_by_position() -> None:
    after = ["--model-path", "/models/m", "--context-length", "8192", "--tp-size", "8", "--watchdog-timeout", "600"]
    changes = field_changes(_pod(SERVER), _pod(after))
    args = "spec.template.spec.containers[sglang].args"
    assert changes == [
        FieldChange(f"{args}[--context-length]", "4096", "8192", "--context-length"),
        FieldChange(f"{args}[--watchdog-timeout]", None, "600", "--watchdog-timeout"),
        FieldChange(f"{args}[--enable-metrics]", True, None, "--enable-metrics"),
    ]
    assert {c.where for c in changes} == {"containers[sglang].args"}
    assert "args[2]" not in text_report(_diff([ObjectChange("StatefulSet", "ns", "sglang-g0", "fleet", changes)]))


def test_a_changed_entry_point_is_one_change_and_a_reordered_line_the_whole_list() -> None:
    router = ["python3", "-m", "smg.launch_router", "--port", "8000"]
    moved = ["python3", "-m", "smg.launch", "--port", "8000"]
    assert field_changes({"command": router}, {"command": moved}) == [
        FieldChange("command[entry]", "python3 -m smg.launch_router", "python3 -m smg.launch")
    ]
    reordered = ["--tp-size", "8", *SERVER[:-2]]
    assert field_changes({"args": SERVER}, {"args": reordered}) == [FieldChange("args", SERVER, reordered)]


def _diff(changed: list[ObjectChange], capacity: list[FieldChange] | None = None) -> FleetDiff:
    return FleetDiff("prod", "main", "0123456789abcdef", 10, 10, changed=changed, capacity=capacity or [])


def test_a_changed_configmap_file_shows_the_keys_that_changed_inside_it() -> None:
    """Issue 28: a ConfigMap holding the stack file showed as the same truncated prefix on both sides."""
    stack = yaml.safe_load((REPO / "Pulumi.dev.yaml").read_text())
    before = {"data": {"stack.yaml": yaml.safe_dump(stack)}}
    stack["config"]["exaserve:rollout"]["interval_s"] = 60
    after = {"data": {"stack.yaml": yaml.safe_dump(stack)}}
    changes = field_changes(before, after)
    assert changes == [FieldChange('data["stack.yaml"].config["exaserve:rollout"].interval_s', 120, 60)]
    result = _diff([ObjectChange("ConfigMap", "exaserve", "exaserve-runtime-stack", "runtime", changes)])
    assert 'data["stack.yaml"].config["exaserve:rollout"].interval_s: 120 → 60' in text_report(result)
    # the pull-request comment shows the same key, not the file's prefix twice
    assert '| `data["stack.yaml"].config["exaserve:rollout"].interval_s` | `120` | `60` |' in markdown_report(result)
    # text that is not a mapping stays one change
    assert field_changes({"data": {"a": "x\ny"}}, {"data": {"a": "x\nz"}}) == [FieldChange("data.a", "x\ny", "x\nz")]


def test_identical_changes_across_update_groups_are_one_entry() -> None:
    flag = FieldChange(
        "spec.template.spec.containers[sglang].args[--context-length]", "4096", "8192", "--context-length"
    )
    same = [ObjectChange("StatefulSet", "exaserve", f"sglang-g{i}", "fleet", [flag]) for i in range(5)]
    other = ObjectChange("StatefulSet", "exaserve", "sglang-g5", "fleet", [FieldChange("spec.replicas", 26, 20)])
    assert [len(g) for g in identical_changes([*same, other])] == [5, 1]
    md = markdown_report(_diff([*same, other]))
    assert "**6 changed, 0 added, 0 removed**" in md
    assert (
        "<code>StatefulSet exaserve/sglang-g0, sglang-g1, sglang-g2, sglang-g3, sglang-g4</code> (fleet): "
        "1 field(s), the same in 5 objects</summary>"
    ) in md
    assert md.count("| `--context-length` in `containers[sglang].args` | `4096` | `8192` |") == 1
    assert "<code>StatefulSet exaserve/sglang-g5</code> (fleet): 1 field(s)</summary>" in md


def test_a_change_that_makes_pulumi_replace_a_serving_group_is_flagged() -> None:
    """Issue 40 (smaller): an immutable StatefulSet field (here the governing Service's name) makes pulumi-kubernetes
    replace the object: every pod of the group deleted at once, outside any rollout. The diff flags it, and only
    it: a template change (a flag) is an update, and the same path on another kind means nothing."""

    def workload(service: str, context: str, kind: str = "StatefulSet") -> RenderedObject:
        spec = {"serviceName": service, "replicas": 26, "template": {"spec": {"containers": [
            {"name": "sglang", "args": ["python", "-m", "sglang.launch_server", "--context-length", context]}]}}}  # fmt: skip
        obj = {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": "sglang-g0", "namespace": "exaserve"},
               "spec": spec}  # fmt: skip
        return RenderedObject(obj, "fleet", f"kubernetes:apps/v1:{kind}")

    _, _, changed = diff_objects([workload("sglang-workers", "4096")], [workload("other", "8192")])
    (change,) = changed
    assert change.replaced_by == ("spec.serviceName",)
    d = _diff(changed)
    assert "REPLACED by pulumi up (deleted, then created): spec.serviceName" in text_report(d)
    assert "**Replaced, not updated, by `pulumi up`**" in markdown_report(
        d
    ) and "(spec.serviceName)" in markdown_report(d)
    assert json.loads(json.dumps(d.as_dict()))["changed"][0]["replaced_by"] == ["spec.serviceName"]
    _, _, only_template = diff_objects([workload("s", "4096")], [workload("s", "8192")])
    assert only_template[0].replaced_by == ()
    _, _, other_kind = diff_objects([workload("a", "1", "Deployment")], [workload("b", "1", "Deployment")])
    assert other_kind[0].replaced_by == ()  # a Deployment is replaced on its selector only


@pytest.mark.parametrize(
    ("key", "value", "shown"),
    [
        ("weights_bytes", 70 * 2**30, "70.00 GiB"),
        ("per_gpu_memory_bytes.kv_cache", 10.5 * 2**30, "10.50 GiB"),
        ("kv_cache_bytes_per_token", 327_680, "320.00 KiB/token"),
        ("requests_per_second", 1234.5, "1,234.5 req/s"),
        ("heartbeat_messages_per_second.direct", 409.6, "409.6 msg/s"),
        ("failure_detection_s", 18, "18 s"),
        ("replicas", 2048, "2,048"),
        ("rollout_group_sizes", [26, 25], "[26, 25]"),
    ],
)
def test_capacity_figures_are_shown_in_their_units(key: str, value: Any, shown: str) -> None:
    assert human(key, value) == shown


def test_capacity_deltas_in_the_report_carry_units_and_percent() -> None:
    capacity = [
        FieldChange("per_gpu_memory_bytes.kv_cache", 10 * 2**30, 20 * 2**30),
        FieldChange("requests_per_second", 200.0, 150.0),
    ]
    md = markdown_report(_diff([], capacity))
    assert "| `per_gpu_memory_bytes.kv_cache` | `10.00 GiB` | `20.00 GiB` | +10.00 GiB (+100.0%) |" in md
    assert "| `requests_per_second` | `200 req/s` | `150 req/s` | -50 req/s (-25.0%) |" in md
    assert "  requests_per_second: 200 req/s → 150 req/s -50 req/s (-25.0%)" in text_report(_diff([], capacity))


# ------------------------------------------------------------------------------------------ the command


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return working_tree_repo(tmp_path_factory.mktemp("repo") / "exaserve")


def _exaserve(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`exaserve` with the repository's own code (PYTHONPATH first), as CI runs it in a clone."""
    return exaserve(*args, cwd=repo, env={"PYTHONPATH": str(repo)}, timeout_s=300)


def _edit_stack(repo: Path, name: str, section: str, changes: dict[str, Any]) -> str:
    path = repo / f"Pulumi.{name}.yaml"
    original = path.read_text()
    doc = yaml.safe_load(original)
    doc["config"].setdefault(f"exaserve:{section}", {}).update(changes)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return original


@pytest.mark.slow  # 10-35 s (a real worker host, agent or git repository): --fast leaves it out
def test_diff_shows_one_group_version_change_as_exactly_that(repo: Path) -> None:
    original = (repo / "Pulumi.prod.yaml").read_text()
    _edit_stack(repo, "prod", "serving", {"releases": {"v1": "lmsysorg/sglang:v0.5.23-cu126", "v2": NEW_IMAGE}})
    _edit_stack(repo, "prod", "rollout", {"group_versions": {2: "v2"}})
    try:
        result = _exaserve(repo, "diff", "--stack", "prod", "--base", "main", "--json")
        markdown = _exaserve(repo, "diff", "--stack", "prod", "--base", "main", "--markdown")
    finally:
        (repo / "Pulumi.prod.yaml").write_text(original)
    assert result.returncode == 0, result.stderr
    doc = json_object(result)
    assert doc["stack"] == "prod" and doc["ok"] is True
    assert doc["added"] == [] and doc["removed"] == [] and doc["capacity"] == []
    assert doc["base"]["objects"] == doc["head"]["objects"] == len(render_file(REPO / "Pulumi.prod.yaml"))
    # The group's workload, the stack the runtime controllers read (a ConfigMap of the stack file), and the updater's
    # admission policy: the new release's image is one it may now set (issue 40: only the stack's releases' images)
    assert [(c["kind"], c["name"], c["component"]) for c in doc["changed"]] == [
        ("StatefulSet", "sglang-g2", "fleet"),
        ("ConfigMap", "exaserve-runtime-stack", "runtime"),
        ("ValidatingAdmissionPolicy", "exaserve-updater-release-only", "updater"),
    ]
    fields = {f["path"]: (f["base"], f["head"]) for f in doc["changed"][0]["fields"]}
    pod = "spec.template"
    assert fields == {
        'metadata.labels["exaserve.io/version"]': ("v1", "v2"),
        f'{pod}.metadata.labels["exaserve.io/version"]': ("v1", "v2"),
        f"{pod}.spec.containers[sglang].env[EXASERVE_RELEASE].value": ("v1", "v2"),
        f"{pod}.spec.containers[sglang].image": (f"{MIRROR}/lmsysorg/sglang:v0.5.23-cu126", f"{MIRROR}/{NEW_IMAGE}"),
        f"{pod}.spec.initContainers[wait-for-cache].image": (
            f"{MIRROR}/lmsysorg/sglang:v0.5.23-cu126",
            f"{MIRROR}/{NEW_IMAGE}",
        ),
    }
    assert markdown.returncode == 0, markdown.stderr
    assert "**3 changed, 0 added, 0 removed**" in markdown.stdout
    assert '| `metadata.labels["exaserve.io/version"]` | `v1` | `v2` |' in markdown.stdout
    assert "No capacity figure changed." in markdown.stdout


def test_diff_reports_capacity_deltas_and_group_sizes(repo: Path) -> None:
    original = _edit_stack(repo, "dev", "serving", {"replicas": 96})
    try:
        result = _exaserve(repo, "diff", "--stack", "dev", "--base", "main")
    finally:
        (repo / "Pulumi.dev.yaml").write_text(original)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    objects = len(render_file(REPO / "Pulumi.dev.yaml"))
    assert (
        f"objects: 14 changed, 0 added, 0 removed ({objects} at base, {objects} now)" in text
    )  # the controller's Role too: it names each serving pod
    assert "~ Deployment exaserve/sglang-router  [" in text, "the gateway's job queue is sized from the replicas"
    assert "~ Role exaserve/exaserve-updater-rollout  [updater]\n      rules[2].resourceNames:" in text, (
        "the updater may label exactly the fleet's pods: fewer replicas, fewer names"
    )
    assert "~ StatefulSet exaserve/sglang-g0  [fleet]\n" in text and "spec.replicas: 26 → 20\n" in text
    assert "topologySpreadConstraints[0].maxSkew: 13 → 10" in text, "the rack spread follows the group size"
    assert "~ PodDisruptionBudget exaserve/sglang-g1  [fleet]\n      spec.maxUnavailable: 2 → 1\n" in text
    assert "PodDisruptionBudget exaserve/sglang-g0" not in text, "group 0 keeps its budget of 2"
    assert "  replicas: 128 → 96 -32 (-25.0%)" in text
    assert "  rollout_group_sizes: [26, 26, 26, 25, 25] → [20, 19, 19, 19, 19]" in text


def test_diff_markdown_names_flags_groups_update_groups_and_shows_units(repo: Path) -> None:
    """A longer context on dev: the five update groups' workloads change alike, flag by flag; the sequences a
    replica's KV pool admits halve (SGLang sizes the pool from memory, not from the context)."""
    original = _edit_stack(repo, "dev", "limits", {"context_length": 8192})
    try:
        result = _exaserve(repo, "diff", "--stack", "dev", "--base", "main", "--markdown")
    finally:
        (repo / "Pulumi.dev.yaml").write_text(original)
    assert result.returncode == 0, result.stderr
    md = result.stdout
    assert (
        "<code>StatefulSet exaserve/sglang-g0, sglang-g1, sglang-g2, sglang-g3, sglang-g4</code> (fleet): "
        "1 field(s), the same in 5 objects"
    ) in md
    assert "| `--context-length` in `containers[sglang].args` | `4096` | `8192` |" in md
    assert "args[" not in md.replace("args[--", "")
    # 104,682 pool tokens (Llama-3-70B AWQ on one A100 80 GB, group scales counted): 25 sequences of 4,096, 12 of 8,192
    assert "| `max_concurrent_sequences_per_replica` | `25` | `12` | -13 (-52.0%) |" in md


def test_diff_of_a_stack_file_compares_it_with_its_copy_at_the_base(repo: Path, tmp_path: Path) -> None:
    original = _edit_stack(repo, "dev", "limits", {"context_length": 8192})
    try:
        result = _exaserve(repo, "diff", "--stack-file", "Pulumi.dev.yaml", "--base", "main", "--json")
    finally:
        (repo / "Pulumi.dev.yaml").write_text(original)
    assert result.returncode == 0, result.stderr
    doc = json_object(result)
    # the five groups, the runtime's stack, and the router: its request timeout is the longest generation
    assert doc["stack"] == "dev" and len(doc["changed"]) == 7
    flags = {f["flag"] for f in doc["changed"][0]["fields"]}
    assert flags == {"--context-length"}
    router = [f for c in doc["changed"] for f in c["fields"] if f["flag"] == "--request-timeout-secs"]
    assert [(f["base"], f["head"]) for f in router] == [("412", "822")]  # ⌈8,192 ÷ 10 + 2⌉

    outside = tmp_path / "Pulumi.source.yaml"
    outside.write_text(SOURCE_PLAN.read_text())
    r = _exaserve(repo, "diff", "--stack-file", str(outside), "--base", "main")
    assert r.returncode == 2 and f"--stack-file {outside}: not inside the repository" in r.stderr
    new = repo / "Pulumi.new.yaml"
    new.write_text(original)
    try:
        r = _exaserve(repo, "diff", "--stack-file", "Pulumi.new.yaml", "--base", "main")
    finally:
        new.unlink()
    assert r.returncode == 2 and "the file does not exist at --base 'main'" in r.stderr
    assert "Traceback" not in r.stderr


def test_diff_rejects_an_unknown_base(repo: Path) -> None:
    result = _exaserve(repo, "diff", "--stack", "dev", "--base", "no-such-branch")
    assert result.returncode == 2
    assert "--base 'no-such-branch' is not a commit" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow  # 10-35 s (a real worker host, agent or git repository): --fast leaves it out
def test_detailed_exitcode_is_2_on_changes_and_0_without(repo: Path) -> None:
    """Issue 28: `diff --detailed-exitcode`, as helm diff has it (there was no way to tell changes by the exit code)."""
    same = _exaserve(repo, "diff", "--stack", "dev", "--base", "main", "--detailed-exitcode", "--json")
    assert same.returncode == 0, same.stderr
    assert json_object(same)["ok"] is True
    original = _edit_stack(repo, "dev", "rollout", {"interval_s": 60})
    try:
        changed = _exaserve(repo, "diff", "--stack", "dev", "--base", "main", "--detailed-exitcode", "--json")
    finally:
        (repo / "Pulumi.dev.yaml").write_text(original)
    assert changed.returncode == 2, changed.stderr
    doc = json_object(changed)
    assert doc["ok"] is False and doc["changed"], doc
    # an error is 1 under --detailed-exitcode, never 2 ("changes"), as terraform plan has it; 2 without the flag
    bad = _exaserve(repo, "diff", "--stack", "dev", "--base", "no-such-ref", "--detailed-exitcode", "--json")
    assert bad.returncode == 1 and json_object(bad)["exit_code"] == 1, bad.stdout + bad.stderr
    assert _exaserve(repo, "diff", "--stack", "dev", "--base", "no-such-ref").returncode == 2
