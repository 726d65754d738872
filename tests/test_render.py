"""`exaserve render` and `exaserve diff`: the Pulumi program's objects on disk, validated against the real
Kubernetes OpenAPI schemas (kubernetes-validate, strict) and the upstream CRDs in ../shared/crds; the
fleet diff of a working tree against a git revision, in a throwaway repository.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from serving.cli.commands import register
from serving.cli.options import app
from serving.pulumi import output
from serving.pulumi.program import kubernetes_objects, run_program
from serving.pulumi.validate import DEFAULT_CRD_DIR, SchemaSetupError, Validator
from serving.spec.stack import PROJECT_ROOT
from tests.k8s_support import MULTI_NODE, render_file, write_variant

NEW_IMAGE = "lmsysorg/sglang:v0.5.24-cu126"
INDEX_KEYS = {"apiVersion", "kind", "name", "namespace", "component"}


def flat(text: str) -> str:
    """Console output with rich's line wrapping undone."""
    return " ".join(text.split())


@pytest.fixture(scope="module")
def cli() -> CliRunner:
    register(None)
    return CliRunner()


def test_shared_crds_are_present() -> None:
    """The CRDs are data beside the repository (never copied in); CI has them at ../shared/crds."""
    assert DEFAULT_CRD_DIR.is_dir(), f"{DEFAULT_CRD_DIR} missing"
    assert not list(PROJECT_ROOT.rglob("*leaderworkersets.yaml")), "CRDs must not be copied into the project"


@pytest.mark.parametrize("stack", ["prod", "dev", "sandbox"])
def test_render_writes_and_validates_every_object(cli: CliRunner, tmp_path: Path, stack: str) -> None:
    out = tmp_path / "out"
    result = cli.invoke(app, ["render", "--stack", stack, "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["problems"] == [] and summary["validated"] is True
    assert summary["crd_dir"] == str(DEFAULT_CRD_DIR)
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


def test_render_replaces_a_previous_render_and_refuses_other_directories(cli: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert cli.invoke(app, ["render", "--stack", "prod", "--out", str(out), "--no-validate"]).exit_code == 0
    assert len(list((out / "nodes").glob("*.yaml"))) == 256
    result = cli.invoke(app, ["render", "--stack", "dev", "--out", str(out), "--no-validate"])
    assert result.exit_code == 0, result.output
    assert len(list((out / "nodes").glob("*.yaml"))) == 16, "prod's node files are gone"
    assert not (out / "fabric").exists(), "components dev does not have are removed"
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    result = cli.invoke(app, ["render", "--stack", "dev", "--out", str(other)])
    assert result.exit_code == 2
    assert "is not empty and holds no previous render" in flat(result.stderr)
    assert (other / "notes.txt").read_text() == "mine"


def test_render_of_a_multi_node_variant_validates_leader_worker_sets(cli: CliRunner, tmp_path: Path) -> None:
    path = write_variant(
        tmp_path,
        "tp16",
        changes=MULTI_NODE,
    )
    result = cli.invoke(app, ["render", "--stack-file", str(path), "--out", str(tmp_path / "out"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["problems"] == []
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert sum(e["kind"] == "LeaderWorkerSet" for e in index) == 5


def test_render_exits_1_when_objects_fail_validation(cli: CliRunner, tmp_path: Path) -> None:
    """With a CRD directory lacking the prometheus-operator CRDs, the monitoring objects cannot be validated."""
    crds = tmp_path / "crds"
    crds.mkdir()
    shutil.copy(DEFAULT_CRD_DIR / "leaderworkerset.x-k8s.io_leaderworkersets.yaml", crds)
    result = cli.invoke(app, ["render", "--stack", "dev", "--out", str(tmp_path / "out"), "--crd-dir", str(crds)])
    assert result.exit_code == 1, result.output
    assert "3 problem(s)" in result.stdout
    assert "✗ PrometheusRule exaserve/exaserve-alerts: (root): no schema for PrometheusRule" in result.stdout
    assert (tmp_path / "out" / "index.json").is_file(), "the render is written even when it fails validation"


def test_render_rejects_an_unsupported_kubernetes_version_and_a_missing_crd_dir(cli: CliRunner, tmp_path: Path) -> None:
    path = write_variant(tmp_path, "future", base="dev", changes={"kubernetes.version": "1.99"})
    result = cli.invoke(app, ["render", "--stack-file", str(path), "--out", str(tmp_path / "a")])
    assert result.exit_code == 2
    assert "kubernetes.version '1.99' is outside the schemas kubernetes-validate ships (1.25–1.37)" in flat(
        result.stderr
    )
    result = cli.invoke(
        app, ["render", "--stack", "dev", "--out", str(tmp_path / "b"), "--crd-dir", str(tmp_path / "nope")]
    )
    assert result.exit_code == 2
    assert "CRD directory" in flat(result.stderr) and "does not exist" in flat(result.stderr)


def test_render_of_a_spec_the_units_cannot_serve_exits_2(cli: CliRunner, tmp_path: Path) -> None:
    """fp16 Llama-3-70B on one 80 GB GPU: the planner's KV pool is empty; the message names fields and fixes."""
    path = write_variant(tmp_path, "fp16", base="dev", changes={"model.precision": "fp16", "model.quantization": None})
    result = cli.invoke(app, ["render", "--stack-file", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    message = flat(result.stderr)
    assert "model.precision=fp16 with parallelism.tp=1" in message and "raise parallelism.tp or pp" in message
    assert "Traceback" not in result.output


@pytest.fixture(scope="module")
def validator() -> Validator:
    return Validator("1.33", DEFAULT_CRD_DIR)


@pytest.fixture(scope="module")
def prod_objects() -> dict[tuple[str, str], dict[str, Any]]:
    return {(o.kind, o.name): o.obj for o in kubernetes_objects(run_program("prod"))}


@pytest.mark.parametrize(
    ("kind", "name", "path", "value", "expected"),
    [
        (
            "StatefulSet",
            "sglang-g0",
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
        ("NetworkAttachmentDefinition", "exaserve-rdma", ["spec", "confg"], "{}", "'confg' was unexpected"),
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
    bad["spec"]["rolloutStrategy"]["rollingUpdateConfig"] = {"maxSurge": 1}
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
    shutil.copy(DEFAULT_CRD_DIR / "leaderworkerset.x-k8s.io_leaderworkersets.yaml", partial)
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


def test_yaml_round_trips_multiline_config(prod_objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    cm = prod_objects[("ConfigMap", "chrony-conf")]
    text = output.to_yaml(cm)
    assert "chrony.conf: |" in text
    assert yaml.safe_load(text) == cm


# ------------------------------------------------------------------------------------------ exaserve diff


def _git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@localhost",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@localhost",
    }
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env).stdout


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway git repository holding this working tree (tracked and untracked, not ignored files), committed:
    the main checkout's index and HEAD are never touched."""
    files = _git(PROJECT_ROOT, "ls-files", "-co", "--exclude-standard", "-z").split("\0")
    dest = tmp_path_factory.mktemp("repo") / "exaserve"
    for rel in filter(None, files):
        src = PROJECT_ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    _git(dest, "init", "-q", "-b", "main")
    _git(dest, "add", "-A")
    _git(dest, "commit", "-q", "-m", "base")
    return dest


def _exaserve(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`exaserve` with the repository's own code (PYTHONPATH first), as CI runs it in a clone."""
    env = {**os.environ, "PYTHONPATH": str(repo), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-c", "from serving.cli.main import main; main()", *args],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _edit_stack(repo: Path, name: str, section: str, changes: dict[str, Any]) -> str:
    path = repo / f"Pulumi.{name}.yaml"
    original = path.read_text()
    doc = yaml.safe_load(original)
    doc["config"][f"exaserve:{section}"].update(changes)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return original


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
    doc = json.loads(result.stdout)
    assert doc["added"] == [] and doc["removed"] == [] and doc["capacity"] == []
    assert doc["base"]["objects"] == doc["head"]["objects"] == 288
    assert [(c["kind"], c["name"], c["component"]) for c in doc["changed"]] == [("StatefulSet", "sglang-g2", "fleet")]
    fields = {f["path"]: (f["base"], f["head"]) for f in doc["changed"][0]["fields"]}
    assert fields == {
        'metadata.labels["exaserve.io/version"]': ("v1", "v2"),
        'spec.template.metadata.labels["exaserve.io/version"]': ("v1", "v2"),
        "spec.template.spec.containers[sglang].env[EXASERVE_RELEASE].value": ("v1", "v2"),
        "spec.template.spec.containers[sglang].image": ("lmsysorg/sglang:v0.5.23-cu126", NEW_IMAGE),
    }
    assert markdown.returncode == 0, markdown.stderr
    assert "**1 changed, 0 added, 0 removed**" in markdown.stdout
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
    assert "objects: 9 changed, 0 added, 0 removed (45 at base, 45 now)" in text
    assert "~ StatefulSet exaserve/sglang-g0  [fleet]\n      spec.replicas: 26 → 20\n" in text
    assert "~ PodDisruptionBudget exaserve/sglang-g1  [fleet]\n      spec.maxUnavailable: 2 → 1\n" in text
    assert "PodDisruptionBudget exaserve/sglang-g0" not in text, "group 0 keeps its budget of 2"
    assert "  replicas: 128 → 96 -32 (-25.0%)" in text
    assert "  rollout_group_sizes: [26, 26, 26, 25, 25] → [20, 19, 19, 19, 19]" in text


def test_diff_rejects_an_unknown_base(repo: Path) -> None:
    result = _exaserve(repo, "diff", "--stack", "dev", "--base", "no-such-branch")
    assert result.returncode == 2
    assert "--base 'no-such-branch' is not a commit" in result.stderr
    assert "Traceback" not in result.stderr


def test_render_includes_the_bare_metal_units(cli: CliRunner, tmp_path: Path) -> None:
    """`render` writes each replica's systemd unit, the router's argv/env and chrony.conf beside the objects;
    a second render replaces them."""
    from serving.plan.planner import fleet_replicas
    from serving.render import units
    from serving.spec.stack import load_stack

    out = tmp_path / "out"
    spec = load_stack("dev").spec
    for _ in range(2):
        result = cli.invoke(app, ["render", "--stack", "dev", "--out", str(out), "--json", "--no-validate"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["replica_units"] == 128
    replicas = fleet_replicas(spec)
    written = sorted(p.name for p in (out / "units").glob("*.service"))
    assert written == sorted(f"{r.id}.service" for r in replicas)
    assert (out / "units" / f"{replicas[5].id}.service").read_text() == units.systemd_unit(spec, replicas[5])
    router = json.loads((out / "units" / "router.json").read_text())
    assert router["argv"] == units.router_argv(spec)
    assert (out / "units" / "chrony.conf").read_text() == units.chrony_conf(spec)
