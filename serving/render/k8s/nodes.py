"""Node patches: the inventory's placement facts as node labels.

Applied as server-side-apply patches (Pulumi ``NodePatch``): the nodes themselves belong to the kubelet; we own
only these labels. Labels use our own prefix, so that they never fight GPU feature discovery over ``nvidia.com/*``
labels. No taints: ``spec.taints`` is an atomic list, so applying ours would conflict with every other taint on the
node (cordon, NotReady, the kubelet's own) and forcing it would wipe them. The GPU taint is set by the kubelet at
registration (Ansible role ``kubelet``, :func:`serving.render.k8s.common.node_taint`).
"""

from __future__ import annotations

from serving.render.k8s.common import (
    LABEL_FABRIC,
    LABEL_GPU_PRODUCT,
    LABEL_LEAF,
    LABEL_POOL,
    LABEL_RACK,
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


def system_node_labels(node: Node) -> dict[str, str]:
    """A system-pool node: its pool, what the routers' and controllers' nodeSelector names (no GPU, and no rack:
    the rack labels place serving replicas)."""
    return {LABEL_POOL: node.pool}


def render(spec: FleetSpec) -> list[K8sObject]:
    """One labels-only patch per node of the inventory, the system pool's included."""
    patches = [(node, node_labels(spec, node)) for node in spec.cluster.nodes]
    patches += [(node, system_node_labels(node)) for node in spec.cluster.system_nodes]
    return [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.name, "labels": lab}} for node, lab in patches
    ]
