"""Node patches: the inventory's placement facts as node labels, and a taint reserving GPU nodes for serving.

Applied as server-side-apply patches (Pulumi ``NodePatch``): the nodes themselves belong to the kubelet;
we only own these labels and the taint. Labels use our own prefix, so that they never fight GPU
feature discovery over ``nvidia.com/*`` labels.
"""

from __future__ import annotations

from serving.render.k8s.common import (
    LABEL_FABRIC,
    LABEL_GPU_PRODUCT,
    LABEL_LEAF,
    LABEL_POOL,
    LABEL_RACK,
    TAINT_KEY,
    TAINT_VALUE,
    K8sObject,
)
from serving.spec.schema import FleetSpec, Node


def node_labels(spec: FleetSpec, node: Node) -> dict[str, str]:
    return {
        LABEL_POOL: node.pool,
        LABEL_RACK: node.rack,
        LABEL_LEAF: node.leaf,
        LABEL_GPU_PRODUCT: spec.cluster.gpu.product,
        LABEL_FABRIC: spec.cluster.fabric.kind.value,
    }


def render(spec: FleetSpec) -> list[K8sObject]:
    """One patch per node of the inventory."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node.name, "labels": node_labels(spec, node)},
            "spec": {"taints": [{"key": TAINT_KEY, "value": TAINT_VALUE, "effect": "NoSchedule"}]},
        }
        for node in spec.cluster.nodes
    ]
