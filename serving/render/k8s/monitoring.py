"""Monitoring: a PrometheusRule with the rollout gates and the source's alert conditions, a ServiceMonitor for the
router and a PodMonitor for the workers (prometheus-operator custom resources), labelled so the cluster's Prometheus
selects them (``kubernetes.prometheus_selector_labels``; kube-prometheus-stack selects its Helm ``release``).

Workers are found as pods, not through a Service: a ServiceMonitor is discovered through the Service's Endpoints
unless the Prometheus sets ``serviceDiscoveryRole: EndpointSlice`` (kube-prometheus-stack leaves it unset), and the
endpoints controller truncates an Endpoints object at 1,000 addresses (kubernetes
``pkg/controller/endpoint/endpoints_controller.go``, ``maxCapacity``), so half of prod's 2,048 workers went unscraped.
A PodMonitor uses the ``pod`` role, one target per selected pod, with no such cap (docs/k8s-semantics.md).

Metric sources: the SGLang router (``smg_*``: requests and latency per path, client-facing responses, worker
health), DCGM exporter (``DCGM_FI_DEV_GPU_UTIL``), node exporter's timex collector (``node_timex_offset_seconds``,
``node_timex_sync_status``: the hosts' chronyd keeps time, the cluster only observes it) and kube-state-metrics
(container restarts, the images the serving containers run). Thresholds come from the spec and the plan; the
GPU-imbalance band (> 90 % on some nodes while others sit < 30 %) is the source's own observation (§5.2).

Request rate and latency count the inference paths only (:data:`INFERENCE_PATHS`): the kubelet's probes of the
router (``/liveness``, ``/readiness``) and scrapes would otherwise dilute both. ``exaserve render`` runs
``promtool check rules`` on the rules; tests/promtool/ holds a ``promtool test rules`` file per group.
"""

from __future__ import annotations

import math
from typing import Any

from serving.plan.model import Fleet
from serving.render.k8s import gateway
from serving.render.k8s.common import LABEL_NAME, ROUTER_APP, SERVING_APP, K8sObject, alert, duration, labels, metadata
from serving.render.k8s.container import LWS_LEADER_LABEL
from serving.render.k8s.fleet import HTTP_PORT_NAME, SERVING_CONTAINER, WORKERS_SERVICE
from serving.rollout.backends.kubernetes import ANNOUNCE_TTL_S, batch_lease_name
from serving.router import INFERENCE_PATHS

COMPONENT = "monitoring"
RULE_NAME = "exaserve-alerts"
WORKERS_MONITOR = WORKERS_SERVICE  # the PodMonitor of the serving pods
RATE_WINDOW = "5m"
GPU_BUSY_PCT = 90
GPU_IDLE_PCT = 30
RESTARTS_PER_HOUR = 3
SCRAPE_INTERVAL = "15s"


def min_healthy_workers(fleet: Fleet) -> int:
    """Healthy workers below which the failure reserve is used up: the plan's replicas less the reserve."""
    return math.ceil(sum(fleet.plan.rollout_group_sizes) * (1 - fleet.spec.limits.failure_reserve))


def rule_groups(fleet: Fleet) -> list[dict[str, Any]]:
    ns, r, lim = fleet.spec.kubernetes.namespace, fleet.spec.rollout, fleet.spec.limits
    router = f'namespace="{ns}",service="{ROUTER_APP}"'
    paths = "|".join(INFERENCE_PATHS)
    inference = f'{router},path=~"{paths}"'

    def requests(offset: str = "") -> str:
        return f"sum(rate(smg_http_requests_total{{{inference}}}[{RATE_WINDOW}]{offset}))"

    def p99(offset: str = "") -> str:
        buckets = f"smg_http_request_duration_seconds_bucket{{{inference}}}[{RATE_WINDOW}]{offset}"
        return f"histogram_quantile(0.99, sum by (le) (rate({buckets})))"

    # A client got no answer: a 5xx, 408 or 429 on a generation route (serving.rollout.gates.window's client errors).
    # A stream smg cut mid-body is not among them: it ends it with an error event and [DONE], a 200 with no error code
    # in its metrics; the worker's breaker counts the failure. A refusal: a worker's 4xx passed through (no smg error
    # code; smg's own 4xx carry one) but 408 and 429, which smg counts as the worker's success.
    answered = f"smg_http_responses_total{{{inference}"
    errors = f'sum(rate({answered},status_code=~"5..|408|429"}}[{RATE_WINDOW}]))'

    def refused(offset: str = "") -> str:
        return f'sum(rate({answered},status_code=~"4..",status_code!~"408|429|499",error_code=""}}[{RATE_WINDOW}]{offset}))'

    # Gates compare with the traffic before the rollout started: one whole rollout (all batches) ago; they apply
    # only while a rollout is under way (the serving containers run more than one image), so an ordinary dip in
    # client traffic does not page anyone.
    baseline = f" offset {duration(max(r.batches * r.interval_s, r.baseline_window_s))}"
    rolling = (
        f'count(count by (image) (kube_pod_container_info{{namespace="{ns}",container="{SERVING_CONTAINER}"}})) > 1'
    )
    soak = duration(max(r.interval_s, 60))
    offset_limit = fleet.spec.cluster.ntp.max_offset_ms / 1000
    healthy_min = min_healthy_workers(fleet)
    batch = max(fleet.plan.rollout_group_sizes)  # the most a rollout batch takes out at once
    routers = gateway.router_replicas(fleet.spec)
    return [
        {
            "name": "exaserve.rollout-gates",
            "rules": [
                alert(
                    "ExaServeRolloutQpsDrop",
                    f"{requests()} < {1 - r.max_qps_drop:g} * {requests(baseline)} and on () ({rolling})",
                    soak,
                    "critical",
                    f"During a rollout, inference QPS fell more than {r.max_qps_drop:.0%} below the pre-rollout "
                    "baseline.",
                    "Pause the rollout and roll back: exaserve rollback --stack STACK.",
                ),
                alert(
                    "ExaServeRolloutP99Rise",
                    f"{p99()} > {1 + r.max_p99_rise:g} * {p99(baseline)} and on () ({rolling})",
                    soak,
                    "critical",
                    f"During a rollout, P99 latency rose more than {r.max_p99_rise:.0%} above the pre-rollout "
                    "baseline.",
                    "Pause the rollout and roll back: exaserve rollback --stack STACK.",
                ),
                alert(
                    "ExaServeErrorRate",
                    f"{errors} / {requests()} > {r.max_error_rate:g}",
                    "2m",
                    "critical",
                    f"Client-facing error rate above {r.max_error_rate:.2%} (5xx, 408, 429).",
                    "Check the newest update group first (exaserve.io/version label); roll back if it is the cause.",
                ),
                alert(
                    "ExaServeRolloutRefusalsRise",
                    f"{refused()} / {requests()} - (({refused(baseline)} / {requests(baseline)}) or vector(0)) "
                    f"> {r.max_error_rate:g} and on () ({rolling})",
                    soak,
                    "critical",
                    f"During a rollout, requests refused with a 4xx rose more than {r.max_error_rate:.2%} of all "
                    "requests above the pre-rollout rate (smg counts a worker's 4xx as its success).",
                    "Pause the rollout and roll back: exaserve rollback --stack STACK.",
                ),
            ],
        },
        {
            "name": "exaserve.serving",
            "rules": [
                alert(
                    "ExaServeP99LatencyHigh",
                    f"{p99()} > {lim.p99_target_s:g}",
                    "10m",
                    "warning",
                    f"P99 latency above the {lim.p99_target_s:g} s target.",
                    "Check queue depth (sglang:num_queue_reqs) and GPU imbalance; add replicas or shed load.",
                ),
                alert(
                    "ExaServeGpuUtilisationImbalance",
                    f"max(avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)) > {GPU_BUSY_PCT} "
                    f"and min(avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)) < {GPU_IDLE_PCT}",
                    "15m",
                    "warning",
                    f"Some nodes run GPUs above {GPU_BUSY_PCT} % while others sit below {GPU_IDLE_PCT} %.",
                    "Spread long- and short-sequence traffic across nodes; check the router policy and worker health.",
                ),
                alert(
                    "ExaServeReplicaRestarts",
                    f'increase(kube_pod_container_status_restarts_total{{namespace="{ns}",container="{SERVING_CONTAINER}"}}[1h]) '
                    f"> {RESTARTS_PER_HOUR}",
                    "0m",
                    "warning",
                    f"A serving replica restarted more than {RESTARTS_PER_HOUR} times in an hour.",
                    "Check its logs for 'CUDA out of memory', then the health-check timeout (≥ 3 s), "
                    "then the model store.",
                ),
                alert(
                    # Counted against the plan, not against what the router has registered: a worker that discovery
                    # never registered (Pending, stuck waiting for its cache, crash-looping) has no smg_worker_health
                    # series at all. Each router instance sees every worker; the one seeing the fewest healthy counts.
                    # The healthy series are COUNTED (== 1), never summed: a series of a removed worker may stay
                    # behind (sglang-router 0.3.2 kept -1 for every DELETEd worker; smg shows 0 while one drains), and
                    # a sum would subtract each of them: after a full rollout the replaced pods' old addresses cancel
                    # the new ones out. `== bool 1` turns each series into 1 (healthy) or 0 (anything else), so an
                    # instance whose workers are all unhealthy counts 0 rather than dropping out of the min.
                    # A rollout batch is out by plan: while the updater renews its batch Lease (kube-state-metrics'
                    # kube_lease_renew_time, fresh within twice the Lease's duration) the largest batch counts as
                    # healthy; an updater that died with a batch out stops renewing, and the page comes.
                    "ExaServeWorkersUnhealthy",
                    f"(min(sum by (pod) (smg_worker_health{{{router}}} == bool 1)) or on () vector(0)) + "
                    f'(max(time() - kube_lease_renew_time{{lease="{batch_lease_name(ns)}"}} < bool '
                    f"{2 * ANNOUNCE_TTL_S:g}) * {batch} or on () vector(0)) < {healthy_min}",
                    "5m",
                    "critical",
                    f"Fewer than {healthy_min} of the plan's {sum(fleet.plan.rollout_group_sizes)} workers are healthy "
                    f"(a rollout batch the updater announces, up to {batch}, counts as healthy): the "
                    f"{lim.failure_reserve:.0%} failure reserve is used up.",
                    "Find the missing workers (kubectl get pods -l app.kubernetes.io/name=sglang: Pending, Init, "
                    "CrashLoopBackOff) and their nodes (exaserve.io/rack labels); run the preflight playbook.",
                ),
                alert(
                    # A router pod that is gone or not Ready has no scrape target; one that hangs has up == 0. Longer
                    # than the plan's recovery time: not a restart the Deployment is already healing.
                    "ExaServeRouterInstanceDown",
                    f"(count(up{{{router}}} == 1) or on () vector(0)) < {routers}",
                    duration(fleet.plan.heartbeats.recovery_s.value),
                    "warning",
                    f"Fewer than {routers} router instances are up: clients of the lost one fail over and the fleet "
                    "has lost router redundancy.",
                    f"kubectl -n {ns} get pods -l {LABEL_NAME}={ROUTER_APP}: find the missing instance (Pending, "
                    "CrashLoopBackOff, its node), then its logs.",
                ),
            ],
        },
        {
            "name": "exaserve.nodes",
            "rules": [
                alert(
                    "ExaServeClockOffset",
                    f"abs(node_timex_offset_seconds) > {offset_limit:g}",
                    "5m",
                    "warning",
                    f"A node's clock is more than {fleet.spec.cluster.ntp.max_offset_ms:g} ms off.",
                    "On that node: chronyc tracking and chronyc sources (the host's chronyd, Ansible role ntp).",
                ),
                alert(
                    "ExaServeClockUnsynchronised",
                    "max_over_time(node_timex_sync_status[5m]) == 0",
                    "10m",
                    "warning",
                    "A node's kernel clock has not been synchronised for 10 minutes (chronyd not disciplining it).",
                    "On that node: systemctl status chrony, chronyc sources; re-run the ntp role (site.yml --tags ntp).",
                ),
            ],
        },
    ]


def render(fleet: Fleet) -> list[K8sObject]:
    ns = fleet.spec.kubernetes.namespace
    selected = fleet.spec.kubernetes.prometheus_selector_labels
    endpoint = {"path": "/metrics", "interval": SCRAPE_INTERVAL}
    objects: list[K8sObject] = [
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": metadata(RULE_NAME, ns, labels(COMPONENT, RULE_NAME, **selected)),
            "spec": {"groups": rule_groups(fleet)},
        }
    ]
    objects += [
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": metadata(ROUTER_APP, ns, labels(COMPONENT, ROUTER_APP, **selected)),
            "spec": {
                "selector": {"matchLabels": {LABEL_NAME: ROUTER_APP}},
                "namespaceSelector": {"matchNames": [ns]},
                "endpoints": [{"port": gateway.METRICS_PORT_NAME, **endpoint}],
            },
        },
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PodMonitor",
            "metadata": metadata(WORKERS_MONITOR, ns, labels(COMPONENT, WORKERS_MONITOR, **selected)),
            "spec": {
                # a multi-node group's worker pods serve no HTTP (only its leader does): scraping them would add a
                # target that is always down for each worker (issue 40)
                "selector": {
                    "matchLabels": {LABEL_NAME: SERVING_APP}
                    | (dict([LWS_LEADER_LABEL]) if fleet.plan.multi_node else {})
                },
                "namespaceSelector": {"matchNames": [ns]},
                "podMetricsEndpoints": [{"port": HTTP_PORT_NAME, **endpoint}],
            },
        },
    ]
    return objects
