"""preflight.yml and site.yml for real: ansible-playbook and `exaserve preflight` over SSH to test hosts.

Real: sshd per node in its own network namespace, host keys verified, the blackholed route, the
2.6 uname personality, the node's cgroup mount, ping between namespaces, gloo all-reduce between
two hosts, findmnt on /dev/shm. Stand-ins (no GPU, HCA, NTP server, containerd or NFS server here):
the stub nvidia-smi/ibstat/chronyc/ctr/containerd/nvidia-container-cli print recorded real output
(tests/data), the model store is the /dev/shm tmpfs.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from serving.checks.preflight import CHECKS
from tests.support.cli import exaserve
from tests.support.hosts.netns import HostPool
from tests.support.preflight import (
    CONNECT_TIMEOUT_S,
    PROBE_TIMEOUT_S,
    SCENARIOS,
    VENV_BIN,
    Deployed,
    ModelStore,
    Outcome,
    ansible_env,
    deploy,
    model_store,
    run_playbook,
    run_scenario,
    scenario_fleet,
)

pytestmark = pytest.mark.slow

# Every check a full run records on a reachable node (all but the fabric ones, which need --tags fabric, and the
# system pool's, which run on its nodes only: tests/test_preflight_system.py).
FULL_RUN_CHECKS = set(CHECKS) - {
    "play",
    "fabric_pair",
    "fabric_rack",
    "system_cpu",
    "system_memory",
    "system_untainted",
}


@pytest.fixture(scope="module")
def store() -> Iterator[ModelStore]:
    with model_store() as s:
        yield s


@pytest.fixture(scope="module")
def scenario(ssh_hosts: HostPool, store: ModelStore, tmp_path_factory: pytest.TempPathFactory) -> Deployed:
    return deploy(scenario_fleet(ssh_hosts), store, tmp_path_factory.mktemp("scenario"))


@pytest.fixture(scope="module")
def healthy(ssh_hosts: HostPool, store: ModelStore, tmp_path_factory: pytest.TempPathFactory) -> Deployed:
    return deploy(ssh_hosts(4), store, tmp_path_factory.mktemp("healthy"))


@pytest.fixture(scope="module")
def scenario_run(scenario: Deployed, tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    """One ansible-playbook preflight.yml over all ten scenario hosts, as users run it."""
    return run_scenario(scenario, tmp_path_factory.mktemp("scenario-run"))


@pytest.mark.parametrize("host", list(SCENARIOS))
def test_each_fault_is_flagged_on_its_host_only_with_its_fix(
    host: str, scenario: Deployed, scenario_run: Outcome
) -> None:
    _, failing, fix_words = SCENARIOS[host]
    entry = scenario_run.report["hosts"][scenario.spec_name(host)]
    failed = {c for c, r in entry["checks"].items() if r["status"] == "fail"}
    assert failed == failing, (host, {c: entry["checks"][c] for c in failed | failing if c in entry["checks"]})
    assert entry["failed_checks"] == [c for c in CHECKS if c in failing]
    if host == "node07":
        assert entry["status"] == "unreachable"
        assert set(entry["checks"]) == {"ssh"}
        assert "Connection timed out" in entry["checks"]["ssh"]["observed"]
    else:
        assert entry["status"] == ("fail" if failing else "pass")
        assert set(entry["checks"]) == FULL_RUN_CHECKS, sorted(FULL_RUN_CHECKS ^ set(entry["checks"]))
    for check, result in entry["checks"].items():
        assert set(result) == {"status", "observed", "expected", "fix"}
        assert result["status"] in ("pass", "fail", "skip")
        assert (result["fix"] is None) == (result["status"] != "fail"), (check, result)
    if fix_words:
        assert all(fix_words in entry["checks"][check]["fix"] for check in failing), entry


def test_scenario_observations_name_the_fault(scenario: Deployed, scenario_run: Outcome) -> None:
    hosts = scenario_run.report["hosts"]
    checks = {h: hosts[scenario.spec_name(h)]["checks"] for h in SCENARIOS}
    assert "mlx5_3 port 1 Down/Polling" in checks["node02"]["ib_ports"]["observed"]
    assert checks["node03"]["ib_rate"]["observed"].count("at 200 Gb/s") == 8
    assert checks["node04"]["ntp_offset"]["observed"] == "+250.000 ms"
    assert checks["node05"]["cgroup_v2"]["observed"].startswith("hybrid")
    assert checks["node06"]["kernel"]["observed"].startswith("2.6.")
    # Only the slow port is named, not every port of the node.
    assert checks["node09"]["ib_rate"]["observed"] == "mlx5_2 port 1 at 200 Gb/s"
    # The hung tool cost one probe timeout and says so; the node's other checks were still read.
    hung = checks["node10"]["gpu_count"]["observed"]
    assert (
        hung.startswith("nvidia-smi --query-gpu=")
        and f"did not answer within {PROBE_TIMEOUT_S} s and was killed" in hung
    )
    assert checks["node10"]["ntp_sync"]["status"] == checks["node10"]["ib_rate"]["status"] == "pass"
    # The unreachable node is not anybody's peer: its rack mates still pass their ping checks.
    assert all(checks[h]["rack_peers"]["status"] == "pass" for h in ("node05", "node06", "node08"))


def test_run_fails_names_the_bad_hosts_and_ends(scenario: Deployed, scenario_run: Outcome) -> None:
    """The run ends (run_playbook's timeout is the patience), exits 2 and names the faulty hosts; how long it took
    (one connect timeout for the dead node, the rest in parallel) is the rehearsal's: tests/rehearsal/test_hosts.py."""
    run = scenario_run.run
    assert run.rc == 2, run.output[-3000:]
    summary = scenario_run.report["summary"]
    assert summary == {"hosts": 10, "passed": 2, "failed": 7, "unreachable": 1}
    assert scenario_run.report["ok"] is False
    # PLAY RECAP: exactly the six faulty nodes failed (the assert of the report role).
    for host, (_, failing, _) in SCENARIOS.items():
        recap = next(line for line in run.output.splitlines() if line.startswith(scenario.spec_name(host) + " "))
        assert ("failed=1" in recap) == bool(failing), recap
    assert "EXASERVE SUMMARY: 10 hosts" in run.output


def run_cli(*args: str, control_dir: Path, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """``exaserve preflight ARGS`` with the project's ansible.cfg and a per-run control path."""
    env = {**ansible_env(control_dir, ANSIBLE_TIMEOUT=str(CONNECT_TIMEOUT_S)), "COLUMNS": "220"}
    return exaserve("preflight", *args, env=env, timeout_s=timeout_s)


def cli_args(d: Deployed, report: Path) -> list[str]:
    return [
        "--stack-file", str(d.stack),
        "--known-hosts", str(d.fleet.known_hosts),
        "--identity", str(d.fleet.client_key),
        "--report", str(report),
    ]  # fmt: skip


def test_cli_all_healthy_exits_0_with_a_hosts_by_checks_table(healthy: Deployed, tmp_path: Path) -> None:
    r = run_cli(*cli_args(healthy, tmp_path / "r.json"), control_dir=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "preflight test: 4/4 nodes pass, 0 failing, 0 unreachable" in r.stdout
    for name in healthy.names:
        row = next(line for line in r.stdout.splitlines() if name in line)
        assert "pass" in row and "FAIL" not in row
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["ok"] is True and set(report["hosts"]) == set(healthy.names)


def test_cli_json_with_limit_exits_1_and_reports_only_the_limited_nodes(scenario: Deployed, tmp_path: Path) -> None:
    bad, good = scenario.spec_name("node02"), scenario.spec_name("node01")
    r = run_cli(*cli_args(scenario, tmp_path / "r.json"), "--json", "--limit", f"{bad},{good}", control_dir=tmp_path)
    assert r.returncode == 1, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert set(doc["hosts"]) == {bad, good}
    assert doc["hosts"][bad]["failed_checks"] == ["ib_ports"]
    assert doc["hosts"][good]["status"] == "pass"


def test_cli_bad_input_exits_2_without_running(scenario: Deployed, tmp_path: Path) -> None:
    r = run_cli(*cli_args(scenario, tmp_path / "r.json"), "--limit", "no-such-node", control_dir=tmp_path)
    assert r.returncode == 2 and "'no-such-node' match no node or group" in r.stderr
    assert not (tmp_path / "r.json").exists()
    broken = tmp_path / "Pulumi.broken.yaml"
    broken.write_text("config:\n  exaserve:cluster:\n    pools: []\n")
    r = run_cli("--stack-file", str(broken), control_dir=tmp_path)
    assert r.returncode == 2 and "cluster.pools" in r.stderr and "Traceback" not in r.stderr


def _digest(paths: list[Path]) -> dict[str, str | None]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else None for p in paths}


# Files the provisioning roles would write; the test hosts share this machine's filesystem.
PROVISIONED = [
    Path("/etc/hosts"),
    Path("/etc/chrony/chrony.conf"),
    Path("/etc/containerd/config.toml"),
    Path("/etc/sysctl.d/90-exaserve.conf"),
    Path("/etc/default/grub.d/90-exaserve-cgroup.cfg"),
    Path("/etc/apt/sources.list.d/exaserve-nvidia-cuda.sources"),
    Path("/usr/share/keyrings/exaserve-nvidia.asc"),
    Path("/etc/profile.d/exaserve-cuda.sh"),
    Path("/etc/modules-load.d/exaserve-rdma.conf"),
    Path("/etc/systemd/system/dev-shm.mount"),
    Path("/tmp/exaserve-test-cache"),
]


def test_preflight_check_mode_changes_nothing(healthy: Deployed, tmp_path: Path) -> None:
    before = _digest(PROVISIONED)
    run = run_playbook(
        "preflight.yml", healthy.inventory, tmp_path, "--check", "-e", f"preflight_report_path={tmp_path}/r.json"
    )
    assert run.rc == 0, run.output[-3000:]
    recaps = [line for line in run.output.splitlines() if line.startswith(tuple(healthy.names))]
    # Only the controller-side report writing shows as changed (on the host it ran for).
    assert len(recaps) == 4 and sum("changed=0" in line for line in recaps) >= 3, recaps
    assert json.loads((tmp_path / "r.json").read_text())["ok"] is True
    assert _digest(PROVISIONED) == before


def test_provisioning_roles_run_in_check_mode_and_change_nothing(healthy: Deployed, tmp_path: Path) -> None:
    """site.yml --check --diff against two test hosts (Debian 12 like this machine): every role runs,
    reports what it would change, and nothing on the hosts changes. Services are left alone because
    the namespace hosts have no systemd; vendor packages are reported, not resolved, while the NVIDIA
    repository is not configured (placeholder mirror URLs under .internal, never contacted)."""
    key = tmp_path / "nvidia.asc"
    key.write_text("-----BEGIN PGP PUBLIC KEY BLOCK-----\n(test placeholder)\n-----END PGP PUBLIC KEY BLOCK-----\n")
    before = _digest(PROVISIONED)
    run = run_playbook(
        "site.yml",
        healthy.inventory,
        tmp_path,
        "--check",
        "--diff",
        "--limit",
        ",".join(list(healthy.names)[:2]),
        "-e", "exaserve_provision_batch=100%",
        "-e", "nvidia_repo_cuda_url=http://mirror.exaserve.internal/cuda/ubuntu2204/x86_64/",
        "-e", "nvidia_repo_toolkit_url=http://mirror.exaserve.internal/libnvidia-container/stable/deb/amd64/",
        "-e", f"nvidia_repo_keyring_src={key}",
    )  # fmt: skip
    assert run.rc == 0, run.output[-5000:]
    assert _digest(PROVISIONED) == before
    recaps = [line for line in run.output.splitlines() if line.startswith(tuple(healthy.names))]
    assert len(recaps) == 2 and all("failed=0" in r and "changed=0" not in r for r in recaps), recaps
    # It would write the spec's chrony.conf (rendered by serving.render.chrony) and the fleet's /etc/hosts block.
    assert "server 10.200." in run.output and "EXASERVE FLEET" in run.output
    assert "would install cuda-drivers-535, nvidia-fabricmanager-535" in run.output


def test_fabric_allreduce_with_gloo_between_two_test_hosts(
    ssh_hosts: HostPool, store: ModelStore, tmp_path: Path
) -> None:
    """--tags fabric: python -m serving.node.fabric runs on both hosts at once (the venv's torch; the hosts
    share this filesystem) and gloo all-reduces over their veths. The stack's Ethernet link rate
    is set low so the CPU figure passes; a second stack at 400 Gb/s fails with the source's table."""
    fleet = ssh_hosts(4)
    results: dict[int, dict[str, Any]] = {}
    for rate in (1, 400):
        directory = tmp_path / f"r{rate}"
        directory.mkdir()
        fabric = {"kind": "ethernet", "hcas": [], "link_rate_gbps": rate}
        d = deploy(fleet, store, directory, racks=1, cluster={"fabric": fabric})
        pair = list(d.names)[:2]
        run = run_playbook(
            "preflight.yml", d.inventory, tmp_path, "--tags", "fabric", "--limit", ",".join(pair),
            "-e", f"preflight_report_path={tmp_path}/r{rate}.json",
            "-e", f"preflight_fabric_python={VENV_BIN}/python", "-e", "preflight_fabric_size_mib=16",
        )  # fmt: skip
        results[rate] = json.loads((tmp_path / f"r{rate}.json").read_text())
        assert run.rc == (0 if rate == 1 else 2), run.output[-3000:]
    for name, entry in results[1]["hosts"].items():
        assert set(entry["checks"]) == {"ssh", "fabric_pair", "fabric_rack"}, name
        pair = entry["checks"]["fabric_pair"]
        assert pair["status"] == "pass" and "(2 nodes), gloo: busbw" in pair["observed"]
    failing = next(iter(results[400]["hosts"].values()))["checks"]["fabric_pair"]
    assert failing["status"] == "fail"
    assert "instead of 80%–92% GPU utilisation (≥ 400 Gb/s: all strategies)" in failing["fix"]


def test_unknown_check_name_is_a_playbook_error(healthy: Deployed, tmp_path: Path) -> None:
    """exaserve.fleet.preflight_record refuses a check the report does not know (a typo in a role cannot silently
    add a column nobody reads)."""
    playbook = tmp_path / "typo.yml"
    playbook.write_text(
        "- name: Typo\n  hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - name: Record\n      exaserve.fleet.preflight_record:\n        checks: [{check: kernal, passed: true}]\n"
    )
    run = run_playbook(str(playbook), healthy.inventory, tmp_path)
    assert run.rc == 2 and "unknown preflight check 'kernal'" in run.output
