"""RDMA fabric: the RDMA shared device plugin (ConfigMap + DaemonSet) and, where the spec asks for one, a Multus
secondary network (NetworkAttachmentDefinition) for RDMA traffic.

The device plugin exposes ``spec.kubernetes.rdma_resource`` (``<prefix>/<name>``); serving pods request one
unit of it (:func:`serving.render.k8s.container.pod_container`, with the NCCL/IB environment) only when a replica
spans nodes: a replica inside one node does its collectives over NVLink/PCIe (a one-GPU replica does none), so
nothing is rendered here then, nor on an Ethernet fabric, which has no HCAs. The secondary network needs Multus and
whereabouts (docs/infra.md, prerequisites). The image is upstream's own (Mellanox/k8s-rdma-shared-dev-plugin's
deployment manifest), pulled through ``kubernetes.image_registry`` when the stack names a mirror.
"""

from __future__ import annotations

import json
from typing import Any

from serving.plan.model import Fleet
from serving.render.k8s.common import (
    ANNOTATION_PRIVILEGED_REASON,
    LABEL_NAME,
    K8sObject,
    await_annotations,
    gpu_node_affinity,
    image,
    labels,
    metadata,
    pull_secrets,
    serving_toleration,
)
from serving.spec.schema import FabricKind, FleetSpec

COMPONENT = "fabric"
APP = "rdma-shared-device-plugin"
DAEMONSET = "rdma-shared-device-plugin"
CONFIGMAP = "rdma-devices"
NETWORK = "exaserve-rdma"
# Pinned upstream image of Mellanox/k8s-rdma-shared-dev-plugin (deployment/k8s/base/daemonset.yaml).
IMAGE = "mellanox/k8s-rdma-shared-dev-plugin:v1.5.3"
# `pulumi up` waits for the plugin on every GPU node: a small image and a registration, no model; a node that
# cannot run it cannot run a multi-node replica either, so the bound is Pulumi's own default.
AWAIT_S = 600
MELLANOX_VENDOR_ID = "15b3"
LINK_TYPES = {FabricKind.INFINIBAND: "infiniband", FabricKind.ROCE: "ether"}
# The secondary network's parent netdev and address range are not (yet) spec fields: IPoIB on the first
# IB port, macvlan on the bootstrap interface for RoCE; whereabouts hands out cluster-wide unique addresses.
SECONDARY_CNI = {FabricKind.INFINIBAND: ("ipoib", "ib0"), FabricKind.ROCE: ("macvlan", None)}
SECONDARY_RANGE = "10.250.0.0/16"
NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"


def has_rdma(fleet: Fleet) -> bool:
    """The fleet uses the RDMA fabric: an RDMA fabric and replicas that span nodes over it."""
    return fleet.spec.cluster.fabric.kind is not FabricKind.ETHERNET and fleet.plan.multi_node


def _resource_parts(spec: FleetSpec) -> tuple[str, str]:
    prefix, _, name = spec.kubernetes.rdma_resource.rpartition("/")
    return prefix, name


def device_plugin_config(spec: FleetSpec) -> dict[str, Any]:
    """The plugin's config.json: one shared resource over the node's Mellanox HCAs of the fabric's link type."""
    prefix, name = _resource_parts(spec)
    entry: dict[str, Any] = {
        "resourceName": name,
        "rdmaHcaMax": spec.cluster.gpu.count_per_node,
        "selectors": {
            "vendors": [MELLANOX_VENDOR_ID],
            "drivers": ["mlx5_core"],
            "linkTypes": [LINK_TYPES[spec.cluster.fabric.kind]],
        },
    }
    if prefix:
        entry["resourcePrefix"] = prefix
    return {"periodicUpdateInterval": 300, "configList": [entry]}


def pod_annotations(spec: FleetSpec) -> dict[str, str]:
    """Multus annotation attaching a replica's pods to the secondary network, when there is one (the caller
    decides whether the replica uses the fabric at all)."""
    return {NETWORKS_ANNOTATION: NETWORK} if spec.cluster.fabric.secondary_network else {}


def _network_config(spec: FleetSpec) -> str:
    fabric = spec.cluster.fabric
    cni, master = SECONDARY_CNI[fabric.kind]
    return json.dumps(
        {
            "cniVersion": "0.3.1",
            "name": NETWORK,
            "type": cni,
            "master": master or fabric.socket_ifname,
            "ipam": {"type": "whereabouts", "range": SECONDARY_RANGE},
        },
        sort_keys=True,
    )


def render(fleet: Fleet) -> list[K8sObject]:
    if not has_rdma(fleet):
        return []
    ns = fleet.spec.kubernetes.namespace
    lab = labels(COMPONENT, APP)
    selector = {LABEL_NAME: APP}
    objects: list[K8sObject] = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata(CONFIGMAP, ns, lab),
            "data": {"config.json": json.dumps(device_plugin_config(fleet.spec), indent=2, sort_keys=True)},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": metadata(
                DAEMONSET,
                ns,
                lab,
                {
                    ANNOTATION_PRIVILEGED_REASON: "registers RDMA devices with the kubelet and exposes /dev/infiniband "
                    "to pods; the device plugin API needs host device access",
                    **await_annotations(timeout_s=AWAIT_S),
                },
            ),
            "spec": {
                "selector": {"matchLabels": selector},
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
                "template": {
                    "metadata": {"labels": lab},
                    "spec": {
                        "hostNetwork": True,
                        "priorityClassName": "system-node-critical",
                        "affinity": gpu_node_affinity(fleet.spec),
                        "tolerations": [serving_toleration()],
                        **pull_secrets(fleet.spec),
                        "containers": [
                            {
                                "name": "device-plugin",
                                "image": image(fleet.spec, IMAGE),
                                "imagePullPolicy": "IfNotPresent",
                                "securityContext": {"privileged": True},
                                "resources": {
                                    "requests": {"cpu": "50m", "memory": "64Mi"},
                                    "limits": {"memory": "256Mi"},
                                },
                                "volumeMounts": [
                                    {"name": "device-plugin", "mountPath": "/var/lib/kubelet/device-plugins"},
                                    {"name": "plugins-registry", "mountPath": "/var/lib/kubelet/plugins_registry"},
                                    {"name": "config", "mountPath": "/k8s-rdma-shared-dev-plugin", "readOnly": True},
                                    {"name": "devs", "mountPath": "/dev/"},
                                ],
                            }
                        ],
                        "volumes": [
                            {"name": "device-plugin", "hostPath": {"path": "/var/lib/kubelet/device-plugins"}},
                            {"name": "plugins-registry", "hostPath": {"path": "/var/lib/kubelet/plugins_registry"}},
                            {
                                "name": "config",
                                "configMap": {
                                    "name": CONFIGMAP,
                                    "items": [{"key": "config.json", "path": "config.json"}],
                                },
                            },
                            {"name": "devs", "hostPath": {"path": "/dev/"}},
                        ],
                    },
                },
            },
        },
    ]
    if fleet.spec.cluster.fabric.secondary_network:
        objects.append(
            {
                "apiVersion": "k8s.cni.cncf.io/v1",
                "kind": "NetworkAttachmentDefinition",
                "metadata": metadata(NETWORK, ns, labels(COMPONENT, NETWORK)),
                "spec": {"config": _network_config(fleet.spec)},
            }
        )
    return objects
