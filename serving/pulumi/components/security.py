"""Network isolation of the serving namespace."""

from __future__ import annotations

import pulumi

from serving.plan.model import Fleet
from serving.pulumi.components.base import KubernetesComponent
from serving.render.k8s import netpol


class NetworkPolicies(KubernetesComponent):
    """Default-deny ingress; the router alone reaches the workers; monitoring alone reaches metrics ports."""

    def __init__(self, name: str, fleet: Fleet, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("exaserve:security:NetworkPolicies", name, netpol.render(fleet), opts)
        self.policies: list[str] = self.names("NetworkPolicy")
        self.register_outputs({"policies": self.policies})
