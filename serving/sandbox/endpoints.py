"""Where a sandbox stack's router and its metrics listen (loopback only)."""

from __future__ import annotations

from serving.rollout.session import Endpoints, RolloutInputError
from serving.sandbox.worker import LOOPBACK
from serving.spec.schema import FleetSpec


def sandbox_endpoints(spec: FleetSpec) -> Endpoints:
    """The router and metrics URLs of a stack with a ``sandbox:`` section; the updater's default target there."""
    if spec.sandbox is None:
        raise RolloutInputError("this stack has no sandbox: section; pass --router-url and --metrics-url")
    return Endpoints(
        f"http://{LOOPBACK}:{spec.sandbox.router_port}", f"http://{LOOPBACK}:{spec.sandbox.prometheus_port}/metrics"
    )
