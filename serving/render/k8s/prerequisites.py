"""What the cluster must already run for a stack: the CRDs its custom resources need (checked by `pulumi up` when
``kubernetes.prerequisites`` is ``check``) and the operators and DaemonSets it relies on (docs/infra.md has the
table with versions). Pure: the Pulumi program turns :func:`required_crds` into reads of the live CRDs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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


LWS_MIN_VERSION = "v0.9.0"  # the first LWS whose controller sets status.observedGeneration (kubernetes-sigs/lws#807)


def lws_crd_problem(crd_spec: Mapping[str, Any] | None) -> str | None:
    """Why the cluster's LeaderWorkerSet CRD is too old for the updater, or None. The updater waits for an LWS's
    ``status.observedGeneration`` to reach its generation before it trusts the status (docs/k8s-semantics.md); LWS
    added the field in v0.9.0 (#807), and its CRD's schema has it from then on, so a served version without it is an
    older LWS. None when the spec is not known (a preview's unknowns, the offline render without the CRDs)."""
    if not crd_spec:
        return None
    lacking = [str(v.get("name")) for v in crd_spec.get("versions") or [] if v.get("served") and not _observed(v)]
    if not lacking:
        return None
    return (
        f"CustomResourceDefinition {LWS_CRD}: served version(s) {', '.join(lacking)} have no status.observedGeneration, "
        f"so the LeaderWorkerSet controller is older than {LWS_MIN_VERSION} (it added the field) and the updater "
        f"cannot tell when a group's status describes its new template; upgrade LWS to {LWS_MIN_VERSION} or later "
        "(docs/infra.md, prerequisites)"
    )


def _observed(version: Mapping[str, Any]) -> bool:
    """Whether a CRD version's schema has ``status.observedGeneration``. The schema's key is ``openAPIV3Schema`` as the
    API server writes it and ``open_apiv3_schema`` in the output types pulumi-kubernetes' Python SDK hands an apply."""
    validation = version.get("schema") or {}
    schema = validation.get("open_apiv3_schema") or validation.get("openAPIV3Schema") or {}
    status = (schema.get("properties") or {}).get("status") or {}
    return "observedGeneration" in (status.get("properties") or {})
