"""The scale sandbox: any stack's replica inventory as SIMULATED SGLang workers on loopback (``exaserve sandbox up
--stack prod --simulate``), behind the stack's own number of real routers and controllers, with its node agents.

The sandbox section is derived from the stack, never copied into a stack file by hand (:func:`simulated_document`):

* ports: one free block outside the ephemeral range (workers, router 0 and its metrics, the runtime's ports of
  :func:`serving.sandbox.runtime.runtime_ports`, then one control port per worker host);
* the layout: :data:`WORKERS_PER_PROCESS` workers (whole nodes) share one event loop
  (:mod:`serving.sandbox.worker_host`), and the agents of the same nodes share one ``exaserve agent run``;
* time: the rollout's waits (soak interval, baseline window, warm-up) and a replica's restart from the local cache
  (the simulated start-up) are the stack's divided by :data:`TIME_SCALE` — a minute becomes a second — but the soak
  never shorter than two of the router's load polls (:func:`serving.rollout.plan.qps_window_min_s`; prod: 10 s, not
  5), so a 5-batch rollout's configured waits take 53.5 s instead of 28.5 min (its wall time at 2,048 is the
  routers', below). Bounds are not waits and stay the stack's, but one: ``rollout.drain_timeout_s`` also bounds
  a batch's removal from every router, the routers' own work — sglang-router 0.3.2 rebuilt its hash ring over
  every worker on each change, ~70 ms of CPU at 2,048 (docs/scale.md; smg 1.13's cost: docs/rollout.md) — which a
  fleet's router gives a core of its
  own (410 changes: 29 s) and the rehearsal's three routers share two cores for (150-180 s, past prod's 120 s). The
  derived stack bounds it like a readmission, by ``rollout.health_timeout_s``. Heartbeats, health-check timeouts,
  failure thresholds and the lease stay the stack's: they are what the rehearsal measures;
* releases: every release of the stack is simulated (the defaults of ``SandboxVersion``), plus
  :data:`REHEARSAL_RELEASE` on the stable image so a rollout can be rehearsed (``--to rehearsal``).

The derived stack is written to ``<state-dir>/<stack>-simulated/Pulumi.<stack>-simulated.yaml``: its own name, so its
journal and locks never mix with the real stack's; every other command drives it with ``--stack-file``.

Bounded: :func:`check_machine` refuses a sandbox with a port in the machine's ephemeral port range, or one the
machine's file descriptors (``RLIMIT_NOFILE``, whose soft limit it raises up to the hard one), memory
(``MemAvailable``) or CPU (:mod:`serving.sandbox.capacity`: the steady state's cores from costs measured on this
machine) cannot hold, naming the figure and the fix.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import resource
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from serving.plan.model import Fleet, Plan
from serving.rollout.journal import StackState
from serving.rollout.plan import qps_window_min_s
from serving.sandbox.backend import node_groups
from serving.sandbox.capacity import CPU_SHARE, Costs, CpuNeed, cpu_need, cpus
from serving.sandbox.processes import EPHEMERAL_PORT_RANGE, ephemeral_port_range, free_port_block
from serving.sandbox.prometheus import prometheus_port
from serving.sandbox.runtime import runtime_ports
from serving.spec.schema import FleetSpec
from serving.spec.stack import NAMESPACE, Stack, absolute_model_paths, load_stack_file, read_stack_document

SIMULATED_SUFFIX = "-simulated"
TIME_SCALE = 60.0  # the stack's minutes become the sandbox's seconds
WORKERS_PER_PROCESS = 256  # simulated workers one event loop serves (rounded down to whole nodes)
REHEARSAL_RELEASE = "rehearsal"
MEMINFO = Path("/proc/meminfo")
MIB = 1 << 20

# Resident memory and open files, measured on the 2-core Debian machine of docs/scale.md (128, 512 and 2,048 replicas),
# rounded up: base of a process + per simulated worker (or replica, node) it serves.
HOST_MIB = (45.0, 0.25)  # worker host: Python + aiohttp, + per hosted worker
WORKER_PROCESS_MIB = 45.0  # one process per worker (the default layout)
ROUTER_MIB = (60.0, 0.07)  # the router, + per registered worker (smg 1.13.0: 76 MiB at 256, 192 MiB at 2,048)
AGENTS_MIB = (70.0, 1.5)  # exaserve agent run, + per node
CONTROLLER_MIB = (90.0, 0.1)  # exaserve controller run, + per replica
ETCD_MIB = 60.0
BASE_FDS = 64
ROUTER_FDS_PER_WORKER = 3  # its health-check and request connection pools (2.2 measured)
HOST_FDS_PER_WORKER_PER_ROUTER = 3  # the same connections, seen from the worker's side
HOST_FDS_PER_WORKER = 3  # its listener, an agent's connection, an updater's or controller's
MEMORY_HEADROOM = 1.25


class MachineTooSmall(ValueError):
    """The machine cannot hold the sandbox (its ports, files, memory or cores); the message names the figure, what the
    machine has and the fix."""


def simulated_name(name: str) -> str:
    return name + SIMULATED_SUFFIX


def simulated_stack_file(name: str, state_dir: Path | None) -> Path:
    """Where ``sandbox up --stack NAME --simulate`` writes the derived stack (inside its own state directory)."""
    derived = simulated_name(name)
    return StackState.for_stack(derived, state_dir).root / f"Pulumi.{derived}.yaml"


def _port_span(spec: FleetSpec) -> int:
    """Ports of the runtime block from ``sandbox.runtime_base_port`` (etcd, controllers, Prometheus, routers 1…)."""
    return 20 + 2 * (spec.scheduler.instances - 1)


def simulated_document(stack: Stack, plan: Plan, *, ports_base: int | None = None) -> dict[str, Any]:
    """The stack's document with the derived ``sandbox:`` section, rehearsal release and shortened waits (module doc).

    ``ports_base``: the first port of the block (default: a free block of the size the stack needs)."""
    spec = stack.spec
    if spec.sandbox is not None:
        raise ValueError(
            f"stack {stack.name!r} already has a sandbox: section; run `exaserve sandbox up` without --simulate"
        )
    doc = copy.deepcopy(read_stack_document(stack.path))
    if doc.get("model"):
        doc["model"] = absolute_model_paths(doc["model"], stack.path.parent)
    replicas = len(plan.replicas)
    nodes = len({r.node.name for r in plan.replicas})
    per_node = math.ceil(replicas / nodes)
    nodes_per_process = max(1, WORKERS_PER_PROCESS // per_node)
    hosts = math.ceil(nodes / nodes_per_process)
    span = _port_span(spec)
    base = free_port_block(replicas + 2 + span + hosts) if ports_base is None else ports_base
    serving = doc.setdefault("serving", {})
    serving["releases"] = {**spec.serving.releases, REHEARSAL_RELEASE: spec.serving.image}
    serving["warmup_duration_s"] = spec.serving.warmup_duration_s / TIME_SCALE
    rollout = doc.setdefault("rollout", {})
    rollout["baseline_window_s"] = spec.rollout.baseline_window_s / TIME_SCALE
    # no shorter than two of the router's load polls, whose heartbeat stays the stack's, or no QPS gate is judged
    rollout["interval_s"] = max(spec.rollout.interval_s / TIME_SCALE, qps_window_min_s(spec))
    rollout["drain_timeout_s"] = max(spec.rollout.drain_timeout_s, spec.rollout.health_timeout_s)
    startup_s = plan.restart_from_cache_s.value / TIME_SCALE
    doc["sandbox"] = {
        "worker_base_port": base,
        "router_port": base + replicas,
        "prometheus_port": base + replicas + 1,
        "runtime_base_port": base + replicas + 2,
        "control_base_port": base + replicas + 2 + span,
        "nodes_per_process": nodes_per_process,
        "runtime": True,
        "prometheus": False,  # scraping thousands of workers would take the cores the rehearsal measures
        "versions": {name: {"startup_s": startup_s} for name in serving["releases"]},
    }
    return doc


def write_simulated_stack(stack: Stack, plan: Plan, state_dir: Path | None) -> Stack:
    """Derive the simulated stack (:func:`simulated_document`), write it beside its state and load it back."""
    path = simulated_stack_file(stack.name, state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = simulated_document(stack, plan)
    header = (
        f"# generated by `exaserve sandbox up --simulate` from {stack.path}: the stack's replica inventory as simulated\n"
        "# workers on loopback, waits shortened (serving/sandbox/scale.py); do not edit, run it again\n"
    )
    body = yaml.safe_dump({"config": {f"{NAMESPACE}:{k}": v for k, v in doc.items()}}, sort_keys=False)
    path.write_text(header + body)
    return load_stack_file(path)


# ----- what the machine must hold ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Needs:
    """The most file descriptors one process of the sandbox opens (and which), the memory all of them take and, when
    measured, the cores they keep busy."""

    fds: int
    fds_process: str
    memory_mib: float
    memory_parts: Mapping[str, float]
    cpu: CpuNeed | None = None  # the steady state's cores, when the costs were measured


def needs(fleet: Fleet) -> Needs:
    """File descriptors and memory of the sandbox of ``spec`` (figures measured here, module constants)."""
    sandbox = fleet.spec.sandbox
    if sandbox is None:
        raise ValueError("this stack has no sandbox: section")
    replicas = len(fleet.plan.replicas)
    routers = fleet.spec.scheduler.instances if sandbox.runtime else 1
    groups = node_groups(fleet)
    hosted = 1 if sandbox.nodes_per_process is None else max(len(g.ports) for g in groups)
    worker_side = hosted * (HOST_FDS_PER_WORKER + HOST_FDS_PER_WORKER_PER_ROUTER * routers)
    fds = {
        f"a router ({replicas} workers × {ROUTER_FDS_PER_WORKER})": BASE_FDS + replicas * ROUTER_FDS_PER_WORKER,
        f"a worker process ({hosted} workers × ({HOST_FDS_PER_WORKER} + {HOST_FDS_PER_WORKER_PER_ROUTER} × "
        f"{routers} routers))": BASE_FDS + worker_side,
    }
    which = max(fds, key=lambda k: fds[k])
    if sandbox.nodes_per_process is None:
        workers_mib = replicas * WORKER_PROCESS_MIB
    else:
        workers_mib = len(groups) * HOST_MIB[0] + replicas * HOST_MIB[1]
    parts = {"workers": workers_mib, "routers": routers * (ROUTER_MIB[0] + replicas * ROUTER_MIB[1])}
    if sandbox.runtime:
        nodes = sum(len(g.nodes) for g in groups)
        parts["agents"] = len(groups) * AGENTS_MIB[0] + nodes * AGENTS_MIB[1]
        parts["controllers"] = fleet.spec.scheduler.instances * (CONTROLLER_MIB[0] + replicas * CONTROLLER_MIB[1])
        parts["etcd"] = ETCD_MIB
    return Needs(fds[which], which, sum(parts.values()) * MEMORY_HEADROOM, parts)


def mem_available_mib(meminfo: Path = MEMINFO) -> float | None:
    """``MemAvailable`` of ``/proc/meminfo`` in MiB; None when the kernel does not say."""
    try:
        for line in meminfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key == "MemAvailable":
                return int(value.split()[0]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def sandbox_ports(fleet: Fleet) -> dict[str, list[int]]:
    """Every port ``sandbox up`` listens on, by the ``sandbox.`` field it derives from (the workers, router 0 and its
    metrics; with ``runtime`` etcd, the controllers and the other routers; with ``prometheus`` its server; in the
    scale layout the worker processes' control ports)."""
    spec = fleet.spec
    sandbox = spec.sandbox
    if sandbox is None:
        raise ValueError("this stack has no sandbox: section")
    groups = node_groups(fleet)
    ports = {
        "worker_base_port": sorted(p for g in groups for p in g.ports),
        "router_port": [sandbox.router_port],
        "prometheus_port": [sandbox.prometheus_port],
    }
    runtime: list[int] = []
    if sandbox.runtime:
        rp = runtime_ports(spec)
        runtime += [rp.etcd_client, rp.etcd_peer, *rp.controllers, *(p for pair in rp.routers[1:] for p in pair)]
    if sandbox.prometheus:
        runtime.append(prometheus_port(spec))
    if runtime:
        ports["runtime_base_port"] = sorted(runtime)
    if sandbox.nodes_per_process is not None:
        ports["control_base_port"] = [sandbox.control_base_port + g.index for g in groups]
    return ports


def check_ports(fleet: Fleet, port_range: Path = EPHEMERAL_PORT_RANGE) -> None:
    """Raise :class:`MachineTooSmall` when a port of the sandbox lies in this machine's ephemeral port range, where
    any outgoing connection may hold it when the sandbox binds it (a ``sandbox up`` failing on a port "in use" that
    nothing listens on). The range is the machine's, so the check is here, not in the spec's validation."""
    low, high = ephemeral_port_range(port_range)
    inside = {field: [p for p in ports if low <= p <= high] for field, ports in sandbox_ports(fleet).items()}
    named = [
        f"sandbox.{field}={getattr(fleet.spec.sandbox, field)} ({_ports(found)})"
        for field, found in inside.items()
        if found
    ]
    if named:
        raise MachineTooSmall(
            f"{'; '.join(named)} inside this machine's ephemeral port range {low}-{high} ({port_range}), from which "
            "outgoing connections take their source ports: one can hold a sandbox port when the sandbox binds it. "
            f"Move them below {low} or above {high} (the sandbox's default ports, 20000-20199, lie below Linux's "
            "default range: drop the port settings to use them), or narrow the range (sysctl "
            "net.ipv4.ip_local_port_range)"
        )


def _ports(ports: list[int]) -> str:
    if len(ports) == 1:
        return f"port {ports[0]}"
    return f"{len(ports)} ports from {ports[0]} to {ports[-1]}"


def check_machine(
    fleet: Fleet,
    *,
    meminfo: Path = MEMINFO,
    port_range: Path = EPHEMERAL_PORT_RANGE,
    costs: Costs | None = None,
    cpu_share: float = CPU_SHARE,
) -> Needs:
    """Raise :class:`MachineTooSmall` unless this machine holds the sandbox: its ports outside the ephemeral range
    (:func:`check_ports`), its file descriptors and memory; raises this process's soft ``RLIMIT_NOFILE`` (which the
    sandbox's processes inherit) up to the hard limit when the sandbox needs more. With ``costs`` (measured here:
    :func:`serving.sandbox.capacity.measure_costs`) the steady state may need at most ``cpu_share`` of the cores."""
    check_ports(fleet, port_range)
    need = needs(fleet)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if need.fds > soft:
        if hard != resource.RLIM_INFINITY and need.fds > hard:
            raise MachineTooSmall(
                f"the sandbox needs {need.fds} open files in one process ({need.fds_process}); RLIMIT_NOFILE allows "
                f"{hard} (hard limit). Raise it (as root: `ulimit -Hn {need.fds}`, LimitNOFILE= in a unit, or "
                "/etc/security/limits.conf) or simulate fewer replicas (serving.replicas)"
            )
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    available = mem_available_mib(meminfo)
    if available is not None and need.memory_mib > available:
        parts = ", ".join(f"{k} {v:,.0f}" for k, v in need.memory_parts.items())
        raise MachineTooSmall(
            f"the sandbox needs about {need.memory_mib:,.0f} MiB of memory ({parts} MiB, × {MEMORY_HEADROOM} "
            f"headroom); MemAvailable is {available:,.0f} MiB. Free memory (`exaserve sandbox down` on other "
            "sandboxes) or simulate fewer replicas (serving.replicas)"
        )
    if costs is not None:
        nodes = len({r.node.name for r in fleet.plan.replicas})
        cpu = cpu_need(fleet.spec, len(fleet.plan.replicas), nodes, costs, cpu_share)
        if cpu.total > cpu.available:
            raise MachineTooSmall(_too_slow(cpu, len(fleet.plan.replicas), nodes, cpu_share))
        need = dataclasses.replace(need, cpu=cpu)
    return need


def _too_slow(cpu: CpuNeed, replicas: int, nodes: int, share: float) -> str:
    """The CPU refusal: the figure, what it is made of, and the replicas (whole nodes) this machine holds."""
    per_node = max(1, replicas // nodes)
    fits = math.floor(replicas * cpu.available / cpu.total / per_node) * per_node
    parts = ", ".join(f"{k} {v:.2f}" for k, v in cpu.cores.items())
    c = cpu.costs
    return (
        f"the sandbox needs about {cpu.total:.2f} cores in its steady state ({parts}; measured on this machine: "
        f"{c.request_ms:.3f} ms of CPU per worker request and {c.probe_ms:.2f} ms per agent probe, {c.speed:.1f}× "
        f"the reference machine's), more than {share:.0%} of its {cpus()} CPUs ({cpu.available:.2f} cores; the rest "
        f"is for the client load, a rollout's router changes and the measurements). This machine holds about "
        f"{fits:,} replicas: simulate fewer (serving.replicas; the scale bench: --replicas {fits}), use more or "
        "faster cores, or raise --cpu-share (the rehearsal then measures a saturated machine)"
    )
