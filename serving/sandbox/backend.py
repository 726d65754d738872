"""Local processes: the sandbox's simulated SGLang workers behind the real router, on loopback.

Each replica of the sandbox stack listens on its plan's endpoint (loopback, ``sandbox.worker_base_port`` + the
replica's index) and runs the simulated release ``sandbox.versions[version]`` (latency, error rate, start-up time,
never-ready). Two layouts (``sandbox.nodes_per_process``): one process per worker (:mod:`serving.sandbox.processes`),
or the workers of several nodes in one process (:mod:`serving.sandbox.worker_host`, the scale sandbox). An update
restarts the worker on its port with the new release, in either layout (:func:`restart_workers`); the processes'
records live in the stack's state directory, so ``sandbox up``, ``rollout`` and ``sandbox down`` can run as separate
commands.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from serving.fleet_http import FleetHttp, HttpFailure
from serving.plan.model import Fleet, Replica
from serving.plan.planner import memory_plan
from serving.render.common import duration_buckets, whole_seconds
from serving.render.router import ROUTER_ENTRY, router_args
from serving.rollout.backends import BackendError, ReplicaIndex
from serving.rollout.kvpool import GIB
from serving.rollout.membership import RouterApiMembership
from serving.rollout.plan import kv_plan
from serving.router.membership import RouterSet
from serving.sandbox import worker_host
from serving.sandbox.processes import SandboxError, StateDir, start_worker, stop_process
from serving.sandbox.worker_config import WorkerConfig
from serving.sglang_health import HEALTH_ENDPOINT_GENERATION, HEALTH_POLL_S, server_health_timeout_s
from serving.spec.schema import FleetSpec, SandboxSpec, ServingSpec

JITTER_SHARE = 0.1  # simulated latency varies ±10 % around each release's latency_ms
SOURCE_HEARTBEAT_S = float(ServingSpec.model_fields["heartbeat_interval_s"].default)  # the source's 5 s


def health_poll_s(spec: FleetSpec) -> float:
    """The simulated ``/health``'s poll period: SGLang's 1 s, scaled as the stack scales time. A stack that checks
    every ``heartbeat_interval_s`` below the source's 5 s (the drill and runtime test stacks check every 1 s) runs
    the fleet's clock that much faster, and SGLang's poll with it; a stack at 5 s or slower gets SGLang's 1 s."""
    return HEALTH_POLL_S * min(1.0, spec.serving.heartbeat_interval_s / SOURCE_HEARTBEAT_S)


def served_health(spec: FleetSpec) -> dict[str, Any]:
    """The simulated worker's health settings as the stack renders its servers: the poll period, the
    ``SGLANG_HEALTH_CHECK_TIMEOUT`` and whether ``/health`` generates (``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION``)."""
    return {
        "health_poll_s": health_poll_s(spec),
        "health_timeout_s": server_health_timeout_s(whole_seconds(spec.serving.health_check_timeout_s)),
        "health_generation": HEALTH_ENDPOINT_GENERATION,
    }


def sandbox_of(spec: FleetSpec) -> SandboxSpec:
    if spec.sandbox is None:
        raise BackendError("this stack has no sandbox: section; the local backend runs only sandbox stacks")
    return spec.sandbox


def worker_name(port: int) -> str:
    """Process name of a sandbox worker in the state directory (``worker-<port>``)."""
    return f"worker-{port}"


@dataclass(frozen=True)
class NodeGroup:
    """Nodes whose simulated workers share one process in the scale layout, and whose agents share another (one
    node per group in the default layout, where each worker has its own process)."""

    index: int
    nodes: tuple[str, ...]
    ports: tuple[int, ...]


def node_groups(fleet: Fleet) -> list[NodeGroup]:
    """The plan's nodes in placement order, ``sandbox.nodes_per_process`` to a group (else one), with their
    replicas' ports."""
    sandbox = sandbox_of(fleet.spec)
    nodes = list(dict.fromkeys(r.node.name for r in fleet.plan.replicas))
    size = sandbox.nodes_per_process or 1
    groups = []
    for index, start in enumerate(range(0, len(nodes), size)):
        members = tuple(nodes[start : start + size])
        ports = tuple(r.endpoint.port for r in fleet.plan.replicas if r.node.name in members)
        groups.append(NodeGroup(index, members, ports))
    return groups


def worker_config(spec: FleetSpec, replica: Replica, version: str) -> WorkerConfig:
    """The simulated worker of ``replica`` running release ``version`` of the sandbox stack."""
    sandbox = sandbox_of(spec)
    release = sandbox.versions.get(version)
    if release is None:
        raise BackendError(
            f"version {version!r} is not in sandbox.versions {sorted(sandbox.versions)}; add it to the stack"
        )
    kv = kv_plan(spec, memory_plan(spec))  # what the real server exports: the plan's pool, off by the release's kv_skew
    tokens = max(1, round(kv.tokens * (1 + release.kv_skew)))
    return WorkerConfig(
        port=replica.endpoint.port,
        version=version,
        host=replica.endpoint.host,
        latency_ms=release.latency_ms,
        jitter_ms=release.latency_ms * JITTER_SHARE,
        error_rate=release.error_rate,
        bad_request_rate=release.bad_request_rate,
        stream_break_rate=release.stream_break_rate,
        seed=replica.index,
        startup_delay_s=release.startup_s,
        never_ready=release.never_ready,
        served_model_name=spec.model.name,
        max_running_requests=spec.limits.max_running_requests,
        **served_health(spec),
        bucket_e2e_request_latency=tuple(duration_buckets(spec)),
        kv_pool_tokens=tokens,
        weight_memory_gb=kv.weights_bytes / GIB,
        kv_cache_memory_gb=tokens * kv.kv_bytes_per_token / GIB,
    )


async def restart_workers(
    spec: FleetSpec, state: StateDir, configs: Sequence[WorkerConfig], *, stop_timeout_s: float | None, timeout_s: float
) -> None:
    """Stop the simulated worker on each config's port (in-flight requests get ``stop_timeout_s``, None: the
    worker's own ``shutdown_timeout_s`` + 5 s, as a SIGTERM gets) and start it again with the config, in the stack's
    layout: its own process, or its port inside its worker host. Returns once every new worker is starting (health is
    the caller's next step); raises :class:`SandboxError` naming each port that failed."""
    if sandbox_of(spec).nodes_per_process is None:

        def again(config: WorkerConfig) -> None:
            name = worker_name(config.port)
            stop_process(
                state, name, timeout_s=config.shutdown_timeout_s + 5.0 if stop_timeout_s is None else stop_timeout_s
            )
            start_worker(state, name, config, wait="started", timeout_s=timeout_s)

        results = await asyncio.gather(*(asyncio.to_thread(again, c) for c in configs), return_exceptions=True)
    else:
        stop = max((c.shutdown_timeout_s for c in configs), default=0.0) if stop_timeout_s is None else stop_timeout_s
        results = await worker_host.restart_hosted(state, configs, stop_timeout_s=stop, timeout_s=timeout_s)
    unexpected = [exc for exc in results if isinstance(exc, BaseException) and not isinstance(exc, SandboxError)]
    if unexpected:
        raise unexpected[0]
    problems = [f"port {c.port}: {exc}" for c, exc in zip(configs, results, strict=True) if exc is not None]
    if problems:
        raise SandboxError("; ".join(problems))


def router_flags(fleet: Fleet, worker_urls: Sequence[str], *, ports: tuple[int, int] | None = None) -> list[str]:
    """The sandbox router's flags: the fleet's router command (:func:`serving.render.router.router_args`, on
    loopback for a sandbox stack, with latency buckets fine enough for the P99 gate); ``ports`` (API, metrics): a
    router of the runtime's own, on its own listeners."""
    sandbox_of(fleet.spec)
    args = router_args(fleet, worker_urls=worker_urls)
    if ports is not None:
        args = replace(args, port=ports[0], metrics_port=ports[1])
    return args.to_argv()[len(ROUTER_ENTRY) :]


class LocalBackend(ReplicaIndex):
    """Restart sandbox workers as local processes."""

    def __init__(self, fleet: Fleet, processes_dir: Path) -> None:
        self.spec = fleet.spec
        self.sandbox = sandbox_of(fleet.spec)
        self.state = StateDir(processes_dir)
        super().__init__(list(fleet.plan.replicas))
        self._http = FleetHttp(timeout_s=fleet.spec.serving.health_check_timeout_s)

    @property
    def name(self) -> str:
        return f"local processes ({len(self.replicas)} simulated workers)"

    def worker_url(self, replica_id: str) -> str:
        return self._replica(replica_id).url

    def known_versions(self) -> frozenset[str]:
        return frozenset(self.sandbox.versions)

    def membership(self, routers: RouterSet) -> RouterApiMembership:
        return RouterApiMembership(routers, self.worker_url)  # the routers know the replicas by these static URLs

    @property
    def updates_whole_groups(self) -> bool:
        return False  # one worker per replica, restarted on its own port in either layout

    async def _version(self, replica_id: str) -> str | None:
        """The release the worker process was started with, as the process itself reports it (``/model_info``'s
        ``weight_version``, from its ``--version``); None when nothing answers on its port (stopped, crashed,
        still loading)."""
        try:
            response = await self._http.get(self.worker_url(replica_id) + "/model_info")
            return str(response.json()["weight_version"]) if response.status == 200 else None
        except (HttpFailure, ValueError, KeyError, TypeError):
            return None

    async def versions(self, replica_ids: Sequence[str]) -> dict[str, str | None]:
        """Every replica's release; those that did not answer are asked once more before they count as down: one
        read past its time-out on a saturated machine (a worker host serving 256 ports) is not a replica down."""
        found = dict(zip(replica_ids, await asyncio.gather(*(self._version(r) for r in replica_ids)), strict=True))
        again = [r for r, v in found.items() if v is None]
        found.update(zip(again, await asyncio.gather(*(self._version(r) for r in again)), strict=True))
        return found

    def unreachable(self) -> dict[str, str]:
        return {}  # a replica that does not answer is down; nothing in between fails on its own

    async def update(self, replica_ids: Sequence[str], version: str, timeout_s: float) -> None:
        current = await self.versions(replica_ids)
        configs = [worker_config(self.spec, self._replica(r), version) for r in replica_ids if current[r] != version]
        try:
            await restart_workers(self.spec, self.state, configs, stop_timeout_s=None, timeout_s=timeout_s)
        except SandboxError as exc:
            raise BackendError(f"restarting simulated workers failed: {exc}") from exc

    async def aclose(self) -> None:
        await self._http.aclose()
