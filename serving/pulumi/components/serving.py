"""The serving path: the SGLang fleet in update groups and the SGLang router in front of it."""

from __future__ import annotations

import pulumi

from serving.plan.model import Plan
from serving.pulumi.components.base import KubernetesComponent
from serving.render.k8s import fleet, gateway
from serving.spec.schema import FleetSpec


class ServingFleet(KubernetesComponent):
    """Exactly rollout.batches update groups (one LeaderWorkerSet each), a PodDisruptionBudget each, and the
    workers' headless Service."""

    def __init__(self, name: str, spec: FleetSpec, plan: Plan, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("exaserve:serving:ServingFleet", name, fleet.render(spec, plan), opts)
        sizes = plan.rollout_group_sizes
        self.group_versions: dict[str, str] = {
            fleet.group_name(g): spec.group_version(g) for g in range(spec.rollout.batches)
        }
        self.group_sizes: dict[str, int] = {fleet.group_name(g): n for g, n in enumerate(sizes)}
        self.replicas: int = sum(sizes)
        self.register_outputs(
            {"group_versions": self.group_versions, "group_sizes": self.group_sizes, "replicas": self.replicas}
        )


class Gateway(KubernetesComponent):
    """The SGLang router: Deployment with Kubernetes service discovery, least-privilege RBAC, a Service."""

    def __init__(self, name: str, spec: FleetSpec, plan: Plan, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("exaserve:serving:Gateway", name, gateway.render(spec, plan), opts)
        router = gateway.cluster_router(spec, plan)
        self.endpoint: str = f"http://{gateway.NAME}.{spec.kubernetes.namespace}.svc:{router.port}"
        self.metrics_port: int = router.metrics_port
        self.register_outputs({"endpoint": self.endpoint, "metrics_port": self.metrics_port})
