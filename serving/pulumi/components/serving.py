"""The serving path: the SGLang fleet in update groups and the SGLang router in front of it."""

from __future__ import annotations

import pulumi

from serving.plan.model import Fleet
from serving.pulumi.components.base import KubernetesComponent
from serving.render.k8s import fleet as serving_fleet
from serving.render.k8s import gateway


class ServingFleet(KubernetesComponent):
    """Exactly rollout.batches update groups (one LeaderWorkerSet each), a PodDisruptionBudget each, and the
    workers' headless Service."""

    def __init__(self, name: str, fleet: Fleet, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("exaserve:serving:ServingFleet", name, serving_fleet.render(fleet), opts)
        sizes = fleet.plan.rollout_group_sizes
        self.group_versions: dict[str, str] = {
            serving_fleet.group_name(g): fleet.spec.group_version(g) for g in range(fleet.spec.rollout.batches)
        }
        self.group_sizes: dict[str, int] = {serving_fleet.group_name(g): n for g, n in enumerate(sizes)}
        self.replicas: int = sum(sizes)
        self.register_outputs(
            {"group_versions": self.group_versions, "group_sizes": self.group_sizes, "replicas": self.replicas}
        )


class Gateway(KubernetesComponent):
    """The SGLang router: Deployment with Kubernetes service discovery, least-privilege RBAC, a Service."""

    def __init__(self, name: str, fleet: Fleet, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("exaserve:serving:Gateway", name, gateway.render(fleet), opts)
        router = gateway.cluster_router(fleet)
        self.endpoint: str = f"http://{gateway.NAME}.{fleet.spec.kubernetes.namespace}.svc:{router.port}"
        self.metrics_port: int = router.metrics_port
        self.register_outputs({"endpoint": self.endpoint, "metrics_port": self.metrics_port})
