"""The RDMA fabric: the shared device plugin and the optional Multus secondary network."""

from __future__ import annotations

import pulumi

from serving.plan.model import Fleet
from serving.pulumi.components.base import KubernetesComponent
from serving.render.k8s import fabric


class RdmaFabric(KubernetesComponent):
    """RDMA shared device plugin (ConfigMap + DaemonSet) and a NetworkAttachmentDefinition when asked for, only
    where replicas span nodes over an RDMA fabric."""

    def __init__(self, name: str, fleet: Fleet, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("exaserve:fabric:RdmaFabric", name, fabric.render(fleet), opts)
        self.rdma_resource: str | None = fleet.spec.kubernetes.rdma_resource if fabric.has_rdma(fleet) else None
        self.networks: list[str] = self.names("NetworkAttachmentDefinition")
        self.register_outputs({"rdma_resource": self.rdma_resource, "networks": self.networks})
