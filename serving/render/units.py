"""Serving units rendered from the typed spec: the SGLang server command and environment, its systemd
unit, its Kubernetes container, the SGLang router's command and chrony.conf.

Every spec → flag decision lives in the tables below (:data:`SERVER_FLAGS`, :data:`SERVER_ENV`,
:data:`ROUTER_FLAGS`); the Jinja2 templates in ``templates/`` only loop and branch over what these
functions hand them. Every command line leaves this module checked against the pinned parser's flag
manifest (:mod:`serving.checks.flags`), so a flag the pinned SGLang or router version does not know
fails at render time, naming the flag and the version — not on a node at 3 a.m.

Pure functions: the only inputs are the spec, the replica and the committed templates and manifests.
See ``docs/units.md`` for the mapping table and the router policy choice.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Final, Generic, TypeVar

import jinja2

from serving.checks.flags import FlagManifest, check_argv, load_router_manifest, load_server_manifest
from serving.plan.planner import MemoryPlan, Replica, fleet_replicas, memory_plan, placement
from serving.spec.schema import GB, GIB, FabricKind, FleetSpec, LogLevel, Precision

TEMPLATES_DIR: Final = Path(__file__).resolve().parent / "templates"

# `sglang serve` is the entry point SGLang 0.5.23 documents (`python -m sglang.launch_server` warns
# that it is only "still supported"). The serving image and the bare-metal install both provide the
# console script at this path; systemd needs an absolute path to check that the binary exists.
SERVER_ENTRY: Final = ("/usr/local/bin/sglang", "serve")
# The router's Python launcher; its parser (RouterArgs.add_cli_args) is the one the manifest pins.
ROUTER_ENTRY: Final = ("python3", "-m", "sglang_router.launch_router")

# Router listeners without a spec field (a sandbox stack uses its own ports, see router_argv).
ROUTER_PORT: Final = 30000  # the router's own default
ROUTER_METRICS_PORT: Final = 29000  # the router's own Prometheus default
# torch.distributed rendezvous port on a multi-node replica's first node (`--dist-init-addr`).
DIST_INIT_PORT: Final = 20000
HEALTH_PATH: Final = "/health"  # SGLang's health endpoint: runs a one-token generation

# Paths shared by the systemd unit and the pod, so the command is the same in both.
SERVICE_USER: Final = "exaserve"
SERVICE_HOME: Final = "/var/lib/exaserve-sglang"  # JIT caches (triton, flashinfer) live under $HOME
CURL: Final = "/usr/bin/curl"
# Pods: labels the router's service discovery selects on; the fleet program puts them on the pods
# that serve HTTP (single-node replicas, or the leader pod of a multi-node LeaderWorkerSet group).
SERVER_POD_LABELS: Final = {"app.kubernetes.io/name": "sglang", "app.kubernetes.io/component": "server"}
LWS_LEADER_LABEL: Final = ("leaderworkerset.sigs.k8s.io/worker-index", "0")
# LeaderWorkerSet puts these in every pod of a group; the kubelet expands $(VAR) in args.
LWS_WORKER_INDEX: Final = "$(LWS_WORKER_INDEX)"
LWS_LEADER_ADDRESS: Final = "$(LWS_LEADER_ADDRESS)"
CONTAINER_NAME: Final = "sglang"
VOLUME_SHM, VOLUME_MODELS, VOLUME_HOME = "dshm", "model-cache", "sglang-home"

# systemd back-off: a fixed delay between restarts, and at most START_LIMIT_BURST starts within a
# window long enough for that many full start-ups; after that the unit stays failed and alerts.
RESTART_SEC: Final = 10
START_LIMIT_BURST: Final = 5
# journald: cap one replica's log rate; the source saw tens of MB/s from 3,072 chatty replicas.
LOG_RATE_LIMIT_INTERVAL_S: Final = 30
LOG_RATE_LIMIT_BURST: Final = 20000


class RenderError(ValueError):
    """The spec is well-formed but cannot be rendered into a working unit; names the field and the fix."""


# ---------------------------------------------------------------------------------------------------
# What one server command needs, for a replica on bare metal or for a pod


@dataclass(frozen=True)
class ServerContext:
    """Everything the server tables read: the spec, its memory plan and the per-process values.

    For a pod, ``node_rank``/``dist_init_host`` are Kubernetes ``$(VAR)`` references to the
    LeaderWorkerSet environment, expanded by the kubelet when the container starts.
    """

    spec: FleetSpec
    memory: MemoryPlan
    host: str
    port: int
    nnodes: int
    node_rank: str
    dist_init_host: str
    gpu_ids: tuple[int, ...]
    replica_id: str
    release: str


Ctx = TypeVar("Ctx")
FlagValue = str | bool | Sequence[str] | None  # None/False: omitted; True: a switch; a list: nargs values


@dataclass(frozen=True)
class FlagRule(Generic[Ctx]):
    """One flag: where its value comes from (for docs) and how it is computed."""

    flag: str
    source: str
    value: Callable[[Ctx], FlagValue]


@dataclass(frozen=True)
class EnvRule:
    """One environment variable; ``pod_field`` replaces the value in pods with a downward-API field,
    ``host_only`` leaves it out of pods (the GPU device plugin sets the visible devices there)."""

    name: str
    source: str
    value: Callable[[ServerContext], str | None]
    pod_field: str | None = None
    host_only: bool = False


def whole_seconds(seconds: float) -> int:
    """Seconds for tools that take whole seconds: rounded up, never below 1 (a timeout of 0 disables)."""
    return max(1, math.ceil(seconds))


def model_dir(spec: FleetSpec) -> str:
    """The weights on the node-local cache (the same path inside pods: a read-only hostPath)."""
    return f"{spec.storage.local_cache.path.rstrip('/')}/{spec.model.path.strip('/')}"


_DTYPE: Final[Mapping[Precision, str]] = {Precision.FP16: "float16", Precision.BF16: "bfloat16"}
_ROUTER_LOG_LEVEL: Final[Mapping[LogLevel, str]] = {
    LogLevel.DEBUG: "debug",
    LogLevel.INFO: "info",
    LogLevel.WARNING: "warn",
    LogLevel.ERROR: "error",
}


def _fraction(value: float) -> str:
    """Three decimals, rounded down: the planner's budget is a ceiling, never exceed it."""
    return f"{math.floor(value * 1000) / 1000:.3f}"


def _running_requests(c: ServerContext) -> str:
    return str(min(c.spec.limits.max_running_requests, int(c.memory.max_concurrent_sequences.value)))


SERVER_FLAGS: Final[tuple[FlagRule[ServerContext], ...]] = (
    FlagRule("--model-path", "storage.local_cache.path + model.path", lambda c: model_dir(c.spec)),
    FlagRule("--served-model-name", "model.name", lambda c: c.spec.model.name),
    FlagRule(
        "--dtype",
        "model.precision (fp16 → float16, bf16 → bfloat16; quantised: SGLang's auto)",
        lambda c: _DTYPE.get(c.spec.model.precision),
    ),
    FlagRule("--quantization", "model.quantization (when set)", lambda c: c.spec.model.quantization),
    FlagRule("--kv-cache-dtype", "model.kv_cache_dtype", lambda c: c.spec.model.kv_cache_dtype),
    FlagRule("--host", "node address (bare metal); 0.0.0.0 in a pod", lambda c: c.host),
    FlagRule("--port", "serving.port + slot on the node (bare metal); serving.port in a pod", lambda c: str(c.port)),
    FlagRule("--tp-size", "parallelism.tp", lambda c: str(c.spec.parallelism.tp)),
    FlagRule("--pp-size", "parallelism.pp", lambda c: str(c.spec.parallelism.pp)),
    FlagRule("--dp-size", "parallelism.dp", lambda c: str(c.spec.parallelism.dp)),
    FlagRule(
        "--nnodes",
        "planner placement: nodes per replica (only when a replica spans nodes)",
        lambda c: str(c.nnodes) if c.nnodes > 1 else None,
    ),
    FlagRule(
        "--node-rank",
        "the node's position in the replica; $(LWS_WORKER_INDEX) in a pod",
        lambda c: c.node_rank if c.nnodes > 1 else None,
    ),
    FlagRule(
        "--dist-init-addr",
        f"the replica's first node: ADDRESS:{DIST_INIT_PORT}; $(LWS_LEADER_ADDRESS) in a pod",
        lambda c: f"{c.dist_init_host}:{DIST_INIT_PORT}" if c.nnodes > 1 else None,
    ),
    FlagRule("--context-length", "limits.context_length", lambda c: str(c.spec.limits.context_length)),
    FlagRule(
        "--max-running-requests",
        "min(limits.max_running_requests, planner max_concurrent_sequences)",
        _running_requests,
    ),
    FlagRule(
        "--max-total-tokens",
        "planner memory_plan.max_total_tokens (KV pool per GPU)",
        lambda c: str(int(c.memory.max_total_tokens.value)),
    ),
    FlagRule(
        "--mem-fraction-static",
        "planner memory_plan.mem_fraction_static (3 decimals, rounded down)",
        lambda c: _fraction(c.memory.mem_fraction_static.value),
    ),
    FlagRule(
        "--chunked-prefill-size", "limits.chunked_prefill_size", lambda c: str(c.spec.limits.chunked_prefill_size)
    ),
    FlagRule("--enable-metrics", "always (Prometheus /metrics on the server port)", lambda c: True),
    FlagRule("--log-level", "serving.log_level", lambda c: c.spec.serving.log_level.value),
    FlagRule("--watchdog-timeout", "serving.watchdog_timeout_s", lambda c: f"{c.spec.serving.watchdog_timeout_s:g}"),
)


def _rdma(spec: FleetSpec) -> bool:
    return spec.cluster.fabric.kind is not FabricKind.ETHERNET


SERVER_ENV: Final[tuple[EnvRule, ...]] = (
    EnvRule(
        "CUDA_VISIBLE_DEVICES",
        "the replica's gpu_ids (bare metal; the device plugin sets them in pods)",
        lambda c: ",".join(str(i) for i in c.gpu_ids),
        host_only=True,
    ),
    EnvRule("NCCL_SOCKET_IFNAME", "cluster.fabric.socket_ifname", lambda c: c.spec.cluster.fabric.socket_ifname),
    EnvRule(
        "GLOO_SOCKET_IFNAME",
        "cluster.fabric.socket_ifname (SGLang's CPU process groups)",
        lambda c: c.spec.cluster.fabric.socket_ifname,
    ),
    EnvRule("NCCL_IB_DISABLE", "cluster.fabric.kind = ethernet → 1", lambda c: None if _rdma(c.spec) else "1"),
    EnvRule(
        "NCCL_IB_HCA",
        "cluster.fabric.hcas, exact match ('=' prefix), infiniband/roce only",
        lambda c: "=" + ",".join(c.spec.cluster.fabric.hcas) if _rdma(c.spec) else None,
    ),
    EnvRule(
        "NCCL_IB_GID_INDEX",
        "cluster.fabric.nccl_ib_gid_index (roce only, when set)",
        lambda c: (
            str(c.spec.cluster.fabric.nccl_ib_gid_index)
            if c.spec.cluster.fabric.kind is FabricKind.ROCE and c.spec.cluster.fabric.nccl_ib_gid_index is not None
            else None
        ),
    ),
    EnvRule("HF_HUB_OFFLINE", "always 1: weights come from the node-local cache, never a model hub", lambda c: "1"),
    EnvRule(
        "SGLANG_HEALTH_CHECK_TIMEOUT",
        "serving.health_check_timeout_s (whole seconds, rounded up)",
        lambda c: str(whole_seconds(c.spec.serving.health_check_timeout_s)),
    ),
    EnvRule("PYTHONUNBUFFERED", "always 1: log lines reach journald / the pod log at once", lambda c: "1"),
    EnvRule("HOME", f"{SERVICE_HOME}: writable JIT caches (StateDirectory / an emptyDir)", lambda c: SERVICE_HOME),
    EnvRule("EXASERVE_REPLICA", "replica id; the pod name in a pod", lambda c: c.replica_id, pod_field="metadata.name"),
    EnvRule(
        "EXASERVE_RELEASE",
        "the replica's update group version (rollout.group_versions or serving.version)",
        lambda c: c.release,
    ),
)


def _render_flags(rules: Sequence[FlagRule[Ctx]], ctx: Ctx) -> list[str]:
    argv: list[str] = []
    for rule in rules:
        value = rule.value(ctx)
        if value is None or value is False:
            continue
        if value is True:
            argv.append(rule.flag)
        elif isinstance(value, str):
            argv += [rule.flag, value]
        elif value:  # a non-empty list of values (nargs '*' or '+')
            argv += [rule.flag, *value]
    return argv


def _checked_memory(spec: FleetSpec) -> MemoryPlan:
    """The planner's memory budget, refused when the KV pool cannot hold one full-length sequence."""
    mp = memory_plan(spec)
    ctx = spec.limits.context_length
    if mp.max_total_tokens.value < ctx:
        raise RenderError(
            f"model.precision={spec.model.precision.value} with parallelism.tp={spec.parallelism.tp} × "
            f"pp={spec.parallelism.pp} leaves a KV-cache pool of {int(mp.max_total_tokens.value):,} tokens per "
            f"GPU ({mp.kv_pool_per_gpu.formula}), less than one limits.context_length={ctx:,} sequence; "
            "raise parallelism.tp or pp, pick a quantised model.precision, or lower limits.context_length "
            "(see `exaserve plan`)"
        )
    return mp


def _replica_context(spec: FleetSpec, replica: Replica, node_rank: int) -> ServerContext:
    nnodes = len(replica.nodes)
    if not 0 <= node_rank < nnodes:
        raise RenderError(
            f"node_rank={node_rank} is outside replica {replica.id}, which spans {nnodes} node(s); use 0..{nnodes - 1}"
        )
    return ServerContext(
        spec=spec,
        memory=_checked_memory(spec),
        host=str(replica.nodes[node_rank].address),
        port=replica.port,
        nnodes=nnodes,
        node_rank=str(node_rank),
        dist_init_host=str(replica.nodes[0].address),
        gpu_ids=replica.gpu_ids,
        replica_id=replica.id if nnodes == 1 else f"{replica.id}-rank{node_rank}",
        release=spec.group_version(replica.group),
    )


# ---------------------------------------------------------------------------------------------------
# Checking command lines against the pinned parsers


def _check(argv: Sequence[str], entry: Sequence[str], manifest: FlagManifest) -> None:
    if tuple(argv[: len(entry)]) != tuple(entry):
        raise ValueError(f"command line must start with {' '.join(entry)!r}, got {' '.join(argv[:3])!r}")
    check_argv(list(argv[len(entry) :]), manifest)


def check_server_argv(argv: Sequence[str], manifest: FlagManifest | None = None) -> None:
    """Raise FlagValidationError when the pinned SGLang parser (or ``manifest``) would not take ``argv``."""
    _check(argv, SERVER_ENTRY, manifest or load_server_manifest())


def check_router_argv(argv: Sequence[str], manifest: FlagManifest | None = None) -> None:
    """Raise FlagValidationError when the pinned router parser (or ``manifest``) would not take ``argv``."""
    _check(argv, ROUTER_ENTRY, manifest or load_router_manifest())


# ---------------------------------------------------------------------------------------------------
# SGLang server


def server_argv(spec: FleetSpec, replica: Replica, node_rank: int = 0) -> list[str]:
    """The full command line of one SGLang server process (entry point first), checked against the pin."""
    argv = [*SERVER_ENTRY, *_render_flags(SERVER_FLAGS, _replica_context(spec, replica, node_rank))]
    check_server_argv(argv)
    return argv


def server_env(spec: FleetSpec, replica: Replica, node_rank: int = 0) -> dict[str, str]:
    """The environment of one SGLang server process on bare metal."""
    ctx = _replica_context(spec, replica, node_rank)
    return {rule.name: v for rule in SERVER_ENV if (v := rule.value(ctx)) is not None}


# ---------------------------------------------------------------------------------------------------
# systemd


_SYSTEMD_PLAIN = re.compile(r"[A-Za-z0-9_@+=:,./-]+")


def systemd_word(word: str, *, exec_line: bool) -> str:
    """Quote one word for a unit file: specifiers (%) always, variables ($) in Exec lines."""
    if any(ord(ch) < 0x20 for ch in word):
        raise RenderError(f"control character in {word!r}; unit files cannot carry it")
    escaped = word.replace("%", "%%")
    if exec_line:
        escaped = escaped.replace("$", "$$")
    if _SYSTEMD_PLAIN.fullmatch(word):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def unit_name(replica: Replica, node_rank: int = 0) -> str:
    """``exaserve-sglang@<replica>.service`` (``-rank<N>`` on the nodes of a multi-node replica)."""
    suffix = "" if len(replica.nodes) == 1 else f"-rank{node_rank}"
    return f"exaserve-sglang@{replica.id}{suffix}.service"


def _exec_lines(argv: Sequence[str]) -> list[str]:
    """The command as unit-file lines: the entry point, then one flag with its values per line."""
    lines: list[list[str]] = [[]]
    for i, word in enumerate(argv):
        if word.startswith("--") and i >= len(SERVER_ENTRY):
            lines.append([])
        lines[-1].append(systemd_word(word, exec_line=True))
    return [" ".join(words) for words in lines]


@cache
def _templates() -> jinja2.Environment:
    return jinja2.Environment(  # noqa: S701  (unit files and configs, not HTML)
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _render(template: str, **context: object) -> str:
    header = f"generated from templates/{template} by serving.render.units — do not edit"
    return _templates().get_template(template).render(header=header, **context)


def systemd_unit(spec: FleetSpec, replica: Replica, node_rank: int = 0) -> str:
    """The systemd unit of one replica (one node of it, for a multi-node replica)."""
    argv = server_argv(spec, replica, node_rank)
    ctx = _replica_context(spec, replica, node_rank)
    s = spec.serving
    interval = whole_seconds(s.heartbeat_interval_s)
    start_timeout = whole_seconds(s.startup_budget_s)
    health_check: list[str] = []
    if node_rank == 0:  # only the first node of a replica serves HTTP
        health_check = [
            CURL, "--silent", "--show-error", "--fail", "--output", "/dev/null",
            "--retry", str(math.ceil(start_timeout / interval)), "--retry-delay", str(interval),
            "--retry-max-time", str(start_timeout), "--retry-connrefused", "--retry-all-errors",
            "--max-time", str(whole_seconds(s.health_check_timeout_s)),
            f"http://{ctx.host}:{ctx.port}{HEALTH_PATH}",
        ]  # fmt: skip
    return _render(
        "sglang-replica.service.j2",
        unit=unit_name(replica, node_rank),
        replica_id=replica.id,
        node_rank=node_rank,
        nnodes=ctx.nnodes,
        model=spec.model.name,
        gpu_ids=",".join(str(i) for i in replica.gpu_ids),
        user=SERVICE_USER,
        state_directory=SERVICE_HOME.removeprefix("/var/lib/"),
        environment=[
            systemd_word(f"{k}={v}", exec_line=False) for k, v in server_env(spec, replica, node_rank).items()
        ],
        exec_start=_exec_lines(argv),
        health_check=" ".join(systemd_word(w, exec_line=True) for w in health_check),
        start_timeout_s=start_timeout,
        stop_timeout_s=whole_seconds(spec.rollout.drain_timeout_s),
        restart_s=RESTART_SEC,
        start_limit_burst=START_LIMIT_BURST,
        start_limit_interval_s=START_LIMIT_BURST * (start_timeout + RESTART_SEC),
        log_rate_interval_s=LOG_RATE_LIMIT_INTERVAL_S,
        log_rate_burst=LOG_RATE_LIMIT_BURST,
        log_level=spec.serving.log_level.value,
        rdma=_rdma(spec),
    )


# ---------------------------------------------------------------------------------------------------
# chrony


def chrony_conf(spec: FleetSpec) -> str:
    """chrony.conf for every node: the spec's servers; step and source-distance limits from the offset limit."""
    ntp = spec.cluster.ntp
    limit_s = ntp.max_offset_ms / 1000
    return _render(
        "chrony.conf.j2",
        servers=ntp.servers,
        max_offset_ms=f"{ntp.max_offset_ms:g}",
        limit_s=f"{limit_s:g}",
    )


# ---------------------------------------------------------------------------------------------------
# SGLang router


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


def duration_buckets(spec: FleetSpec) -> list[float]:
    """Router latency buckets fine enough to resolve the P99 gate.

    The router's default buckets jump 25 ms → 50 ms → 100 ms … 1 s → 2.5 s: a 30 % P99 rise inside
    one bucket is invisible to ``histogram_quantile``. Geometric buckets with ratio
    ``1 + max_p99_rise / 3`` put at least three buckets inside the gate, from 1 ms to 10 × the P99
    target. Rendered as the router's ``--prometheus-duration-buckets``; the rollout gates read them.
    """
    ratio = 1 + spec.rollout.max_p99_rise / 3
    top = 10 * spec.limits.p99_target_s
    out, b = [], 0.001
    while b < top:
        out.append(float(f"{b:.4g}"))
        b *= ratio
    return [*dict.fromkeys(out), top]


@dataclass(frozen=True)
class RouterContext:
    spec: FleetSpec
    host: str
    port: int
    metrics_host: str
    metrics_port: int
    worker_urls: tuple[str, ...]
    kubernetes: bool
    selector: tuple[str, ...]


def _interval(c: RouterContext) -> int:
    return whole_seconds(c.spec.serving.heartbeat_interval_s)


ROUTER_FLAGS: Final[tuple[FlagRule[RouterContext], ...]] = (
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
        lambda c: str(c.spec.serving.failure_threshold * _interval(c)),
    ),
    FlagRule(
        "--shutdown-grace-period-secs",
        "rollout.drain_timeout_s",
        lambda c: str(whole_seconds(c.spec.rollout.drain_timeout_s)),
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
        "serving pod labels (+ LWS leader index when a replica spans nodes)",
        lambda c: c.selector if c.kubernetes else None,
    ),
    FlagRule(
        "--service-discovery-namespace",
        "kubernetes.namespace",
        lambda c: c.spec.kubernetes.namespace if c.kubernetes else None,
    ),
    FlagRule("--service-discovery-port", "serving.port", lambda c: str(c.spec.serving.port) if c.kubernetes else None),
)


def server_selector(spec: FleetSpec) -> dict[str, str]:
    """Labels of the pods the router discovers: HTTP-serving pods only (LWS leaders for multi-node)."""
    labels = dict(SERVER_POD_LABELS)
    if placement(spec).nodes_per_replica > 1:
        labels[LWS_LEADER_LABEL[0]] = LWS_LEADER_LABEL[1]
    return labels


def replica_url(replica: Replica) -> str:
    return f"http://{replica.node.address}:{replica.port}"


def router_argv(spec: FleetSpec, *, worker_urls: Sequence[str] | None = None, kubernetes: bool = False) -> list[str]:
    """The SGLang router's command line; static worker URLs, Kubernetes discovery, or both."""
    if worker_urls is None:
        worker_urls = [] if kubernetes else [replica_url(r) for r in fleet_replicas(spec)]
    loopback = spec.sandbox is not None
    ctx = RouterContext(
        spec=spec,
        host="127.0.0.1" if loopback else "0.0.0.0",  # noqa: S104  (the gateway serves clients)
        port=spec.sandbox.router_port if spec.sandbox else ROUTER_PORT,
        metrics_host="127.0.0.1" if loopback else "0.0.0.0",  # noqa: S104  (scraped by Prometheus)
        metrics_port=spec.sandbox.prometheus_port if spec.sandbox else ROUTER_METRICS_PORT,
        worker_urls=tuple(worker_urls),
        kubernetes=kubernetes,
        selector=tuple(f"{k}={v}" for k, v in server_selector(spec).items()),
    )
    argv = [*ROUTER_ENTRY, *_render_flags(ROUTER_FLAGS, ctx)]
    check_router_argv(argv)
    return argv


def router_env(spec: FleetSpec) -> dict[str, str]:
    """The router's environment: the launcher is Python, so unbuffered output like the servers."""
    del spec  # nothing in the spec changes it today; the signature matches the other renderers
    return {"PYTHONUNBUFFERED": "1"}


# ---------------------------------------------------------------------------------------------------
# Kubernetes container


def gpus_per_pod(spec: FleetSpec) -> int:
    """A replica on one node is one pod; a multi-node replica has one pod per node, each with all GPUs."""
    p = placement(spec)
    return p.gpus_per_replica if p.nodes_per_replica == 1 else p.gpus_per_node


def pod_memory_bytes(spec: FleetSpec) -> int:
    """Host memory limit of a serving pod: its /dev/shm (memory-backed, counted against the limit),
    the pod's share of the weights (staged through host memory while loading) and the framework
    overhead of each GPU process. Rounded up to whole GiB."""
    mp = memory_plan(spec)
    gpus = gpus_per_pod(spec)
    total = (
        spec.serving.shm_size_gb * GB
        + mp.per_gpu["weights"].value * gpus
        + spec.model.framework_overhead_gb * GB * gpus
    )
    return math.ceil(total / GIB) * GIB


def _probe(spec: FleetSpec, failure_threshold: int, success_threshold: int = 1) -> dict[str, Any]:
    s = spec.serving
    return {
        "httpGet": {"path": HEALTH_PATH, "port": "http"},
        "periodSeconds": whole_seconds(s.heartbeat_interval_s),
        "timeoutSeconds": whole_seconds(s.health_check_timeout_s),
        "failureThreshold": failure_threshold,
        "successThreshold": success_threshold,
    }


def pod_volumes(spec: FleetSpec) -> list[dict[str, Any]]:
    """The pod-level volumes :func:`pod_container` mounts."""
    return [
        {
            "name": VOLUME_SHM,
            "emptyDir": {"medium": "Memory", "sizeLimit": f"{math.ceil(spec.serving.shm_size_gb * GB / GIB)}Gi"},
        },
        {"name": VOLUME_MODELS, "hostPath": {"path": spec.storage.local_cache.path, "type": "Directory"}},
        {"name": VOLUME_HOME, "emptyDir": {}},
    ]


def as_leader_pod(words: Sequence[str]) -> list[str]:
    """``words`` with the LeaderWorkerSet references expanded as the kubelet would in a leader pod
    (rank 0, an example address): what the parsers check, since they cannot read ``$(VAR)``."""
    leader = {LWS_WORKER_INDEX: "0", LWS_LEADER_ADDRESS: "10.0.0.1"}
    refs = re.compile("|".join(re.escape(ref) for ref in leader))
    return [refs.sub(lambda m: leader[m.group(0)], word) for word in words]


def pod_container(spec: FleetSpec, group: int, *, leader: bool = True) -> dict[str, Any]:
    """The serving container (camelCase, as the Kubernetes API takes it) of update group ``group``.

    Same command and environment as :func:`server_argv`/:func:`server_env`, with per-pod values from
    the downward API and, for multi-node replicas, the LeaderWorkerSet environment. ``leader=False``
    is a non-leader pod of a multi-node replica: it serves no HTTP, so it has no probes.
    """
    if not 0 <= group < spec.rollout.batches:
        raise RenderError(
            f"update group {group} does not exist; rollout.batches={spec.rollout.batches} gives 0..{spec.rollout.batches - 1}"
        )
    p = placement(spec)
    ctx = ServerContext(
        spec=spec,
        memory=_checked_memory(spec),
        host="0.0.0.0",  # noqa: S104  (the pod's own network namespace)
        port=spec.serving.port,
        nnodes=p.nodes_per_replica,
        node_rank=LWS_WORKER_INDEX,
        dist_init_host=LWS_LEADER_ADDRESS,
        gpu_ids=(),
        replica_id="",
        release=spec.group_version(group),
    )
    flags = _render_flags(SERVER_FLAGS, ctx)
    check_server_argv([*SERVER_ENTRY, *as_leader_pod(flags)])
    env: list[dict[str, Any]] = []
    for rule in SERVER_ENV:
        if rule.host_only:
            continue
        if rule.pod_field:
            env.append({"name": rule.name, "valueFrom": {"fieldRef": {"fieldPath": rule.pod_field}}})
        elif (value := rule.value(ctx)) is not None:
            env.append({"name": rule.name, "value": value})
    s = spec.serving
    gpus = str(gpus_per_pod(spec))
    memory = f"{pod_memory_bytes(spec) // GIB}Gi"
    resources: dict[str, str] = {"nvidia.com/gpu": gpus, "memory": memory}
    capabilities: dict[str, list[str]] = {"drop": ["ALL"]}
    if _rdma(spec):
        resources[spec.kubernetes.rdma_resource] = "1"
        capabilities["add"] = ["IPC_LOCK"]  # pin RDMA buffers (ibv_reg_mr)
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.group_image(group),
        "imagePullPolicy": "IfNotPresent",
        "command": list(SERVER_ENTRY),
        "args": flags,
        "env": env,
        "ports": [{"name": "http", "containerPort": s.port, "protocol": "TCP"}],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "securityContext": {
            "privileged": False,
            "allowPrivilegeEscalation": False,
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "capabilities": capabilities,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": VOLUME_SHM, "mountPath": "/dev/shm"},  # noqa: S108  (a mount point, not a temp file)
            {"name": VOLUME_MODELS, "mountPath": spec.storage.local_cache.path, "readOnly": True},
            {"name": VOLUME_HOME, "mountPath": SERVICE_HOME},
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if leader:
        interval = whole_seconds(s.heartbeat_interval_s)
        container["startupProbe"] = _probe(spec, math.ceil(whole_seconds(s.startup_budget_s) / interval))
        container["readinessProbe"] = _probe(spec, s.failure_threshold, s.success_threshold)
        container["livenessProbe"] = _probe(spec, s.failure_threshold)
    return container
