"""The gateway (smg 1.13, the SGLang router's successor): its command line, environment, policy and latency buckets.

Every spec → flag decision lives in :data:`ROUTER_FLAGS`; the command line is checked against the
pinned router parser's manifest (:mod:`serving.flags`). See ``docs/units.md`` for the policy choice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from serving.flags import FlagManifest, load_router_manifest
from serving.plan.model import Fleet, Plan
from serving.render.common import FlagRule, check_entry, duration_buckets, render_flags, whole_seconds
from serving.render.k8s.common import LABEL_ADMITTED
from serving.render.k8s.container import LWS_LEADER_LABEL, SERVER_POD_LABELS
from serving.sglang_health import HEALTH_PATH
from serving.spec.schema import FleetSpec, LogLevel

# The gateway's Python launcher; its parser (smg.router_args.RouterArgs.add_cli_args) is the one the manifest pins.
ROUTER_ENTRY: Final = ("python3", "-m", "smg.launch_router")


# Router listeners without a spec field (a sandbox stack uses its own ports, see router_args).
ROUTER_PORT: Final = 30000  # the router's own default


ROUTER_METRICS_PORT: Final = 29000  # the router's own Prometheus default


_ROUTER_LOG_LEVEL: Final[Mapping[LogLevel, str]] = {
    LogLevel.DEBUG: "debug",
    LogLevel.INFO: "info",
    LogLevel.WARNING: "warn",
    LogLevel.ERROR: "error",
}


def router_policy(spec: FleetSpec) -> str:
    """The router policy for ``scheduler.strategy``.

    The router has no weighted round robin. The source weights nodes by load (GPU 0.5, memory 0.3,
    network 0.2); the router's load-aware policy is ``power_of_two``: pick two workers at random and
    send the request to the less loaded one. ``cache_aware`` also balances load, but only once the
    imbalance passes its thresholds — prefix affinity comes first; choose it explicitly when
    requests share long prompts.
    """
    strategy = spec.scheduler.strategy
    return "power_of_two" if strategy == "weighted_round_robin" else strategy


@dataclass(frozen=True)
class RouterArgs:
    """One router's settings as a value (SGLang's own ``RouterArgs``): its listeners, the workers it starts with and
    its discovery; every other flag follows the spec through :data:`ROUTER_FLAGS`. :meth:`to_argv` renders the
    command line, checked against the pinned router parser."""

    spec: FleetSpec
    host: str
    port: int
    metrics_host: str
    metrics_port: int
    worker_urls: tuple[str, ...]
    kubernetes: bool
    selector: tuple[str, ...]
    job_queue_capacity: int
    job_queue_concurrency: int
    request_timeout_s: int

    def to_argv(self) -> list[str]:
        """The router's command line (entry point included); raises FlagValidationError when the pinned router
        parser would not take it."""
        argv = [*ROUTER_ENTRY, *render_flags(ROUTER_FLAGS, self)]
        check_router_argv(argv)
        return argv


def _interval(c: RouterArgs) -> int:
    return whole_seconds(c.spec.serving.heartbeat_interval_s)


def detection_window_s(spec: FleetSpec) -> int:
    """serving.failure_threshold × the heartbeat, in the whole seconds the routers take: ``--cb-window-duration-secs``,
    and the bound of a warm-up request (a short one: :class:`serving.rollout.plan.Timings`)."""
    return spec.serving.failure_threshold * whole_seconds(spec.serving.heartbeat_interval_s)


def request_timeout_s(plan: Plan) -> int:
    """The routers' ``--request-timeout-secs``: the longest generation the spec allows, as the plan derives it
    (:func:`serving.plan.planner.request_timeout`, shown by ``exaserve plan``)."""
    return int(plan.heartbeats.request_timeout_s.value)


def job_queue_capacity(plan: Plan) -> int:
    """``--job-queue-capacity``: every replica's add and its removal pending at once (a full rollout's worth of
    membership jobs, or a discovery reconcile that enqueues every worker); smg's default, 1,000, blocks a 2,048-worker
    fleet's registration."""
    return 2 * len(plan.replicas)


def job_queue_concurrency(spec: FleetSpec, plan: Plan) -> int:
    """``--job-queue-concurrency``: one rollout batch's replicas registered at once, ⌈replicas / rollout.batches⌉."""
    return math.ceil(len(plan.replicas) / spec.rollout.batches)


def _abs_threshold(spec: FleetSpec) -> int:
    """cache_aware also needs ``max − min > abs``: the router's 64 in-flight requests is 8 replicas' batches at
    the source's 8; the plan's 1.5 × mean over one replica's batch is (ratio − 1) × batch in-flight requests."""
    return max(1, math.ceil((spec.scheduler.migration_load_ratio - 1) * spec.limits.max_running_requests))


ROUTER_FLAGS: Final[tuple[FlagRule[RouterArgs], ...]] = (
    FlagRule("--host", f"0.0.0.0; sandbox: 127.0.0.1 (port {ROUTER_PORT}, sandbox.router_port)", lambda c: c.host),
    FlagRule("--port", f"{ROUTER_PORT}; sandbox.router_port in the sandbox", lambda c: str(c.port)),
    FlagRule(
        "--worker-urls",
        "the replicas' http://ADDRESS:PORT (first node of each), or the caller's list",
        lambda c: c.worker_urls,
    ),
    FlagRule("--policy", "scheduler.strategy (weighted_round_robin → power_of_two)", lambda c: router_policy(c.spec)),
    FlagRule(
        "--balance-rel-threshold",
        "scheduler.migration_load_ratio (cache_aware only)",
        lambda c: f"{c.spec.scheduler.migration_load_ratio:g}" if router_policy(c.spec) == "cache_aware" else None,
    ),
    FlagRule(
        "--balance-abs-threshold",
        "⌈(scheduler.migration_load_ratio − 1) × limits.max_running_requests⌉ (cache_aware only)",
        lambda c: str(_abs_threshold(c.spec)) if router_policy(c.spec) == "cache_aware" else None,
    ),
    FlagRule(
        "--worker-startup-check-interval",
        "serving.heartbeat_interval_s (a registration job's /health poll; the 30 s default adds up to 30 s per add)",
        lambda c: str(_interval(c)),
    ),
    FlagRule(
        "--worker-startup-timeout-secs",
        "serving.startup_budget_s",
        lambda c: str(whole_seconds(c.spec.serving.startup_budget_s)),
    ),
    FlagRule("--health-check-endpoint", HEALTH_PATH, lambda c: HEALTH_PATH),
    FlagRule("--health-check-interval-secs", "serving.heartbeat_interval_s", lambda c: str(_interval(c))),
    FlagRule(
        "--health-check-timeout-secs",
        "serving.health_check_timeout_s",
        lambda c: str(whole_seconds(c.spec.serving.health_check_timeout_s)),
    ),
    FlagRule(
        "--health-failure-threshold", "serving.failure_threshold", lambda c: str(c.spec.serving.failure_threshold)
    ),
    FlagRule(
        "--health-success-threshold", "serving.success_threshold", lambda c: str(c.spec.serving.success_threshold)
    ),
    FlagRule(
        "--retry-max-retries",
        "scheduler.retries (when > 0)",
        lambda c: str(c.spec.scheduler.retries) if c.spec.scheduler.retries else None,
    ),
    FlagRule("--disable-retries", "scheduler.retries = 0", lambda c: c.spec.scheduler.retries == 0),
    FlagRule(
        "--cb-failure-threshold",
        "serving.failure_threshold (consecutive failures open the breaker)",
        lambda c: str(c.spec.serving.failure_threshold),
    ),
    FlagRule(
        "--cb-success-threshold",
        "serving.success_threshold (successes close it again)",
        lambda c: str(c.spec.serving.success_threshold),
    ),
    FlagRule(
        "--cb-timeout-duration-secs",
        "serving.migration_timeout_s (open this long, then probe)",
        lambda c: str(whole_seconds(c.spec.serving.migration_timeout_s)),
    ),
    FlagRule(
        "--cb-window-duration-secs",
        "serving.failure_threshold × serving.heartbeat_interval_s",
        lambda c: str(detection_window_s(c.spec)),
    ),
    FlagRule(
        "--request-timeout-secs",
        "⌈limits.context_length ÷ limits.min_decode_tokens_per_s + limits.p99_target_s⌉: the longest generation "
        "the spec allows (smg's total upstream timeout cuts a stream at that age; default 1800 s)",
        lambda c: str(c.request_timeout_s),
    ),
    FlagRule(
        "--shutdown-grace-period-secs",
        "rollout.drain_timeout_s",
        lambda c: str(whole_seconds(c.spec.rollout.drain_timeout_s)),
    ),
    FlagRule(
        "--job-queue-capacity",
        "2 × the plan's replicas (every replica's add and removal pending at once; the default 1,000 blocks at 2,048)",
        lambda c: str(c.job_queue_capacity),
    ),
    FlagRule(
        "--job-queue-concurrency",
        "⌈the plan's replicas / rollout.batches⌉ (one batch's registrations at once)",
        lambda c: str(c.job_queue_concurrency),
    ),
    FlagRule(
        "--load-monitor-interval",
        "serving.heartbeat_interval_s (how fresh power_of_two's and overload protection's /v1/loads poll is)",
        lambda c: str(_interval(c)),
    ),
    FlagRule(
        "--disable-load-monitoring",
        "always: poll /v1/loads only where a load-aware policy or overload protection reads it",
        lambda c: True,
    ),
    FlagRule(
        "--worker-overload-waiting-requests",
        "limits.max_running_requests (a whole batch queued behind the running one: out of rotation while others are not)",
        lambda c: str(c.spec.limits.max_running_requests),
    ),
    FlagRule("--prometheus-host", "0.0.0.0; sandbox: 127.0.0.1", lambda c: c.metrics_host),
    FlagRule(
        "--prometheus-port",
        f"{ROUTER_METRICS_PORT}; sandbox.prometheus_port in the sandbox",
        lambda c: str(c.metrics_port),
    ),
    FlagRule(
        "--prometheus-duration-buckets",
        "geometric, ratio 1 + rollout.max_p99_rise / 3, 1 ms to 10 × limits.p99_target_s (resolves the P99 gate)",
        lambda c: tuple(f"{b:g}" for b in duration_buckets(c.spec)),
    ),
    FlagRule(
        "--log-level", "serving.log_level (warning → warn)", lambda c: _ROUTER_LOG_LEVEL[c.spec.serving.log_level]
    ),
    FlagRule("--service-discovery", "kubernetes mode", lambda c: c.kubernetes),
    FlagRule(
        "--selector",
        "serving pod labels (+ LWS leader index when a replica spans nodes) + exaserve.io/admitted=true",
        lambda c: c.selector if c.kubernetes else None,
    ),
    FlagRule(
        "--service-discovery-namespace",
        "kubernetes.namespace",
        lambda c: c.spec.kubernetes.namespace if c.kubernetes else None,
    ),
    FlagRule("--service-discovery-port", "serving.port", lambda c: str(c.spec.serving.port) if c.kubernetes else None),
)


def server_selector(plan: Plan) -> dict[str, str]:
    """Labels of the pods the router discovers: HTTP-serving pods only (LWS leaders for multi-node)."""
    labels = dict(SERVER_POD_LABELS)
    if plan.multi_node:
        labels[LWS_LEADER_LABEL[0]] = LWS_LEADER_LABEL[1]
    return labels


def check_router_argv(argv: Sequence[str], manifest: FlagManifest | None = None) -> None:
    """Raise FlagValidationError when the pinned router parser (or ``manifest``) would not take ``argv``."""
    check_entry(argv, ROUTER_ENTRY, manifest or load_router_manifest())


def router_args(fleet: Fleet, *, worker_urls: Sequence[str] | None = None, kubernetes: bool = False) -> RouterArgs:
    """The gateway's settings; static worker URLs (by default the plan's replicas), Kubernetes discovery, or
    both. A sandbox stack's router listens on loopback, on ``sandbox.router_port`` and ``prometheus_port``."""
    if worker_urls is None:
        worker_urls = [] if kubernetes else [r.url for r in fleet.plan.replicas]
    loopback = fleet.spec.sandbox is not None
    return RouterArgs(
        spec=fleet.spec,
        host="127.0.0.1" if loopback else "0.0.0.0",  # noqa: S104  (the gateway serves clients)
        port=fleet.spec.sandbox.router_port if fleet.spec.sandbox else ROUTER_PORT,
        metrics_host="127.0.0.1" if loopback else "0.0.0.0",  # noqa: S104  (scraped by Prometheus)
        metrics_port=fleet.spec.sandbox.prometheus_port if fleet.spec.sandbox else ROUTER_METRICS_PORT,
        worker_urls=tuple(worker_urls),
        kubernetes=kubernetes,
        selector=tuple(f"{k}={v}" for k, v in {**server_selector(fleet.plan), LABEL_ADMITTED: "true"}.items()),
        job_queue_capacity=job_queue_capacity(fleet.plan),
        job_queue_concurrency=job_queue_concurrency(fleet.spec, fleet.plan),
        request_timeout_s=request_timeout_s(fleet.plan),
    )


def router_env(spec: FleetSpec) -> dict[str, str]:
    """The router's environment: the launcher is Python, so unbuffered output like the servers."""
    del spec  # nothing in the spec changes it today; the signature matches the other renderers
    return {"PYTHONUNBUFFERED": "1"}
