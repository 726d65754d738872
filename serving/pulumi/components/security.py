"""Network isolation of the serving namespace."""

from __future__ import annotations

import pulumi

from serving.plan.model import Plan
from serving.pulumi.components.base import KubernetesComponent
from serving.render.k8s import netpol
from serving.spec.schema import FleetSpec


class NetworkPolicies(KubernetesComponent):
    """Default-deny ingress; the router alone reaches the workers; monitoring alone reaches metrics ports."""

    def __init__(self, name: str, spec: FleetSpec, plan: Plan, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("exaserve:security:NetworkPolicies", name, netpol.render(spec, plan), opts)
        self.policies: list[str] = self.names("NetworkPolicy")
        self.register_outputs({"policies": self.policies})
