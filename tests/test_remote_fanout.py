"""paramiko fan-out against real sshd test hosts: host keys verified, per-host errors and timeouts,
bounded concurrency, and `exaserve fleet exec` as users run it (the read-only guard: test_remote_probes.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from serving.remote.fanout import fan_out
from tests.support import fanout
from tests.support.fanout import targets
from tests.support.hosts.netns import HostFleet, HostPool
from tests.support.patience import finishes
from tests.support.preflight import VENV_BIN, ModelStore, fleet_stack_doc
from tests.support.stacks import write_stack


@pytest.fixture(scope="module")
def fleet(ssh_hosts: HostPool) -> HostFleet:
    return fanout.fleet(ssh_hosts)


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


def test_unreachable_host_is_reported_as_such_and_never_hangs_the_call(fleet: HostFleet) -> None:
    """node03's replies are dropped: its connect times out (2 s) and says so; node01 answers. How long the call took
    against the connect timeout is the rehearsal's (tests/rehearsal/test_hosts.py)."""
    call = finishes(lambda: fanout.unreachable_call(fleet), what="a fan-out to an unreachable host")
    ok, dark = call.results
    assert ok.ok
    assert dark.status == "unreachable" and "within 2 s" in (dark.error or "")


def test_a_slow_host_times_out_and_never_hangs_the_call(fleet: HostFleet) -> None:
    (r,) = finishes(lambda: fanout.slow_call(fleet), what="a fan-out to a host slower than its timeout").results
    assert r.status == "timeout" and "1.5 s" in (r.error or "")


def test_concurrency_is_bounded(fleet: HostFleet) -> None:
    """One at a time: each host's connection ends before the next starts. Two at a time on three hosts: the first two
    are in flight together (they wait for each other before connecting), the third waits for one of them. The
    wall-clock gain is the rehearsal's (tests/rehearsal/test_hosts.py)."""
    serial = finishes(lambda: fanout.waves(fleet, ("node01", "node02"), 1), what="a fan-out one at a time")
    assert all(r.ok for r in serial.call.results)
    assert serial.events == [("enter", 0), ("exit", 0), ("enter", 1), ("exit", 1)]
    three = ("node01", "node02", "node01")
    parallel = finishes(lambda: fanout.waves(fleet, three, 2, meet=2), what="a fan-out two at a time")
    assert all(r.ok for r in parallel.call.results)
    assert parallel.events[:2] == [("enter", 0), ("enter", 1)], parallel.events
    assert parallel.most_in_flight == 2, parallel.events  # the third entered only after one of the first two left


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
