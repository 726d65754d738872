"""Cluster-level concerns: the namespace and the node labels (taints and time keeping belong to the hosts: Ansible)."""

from __future__ import annotations

import pulumi

from serving.pulumi.components.base import KubernetesComponent
from serving.render.k8s import namespace, nodes
from serving.spec.schema import FleetSpec


class Namespace(KubernetesComponent):
    """The stack's namespace; every namespaced concern depends on it."""

    def __init__(self, name: str, spec: FleetSpec, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("exaserve:core:Namespace", name, namespace.render(spec), opts)
        self.namespace: str = spec.kubernetes.namespace
        self.register_outputs({"namespace": self.namespace})


class Nodes(KubernetesComponent):
    """One labels-only NodePatch per node: pool, rack, leaf switch, GPU product and fabric; the system pool's
    nodes carry their pool only."""

    def __init__(self, name: str, spec: FleetSpec, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("exaserve:cluster:Nodes", name, nodes.render(spec), opts)
        self.racks: list[str] = sorted({n.rack for n in spec.cluster.nodes})
        self.gpu_nodes = len(spec.cluster.nodes)
        self.system_nodes = len(spec.cluster.system_nodes)
        self.register_outputs({"nodes": self.gpu_nodes, "system_nodes": self.system_nodes, "racks": self.racks})
