"""The runtime layer rendered: Kubernetes objects through the Pulumi program (schema-validated, promtool-checked and
policy-checked by the real `exaserve render`/`check`), the bare-metal units through strict `systemd-analyze verify`,
and every rendered command line parsed by the real `exaserve` parser."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.main import get_command

from serving.cli.commands import register
from serving.cli.options import app
from serving.render.k8s import gateway, runtime
from serving.render.router import router_args
from serving.render.runtime_units import (
    AGENT_UNIT,
    EXASERVE_BIN,
    agent_argv,
    agent_unit,
    controller_argv,
    controller_unit,
    controller_unit_name,
)
from serving.spec.stack import load_stack, load_stack_file
from tests.support.cli import exaserve, json_object
from tests.support.k8s import of_kind, one, render_file
from tests.support.paths import REPO
from tests.support.stacks import fleet_of
from tests.support.systemd import verify_unit

PROD = load_stack("prod").spec


def parses(argv: list[str]) -> None:
    """``exaserve ARGV`` is accepted by the real command parser (nothing runs)."""
    register(argv[0])
    group: Any = get_command(app)
    ctx = group.make_context("exaserve", list(argv), resilient_parsing=False)
    sub = group.get_command(ctx, argv[0])
    cmd = sub.get_command(ctx, argv[1])
    assert cmd is not None, argv
    cmd.make_context(argv[1], list(argv[2:]), parent=ctx)  # raises a usage error on an unknown flag


@pytest.fixture(scope="module")
def objects() -> list:  # type: ignore[type-arg]
    return render_file(REPO / "Pulumi.prod.yaml")


def test_controller_deployment_has_the_scheduler_instances_and_a_role_for_its_one_lease(objects: list) -> None:  # type: ignore[type-arg]
    deployment = one(objects, "Deployment", runtime.CONTROLLER)
    assert deployment["spec"]["replicas"] == PROD.scheduler.instances == 3
    role = one(objects, "Role", runtime.CONTROLLER_ROLE)
    named = [r for r in role["rules"] if r.get("resourceNames")]
    # a migration evicts a serving pod (within its budget) and reads it back: those pods by name, no delete, no list
    serving = [f"sglang-g{g}-{i}" for g, n in enumerate(fleet_of(PROD).plan.rollout_group_sizes) for i in range(n)]
    assert len(serving) == 2048
    assert named == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [PROD.runtime.lease_name],
            "verbs": ["get", "update"],
        },
        {"apiGroups": [""], "resources": ["pods"], "resourceNames": serving, "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "resourceNames": serving, "verbs": ["create"]},
    ]
    unnamed = [r for r in role["rules"] if not r.get("resourceNames")]
    assert unnamed == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]}]
    binding = one(objects, "RoleBinding", runtime.CONTROLLER_ROLE)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": runtime.CONTROLLER, "namespace": "exaserve"}]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["securityContext"]["runAsNonRoot"] and container["securityContext"]["readOnlyRootFilesystem"]
    parses([a.replace("$(POD_NAME)", "controller-0") for a in container["command"][1:]])
    command = container["command"]
    assert command[command.index("--backend") + 1] == "kubernetes"  # issue 24: `none` left every migration failing


def test_agent_daemonset_runs_on_the_serving_nodes_and_may_only_read_pods(objects: list) -> None:  # type: ignore[type-arg]
    ds = one(objects, "DaemonSet", runtime.AGENT)
    pod = ds["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == runtime.AGENT
    role = one(objects, "Role", f"{runtime.AGENT}-pods")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    command = pod["containers"][0]["command"]
    assert "--controller-service" in command
    parses([a.replace("$(NODE_NAME)", "gpu-r00-n00") for a in command[1:]])
    headless = one(objects, "Service", runtime.CONTROLLER)
    assert headless["spec"]["clusterIP"] == "None"
    assert one(objects, "Service", gateway.PODS_SERVICE)["spec"]["clusterIP"] == "None"


def test_the_stack_configmap_loads_back_to_the_same_spec(tmp_path: Path, objects: list) -> None:  # type: ignore[type-arg]
    text = one(objects, "ConfigMap", runtime.STACK_CONFIGMAP)["data"][runtime.STACK_FILE]
    path = tmp_path / runtime.STACK_FILE
    path.write_text(text)
    loaded = load_stack_file(path).spec
    assert loaded.model_dump(exclude={"model": {"hf_config"}}) == PROD.model_dump(exclude={"model": {"hf_config"}})


def test_alert_rules_name_the_runtime_metrics(objects: list) -> None:  # type: ignore[type-arg]
    rules = one(objects, "PrometheusRule", runtime.RULE_NAME)["spec"]["groups"][0]["rules"]
    names = {r["alert"] for r in rules}
    assert {"ExaServeNoControllerLeader", "ExaServeNodeSuspect", "ExaServeEvictionCapReached"} <= names
    exprs = " ".join(r["expr"] for r in rules)
    assert f"< {PROD.health.stop_routing_below}" in exprs
    monitors = of_kind(objects, "ServiceMonitor")
    assert any(m["metadata"]["name"] == runtime.CONTROLLER for m in monitors)


def test_render_and_check_validate_the_runtime_objects(tmp_path: Path) -> None:
    """The real pipeline: strict schemas (built-in kinds), the pinned CRDs (PrometheusRule, ServiceMonitor), promtool
    on every rule, and the policy pack — with the runtime objects in it."""
    rendered = exaserve("render", "--stack", "prod", "--out", str(tmp_path / "out"), "--json")
    doc = json_object(rendered)
    assert rendered.returncode == 0 and doc["problems"] == [], rendered.stdout[-2000:]
    assert doc["promtool"]["status"] == "pass"
    assert (tmp_path / "out" / "runtime").is_dir()
    checked = exaserve("check", "--stack", "prod", "--allow-tags", "--json")  # prod's digests: not yet published
    violations = [v for v in json_object(checked)["violations"] if "exaserve-" in v["subject"]]
    assert violations == [], json.dumps(violations)[:2000]


def test_bare_metal_units_pass_strict_systemd_verify(systemd_root: Path) -> None:
    stub = systemd_root / EXASERVE_BIN.lstrip("/")
    stub.parent.mkdir(parents=True, exist_ok=True)
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    routers = ["http://10.40.9.1:30000", "http://10.40.9.2:30000", "http://10.40.9.3:30000"]
    controllers = [f"http://10.40.9.{i}:{PROD.runtime.controller_port}" for i in (1, 2, 3)]
    units = {
        AGENT_UNIT: agent_unit(PROD, "prod", "gpu-000", controllers),
        controller_unit_name("c0"): controller_unit(PROD, "prod", "c0", routers),
    }
    for name, text in units.items():
        proc = verify_unit(systemd_root, name, text)
        assert proc.returncode == 0 and proc.stderr == "", f"{name}: {proc.stderr}"
        # finding 6 (clocks): ordered after time-sync.target (a synchronised clock), not chrony.service (a started one)
        [after] = [line.split("=", 1)[1].split() for line in text.splitlines() if line.startswith("After=")]
        assert "time-sync.target" in after and "chrony.service" not in after, (name, after)
    parses(agent_argv(PROD, "prod", "gpu-000", controllers)[1:])
    parses(controller_argv(PROD, "prod", "c0", routers)[1:])


def test_gateway_flags_meet_the_plan() -> None:
    """The router detects a dead or hung replica within interval × threshold (5 s × 3 = 15 s), lets a generation run
    as long as the longest the spec allows (⌈4,096 tokens ÷ 10 tokens/s + 2 s⌉ = 412 s: smg's timeout is total,
    streamed body included), and polls the load power_of_two reads every interval, not every 30 s."""
    argv = router_args(fleet_of(PROD), kubernetes=True).to_argv()

    def flag(name: str) -> str:
        return argv[argv.index(name) + 1]

    assert flag("--policy") == "power_of_two"
    assert flag("--worker-startup-check-interval") == "5"
    assert int(flag("--health-check-interval-secs")) * int(flag("--health-failure-threshold")) == 15
    assert flag("--request-timeout-secs") == "412"
    assert "--balance-abs-threshold" not in argv
    cache_aware = PROD.model_copy(update={"scheduler": PROD.scheduler.model_copy(update={"strategy": "cache_aware"})})
    argv = router_args(fleet_of(cache_aware), kubernetes=True).to_argv()
    assert argv[argv.index("--balance-rel-threshold") + 1] == "1.5"
    assert argv[argv.index("--balance-abs-threshold") + 1] == "4"  # ⌈0.5 × 8 in-flight requests⌉


def test_bad_controller_and_agent_input_exits_2_naming_the_fix() -> None:
    agent = exaserve("agent", "run", "--stack", "prod", "--node", "nowhere", "--controller", "http://127.0.0.1:1")
    assert agent.returncode == 2 and "--node nowhere" in agent.stderr and "Traceback" not in agent.stderr
    service = exaserve("agent", "run", "--stack", "prod", "--node", "gpu-r00-n00", "--controller-service", "nohostport")
    assert service.returncode == 2 and "HOST:PORT" in service.stderr
    booted = exaserve(
        "agent", "run", "--stack", "prod", "--node", "gpu-r00-n00", "--controller", "http://127.0.0.1:1",
        "--simulated-boot", "/nonexistent/boot.json",
    )  # fmt: skip
    assert booted.returncode == 2 and "--simulated-boot /nonexistent/boot.json" in booted.stderr, booted.stderr
    assert "boot_id and booted_at_ns" in booted.stderr and "Traceback" not in booted.stderr
    status = exaserve("status", "--stack", "prod", "--json")
    assert status.returncode == 2 and json_object(status)["ok"] is False
    assert "--controller" in json_object(status)["error"]
    unreachable = exaserve("status", "--stack", "prod", "--controller", "http://127.0.0.1:9", "--json")
    assert unreachable.returncode == 1 and "no controller answered" in json_object(unreachable)["error"]
