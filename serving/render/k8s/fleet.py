"""The serving fleet: exactly ``rollout.batches`` update groups, each one workload object carrying its own version.

A replica that fits on one node is one pod: a group is a StatefulSet of ``size`` pods. A replica that spans
nodes is a LeaderWorkerSet group (leader + workers, one pod per node): a group is a LeaderWorkerSet of
``size`` replicas. Either way the object count is the number of groups, never the number of replicas.

The container comes from :func:`serving.render.k8s.container.pod_container` (command, environment, probes, GPU, RDMA and
memory resources); this module adds the pod around it: placement on the serving pools (tolerating their
taint), spread across racks, shared memory and model-cache volumes, the secondary network, a
PodDisruptionBudget per group, and one headless Service over all workers for metrics scraping.
"""

from __future__ import annotations

import math
from typing import Any

from serving.plan.model import Plan
from serving.render.common import whole_seconds
from serving.render.k8s import fabric
from serving.render.k8s.common import (
    HOSTNAME_LABEL,
    LABEL_GROUP,
    LABEL_PART_OF,
    LABEL_RACK,
    LABEL_VERSION,
    K8sObject,
    gpu_node_affinity,
    metadata,
    serving_toleration,
)
from serving.render.k8s.container import CONTAINER_NAME, SERVER_POD_LABELS, pod_container, pod_volumes
from serving.spec.schema import FleetSpec

COMPONENT = "fleet"
WORKERS_SERVICE = "sglang-workers"
HTTP_PORT_NAME = "http"
SERVING_CONTAINER = CONTAINER_NAME
LWS_API = "leaderworkerset.x-k8s.io/v1"


def group_name(group: int) -> str:
    """Name of update group ``group``'s StatefulSet / LeaderWorkerSet (and its PodDisruptionBudget)."""
    return f"sglang-g{group}"


def group_selector(group: int) -> dict[str, str]:
    return {**SERVER_POD_LABELS, LABEL_GROUP: str(group)}


def group_labels(spec: FleetSpec, group: int) -> dict[str, str]:
    return {**group_selector(group), LABEL_PART_OF: "exaserve", LABEL_VERSION: spec.group_version(group)}


def max_unavailable(spec: FleetSpec, size: int) -> int:
    """Disruptions a group tolerates: its share of the failure/rollout reserve, at least one replica."""
    return max(1, math.floor(size * spec.limits.failure_reserve))


def pod_template(spec: FleetSpec, plan: Plan, group: int, *, leader: bool = True) -> dict[str, Any]:
    selector = group_selector(group)
    meta: dict[str, Any] = {"labels": group_labels(spec, group)}
    if annotations := fabric.pod_annotations(spec):
        meta["annotations"] = annotations
    spread = [
        # Racks first: losing a rack (leaf switch) takes at most its share of every group.
        {"maxSkew": 1, "topologyKey": LABEL_RACK, "whenUnsatisfiable": "DoNotSchedule"},
        {"maxSkew": 1, "topologyKey": HOSTNAME_LABEL, "whenUnsatisfiable": "ScheduleAnyway"},
    ]
    return {
        "metadata": meta,
        "spec": {
            "affinity": gpu_node_affinity(spec),
            "tolerations": [serving_toleration()],
            "topologySpreadConstraints": [{**c, "labelSelector": {"matchLabels": selector}} for c in spread],
            "terminationGracePeriodSeconds": whole_seconds(spec.rollout.drain_timeout_s),
            "enableServiceLinks": False,
            "containers": [pod_container(spec, plan, group, leader=leader)],
            "volumes": pod_volumes(spec),
        },
    }


def _workload(spec: FleetSpec, plan: Plan, group: int, size: int) -> K8sObject:
    ns = spec.kubernetes.namespace
    meta = metadata(group_name(group), ns, group_labels(spec, group))
    budget = max_unavailable(spec, size)
    if plan.multi_node:
        return {
            "apiVersion": LWS_API,
            "kind": "LeaderWorkerSet",
            "metadata": meta,
            "spec": {
                "replicas": size,
                "startupPolicy": "LeaderCreated",
                "rolloutStrategy": {
                    "type": "RollingUpdate",
                    "rollingUpdateConfiguration": {"maxUnavailable": budget, "maxSurge": 0},
                },
                "leaderWorkerTemplate": {
                    "size": plan.placement.nodes_per_replica,
                    "restartPolicy": "RecreateGroupOnPodRestart",
                    "leaderTemplate": pod_template(spec, plan, group, leader=True),
                    "workerTemplate": pod_template(spec, plan, group, leader=False),
                },
            },
        }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": meta,
        "spec": {
            "replicas": size,
            "serviceName": WORKERS_SERVICE,
            # Pods of a group start together; an update replaces up to the group's disruption budget at once
            # (maxUnavailable needs the MaxUnavailableStatefulSet feature; without it, one pod at a time).
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": budget}},
            "selector": {"matchLabels": group_selector(group)},
            "template": pod_template(spec, plan, group),
        },
    }


def render(spec: FleetSpec, plan: Plan) -> list[K8sObject]:
    ns = spec.kubernetes.namespace
    objects: list[K8sObject] = [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": metadata(WORKERS_SERVICE, ns, {**SERVER_POD_LABELS, LABEL_PART_OF: "exaserve"}),
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": False,
                "selector": dict(SERVER_POD_LABELS),
                "ports": [
                    {"name": HTTP_PORT_NAME, "port": spec.serving.port, "targetPort": HTTP_PORT_NAME, "protocol": "TCP"}
                ],
            },
        }
    ]
    for group, size in enumerate(plan.rollout_group_sizes):
        objects.append(_workload(spec, plan, group, size))
        objects.append(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                # No version label: the budget stays put while the rolling updater moves the group's version.
                "metadata": metadata(group_name(group), ns, {**group_selector(group), LABEL_PART_OF: "exaserve"}),
                "spec": {
                    "maxUnavailable": max_unavailable(spec, size),
                    "selector": {"matchLabels": group_selector(group)},
                },
            }
        )
    return objects
