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

OpenSSH's client configuration (``~/.ssh/config`` by default, ``--ssh-config``) is read as ``ssh -p PORT -l USER
ADDRESS`` would read it, so operators reach the fleet through their bastions: the node's address is looked up;
its ``HostName``, ``IdentityFile`` (a ``KEY-cert.pub`` beside a key is offered as its certificate, paramiko's
``key_filename``), ``ProxyJump`` (a chain of ``[user@]host[:port]`` or ``ssh://`` URIs, each hop looked up in the
same file for its ``HostName``, ``Port``, ``User``, ``IdentityFile`` and its own ``ProxyJump``, its host key verified
against the same known_hosts; a hop with only a ``ProxyCommand`` is refused, never dialled directly) and
``ProxyCommand`` (run without a shell, as paramiko does: ``exec`` and ``$VAR`` are not a shell's; a command that
exits is that node's ``unreachable``) apply; ``Include`` is read (paramiko keeps it unread); the stack's port and user win over the
file's ``Port`` and ``User`` (as ``-p`` and ``-l`` do; ``%p`` and ``%r`` expand to them); ``--identity`` wins over
``IdentityFile``; known_hosts is always the one given (``UserKnownHostsFile`` and ``StrictHostKeyChecking`` are not
read: keys are never accepted unverified). Where a host has both, ``ProxyJump`` is taken (OpenSSH takes the first
given). The default file applies to every caller, the controller service included (``--ssh-config /dev/null``).
"""

from __future__ import annotations

import getpass
import glob
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


DEFAULT_SSH_CONFIG = Path("~/.ssh/config")
MAX_INCLUDE_DEPTH = 16  # OpenSSH's READCONF_MAX_DEPTH
MAX_JUMPS = 8


def load_ssh_config(path: Path | None) -> str:
    """The client configuration's text from ``path``, or from :data:`DEFAULT_SSH_CONFIG` when ``path`` is None (``""``
    when that does not exist, as ssh runs without one), its ``Include`` lines replaced by the files they name (paramiko
    keeps them unread: a bastion defined in ``~/.ssh/config.d`` would be skipped and the node dialled directly); a
    file given that cannot be read or parsed is a :class:`FanoutError` naming it."""
    where = (path or DEFAULT_SSH_CONFIG).expanduser()
    if path is None and not where.exists():
        return ""
    try:
        text = _included(where, 0)
        paramiko.SSHConfig.from_text(text)
    except (OSError, UnicodeDecodeError, paramiko.ConfigParseError) as exc:
        raise FanoutError(
            f"--ssh-config {where}: cannot read it ({exc}); pass an OpenSSH client config, or /dev/null for none"
        ) from None
    return text


def _included(path: Path, depth: int) -> str:
    """``path``'s text with each ``Include`` replaced, in place, by the files its patterns match (relative ones under
    ~/.ssh, as ssh_config(5) has it for a user's file), in order, recursively (at most 16 deep, as OpenSSH)."""
    if depth > MAX_INCLUDE_DEPTH:
        raise OSError(f"Include nested more than {MAX_INCLUDE_DEPTH} deep at {path}")
    out = []
    for line in path.read_text().splitlines():
        words = line.replace("=", " ", 1).split()
        if not words or words[0].lower() != "include":
            out.append(line)
            continue
        for pattern in words[1:]:
            full = Path(pattern).expanduser()
            full = full if full.is_absolute() else DEFAULT_SSH_CONFIG.expanduser().parent / full
            for found in sorted(glob.glob(str(full))):
                out.extend(_included(Path(found), depth + 1).splitlines())
    return "".join(f"{line}\n" for line in out)


def _hop(spec: str) -> tuple[str | None, str, int | None]:
    """One ProxyJump hop as OpenSSH parses it: ``[user@]host[:port]`` or ``ssh://[user@]host[:port]``, the host an
    IPv6 address in brackets where it has a port; (user, host, port), None where not given."""
    text = spec.strip()
    if text.lower().startswith("ssh://"):
        text = text[len("ssh://") :].rstrip("/")
    user, _, hostport = text.rpartition("@")
    port = ""
    if hostport.startswith("["):
        host, bracket, rest = hostport[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise FanoutError(f"ProxyJump {spec!r}: an IPv6 host is [ADDRESS]:PORT")
        port = rest[1:]
    elif hostport.count(":") == 1:
        host, _, port = hostport.partition(":")
    else:
        host = hostport  # a bare IPv6 address has no port
    if not host or (port and not port.isdigit()):
        raise FanoutError(f"ProxyJump {spec!r}: expected [user@]host[:port] or ssh://[user@]host[:port]")
    return user or None, host, int(port) if port else None


def _hops(spec: str, config_text: str, seen: tuple[str, ...]) -> list[tuple[str, int, str, list[str]]]:
    """The hops of a ProxyJump value, each looked up in the configuration as ssh does for it (its ``HostName``,
    ``Port``, ``User``, ``IdentityFile``, and its own ``ProxyJump``, whose hops come first); a loop is refused."""
    hops: list[tuple[str, int, str, list[str]]] = []
    if not spec.strip():
        return hops  # no ProxyJump: nothing to look up
    config = paramiko.SSHConfig.from_text(config_text)
    for part in filter(None, (h.strip() for h in spec.split(","))):
        if part.lower() == "none":
            break
        user, host, port = _hop(part)
        if host in seen or len(seen) > MAX_JUMPS:
            raise FanoutError(f"ProxyJump {part!r}: a loop, or more than {MAX_JUMPS} hops ({' → '.join(seen)})")
        own = config.lookup(host)
        if own.get("proxycommand") and not own.get("proxyjump"):
            raise FanoutError(f"ProxyJump {part!r}: its own ProxyCommand is not followed; use ProxyJump for it too")
        if own.get("proxyjump"):
            hops.extend(_hops(str(own["proxyjump"]), config_text, (*seen, host)))
        hops.append(
            (
                own.get("hostname", host),
                port or int(own.get("port", "22")),
                user or own.get("user") or getpass.getuser(),  # ssh's default: the local user
                list(own.get("identityfile", [])),
            )
        )
    return hops


class _HopFailed(Exception):
    """A ProxyJump hop that could not be reached or would not forward: which one, and why."""

    def __init__(self, hop: str, cause: Exception) -> None:
        super().__init__(f"{hop}: {cause}")
        self.cause = cause


@dataclass(frozen=True)
class _Route:
    """How ``ssh -p PORT -l USER ADDRESS`` would reach a node under a client configuration."""

    hostname: str
    identities: list[str]
    jumps: list[tuple[str, int, str, list[str]]]  # (host, port, user, IdentityFiles) of each ProxyJump hop, in order
    proxy_command: str | None


def _route(target: Target, config_text: str) -> _Route:
    """How ssh would reach ``target`` under ``config_text``; a :class:`FanoutError` for a ProxyJump it cannot follow."""
    # the stack's port and user are the command line's -p and -l: put first, they win (the first value obtained wins)
    first = f"Host *\n    Port {target.port}\n    User {target.user}\n\n"
    found = paramiko.SSHConfig.from_text(first + config_text).lookup(target.address)
    command = found.get("proxycommand")
    return _Route(
        hostname=found.get("hostname", target.address),
        identities=list(found.get("identityfile", [])),
        jumps=_hops(str(found.get("proxyjump", "")), config_text, (target.address,)),
        proxy_command=None if command is None or command.lower() == "none" else command,
    )


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
    ssh_config: str = "",
    max_output_bytes: int = 1 << 20,
) -> HostResult:
    """Run ``command`` on one host (reached as ``ssh_config``, the client configuration's text, says); every outcome,
    failures included, is a :class:`HostResult`."""
    started = time.monotonic()
    deadline = started + timeout_s
    client = paramiko.SSHClient()
    hops: list[paramiko.SSHClient] = []
    try:
        client.load_host_keys(str(known_hosts))
    except OSError as exc:
        return _error(target, "host-key", f"cannot read known_hosts {known_hosts}: {exc}", started)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        route = _route(target, ssh_config)
    except FanoutError as exc:  # nothing was sent: unreachable, as the SSH backend must read it
        return _error(target, "unreachable", f"--ssh-config: {exc}", started)
    keys = [str(identity)] if identity else route.identities or None
    hostport = route.hostname if target.port == 22 else f"[{route.hostname}]:{target.port}"
    # once the exec request is on its way the command may run, whatever the connection does after: paramiko's
    # exec_command re-raises the transport's saved socket error (Channel._wait_for_event), so a reset while it waits
    # for the answer must not read as "unreachable" (nothing ran), which the runtime takes as a restart never made
    sent = False
    try:
        try:
            sock = _through(route, target, known_hosts, keys, connect_timeout_s, hops)
        except (_HopFailed, paramiko.SSHException, OSError) as exc:  # a hop, or the ProxyCommand's process
            cause = exc.cause if isinstance(exc, _HopFailed) else exc
            status: Status = (
                "host-key"
                if isinstance(cause, paramiko.BadHostKeyException) or "known_hosts" in str(cause)
                else "auth"
                if isinstance(cause, paramiko.AuthenticationException)
                else "unreachable"
            )
            via = "ProxyJump" if route.jumps else "ProxyCommand"
            return _error(target, status, f"cannot reach {hostport} through its {via} {exc}", started)
        client.connect(
            route.hostname,
            port=target.port,
            username=target.user,
            key_filename=keys,  # type: ignore[arg-type]  # paramiko takes a list of files too (SSHClient.connect)
            timeout=connect_timeout_s,
            banner_timeout=connect_timeout_s,
            auth_timeout=connect_timeout_s,
            channel_timeout=connect_timeout_s,
            allow_agent=identity is None,
            look_for_keys=identity is None,
            sock=sock,
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
        if route.proxy_command and not route.jumps and not sent:  # the command exited, or said nothing SSH
            return _error(
                target, "unreachable", f"cannot reach {hostport} through its ProxyCommand "
                f"{route.proxy_command!r}: {exc}", started,
            )  # fmt: skip
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
        for hop in reversed(hops):
            hop.close()


def _through(
    route: _Route,
    target: Target,
    known_hosts: Path,
    keys: list[str] | None,
    timeout_s: float,
    hops: list[paramiko.SSHClient],
) -> paramiko.Channel | paramiko.ProxyCommand | None:
    """The socket to reach the node through: a ``direct-tcpip`` channel through each ProxyJump hop in turn (each
    hop's host key verified against ``known_hosts``; the clients are appended to ``hops`` for the caller to close),
    the ProxyCommand's pipe, or None (connect directly)."""
    if not route.jumps:
        return paramiko.ProxyCommand(route.proxy_command) if route.proxy_command else None
    sock: paramiko.Channel | None = None
    for i, (host, port, user, own_keys) in enumerate(route.jumps):
        hop_keys = own_keys or keys  # the hop's own IdentityFile, else the node's keys
        hop = paramiko.SSHClient()
        hops.append(hop)
        hop.load_host_keys(str(known_hosts))
        hop.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            hop.connect(
                host, port=port, username=user, key_filename=hop_keys,  # type: ignore[arg-type]  # a list too
                timeout=timeout_s, banner_timeout=timeout_s, auth_timeout=timeout_s, channel_timeout=timeout_s,
                allow_agent=hop_keys is None, look_for_keys=hop_keys is None,
                sock=sock,
            )  # fmt: skip
            nxt = route.jumps[i + 1][:2] if i + 1 < len(route.jumps) else (route.hostname, target.port)
            sock = hop.get_transport().open_channel(  # type: ignore[union-attr]
                "direct-tcpip", nxt, ("127.0.0.1", 0), timeout=timeout_s
            )
        except (paramiko.SSHException, TimeoutError, OSError) as exc:
            raise _HopFailed(f"{user}@{host}:{port}", exc) from exc
    return sock


def fan_out(
    targets: Sequence[Target],
    argv: Sequence[str],
    *,
    known_hosts: Path,
    identity: Path | None = None,
    connect_timeout_s: float = 5.0,
    timeout_s: float = 15.0,
    max_parallel: int = 64,
    ssh_config: str = "",
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
                ssh_config=ssh_config,
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
