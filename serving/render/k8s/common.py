"""Shared vocabulary of the rendered objects: label and annotation keys, metadata, node placement."""

from __future__ import annotations

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
LABEL_NAME = "app.kubernetes.io/name"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_PART_OF = "app.kubernetes.io/part-of"
HOSTNAME_LABEL = "kubernetes.io/hostname"

# A container may run privileged only in a DaemonSet named in serving.checks.policy.PRIVILEGED_DAEMONSETS that
# states its reason in this annotation; a LoadBalancer Service needs the second one.
ANNOTATION_PRIVILEGED_REASON = f"{PREFIX}/privileged-reason"
ANNOTATION_ALLOW_LOAD_BALANCER = f"{PREFIX}/allow-load-balancer"

# GPU nodes are reserved for serving: only pods tolerating this taint land there.
TAINT_KEY = f"{PREFIX}/reserved"
TAINT_VALUE = "serving"

# app.kubernetes.io/name of the serving pods and the router: selectors, policies and alerts use them.
SERVING_APP = "sglang"
ROUTER_APP = "sglang-router"


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


def serving_toleration() -> dict[str, str]:
    return {"key": TAINT_KEY, "operator": "Equal", "value": TAINT_VALUE, "effect": "NoSchedule"}


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
