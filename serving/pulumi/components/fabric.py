"""The RDMA fabric: the shared device plugin and the optional Multus secondary network."""

from __future__ import annotations

import pulumi

from serving.pulumi.components.base import KubernetesComponent
from serving.render.k8s import fabric
from serving.spec.schema import FleetSpec


class RdmaFabric(KubernetesComponent):
    """RDMA shared device plugin (ConfigMap + DaemonSet); a NetworkAttachmentDefinition when asked for."""

    def __init__(self, name: str, spec: FleetSpec, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("exaserve:fabric:RdmaFabric", name, fabric.render(spec), opts)
        self.rdma_resource: str | None = spec.kubernetes.rdma_resource if fabric.has_rdma(spec) else None
        self.networks: list[str] = self.names("NetworkAttachmentDefinition")
        self.register_outputs({"rdma_resource": self.rdma_resource, "networks": self.networks})
