"""Where a sandbox stack's routers and their metrics listen (loopback only), and the sandbox as the updater's
local backend (:func:`register`)."""

from __future__ import annotations

from pathlib import Path

from serving.plan.model import Fleet
from serving.rollout.backends import Backend, local
from serving.rollout.session import Endpoints, RolloutInputError
from serving.sandbox.runtime import runtime_ports
from serving.sandbox.worker_config import LOOPBACK
from serving.spec.schema import FleetSpec


def sandbox_routers(spec: FleetSpec) -> tuple[tuple[str, str], ...]:
    """(API URL, Prometheus URL) of every router instance a sandbox can run: router 0 (``sandbox up``), then routers
    1… (``sandbox.runtime``, or started beside it) on the ports of :func:`serving.sandbox.runtime.runtime_ports`."""
    return tuple(
        (f"http://{LOOPBACK}:{api}", f"http://{LOOPBACK}:{metrics}/metrics")
        for api, metrics in runtime_ports(spec).routers
    )


def sandbox_endpoints(spec: FleetSpec) -> Endpoints:
    """Every router instance of a stack with a ``sandbox:`` section; the updater's default target there. With
    ``sandbox.runtime`` on, ``sandbox up`` runs ``scheduler.instances`` routers, otherwise router 0 alone."""
    if spec.sandbox is None:
        raise RolloutInputError("this stack has no sandbox: section; pass --router for every router instance")
    routers = sandbox_routers(spec) if spec.sandbox.runtime else sandbox_routers(spec)[:1]
    return Endpoints(tuple(api for api, _ in routers), tuple(metrics for _, metrics in routers))


def _open_local(fleet: Fleet, sandbox_dir: Path) -> Backend:
    from serving.sandbox.backend import LocalBackend  # noqa: PLC0415 - loads the router launcher

    return LocalBackend(fleet, sandbox_dir)


def register() -> None:
    """Make the sandbox the updater's ``--backend local``, and its routers a sandbox stack's default ones."""
    local.register(local.LocalPlatform(open=_open_local, routers=sandbox_routers, endpoints=sandbox_endpoints))
