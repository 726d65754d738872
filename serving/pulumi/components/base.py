"""One Pulumi resource per rendered Kubernetes object, under a component per concern."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from serving.render.k8s.common import K8sObject

# Typed classes of the built-in kinds the renderers emit; any other kind is a custom resource. Nodes are
# patched (server-side apply of our labels and taint), never created.
TYPED: dict[tuple[str, str], Any] = {
    ("v1", "Namespace"): k8s.core.v1.Namespace,
    ("v1", "Node"): k8s.core.v1.NodePatch,
    ("v1", "ConfigMap"): k8s.core.v1.ConfigMap,
    ("v1", "Service"): k8s.core.v1.Service,
    ("v1", "ServiceAccount"): k8s.core.v1.ServiceAccount,
    ("v1", "PersistentVolume"): k8s.core.v1.PersistentVolume,
    ("v1", "PersistentVolumeClaim"): k8s.core.v1.PersistentVolumeClaim,
    ("apps/v1", "DaemonSet"): k8s.apps.v1.DaemonSet,
    ("apps/v1", "Deployment"): k8s.apps.v1.Deployment,
    ("apps/v1", "StatefulSet"): k8s.apps.v1.StatefulSet,
    ("policy/v1", "PodDisruptionBudget"): k8s.policy.v1.PodDisruptionBudget,
    ("rbac.authorization.k8s.io/v1", "Role"): k8s.rbac.v1.Role,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): k8s.rbac.v1.RoleBinding,
    ("networking.k8s.io/v1", "NetworkPolicy"): k8s.networking.v1.NetworkPolicy,
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicy",
    ): k8s.admissionregistration.v1.ValidatingAdmissionPolicy,
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"): (
        k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding
    ),
}


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def kubernetes_resource(obj: K8sObject, opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
    """The Pulumi resource for one object; its logical name is the object's name (unique per type)."""
    api_version, kind = obj["apiVersion"], obj["kind"]
    name = obj["metadata"]["name"]
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
    cls = TYPED.get((api_version, kind))
    if cls is None:
        extra = sorted(set(body) - {"metadata", "spec"})
        if extra:
            raise ValueError(f"custom resource {kind} {name} has top-level fields {extra}; only metadata and spec")
        return k8s.apiextensions.CustomResource(
            name, api_version=api_version, kind=kind, metadata=body["metadata"], spec=body.get("spec"), opts=opts
        )
    resource: pulumi.CustomResource = cls(name, opts=opts, **{_snake(k): v for k, v in body.items()})
    return resource


class KubernetesComponent(pulumi.ComponentResource):
    """A concern of the fleet: its renderer's objects as child resources (``parent=self``).

    Subclasses set their typed output attributes, then call ``register_outputs`` last.
    """

    def __init__(
        self, type_token: str, name: str, objects: Sequence[K8sObject], opts: pulumi.ResourceOptions | None
    ) -> None:
        super().__init__(type_token, name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.objects = list(objects)
        self.resources: dict[str, pulumi.CustomResource] = {
            f"{o['kind']}/{o['metadata']['name']}": kubernetes_resource(o, child) for o in self.objects
        }

    def names(self, kind: str) -> list[str]:
        return [o["metadata"]["name"] for o in self.objects if o["kind"] == kind]
