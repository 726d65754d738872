"""The serving fleet: exactly ``rollout.batches`` update groups, each one workload carrying its own version.

A group of replicas that each fit on one node is a StatefulSet of ``size`` pods (``sglang-g0-3``) with
``podManagementPolicy: Parallel`` and ``updateStrategy: OnDelete``; a group of replicas that span nodes is a
LeaderWorkerSet (a leader and workers, one pod per node). Why (docs/infra.md, "How a batch is rolled"): a batch is
a whole group, already out of every router, so all of its pods should be replaced at once. Kubernetes 1.33 offers
that only through GA semantics the updater drives itself: it patches the StatefulSet's template (OnDelete: nothing
happens yet), then deletes the group's pods, and the StatefulSet controller recreates every missing pod at the new
revision in parallel. A rolling update cannot: ``rollingUpdate.maxUnavailable`` of a StatefulSet is alpha
(MaxUnavailableStatefulSet) and ignored without the gate, and a LeaderWorkerSet copies its ``maxUnavailable`` onto
its leader StatefulSet (lws ``leaderworkerset_controller.go``, ``constructLeaderStatefulSetApplyConfiguration``), so
both replace one pod at a time: 410 reloads in sequence for one prod group. A LeaderWorkerSet group is therefore
replaced by scaling it through 0 with the new template (the updater does; the admission policy allows exactly that).
Pods keep stable names for the updater.
The object count is the number of groups, never the number of replicas.

The container comes from :func:`serving.render.k8s.container.pod_container`; this module adds the pod around it:
an init container holding it until its node's model cache is complete, placement on the serving pools (tolerating
the GPU taint), a satisfiable spread across racks (a multi-node replica stays inside one rack), shared memory and
model-cache volumes, the secondary network, a PodDisruptionBudget per group, and one headless Service over all
workers (the StatefulSets' governing Service).
"""

from __future__ import annotations

import math
from typing import Any

from serving.plan.model import Fleet
from serving.render.common import whole_seconds
from serving.render.k8s import fabric
from serving.render.k8s.common import (
    HOSTNAME_LABEL,
    LABEL_ADMITTED,
    LABEL_GROUP,
    LABEL_PART_OF,
    LABEL_RACK,
    LABEL_VERSION,
    K8sObject,
    await_annotations,
    gpu_node_affinity,
    metadata,
    pull_secrets,
    serving_toleration,
)
from serving.render.k8s.container import (
    CONTAINER_NAME,
    LWS_LEADER_LABEL,
    SERVER_POD_LABELS,
    cache_init_container,
    pod_container,
    pod_volumes,
)
from serving.spec.schema import FleetSpec

COMPONENT = "fleet"
WORKERS_SERVICE = "sglang-workers"
HTTP_PORT_NAME = "http"
SERVING_CONTAINER = CONTAINER_NAME
LWS_API = "leaderworkerset.x-k8s.io/v1"
STS_API = "apps/v1"
LWS_GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"


def group_name(group: int) -> str:
    """Name of update group ``group``'s StatefulSet or LeaderWorkerSet (and its PodDisruptionBudget)."""
    return f"sglang-g{group}"


def workload_kind(fleet: Fleet) -> tuple[str, str]:
    """(apiVersion, kind) of every update group's workload: a StatefulSet, a LeaderWorkerSet when replicas span nodes."""
    return (LWS_API, "LeaderWorkerSet") if fleet.plan.multi_node else (STS_API, "StatefulSet")


def group_selector(group: int) -> dict[str, str]:
    return {**SERVER_POD_LABELS, LABEL_GROUP: str(group)}


def group_labels(spec: FleetSpec, group: int) -> dict[str, str]:
    return {**group_selector(group), LABEL_PART_OF: "exaserve", LABEL_VERSION: spec.group_version(group)}


def max_unavailable(spec: FleetSpec, size: int) -> int:
    """Disruptions a group tolerates: its share of the failure/rollout reserve, at least one replica."""
    return max(1, math.floor(size * spec.limits.failure_reserve))


def rack_max_skew(spec: FleetSpec, size: int) -> int:
    """How unevenly a group may spread over racks (pods, or multi-node replicas' leaders): one rack's share of the
    group. A rack that is full, cordoned or lost then holds the rest back by at most its share instead of stranding
    them Pending, and still no rack holds more than about two shares of a group."""
    return max(1, math.ceil(size / max(1, spec.cluster.rack_count)))


def _spread(fleet: Fleet, group: int, size: int) -> list[dict[str, Any]]:
    selector: dict[str, str] = dict(group_selector(group))
    if fleet.plan.multi_node:  # spread the replicas (their leaders); a replica's own pods stay together in one rack
        selector[LWS_LEADER_LABEL[0]] = LWS_LEADER_LABEL[1]
    rack = {
        "maxSkew": rack_max_skew(fleet.spec, size),
        "topologyKey": LABEL_RACK,
        "whenUnsatisfiable": "DoNotSchedule",
        # Cordoned (tainted unschedulable) and NotReady nodes do not count as places the group could go.
        "nodeTaintsPolicy": "Honor",
    }
    host = {"maxSkew": 1, "topologyKey": HOSTNAME_LABEL, "whenUnsatisfiable": "ScheduleAnyway"}
    return [{**c, "labelSelector": {"matchLabels": selector}} for c in (rack, host)]


def _same_rack() -> dict[str, Any]:
    """Every pod of one multi-node replica in its leader's rack (NCCL stays under one leaf switch). The first pod of
    a group matches its own term, so the leader lands anywhere the spread allows and its workers follow it."""
    return {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchExpressions": [{"key": LWS_GROUP_KEY, "operator": "Exists"}]},
                    "matchLabelKeys": [LWS_GROUP_KEY],
                    "topologyKey": LABEL_RACK,
                }
            ]
        }
    }


def pod_template(fleet: Fleet, group: int, size: int, *, leader: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"labels": {**group_labels(fleet.spec, group), LABEL_ADMITTED: "true"}}
    if fabric.has_rdma(fleet) and (annotations := fabric.pod_annotations(fleet.spec)):
        meta["annotations"] = annotations
    affinity: dict[str, Any] = gpu_node_affinity(fleet.spec)
    if fleet.plan.multi_node:
        affinity = {**affinity, **_same_rack()}
    pod: dict[str, Any] = {
        "affinity": affinity,
        "tolerations": [serving_toleration()],
        "terminationGracePeriodSeconds": whole_seconds(fleet.spec.rollout.drain_timeout_s),
        "enableServiceLinks": False,
        # SGLang calls no Kubernetes API: no token in the pod (guard pod-host-isolation); no host namespace either.
        "automountServiceAccountToken": False,
        "initContainers": [cache_init_container(fleet.spec, group)],
        "containers": [pod_container(fleet, group, leader=leader)],
        "volumes": pod_volumes(fleet),
        **pull_secrets(fleet.spec),
    }
    if leader:
        pod["topologySpreadConstraints"] = _spread(fleet, group, size)
    return {"metadata": meta, "spec": pod}


def _workload(fleet: Fleet, group: int, size: int) -> K8sObject:
    ns = fleet.spec.kubernetes.namespace
    # `pulumi up` does not wait for a group's pods: each waits for its node's cache and then loads for up to
    # serving.startup_budget_s; the rolling updater and `kubectl rollout status` watch readiness instead.
    meta = metadata(group_name(group), ns, group_labels(fleet.spec, group), await_annotations(skip=True))
    api_version, kind = workload_kind(fleet)
    spec: dict[str, Any] = {"replicas": size}
    if kind == "StatefulSet":
        spec |= {
            "serviceName": WORKERS_SERVICE,
            "selector": {"matchLabels": group_selector(group)},
            # Every missing pod is created at once (GA), and a template change replaces no pod by itself: the
            # updater deletes the batch's pods after patching the template (serving.rollout.backends.kubernetes).
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "OnDelete"},
            "template": pod_template(fleet, group, size, leader=True),
        }
    else:  # a multi-node group: the updater replaces all its replicas at once by scaling it through 0 (docs/infra.md)
        spec |= {
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": fleet.plan.placement.nodes_per_replica,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": pod_template(fleet, group, size, leader=True),
                "workerTemplate": pod_template(fleet, group, size, leader=False),
            },
        }
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, "spec": spec}


def render(fleet: Fleet) -> list[K8sObject]:
    ns = fleet.spec.kubernetes.namespace
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
                    {
                        "name": HTTP_PORT_NAME,
                        "port": fleet.spec.serving.port,
                        "targetPort": HTTP_PORT_NAME,
                        "protocol": "TCP",
                    }
                ],
            },
        }
    ]
    for group, size in enumerate(fleet.plan.rollout_group_sizes):
        objects.append(_workload(fleet, group, size))
        objects.append(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                # No version label: the budget stays put while the rolling updater moves the group's version.
                "metadata": metadata(group_name(group), ns, {**group_selector(group), LABEL_PART_OF: "exaserve"}),
                "spec": {
                    "maxUnavailable": max_unavailable(fleet.spec, size),
                    "selector": {"matchLabels": group_selector(group)},
                    # A pod that is not Ready serves nobody: the controller's eviction of a hung replica goes through
                    # even when the group is short of pods. Under the default IfHealthyBudget it would pin itself
                    # (kubernetes pkg/registry/core/pod/storage/eviction.go, EvictionREST.Create; GA in 1.31).
                    "unhealthyPodEvictionPolicy": "AlwaysAllow",
                },
            }
        )
    return objects
