"""The runtime layer on Kubernetes: the fleet controller (a Deployment of ``scheduler.instances``, leader elected on
one ``coordination.k8s.io`` Lease), the node agent (a DaemonSet on the serving pools), their alert rules and scrape.

RBAC is least privilege: the controller's Role may get and update only its own Lease (``resourceNames``); RBAC
cannot limit ``create`` by name, so creating a Lease is allowed in the namespace (the first leader creates it). To
migrate a replica it may get pods and create ``pods/eviction``: never delete a pod, so every restart it makes stays
within the group's PodDisruptionBudget (:mod:`serving.runtime.eviction`).
The agent may get and list pods in the namespace, nothing else: LeaderWorkerSet places the serving pods, not the
plan, so each agent lists the serving pods on its node (``--discover kubernetes``) and reports them by pod name
and pod URL, the URL the router's service discovery uses; the controllers take the replicas from those reports.
Agents reach every controller pod through a headless Service, the controllers reach every router pod through
another one (router membership is per instance).

The stack travels as a ConfigMap (:func:`stack_document`); controller and agent read it like ``exaserve`` does.
Migration on Kubernetes: the controllers run with ``--backend kubernetes``: a failing replica is taken out of every
router, its pod evicted (its StatefulSet or LeaderWorkerSet creates it again) and readmitted after warm-up. The
router's own discovery may re-add a pod it sees Ready; the controller removes it again while its score is low.
"""

from __future__ import annotations

from typing import Any

import yaml

from serving.plan.model import Fleet
from serving.render.k8s import gateway
from serving.render.k8s.common import (
    LABEL_NAME,
    ROUTER_APP,
    SERVING_APP,
    K8sObject,
    Requests,
    alert,
    await_annotations,
    duration,
    gpu_node_affinity,
    image,
    labels,
    metadata,
    on_system_pool,
    pull_secrets,
    service_account_with_role,
    serving_toleration,
)
from serving.render.k8s.netpol import NAMESPACE_NAME_LABEL
from serving.render.k8s.updater import leader_pods
from serving.spec.schema import MODEL_PATH_FIELDS, FleetSpec

COMPONENT = "runtime"
CONTROLLER = "exaserve-controller"
AGENT = "exaserve-agent"
RULE_NAME = "exaserve-runtime-alerts"
STACK_CONFIGMAP = "exaserve-runtime-stack"
STACK_DIR = "/etc/exaserve"
STACK_FILE = "Pulumi.runtime.yaml"
HTTP_PORT_NAME = "http"
EXASERVE = "exaserve"
RUNTIME_UID = 65532
CONTROLLER_READY_S = 300
# What one controller asks of a system-pool node (the pool's size is derived from it: serving.render.k8s.system).
CONTROLLER_REQUESTS = Requests(millicpu=500, memory_mib=256)

# Recording the controllers' own series: every instance exports them, the leader's are the ones that act.
LEADERS = "sum(exaserve_runtime_leader)"


def stack_document(spec: FleetSpec) -> str:
    """The spec as a stack file the runtime's ``--stack-file`` loads (the model's architecture and checkpoint weights
    inlined, so the ``hf_config`` and ``checkpoint`` files the stack names on the workstation are not needed in the
    pod)."""
    doc: dict[str, Any] = spec.model_dump(mode="json", exclude_none=True)
    for key in MODEL_PATH_FIELDS:
        doc["model"].pop(key, None)
    return yaml.safe_dump({"config": {f"exaserve:{k}": v for k, v in doc.items()}}, sort_keys=False)


def _security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": RUNTIME_UID,
        "runAsGroup": RUNTIME_UID,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _stack_volume() -> tuple[dict[str, Any], dict[str, Any]]:
    return (
        {"name": "stack", "configMap": {"name": STACK_CONFIGMAP}},
        {"name": "stack", "mountPath": STACK_DIR, "readOnly": True},
    )


def _policy(spec: FleetSpec, name: str, pod_selector: dict[str, str], ingress: list[dict[str, Any]]) -> K8sObject:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(name, spec.kubernetes.namespace, labels(COMPONENT, name)),
        "spec": {"podSelector": {"matchLabels": pod_selector}, "policyTypes": ["Ingress"], "ingress": ingress},
    }


CONTROLLER_ROLE = f"{CONTROLLER}-runtime"  # its Lease, and evicting serving pods


def _svc(ns: str) -> str:
    return f"{ns}.svc"


def controller_command(fleet: Fleet) -> list[str]:
    ns = fleet.spec.kubernetes.namespace
    http_port = gateway.cluster_router(fleet).port
    return [
        EXASERVE,
        "controller",
        "run",
        "--stack-file",
        f"{STACK_DIR}/{STACK_FILE}",
        "--name",
        "$(POD_NAME)",
        "--host",
        "0.0.0.0",  # noqa: S104 - agents in other pods report here
        "--port",
        str(fleet.spec.runtime.controller_port),
        "--election",
        "kubernetes",
        "--backend",
        "kubernetes",
        "--router-service",
        f"{gateway.PODS_SERVICE}.{_svc(ns)}:{http_port}",
        "--discover",
        "kubernetes",
    ]


def agent_command(spec: FleetSpec) -> list[str]:
    ns = spec.kubernetes.namespace
    return [
        EXASERVE,
        "agent",
        "run",
        "--stack-file",
        f"{STACK_DIR}/{STACK_FILE}",
        "--node",
        "$(NODE_NAME)",
        "--controller-service",
        f"{CONTROLLER}.{_svc(ns)}:{spec.runtime.controller_port}",
        "--discover",
        "kubernetes",
    ]


def rule_groups(spec: FleetSpec) -> list[dict[str, Any]]:
    lease = duration(2 * spec.runtime.lease_ttl_s)
    refusal_window = duration(2 * spec.runtime.restart_backoff_max_s)
    detect = duration(spec.serving.failure_threshold * spec.serving.heartbeat_interval_s)
    return [
        {
            "name": "exaserve.runtime",
            "rules": [
                alert(
                    "ExaServeNoControllerLeader",
                    # absent(): with no controller scraped at all (none running, image never pulled) the sum is an
                    # empty vector, which compares to nothing (issue 25).
                    f"{LEADERS} < 1 or absent(exaserve_runtime_leader)",
                    lease,
                    "critical",
                    "No fleet controller leads: failing replicas are not taken out of rotation",
                    "Check the controller pods and the Lease runtime.lease_name (kubectl get lease).",
                ),
                alert(
                    "ExaServeControllerSplitBrain",
                    f"{LEADERS} > 1",
                    lease,
                    "critical",
                    "More than one controller believes it leads",
                    "Fencing should prevent this: check the controllers' clocks and the coordination service.",
                ),
                alert(
                    "ExaServeNodeSuspect",
                    "max by (node) (exaserve_runtime_node_suspect) == 1",
                    detect,
                    "warning",
                    "A node agent stopped reporting; its replicas are left to the router's own checks",
                    "Check the exaserve-agent pod on that node (kubectl logs).",
                ),
                alert(
                    "ExaServeNodeHealthLow",
                    f"min by (node) (exaserve_runtime_node_score) < {spec.health.stop_routing_below}",
                    "1m",
                    "warning",
                    "A node's health score is below the no-new-requests line: most of its replicas fail probes",
                    "Check the node's network and GPUs; its replicas are out of rotation until it recovers.",
                ),
                alert(
                    # the leader's view (followers apply the same reports but do not act); for: the detection window
                    "ExaServeReplicaOutOfRotation",
                    "max by (replica) (exaserve_runtime_replica_in_rotation * on (instance) group_left () "
                    "(exaserve_runtime_leader == 1)) == 0",
                    detect,
                    "warning",
                    "The controller took a replica out of rotation (failing probes) or is migrating or warming it up",
                    "See its score and the leader's actions (exaserve status); if it stays out, check the replica's "
                    "log and its node.",
                ),
                alert(
                    # the leader's view: only the leader restarts, so only its count of restarts is real
                    "ExaServeReplicaQuarantined",
                    "max by (replica) (exaserve_runtime_replica_quarantined * on (instance) group_left () "
                    "(exaserve_runtime_leader == 1)) == 1",
                    "0m",
                    "critical",
                    "A replica restarted runtime.quarantine_after times within runtime.quarantine_window_s (or whose "
                    "generations a restart did not fix) is out of rotation: the controller stopped restarting it",
                    "Check the replica's log and its node (exaserve status shows its restarts); it returns to rotation "
                    "by itself once it passes a warm-up, and is restarted again only after serving a whole window.",
                ),
                alert(
                    # the leader's view: followers compute the same racks but only the leader withholds restarts
                    "ExaServeRackDisrupted",
                    "max by (rack) (exaserve_runtime_rack_disrupted * on (instance) group_left () "
                    "(exaserve_runtime_leader == 1)) == 1",
                    "0m",
                    "critical",
                    "Most of a rack's nodes are unhealthy at once (a leaf switch, power, a reboot wave): the "
                    "controller restarts nothing there and takes its replicas out of rotation within the cap",
                    "Check the rack's leaf switch, PDU and the nodes' boot times (exaserve status: disrupted_racks); "
                    "restarts resume by themselves once fewer than runtime.disrupted_share of its nodes are unhealthy.",
                ),
                alert(
                    "ExaServeNodeClockSkew",
                    f"max by (node) (abs(exaserve_runtime_node_clock_skew_seconds)) > {spec.runtime.clock_skew_alert_s:g}",
                    "5m",
                    "warning",
                    "A node's clock is off from the controller's by more than runtime.clock_skew_alert_s; its reports "
                    "are still applied (freshness is judged on the controller's monotonic clock)",
                    "Check chrony on that node (chronyc tracking); logs and traces from it carry the wrong time.",
                ),
                alert(
                    "ExaServeRouterUnsynced",
                    "max by (router) (exaserve_runtime_router_unsynced * on (instance) group_left () "
                    "(exaserve_runtime_leader == 1)) == 1",
                    detect,
                    "warning",
                    "A router instance missed the controller's membership changes: it may route to replicas the "
                    "controller took out",
                    "Check that router instance (ExaServeRouterInstanceDown); the leader reconciles its worker list "
                    "as soon as it answers.",
                ),
                alert(
                    "ExaServeEvictionCapReached",
                    "max(exaserve_runtime_evicted_replicas) >= max(exaserve_runtime_eviction_cap)",
                    "5m",
                    "critical",
                    "The eviction cap is reached: further failing replicas stay in rotation",
                    "Find why so many replicas fail (exaserve status); raise runtime.max_eviction_share only knowingly.",
                ),
                alert(
                    "ExaServeReportsRejected",
                    "sum(rate(exaserve_runtime_reports_rejected_total[5m])) > 0",
                    "10m",
                    "warning",
                    "Controllers reject agent reports (malformed, unknown node or replica, replayed)",
                    "See the reason label: a replayed reason points at a duplicated agent (two agents for one node).",
                ),
                alert(
                    # A refused restart is asked again after the back-off, at most runtime.restart_backoff_max_s
                    # later: refusals inside every window of twice that mean the group's budget stays spent (missing
                    # pods, a drain or a rollout holding it). One refusal keeps the expression true for one window,
                    # shorter than the 'for': it never fires.
                    "ExaServeRestartsRefused",
                    f"sum(increase(exaserve_runtime_restarts_refused_total[{refusal_window}])) > 0",
                    duration(2 * spec.runtime.restart_backoff_max_s + 300),
                    "warning",
                    "The controller cannot restart a failing replica: its group's PodDisruptionBudget allows no "
                    "eviction",
                    "kubectl get pdb and kubectl get pods -l app.kubernetes.io/name=sglang: find the group's pods that "
                    "are not Ready (Pending, loading, on a drained node); the replica stays out of rotation meanwhile.",
                ),
                alert(
                    "ExaServeRuntimeActionsFailing",
                    "sum by (kind) (increase(exaserve_runtime_action_failures_total[15m])) > 0",
                    "0m",
                    "warning",
                    "The controller's removals, migrations or warm-ups fail",
                    "See the controller's log and `exaserve status`: a warm-up failing its error or latency gate "
                    "keeps the replica out.",
                ),
            ],
        }
    ]


def render(fleet: Fleet) -> list[K8sObject]:
    ns = fleet.spec.kubernetes.namespace
    rt = fleet.spec.runtime
    serving_pods = leader_pods(fleet.plan)  # each replica's pod (a LeaderWorkerSet's leader): what a migration evicts
    selected = fleet.spec.kubernetes.prometheus_selector_labels
    c_lab, a_lab = labels(COMPONENT, CONTROLLER), labels(COMPONENT, AGENT)
    c_sel, a_sel = {LABEL_NAME: CONTROLLER}, {LABEL_NAME: AGENT}
    volume, mount = _stack_volume()
    monitoring = {
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: fleet.spec.kubernetes.monitoring_namespace}}
    }
    controller_port = [{"protocol": "TCP", "port": rt.controller_port}]
    probe = {
        "httpGet": {"path": "/v1/status", "port": HTTP_PORT_NAME},
        "periodSeconds": max(1, round(fleet.spec.serving.heartbeat_interval_s)),
        "timeoutSeconds": max(1, round(fleet.spec.serving.health_check_timeout_s)),
        "failureThreshold": fleet.spec.serving.failure_threshold,
    }
    controller: K8sObject = {
        "name": "controller",
        "image": image(fleet.spec, rt.image),
        "command": controller_command(fleet),
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "ports": [{"name": HTTP_PORT_NAME, "containerPort": rt.controller_port, "protocol": "TCP"}],
        "livenessProbe": probe,
        "readinessProbe": probe,
        "resources": {"requests": CONTROLLER_REQUESTS.quantities(), "limits": {"memory": "1Gi"}},
        "securityContext": _security(),
        "volumeMounts": [mount],
    }
    agent: K8sObject = {
        "name": "agent",
        "image": image(fleet.spec, rt.image),
        "command": agent_command(fleet.spec),
        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": _security(),
        "volumeMounts": [mount],
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata(STACK_CONFIGMAP, ns, labels(COMPONENT, STACK_CONFIGMAP)),
            "data": {STACK_FILE: stack_document(fleet.spec)},
        },
        *service_account_with_role(
            CONTROLLER,
            CONTROLLER_ROLE,
            ns,
            c_lab,
            [
                {
                    "apiGroups": ["coordination.k8s.io"],
                    "resources": ["leases"],
                    "resourceNames": [rt.lease_name],
                    "verbs": ["get", "update"],
                },
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
                # a migration evicts the replica's pod (within its disruption budget) and watches it come back:
                # the serving pods by name (the eviction's name is in its URL, so RBAC can name it), none other
                {"apiGroups": [""], "resources": ["pods"], "resourceNames": serving_pods, "verbs": ["get"]},
                {"apiGroups": [""], "resources": ["pods/eviction"], "resourceNames": serving_pods, "verbs": ["create"]},
            ],
        ),
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            # ready as soon as it serves /v1/status (it needs no model): a bounded wait
            "metadata": metadata(CONTROLLER, ns, c_lab, await_annotations(timeout_s=CONTROLLER_READY_S)),
            "spec": {
                "replicas": fleet.spec.scheduler.instances,
                "selector": {"matchLabels": c_sel},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
                "template": {
                    "metadata": {"labels": c_lab},
                    "spec": {
                        "serviceAccountName": CONTROLLER,
                        "enableServiceLinks": False,
                        **pull_secrets(fleet.spec),
                        **on_system_pool(fleet.spec),
                        "affinity": {
                            "podAntiAffinity": {
                                "preferredDuringSchedulingIgnoredDuringExecution": [
                                    {
                                        "weight": 100,
                                        "podAffinityTerm": {
                                            "labelSelector": {"matchLabels": c_sel},
                                            "topologyKey": "kubernetes.io/hostname",
                                        },
                                    }
                                ]
                            }
                        },
                        "containers": [controller],
                        "volumes": [volume],
                    },
                },
            },
        },
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": metadata(CONTROLLER, ns, c_lab),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": c_sel}},
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": metadata(CONTROLLER, ns, c_lab),
            "spec": {
                "clusterIP": "None",
                "selector": c_sel,
                "ports": [{"name": HTTP_PORT_NAME, "port": rt.controller_port, "targetPort": HTTP_PORT_NAME}],
            },
        },
        *service_account_with_role(
            AGENT, f"{AGENT}-pods", ns, a_lab, [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]
        ),
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            # one pod per serving node: `pulumi up` does not wait for the last node's image pull
            "metadata": metadata(AGENT, ns, a_lab, await_annotations(skip=True)),
            "spec": {
                "selector": {"matchLabels": a_sel},
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
                "template": {
                    "metadata": {"labels": a_lab},
                    "spec": {
                        "serviceAccountName": AGENT,
                        "enableServiceLinks": False,
                        **pull_secrets(fleet.spec),
                        "affinity": gpu_node_affinity(fleet.spec),
                        "tolerations": [serving_toleration()],
                        "containers": [agent],
                        "volumes": [volume],
                    },
                },
            },
        },
        # ingress on top of the namespace's default deny (serving.render.k8s.netpol): policies add up
        _policy(
            fleet.spec,
            CONTROLLER,
            c_sel,
            [{"from": [{"podSelector": {"matchLabels": a_sel}}, monitoring], "ports": controller_port}],
        ),
        _policy(
            fleet.spec,
            f"{SERVING_APP}-runtime-probes",
            {LABEL_NAME: SERVING_APP},
            [
                {
                    "from": [{"podSelector": {"matchLabels": a_sel}}, {"podSelector": {"matchLabels": c_sel}}],
                    "ports": [{"protocol": "TCP", "port": fleet.spec.serving.port}],
                }
            ],
        ),
        _policy(  # the leader reads each router's circuit breakers (smg_worker_cb_state): requests failing
            fleet.spec,
            f"{ROUTER_APP}-controller-metrics",
            {LABEL_NAME: ROUTER_APP},
            [
                {
                    "from": [{"podSelector": {"matchLabels": c_sel}}],
                    "ports": [{"protocol": "TCP", "port": gateway.cluster_router(fleet).metrics_port}],
                }
            ],
        ),
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": metadata(RULE_NAME, ns, labels(COMPONENT, RULE_NAME, **selected)),
            "spec": {"groups": rule_groups(fleet.spec)},
        },
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": metadata(CONTROLLER, ns, labels(COMPONENT, CONTROLLER, **selected)),
            "spec": {
                "selector": {"matchLabels": c_sel},
                "namespaceSelector": {"matchNames": [ns]},
                "endpoints": [{"port": HTTP_PORT_NAME, "path": "/metrics", "interval": "15s"}],
            },
        },
    ]
