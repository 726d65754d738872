"""The fault drills as Chaos Mesh experiments (serving/render/k8s/chaos.py, `exaserve drill --render-only`): every
object validated against the pinned Chaos Mesh CRDs (../shared/crds), selectors that pick exactly the pods the
fleet's renderers label (read from the Pulumi program's own output), sizes from the catalogue, and a render that
fails — exit 1 naming the object and the field, nothing written — when a CRD rejects what was rendered.

No Kubernetes API server or Chaos Mesh controller runs here: the CRDs' openAPIV3Schema (made strict, as the API
server would prune unknown fields) stands in for the API server's admission."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from serving.drill.scenarios import SCENARIOS, TargetName, fault_sizes, plan_targets
from serving.pulumi.program import RenderedObject
from serving.pulumi.validate import Validator
from serving.render.k8s import chaos
from serving.render.k8s.common import LABEL_NAME
from serving.render.k8s.container import LWS_LEADER_LABEL
from serving.spec.schema import FleetSpec
from serving.spec.stack import load_stack
from tests.support.cli import exaserve, flat, json_object
from tests.support.k8s import crd_dir, render_file
from tests.support.paths import REPO
from tests.support.stacks import MULTI_NODE, fleet_of, spec_from, write_variant

STACKS = ["prod", "dev", "sandbox"]


def _objects(spec: FleetSpec) -> list[dict[str, Any]]:
    fl = fleet_of(spec)
    found = [o for e in chaos.experiments(fl) if isinstance(e, chaos.Experiment) for o in e.objects]
    return [*found, chaos.schedule(fl)]


def _validator(spec: FleetSpec, crds: Path | None = None) -> Validator:
    return Validator(spec.kubernetes.version, crds or crd_dir())


@pytest.mark.parametrize("stack", STACKS)
def test_every_experiment_and_the_schedule_pass_the_chaos_mesh_crds(stack: str) -> None:
    spec = load_stack(stack).spec
    objects = _objects(spec)
    assert {o["kind"] for o in objects} == {"PodChaos", "NetworkChaos", "StressChaos", "Schedule"}
    assert _validator(spec).validate_all(objects) == []
    assert {o["metadata"]["namespace"] for o in objects} == {spec.kubernetes.namespace}
    names = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert len(names) == len(set(names)), "two objects of one kind and name: applying one would replace the other"


def test_a_multi_node_fleet_and_a_scheduled_double_fault_validate_too(tmp_path: Path) -> None:
    spec = spec_from("prod", drills__scheduled=["double-fault", "node-loss"], **{k: v for k, v in MULTI_NODE.items()})
    fl = fleet_of(spec)
    p = fl.plan
    assert p.multi_node
    objects = _objects(spec)
    assert _validator(spec).validate_all(objects) == []
    crash = chaos.experiment(SCENARIOS["replica-crash"], fl)
    assert isinstance(crash, chaos.Experiment)
    # the server of a multi-node replica is its leader pod: a worker pod has no HTTP server to crash
    assert crash.objects[0]["spec"]["selector"]["labelSelectors"][LWS_LEADER_LABEL[0]] == LWS_LEADER_LABEL[1]
    templates = {t["name"]: t for t in objects[-1]["spec"]["workflow"]["templates"]}
    assert templates["double-fault"] == {
        "name": "double-fault",
        "templateType": "Parallel",
        "children": ["double-fault-replica", "double-fault-controller"],
    }
    assert templates["double-fault-controller"]["podChaos"]["action"] == "pod-kill"


# ------------------------------------------------------------------------------------------ the pods they select


def _pod_templates(objects: list[RenderedObject]) -> dict[tuple[str, str], tuple[str, dict[str, str]]]:
    """(kind, name) of each workload → (namespace, its pods' labels), from the Pulumi program's objects."""
    out = {}
    for o in objects:
        if o.kind in ("Deployment", "DaemonSet", "StatefulSet"):
            out[(o.kind, o.name)] = (o.namespace or "", o.obj["spec"]["template"]["metadata"]["labels"])
        elif o.kind == "LeaderWorkerSet":
            template = o.obj["spec"]["leaderWorkerTemplate"]
            leader = template.get("leaderTemplate", template["workerTemplate"])
            out[(o.kind, o.name)] = (o.namespace or "", leader["metadata"]["labels"])
    return out


def _selects(selector: dict[str, Any], namespace: str, pod: dict[str, str]) -> bool:
    if namespace not in selector["namespaces"]:
        return False
    wanted = {k: v for k, v in selector.get("labelSelectors", {}).items() if k != LWS_LEADER_LABEL[0]}
    if any(pod.get(k) != v for k, v in wanted.items()):
        return False
    return all(pod.get(e["key"]) in e["values"] for e in selector.get("expressionSelectors", []))


@pytest.fixture(scope="module")
def prod_program() -> list[RenderedObject]:
    return render_file(REPO / "Pulumi.prod.yaml")


EXPECTED_WORKLOADS = {
    "replica-crash": {"sglang"},
    "replica-hang": {"sglang"},
    "replica-slow": {"sglang"},
    "memory-pressure": {"sglang"},
    "network-jitter": {"sglang"},
    "node-loss": {"sglang", "exaserve-agent"},
    "router-loss": {"sglang-router"},
    "leader-loss": {"exaserve-controller"},
    "double-fault": {"sglang", "exaserve-controller"},
}


def test_each_experiment_selects_exactly_the_pods_the_renderers_label(prod_program: list[RenderedObject]) -> None:
    spec = load_stack("prod").spec
    fl = fleet_of(spec)
    workloads = _pod_templates(prod_program)
    nodes = {o.name: o.obj["metadata"]["labels"] for o in prod_program if o.kind == "Node"}
    for name, expected in EXPECTED_WORKLOADS.items():
        found = chaos.experiment(SCENARIOS[name], fl)  # type: ignore[index]
        assert isinstance(found, chaos.Experiment), name
        hit = set()
        for obj in found.objects:
            selector = obj["spec"]["selector"]
            chosen = {key for key, (ns, pod) in workloads.items() if _selects(selector, ns, pod)}
            assert chosen, f"{name}: {obj['metadata']['name']} selects no rendered pods"
            hit |= {workloads[key][1][LABEL_NAME] for key in chosen}
            for node in selector.get("nodes", []):  # a node of the inventory, in a serving pool
                assert node in nodes and nodes[node]["exaserve.io/pool"] in [pl.name for pl in spec.cluster.pools]
        assert hit == expected, name
    sglang = {k for k, (_, pod) in workloads.items() if pod.get(LABEL_NAME) == "sglang"}
    assert len(sglang) == spec.rollout.batches  # the serving selector spans every update group


def test_held_faults_last_the_hold_and_instant_ones_have_no_duration() -> None:
    spec = load_stack("prod").spec
    fl = fleet_of(spec)
    sizes = fault_sizes(fl)
    hold = f"{sizes.hold_s.value:g}s"
    durations = {}
    for e in chaos.experiments(fl):
        if isinstance(e, chaos.Experiment):
            durations[e.scenario] = [o["spec"].get("duration") for o in e.objects]
    assert durations["replica-crash"] == [None] and durations["leader-loss"] == [None]
    assert durations["double-fault"] == [None, None]
    for held in ("replica-hang", "replica-slow", "memory-pressure", "network-jitter", "node-loss", "router-loss"):
        assert durations[held] == [hold], held
    jitter = chaos.experiment(SCENARIOS["network-jitter"], fl)
    assert isinstance(jitter, chaos.Experiment)
    assert jitter.objects[0]["spec"]["delay"] == {"latency": "1000ms", "jitter": "1000ms"}  # 3 s timeout / 3 each
    slow = chaos.experiment(SCENARIOS["replica-slow"], fl)
    assert isinstance(slow, chaos.Experiment) and slow.objects[0]["spec"]["delay"] == {"latency": "6000ms"}


def test_error_burst_is_not_rendered_and_says_why() -> None:
    spec = load_stack("prod").spec
    found = chaos.experiment(SCENARIOS["error-burst"], fleet_of(spec))
    assert isinstance(found, chaos.NotRendered)
    assert "HTTPChaos" in found.reason and "not among the pinned CRDs" in found.reason
    assert not any(p.name.endswith("httpchaos.yaml") for p in crd_dir().iterdir())  # still true of the mirror


def test_the_schedule_runs_the_regular_drills_in_turn_with_time_to_restore() -> None:
    spec = load_stack("prod").spec
    fl = fleet_of(spec)
    schedule = chaos.schedule(fl)
    assert schedule["spec"]["schedule"] == spec.drills.schedule and schedule["spec"]["type"] == "Workflow"
    assert schedule["spec"]["concurrencyPolicy"] == "Forbid"
    templates = {t["name"]: t for t in schedule["spec"]["workflow"]["templates"]}
    serial = templates[schedule["spec"]["workflow"]["entry"]]
    names = list(spec.drills.scheduled)
    assert serial["children"] == [n for name in names for n in (name, f"settle-{name}")]
    restore = plan_targets(fl)[TargetName.RESTORATION].value
    assert {templates[f"settle-{n}"]["deadline"] for n in names} == {f"{restore:g}s"}
    assert templates["network-jitter"]["networkChaos"]["action"] == "delay"
    assert "duration" not in templates["memory-pressure"]["stressChaos"]  # a workflow step lasts its deadline


# ------------------------------------------------------------------------------------------ a render that can fail


@pytest.mark.parametrize(
    ("scenario", "breaking", "path", "message"),
    [
        ("replica-slow", ("delay", {"latency": "6 seconds"}), "spec.delay.latency", "does not match"),
        ("replica-crash", ("action", "pod-crash"), "spec.action", "is not one of"),
        ("memory-pressure", ("stressors", {"memory": {"size": "1GiB"}}), "spec.stressors.memory", "'workers'"),
        ("router-loss", ("actions", "pod-kill"), "spec", "Additional properties are not allowed"),
    ],
)
def test_a_broken_object_is_rejected_naming_the_object_and_the_field(
    scenario: str, breaking: tuple[str, Any], path: str, message: str
) -> None:
    spec = load_stack("prod").spec
    found = chaos.experiment(SCENARIOS[scenario], fleet_of(spec))  # type: ignore[index]
    assert isinstance(found, chaos.Experiment)
    broken = copy.deepcopy(found.objects[0])
    broken["spec"][breaking[0]] = breaking[1]
    problems = _validator(spec).problems(broken)
    assert [p.path for p in problems] == [path], problems
    assert message in problems[0].message
    assert str(problems[0]).startswith(f"{broken['kind']} exaserve/exaserve-drill-{scenario}: {path}: ")


def test_a_schedule_with_a_broken_workflow_step_is_rejected() -> None:
    spec = load_stack("prod").spec
    schedule = chaos.schedule(fleet_of(spec))
    del schedule["spec"]["workflow"]["templates"][1]["templateType"]
    problems = _validator(spec).problems(schedule)
    assert [(p.path, p.message) for p in problems] == [
        ("spec.workflow.templates.1", "'templateType' is a required property")
    ]


def _older_chaos_mesh(tmp_path: Path) -> Path:
    """A CRD directory from a Chaos Mesh whose PodChaos knows no container-kill (the user's own file beside the
    other pinned ones)."""
    crds = tmp_path / "crds"
    crds.mkdir()
    for path in crd_dir().glob("*.yaml"):
        if path.name != "chaos-mesh.org_podchaos.yaml":
            shutil.copy(path, crds / path.name)
    doc = yaml.safe_load((crd_dir() / "chaos-mesh.org_podchaos.yaml").read_text())
    action = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["action"]
    action["enum"] = ["pod-kill", "pod-failure"]
    (crds / "older-podchaos.yaml").write_text(yaml.safe_dump(doc))
    return crds


def test_render_exits_1_naming_the_object_and_field_a_crd_rejects_and_writes_nothing(tmp_path: Path) -> None:
    out, crds = tmp_path / "drills", _older_chaos_mesh(tmp_path)
    args = ["--stack", "prod", "--render-only", "--out", str(out), "--crd-dir", str(crds)]
    r = exaserve("drill", *args)
    assert r.returncode == 1, r.stdout + r.stderr
    text = flat(r.stdout)
    assert "✗ PodChaos exaserve/exaserve-drill-replica-crash: spec.action: 'container-kill' is not one of" in text
    assert "✗ PodChaos exaserve/exaserve-drill-double-fault-replica: spec.action:" in text
    assert "nothing written" in text and not out.exists()
    j = exaserve("drill", "--json", *args)
    doc = json_object(j)
    assert j.returncode == 1 and doc["ok"] is False
    assert {(p["resource"], p["path"]) for p in doc["problems"]} == {
        ("PodChaos exaserve/exaserve-drill-replica-crash", "spec.action"),
        ("PodChaos exaserve/exaserve-drill-double-fault-replica", "spec.action"),
        ("PodChaos exaserve/exaserve-drill-router-and-replica-loss-replica", "spec.action"),
    }


def test_render_exits_1_for_a_kind_the_crd_directory_lacks(tmp_path: Path) -> None:
    crds = tmp_path / "crds"
    crds.mkdir()
    for path in crd_dir().glob("chaos-mesh.org_*.yaml"):
        if "networkchaos" not in path.name:
            shutil.copy(path, crds / path.name)
    r = exaserve("drill", "--stack", "dev", "--render-only", "--out", str(tmp_path / "o"), "--crd-dir", str(crds))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "✗ NetworkChaos exaserve/exaserve-drill-replica-hang: (root): no schema for NetworkChaos" in flat(r.stdout)


# ------------------------------------------------------------------------------------------ exaserve drill --render-only


def test_render_only_writes_one_file_per_scenario_the_schedule_and_an_index(tmp_path: Path) -> None:
    out = tmp_path / "drills"
    r = exaserve("drill", "--json", "--stack", "prod", "--render-only", "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json_object(r)
    assert doc["ok"] is True and doc["problems"] == [] and doc["crd_dir"] == str(crd_dir())
    assert [e["scenario"] for e in doc["not_rendered"]] == [
        "scheduler-wedged",
        "replica-flapping",
        "error-burst",
        "generation-errors",
        "node-stall",
    ]
    spec = load_stack("prod").spec
    fl = fleet_of(spec)
    for entry in doc["experiments"]:
        written = list(yaml.safe_load_all((out / entry["file"]).read_text()))
        rendered = chaos.experiment(SCENARIOS[entry["scenario"]], fl)
        assert isinstance(rendered, chaos.Experiment) and written == list(rendered.objects), entry["scenario"]
    assert yaml.safe_load((out / "schedule.yaml").read_text()) == chaos.schedule(fl)
    assert sorted(f.name for f in (out / "experiments").iterdir()) == sorted(
        f"{e['scenario']}.yaml" for e in doc["experiments"]
    )
    assert json.loads((out / "drills.json").read_text())["schedule"]["scenarios"] == spec.drills.scheduled
    again = exaserve("drill", "--stack", "prod", "--render-only", "--out", str(out), "--scenario", "node-loss")
    assert again.returncode == 0, again.stderr  # a previous drill render is replaced
    assert [f.name for f in (out / "experiments").iterdir()] == ["node-loss.yaml"]


def test_a_scheduled_scenario_chaos_mesh_cannot_run_exits_2_naming_it(tmp_path: Path) -> None:
    stack = write_variant(tmp_path, "burst", changes={"drills.scheduled": ["replica-crash", "error-burst"]})
    r = exaserve("drill", "--stack-file", str(stack), "--render-only", "--out", str(tmp_path / "o"))
    assert r.returncode == 2, r.stdout + r.stderr
    message = flat(r.stderr)
    assert "drills.scheduled names error-burst, which Chaos Mesh cannot run" in message
    assert "remove it from drills.scheduled" in message and "Traceback" not in r.stderr


def test_render_only_refuses_a_directory_holding_something_else(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    r = exaserve("drill", "--stack", "dev", "--render-only", "--out", str(tmp_path))
    assert r.returncode == 2
    assert "is not empty and holds no previous drill render (drills.json); pass an empty directory" in flat(r.stderr)
    assert (tmp_path / "precious.txt").read_text() == "keep me"
