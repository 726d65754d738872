"""SSH test hosts: one network namespace, one real sshd and one set of stub tools per node.

Each node is a network namespace (veth into the bridge `exs<slot>br`, 10.200.<slot>.1/24 on the
machine's side) running its own `sshd -D` inside `unshare --pid --fork --kill-child --mount-proc
--uts`, so it has its own hostname, process table and mounts: the node's stub folder is
bind-mounted over /usr/local/sbin, /dev/null over /root/.bashrc, its own /etc/hostname, /etc/hosts
(all hosts of its fleet) and /etc/resolv.conf (no name server), and /sys/fs/cgroup holds either
cgroup2 or a hybrid v1 layout. Nodes have no default route: traffic stays on the test network.
Every node has a fresh ed25519 host key; clients verify it against the fleet's known_hosts file
and log in as root with the pool's client key.

A `HostPool` owns one slot (0..15, a lock file under /run/exaserve-testhosts) so concurrent test
sessions do not collide; it first removes whatever a dead session left in that slot. Needs root.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .faults import STUBBED_TOOLS, HostFaults
from .stubs import write_stubs

BASE_DIR = Path("/run/exaserve-testhosts")
MAX_SLOTS = 16
SSH_PORT = 22
FIRST_HOST_OCTET = 10
LAST_HOST_OCTET = 250
READY_TIMEOUT_S = 15.0
REQUIRED_COMMANDS = ("ip", "unshare", "setarch", "mount", "ssh-keygen", "/usr/sbin/sshd")
# Where tools live on the machine; a "missing" tool is masked in each of these inside the node.
SYSTEM_BIN_DIRS = ("/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class SshHost:
    """One test host, as a client needs it."""

    name: str  # inventory name and the node's hostname, e.g. "node03"
    address: str  # IPv4 address sshd listens on, e.g. "10.200.0.12"
    port: int  # sshd port (22)
    netns: str  # network namespace, e.g. "exs0-n12"
    stub_dir: Path  # mounted over /usr/local/sbin on the node
    known_hosts: Path  # known_hosts holding the real host key of every host of the fleet
    client_key: Path  # OpenSSH ed25519 private key that logs in as root
    host_public_key: str  # "ssh-ed25519 AAAA..." of this host
    faults: HostFaults


@dataclass(frozen=True)
class HostFleet:
    """The hosts of one `HostPool.fleet(...)` call."""

    hosts: tuple[SshHost, ...]
    known_hosts: Path
    client_key: Path

    def __getitem__(self, name: str) -> SshHost:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(f"no host {name!r} in this fleet; it has {[h.name for h in self.hosts]}")

    @property
    def names(self) -> list[str]:
        return [host.name for host in self.hosts]

    def inventory(self, *, connect_timeout_s: int = 5) -> dict[str, Any]:
        """A YAML-ready Ansible inventory: group `all`, root over SSH with host keys verified."""
        ssh_args = (
            f"-o UserKnownHostsFile={self.known_hosts} -o GlobalKnownHostsFile=/dev/null "
            f"-o StrictHostKeyChecking=yes -o IdentitiesOnly=yes -o ConnectTimeout={connect_timeout_s}"
        )
        return {
            "all": {
                "vars": {
                    "ansible_user": "root",
                    "ansible_ssh_private_key_file": str(self.client_key),
                    "ansible_ssh_common_args": ssh_args,
                    "ansible_python_interpreter": "/usr/bin/python3",
                    "ansible_timeout": connect_timeout_s,
                },
                "hosts": {h.name: {"ansible_host": h.address, "ansible_port": h.port} for h in self.hosts},
            }
        }

    def write_inventory(self, path: Path, *, connect_timeout_s: int = 5) -> Path:
        """Write `inventory()` as YAML to `path` and return it."""
        path.write_text(yaml.safe_dump(self.inventory(connect_timeout_s=connect_timeout_s), sort_keys=False))
        return path

    @staticmethod
    def ansible_env(control_path_dir: Path) -> dict[str, str]:
        """Environment for `ansible`/`ansible-playbook`/ansible-runner against this fleet: the
        venv's bin first on PATH, a per-test SSH control path dir (keep it short: a socket path
        is limited to 108 bytes), host key checking on, no colour."""
        venv_bin = str(Path(sys.executable).parent)
        return {
            **os.environ,
            "PATH": f"{venv_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control_path_dir),
            "ANSIBLE_HOST_KEY_CHECKING": "True",
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
        }


def unavailable_reason() -> str | None:
    """Why test hosts cannot start on this machine, or None when they can."""
    if os.geteuid() != 0:
        return "SSH test hosts need root (network namespaces, mounts)"
    missing = [c for c in REQUIRED_COMMANDS if shutil.which(c) is None]
    if missing:
        return f"SSH test hosts need {missing}: run scripts/bootstrap.sh (openssh-server, iproute2, util-linux)"
    return None


def _run(args: list[str], *, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, input=stdin, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {result.returncode}: {result.stderr.strip()}")
    return result


def _ip_batch(commands: Iterable[str], *, netns: str | None = None, force: bool = False) -> None:
    """Run many `ip` commands in one process (`ip [-n NS] [-force] -batch -`)."""
    args = ["ip", *(["-n", netns] if netns else []), *(["-force"] if force else []), "-batch", "-"]
    _run(args, stdin="".join(f"{c}\n" for c in commands), check=not force)


def _ssh_keygen(paths: list[Path]) -> list[str]:
    """Create an ed25519 key pair at each path (OpenSSH format, mode 0600, `.pub` beside it),
    in parallel; return the public keys ("ssh-ed25519 AAAA...")."""
    procs = [
        subprocess.Popen(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for path in paths
    ]
    for path, proc in zip(paths, procs, strict=True):
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"ssh-keygen for {path} failed: {err.decode().strip()}")
    return [path.with_suffix(".pub").read_text().strip() for path in paths]


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def sshd_config(*, address: str, host_key: Path, authorized_keys: Path, forwarding: bool = False) -> str:
    """sshd_config of one test host: root by key only, no PAM, no DNS, internal sftp; TCP forwarding only for a
    bastion (``forwarding``)."""
    return "\n".join(
        [
            f"ListenAddress {address}:{SSH_PORT}",
            f"HostKey {host_key}",
            f"AuthorizedKeysFile {authorized_keys}",
            "PidFile none",
            "UsePAM no",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "StrictModes yes",
            "UseDNS no",
            "PrintMotd no",
            "PrintLastLog no",
            "X11Forwarding no",
            f"AllowTcpForwarding {'yes' if forwarding else 'no'}",
            "Subsystem sftp internal-sftp",
            "LogLevel ERROR",
            "",
        ]
    )


def etc_files(node: str, fleet_addresses: Mapping[str, str]) -> dict[str, str]:
    """The node's own /etc/hostname, /etc/hosts (every host of its fleet, as on a real cluster)
    and /etc/resolv.conf (no name server: lookups fail at once on the node's loopback instead of
    waiting for, or reaching, a DNS server outside the test network)."""
    hosts = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    hosts += [f"{address}\t{name}" for name, address in fleet_addresses.items()]
    return {
        "hostname": f"{node}\n",
        "hosts": "\n".join(hosts) + "\n",
        "resolv.conf": "# ExaServe test host: the test network has no DNS server.\nnameserver 127.0.0.1\n",
    }


def node_init_script(*, node: str, node_dir: Path, config: Path, faults: HostFaults) -> str:
    """The script that runs as PID 1 of the node's PID namespace and becomes its sshd.
    `node_dir` holds `stubs/` and `etc/` (see `etc_files`)."""
    lines = [
        "#!/bin/sh",
        f"# PID 1 of test host {node}: {faults.describe()}",
        "set -eu",
        f"hostname {node}",
        f"mount --bind {node_dir}/stubs /usr/local/sbin",
        "if [ -e /root/.bashrc ]; then mount --bind /dev/null /root/.bashrc; fi",
        *(f"mount --bind {node_dir}/etc/{name} /etc/{name}" for name in ("hostname", "hosts", "resolv.conf")),
    ]
    if faults.cgroup_v2:
        lines.append("mount -t cgroup2 cgroup2 /sys/fs/cgroup")
    else:
        # systemd's hybrid layout: tmpfs with v1 hierarchies, v2 only at /sys/fs/cgroup/unified.
        # v1 controllers already bound to v2 on this machine cannot be mounted; skip those.
        lines += [
            "mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup",
            "for c in cpu cpuacct memory pids; do",
            "  mkdir /sys/fs/cgroup/$c",
            "  mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c 2>/dev/null || rmdir /sys/fs/cgroup/$c",
            "done",
            "mkdir /sys/fs/cgroup/systemd",
            "mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd 2>/dev/null"
            " || rmdir /sys/fs/cgroup/systemd",
            "mkdir /sys/fs/cgroup/unified",
            "mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified",
        ]
    if faults.kubelet_flags is not None:
        lines += [
            "mount -t tmpfs -o mode=755 tmpfs /etc/default",
            f"printf 'KUBELET_EXTRA_ARGS=\"%s\"\\n' {shlex.quote(faults.kubelet_flags)} > /etc/default/kubelet",
        ]
    for tool in faults.missing_tools:
        for directory in SYSTEM_BIN_DIRS:
            path = f"{directory}/{tool}"
            lines.append(f"if [ -e {path} ]; then mount --bind /dev/null {path}; fi")
    launcher = "setarch --uname-2.6 " if faults.old_kernel else ""
    lines.append(f"exec {launcher}/usr/sbin/sshd -D -e -f {config}")
    return "\n".join(lines) + "\n"


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the test process dies, so even a killed
    pytest leaves no sshd behind (the namespaces are removed by the next session)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class _Node:
    host: SshHost
    process: subprocess.Popen[bytes]


@dataclass
class HostPool:
    """Session-wide owner of test hosts; call it (or `.fleet`) to get a `HostFleet`."""

    slot: int
    root: Path
    lock_fd: int
    client_key: Path
    authorized_keys: Path
    _next_octet: int = FIRST_HOST_OCTET
    _fleets: dict[tuple[int, tuple[tuple[str, HostFaults], ...]], HostFleet] = field(default_factory=dict)
    _nodes: list[_Node] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"exs{self.slot}br"

    @property
    def gateway(self) -> str:
        """The machine's address on the test network."""
        return f"10.200.{self.slot}.1"

    @classmethod
    def acquire(cls) -> HostPool:
        """Lock the first free slot, clean what a dead session left there, create the bridge."""
        BASE_DIR.mkdir(mode=0o700, exist_ok=True)
        os.chmod(BASE_DIR, 0o700)
        for slot in range(MAX_SLOTS):
            fd = os.open(BASE_DIR / f"slot{slot}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                _remove_slot_leftovers(slot)
                root = BASE_DIR / f"slot{slot}"
                root.mkdir(mode=0o700)
                client_key = root / "client_ed25519"
                (public,) = _ssh_keygen([client_key])
                authorized_keys = root / "authorized_keys"
                _write_private(authorized_keys, public + "\n")
                Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
                _ip_batch(
                    [
                        f"link add exs{slot}br type bridge",
                        f"addr add 10.200.{slot}.1/24 dev exs{slot}br",
                        f"link set exs{slot}br up",
                    ]
                )
            except BaseException:
                _remove_slot_leftovers(slot)
                os.close(fd)
                raise
            return cls(slot, root, fd, client_key, authorized_keys)
        raise RuntimeError(f"all {MAX_SLOTS} test-host slots under {BASE_DIR} are locked by running sessions")

    def __call__(self, count: int = 4, faults: Mapping[str, HostFaults] | None = None) -> HostFleet:
        return self.fleet(count, faults)

    def fleet(self, count: int = 4, faults: Mapping[str, HostFaults] | None = None) -> HostFleet:
        """`count` hosts named node01..nodeNN; `faults` maps a host name to its faults (others are
        healthy). The same request returns the same running fleet for the rest of the session."""
        faults = dict(faults or {})
        names = [f"node{i:02d}" for i in range(1, count + 1)]
        unknown = sorted(set(faults) - set(names))
        if unknown:
            raise ValueError(f"faults for {unknown}, but the fleet has {names[0]}..{names[-1]}")
        key = (count, tuple(sorted(faults.items())))
        if key not in self._fleets:
            self._fleets[key] = self._start(names, faults)
        return self._fleets[key]

    def _start(self, names: list[str], faults: Mapping[str, HostFaults]) -> HostFleet:
        if self._next_octet + len(names) - 1 > LAST_HOST_OCTET:
            raise RuntimeError(
                f"test network 10.200.{self.slot}.0/24 is full: {len(names)} more hosts do not fit "
                f"after {self._next_octet - FIRST_HOST_OCTET} started this session"
            )
        octets = list(range(self._next_octet, self._next_octet + len(names)))
        self._next_octet += len(names)
        fleet_dir = self.root / f"fleet-{octets[0]}"
        fleet_dir.mkdir(mode=0o700)
        known_hosts = fleet_dir / "known_hosts"
        for name in names:
            (fleet_dir / name).mkdir()
        host_keys = [fleet_dir / name / "ssh_host_ed25519_key" for name in names]
        public_keys = _ssh_keygen(host_keys)
        addresses = {name: f"10.200.{self.slot}.{octet}" for name, octet in zip(names, octets, strict=True)}
        hosts, veths, scripts = [], [], []
        for name, octet, host_key, public in zip(names, octets, host_keys, public_keys, strict=True):
            host_faults = faults.get(name, HostFaults())
            node_dir = host_key.parent
            address = addresses[name]
            config = node_dir / "sshd_config"
            config.write_text(
                sshd_config(
                    address=address, host_key=host_key, authorized_keys=self.authorized_keys,
                    forwarding=host_faults.bastion,
                )
            )  # fmt: skip
            stub_dir = node_dir / "stubs"
            write_stubs(stub_dir, name, host_faults)
            (node_dir / "etc").mkdir()
            for etc_name, text in etc_files(name, addresses).items():
                (node_dir / "etc" / etc_name).write_text(text)
            script = node_dir / "init.sh"
            script.write_text(node_init_script(node=name, node_dir=node_dir, config=config, faults=host_faults))
            hosts.append(
                SshHost(
                    name=name,
                    address=address,
                    port=SSH_PORT,
                    netns=f"exs{self.slot}-n{octet}",
                    stub_dir=stub_dir,
                    known_hosts=known_hosts,
                    client_key=self.client_key,
                    host_public_key=public,
                    faults=host_faults,
                )
            )
            veths.append(f"exs{self.slot}v{octet}")
            scripts.append(script)
        known_hosts.write_text("".join(f"{h.address} {h.host_public_key}\n" for h in hosts))

        root_commands = []
        for host, veth in zip(hosts, veths, strict=True):
            root_commands += [
                f"netns add {host.netns}",
                f"link add {veth} type veth peer name eth0 netns {host.netns}",
                f"link set {veth} master {self.bridge} up",
            ]
        _ip_batch(root_commands)
        configure = [
            subprocess.Popen(
                ["ip", "-n", host.netns, "-batch", "-"],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for host in hosts
        ]
        for host, proc in zip(hosts, configure, strict=True):
            _, err = proc.communicate(f"link set lo up\naddr add {host.address}/24 dev eth0\nlink set eth0 up\n")
            if proc.returncode != 0:
                raise RuntimeError(f"configuring {host.netns} failed: {err.strip()}")
        for host, script in zip(hosts, scripts, strict=True):
            with open(script.parent / "sshd.log", "wb") as log:
                process = subprocess.Popen(
                    [
                        "ip",
                        "netns",
                        "exec",
                        host.netns,
                        "unshare",
                        "--pid",
                        "--fork",
                        "--kill-child",
                        "--mount-proc",
                        "--uts",
                        "/bin/sh",
                        str(script),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    preexec_fn=_die_with_parent,  # noqa: PLW1509 - single-threaded here, needed for PDEATHSIG
                )
            self._nodes.append(_Node(host, process))
        self._wait_ready(hosts)
        for host in hosts:
            if host.faults.unreachable:
                # Drop every reply the node would send, to this machine and to its peers: SSH and
                # ping to it time out, as to a node that went dark, while its sshd keeps running.
                peers = [h.address for h in hosts if h is not host]
                _ip_batch([f"route add blackhole {a}/32" for a in (self.gateway, *peers)], netns=host.netns)
            elif host.faults.behind_bastion:  # its peers reach it; this machine does not
                _ip_batch([f"route add blackhole {self.gateway}/32"], netns=host.netns)
        return HostFleet(tuple(hosts), known_hosts, self.client_key)

    def _wait_ready(self, hosts: list[SshHost]) -> None:
        """Wait until every sshd sends its SSH banner."""
        pending = {h.name: h for h in hosts}
        deadline = time.monotonic() + READY_TIMEOUT_S
        while pending:
            for name, host in list(pending.items()):
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection((host.address, host.port), timeout=0.5) as conn,
                ):
                    if conn.recv(8).startswith(b"SSH-2.0"):
                        del pending[name]
            if not pending:
                return
            dead = [n.host.name for n in self._nodes if n.host.name in pending and n.process.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = {
                    name: (host.stub_dir.parent / "sshd.log").read_text(errors="replace")[-2000:]
                    for name, host in pending.items()
                }
                raise RuntimeError(f"sshd did not come up on {sorted(pending)} (exited: {dead}); logs: {logs}")
            time.sleep(0.02)

    def close(self) -> None:
        """Kill every node's namespace wrapper (its sshd and all it started die with it), then
        delete the slot's veths, namespaces, bridge and files, and release the slot."""
        try:
            for node in self._nodes:
                node.process.kill()
            for node in self._nodes:
                node.process.wait()
            self._nodes.clear()
            _remove_slot_leftovers(self.slot)
        finally:
            os.close(self.lock_fd)


def _remove_slot_leftovers(slot: int) -> None:
    """Remove everything of `slot` (the caller holds its lock, so no running session owns it):
    processes left in its namespaces, then veths, namespaces, bridge and files. Runs when a pool
    closes and again when the next session takes the slot, in case a session died uncleanly."""
    prefix = f"exs{slot}-n"
    namespaces = [
        line.split()[0] for line in _run(["ip", "netns", "list"]).stdout.splitlines() if line.startswith(prefix)
    ]
    for netns in namespaces:
        for pid in _run(["ip", "netns", "pids", netns], check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    links = [
        line.split()[1].split("@")[0].rstrip(":")
        for line in _run(["ip", "-o", "link", "show"]).stdout.splitlines()
        if line.split()[1].startswith((f"exs{slot}v", f"exs{slot}br"))
    ]
    _ip_batch([*(f"link del {link}" for link in links), *(f"netns del {ns}" for ns in namespaces)], force=True)
    shutil.rmtree(BASE_DIR / f"slot{slot}", ignore_errors=True)


__all__ = [
    "STUBBED_TOOLS",
    "HostFaults",
    "HostFleet",
    "HostPool",
    "SshHost",
    "etc_files",
    "node_init_script",
    "sshd_config",
    "unavailable_reason",
]
