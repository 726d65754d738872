"""Where a sandbox stack's routers and their metrics listen (loopback only)."""

from __future__ import annotations

from serving.rollout.session import Endpoints, RolloutInputError
from serving.sandbox.runtime import runtime_ports
from serving.sandbox.worker import LOOPBACK
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
