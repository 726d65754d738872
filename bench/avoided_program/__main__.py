"""The program shape ExaServe avoids, for the render benchmark only: one StatefulSet per replica (2,048 in prod)
instead of one per update group. Everything else is the real program (serving/pulumi/components/stack.py)."""

import copy

import pulumi
import pulumi_kubernetes as k8s

from serving.plan.model import Plan
from serving.plan.planner import plan
from serving.pulumi.components import (
    Gateway,
    ModelStorage,
    Monitoring,
    Namespace,
    NetworkPolicies,
    Nodes,
    Ntp,
    RdmaFabric,
)
from serving.pulumi.components.base import KubernetesComponent
from serving.pulumi.program import program_stack
from serving.render.k8s import fleet
from serving.spec.schema import FleetSpec


class PerReplicaFleet(KubernetesComponent):
    """Each group's StatefulSet split into one single-replica StatefulSet per replica."""

    def __init__(self, name: str, spec: FleetSpec, pl: Plan, opts: pulumi.ResourceOptions | None = None) -> None:
        objects = []
        for obj in fleet.render(spec, pl):
            if obj["kind"] != "StatefulSet":
                objects.append(obj)
                continue
            for i in range(obj["spec"]["replicas"]):
                single = copy.deepcopy(obj)
                single["metadata"]["name"] = f"{obj['metadata']['name']}-r{i}"
                single["spec"]["replicas"] = 1
                objects.append(single)
        super().__init__("exaserve:serving:ServingFleet", name, objects, opts)
        self.register_outputs({"statefulsets": len(self.names("StatefulSet"))})


spec = program_stack().spec
pl = plan(spec)
provider = k8s.Provider("k8s", context=spec.kubernetes.context)
cluster = pulumi.ResourceOptions(provider=provider)
namespace = Namespace("namespace", spec, opts=cluster)
in_namespace = pulumi.ResourceOptions(provider=provider, depends_on=[namespace])
nodes = Nodes("nodes", spec, opts=cluster)
RdmaFabric("fabric", spec, opts=in_namespace)
Ntp("ntp", spec, opts=in_namespace)
storage = ModelStorage("storage", spec, opts=in_namespace)
PerReplicaFleet("fleet", spec, pl, opts=pulumi.ResourceOptions(provider=provider, depends_on=[namespace, nodes, storage]))
Gateway("gateway", spec, pl, opts=in_namespace)
Monitoring("monitoring", spec, opts=in_namespace)
NetworkPolicies("network-policy", spec, pl, opts=in_namespace)
