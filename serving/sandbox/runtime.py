"""The runtime layer in the sandbox: a real etcd, ``scheduler.instances`` router instances and as many
controllers, and one agent per simulated node, all on loopback.

Ports, from ``sandbox.runtime_base_port`` (B): etcd client B, peer B+1; controller i on B+2+i; router 0
is the sandbox's router (``sandbox.router_port``/``prometheus_port``), router i ≥ 1 on B+20+2(i−1) with
its metrics on the next port; B+19 is the Prometheus server's (:mod:`serving.sandbox.prometheus`). Controllers
and agents run as ``exaserve controller run`` / ``exaserve agent run`` processes, recorded like the workers, so
``sandbox down`` stops them: one agent process per node, or in the scale layout (``sandbox.nodes_per_process``)
one per group of nodes, the same groups whose workers share a process (:func:`serving.sandbox.backend.node_groups`).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from serving.fleet_http import client_tls
from serving.plan.model import Fleet
from serving.rollout.backends import BackendError, ReplicaIndex
from serving.runtime.service import STATUS_PATH
from serving.sandbox.backend import node_groups, restart_workers, router_flags, worker_config
from serving.sandbox.processes import ProcessRecord, SandboxError, StateDir, start_router, start_service
from serving.sandbox.worker_config import LOOPBACK
from serving.spec.schema import FleetSpec, SandboxSpec

ETCD_BINARY = "etcd"
_KILL_AFTER_S = 1.0  # a hung (SIGSTOP) simulated worker never handles SIGTERM: kill it after this


@dataclass(frozen=True)
class RuntimePorts:
    etcd_client: int
    etcd_peer: int
    controllers: tuple[int, ...]
    routers: tuple[tuple[int, int], ...]  # (api, metrics), router 0 first


def _sandbox(spec: FleetSpec) -> SandboxSpec:
    if spec.sandbox is None:
        raise SandboxError("this stack has no sandbox: section")
    return spec.sandbox


def runtime_ports(spec: FleetSpec) -> RuntimePorts:
    sb = _sandbox(spec)
    base, n = sb.runtime_base_port, spec.scheduler.instances
    extra = tuple((base + 20 + 2 * i, base + 21 + 2 * i) for i in range(n - 1))
    return RuntimePorts(
        base, base + 1, tuple(base + 2 + i for i in range(n)), ((sb.router_port, sb.prometheus_port), *extra)
    )


def _url(port: int) -> str:
    return f"http://{LOOPBACK}:{port}"


def router_urls(spec: FleetSpec) -> list[str]:
    return [_url(api) for api, _ in runtime_ports(spec).routers]


def router_metrics_urls(spec: FleetSpec) -> list[str]:
    """Each router instance's Prometheus listener, in the order of :func:`router_urls`."""
    return [_url(metrics) + "/metrics" for _, metrics in runtime_ports(spec).routers]


def controller_urls(spec: FleetSpec) -> list[str]:
    return [_url(p) for p in runtime_ports(spec).controllers]


def etcd_url(spec: FleetSpec) -> str:
    return _url(runtime_ports(spec).etcd_client)


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0, verify=client_tls()).status_code == 200
    except httpx.HTTPError:
        return False


def _exaserve() -> str:
    """The ``exaserve`` console script of this interpreter's environment."""
    found = Path(sys.executable).with_name("exaserve")
    if found.exists():
        return str(found)
    on_path = shutil.which("exaserve")
    if on_path is None:
        raise SandboxError("the exaserve command is not installed beside this Python; pip install -e . first")
    return on_path


def start_etcd(state: StateDir, spec: FleetSpec, *, timeout_s: float) -> ProcessRecord:
    """A single-member etcd on loopback, data under the sandbox's state directory."""
    binary = shutil.which(ETCD_BINARY)
    if binary is None:
        raise SandboxError("etcd is not installed; install the Debian package etcd-server (scripts/bootstrap.sh)")
    ports = runtime_ports(spec)
    client, peer = _url(ports.etcd_client), _url(ports.etcd_peer)
    argv = [
        binary,
        "--name=sandbox",
        f"--data-dir={state.root / 'etcd-data'}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=sandbox={peer}",
        "--log-level=warn",
    ]
    return start_service(state, "etcd", "etcd", argv, client, lambda: _ok(client + "/health"), timeout_s)


def start_extra_routers(
    state: StateDir, fleet: Fleet, worker_urls: Sequence[str], *, healthy: int, timeout_s: float
) -> list[ProcessRecord]:
    """Routers 1…n−1: the fleet's router command on their own ports, started at once (each one's registration of
    the workers takes its own CPU time, which grows with their number)."""

    def one(i: int, api: int, metrics: int) -> ProcessRecord:
        flags = router_flags(fleet, worker_urls, ports=(api, metrics))
        return start_router(state, flags, name=f"router-{i}", healthy_workers=healthy, timeout_s=timeout_s)

    extra = runtime_ports(fleet.spec).routers[1:]
    if not extra:
        return []
    with ThreadPoolExecutor(len(extra)) as pool:
        futures = [pool.submit(one, i, api, metrics) for i, (api, metrics) in enumerate(extra, start=1)]
        return [f.result() for f in futures]


def _ready(url: str) -> Callable[[], bool]:
    return lambda: _ok(url)


def start_controllers(
    state: StateDir, stack_file: Path, state_dir: Path, spec: FleetSpec, *, timeout_s: float
) -> list[ProcessRecord]:
    out = []
    for i, port in enumerate(runtime_ports(spec).controllers):
        argv = [
            _exaserve(),
            "controller",
            "run",
            f"--stack-file={stack_file}",
            f"--state-dir={state_dir}",
            f"--name=controller-{i}",
            f"--port={port}",
        ]
        url = _url(port)
        out.append(
            start_service(state, f"controller-{i}", "controller", argv, url, _ready(url + STATUS_PATH), timeout_s)
        )
    return out


def start_agents(state: StateDir, stack_file: Path, fleet: Fleet, *, timeout_s: float) -> list[ProcessRecord]:
    """``agent-<node>`` per node, or in the scale layout ``agents-<i>`` per group of nodes (``--node`` for each)."""
    scale = _sandbox(fleet.spec).nodes_per_process is not None
    out = []
    for group in node_groups(fleet):
        name = f"agents-{group.index}" if scale else f"agent-{group.nodes[0]}"
        argv = [_exaserve(), "agent", "run", f"--stack-file={stack_file}", *(f"--node={n}" for n in group.nodes)]
        out.append(start_service(state, name, "agent", argv, "", lambda: True, timeout_s))
    return out


def start_runtime(
    state: StateDir, fleet: Fleet, *, stack_file: Path, state_dir: Path, timeout_s: float
) -> dict[str, list[str]]:
    """After ``sandbox up`` started the routers (:func:`start_extra_routers` beside router 0): etcd, the
    controllers, then the agents."""
    start_etcd(state, fleet.spec, timeout_s=timeout_s)
    start_controllers(state, stack_file, state_dir, fleet.spec, timeout_s=timeout_s)
    start_agents(state, stack_file, fleet, timeout_s=timeout_s)
    return {
        "routers": router_urls(fleet.spec),
        "controllers": controller_urls(fleet.spec),
        "etcd": [etcd_url(fleet.spec)],
    }


class SandboxRestarter(ReplicaIndex):
    """Migration in the sandbox: kill the simulated worker (its process, a hung one too, or its port inside its
    worker host) and start it again at the version the stack says its group runs."""

    def __init__(self, fleet: Fleet, processes_dir: Path) -> None:
        super().__init__(list(fleet.plan.replicas))
        self.spec = fleet.spec
        self.state = StateDir(processes_dir)

    async def restart(self, replica_id: str, timeout_s: float) -> None:
        replica = self._replica(replica_id)
        config = worker_config(self.spec, replica, self.spec.group_version(replica.group))
        try:
            await restart_workers(self.spec, self.state, [config], stop_timeout_s=_KILL_AFTER_S, timeout_s=timeout_s)
        except SandboxError as exc:
            raise BackendError(f"restarting {replica_id}: {exc}") from exc
