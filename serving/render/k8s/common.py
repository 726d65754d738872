"""Shared vocabulary of the rendered objects: label and annotation keys, metadata, node placement."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from serving.spec.schema import FleetSpec

K8sObject = dict[str, Any]

PREFIX = "exaserve.io"
LABEL_POOL = f"{PREFIX}/pool"
LABEL_RACK = f"{PREFIX}/rack"
LABEL_LEAF = f"{PREFIX}/leaf"
LABEL_GPU_PRODUCT = f"{PREFIX}/gpu-product"
LABEL_FABRIC = f"{PREFIX}/fabric"
LABEL_GROUP = f"{PREFIX}/group"
LABEL_VERSION = f"{PREFIX}/version"
# "true" on every serving pod (the pod template's); the routers' discovery selects only those. The rolling updater
# takes a batch out by setting "false" on its pods and brings it back with "true" (serving.rollout.backends.kubernetes).
LABEL_ADMITTED = f"{PREFIX}/admitted"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_PART_OF = "app.kubernetes.io/part-of"
HOSTNAME_LABEL = "kubernetes.io/hostname"

# A container may run privileged only in a DaemonSet named in serving.checks.policy.workloads.PRIVILEGED_DAEMONSETS that
# states its reason in this annotation; a LoadBalancer Service needs the second one.
ANNOTATION_PRIVILEGED_REASON = f"{PREFIX}/privileged-reason"
ANNOTATION_ALLOW_LOAD_BALANCER = f"{PREFIX}/allow-load-balancer"

# GPU nodes are reserved for GPU work with the GPU operator's own convention, so NVIDIA's device plugin, GPU feature
# discovery and DCGM exporter DaemonSets (which tolerate nvidia.com/gpu) still land there. The kubelet sets it at
# registration (Ansible role ``kubelet``); the node patches carry labels only.
TAINT_KEY = "nvidia.com/gpu"
TAINT_VALUE = "present"
TAINT_EFFECT = "NoSchedule"

# pulumi-kubernetes await annotations: what `pulumi up` waits for, per object (docs/infra.md, "What up waits for").
ANNOTATION_SKIP_AWAIT = "pulumi.com/skipAwait"
ANNOTATION_TIMEOUT_S = "pulumi.com/timeoutSeconds"

# app.kubernetes.io/name of the serving pods, the router and the updater: selectors, policies and alerts use them.
SERVING_APP = "sglang"
ROUTER_APP = "sglang-router"
UPDATER_APP = "exaserve-updater"  # the pod that runs `exaserve rollout` in the cluster, and its ServiceAccount


def labels(component: str, app: str, **extra: str) -> dict[str, str]:
    """The recommended app.kubernetes.io labels plus ``extra``."""
    return {LABEL_NAME: app, LABEL_COMPONENT: component, LABEL_PART_OF: "exaserve", **extra}


def metadata(
    name: str,
    namespace: str | None,
    object_labels: dict[str, str],
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(object_labels)}
    if namespace is not None:
        meta["namespace"] = namespace
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def alert(name: str, expr: str, for_: str, severity: str, summary: str, fix: str) -> dict[str, Any]:
    """One Prometheus alerting rule; every alert says what to do in its ``fix`` annotation."""
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity},
        "annotations": {"summary": summary, "fix": fix},
    }


def service_account_with_role(
    account: str, role: str, namespace: str, lab: dict[str, str], rules: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """A ServiceAccount ``account``, a namespaced Role ``role`` holding exactly ``rules``, and the RoleBinding
    that grants it to the account: least privilege for a pod that calls the API server."""
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata(account, namespace, lab)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": metadata(role, namespace, lab),
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": metadata(role, namespace, lab),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        },
    ]


def serving_pools(spec: FleetSpec) -> list[str]:
    return [p.name for p in spec.cluster.pools]


def gpu_node_affinity(spec: FleetSpec) -> dict[str, Any]:
    """Schedule onto the spec's pools (the node patches label every node with its pool)."""
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": LABEL_POOL, "operator": "In", "values": serving_pools(spec)}]}
                ]
            }
        }
    }


@dataclass(frozen=True)
class Requests:
    """A container's resource requests, in the units the system pool's sizing adds up (rendered as quantities)."""

    millicpu: int
    memory_mib: int

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 2**20

    def quantities(self) -> dict[str, str]:
        cpu = f"{self.millicpu // 1000}" if self.millicpu % 1000 == 0 else f"{self.millicpu}m"
        memory = f"{self.memory_mib // 1024}Gi" if self.memory_mib % 1024 == 0 else f"{self.memory_mib}Mi"
        return {"cpu": cpu, "memory": memory}


def system_pool_selector(spec: FleetSpec) -> dict[str, str]:
    """The label of the system pool's nodes (the node patches set it); {} when the stack declares no pool."""
    pool = spec.cluster.system_pool
    return {LABEL_POOL: pool.name} if pool else {}


def on_system_pool(spec: FleetSpec) -> dict[str, Any]:
    """The pod spec's ``nodeSelector`` for the routers and controllers: the system pool (no GPU taint to tolerate).
    Nothing without a pool: guard ``system-pool-placement`` then names the fix."""
    selector = system_pool_selector(spec)
    return {"nodeSelector": selector} if selector else {}


def serving_toleration() -> dict[str, str]:
    """Tolerate the GPU nodes' taint as the GPU operator's own DaemonSets do (any value)."""
    return {"key": TAINT_KEY, "operator": "Exists", "effect": TAINT_EFFECT}


def node_taint() -> str:
    """The kubelet's ``--register-with-taints`` value for a GPU node."""
    return f"{TAINT_KEY}={TAINT_VALUE}:{TAINT_EFFECT}"


def image(spec: FleetSpec, name: str) -> str:
    """``name`` pulled through ``kubernetes.image_registry`` when the stack names a mirror."""
    mirror = spec.kubernetes.image_registry
    return f"{mirror}/{name}" if mirror else name


def pull_secrets(spec: FleetSpec) -> dict[str, Any]:
    """The pod spec's ``imagePullSecrets`` (a reference by name) when the stack names one."""
    secret = spec.kubernetes.image_pull_secret
    return {"imagePullSecrets": [{"name": secret}]} if secret else {}


def await_annotations(*, skip: bool = False, timeout_s: float | None = None) -> dict[str, str]:
    """What `pulumi up` waits for on one object: nothing (``skip``), or readiness within ``timeout_s``."""
    if skip:
        return {ANNOTATION_SKIP_AWAIT: "true"}
    if timeout_s is None:
        raise ValueError("await_annotations needs skip=True or a timeout")
    return {ANNOTATION_TIMEOUT_S: str(max(1, math.ceil(timeout_s)))}


def gigabytes(gb: float) -> str:
    """A Kubernetes quantity for a size in GB (10^9 bytes), as the spec's ``*_gb`` fields are."""
    return f"{gb:g}G" if float(gb).is_integer() else f"{round(gb * 1000)}M"


def duration(seconds: float) -> str:
    """A Prometheus duration (``5m``, ``90s``, ``1h30m``) for a whole number of seconds (at least 1 s)."""
    s = max(1, round(seconds))
    out = ""
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        n, s = divmod(s, size)
        if n:
            out += f"{n}{unit}"
    return out
