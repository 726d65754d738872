"""What the cluster must already run for a stack: the CRDs its custom resources need (checked by `pulumi up` when
``kubernetes.prerequisites`` is ``check``) and the operators and DaemonSets it relies on (docs/infra.md has the
table with versions). Pure: the Pulumi program turns :func:`required_crds` into reads of the live CRDs."""

from __future__ import annotations

from serving.plan.model import Fleet
from serving.render.k8s import fabric

LWS_CRD = "leaderworkersets.leaderworkerset.x-k8s.io"
PROMETHEUS_RULE_CRD = "prometheusrules.monitoring.coreos.com"
SERVICE_MONITOR_CRD = "servicemonitors.monitoring.coreos.com"
POD_MONITOR_CRD = "podmonitors.monitoring.coreos.com"
NAD_CRD = "network-attachment-definitions.k8s.cni.cncf.io"


def required_crds(fleet: Fleet) -> dict[str, list[str]]:
    """CRD names each concern's custom resources need, by concern (``fleet``, ``monitoring``, ``fabric``)."""
    needed = {"monitoring": [PROMETHEUS_RULE_CRD, SERVICE_MONITOR_CRD, POD_MONITOR_CRD]}
    if fleet.plan.multi_node:  # one-node replicas are StatefulSets (serving.render.k8s.fleet)
        needed["fleet"] = [LWS_CRD]
    if fabric.has_rdma(fleet) and fleet.spec.cluster.fabric.secondary_network:
        needed["fabric"] = [NAD_CRD]
    return needed
