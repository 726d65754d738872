"""Local processes: the sandbox's simulated SGLang workers behind the real router, on loopback.

Replica ``i`` of the sandbox stack listens on ``sandbox.worker_base_port + i`` and runs the simulated
release ``sandbox.versions[version]`` (latency, error rate, start-up time, never-ready). An update
restarts its process with the new release through :mod:`serving.sandbox.processes`; the processes'
records live in the stack's state directory, so ``sandbox up``, ``rollout`` and ``sandbox down`` can
run as separate commands.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import httpx

from serving.plan.model import Plan, Replica
from serving.render.common import duration_buckets
from serving.render.router import ROUTER_ENTRY, router_argv
from serving.rollout.backends import BackendError, ReplicaIndex
from serving.rollout.membership import RouterApiMembership
from serving.router.membership import RouterSet
from serving.sandbox.processes import SandboxError, StateDir, restart_worker
from serving.sandbox.worker import LOOPBACK, WorkerConfig
from serving.spec.schema import FleetSpec, SandboxSpec

JITTER_SHARE = 0.1  # simulated latency varies ±10 % around each release's latency_ms


def sandbox_of(spec: FleetSpec) -> SandboxSpec:
    if spec.sandbox is None:
        raise BackendError("this stack has no sandbox: section; the local backend runs only sandbox stacks")
    return spec.sandbox


def worker_name(port: int) -> str:
    """Process name of a sandbox worker in the state directory (``worker-<port>``)."""
    return f"worker-{port}"


def worker_config(spec: FleetSpec, replica: Replica, version: str) -> WorkerConfig:
    """The simulated worker of ``replica`` running release ``version`` of the sandbox stack."""
    sandbox = sandbox_of(spec)
    release = sandbox.versions.get(version)
    if release is None:
        raise BackendError(
            f"version {version!r} is not in sandbox.versions {sorted(sandbox.versions)}; add it to the stack"
        )
    return WorkerConfig(
        port=sandbox.worker_base_port + replica.index,
        version=version,
        host=LOOPBACK,
        latency_ms=release.latency_ms,
        jitter_ms=release.latency_ms * JITTER_SHARE,
        error_rate=release.error_rate,
        seed=replica.index,
        startup_delay_s=release.startup_s,
        never_ready=release.never_ready,
        served_model_name=spec.model.name,
        max_running_requests=spec.limits.max_running_requests,
        bucket_e2e_request_latency=tuple(duration_buckets(spec)),
    )


def router_flags(spec: FleetSpec, plan: Plan, worker_urls: Sequence[str]) -> list[str]:
    """The sandbox router's flags: the fleet's router command (:func:`serving.render.router.router_argv`, on
    loopback for a sandbox stack, with latency buckets fine enough for the P99 gate)."""
    sandbox_of(spec)
    return router_argv(spec, plan, worker_urls=worker_urls)[len(ROUTER_ENTRY) :]


class LocalBackend(ReplicaIndex):
    """Restart sandbox workers as local processes."""

    def __init__(self, spec: FleetSpec, plan: Plan, processes_dir: Path) -> None:
        self.spec = spec
        self.sandbox = sandbox_of(spec)
        self.state = StateDir(processes_dir)
        super().__init__(list(plan.replicas))
        self._http = httpx.AsyncClient(timeout=spec.serving.health_check_timeout_s)

    @property
    def name(self) -> str:
        return f"local processes ({len(self.replicas)} simulated workers)"

    def worker_url(self, replica_id: str) -> str:
        return f"http://{LOOPBACK}:{self.sandbox.worker_base_port + self._replica(replica_id).index}"

    def known_versions(self) -> frozenset[str]:
        return frozenset(self.sandbox.versions)

    def membership(self, routers: RouterSet) -> RouterApiMembership:
        return RouterApiMembership(routers, self.worker_url)  # the routers know the replicas by these static URLs

    @property
    def updates_whole_groups(self) -> bool:
        return False  # one process per replica

    async def _version(self, replica_id: str) -> str | None:
        """The release the worker process was started with, as the process itself reports it (``/model_info``'s
        ``weight_version``, from its ``--version``); None when nothing answers on its port (stopped, crashed,
        still loading)."""
        try:
            response = await self._http.get(self.worker_url(replica_id) + "/model_info")
            return str(response.json()["weight_version"]) if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, KeyError):
            return None

    async def versions(self, replica_ids: Sequence[str]) -> dict[str, str | None]:
        found = await asyncio.gather(*(self._version(r) for r in replica_ids))
        return dict(zip(replica_ids, found, strict=True))

    async def update(self, replica_ids: Sequence[str], version: str, timeout_s: float) -> None:
        current = await self.versions(replica_ids)
        todo = [r for r in replica_ids if current[r] != version]
        configs = [worker_config(self.spec, self._replica(r), version) for r in todo]
        results = await asyncio.gather(
            *(
                asyncio.to_thread(
                    restart_worker, self.state, worker_name(c.port), c, wait="started", timeout_s=timeout_s
                )
                for c in configs
            ),
            return_exceptions=True,
        )
        problems = [f"{r}: {exc}" for r, exc in zip(todo, results, strict=True) if isinstance(exc, BaseException)]
        if problems:
            bad = [exc for exc in results if isinstance(exc, BaseException) and not isinstance(exc, SandboxError)]
            if bad:
                raise bad[0]
            raise BackendError("restarting simulated workers failed: " + "; ".join(problems))

    async def aclose(self) -> None:
        await self._http.aclose()
