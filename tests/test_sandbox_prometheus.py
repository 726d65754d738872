"""A REAL Prometheus (Debian's ``prometheus`` 2.42) in the sandbox: `exaserve sandbox up` with ``sandbox.prometheus``
and the runtime on starts it beside the REAL router (2 instances), simulated SGLang workers (2 nodes × 2), the agents,
2 controllers and a REAL etcd; it scrapes what the rendered ServiceMonitors describe and evaluates the rendered alert
rules every heartbeat (1 s). A fault is a real SIGKILL to a worker's process; `sandbox down` stops Prometheus too.

Expected timeline of a killed worker (heartbeat 1 s, 3 failures, score −5/+1, stop routing below 60): the leader takes
it out of rotation at its 9th failed probe (≈ 9 s) and migrates it at the 15th (≈ 15 s); it is back after warm-up.
``ExaServeReplicaOutOfRotation`` holds for 3 × 1 s (``for:`` = failure threshold × heartbeat), so it fires ≈ 12 s after
the kill, while the replica is still out.

The configuration and rule checks at the end need promtool only (no process, no lock).
"""

from __future__ import annotations

import copy
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from serving.prometheus_api import FiredAlert, PrometheusError, alerts_fired, query
from serving.render.k8s import monitoring, runtime
from serving.render.k8s.common import ROUTER_APP, SERVING_APP
from serving.sandbox.backend import worker_name
from serving.sandbox.processes import SandboxError, StateDir, free_port, free_port_block
from serving.sandbox.prometheus import (
    NAME,
    Pod,
    prometheus_url,
    rendered_objects,
    sandbox_pods,
    scrape_configs,
    write_config,
)
from serving.spec.schema import FleetSpec
from serving.spec.stack import load_stack_file
from tests.support.ci import require_prometheus
from tests.support.cli import json_object
from tests.support.etcd import require_etcd
from tests.support.patience import wait_until
from tests.support.sandbox import Sandbox, running_sandbox
from tests.support.stacks import fleet_of, request_timeout_of, sandbox_stack_file

INTERVAL_S = 1.0
CHANGES = {
    "sandbox.prometheus": True,
    "sandbox.runtime": True,
    "cluster.pools.0.count": 2,
    "serving.replicas_per_node": 2,
    "serving.heartbeat_interval_s": INTERVAL_S,
    **request_timeout_of(3),  # its detection window (3 × 1 s), as before the timeout fit a generation
    "serving.health_check_timeout_s": 0.5,
    "scheduler.instances": 2,
    "runtime.lease_ttl_s": 3,
    "runtime.max_eviction_share": 0.25,
}


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    require_prometheus()
    require_etcd()
    base = free_port_block(40)
    changes = {
        **CHANGES,
        "sandbox.worker_base_port": base,
        "sandbox.router_port": base + 8,
        "sandbox.prometheus_port": base + 9,
        "sandbox.runtime_base_port": base + 10,
    }
    with running_sandbox(tmp_path_factory.mktemp("prometheus"), replicas=4, changes=changes) as sb:
        yield sb


def test_every_target_the_monitors_describe_is_scraped_and_up(sandbox: Sandbox) -> None:
    """`up` per target: both routers' metrics listeners, the 4 workers, the 2 controllers, labelled as
    prometheus-operator labels them, so the rendered rules' selectors find the series."""
    prom = prometheus_url(sandbox.spec)
    ns = sandbox.spec.kubernetes.namespace
    up = {(s.labels["job"], s.labels["pod"]): s.value for s in query(prom, "up")}
    replicas = [r.id for r in fleet_of(sandbox.spec).plan.replicas]
    expected = {
        ("sglang-router", "router"),
        ("sglang-router", "router-1"),
        # a PodMonitor's job is "<namespace>/<name>" (prometheus-operator), one target per serving pod
        *((f"{ns}/sglang-workers", rid) for rid in replicas),
        ("exaserve-controller", "controller-0"),
        ("exaserve-controller", "controller-1"),
    }
    assert set(up) == expected, up
    assert all(v == 1 for v in up.values()), up
    # the rules select on namespace and service: the router's and the controllers' series carry them
    health = query(prom, f'smg_worker_health{{namespace="{ns}",service="{ROUTER_APP}"}}')
    assert {s.labels["pod"] for s in health} == {"router", "router-1"}
    assert len(health) == 2 * len(replicas)
    leaders = query(prom, "sum(exaserve_runtime_leader)")
    assert [s.value for s in leaders] == [1.0]
    # every rendered rule group is loaded
    groups = httpx.get(prom + "/api/v1/rules", timeout=5).json()["data"]["groups"]
    objects = rendered_objects(fleet_of(sandbox.spec))
    rendered = [g["name"] for o in objects if o["kind"] == "PrometheusRule" for g in o["spec"]["groups"]]
    assert sorted(g["name"] for g in groups) == sorted(rendered)
    assert all(r["health"] == "ok" for g in groups for r in g["rules"]), groups


def test_a_killed_worker_fires_the_out_of_rotation_alert_with_its_time(sandbox: Sandbox) -> None:
    prom = prometheus_url(sandbox.spec)
    rid = fleet_of(sandbox.spec).plan.replicas[1].id  # the sandbox's configs are in replica order
    record = sandbox.processes.read(worker_name(sandbox.configs[1].port))
    assert record is not None
    # A settled fleet first: no alert pending or firing now. Not "none fired since it came up": a loaded machine may
    # start a node's agent late enough for ExaServeNodeSuspect to fire and resolve while the sandbox comes up (a CI
    # run here), which is that alert doing its job, and the alert this test judges is one that became active after
    # the kill (below).
    wait_until(lambda: not query(prom, "ALERTS"), what="no alert pending or firing", seen=lambda: query(prom, "ALERTS"))
    killed_at = time.time()
    os.kill(record.pid, signal.SIGKILL)

    def fired() -> list[FiredAlert]:
        return [
            a
            for a in alerts_fired(prom, killed_at)
            if a.alertname == "ExaServeReplicaOutOfRotation" and a.labels.get("replica") == rid
        ]

    def every() -> list[tuple[str, dict[str, str], float]]:
        return [(a.alertname, dict(a.labels), round(a.fired_at - killed_at, 1)) for a in alerts_fired(prom, killed_at)]

    found = wait_until(fired, what=f"ExaServeReplicaOutOfRotation to fire for {rid}", every_s=0.5, seen=every)
    alert = found[0]
    hold_s = sandbox.spec.serving.failure_threshold * sandbox.spec.serving.heartbeat_interval_s
    print(
        f"kill → out-of-rotation active {alert.active_at - killed_at:.1f} s, firing {alert.fired_at - killed_at:.1f} s;"
        f" all fired: {every()}"
    )
    assert killed_at < alert.active_at < alert.fired_at
    held_s = alert.fired_at - alert.active_at  # Prometheus's own timestamps
    assert held_s >= hold_s - INTERVAL_S  # not a timing judgment: a lower bound, its `for:` held (to one evaluation)
    assert alert.labels["severity"] == "warning"
    # the scrape saw the process die: its target was down after the kill
    down = query(prom, f'min_over_time(up{{pod="{rid}"}}[{round(time.time() - killed_at) + 1}s])')
    assert [s.value for s in down] == [0.0]


def test_a_bad_query_and_an_absent_server_are_reported_with_the_url(sandbox: Sandbox) -> None:
    prom = prometheus_url(sandbox.spec)
    with pytest.raises(PrometheusError, match=r"refused 'sum\(up': .*parse error"):
        query(prom, "sum(up")
    nobody = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(PrometheusError, match=f"Prometheus at {nobody} did not answer /api/v1/query"):
        query(nobody, "up")


def test_sandbox_down_stops_prometheus_and_leaves_no_record(sandbox: Sandbox) -> None:
    """Runs last in this module: the fixture's own `sandbox down` then finds nothing to stop."""
    state = StateDir(sandbox.paths.sandbox_dir)
    record = state.read(NAME)
    assert record is not None and record.kind == "prometheus"
    down = sandbox.cli("sandbox", "down", "--json")
    assert down.returncode == 0, down.stdout + down.stderr
    assert NAME in json_object(down)["stopped"]
    stat = Path(f"/proc/{record.pid}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z", "prometheus still runs"
    assert state.records() == []
    with pytest.raises(PrometheusError):
        query(prometheus_url(sandbox.spec), "up")


# ----- configuration and rules, checked without starting anything (promtool only) ----------------------------------
Rendered = tuple[FleetSpec, list[dict[str, Any]], dict[str, list[Pod]]]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    """The test stack's rendered objects and the processes its sandbox would run (ports fixed: nothing starts)."""
    require_prometheus()
    path = sandbox_stack_file(tmp_path_factory.mktemp("stack"), ports_base=41000, replicas=4, changes=CHANGES)
    spec = load_stack_file(path).spec
    fl = fleet_of(spec)
    return spec, rendered_objects(fl), sandbox_pods(fl)


def test_scrape_jobs_follow_the_rendered_monitors(rendered: Rendered) -> None:
    spec, objects, pods = rendered
    sb = spec.sandbox
    assert sb is not None
    jobs = {j["job_name"]: j for j in scrape_configs(objects, pods)}
    monitors = [o for o in objects if o["kind"] == "ServiceMonitor"]
    pod_monitors = [o for o in objects if o["kind"] == "PodMonitor"]
    assert sorted(jobs) == sorted(
        [f"serviceMonitor/{m['metadata']['namespace']}/{m['metadata']['name']}/0" for m in monitors]
        + [f"podMonitor/{m['metadata']['namespace']}/{m['metadata']['name']}/0" for m in pod_monitors]
    )
    for m in monitors:
        job = jobs[f"serviceMonitor/{m['metadata']['namespace']}/{m['metadata']['name']}/0"]
        assert job["metrics_path"] == m["spec"]["endpoints"][0]["path"]
        assert {c["labels"]["endpoint"] for c in job["static_configs"]} == {m["spec"]["endpoints"][0]["port"]}
    router_targets = [
        c["targets"][0] for c in jobs[f"serviceMonitor/{spec.kubernetes.namespace}/{ROUTER_APP}/0"]["static_configs"]
    ]
    assert router_targets[0] == f"127.0.0.1:{sb.prometheus_port}"  # router 0's metrics listener
    workers = jobs[f"podMonitor/{spec.kubernetes.namespace}/sglang-workers/0"]["static_configs"]
    assert [c["targets"][0] for c in workers] == [
        f"127.0.0.1:{sb.worker_base_port + i}" for i in range(len(pods[SERVING_APP]))
    ]


def test_a_monitor_port_nobody_names_is_reported(rendered: Rendered) -> None:
    _spec, objects, pods = rendered
    broken = copy.deepcopy(objects)
    mon = next(o for o in broken if o["kind"] == "ServiceMonitor" and o["metadata"]["name"] == ROUTER_APP)
    mon["spec"]["endpoints"][0]["port"] = "prom"
    with pytest.raises(
        SandboxError, match=r"ServiceMonitor exaserve/sglang-router scrapes port 'prom', but no Service"
    ):
        scrape_configs(broken, pods)


def test_a_port_the_sandbox_processes_lack_is_reported(rendered: Rendered) -> None:
    _spec, objects, pods = rendered
    without = {**pods, ROUTER_APP: [Pod(p.name, {"http": p.ports["http"]}) for p in pods[ROUTER_APP]]}
    with pytest.raises(SandboxError, match=r"scrapes port 'metrics', which the sandbox's router does not listen on"):
        scrape_configs(objects, without)
    with pytest.raises(
        SandboxError, match=r"selects pods app.kubernetes.io/name=exaserve-controller, which the sandbox"
    ):
        scrape_configs(objects, {k: v for k, v in pods.items() if k != runtime.CONTROLLER})


def test_a_broken_rule_stops_the_start_with_promtools_words(rendered: Rendered, tmp_path: Path) -> None:
    spec, objects, pods = rendered
    broken = copy.deepcopy(objects)
    rule = next(o for o in broken if o["kind"] == "PrometheusRule" and o["metadata"]["name"] == monitoring.RULE_NAME)
    rule["spec"]["groups"][0]["rules"][0]["expr"] = "sum(rate(x[5m])) < 0.8 * (sum(rate(x[5m])) offset 25m)"
    with pytest.raises(SandboxError, match=r"(?s)promtool check config rejected.*ExaServeRolloutQpsDrop.*offset"):
        write_config(tmp_path, spec, broken, pods)
    assert write_config(tmp_path / "good", spec, objects, pods).exists()
