"""The SSH test hosts are real: real sshd per network namespace, host keys verified, faults made
by real mechanisms (routes, personality, mounts), and the custom probe modules run on them over
SSH with `ansible`. Only nvidia-smi/ibstat/chronyc are stubs (no GPU, HCA or NTP server here)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import paramiko
import pytest

from tests.support.hosts.collection import COLLECTIONS_DIR, load
from tests.support.hosts.faults import HostFaults
from tests.support.hosts.netns import HostFleet, HostPool, SshHost
from tests.support.hosts.ssh import connect, failed_connect
from tests.support.hosts.stubs import sample
from tests.support.patience import finishes

MIXED_FAULTS = {
    "node02": HostFaults(ib_down=("mlx5_3",)),
    "node03": HostFaults(ib_rate_gbps=200),
    "node04": HostFaults(clock_offset_s=0.25),
    "node05": HostFaults(old_kernel=True, cgroup_v2=False),
    "node06": HostFaults(unreachable=True),
    "node07": HostFaults(missing_tools=("nvidia-smi", "ibstat", "chronyc")),
    "node08": HostFaults(gpu_count=7, chrony="unsynchronised"),
    "node09": HostFaults(nvidia_driver_failed=True, chrony="stopped"),
}


@pytest.fixture(scope="module")
def mixed(ssh_hosts: HostPool) -> HostFleet:
    """Nine hosts: node01 healthy, node02..node09 one kind of fault each (MIXED_FAULTS)."""
    return ssh_hosts(9, MIXED_FAULTS)


def run(host: SshHost, command: str) -> tuple[int, str, str]:
    """Run `command` on `host` over a host-key-verified SSH connection."""
    with connect(host) as client:
        _, stdout, stderr = client.exec_command(command, timeout=10)
        out, err = stdout.read().decode(), stderr.read().decode()
        return stdout.channel.recv_exit_status(), out, err


def test_sixteen_hosts_each_is_its_own_machine(ssh_hosts: HostPool) -> None:
    fleet = ssh_hosts(16)  # bring-up time is measured in bench/preflight_bench.py, not asserted here

    def identity(host: SshHost) -> tuple[str, str]:
        rc, out, err = run(host, "hostname; cat /proc/1/comm; readlink /proc/1/ns/net")
        assert rc == 0, err
        return host.name, out

    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = dict(pool.map(identity, fleet.hosts))
    for name, out in answers.items():
        hostname, pid1, _ = out.split()
        assert (hostname, pid1) == (name, "sshd"), "own UTS and PID namespace, sshd is PID 1"
    assert len({out.split()[2] for out in answers.values()}) == 16, "one network namespace per host"


def test_client_rejects_a_host_key_that_is_not_the_known_one(mixed: HostFleet, tmp_path: Path) -> None:
    node01, node02 = mixed["node01"], mixed["node02"]
    swapped = tmp_path / "known_hosts"
    swapped.write_text(f"{node01.address} {node02.host_public_key}\n")
    with pytest.raises(paramiko.BadHostKeyException):
        connect(node01, known_hosts=swapped)
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        connect(node01, known_hosts=empty)
    # OpenSSH, which Ansible uses, refuses it too.
    result = subprocess.run(
        [
            "ssh",
            "-i",
            str(node01.client_key),
            "-o",
            f"UserKnownHostsFile={swapped}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            f"root@{node01.address}",
            "true",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert result.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in result.stderr


def test_blackholed_host_never_answers_while_its_sshd_runs(mixed: HostFleet) -> None:
    """The connect fails (its 1 s timeout; how soon is the rehearsal's: tests/rehearsal/test_hosts.py) and never
    hangs, while the node's sshd runs: only the route drops the replies."""
    node06 = mixed["node06"]
    finishes(lambda: failed_connect(node06, timeout=1.0), what="a connect to the blackholed node06")
    routes = subprocess.run(["ip", "-n", node06.netns, "route", "show"], capture_output=True, text=True, check=True)
    assert "blackhole 10.200." in routes.stdout
    pids = subprocess.run(["ip", "netns", "pids", node06.netns], capture_output=True, text=True, check=True)
    assert pids.stdout.split(), "sshd is still running; only the route drops the replies"


def test_nodes_resolve_and_ping_each_other_by_name_except_the_dark_one(mixed: HostFleet) -> None:
    """The source's preflight pings every node by name: /etc/hosts on each node lists the fleet."""
    rc, out, err = run(mixed["node01"], "getent hosts node02; ping -c1 -W1 node02 >/dev/null; echo $?")
    assert rc == 0, err
    address, name, ping_rc = out.split()
    assert (address, name, ping_rc) == (mixed["node02"].address, "node02", "0")
    _, out, _ = run(mixed["node01"], "ping -c1 -W1 node06 >/dev/null; echo $?")
    assert out.strip() == "1", "node06 drops every reply, to peers too"


def test_old_kernel_host_reports_a_2_6_release(mixed: HostFleet) -> None:
    _, old, _ = run(mixed["node05"], "uname -r")
    _, healthy, _ = run(mixed["node01"], "uname -r")
    assert old.startswith("2.6."), old
    assert healthy.strip() == os.uname().release


def test_no_cgroup2_host_has_a_v1_hierarchy_at_sys_fs_cgroup(mixed: HostFleet) -> None:
    _, faulty, _ = run(
        mixed["node05"], "stat -fc %T /sys/fs/cgroup; test -e /sys/fs/cgroup/cgroup.controllers; echo $?"
    )
    _, healthy, _ = run(
        mixed["node01"], "stat -fc %T /sys/fs/cgroup; test -e /sys/fs/cgroup/cgroup.controllers; echo $?"
    )
    assert faulty.split() == ["tmpfs", "1"]
    assert healthy.split() == ["cgroup2fs", "0"]


def test_stub_tools_print_the_recorded_samples_with_faults_applied(mixed: HostFleet) -> None:
    node01 = mixed["node01"]
    assert run(node01, "ibstat")[1] == sample("ibstat_h100_node.txt")
    assert run(node01, "chronyc tracking")[1] == sample("chronyc_tracking_manpage.txt")
    assert run(node01, "nvidia-smi")[1] == sample("nvidia_smi_h100x8.txt")
    rc, _, err = run(node01, "nvidia-smi -q")
    assert rc == 2 and "no recorded output" in err, "unrecorded arguments fail loudly"

    ibstat = load("ibstat", "module_utils").parse_ibstat(run(mixed["node02"], "ibstat")[1])
    assert {p["ca"] for p in ibstat["ports"] if p["state"] == "Down"} == {"mlx5_3", "mlx5_9"}
    chrony = load("chrony", "module_utils").parse_tracking_csv(run(mixed["node04"], "chronyc -c tracking")[1])
    assert chrony["system_time_offset_s"] == 0.25
    rc, out, _ = run(mixed["node09"], "nvidia-smi")
    assert rc == 9 and "couldn't communicate with the NVIDIA driver" in out


def test_missing_tools_are_gone_even_when_this_machine_has_them(mixed: HostFleet) -> None:
    """node07 lacks all three: no stubs, and a real /usr/bin/chronyc on this machine is covered
    by a non-executable bind mount inside it, so an executable lookup (what Ansible's
    get_bin_path and shutil.which do) finds nothing."""
    probe = 'python3 -c \'import shutil; print([shutil.which(t) for t in ("nvidia-smi", "ibstat", "chronyc")])\''
    assert run(mixed["node07"], probe)[1].strip() == "[None, None, None]"
    assert run(mixed["node01"], probe)[1].strip() == str(
        ["/usr/local/sbin/nvidia-smi", "/usr/local/sbin/ibstat", "/usr/local/sbin/chronyc"]
    )
    rc, _, err = run(mixed["node07"], "chronyc tracking")
    assert rc in (126, 127), err


# --- the custom modules over real SSH, with `ansible` ad hoc ------------------------------------


RESULT_HEADER = re.compile(r"^(?P<host>\S+) \| (?P<status>SUCCESS|CHANGED|FAILED!|UNREACHABLE!) => ", re.MULTILINE)


def ansible_adhoc(
    fleet: HostFleet, module: str, tmp_path: Path, control_dir: Path, args: str | None = None
) -> dict[str, dict[str, Any]]:
    """Run `ansible all -m MODULE --check` against `fleet` (a short name is one of the exaserve.fleet
    collection's modules); per host, the result it printed plus `status` (SUCCESS, CHANGED, FAILED! or
    UNREACHABLE!)."""
    inventory = fleet.write_inventory(tmp_path / "inventory.yml", connect_timeout_s=2)
    command = [
        "ansible",
        "all",
        "-i",
        str(inventory),
        "-m",
        module if "." in module else f"exaserve.fleet.{module}",
        "--check",
        "--forks",
        str(len(fleet.hosts)),
    ]
    if args:
        command += ["-a", args]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env={**fleet.ansible_env(control_dir), "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS_DIR)},
        check=False,
        timeout=300,
    )
    results = {}
    for match in RESULT_HEADER.finditer(result.stdout):
        payload, _ = json.JSONDecoder().raw_decode(result.stdout, match.end())
        results[match.group("host")] = {**payload, "status": match.group("status")}
    assert set(results) == set(fleet.names), result.stdout + result.stderr
    return results


def facts_of(results: dict[str, dict[str, Any]], host: str, fact: str) -> Any:
    result = results[host]
    assert result["status"] == "SUCCESS", result
    assert result["changed"] is False
    return result["ansible_facts"][fact]


def failure_of(results: dict[str, dict[str, Any]], host: str) -> str:
    assert results[host]["status"] == "FAILED!", results[host]
    assert "Traceback" not in json.dumps(results[host]), "a clean message, not a traceback"
    return str(results[host]["msg"])


def test_ibstat_facts_over_ssh(mixed: HostFleet, tmp_path: Path, ssh_control_dir: Path) -> None:
    results = ansible_adhoc(mixed, "ibstat_facts", tmp_path, ssh_control_dir)
    ib_ports = {
        host: [p for p in facts_of(results, host, "ibstat")["ports"] if p["link_layer"] == "InfiniBand"]
        for host in ("node01", "node02", "node03")
    }
    assert {(p["state"], p["rate_gbps"]) for p in ib_ports["node01"]} == {("Active", 400)}
    assert [p["ca"] for p in ib_ports["node02"] if p["state"] != "Active"] == ["mlx5_3"]
    assert {p["rate_gbps"] for p in ib_ports["node03"]} == {200}
    assert results["node06"]["status"] == "UNREACHABLE!"
    assert "apt-get install infiniband-diags" in failure_of(results, "node07")


def test_nvidia_smi_facts_over_ssh(mixed: HostFleet, tmp_path: Path, ssh_control_dir: Path) -> None:
    results = ansible_adhoc(mixed, "nvidia_smi_facts", tmp_path, ssh_control_dir)
    healthy = facts_of(results, "node01", "nvidia_smi")
    assert (healthy["gpu_count"], healthy["driver_version"], healthy["cuda_version"]) == (8, "570.195.03", "12.8")
    assert healthy["gpus"][0]["memory_total_mib"] == 81559
    assert facts_of(results, "node08", "nvidia_smi")["gpu_count"] == 7
    assert "Install the NVIDIA datacenter driver" in failure_of(results, "node07")
    assert "couldn't communicate with the NVIDIA driver" in failure_of(results, "node09")


@pytest.mark.parametrize("output_format", ["csv", "text"])
def test_chrony_facts_over_ssh(mixed: HostFleet, tmp_path: Path, ssh_control_dir: Path, output_format: str) -> None:
    results = ansible_adhoc(mixed, "chrony_facts", tmp_path, ssh_control_dir, f"output_format={output_format}")
    offset = facts_of(results, "node01", "chrony")["system_time_offset_s"]
    assert offset == pytest.approx(-0.000006523)  # not a timing judgment: the test host's chronyc output, parsed
    assert facts_of(results, "node04", "chrony")["system_time_offset_s"] == 0.25
    assert facts_of(results, "node08", "chrony")["synchronised"] is False
    assert "chronyd is not answering" in failure_of(results, "node09")
    assert "chronyc is not installed" in failure_of(results, "node07")


def test_kernel_facts_over_ssh(mixed: HostFleet, tmp_path: Path, ssh_control_dir: Path) -> None:
    results = ansible_adhoc(mixed, "kernel_facts", tmp_path, ssh_control_dir)
    cgroup = facts_of(results, "node01", "cgroup")
    assert (cgroup["version"], cgroup["fstype"], cgroup["unified_mountpoint"]) == (2, "cgroup2", "/sys/fs/cgroup")
    assert facts_of(results, "node01", "host_kernel")["release"] == os.uname().release
    faulty = facts_of(results, "node05", "cgroup")
    assert (faulty["version"] != 2, faulty["fstype"]) == (True, "tmpfs")
    assert facts_of(results, "node05", "host_kernel")["version"].startswith("2.6.")


def test_gather_facts_sees_the_old_kernel_too(mixed: HostFleet, tmp_path: Path, ssh_control_dir: Path) -> None:
    """`ansible_kernel` from the setup module comes from the same uname(2) as `uname -r`."""
    results = ansible_adhoc(
        mixed, "ansible.builtin.setup", tmp_path, ssh_control_dir, "gather_subset=!all filter=ansible_kernel"
    )
    assert facts_of(results, "node05", "ansible_kernel").startswith("2.6.")
    assert facts_of(results, "node01", "ansible_kernel") == os.uname().release
