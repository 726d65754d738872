"""What preflight needs on the SSH test hosts beyond tests/support/hosts: a stack for the fleet, container
runtime stubs, a model store, and a way to run the playbook. Shared by the tests and the benchmark.

Stand-ins (there is no containerd daemon, NVIDIA toolkit, NFS server or GPU here): `ctr`,
`containerd` and `nvidia-container-cli` are stubs printing the real-format samples in
tests/data/container; the model store is /dev/shm (a real tmpfs mount point every test host sees,
whatever its start time) holding a tiny model directory.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.hosts.faults import HostFaults
from tests.support.hosts.netns import HostFleet
from tests.support.paths import REPO
from tests.support.patience import PATIENCE_S
from tests.support.stacks import merge, write_stack

ANSIBLE_DIR = REPO / "ansible"
CONTAINER_DATA = REPO / "tests" / "data" / "container"
VENV_BIN = Path(sys.executable).parent
MODEL_STORE_MOUNT = "/dev/shm"
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"  # the recorded nvidia-smi sample's GPUs

_STUBS = {
    "ctr": {"version": "ctr_version.txt"},
    "containerd": {"config dump": "containerd_config_dump_nvidia.toml"},
    "nvidia-container-cli": {"info": "nvidia_container_cli_info_h100x8.txt"},
}


def install_container_stubs(fleet: HostFleet) -> None:
    """Put stub `ctr`, `containerd` and `nvidia-container-cli` in every host's stub folder (its
    /usr/local/sbin). Each prints a recorded sample for the arguments preflight uses and fails
    loudly (rc 2) for anything else."""
    for host in fleet.hosts:
        for tool, replies in _STUBS.items():
            cases = "".join(
                f"  {shlex.quote(args)}) cat {shlex.quote(str(CONTAINER_DATA / name))} ;;\n"
                for args, name in replies.items()
            )
            script = (
                "#!/bin/sh\n"
                f"# test stub: {tool}, prints samples from tests/data/container\n"
                'case "$*" in\n'
                f"{cases}"
                f'  *) echo "{tool} stub: arguments not recorded: $*" >&2; exit 2 ;;\n'
                "esac\n"
            )
            path = host.stub_dir / tool
            path.write_text(script)
            path.chmod(0o755)


@dataclass(frozen=True)
class ModelStore:
    """A model directory on /dev/shm: config.json and one small weight file."""

    root: Path
    model_path: str  # model.path, relative to the store's mount path

    @property
    def model_dir(self) -> Path:
        return Path(MODEL_STORE_MOUNT) / self.model_path


@contextmanager
def model_store() -> Iterator[ModelStore]:
    root = Path(MODEL_STORE_MOUNT) / f"exaserve-test-{os.getpid()}"
    store = ModelStore(root, f"{root.name}/tiny-model")
    store.model_dir.mkdir(parents=True, exist_ok=True)
    (store.model_dir / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}\n')
    (store.model_dir / "model.safetensors").write_bytes(b"\0" * 4096)
    try:
        yield store
    finally:
        shutil.rmtree(root, ignore_errors=True)


def fleet_stack_doc(fleet: HostFleet, store: ModelStore, *, racks: int = 2, **sections: Any) -> dict[str, Any]:
    """A stack for the fleet: one pool over its addresses (10.200.<slot>.x, contiguous), the recorded
    node's hardware (8 × H100, 8 × 400 Gb/s HCAs), Debian 12 as on the test hosts. ``sections``
    deep-merges over the defaults, e.g. ``cluster={"fabric": {"link_rate_gbps": 200}}``."""
    first = fleet.hosts[0].address
    subnet = first.rsplit(".", 1)[0] + ".0/24"
    doc: dict[str, Any] = {
        "cluster": {
            "name": "exaserve-test",
            "pools": [
                {
                    "name": "tn",
                    "count": len(fleet.hosts),
                    "subnet": subnet,
                    "first_address": first,
                    "racks": racks,
                }
            ],
            "gpu": {"product": GPU_PRODUCT, "memory_gb": 80, "count_per_node": 8},
            "fabric": {"kind": "infiniband", "link_rate_gbps": 400},
            "host": {"os_id": "debian", "os_version": "12", "min_free_disk_gb": 1},
            "ntp": {"servers": [subnet.rsplit(".", 1)[0] + ".1"], "max_offset_ms": 100},
        },
        "storage": {
            "model_store": {"kind": "nfs", "server": "nfs.exaserve.internal", "mount_path": MODEL_STORE_MOUNT},
            "local_cache": {"path": "/tmp/exaserve-test-cache"},
        },
        "model": {"name": "tiny-model", "path": store.model_path},
    }
    return merge(doc, sections)


def node_names(fleet: HostFleet, stack_path: Path) -> dict[str, str]:
    """Spec node name -> test host name (matched by address)."""
    from serving.spec.stack import load_stack_file

    by_address = {h.address: h.name for h in fleet.hosts}
    return {n.name: by_address[str(n.address)] for n in load_stack_file(stack_path).spec.cluster.nodes}


def write_inventory(directory: Path, stack_path: Path, fleet: HostFleet) -> Path:
    """An `exaserve.fleet.exaserve` inventory config for the stack, with the fleet's known_hosts and client key."""
    path = directory / "test.exaserve.yml"
    path.write_text(
        yaml.safe_dump(
            {
                "plugin": "exaserve.fleet.exaserve",
                "stack_file": str(stack_path),
                "known_hosts_file": str(fleet.known_hosts),
                "private_key_file": str(fleet.client_key),
            }
        )
    )
    return path


def ansible_env(control_dir: Path, **extra: str) -> dict[str, str]:
    """Environment for ansible-playbook with the project's ansible.cfg and a per-run control path."""
    return {
        **HostFleet.ansible_env(control_dir),
        "ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg"),
        **extra,
    }


@dataclass(frozen=True)
class PlaybookRun:
    rc: int
    output: str
    seconds: float


def run_playbook(
    playbook: str,
    inventory: Path,
    control_dir: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 5 * PATIENCE_S,
) -> PlaybookRun:
    """``ansible-playbook`` against the test hosts. ``timeout_s`` is patience, a hang detector (CI under load saw
    site.yml in check mode on two hosts pass 300 s, where it takes about 60 s quiet); how long it took is
    ``seconds``, judged only by the rehearsal (tests/rehearsal/test_hosts.py)."""
    started = time.monotonic()
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), str(ANSIBLE_DIR / playbook), *args],
        capture_output=True,
        text=True,
        cwd=ANSIBLE_DIR,
        env={**ansible_env(control_dir), **(env or {})},
        timeout=timeout_s,
        check=False,
    )
    return PlaybookRun(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started)


# ----- the ten-host scenario: tests/test_preflight_hosts.py (what each host's checks say, the exit code) and
# tests/rehearsal/test_hosts.py (how long the run took) ----------------------------------------------------------------
# Test host -> (faults, checks that must fail on it, words its fix must contain).
SCENARIOS: dict[str, tuple[HostFaults, set[str], str | None]] = {
    "node01": (HostFaults(), set(), None),
    "node02": (HostFaults(ib_down=("mlx5_3",)), {"ib_ports"}, "reseat or replace the cable"),
    "node03": (HostFaults(ib_rate_gbps=200), {"ib_rate"}, "linked below 400 Gb/s"),
    "node04": (HostFaults(clock_offset_s=0.25), {"ntp_offset"}, "chronyc makestep"),
    "node05": (HostFaults(cgroup_v2=False), {"cgroup_v2"}, "systemd.unified_cgroup_hierarchy=1"),
    "node06": (HostFaults(old_kernel=True), {"kernel"}, "Boot a kernel >= 5.15"),
    "node07": (HostFaults(unreachable=True), {"ssh"}, "does not answer SSH"),
    "node08": (HostFaults(), set(), None),
    # One port of one HCA slow, the rest at the link rate: ib_rate must not pass on the fastest port.
    "node09": (HostFaults(ib_port_rates=(("mlx5_2", 1, 200),)), {"ib_rate"}, "linked below 400 Gb/s"),
    # nvidia-smi hangs (a wedged GPU): the probe kills it after its timeout, only the GPU checks fail.
    "node10": (HostFaults(hangs=("nvidia-smi",)), {"gpu_count", "gpu_product", "gpu_memory", "driver", "cuda"}, "Xid"),
}
PROBE_TIMEOUT_S = 5
CONNECT_TIMEOUT_S = 5
# How long the scenario's run may take: one connect timeout for the dead node and one probe timeout for the hung
# tool, the rest in parallel; generous for 2 loaded cores (judged in the rehearsal only)
SCENARIO_RUN_TARGET_S = 150


@dataclass(frozen=True)
class Deployed:
    fleet: HostFleet
    stack: Path
    inventory: Path
    names: dict[str, str]  # spec node name -> test host name

    def spec_name(self, host: str) -> str:
        return next(n for n, h in self.names.items() if h == host)


def deploy(fleet: HostFleet, store: ModelStore, directory: Path, **sections: Any) -> Deployed:
    install_container_stubs(fleet)
    stack = write_stack(directory / "Pulumi.test.yaml", fleet_stack_doc(fleet, store, **sections))
    return Deployed(fleet, stack, write_inventory(directory, stack, fleet), node_names(fleet, stack))


def scenario_fleet(ssh_hosts: Any) -> HostFleet:
    """The ten hosts of :data:`SCENARIOS`, each with its faults (``ssh_hosts``: tests/conftest.py's pool)."""
    return ssh_hosts(len(SCENARIOS), {h: f for h, (f, _, _) in SCENARIOS.items() if f != HostFaults()})


@dataclass(frozen=True)
class Outcome:
    run: PlaybookRun
    report: dict[str, Any]


def run_scenario(scenario: Deployed, out: Path) -> Outcome:
    """One ansible-playbook preflight.yml over all ten scenario hosts, as users run it; its report lands in ``out``.
    run_playbook's timeout (300 s) is the patience: a run that long has hung."""
    run = run_playbook(
        "preflight.yml",
        scenario.inventory,
        out,
        "-e",
        f"preflight_report_path={out}/report.json",
        "-e",
        f"preflight_ssh_probe_timeout_s={PROBE_TIMEOUT_S}",
        # The test hosts are veths on one 2-core machine that runs all their probes at once: pings there average
        # 2–4 ms with 20 ms spikes, above the 2 ms a rack's fabric must meet. These scenarios attribute faults
        # (no host here adds latency), so the average-RTT limit is the machine's, not the datacentre's.
        "-e",
        "preflight_connectivity_max_avg_rtt_ms=50",
        env={"ANSIBLE_TIMEOUT": str(CONNECT_TIMEOUT_S)},
    )
    assert (out / "report.json").exists(), run.output[-4000:]
    return Outcome(run, json.loads((out / "report.json").read_text()))
