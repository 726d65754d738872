"""The runtime layer: fleet controller (3 instances, one leader on a Lease), node agents, their alerts."""

from __future__ import annotations

import pulumi

from serving.plan.model import Fleet
from serving.pulumi.components.base import KubernetesComponent
from serving.render.k8s import runtime


class Runtime(KubernetesComponent):
    """Controller Deployment, agent DaemonSet, Lease RBAC, headless Services, PrometheusRule and ServiceMonitor."""

    def __init__(self, name: str, fleet: Fleet, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("exaserve:runtime:Runtime", name, runtime.render(fleet), opts)
        self.controllers: int = fleet.spec.scheduler.instances
        self.alerts: list[str] = [r["alert"] for g in runtime.rule_groups(fleet.spec) for r in g["rules"]]
        self.register_outputs({"controllers": self.controllers, "alerts": self.alerts})
