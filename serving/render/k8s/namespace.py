"""The stack's namespace. Its pod-security level is ``privileged``: the serving pods and the cache warmer mount the
node-local model cache (hostPath, which even ``baseline`` forbids) and the RDMA device plugin, where a replica spans
nodes, runs privileged. The policy pack (:mod:`serving.checks.policy`) is what keeps every other container
unprivileged, non-root where it can be, and without host namespaces (docs/infra.md, finding 16)."""

from __future__ import annotations

from serving.render.k8s.common import K8sObject, labels, metadata
from serving.spec.schema import FleetSpec

COMPONENT = "namespace"


def render(spec: FleetSpec) -> list[K8sObject]:
    ns = spec.kubernetes.namespace
    lab = labels(COMPONENT, ns, **{"pod-security.kubernetes.io/enforce": "privileged"})
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": metadata(ns, None, lab)}]
