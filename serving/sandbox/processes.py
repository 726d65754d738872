"""Start, stop and find the sandbox's processes: simulated SGLang workers and the real SGLang router.

Each process runs in its own session (process group) with its output in ``<state>/<name>.log`` and a
record in ``<state>/<name>.json`` (pid, kernel start time, argv, URLs). The record is the pid file:
:func:`stop_all` reads the records, so ``sandbox down`` stops what ``sandbox up`` started even from
another process, and the start time guards against signalling an unrelated process that reuses a pid.

Everything binds to loopback; the router's flags are checked with the router's own argument parser.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import random
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import httpx

from serving.fleet_http import client_tls
from serving.router.client import parse_workers
from serving.sandbox.worker_config import LOOPBACK, WorkerConfig, health_answer_bound_s

Kind = Literal["worker", "worker-host", "router", "etcd", "controller", "agent", "prometheus"]
WaitFor = Literal["healthy", "listening", "started"]
RouterPolicy = Literal["random", "round_robin", "cache_aware", "power_of_two", "manual"]
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
_POLL_S = 0.05
# A GET /workers cost sglang-router 0.3.2 ≈ 80 µs per registered worker and this process about as much to read
# (418 KB, 0.08 s + 0.1 s at 1,024 workers; not re-measured on smg, whose list also carries each worker's engine
# load): polled every 5 ms per worker, three starting routers' lists take about 10 % of a core.
_LIST_POLL_S_PER_WORKER = 0.005
_KILL_WAIT_S = 10.0
_SMG_METRICS_HOST, _SMG_METRICS_PORT = "0.0.0.0", 29000  # noqa: S104  (smg's own default, refused below)


class SandboxError(RuntimeError):
    """A sandbox process could not be started or stopped; the message says why and what to do."""


@dataclass(frozen=True)
class ProcessRecord:
    """What the state directory remembers about one process."""

    name: str
    kind: Kind
    pid: int
    start_ticks: int
    argv: tuple[str, ...]
    url: str
    metrics_url: str
    log_path: str
    version: str | None = None
    ports: tuple[int, ...] = ()  # a worker host's simulated workers (serving.sandbox.worker_host)

    @classmethod
    def from_json(cls, text: str) -> ProcessRecord:
        data = json.loads(text)
        return cls(**{**data, "argv": tuple(data["argv"]), "ports": tuple(data.get("ports", ()))})

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


class StateDir:
    """``<root>/<name>.json`` records and ``<root>/<name>.log`` logs."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def record_path(self, name: str) -> Path:
        if not name or "/" in name or name.startswith("."):
            raise SandboxError(f"process name {name!r}: use letters, digits, '-' or '_' (it names files)")
        return self.root / f"{name}.json"

    def log_path(self, name: str) -> Path:
        return self.record_path(name).with_suffix(".log")

    def read(self, name: str) -> ProcessRecord | None:
        path = self.record_path(name)
        return ProcessRecord.from_json(path.read_text()) if path.exists() else None

    def records(self) -> list[ProcessRecord]:
        return [ProcessRecord.from_json(p.read_text()) for p in sorted(self.root.glob("*.json"))]

    def write(self, record: ProcessRecord) -> None:
        tmp = self.record_path(record.name).with_suffix(".json.tmp")
        tmp.write_text(record.to_json())
        tmp.replace(self.record_path(record.name))

    def forget(self, name: str) -> None:
        self.record_path(name).unlink(missing_ok=True)

    def forget_stopped(self, record: ProcessRecord) -> None:
        """Forget ``record``'s name unless the record now names another process (one started again under the same
        name meanwhile, e.g. a worker a controller restarted while it was being stopped: its record stays)."""
        now = self.read(record.name)
        if now is not None and (now.pid, now.start_ticks) == (record.pid, record.start_ticks):
            self.forget(record.name)


# ----- ports and process identity --------------------------------------------------------------------
EPHEMERAL_PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_EPHEMERAL_DEFAULT = (32768, 60999)
# Below: well-known and registered service ports, then the sandbox stack's own fixed ports (20000-20199, the
# defaults of serving.spec.schema.SandboxSpec), which a chosen port must not take from a sandbox not yet started.
FIRST_SANDBOX_PORT = 20200
# Where the searches for free ports start: a port number. Unset, a per-process offset (a block) or a random start (single
# ports), so that concurrent runs rarely pick the same; sandboxes brought up side by side on purpose (parallel test
# workers) give each its own start, since a port found free is bound only later, by the process started on it.
PORT_SEARCH_START = "EXASERVE_PORT_SEARCH_START"
# Ports this process handed out lately (port -> when): found free, but bound only later by the process started on them,
# so a search here must not find them free again meanwhile (a worker host's control port on its first worker's port).
_handed_out: dict[int, float] = {}
HANDED_OUT_S = 120.0  # long enough for what was started on them to bind them (or to have failed)


def _taken_lately(ports: range | list[int]) -> bool:
    now = time.monotonic()
    return any(now - _handed_out.get(port, -HANDED_OUT_S) < HANDED_OUT_S for port in ports)


def _hand_out(ports: range | list[int]) -> None:
    now = time.monotonic()
    _handed_out.update(dict.fromkeys(ports, now))


def ephemeral_port_range(path: Path = EPHEMERAL_PORT_RANGE) -> tuple[int, int]:
    """The kernel's ephemeral port range, both ends included: every outgoing connection takes its source port
    from it, so a listener placed there can find its port taken. Linux's default if ``path`` cannot be read."""
    try:
        low, high = (int(v) for v in path.read_text().split())
    except (OSError, ValueError):
        return LINUX_EPHEMERAL_DEFAULT
    return low, high


def _outside_ephemeral() -> tuple[tuple[int, int], list[range]]:
    """The ephemeral range and the spans of ports from :data:`FIRST_SANDBOX_PORT` up that lie outside it."""
    low, high = ephemeral_port_range()
    return (low, high), [range(FIRST_SANDBOX_PORT, min(low, 65536)), range(max(high + 1, FIRST_SANDBOX_PORT), 65536)]


def _search_start(candidates: list[int], default: int) -> int:
    """The index in ``candidates`` (ascending ports) where a search starts: the first at or above
    ``$EXASERVE_PORT_SEARCH_START`` when that is set (wrapping to the first), else ``default``."""
    wanted = os.environ.get(PORT_SEARCH_START)
    if not wanted or not candidates:
        return default
    try:
        port = int(wanted)
    except ValueError:
        raise SandboxError(
            f"{PORT_SEARCH_START}={wanted!r} is not a port number; set a port (e.g. 24000) or unset it"
        ) from None
    return next((i for i, candidate in enumerate(candidates) if candidate >= port), 0)


def _no_free_ports(what: str, host: str, ephemeral: tuple[int, int]) -> SandboxError:
    low, high = ephemeral
    return SandboxError(
        f"no {what} on {host} outside the ephemeral range {low}-{high} (from {FIRST_SANDBOX_PORT} to 65535); stop "
        f"other sandboxes (exaserve sandbox down) or narrow {EPHEMERAL_PORT_RANGE}"
    )


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """``count`` distinct ports that were free a moment ago (held open together while choosing), outside the kernel's
    ephemeral range like :func:`free_port_block`'s, from a random start so concurrent runs rarely pick the same."""
    ephemeral, spans = _outside_ephemeral()
    candidates = [port for span in spans for port in span]
    start = _search_start(candidates, random.randrange(len(candidates)) if candidates else 0)
    chosen: list[int] = []
    with contextlib.ExitStack() as stack:
        for port in candidates[start:] + candidates[:start]:
            if _taken_lately([port]):
                continue
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            try:
                sock.bind((host, port))
            except OSError:
                continue
            chosen.append(port)
            if len(chosen) == count:
                _hand_out(chosen)
                return chosen
    raise _no_free_ports(f"{count} free ports", host, ephemeral)


def free_port(host: str = LOOPBACK) -> int:
    return free_ports(1, host)[0]


def free_port_block(count: int, host: str = LOOPBACK) -> int:
    """A base port with ``count`` consecutive free ports after it (a sandbox's workers listen on base + index),
    outside the kernel's ephemeral range (:func:`ephemeral_port_range`), so no outgoing connection of this or any
    other process can take one of them between this check and the bind. The search starts at a per-process offset
    so concurrent runs rarely pick the same block (or at ``$EXASERVE_PORT_SEARCH_START``)."""
    ephemeral, spans = _outside_ephemeral()
    bases = [base for span in spans for base in range(span.start, span.stop - count + 1)]
    start = _search_start(bases, os.getpid() % 500 * 20)
    for step in range(0, len(bases), 37):
        base = bases[(start + step) % len(bases)]
        if _taken_lately(range(base, base + count)):
            continue
        with contextlib.ExitStack() as stack:
            try:
                for port in range(base, base + count):
                    stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)).bind((host, port))
            except OSError:
                continue
            _hand_out(range(base, base + count))
            return base
    raise _no_free_ports(f"block of {count} consecutive free ports", host, ephemeral)


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (the state letter first); None if there is no such
    pid."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return raw[raw.rindex(")") + 2 :].split()  # the command name may contain spaces and ")"


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) from ``/proc/<pid>/stat``; None if there is no such pid."""
    fields = _stat_fields(pid)
    return None if fields is None else (fields[0], int(fields[19]))


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) process ``pid`` has used, from ``/proc/<pid>/stat``; raises
    :class:`SandboxError` if there is no such pid."""
    fields = _stat_fields(pid)
    if fields is None:
        raise SandboxError(f"no process {pid}: it exited before its CPU time was read")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` in MiB (``VmRSS`` of ``/proc/<pid>/status``); raises
    :class:`SandboxError` if there is no such pid."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError as exc:
        raise SandboxError(f"no process {pid}: it exited before its memory was read") from exc
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise SandboxError(f"process {pid} has no VmRSS (a zombie or a kernel thread)")


def _alive(record: ProcessRecord) -> bool:
    """The recorded process still runs (same pid *and* same start time, not a zombie)."""
    stat = _proc_stat(record.pid)
    if stat is None or stat[1] != record.start_ticks:
        return False
    if stat[0] == "Z":
        _reap(record.pid)
        return False
    return True


def _reap(pid: int) -> None:
    """Collect the exit status if ``pid`` is our child; harmless otherwise."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _log_tail(path: str, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


# ----- starting and stopping --------------------------------------------------------------------
def _spawn(state: StateDir, name: str, argv: Sequence[str]) -> tuple[int, int, str]:
    """Start ``argv`` in a new session with stdout+stderr appended to the log; (pid, start ticks, log)."""
    existing = state.read(name)
    if existing is not None and _alive(existing):
        raise SandboxError(f"process {name!r} already runs (pid {existing.pid}); stop it first or choose another name")
    log = str(state.log_path(name))
    pid = os.posix_spawn(
        argv[0],
        list(argv),
        dict(os.environ),
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ],
        setsid=True,
    )
    stat = _proc_stat(pid)
    if stat is None:
        _reap(pid)
        raise SandboxError(f"{name}: {argv[0]} exited at once; see {log}:\n{_log_tail(log)}")
    return pid, stat[1], log


def _wait(
    state: StateDir,
    record: ProcessRecord,
    ready: Callable[[], bool],
    what: str,
    timeout_s: float,
    *,
    poll_s: float = _POLL_S,
) -> None:
    """Poll ``ready`` every ``poll_s`` until it holds. If the process dies, or ``timeout_s`` passes (then the process
    is stopped), raise with the tail of its log."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if not _alive(record):
            state.forget(record.name)
            raise SandboxError(
                f"{record.name} exited before it was {what}; see {record.log_path}:\n{_log_tail(record.log_path)}"
            )
        if time.monotonic() >= deadline:
            stop_process(state, record.name, timeout_s=5.0)
            raise SandboxError(
                f"{record.name} (pid {record.pid}) not {what} after {timeout_s:.0f} s, stopped it; "
                f"see {record.log_path}:\n{_log_tail(record.log_path)}"
            )
        time.sleep(poll_s)


def http_ok(url: str, timeout_s: float = 1.0) -> bool:
    try:
        return httpx.get(url, timeout=timeout_s, verify=client_tls()).status_code == 200
    except httpx.HTTPError:
        return False


def _listening(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def stop_process(state: StateDir, name: str, *, timeout_s: float = 30.0) -> bool:
    """SIGTERM the process group, wait up to ``timeout_s``, then SIGKILL; forget the record.

    Returns True if a live process was stopped, False if the record was stale or absent.
    """
    return name in stop_processes(state, [name], timeout_s=timeout_s)


def stop_processes(state: StateDir, names: Sequence[str], *, timeout_s: float = 30.0) -> list[str]:
    """:func:`stop_process` for several processes at once: all are signalled, then waited on together (an smg router
    takes half its ``--shutdown-grace-period-secs`` to exit when idle, 5 s at the sandbox's 10 s drain timeout: one
    by one, three routers took 15 s). Returns the names of those that were alive."""
    records = [r for r in (state.read(n) for n in names) if r is not None]
    alive = [r for r in records if _alive(r)]
    for record in alive:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while any(_alive(r) for r in alive) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    survivors = [r for r in alive if _alive(r)]
    for record in survivors:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record.pid, signal.SIGKILL)
    deadline = time.monotonic() + _KILL_WAIT_S
    while survivors := [r for r in survivors if _alive(r)]:
        if time.monotonic() >= deadline:
            for record in records:
                if record not in survivors:
                    state.forget_stopped(record)
            stuck = ", ".join(f"{r.name} (pid {r.pid})" for r in survivors)
            raise SandboxError(
                f"{stuck} survived SIGKILL for {_KILL_WAIT_S:.0f} s (stuck in the kernel?); "
                f"{'its record stays' if len(survivors) == 1 else 'their records stay'} in {state.root} so a later "
                "'sandbox down' can retry"
            )
        time.sleep(_POLL_S)
    for record in records:
        state.forget_stopped(record)
    return [r.name for r in alive]


def stop_all(state: StateDir, *, timeout_s: float = 30.0) -> list[str]:
    """Stop every recorded process in three waves, each at once (:func:`stop_processes`): the routers, so no new
    traffic reaches stopping workers; the controllers and agents, which restart workers; then the rest, once nothing
    can start a worker the records do not yet show."""
    records = sorted(state.records(), key=lambda r: r.name)
    waves = [
        [r.name for r in records if r.kind == "router"],
        [r.name for r in records if r.kind in ("controller", "agent")],
        [r.name for r in records if r.kind not in ("router", "controller", "agent")],
    ]
    return [name for wave in waves for name in stop_processes(state, wave, timeout_s=timeout_s)]


def start_service(
    state: StateDir,
    name: str,
    kind: Kind,
    argv: Sequence[str],
    url: str,
    ready: Callable[[], bool],
    timeout_s: float,
    *,
    ports: Sequence[int] = (),
) -> ProcessRecord:
    """Start a runtime process (etcd, a controller, agents, a worker host serving ``ports``) and wait until ``ready``
    holds."""
    pid, ticks, log = _spawn(state, name, argv)
    record = ProcessRecord(name, kind, pid, ticks, tuple(argv), url, url, log, ports=tuple(ports))
    state.write(record)
    _wait(state, record, ready, "ready", timeout_s)
    return record


def running(record: ProcessRecord) -> bool:
    """The process of ``record`` still runs (same pid and start time, not a zombie; a stopped one counts)."""
    return _alive(record)


def respawn(state: StateDir, record: ProcessRecord, ready: Callable[[], bool], timeout_s: float) -> ProcessRecord:
    """Start ``record``'s command again under its name (after it died), keeping its kind, URLs and version, and wait
    until ``ready`` holds: a node, router or controller coming back after a fault drill."""
    pid, ticks, log = _spawn(state, record.name, record.argv)
    again = ProcessRecord(
        record.name, record.kind, pid, ticks, record.argv, record.url, record.metrics_url, log, record.version
    )
    state.write(again)
    _wait(state, again, ready, "ready", timeout_s)
    return again


# ----- workers ----------------------------------------------------------------------------------
def worker_argv(config: WorkerConfig) -> list[str]:
    return [sys.executable, "-m", "serving.sandbox.worker", *config.to_argv()]


def start_worker(
    state: StateDir, name: str, config: WorkerConfig, *, wait: WaitFor = "healthy", timeout_s: float = 30.0
) -> ProcessRecord:
    """Start a simulated worker; wait until its ``/health`` is 200, its port listens, or not at all."""
    argv = worker_argv(config)
    pid, ticks, log = _spawn(state, name, argv)
    record = ProcessRecord(
        name, "worker", pid, ticks, tuple(argv), config.url, config.url + "/metrics", log, config.version
    )
    state.write(record)
    if wait != "started":
        _wait(state, record, _worker_probe(config, wait), wait, config.startup_delay_s + config.warmup_s + timeout_s)
    return record


def _worker_probe(config: WorkerConfig, wait: WaitFor) -> Callable[[], bool]:
    if wait == "healthy":
        return lambda: http_ok(config.url + "/health", health_answer_bound_s(config))
    return lambda: _listening(config.host, config.port)


def restart_worker(
    state: StateDir, name: str, config: WorkerConfig, *, wait: WaitFor = "healthy", timeout_s: float = 30.0
) -> ProcessRecord:
    """Stop ``name`` (if it runs) and start it again with ``config``, e.g. a new version on the same port."""
    stop_process(state, name, timeout_s=config.shutdown_timeout_s + 5.0)
    return start_worker(state, name, config, wait=wait, timeout_s=timeout_s)


# ----- router -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RouterSpec:
    """Sandbox router flags. Defaults probe health every second so tests see changes quickly; the
    fleet's own values come from the units renderer through ``extra_args`` or :func:`start_router`.

    ``worker_startup_timeout_secs`` bounds how long a registration job waits for a worker's ``/health``
    to answer 200 before it fails (router default 1800 s); until then the worker is not routed to. The job asks every
    ``worker_startup_check_interval`` seconds (smg's default, 30 s, would add up to 30 s to every registration).
    """

    port: int
    prometheus_port: int
    worker_urls: tuple[str, ...] = ()
    policy: RouterPolicy = "round_robin"
    host: str = LOOPBACK
    prometheus_host: str = LOOPBACK
    health_check_interval_secs: int = 1
    # smg's timeout is whole seconds: the first above a healthy /health of a default worker (SGLang's 1 s poll)
    health_check_timeout_secs: int = math.ceil(health_answer_bound_s(WorkerConfig(port=1)))
    health_failure_threshold: int = 2
    health_success_threshold: int = 1
    worker_startup_timeout_secs: int = 30
    worker_startup_check_interval: int = 1
    log_level: Literal["debug", "info", "warn", "error"] = "warn"
    extra_args: tuple[str, ...] = field(default=())

    def to_argv(self) -> list[str]:
        """Router flags (without the interpreter), in the order the router's ``--help`` lists them."""
        argv = ["--host", self.host, "--port", str(self.port)]
        if self.worker_urls:
            argv += ["--worker-urls", *self.worker_urls]
        pairs = [
            ("--policy", self.policy),
            ("--prometheus-host", self.prometheus_host),
            ("--prometheus-port", str(self.prometheus_port)),
            ("--health-check-interval-secs", str(self.health_check_interval_secs)),
            ("--health-check-timeout-secs", str(self.health_check_timeout_secs)),
            ("--health-failure-threshold", str(self.health_failure_threshold)),
            ("--health-success-threshold", str(self.health_success_threshold)),
            ("--worker-startup-timeout-secs", str(self.worker_startup_timeout_secs)),
            ("--worker-startup-check-interval", str(self.worker_startup_check_interval)),
            ("--log-level", self.log_level),
        ]
        argv += [item for pair in pairs for item in pair]
        return argv + list(self.extra_args)


@dataclass(frozen=True)
class RouterEndpoints:
    url: str
    metrics_url: str


def router_endpoints(flags: Sequence[str]) -> RouterEndpoints:
    """Check router flags with the router's own parser and return where it will listen.

    Rejects flags the router does not know and any listener not on loopback (the router's defaults
    are ``0.0.0.0`` for both the API and the Prometheus listener).
    """
    from smg.launch_router import parse_router_args  # noqa: PLC0415 - ≈ 1 s: only where a router starts

    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = parse_router_args(list(flags))
    except SystemExit as exc:
        message = stderr.getvalue().strip().splitlines()[-1:] or ["invalid arguments"]
        raise SandboxError(f"router flags rejected by smg's parser: {message[0]}") from exc
    # smg's launcher leaves the metrics listener unset (None); 1.13.0 then binds 0.0.0.0:29000 (seen live)
    prom_host = str(args.prometheus_host) if args.prometheus_host is not None else _SMG_METRICS_HOST
    prom_port = int(args.prometheus_port) if args.prometheus_port is not None else _SMG_METRICS_PORT
    host = str(args.host)
    for flag, value in (("--host", host), ("--prometheus-host", prom_host)):
        if value not in LOOPBACK_HOSTS:
            raise SandboxError(f"router {flag} {value}: the sandbox listens on loopback only; pass {flag} {LOOPBACK}")
    return RouterEndpoints(
        f"http://{_url_host(host)}:{int(args.port)}",
        f"http://{_url_host(prom_host)}:{prom_port}/metrics",
    )


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _healthy_workers(url: str) -> int:
    try:
        response = httpx.get(url + "/workers", timeout=1.0, verify=client_tls())
    except httpx.HTTPError:
        return -1
    if response.status_code != 200:
        return -1
    return sum(w.is_healthy for w in parse_workers(response.json()))


def start_router(
    state: StateDir,
    flags: Sequence[str],
    *,
    name: str = "router",
    healthy_workers: int = 0,
    timeout_s: float = 30.0,
) -> ProcessRecord:
    """Run ``python -m smg.launch_router FLAGS``; wait until its API and Prometheus listener
    answer and at least ``healthy_workers`` workers are registered and healthy."""
    endpoints = router_endpoints(flags)
    argv = [sys.executable, "-m", "smg.launch_router", *flags]
    pid, ticks, log = _spawn(state, name, argv)
    record = ProcessRecord(name, "router", pid, ticks, tuple(argv), endpoints.url, endpoints.metrics_url, log)
    state.write(record)
    listening = False  # its API and metrics listener, asked until both answer once; then only the workers' list

    def ready() -> bool:
        nonlocal listening
        listening = listening or (http_ok(endpoints.url + "/health") and http_ok(endpoints.metrics_url))
        return listening and _healthy_workers(endpoints.url) >= healthy_workers

    _wait(
        state,
        record,
        ready,
        f"serving with {healthy_workers} healthy workers",
        timeout_s,
        poll_s=max(_POLL_S, healthy_workers * _LIST_POLL_S_PER_WORKER),
    )
    return record
