"""Fast SSH fan-out with paramiko: one read-only probe on every node at once, never a hang.

``exaserve fleet exec --stack NAME -- nvidia-smi --query-gpu=utilization.gpu --format=csv`` is the
source's per-node monitoring loop run in parallel. Safety rules, all enforced here:

* host keys are verified against known_hosts (:class:`paramiko.RejectPolicy`); an unknown or changed
  key is that host's error, never silently accepted;
* only read-only probes run (:mod:`serving.remote.probes`: each program in the shapes in which it only reads,
  ``date +%s`` but not ``date MMDDhhmm``, ``ip addr show`` but not ``ip -b FILE``); the argv is quoted,
  so shell operators in it are literal arguments, not pipelines or redirections;
* every host has a connect timeout and an overall deadline; at most ``max_parallel`` connections
  are open at once; one host's failure is reported for that host and never stops the others.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import paramiko

from serving.remote.probes import FanoutError, check_read_only
from serving.spec.schema import Node

# paramiko's transport thread logs a failed handshake with its traceback at ERROR ("Error reading SSH protocol
# banner"); where nothing configured logging, Python prints that to stderr (logging.lastResort): 512 tracebacks for a
# rollout's dry run against 256 unreachable nodes (issue 28). Every failure is a HostResult with its one-line message
# already, so paramiko's own log stays out of the user's terminal.
_PARAMIKO_LOG = logging.getLogger("paramiko")
_PARAMIKO_LOG.addHandler(logging.NullHandler())
_PARAMIKO_LOG.propagate = False

Status = Literal["ok", "exit", "timeout", "unreachable", "host-key", "auth", "ssh-error"]


@dataclass(frozen=True)
class Target:
    name: str
    address: str
    port: int
    user: str

    @classmethod
    def from_node(cls, node: Node) -> Target:
        return cls(node.name, str(node.address), node.ssh_port, node.ssh_user)


@dataclass(frozen=True)
class HostResult:
    host: str
    address: str
    status: Status
    exit_code: int | None
    stdout: str
    stderr: str
    error: str | None
    seconds: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _error(target: Target, status: Status, message: str, started: float) -> HostResult:
    return HostResult(target.name, target.address, status, None, "", "", message, time.monotonic() - started)


def run_one(
    target: Target,
    command: str,
    *,
    known_hosts: Path,
    identity: Path | None,
    connect_timeout_s: float,
    timeout_s: float,
    max_output_bytes: int = 1 << 20,
) -> HostResult:
    """Run ``command`` on one host; every outcome, failures included, is a :class:`HostResult`."""
    started = time.monotonic()
    deadline = started + timeout_s
    client = paramiko.SSHClient()
    try:
        client.load_host_keys(str(known_hosts))
    except OSError as exc:
        return _error(target, "host-key", f"cannot read known_hosts {known_hosts}: {exc}", started)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    hostport = target.address if target.port == 22 else f"[{target.address}]:{target.port}"
    # once the exec request is on its way the command may run, whatever the connection does after: paramiko's
    # exec_command re-raises the transport's saved socket error (Channel._wait_for_event), so a reset while it waits
    # for the answer must not read as "unreachable" (nothing ran), which the runtime takes as a restart never made
    sent = False
    try:
        client.connect(
            target.address,
            port=target.port,
            username=target.user,
            key_filename=str(identity) if identity else None,
            timeout=connect_timeout_s,
            banner_timeout=connect_timeout_s,
            auth_timeout=connect_timeout_s,
            channel_timeout=connect_timeout_s,
            allow_agent=identity is None,
            look_for_keys=identity is None,
        )
        channel = client.get_transport().open_session(timeout=connect_timeout_s)  # type: ignore[union-attr]
        sent = True
        channel.exec_command(command)
        out, err = bytearray(), bytearray()
        channel.settimeout(0.2)
        while True:
            if time.monotonic() > deadline:
                return _error(
                    target, "timeout", f"no exit after {timeout_s:g} s (per-host timeout); session closed", started
                )
            got = False
            for recv, buf in ((channel.recv, out), (channel.recv_stderr, err)):
                try:
                    chunk = recv(65536)
                except TimeoutError:
                    continue
                if chunk and len(buf) < max_output_bytes:
                    buf.extend(chunk)
                got = got or bool(chunk)
            if not got and channel.exit_status_ready() and not channel.recv_ready() and not channel.recv_stderr_ready():
                break
        code = channel.recv_exit_status()
        return HostResult(
            target.name,
            target.address,
            "ok" if code == 0 else "exit",
            code,
            out.decode(errors="replace"),
            err.decode(errors="replace"),
            None if code == 0 else f"exited {code}",
            time.monotonic() - started,
        )
    except paramiko.BadHostKeyException as exc:
        return _error(
            target,
            "host-key",
            f"host key of {hostport} CHANGED (got {exc.key.get_name()} "
            f"{exc.key.fingerprint}); verify the node out of band, then replace its line in {known_hosts}",
            started,
        )
    except paramiko.SSHException as exc:
        if "not found in known_hosts" in str(exc):
            return _error(
                target,
                "host-key",
                f"{hostport} is not in {known_hosts}; add its key after checking the fingerprint "
                f"(ssh-keyscan -p {target.port} {target.address}), never auto-accept",
                started,
            )
        if isinstance(exc, paramiko.AuthenticationException):
            return _error(target, "auth", f"authentication as {target.user} failed: {exc}", started)
        return _error(target, "ssh-error", f"SSH error: {exc}", started)
    except (TimeoutError, OSError) as exc:
        if sent:
            return _error(
                target, "ssh-error", f"connection to {hostport} lost after the command was sent: {exc}", started
            )
        if isinstance(exc, TimeoutError):
            return _error(
                target,
                "unreachable",
                f"no SSH answer from {hostport} within {connect_timeout_s:g} s (connect timeout)",
                started,
            )
        return _error(target, "unreachable", f"cannot connect to {hostport}: {exc.strerror or exc}", started)
    finally:
        client.close()


def fan_out(
    targets: Sequence[Target],
    argv: Sequence[str],
    *,
    known_hosts: Path,
    identity: Path | None = None,
    connect_timeout_s: float = 5.0,
    timeout_s: float = 15.0,
    max_parallel: int = 64,
    on_result: Callable[[HostResult], None] | None = None,
) -> list[HostResult]:
    """Run a read-only ``argv`` on every target, at most ``max_parallel`` at a time; results in target order.

    Each host is bounded by ``timeout_s`` (connect included). Workers are daemon threads and the
    call waits at most one ``timeout_s`` per wave of hosts plus a grace period: a worker stuck past
    that (a hang below paramiko's timeouts) is reported as a timeout and abandoned, so the call
    itself always returns.
    """
    command = check_read_only(argv)
    if max_parallel < 1:
        raise FanoutError(f"max_parallel={max_parallel}: need at least 1")
    results: dict[int, HostResult] = {}
    lock = threading.Lock()
    pending = list(enumerate(targets))
    started = time.monotonic()

    def worker() -> None:
        while True:
            with lock:
                if not pending:
                    return
                i, t = pending.pop(0)
            r = run_one(
                t,
                command,
                known_hosts=known_hosts,
                identity=identity,
                connect_timeout_s=connect_timeout_s,
                timeout_s=timeout_s,
            )
            with lock:
                results[i] = r
            if on_result:
                on_result(r)

    threads = [
        threading.Thread(target=worker, name=f"fanout-{n}", daemon=True) for n in range(min(max_parallel, len(targets)))
    ]
    for th in threads:
        th.start()
    waves = -(-len(targets) // max_parallel)
    hard_deadline = started + waves * timeout_s + 5.0
    for th in threads:
        th.join(max(0.0, hard_deadline - time.monotonic()))
    with lock:
        return [
            results.get(i) or _error(t, "timeout", f"still running after {timeout_s:g} s; abandoned", started)
            for i, t in enumerate(targets)
        ]
