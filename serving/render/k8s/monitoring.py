"""Monitoring: a PrometheusRule with the rollout gates and the source's alert conditions, and ServiceMonitors for
the router and the workers (prometheus-operator custom resources).

Metric sources: the SGLang router (``smg_*``, client-facing responses and latency, worker health), DCGM
exporter (``DCGM_FI_DEV_GPU_UTIL``), node exporter's timex collector (``node_timex_offset_seconds``) and
kube-state-metrics (container restarts). Thresholds come from the spec; the GPU-imbalance band (> 90 % on
some nodes while others sit < 30 %) is the source's own observation (§5.2).
"""

from __future__ import annotations

from typing import Any

from serving.render.k8s import fleet, gateway
from serving.render.k8s.common import LABEL_NAME, ROUTER_APP, SERVING_APP, K8sObject, duration, labels, metadata
from serving.spec.schema import FleetSpec

COMPONENT = "monitoring"
RULE_NAME = "exaserve-alerts"
RATE_WINDOW = "5m"
GPU_BUSY_PCT = 90
GPU_IDLE_PCT = 30
RESTARTS_PER_HOUR = 3
SCRAPE_INTERVAL = "15s"


def _alert(name: str, expr: str, for_: str, severity: str, summary: str, fix: str) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity},
        "annotations": {"summary": summary, "fix": fix},
    }


def rule_groups(spec: FleetSpec) -> list[dict[str, Any]]:
    ns, r, lim = spec.kubernetes.namespace, spec.rollout, spec.limits
    router = f'namespace="{ns}",service="{ROUTER_APP}"'
    ok = f'sum(rate(smg_http_responses_total{{{router},status_code=~"2.."}}[{RATE_WINDOW}]))'
    total = f"sum(rate(smg_http_responses_total{{{router}}}[{RATE_WINDOW}]))"
    errors = f'sum(rate(smg_http_responses_total{{{router},status_code=~"5.."}}[{RATE_WINDOW}]))'
    p99 = f"histogram_quantile(0.99, sum by (le) (rate(smg_http_request_duration_seconds_bucket{{{router}}}[{RATE_WINDOW}])))"
    # Gates compare with the traffic before the rollout started: one whole rollout (all batches) ago.
    baseline = duration(max(r.batches * r.interval_s, r.baseline_window_s))
    soak = duration(max(r.interval_s, 60))
    offset_limit = spec.cluster.ntp.max_offset_ms / 1000
    serving_container = fleet.SERVING_CONTAINER
    return [
        {
            "name": "exaserve.rollout-gates",
            "rules": [
                _alert(
                    "ExaServeRolloutQpsDrop",
                    f"{ok} < {1 - r.max_qps_drop:g} * ({ok} offset {baseline})",
                    soak,
                    "critical",
                    f"Successful QPS fell more than {r.max_qps_drop:.0%} below the pre-rollout baseline.",
                    "Pause the rollout and roll back: exaserve rollback --stack STACK.",
                ),
                _alert(
                    "ExaServeRolloutP99Rise",
                    f"{p99} > {1 + r.max_p99_rise:g} * ({p99} offset {baseline})",
                    soak,
                    "critical",
                    f"P99 latency rose more than {r.max_p99_rise:.0%} above the pre-rollout baseline.",
                    "Pause the rollout and roll back: exaserve rollback --stack STACK.",
                ),
                _alert(
                    "ExaServeErrorRate",
                    f"{errors} / {total} > {r.max_error_rate:g}",
                    "2m",
                    "critical",
                    f"Client-facing error rate above {r.max_error_rate:.2%}.",
                    "Check the newest update group first (exaserve.io/version label); roll back if it is the cause.",
                ),
            ],
        },
        {
            "name": "exaserve.serving",
            "rules": [
                _alert(
                    "ExaServeP99LatencyHigh",
                    f"{p99} > {lim.p99_target_s:g}",
                    "10m",
                    "warning",
                    f"P99 latency above the {lim.p99_target_s:g} s target.",
                    "Check queue depth (sglang:num_queue_reqs) and GPU imbalance; add replicas or shed load.",
                ),
                _alert(
                    "ExaServeGpuUtilisationImbalance",
                    f"max(avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)) > {GPU_BUSY_PCT} "
                    f"and min(avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)) < {GPU_IDLE_PCT}",
                    "15m",
                    "warning",
                    f"Some nodes run GPUs above {GPU_BUSY_PCT} % while others sit below {GPU_IDLE_PCT} %.",
                    "Spread long- and short-sequence traffic across nodes; check the router policy and worker health.",
                ),
                _alert(
                    "ExaServeReplicaRestarts",
                    f'increase(kube_pod_container_status_restarts_total{{namespace="{ns}",container="{serving_container}"}}[1h]) '
                    f"> {RESTARTS_PER_HOUR}",
                    "0m",
                    "warning",
                    f"A serving replica restarted more than {RESTARTS_PER_HOUR} times in an hour.",
                    "Check its logs for 'CUDA out of memory', then the health-check timeout (≥ 3 s), "
                    "then the model store.",
                ),
                _alert(
                    "ExaServeWorkersUnhealthy",
                    f"count(smg_worker_health{{{router}}} == 0) > {lim.failure_reserve:g} * count(smg_worker_health{{{router}}})",
                    "5m",
                    "critical",
                    f"More workers are unhealthy than the {lim.failure_reserve:.0%} failure reserve covers.",
                    "Find the failing nodes (exaserve.io/rack labels) and drain them; run the preflight playbook.",
                ),
            ],
        },
        {
            "name": "exaserve.nodes",
            "rules": [
                _alert(
                    "ExaServeClockOffset",
                    f"abs(node_timex_offset_seconds) > {offset_limit:g}",
                    "5m",
                    "warning",
                    f"A node's clock is more than {spec.cluster.ntp.max_offset_ms:g} ms off.",
                    "Check the chrony pod on that node (chronyc tracking) and its NTP servers.",
                ),
            ],
        },
    ]


def render(spec: FleetSpec) -> list[K8sObject]:
    ns = spec.kubernetes.namespace
    monitors: list[tuple[str, str, str]] = [
        (ROUTER_APP, ROUTER_APP, gateway.METRICS_PORT_NAME),
        (fleet.WORKERS_SERVICE, SERVING_APP, fleet.HTTP_PORT_NAME),
    ]
    objects: list[K8sObject] = [
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": metadata(RULE_NAME, ns, labels(COMPONENT, RULE_NAME)),
            "spec": {"groups": rule_groups(spec)},
        }
    ]
    objects += [
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": metadata(name, ns, labels(COMPONENT, name)),
            "spec": {
                "selector": {"matchLabels": {LABEL_NAME: app}},
                "namespaceSelector": {"matchNames": [ns]},
                "endpoints": [{"port": port, "path": "/metrics", "interval": SCRAPE_INTERVAL}],
            },
        }
        for name, app, port in monitors
    ]
    return objects
