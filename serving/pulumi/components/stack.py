"""The ExaServe Pulumi program as a function: the plan computed once, one explicit Kubernetes provider, one
component per concern, the stack's outputs.

``infra/__main__.py`` (the entry point ``pulumi up`` runs) calls it with the stack's spec; ``exaserve render``,
``check`` and ``diff`` call the same function in-process under Pulumi's mocks (:mod:`serving.pulumi.program`), so
an installed wheel renders exactly what ``pulumi up`` would deploy.
"""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from serving.plan.planner import plan
from serving.pulumi.components.cluster import Namespace, Nodes, Ntp
from serving.pulumi.components.fabric import RdmaFabric
from serving.pulumi.components.observability import Monitoring
from serving.pulumi.components.security import NetworkPolicies
from serving.pulumi.components.serving import Gateway, ServingFleet
from serving.pulumi.components.storage import ModelStorage
from serving.spec.schema import FleetSpec


def fleet_stack(spec: FleetSpec) -> None:
    """Create the fleet's resources for ``spec`` and export the stack outputs (inside a Pulumi program)."""
    pl = plan(spec)
    provider = k8s.Provider("k8s", context=spec.kubernetes.context)
    cluster = pulumi.ResourceOptions(provider=provider)
    namespace = Namespace("namespace", spec, opts=cluster)
    in_namespace = pulumi.ResourceOptions(provider=provider, depends_on=[namespace])

    nodes = Nodes("nodes", spec, opts=cluster)
    fabric = RdmaFabric("fabric", spec, opts=in_namespace)
    Ntp("ntp", spec, opts=in_namespace)
    storage = ModelStorage("storage", spec, opts=in_namespace)
    fleet = ServingFleet(
        "fleet", spec, pl, opts=pulumi.ResourceOptions(provider=provider, depends_on=[namespace, nodes, storage])
    )
    gateway = Gateway("gateway", spec, pl, opts=in_namespace)
    monitoring = Monitoring("monitoring", spec, opts=in_namespace)
    NetworkPolicies("network-policy", spec, pl, opts=in_namespace)

    pulumi.export("namespace", namespace.namespace)
    pulumi.export("nodes", len(nodes.node_names))
    pulumi.export("rdma_resource", fabric.rdma_resource)
    pulumi.export("group_versions", fleet.group_versions)
    pulumi.export("group_sizes", fleet.group_sizes)
    pulumi.export("replicas", fleet.replicas)
    pulumi.export("router_endpoint", gateway.endpoint)
    pulumi.export("alerts", monitoring.alerts)
