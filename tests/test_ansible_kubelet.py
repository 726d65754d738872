"""The ``kubelet`` role run for real (ansible-playbook, local connection) on a scratch environment file: it merges the
fleet's flags into ``KUBELET_EXTRA_ARGS`` instead of overwriting the line (issue 25, finding 3: the node's own flags
were lost and ``--cpu-manager-policy=static`` was never set), adds a CPU reservation only where none is set, drops
the CPU manager's checkpoint when the policy changes, and changes nothing on a second run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support.preflight import run_playbook

TAINT = "nvidia.com/gpu=present:NoSchedule"


def _converge(tmp_path: Path, env_file: Path, state: Path) -> tuple[int, str]:
    playbook = tmp_path / "kubelet.yml"
    playbook.write_text(
        json.dumps([{
            "hosts": "localhost", "connection": "local", "gather_facts": False,
            "vars": {"kubelet_extra_args_path": str(env_file), "kubelet_cpu_manager_state": str(state),
                     "kubelet_register_with_taints": [TAINT], "kubelet_service": "exaserve-test-no-such-kubelet"},
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
