"""paramiko fan-out against real sshd test hosts: host keys verified, per-host errors and timeouts,
bounded concurrency, and `exaserve fleet exec` as users run it (the read-only guard: test_remote_probes.py)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from serving.remote.fanout import Target, fan_out
from tests.support.hosts.faults import HostFaults
from tests.support.hosts.netns import HostFleet, HostPool
from tests.support.preflight import VENV_BIN, ModelStore, fleet_stack_doc
from tests.support.stacks import write_stack


@pytest.fixture(scope="module")
def fleet(ssh_hosts: HostPool) -> HostFleet:
    return ssh_hosts(3, {"node03": HostFaults(unreachable=True)})


def targets(fleet: HostFleet, names: tuple[str, ...] = ("node01", "node02")) -> list[Target]:
    return [Target(fleet[n].name, fleet[n].address, fleet[n].port, "root") for n in names]


def test_runs_on_every_host_and_quotes_shell_operators(fleet: HostFleet) -> None:
    results = fan_out(targets(fleet), ["echo", "x; hostname"], known_hosts=fleet.known_hosts, identity=fleet.client_key)
    assert [r.status for r in results] == ["ok", "ok"]
    assert all(r.stdout == "x; hostname\n" for r in results)  # one literal argument, not two commands
    results = fan_out(targets(fleet), ["hostname"], known_hosts=fleet.known_hosts, identity=fleet.client_key)
    assert [r.stdout.strip() for r in results] == ["node01", "node02"]


def test_stub_probe_the_source_runs_per_node(fleet: HostFleet) -> None:
    """The source's GPU query loop, all nodes at once (nvidia-smi is the recorded-output stub)."""
    argv = ["nvidia-smi", "--query-gpu=index,name,memory.total,memory.used", "--format=csv"]
    results = fan_out(targets(fleet), argv, known_hosts=fleet.known_hosts, identity=fleet.client_key)
    assert all(r.ok and r.stdout.count("NVIDIA H100 80GB HBM3") == 8 for r in results), results


def test_unknown_and_changed_host_keys_are_rejected_per_host(fleet: HostFleet, tmp_path: Path) -> None:
    lines = fleet.known_hosts.read_text().splitlines()
    n1, n2 = fleet["node01"], fleet["node02"]
    other = (
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    )
    known = tmp_path / "known_hosts"
    # node01 missing, node02 with another key.
    known.write_text("".join(f"{ln}\n" for ln in lines if not ln.startswith((n1.address + " ", n2.address + " ")))
                     + f"{n2.address} {other.decode()}\n")  # fmt: skip
    r1, r2 = fan_out(targets(fleet), ["hostname"], known_hosts=known, identity=fleet.client_key)
    assert r1.status == "host-key" and "is not in" in (r1.error or "") and "never auto-accept" in (r1.error or "")
    assert r2.status == "host-key" and "CHANGED" in (r2.error or "")
    assert known.read_text().count(n1.address) == 0  # nothing was added


def test_unreachable_host_is_reported_within_the_connect_timeout(fleet: HostFleet) -> None:
    started = time.monotonic()
    results = fan_out(
        targets(fleet, ("node01", "node03")), ["uptime"], known_hosts=fleet.known_hosts, identity=fleet.client_key,
        connect_timeout_s=2, timeout_s=5,
    )  # fmt: skip
    assert results[0].ok
    assert results[1].status == "unreachable" and "within 2 s" in (results[1].error or "")
    assert time.monotonic() - started < 5


def test_a_slow_host_times_out_and_never_hangs_the_call(fleet: HostFleet) -> None:
    started = time.monotonic()
    (r,) = fan_out(
        targets(fleet, ("node01",)), ["ping", "-c", "30", "-i", "0.2", "127.0.0.1"], known_hosts=fleet.known_hosts,
        identity=fleet.client_key, timeout_s=1.5,
    )  # fmt: skip
    assert r.status == "timeout" and "1.5 s" in (r.error or "")
    assert time.monotonic() - started < 4


def test_concurrency_is_bounded(fleet: HostFleet) -> None:
    argv = ["ping", "-c", "3", "-i", "0.2", "127.0.0.1"]  # ≈ 0.4 s on the node
    kwargs = {"known_hosts": fleet.known_hosts, "identity": fleet.client_key}
    started = time.monotonic()
    serial = fan_out(targets(fleet), argv, max_parallel=1, **kwargs)  # type: ignore[arg-type]
    wall = time.monotonic() - started
    assert all(r.ok for r in serial)
    # One connection at a time: the call lasts at least as long as the hosts together.
    assert wall >= sum(r.seconds for r in serial)
    started = time.monotonic()
    parallel = fan_out(targets(fleet), argv, max_parallel=2, **kwargs)  # type: ignore[arg-type]
    assert time.monotonic() - started < sum(r.seconds for r in parallel)


def _stack(fleet: HostFleet, tmp_path: Path) -> Path:
    doc = fleet_stack_doc(fleet, ModelStore(Path("/dev/shm/unused"), "unused/model"), racks=1)
    return write_stack(tmp_path / "Pulumi.fanout.yaml", doc)


def fleet_exec(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VENV_BIN / "exaserve"), "fleet", "exec", *args], capture_output=True, text=True,
                          timeout=60, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})  # fmt: skip


def test_cli_fleet_exec_json_and_exit_codes(fleet: HostFleet, tmp_path: Path) -> None:
    stack = _stack(fleet, tmp_path)
    common = ["--stack-file", str(stack), "--known-hosts", str(fleet.known_hosts), "-i", str(fleet.client_key)]
    r = fleet_exec(*common, "--json", "--connect-timeout-s", "2", "--", "uname", "-s")
    assert r.returncode == 1, r.stderr  # node03 is unreachable
    doc = json.loads(r.stdout)
    by_host = {x["address"]: x for x in doc["results"]}
    assert by_host[fleet["node01"].address]["stdout"] == "Linux\n"
    assert by_host[fleet["node03"].address]["status"] == "unreachable"
    first_two = ",".join(x["host"] for x in doc["results"][:2])
    r = fleet_exec(*common, "--limit", first_two, "--", "uname", "-s")
    assert r.returncode == 0 and "2/2 nodes ok" in r.stdout
    r = fleet_exec(*common, "--", "reboot")
    assert r.returncode == 2 and "not a read-only probe" in r.stderr
    r = fleet_exec("--stack-file", str(stack), "--known-hosts", str(tmp_path / "none"), "--", "uptime")
    assert r.returncode == 2 and "host keys are always verified" in r.stderr
