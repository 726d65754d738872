"""Gateway: the SGLang router as a Deployment with Kubernetes service discovery.

The router's command and its ports come from one :class:`serving.render.router.RouterArgs` value
(``kubernetes=True``: discovery of the serving pods by label in the stack's namespace), so they are defined once. Discovery needs to read pods and nothing else: the Role grants get/list/watch on pods.

Clients reach the routers through one ClusterIP Service; membership is per router instance, so a headless Service
(:data:`PODS_SERVICE`) gives one address per router pod: the rolling updater and the fleet controllers resolve it
and prove each membership change on every instance. It names both ports, the API and the metrics listener: each
instance counts only the requests it routed, so a reader of router metrics (the updater's gates) must reach every
instance's own listener, which the ClusterIP Service (one instance per connection) cannot give.
"""

from __future__ import annotations

from serving.plan.model import Fleet
from serving.render.common import whole_seconds
from serving.render.k8s.common import (
    HOSTNAME_LABEL,
    LABEL_NAME,
    ROUTER_APP,
    K8sObject,
    Requests,
    await_annotations,
    image,
    labels,
    metadata,
    on_system_pool,
    pull_secrets,
    service_account_with_role,
)
from serving.render.router import RouterArgs, router_args
from serving.spec.schema import FleetSpec

COMPONENT = "gateway"
NAME = ROUTER_APP
PODS_SERVICE = f"{ROUTER_APP}-pods"  # headless: one address per router pod
HTTP_PORT_NAME = "http"
METRICS_PORT_NAME = "metrics"
LIVENESS_PATH = "/liveness"  # the router's own liveness: answers without asking any worker
DISCOVERY_RULES = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
# How long cluster DNS may keep answering with a router pod's address: the Corefile kubeadm installs answers Service
# records with `ttl 30` and caches them (`cache 30`) (kubernetes cmd/kubeadm/app/phases/addons/dns/manifests.go,
# CoreDNSConfigMap; CoreDNS's own default is 5 s). The updater and the controllers resolve the headless Service before
# each operation (serving.router.membership), so a deleted router can be named to them that long after it left the
# EndpointSlice (docs/k8s-semantics.md).
DNS_TTL_S = 30
# The kubelet's minimumGracePeriodInSeconds: the least stop window it gives a container after its preStop.
KUBELET_MIN_STOP_S = 2
# What one router asks of a system-pool node (the pool's size is derived from it: serving.render.k8s.system).
ROUTER_REQUESTS = Requests(millicpu=2000, memory_mib=2048)


def drain_before_stop_s(spec: FleetSpec) -> int:
    """The router's preStop: how long a deleted router pod keeps serving before its SIGTERM. The EndpointSlice
    controller marks a terminating pod not ready at once; kube-proxy and DNS apply that later (a resolver may reuse an
    answer for :data:`DNS_TTL_S`; kube-proxy syncs within its min-sync period). The DNS TTL, or one heartbeat interval
    (the serving pods' preStop) if longer."""
    return max(whole_seconds(spec.serving.heartbeat_interval_s), DNS_TTL_S)


def termination_grace_s(spec: FleetSpec) -> int:
    """The router pod's terminationGracePeriodSeconds. The kubelet counts the preStop within it and sends SIGTERM
    only after (kuberuntime_container.go, killContainer), then the router drains its in-flight requests for
    ``--shutdown-grace-period-secs`` (rollout.drain_timeout_s); :data:`KUBELET_MIN_STOP_S` more for it to exit."""
    return drain_before_stop_s(spec) + whole_seconds(spec.rollout.drain_timeout_s) + KUBELET_MIN_STOP_S


def cluster_router(fleet: Fleet) -> RouterArgs:
    """The cluster's routers: Kubernetes discovery of the serving pods, no static workers."""
    return router_args(fleet, kubernetes=True)


def router_replicas(spec: FleetSpec) -> int:
    """One router per scheduler instance (source §4.3: at least 3; ``exaserve plan`` rule scheduler.ha)."""
    return spec.scheduler.instances


def render(fleet: Fleet) -> list[K8sObject]:
    ns = fleet.spec.kubernetes.namespace
    lab = labels(COMPONENT, NAME)
    selector = {LABEL_NAME: NAME}
    args = cluster_router(fleet)
    http_port, metrics_port = args.port, args.metrics_port
    ports = [
        {"name": HTTP_PORT_NAME, "port": http_port, "targetPort": HTTP_PORT_NAME, "protocol": "TCP"},
        {"name": METRICS_PORT_NAME, "port": metrics_port, "targetPort": METRICS_PORT_NAME, "protocol": "TCP"},
    ]
    probe = {
        "periodSeconds": max(1, round(fleet.spec.serving.heartbeat_interval_s)),
        "timeoutSeconds": max(1, round(fleet.spec.serving.health_check_timeout_s)),
        "failureThreshold": fleet.spec.serving.failure_threshold,
    }
    container: K8sObject = {
        "name": "router",
        "image": image(fleet.spec, fleet.spec.kubernetes.router_image),
        "command": args.to_argv(),
        "ports": [
            {"name": HTTP_PORT_NAME, "containerPort": http_port, "protocol": "TCP"},
            {"name": METRICS_PORT_NAME, "containerPort": metrics_port, "protocol": "TCP"},
        ],
        # /liveness answers while the process serves; /readiness only once a healthy worker is known.
        "livenessProbe": {"httpGet": {"path": LIVENESS_PATH, "port": HTTP_PORT_NAME}, **probe},
        "readinessProbe": {"httpGet": {"path": "/readiness", "port": HTTP_PORT_NAME}, **probe},
        "resources": {"requests": ROUTER_REQUESTS.quantities(), "limits": {"memory": "4Gi"}},
        # The kubelet's own sleep (PodLifecycleSleepAction, on by default since 1.30): no shell in the image needed.
        "lifecycle": {"preStop": {"sleep": {"seconds": drain_before_stop_s(fleet.spec)}}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "runAsGroup": 65532,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    return [
        *service_account_with_role(NAME, f"{NAME}-discovery", ns, lab, DISCOVERY_RULES),
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            # `pulumi up` does not wait for the router: it turns Ready only once a worker is healthy, and workers wait
            # for their node's cache and load for minutes (docs/infra.md, "What up waits for").
            "metadata": metadata(NAME, ns, lab, await_annotations(skip=True)),
            "spec": {
                "replicas": router_replicas(fleet.spec),
                "selector": {"matchLabels": selector},
                # One router per node (required anti-affinity): a surge pod would need a node beyond the replicas',
                # so replace one at a time instead; the PodDisruptionBudget allows the same one.
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
                "template": {
                    "metadata": {"labels": lab},
                    "spec": {
                        "serviceAccountName": NAME,
                        "enableServiceLinks": False,
                        # The kubelet's SIGKILL comes after the preStop and the router's own drain, not at the
                        # default 30 s.
                        "terminationGracePeriodSeconds": termination_grace_s(fleet.spec),
                        **pull_secrets(fleet.spec),
                        **on_system_pool(fleet.spec),
                        "affinity": {
                            "podAntiAffinity": {
                                "requiredDuringSchedulingIgnoredDuringExecution": [
                                    {"labelSelector": {"matchLabels": selector}, "topologyKey": HOSTNAME_LABEL}
                                ]
                            }
                        },
                        "containers": [container],
                    },
                },
            },
        },
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": metadata(NAME, ns, lab),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector}},
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            # Not awaited either: `up` would wait for a Ready router behind it (pulumi-kubernetes
            # provider/pkg/await/service.go:404, shouldWaitForPods), i.e. for the fleet to load.
            "metadata": metadata(NAME, ns, lab, await_annotations(skip=True)),
            "spec": {"type": "ClusterIP", "selector": selector, "ports": ports},
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            # its own name label: the router's ServiceMonitor selects the ClusterIP Service, not this one too (each
            # router would be scraped twice, every sum of router series doubled)
            "metadata": metadata(PODS_SERVICE, ns, labels(COMPONENT, PODS_SERVICE)),
            "spec": {"clusterIP": "None", "selector": selector, "ports": ports},
        },
    ]
