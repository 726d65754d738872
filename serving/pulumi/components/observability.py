"""Monitoring: alert rules and scrape configuration (prometheus-operator custom resources)."""

from __future__ import annotations

import pulumi

from serving.plan.model import Fleet
from serving.pulumi.components.base import KubernetesComponent
from serving.render.k8s import monitoring


class Monitoring(KubernetesComponent):
    """A PrometheusRule (rollout gates and the source's alert conditions) and ServiceMonitors."""

    def __init__(self, name: str, fleet: Fleet, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("exaserve:observability:Monitoring", name, monitoring.render(fleet), opts)
        self.alerts: list[str] = [r["alert"] for g in monitoring.rule_groups(fleet) for r in g["rules"]]
        self.register_outputs({"alerts": self.alerts})
