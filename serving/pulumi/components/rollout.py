"""The rolling updater's identity: the account `exaserve rollout` runs as in the cluster."""

from __future__ import annotations

import pulumi

from serving.plan.model import Fleet
from serving.pulumi.components.base import KubernetesComponent
from serving.render.k8s import updater


class Updater(KubernetesComponent):
    """ServiceAccount, Role (exactly the Kubernetes backend's calls) and RoleBinding of the rolling updater, and the
    ValidatingAdmissionPolicy (and binding) that lets its patches change only releases."""

    def __init__(self, name: str, fleet: Fleet, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("exaserve:rollout:Updater", name, updater.render(fleet), opts)
        (self.service_account,) = self.names("ServiceAccount")
        self.register_outputs({"service_account": self.service_account})
