"""The stack's namespace. Its pod-security level is ``privileged`` because the RDMA device plugin runs there;
the policy pack (:mod:`serving.checks.policy`) keeps every other container unprivileged."""

from __future__ import annotations

from serving.render.k8s.common import K8sObject, labels, metadata
from serving.spec.schema import FleetSpec

COMPONENT = "namespace"


def render(spec: FleetSpec) -> list[K8sObject]:
    ns = spec.kubernetes.namespace
    lab = labels(COMPONENT, ns, **{"pod-security.kubernetes.io/enforce": "privileged"})
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": metadata(ns, None, lab)}]
