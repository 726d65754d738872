"""The rolling updater's identity on Kubernetes: a ServiceAccount and a Role granting exactly the API calls
:mod:`serving.rollout.backends.kubernetes` makes, nothing more.

The backend's calls, and the rule that allows each:

* ``GET`` and ``PATCH`` (JSON merge patch) of an update group's workload ``sglang-g<i>`` (a StatefulSet, or a
  LeaderWorkerSet when replicas span nodes): ``get``/``patch`` on that resource, by name (the stack's
  ``rollout.batches`` groups);
* ``GET /api/v1/namespaces/<ns>/pods?labelSelector=exaserve.io/group=<i>``: ``list`` on ``pods`` (RBAC cannot
  narrow a list by name);
* ``PATCH`` of a replica's serving pod (its ``exaserve.io/admitted`` label): ``patch`` on ``pods``, by name — the
  leader pods ``sglang-g<i>-<ordinal>`` of the stack's replicas, so the account cannot touch the router's, the
  controllers' or a multi-node replica's worker pods (a pod's image is patchable);
* ``DELETE`` of those same pods (StatefulSet groups only): ``delete`` on ``pods``, by name — an OnDelete StatefulSet
  replaces a pod only when it is deleted (:mod:`serving.rollout.backends.kubernetes`);
* the batch Lease ``exaserve-rollout-<namespace>`` it holds while a batch is out (``KubernetesBackend.announce``):
  ``get``/``update`` on that Lease by name, and ``create`` on ``leases`` (RBAC cannot narrow a create by name: the
  account may create other Leases in the namespace, none of which anything reads).

RBAC cannot narrow a ``patch`` to fields; a ValidatingAdmissionPolicy bound to this account does
(:mod:`serving.render.k8s.admission`): only images, the release and the version label of a workload, only the
admitted label of a pod.

The router instances are found through DNS (the headless Service :data:`serving.render.k8s.gateway.PODS_SERVICE`),
not the API, so the account reads no Endpoints. The pod that runs ``exaserve rollout`` is not rendered here
(docs/rollout.md, "In the cluster"): it runs as this account, labelled ``app.kubernetes.io/name=exaserve-updater``,
which the NetworkPolicies admit to the workers' serving port and the routers' metrics port
(:mod:`serving.render.k8s.netpol`).
"""

from __future__ import annotations

from typing import Any

from serving.plan.model import Fleet, Plan
from serving.render.k8s import admission
from serving.render.k8s.common import UPDATER_APP, K8sObject, labels, service_account_with_role
from serving.render.k8s.fleet import group_name, workload_kind
from serving.rollout.backends.kubernetes import batch_lease_name

COMPONENT = "rollout"
ROLE = f"{UPDATER_APP}-rollout"


def leader_pods(plan: Plan) -> list[str]:
    """Each replica's serving pod: ``sglang-g<group>-<ordinal>``, as its StatefulSet or LeaderWorkerSet names it."""
    return [f"{group_name(g)}-{i}" for g, size in enumerate(plan.rollout_group_sizes) for i in range(size)]


def rules(fleet: Fleet) -> list[dict[str, Any]]:
    """The Role's rules: one per kind of call the backend makes (module docstring)."""
    api_version, kind = workload_kind(fleet)
    return [
        {
            "apiGroups": [api_version.rsplit("/", 1)[0]],
            "resources": [f"{kind.lower()}s"],
            "resourceNames": [group_name(g) for g in range(fleet.spec.rollout.batches)],
            "verbs": ["get", "patch"],
        },
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        {
            "apiGroups": [""],
            "resources": ["pods"],
            "resourceNames": leader_pods(fleet.plan),
            # An OnDelete StatefulSet replaces a pod only when it is deleted; a LeaderWorkerSet replaces its own.
            "verbs": ["patch", "delete"] if kind == "StatefulSet" else ["patch"],
        },
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [batch_lease_name(fleet.spec.kubernetes.namespace)],
            "verbs": ["get", "update"],
        },
    ]


def render(fleet: Fleet) -> list[K8sObject]:
    """The account, its Role and binding, and the admission policy narrowing its patches (:mod:`.admission`)."""
    return [
        *service_account_with_role(
            UPDATER_APP, ROLE, fleet.spec.kubernetes.namespace, labels(COMPONENT, UPDATER_APP), rules(fleet)
        ),
        *admission.render(fleet),
    ]
