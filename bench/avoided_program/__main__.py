"""The program shape ExaServe avoids, for the render benchmark only: one LeaderWorkerSet per replica (2,048 in prod)
instead of one per update group. Everything else is the real program (serving/pulumi/components/stack.py)."""

import copy

import pulumi
import pulumi_kubernetes as k8s

from serving.plan.model import Fleet
from serving.pulumi.components import (
    Gateway,
    ModelStorage,
    Monitoring,
    Namespace,
    NetworkPolicies,
    Nodes,
    RdmaFabric,
)
from serving.pulumi.components.base import KubernetesComponent
from serving.pulumi.program import program_fleet
from serving.render.k8s import fleet as serving_fleet


class PerReplicaFleet(KubernetesComponent):
    """Each group's LeaderWorkerSet split into one single-replica LeaderWorkerSet per replica."""

    def __init__(self, name: str, fleet: Fleet, opts: pulumi.ResourceOptions | None = None) -> None:
        objects = []
        for obj in serving_fleet.render(fleet):
            if obj["kind"] != "LeaderWorkerSet":
                objects.append(obj)
                continue
            for i in range(obj["spec"]["replicas"]):
                single = copy.deepcopy(obj)
                single["metadata"]["name"] = f"{obj['metadata']['name']}-r{i}"
                single["spec"]["replicas"] = 1
                objects.append(single)
        super().__init__("exaserve:serving:ServingFleet", name, objects, opts)
        self.register_outputs({"groups": len(self.names("LeaderWorkerSet"))})


fleet = program_fleet()
spec = fleet.spec
provider = k8s.Provider("k8s", context=spec.kubernetes.context)
cluster = pulumi.ResourceOptions(provider=provider)
namespace = Namespace("namespace", spec, opts=cluster)
in_namespace = pulumi.ResourceOptions(provider=provider, depends_on=[namespace])
nodes = Nodes("nodes", spec, opts=cluster)
after_nodes = pulumi.ResourceOptions(provider=provider, depends_on=[namespace, nodes])
RdmaFabric("fabric", fleet, opts=after_nodes)
ModelStorage("storage", spec, opts=after_nodes)
PerReplicaFleet("fleet", fleet, opts=after_nodes)
Gateway("gateway", fleet, opts=in_namespace)
Monitoring("monitoring", fleet, opts=in_namespace)
NetworkPolicies("network-policy", fleet, opts=in_namespace)
