"""The ExaServe Pulumi program as a function: one explicit Kubernetes provider, one component per concern, the
stack's outputs, all from one :class:`~serving.plan.model.Fleet` (the plan computed once, by the stack loader).

``infra/__main__.py`` (the entry point ``pulumi up`` runs) calls it with the stack's fleet; ``exaserve render``,
``check`` and ``diff`` call the same function in-process under Pulumi's mocks (:mod:`serving.pulumi.program`), so
an installed wheel renders exactly what ``pulumi up`` would deploy.

Ordering is by what an object needs to exist, never by another concern's readiness: the serving fleet does not wait
for the cache warmer (each pod waits for its own node's cache in an init container), the warmer follows the node
labels it selects on, and custom resources follow the reads of their CRDs (``kubernetes.prerequisites: check``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pulumi
import pulumi_kubernetes as k8s

from serving.plan.model import Fleet
from serving.pulumi.components.cluster import Namespace, Nodes
from serving.pulumi.components.fabric import RdmaFabric
from serving.pulumi.components.observability import Monitoring
from serving.pulumi.components.rollout import Updater
from serving.pulumi.components.runtime import Runtime
from serving.pulumi.components.security import NetworkPolicies
from serving.pulumi.components.serving import Gateway, ServingFleet
from serving.pulumi.components.storage import ModelStorage
from serving.render.k8s.prerequisites import lws_crd_problem, required_crds


def _crd_reads(fleet: Fleet, provider: k8s.Provider) -> Mapping[str, Sequence[pulumi.Resource]]:
    """Read each CRD the stack's custom resources need, by concern: `pulumi up` fails on a missing one, naming it,
    before it creates anything that uses it. Nothing is read when ``kubernetes.prerequisites`` is ``skip``."""
    if fleet.spec.kubernetes.prerequisites == "skip":
        return {}
    opts = pulumi.ResourceOptions(provider=provider)
    reads = {
        concern: [k8s.apiextensions.v1.CustomResourceDefinition.get(f"crd-{n}", n, opts=opts) for n in names]
        for concern, names in required_crds(fleet).items()
    }
    for crd in reads.get("fleet", []):  # the LeaderWorkerSet CRD: the updater needs LWS >= v0.9.0
        crd.spec.apply(_refuse_old_lws)
    return reads


def _refuse_old_lws(spec: object) -> None:
    if problem := lws_crd_problem(spec if isinstance(spec, dict) else None):
        raise pulumi.RunError(problem)


def fleet_stack(fleet: Fleet) -> None:
    """Create ``fleet``'s resources and export the stack outputs (inside a Pulumi program)."""
    spec = fleet.spec
    provider = k8s.Provider("k8s", context=spec.kubernetes.context)
    crds = _crd_reads(fleet, provider)
    cluster = pulumi.ResourceOptions(provider=provider)
    namespace = Namespace("namespace", spec, opts=cluster)

    def after(*needs: pulumi.Resource, concern: str = "") -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(provider=provider, depends_on=[namespace, *needs, *crds.get(concern, [])])

    nodes = Nodes("nodes", spec, opts=cluster)
    fabric = RdmaFabric("fabric", fleet, opts=after(nodes, concern="fabric"))
    ModelStorage("storage", spec, opts=after(nodes))
    serving = ServingFleet("fleet", fleet, opts=after(nodes, concern="fleet"))
    gateway = Gateway("gateway", fleet, opts=after())
    monitoring = Monitoring("monitoring", fleet, opts=after(concern="monitoring"))
    NetworkPolicies("network-policy", fleet, opts=after())
    runtime = Runtime("runtime", fleet, opts=after(concern="monitoring"))  # its PrometheusRule, ServiceMonitor
    updater = Updater("updater", fleet, opts=after())

    pulumi.export("namespace", namespace.namespace)
    pulumi.export("nodes", nodes.gpu_nodes)
    pulumi.export("system_nodes", nodes.system_nodes)
    pulumi.export("rdma_resource", fabric.rdma_resource)
    pulumi.export("group_versions", serving.group_versions)
    pulumi.export("group_sizes", serving.group_sizes)
    pulumi.export("replicas", serving.replicas)
    pulumi.export("router_endpoint", gateway.endpoint)
    pulumi.export("updater_service_account", updater.service_account)
    pulumi.export("alerts", monitoring.alerts + runtime.alerts)
