"""NetworkPolicy: deny ingress by default; only the router and the rolling updater reach the workers' serving port,
only the monitoring namespace and the updater reach the router's metrics port.

SGLang serves ``/metrics`` on its serving port, so the monitoring namespace is admitted to that port too. The rolling
updater (``exaserve rollout`` run in a pod labelled ``app.kubernetes.io/name=exaserve-updater``, in the namespace)
calls each replica directly — its health, its in-flight requests on ``/metrics`` while it drains, the warm-up
requests — so its pods are admitted to the serving port and nothing else there. On the routers it calls the API
(``/workers`` on every instance), which is open to every client anyway, and reads the router's ``/metrics`` for its
gates, so it is admitted to the metrics port beside the monitoring namespace.
Replicas that span nodes also admit their own peers (the distributed init and NCCL bootstrap between the
pods of one replica). Host-network DaemonSets (the RDMA plugin) are outside pod network policy.
"""

from __future__ import annotations

from typing import Any

from serving.plan.model import Fleet
from serving.render.k8s import gateway
from serving.render.k8s.common import LABEL_NAME, ROUTER_APP, SERVING_APP, UPDATER_APP, K8sObject, labels, metadata
from serving.render.k8s.fleet import WORKERS_SERVICE
from serving.spec.schema import FleetSpec

COMPONENT = "network-policy"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def _policy(spec: FleetSpec, name: str, pod_selector: dict[str, Any], ingress: list[dict[str, Any]]) -> K8sObject:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(name, spec.kubernetes.namespace, labels(COMPONENT, name)),
        "spec": {"podSelector": pod_selector, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def render(fleet: Fleet) -> list[K8sObject]:
    monitoring = {
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: fleet.spec.kubernetes.monitoring_namespace}}
    }
    router_pods = {"podSelector": {"matchLabels": {LABEL_NAME: ROUTER_APP}}}
    serving_pods = {"podSelector": {"matchLabels": {LABEL_NAME: SERVING_APP}}}
    updater_pods = {"podSelector": {"matchLabels": {LABEL_NAME: UPDATER_APP}}}
    serving_port = [{"protocol": "TCP", "port": fleet.spec.serving.port}]
    router = gateway.cluster_router(fleet)
    http_port, metrics_port = router.port, router.metrics_port
    worker_ingress: list[dict[str, Any]] = [
        {"from": [router_pods, updater_pods, monitoring], "ports": serving_port},
    ]
    if fleet.plan.multi_node:
        worker_ingress.append({"from": [serving_pods]})
    return [
        _policy(fleet.spec, "default-deny-ingress", {}, []),
        _policy(fleet.spec, WORKERS_SERVICE, serving_pods["podSelector"], worker_ingress),
        _policy(
            fleet.spec,
            ROUTER_APP,
            router_pods["podSelector"],
            [
                {"ports": [{"protocol": "TCP", "port": http_port}]},
                {"from": [monitoring, updater_pods], "ports": [{"protocol": "TCP", "port": metrics_port}]},
            ],
        ),
    ]
