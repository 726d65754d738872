"""`exaserve render`: the Pulumi program's objects on disk, validated against the real Kubernetes OpenAPI
schemas (kubernetes-validate, strict) and the upstream CRDs in ../shared/crds. `exaserve diff` is in test_diff.py.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from serving.checks import promtool
from serving.pulumi import output
from serving.pulumi.program import kubernetes_objects, run_program
from serving.pulumi.validate import SchemaSetupError, Validator
from serving.result import Status
from tests.support.cli import exaserve, flat
from tests.support.k8s import crd_dir, render_file
from tests.support.paths import REPO
from tests.support.stacks import MULTI_NODE, fleet_of, write_variant
from tests.support.worker_health import worker_health_tests

INDEX_KEYS = {"apiVersion", "kind", "name", "namespace", "component"}


def test_pinned_crds_resolve_and_are_not_copied_in() -> None:
    """The CRDs are pinned (serving/data/crds.lock.json), found beside the repository (CI's ../shared/crds) or in
    the cache bootstrap fills, never copied in."""
    assert crd_dir().is_dir()
    assert not list(REPO.rglob("*leaderworkersets.yaml")), "CRDs must not be copied into the project"


@pytest.mark.parametrize("stack", ["prod", "dev", "sandbox"])
def test_render_writes_and_validates_every_object(tmp_path: Path, stack: str) -> None:
    out = tmp_path / "out"
    result = exaserve("render", "--stack", stack, "--out", str(out), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(result.stdout)
    assert summary["problems"] == [] and summary["validated"] is True
    assert summary["crd_dir"] == str(crd_dir())
    index = json.loads((out / "index.json").read_text())
    assert len(index) == summary["objects"] and all(set(e) == INDEX_KEYS for e in index)
    files = sorted(out.rglob("*.yaml"))
    assert len(files) == len(index)
    docs = [yaml.safe_load(f.read_text()) for f in files]
    on_disk = sorted(
        (d["apiVersion"], d["kind"], d["metadata"]["name"], d["metadata"].get("namespace"), f.parent.name)
        for d, f in zip(docs, files, strict=True)
    )
    assert on_disk == sorted((e["apiVersion"], e["kind"], e["name"], e["namespace"], e["component"]) for e in index)
    first = next(iter(yaml.safe_load(files[0].read_text())))
    assert first == "apiVersion", "objects start with apiVersion, kind, metadata"
    kinds = {e["kind"] for e in index}
    assert {"StatefulSet", "PrometheusRule", "ServiceMonitor", "Node", "NetworkPolicy"} <= kinds
    assert ("Role", "exaserve-updater-rollout", "updater") in {(e["kind"], e["name"], e["component"]) for e in index}


def test_render_replaces_a_previous_render_and_refuses_other_directories(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert exaserve("render", "--stack", "prod", "--out", str(out), "--no-validate").returncode == 0
    assert len(list((out / "nodes").glob("*.yaml"))) == 256 + 3  # the GPU nodes and the system pool's
    result = exaserve("render", "--stack", "dev", "--out", str(out), "--no-validate")
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(list((out / "nodes").glob("*.yaml"))) == 16 + 2, "prod's node files are gone"
    assert not (out / "fabric").exists(), "components dev does not have are removed"
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    result = exaserve("render", "--stack", "dev", "--out", str(other))
    assert result.returncode == 2
    assert "is not empty and holds no previous render" in flat(result.stderr)
    assert (other / "notes.txt").read_text() == "mine"


def test_render_of_a_multi_node_variant_validates_leader_worker_sets(tmp_path: Path) -> None:
    path = write_variant(
        tmp_path,
        "tp16",
        changes=MULTI_NODE,
    )
    result = exaserve("render", "--stack-file", str(path), "--out", str(tmp_path / "out"), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["problems"] == []
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert sum(e["kind"] == "LeaderWorkerSet" for e in index) == 5


def test_render_exits_1_when_objects_fail_validation(tmp_path: Path) -> None:
    """With a CRD directory lacking the prometheus-operator CRDs, the monitoring objects cannot be validated."""
    crds = tmp_path / "crds"
    crds.mkdir()
    shutil.copy(crd_dir() / "leaderworkerset.x-k8s.io_leaderworkersets.yaml", crds)
    result = exaserve("render", "--stack", "dev", "--out", str(tmp_path / "out"), "--crd-dir", str(crds))
    assert result.returncode == 1, result.stdout + result.stderr
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    monitoring = [e for e in index if e["apiVersion"].startswith("monitoring.coreos.com/")]
    assert len(monitoring) >= 3  # the fleet's and the runtime's PrometheusRules and ServiceMonitors
    assert f"{len(monitoring)} problem(s)" in result.stdout
    assert "✗ PrometheusRule exaserve/exaserve-alerts: (root): no schema for PrometheusRule" in result.stdout
    assert (tmp_path / "out" / "index.json").is_file(), "the render is written even when it fails validation"


def test_render_rejects_an_unsupported_kubernetes_version_and_a_missing_crd_dir(tmp_path: Path) -> None:
    path = write_variant(tmp_path, "future", base="dev", changes={"kubernetes.version": "1.99"})
    result = exaserve("render", "--stack-file", str(path), "--out", str(tmp_path / "a"))
    assert result.returncode == 2
    assert "kubernetes.version '1.99' is outside the schemas kubernetes-validate ships (1.25–1.37)" in flat(
        result.stderr
    )
    result = exaserve("render", "--stack", "dev", "--out", str(tmp_path / "b"), "--crd-dir", str(tmp_path / "nope"))
    assert result.returncode == 2
    assert "CRD directory" in flat(result.stderr) and "does not exist" in flat(result.stderr)


def test_render_of_a_spec_the_units_cannot_serve_exits_2(tmp_path: Path) -> None:
    """fp16 Llama-3-70B on one 80 GB GPU: the planner's KV pool is empty; the message names fields and fixes."""
    path = write_variant(tmp_path, "fp16", base="dev", changes={"model.precision": "fp16", "model.quantization": None})
    result = exaserve("render", "--stack-file", str(path), "--out", str(tmp_path / "out"))
    assert result.returncode == 2, result.stdout + result.stderr
    message = flat(result.stderr)
    assert "model.precision=fp16 with parallelism.tp=1" in message and "raise parallelism.tp or pp" in message
    assert "Traceback" not in result.stdout + result.stderr


@pytest.fixture(scope="module")
def validator() -> Validator:
    return Validator("1.33", crd_dir())


@pytest.fixture(scope="module")
def prod_objects() -> dict[tuple[str, str], dict[str, Any]]:
    return {(o.kind, o.name): o.obj for o in kubernetes_objects(run_program("prod"))}


@pytest.mark.parametrize(
    ("kind", "name", "path", "value", "expected"),
    [
        (
            "Deployment",
            "sglang-router",
            ["spec", "template", "spec", "containers", 0, "resourcs"],
            {},
            "'resourcs' was unexpected",
        ),
        ("StatefulSet", "sglang-g0", ["spec", "replicas"], "410", "'410' is not of type 'integer'"),
        (
            "Deployment",
            "sglang-router",
            ["spec", "template", "spec", "containers", 0, "image"],
            5,
            "5 is not of type 'string'",
        ),
        ("PrometheusRule", "exaserve-alerts", ["spec", "groups", 0, "rules", 0, "for"], "5 minutes", "does not match"),
        ("ServiceMonitor", "sglang-router", ["metadata", "lables"], {}, "'lables' was unexpected"),
    ],
)
def test_validator_rejects_defects(
    validator: Validator,
    prod_objects: dict[tuple[str, str], dict[str, Any]],
    kind: str,
    name: str,
    path: list[Any],
    value: Any,
    expected: str,
) -> None:
    obj = prod_objects[(kind, name)]
    assert validator.problems(obj) == []
    bad = copy.deepcopy(obj)
    cur = bad
    for part in path[:-1]:
        cur = cur[part]
    cur[path[-1]] = value
    problems = validator.problems(bad)
    assert problems, f"{kind} {name}: defect at {path} not caught"
    assert any(expected in p.message for p in problems), [str(p) for p in problems]


def test_leader_worker_set_defects_are_caught_by_its_crd(validator: Validator, tmp_path: Path) -> None:
    objects = render_file(
        write_variant(
            tmp_path,
            "tp16",
            changes=MULTI_NODE,
        )
    )
    lws = next(o.obj for o in objects if o.kind == "LeaderWorkerSet")
    assert validator.problems(lws) == []
    bad = copy.deepcopy(lws)
    bad["spec"]["rolloutStrategy"] = {"rollingUpdateConfig": {"maxSurge": 1}}
    bad["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Always"
    messages = [str(p) for p in validator.problems(bad)]
    assert any("'rollingUpdateConfig' was unexpected" in m for m in messages), messages
    assert any("'Always' is not one of" in m for m in messages), messages


def test_custom_resource_without_a_crd_is_a_problem(
    prod_objects: dict[tuple[str, str], dict[str, Any]], tmp_path: Path
) -> None:
    """With a CRD directory that lacks the CRD, the object fails; with none at all, it is listed as
    unvalidated (the render warns) so the main job works on a machine without the upstream CRDs."""
    rule = prod_objects[("PrometheusRule", "exaserve-alerts")]
    partial = tmp_path / "crds"
    partial.mkdir()
    shutil.copy(crd_dir() / "leaderworkerset.x-k8s.io_leaderworkersets.yaml", partial)
    problems = Validator("1.33", partial).problems(rule)
    assert len(problems) == 1 and "no schema for PrometheusRule" in problems[0].message
    bare = Validator("1.33", None)
    assert bare.problems(rule) == [] and bare.unvalidated == ["PrometheusRule exaserve/exaserve-alerts"]
    service = copy.deepcopy(prod_objects[("Service", "sglang-router")])
    assert bare.problems(service) == []
    service["spec"]["bogusField"] = 1  # built-ins are still validated, strictly
    assert any("bogusField" in p.message for p in bare.problems(service))
    with pytest.raises(SchemaSetupError, match="outside the schemas"):
        Validator("1.20", None)


def test_yaml_round_trips_multiline_config() -> None:
    from serving.render.chrony import chrony_conf
    from serving.spec.stack import load_stack

    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "c"},
        "data": {"chrony.conf": chrony_conf(load_stack("prod").spec)},
    }
    text = output.to_yaml(cm)
    assert "chrony.conf: |" in text
    assert yaml.safe_load(text) == cm


def test_render_includes_the_bare_metal_units(tmp_path: Path) -> None:
    """`render` writes each replica's systemd unit, the router's argv/env and chrony.conf beside the objects;
    a second render replaces them."""
    from serving.plan.planner import fleet_replicas
    from serving.render.chrony import chrony_conf
    from serving.render.router import router_args
    from serving.render.systemd import systemd_unit
    from serving.spec.stack import load_stack

    out = tmp_path / "out"
    spec = load_stack("dev").spec
    for _ in range(2):
        result = exaserve("render", "--stack", "dev", "--out", str(out), "--json", "--no-validate")
        assert result.returncode == 0, result.stdout + result.stderr
        assert json.loads(result.stdout)["replica_units"] == 128
    replicas = fleet_replicas(spec)
    written = sorted(p.name for p in (out / "units").glob("*.service"))
    assert written == sorted(f"{r.id}.service" for r in replicas)
    assert (out / "units" / f"{replicas[5].id}.service").read_text() == systemd_unit(fleet_of(spec), replicas[5])
    router = json.loads((out / "units" / "router.json").read_text())
    assert router["argv"] == router_args(fleet_of(spec)).to_argv()
    assert (out / "units" / "chrony.conf").read_text() == chrony_conf(spec)


# ------------------------------------------------------------------------------------------ alert rules and promtool

PROMTOOL_TESTS = REPO / "tests" / "promtool"


@pytest.fixture(scope="module")
def prod_rules() -> dict[str, Any]:
    return promtool.rule_file(o.obj for o in kubernetes_objects(run_program("prod")))


@pytest.mark.parametrize("stack", ["prod", "dev", "sandbox"])
def test_render_runs_promtool_check_rules(tmp_path: Path, stack: str) -> None:
    """Finding 13: every render's rules pass Prometheus's own parser (promtool from Debian's prometheus package)."""
    result = exaserve("render", "--stack", stack, "--out", str(tmp_path / "out"), "--json", "--no-validate")
    assert result.returncode == 0, result.stdout + result.stderr
    checked = json.loads(result.stdout)["promtool"]
    assert checked["status"] == "pass", checked
    assert "SUCCESS: 24 rules found" in checked["observed"]  # 11 monitoring + 13 runtime (serving.render.k8s.runtime)


def test_promtool_rejects_offset_after_parentheses_and_render_fails(prod_rules: dict[str, Any]) -> None:
    """The shape that did not load: `(sum(rate(…[5m])) offset 25m)`. promtool names it; the check fails."""
    broken = copy.deepcopy(prod_rules)
    broken["groups"][0]["rules"][0]["expr"] = "sum(rate(x[5m])) < 0.8 * (sum(rate(x[5m])) offset 25m)"
    found = promtool.check_rules([{"kind": "PrometheusRule", "spec": broken}])
    assert found.status is Status.FAIL and "offset" in found.observed and found.fix
    assert "/tmp" not in found.observed, "the temporary file's path is not part of the message"


def test_without_promtool_render_says_what_was_not_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(promtool.shutil, "which", lambda name: None)
    skipped = promtool.check_rules([])
    assert skipped.status is Status.SKIP and skipped.observed == promtool.NOT_INSTALLED
    assert "alert rules of the PrometheusRule objects were not checked" in skipped.observed


def promtool_tests(group: str) -> dict[str, Any]:
    """The group's promtool test file, with the per-worker ExaServeWorkersUnhealthy tests built from the prod plan
    (tests/support/worker_health.py) added to exaserve.serving's."""
    doc: dict[str, Any] = yaml.safe_load((PROMTOOL_TESTS / f"{group}.test.yaml").read_text())
    if group == "exaserve.serving":
        from serving.spec.stack import load_stack

        doc["tests"] += worker_health_tests(fleet_of(load_stack("prod").spec))
    return doc


def test_every_rule_group_has_a_promtool_unit_test_naming_each_alert(prod_rules: dict[str, Any]) -> None:
    files = {f.name.removesuffix(".test.yaml") for f in PROMTOOL_TESTS.glob("*.test.yaml")}
    assert files == {g["name"] for g in prod_rules["groups"]}
    for group in prod_rules["groups"]:
        tests = promtool_tests(group["name"])["tests"]
        checks = [c for t in tests for c in t["alert_rule_test"]]
        for rule in group["rules"]:
            fired = [c for c in checks if c["alertname"] == rule["alert"] and c["exp_alerts"]]
            quiet = [c for c in checks if c["alertname"] == rule["alert"] and not c["exp_alerts"]]
            assert fired and quiet, f"{rule['alert']}: needs a test that fires it and one that keeps it quiet"


@pytest.mark.parametrize("group", ["exaserve.rollout-gates", "exaserve.serving", "exaserve.nodes", "exaserve.runtime"])
def test_promtool_unit_tests_fire_and_stay_quiet(tmp_path: Path, prod_rules: dict[str, Any], group: str) -> None:
    """`promtool test rules` for real (CI has it): input series that make each alert fire, and ones that keep it
    quiet, against the rules the prod stack renders."""
    exe = shutil.which("promtool")
    assert exe, "promtool is not installed: run scripts/bootstrap.sh (apt package prometheus)"
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(prod_rules, sort_keys=False))
    (tmp_path / f"{group}.test.yaml").write_text(yaml.safe_dump(promtool_tests(group), sort_keys=False))
    proc = subprocess.run(
        [exe, "test", "rules", f"{group}.test.yaml"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout
