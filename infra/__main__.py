"""The ExaServe Pulumi program: `pulumi up --stack NAME` deploys the fleet Pulumi.<NAME>.yaml describes.

Loads the stack's spec, creates one explicit Kubernetes provider and one component per concern, exports
outputs. Everything else lives in the components (infra/components) and the pure renderers (serving.render.k8s).
`exaserve render` runs this same file in-process under Pulumi's mocks.
"""

import pulumi
import pulumi_kubernetes as k8s
from components import (
    Gateway,
    ModelStorage,
    Monitoring,
    Namespace,
    NetworkPolicies,
    Nodes,
    Ntp,
    RdmaFabric,
    ServingFleet,
)

from serving.pulumi.program import program_stack

spec = program_stack().spec

provider = k8s.Provider("k8s", context=spec.kubernetes.context)
cluster = pulumi.ResourceOptions(provider=provider)
namespace = Namespace("namespace", spec, opts=cluster)
in_namespace = pulumi.ResourceOptions(provider=provider, depends_on=[namespace])

nodes = Nodes("nodes", spec, opts=cluster)
fabric = RdmaFabric("fabric", spec, opts=in_namespace)
ntp = Ntp("ntp", spec, opts=in_namespace)
storage = ModelStorage("storage", spec, opts=in_namespace)
fleet = ServingFleet(
    "fleet", spec, opts=pulumi.ResourceOptions(provider=provider, depends_on=[namespace, nodes, storage])
)
gateway = Gateway("gateway", spec, opts=in_namespace)
monitoring = Monitoring("monitoring", spec, opts=in_namespace)
network_policies = NetworkPolicies("network-policy", spec, opts=in_namespace)

pulumi.export("namespace", namespace.namespace)
pulumi.export("nodes", len(nodes.node_names))
pulumi.export("rdma_resource", fabric.rdma_resource)
pulumi.export("group_versions", fleet.group_versions)
pulumi.export("group_sizes", fleet.group_sizes)
pulumi.export("replicas", fleet.replicas)
pulumi.export("router_endpoint", gateway.endpoint)
pulumi.export("alerts", monitoring.alerts)
