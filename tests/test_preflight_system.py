"""Preflight of the system pool (issue 25, finding 6) for real: ansible-playbook preflight.yml over SSH test hosts,
one GPU node and two system-pool nodes. The inventory plugin puts the system nodes in their own group
(exaserve_system, outside exaserve: no GPU probe runs there); the preflight_system role reads each node's online
CPUs (getconf), /proc/meminfo and the kubelet's flags file, and checks them against cluster.system_pool.

Real: sshd per node, the machine's CPUs and memory as the nodes see them, a kubelet flags file in one node's own
mount namespace registering the GPU taint (HostFaults.kubelet_flags).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from serving.spec.stack import load_stack_file
from tests.support.hosts.faults import HostFaults
from tests.support.hosts.netns import HostFleet, HostPool
from tests.support.preflight import (
    ModelStore,
    fleet_stack_doc,
    install_container_stubs,
    model_store,
    run_playbook,
    write_inventory,
)
from tests.support.stacks import write_stack

pytestmark = pytest.mark.slow

GPU_TAINT_FLAGS = "--node-ip=10.0.0.1 --register-with-taints=nvidia.com/gpu=present:NoSchedule"


@pytest.fixture(scope="module")
def fleet(ssh_hosts: HostPool) -> HostFleet:
    hosts = ssh_hosts(3, {"node03": HostFaults(kubelet_flags=GPU_TAINT_FLAGS)})
    install_container_stubs(hosts)
    return hosts


def _preflight(fleet: HostFleet, directory: Path, cpu: float, memory_gb: float) -> tuple[dict[str, Any], str]:
    """preflight.yml (tag system) on a stack whose GPU pool is node01 and whose system pool is node02, node03."""
    with model_store() as store:
        return _run(fleet, store, directory, cpu, memory_gb)


def _run(
    fleet: HostFleet, store: ModelStore, directory: Path, cpu: float, memory_gb: float
) -> tuple[dict[str, Any], str]:
    first, system = fleet.hosts[0], fleet.hosts[1]
    subnet = first.address.rsplit(".", 1)[0] + ".0/24"
    doc = fleet_stack_doc(
        fleet,
        store,
        racks=1,
        cluster={
            "pools": [{"name": "tn", "count": 1, "subnet": subnet, "first_address": first.address}],
            "system_pool": {
                "count": 2,
                "subnet": subnet,
                "first_address": system.address,
                "cpu": cpu,
                "memory_gb": memory_gb,
            },
        },
    )
    stack = write_stack(directory / "Pulumi.test.yaml", doc)
    spec = load_stack_file(stack).spec
    by_address = {h.address: h.name for h in fleet.hosts}
    names = {by_address[str(n.address)]: n.name for n in (*spec.cluster.nodes, *spec.cluster.system_nodes)}
    inventory = write_inventory(directory, stack, fleet)
    run = run_playbook(
        "preflight.yml",
        inventory,
        directory,
        "--tags",
        "system",
        "-e",
        f"preflight_report_path={directory}/report.json",
    )
    assert (directory / "report.json").exists(), run.output[-4000:]
    report = json.loads((directory / "report.json").read_text())
    return {host: report["hosts"][spec_name] for host, spec_name in names.items()}, run.output


def test_system_nodes_are_checked_and_a_gpu_taint_is_named(fleet: HostFleet, tmp_path: Path) -> None:
    hosts, output = _preflight(fleet, tmp_path, cpu=1, memory_gb=0.5)
    # The GPU node is in the run (reachable), but none of the system checks runs there.
    assert hosts["node01"]["status"] == "pass" and set(hosts["node01"]["checks"]) == {"ssh"}
    system = {"ssh", "system_cpu", "system_memory", "system_untainted"}
    assert hosts["node02"]["status"] == "pass" and set(hosts["node02"]["checks"]) == system, hosts["node02"]
    assert hosts["node02"]["checks"]["system_untainted"]["observed"].startswith("no /etc/default/kubelet")
    tainted = hosts["node03"]
    assert tainted["failed_checks"] == ["system_untainted"], tainted
    check = tainted["checks"]["system_untainted"]
    assert check["observed"] == "kubelet registers with taints nvidia.com/gpu=present:NoSchedule"
    assert check["fix"].startswith(
        "Remove the nvidia.com/gpu taint from --register-with-taints in /etc/default/kubelet"
    )
    assert "system_untainted" in output


def test_system_nodes_smaller_than_the_spec_fail_with_their_figures(fleet: HostFleet, tmp_path: Path) -> None:
    cpus = os.sysconf("SC_NPROCESSORS_ONLN")
    hosts, _ = _preflight(fleet, tmp_path, cpu=cpus + 1, memory_gb=1_000_000)
    for host in ("node02", "node03"):
        checks = hosts[host]["checks"]
        assert checks["system_cpu"]["status"] == "fail" and checks["system_cpu"]["observed"] == f"{cpus} CPUs online"
        assert checks["system_cpu"]["expected"].startswith(f">= {cpus + 1}")
        assert checks["system_memory"]["status"] == "fail" and checks["system_memory"]["observed"].startswith(
            "MemTotal "
        )
        assert "set cluster.system_pool.memory_gb" in checks["system_memory"]["fix"]
