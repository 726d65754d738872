"""The ``kubelet`` role run for real (ansible-playbook, local connection) on a scratch environment file: it merges the
fleet's flags into ``KUBELET_EXTRA_ARGS`` instead of overwriting the line (issue 25, finding 3: the node's own flags
were lost and ``--cpu-manager-policy=static`` was never set), adds a CPU reservation only where none is set, drops
the CPU manager's checkpoint when the policy changes, and changes nothing on a second run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from tests.support.hosts.collection import load
from tests.support.preflight import run_playbook

TAINT = "nvidia.com/gpu=present:NoSchedule"


def _converge(tmp_path: Path, env_file: Path, state: Path, **extra: object) -> tuple[int, str]:
    playbook = tmp_path / "kubelet.yml"
    playbook.write_text(
        json.dumps([{
            "hosts": "localhost", "connection": "local", "gather_facts": False,
            "vars": {"kubelet_extra_args_path": str(env_file), "kubelet_cpu_manager_state": str(state),
                     "kubelet_register_with_taints": [TAINT], "kubelet_service": "exaserve-test-no-such-kubelet",
                     "kubelet_config_path": str(tmp_path / "no-config.yaml"), **extra},
            "roles": ["exaserve.fleet.kubelet"],
        }])
    )  # fmt: skip
    inventory = tmp_path / "inventory.ini"
    inventory.write_text(f"localhost ansible_python_interpreter={sys.executable}\n")
    run = run_playbook(str(playbook), inventory, tmp_path / "cp")
    return run.rc, run.output


def _args(env_file: Path) -> list[str]:
    (line,) = [x for x in env_file.read_text().splitlines() if x.startswith("KUBELET_EXTRA_ARGS=")]
    return line.removeprefix("KUBELET_EXTRA_ARGS=").split()


@pytest.mark.parametrize(
    ("existing", "reservation"),
    [("--cpu-manager-policy=none", "--reserved-cpus=0-1"), ("--kube-reserved=cpu=2", "--kube-reserved=cpu=2")],
    ids=["policy-none-no-reservation", "own-reservation"],
)
def test_kubelet_role_merges_its_flags_and_keeps_the_nodes_own(tmp_path: Path, existing: str, reservation: str) -> None:
    env_file, state = tmp_path / "kubelet.env", tmp_path / "cpu_manager_state"
    env_file.write_text(
        f'OTHER=1\nKUBELET_EXTRA_ARGS="--node-ip=10.40.0.11 {existing} --register-with-taints=old=x:NoSchedule"\n'
    )
    state.write_text('{"policyName":"none"}')
    rc, output = _converge(tmp_path, env_file, state)
    assert rc == 0, output
    args = _args(env_file)
    assert "--node-ip=10.40.0.11" in args, "the node's own flag survives"
    assert f"--register-with-taints={TAINT}" in args and "--register-with-taints=old=x:NoSchedule" not in args
    assert "--cpu-manager-policy=static" in args and "--cpu-manager-policy=none" not in args
    assert reservation in args and sum(a.startswith(("--reserved-cpus", "--kube-reserved")) for a in args) == 1
    assert "OTHER=1" in env_file.read_text().splitlines()
    assert not state.exists(), "the stale checkpoint of policy none is removed"
    # Converged: a second run changes nothing, and a checkpoint of the same policy stays.
    state.write_text('{"policyName":"static"}')
    before = env_file.read_text()
    rc, output = _converge(tmp_path, env_file, state)
    assert rc == 0, output
    assert env_file.read_text() == before and state.exists()
    assert "changed=0" in output, output[-2000:]


# Issue 40, item 3: the role took any --kube-reserved=/--system-reserved= for a CPU reservation, so a node with
# --kube-reserved=memory=2Gi got the static CPU manager with 0 CPU reserved, which the kubelet refuses at start
# (kubernetes pkg/kubelet/cm/cpumanager/cpu_manager.go NewManager: "the static policy requires systemreserved.cpu +
# kubereserved.cpu to be greater than zero"): every such node NotReady at once. It also ignored config.yaml.
@pytest.mark.parametrize(
    ("existing", "config", "adds"),
    [
        ("--kube-reserved=memory=2Gi", None, True),
        ("--system-reserved=cpu=500m,memory=1Gi", None, False),
        ("--kube-reserved=cpu=0,memory=1Gi", None, True),
        ("", {"kind": "KubeletConfiguration", "kubeReserved": {"cpu": "1", "memory": "2Gi"}}, False),
        ("", {"kind": "KubeletConfiguration", "reservedSystemCPUs": "0,2"}, False),
        # a flag replaces the config file's whole field: the file's CPU no longer counts
        ("--kube-reserved=memory=1Gi", {"kind": "KubeletConfiguration", "kubeReserved": {"cpu": "1"}}, True),
    ],
    ids=[
        "memory-only-flag",
        "system-cpu-flag",
        "zero-cpu",
        "config-kube-cpu",
        "config-reserved-cpus",
        "flag-over-config",
    ],
)
def test_kubelet_role_counts_reserved_cpu_as_the_kubelet_does(
    tmp_path: Path, existing: str, config: dict[str, object] | None, adds: bool
) -> None:
    env_file, state = tmp_path / "kubelet.env", tmp_path / "cpu_manager_state"
    env_file.write_text(f'KUBELET_EXTRA_ARGS="--node-ip=10.40.0.11 {existing}"\n')
    extra: dict[str, object] = {}
    if config is not None:
        (tmp_path / "config.yaml").write_text(json.dumps(config))
        extra["kubelet_config_path"] = str(tmp_path / "config.yaml")
    rc, output = _converge(tmp_path, env_file, state, **extra)
    assert rc == 0, output
    args = _args(env_file)
    assert ("--reserved-cpus=0-1" in args) is adds, args
    assert "--cpu-manager-policy=static" in args and (not existing or existing in args)


def test_kubelet_role_refuses_static_without_reserved_cpu_and_writes_nothing(tmp_path: Path) -> None:
    """No CPU reserved on the node and kubelet_reserved_cpus empty: the role stops before writing the line, naming
    what the node has and the three fixes."""
    env_file, state = tmp_path / "kubelet.env", tmp_path / "cpu_manager_state"
    env_file.write_text('KUBELET_EXTRA_ARGS="--kube-reserved=memory=2Gi"\n')
    before = env_file.read_text()
    rc, output = _converge(tmp_path, env_file, state, kubelet_reserved_cpus="")
    assert rc != 0 and env_file.read_text() == before, output
    text = " ".join(output.split())
    assert "kubelet refuses the static CPU manager without reserved CPU" in text, output[-3000:]
    assert "no CPU reservation on this node" in text and "Set kubelet_reserved_cpus" in text, output[-3000:]


@pytest.mark.parametrize(
    ("args", "config", "milli"),
    [
        (["--reserved-cpus=0-1,4"], None, 3000),
        (["--kube-reserved=cpu=1.5", "--system-reserved=cpu=250m"], None, 1750),
        (["--kube-reserved=memory=2Gi"], {"kubeReserved": {"cpu": "2"}}, 0),
        ([], {"kubeReserved": {"cpu": "2"}, "systemReserved": {"cpu": "500m"}}, 2500),
        ([], {"reservedSystemCPUs": "0-3", "kubeReserved": {"cpu": "1"}}, 4000),
    ],
)
def test_the_reserved_cpu_filter_follows_the_kubelets_precedence(
    args: list[str], config: dict[str, object] | None, milli: int
) -> None:
    reserved_cpu = load("fleet", "filter").kubelet_reserved_cpu
    assert reserved_cpu(args, config)["milli"] == milli
    with pytest.raises(AnsibleFilterError, match=r"--kube-reserved cpu='two' is not a CPU quantity"):
        reserved_cpu(["--kube-reserved=cpu=two"])
