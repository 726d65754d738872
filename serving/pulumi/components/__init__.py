"""The Pulumi components of ExaServe: one per concern, each built from a pure renderer in serving.render.k8s;
:func:`fleet_stack` (``serving.pulumi.components.stack``) is the program that creates them."""

from serving.pulumi.components.cluster import Namespace, Nodes
from serving.pulumi.components.fabric import RdmaFabric
from serving.pulumi.components.observability import Monitoring
from serving.pulumi.components.rollout import Updater
from serving.pulumi.components.runtime import Runtime
from serving.pulumi.components.security import NetworkPolicies
from serving.pulumi.components.serving import Gateway, ServingFleet
from serving.pulumi.components.stack import fleet_stack
from serving.pulumi.components.storage import ModelStorage

__all__ = [
    "Gateway",
    "ModelStorage",
    "Monitoring",
    "Namespace",
    "NetworkPolicies",
    "Nodes",
    "RdmaFabric",
    "Runtime",
    "ServingFleet",
    "Updater",
    "fleet_stack",
]
