"""Monitoring: alert rules and scrape configuration (prometheus-operator custom resources)."""

from __future__ import annotations

import pulumi

from serving.plan.model import Plan
from serving.pulumi.components.base import KubernetesComponent
from serving.render.k8s import monitoring
from serving.spec.schema import FleetSpec


class Monitoring(KubernetesComponent):
    """A PrometheusRule (rollout gates and the source's alert conditions) and ServiceMonitors."""

    def __init__(self, name: str, spec: FleetSpec, plan: Plan, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("exaserve:observability:Monitoring", name, monitoring.render(spec, plan), opts)
        self.alerts: list[str] = [r["alert"] for g in monitoring.rule_groups(spec, plan) for r in g["rules"]]
        self.register_outputs({"alerts": self.alerts})
