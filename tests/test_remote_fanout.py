"""paramiko fan-out against real sshd test hosts: host keys verified, per-host errors and timeouts,
bounded concurrency, and `exaserve fleet exec` as users run it (the read-only guard: test_remote_probes.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from serving.remote.fanout import Target, _hop, fan_out, load_ssh_config, run_one
from serving.remote.probes import FanoutError
from tests.support import fanout
from tests.support.fanout import targets
from tests.support.hosts.faults import HostFaults
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


# ----- ~/.ssh/config: reaching nodes through a bastion (issue 42) ------------------------------------------------------
BEHIND = {"node01": HostFaults(bastion=True), "node02": HostFaults(behind_bastion=True)}  # node03: forwards nothing


@pytest.fixture(scope="module")
def bastioned(ssh_hosts: HostPool) -> HostFleet:
    """node01 a bastion (its sshd forwards TCP), node02 reachable only from its peers, node03 a plain host."""
    return ssh_hosts(3, BEHIND)


def _via(
    fleet: HostFleet, jump: str, tmp_path: Path, known_hosts: Path | None = None, more: str = ""
) -> tuple[str, Path]:
    """``hostname`` on node02 with a client configuration that sends it through ``jump`` (and ``more`` of it);
    (its result, the config)."""
    hidden, hop = fleet["node02"], fleet[jump]
    config = tmp_path / "ssh_config"
    config.write_text(f"Host {hidden.address}\n    ProxyJump root@{hop.address}\n{more}")
    result = run_one(
        Target("node02", hidden.address, hidden.port, "root"), "hostname", known_hosts=known_hosts or fleet.known_hosts,
        identity=fleet.client_key, connect_timeout_s=3, timeout_s=10, ssh_config=load_ssh_config(config),
    )  # fmt: skip
    return f"{result.status}: {result.stdout.strip() or result.error}", config


def test_a_node_behind_a_bastion_is_reached_through_the_proxyjump_of_the_ssh_config(
    bastioned: HostFleet, tmp_path: Path
) -> None:
    """paramiko reads no ~/.ssh/config: operators reach 256 nodes through bastions, and the fan-out (fleet exec, the
    SSH backend's restarts) could not. Direct, node02 does not answer this machine; through node01's sshd (a
    direct-tcpip channel, its host key verified) it runs the command on node02 itself; through node03, whose sshd
    forwards nothing, it fails naming the hop, never silently reaching it another way."""
    hidden = bastioned["node02"]
    direct = fan_out(
        [Target("node02", hidden.address, hidden.port, "root")], ["hostname"], known_hosts=bastioned.known_hosts,
        identity=bastioned.client_key, connect_timeout_s=2, timeout_s=4,
    )  # fmt: skip
    assert [r.status for r in direct] == ["unreachable"], direct
    assert _via(bastioned, "node01", tmp_path)[0] == "ok: node02"
    refused, _config = _via(bastioned, "node03", tmp_path)
    hop = bastioned["node03"].address
    assert refused.startswith(f"unreachable: cannot reach {hidden.address} through its ProxyJump root@{hop}:22: ")
    # the hop's host key is verified against the same known_hosts: a hop missing from it is refused
    lines = [line for line in bastioned.known_hosts.read_text().splitlines() if bastioned["node01"].address not in line]
    partial = tmp_path / "known_hosts"
    partial.write_text("\n".join(lines) + "\n")
    unknown, _config = _via(bastioned, "node01", tmp_path, known_hosts=partial)
    assert unknown.startswith("host-key: ") and f"root@{bastioned['node01'].address}:22" in unknown, unknown


def test_an_ssh_config_that_cannot_be_read_names_itself_and_none_given_reads_the_default(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(FanoutError, match=f"--ssh-config {missing}: cannot read it .*/dev/null for none"):
        load_ssh_config(missing)
    assert load_ssh_config(Path("/dev/null")) == ""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        assert load_ssh_config(None) == ""  # no ~/.ssh/config: none, as ssh without one
        (home / ".ssh" / "config").write_text("Host *\n    ProxyJump bastion\n")
        assert "ProxyJump bastion" in load_ssh_config(None)


def test_a_hops_own_proxyjump_and_an_included_file_are_followed_never_dialled_around(
    bastioned: HostFleet, tmp_path: Path
) -> None:
    """A review of the first cut: a hop's own ProxyJump was dropped (the hop dialled directly) and ``Include`` was
    never read (paramiko keeps it unread), so a bastion defined in ~/.ssh/config.d was skipped. node01's own ProxyJump
    through node03 (which forwards nothing) now fails naming node03; node02 sent through node01 by an included file
    is reached."""
    n1, n3 = bastioned["node01"].address, bastioned["node03"].address
    chained, _config = _via(bastioned, "node01", tmp_path, more=f"Host {n1}\n    ProxyJump root@{n3}\n")
    assert chained.startswith("unreachable: ") and f"root@{n3}:22" in chained, chained
    (tmp_path / "bastions").write_text(f"Host {bastioned['node02'].address}\n    ProxyJump root@{n1}\n")
    main = tmp_path / "main_config"
    main.write_text(f"Include {tmp_path / 'bast*'}\n")
    hidden = bastioned["node02"]
    result = run_one(
        Target("node02", hidden.address, hidden.port, "root"), "hostname", known_hosts=bastioned.known_hosts,
        identity=bastioned.client_key, connect_timeout_s=3, timeout_s=10, ssh_config=load_ssh_config(main),
    )  # fmt: skip
    assert (result.status, result.stdout.strip()) == ("ok", "node02"), result


@pytest.mark.parametrize(
    ("spec", "hop"),
    [
        ("jump", (None, "jump", None)),
        ("bob@jump:2222", ("bob", "jump", 2222)),
        ("ssh://bob@jump:2022", ("bob", "jump", 2022)),
        ("ssh://jump/", (None, "jump", None)),
        ("[2001:db8::1]:2222", (None, "2001:db8::1", 2222)),
        ("2001:db8::1", (None, "2001:db8::1", None)),
    ],
)
def test_proxyjump_hops_parse_as_openssh_reads_them(spec: str, hop: tuple[str | None, str, int | None]) -> None:
    assert _hop(spec) == hop


@pytest.mark.parametrize("spec", ["jump:ssh", "[2001:db8::1", "[2001:db8::1]x", "bob@"])
def test_a_proxyjump_ssh_cannot_follow_is_that_nodes_unreachable_naming_it(spec: str, tmp_path: Path) -> None:
    """Before, ``[addr]:port`` or ``ssh://`` raised ValueError out of run_one: the fan-out's worker died (the node
    read "abandoned") and the SSH backend's gather raised. Now nothing is dialled and the node says why."""
    config = f"Host 10.0.0.7\n    ProxyJump {spec}\n"
    result = run_one(
        Target("n7", "10.0.0.7", 22, "root"), "uptime", known_hosts=Path("/dev/null"), identity=None,
        connect_timeout_s=1, timeout_s=2, ssh_config=config,
    )  # fmt: skip
    assert result.status == "unreachable" and result.error is not None
    assert result.error.startswith(f"--ssh-config: ProxyJump {spec!r}: "), result.error
