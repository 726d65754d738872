"""The Pulumi components of ExaServe: one per concern, each built from a pure renderer in serving.render.k8s."""

from components.cluster import Namespace, Nodes, Ntp
from components.fabric import RdmaFabric
from components.observability import Monitoring
from components.security import NetworkPolicies
from components.serving import Gateway, ServingFleet
from components.storage import ModelStorage

__all__ = [
    "Gateway",
    "ModelStorage",
    "Monitoring",
    "Namespace",
    "NetworkPolicies",
    "Nodes",
    "Ntp",
    "RdmaFabric",
    "ServingFleet",
]
