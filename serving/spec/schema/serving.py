"""How the replicas serve and are kept serving: parallelism inside a replica, batch and latency limits, the releases
(pinned images) and serving flags, the router's scheduling, the health score, and the runtime (node agents and the
fleet controller)."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal, Self

from pydantic import Field, StringConstraints, field_validator, model_validator

from serving.sglang_metrics import STALL_BOUNDS_S
from serving.spec.schema.base import SpecModel


class ParallelismSpec(SpecModel):
    tp: int = Field(default=2, gt=0, le=64, description="Tensor parallel size (source: 2).")
    pp: int = Field(default=4, gt=0, le=64, description="Pipeline parallel size (source: 4).")
    dp: int = Field(default=1, gt=0, le=64, description="Data parallel ranks inside one replica.")
    attn_dp: int = Field(
        default=1,
        gt=0,
        le=64,
        description="Attention data parallelism inside the TP group (SGLang --attn-dp-size): attn_dp groups of "
        "tp / attn_dp GPUs, each with its own scheduler and KV pool; adds no GPUs.",
    )
    ep: int = Field(
        default=1,
        gt=0,
        le=64,
        description="Expert parallelism inside the TP group (SGLang --ep-size): a MoE model's experts spread whole "
        "over ep groups of tp / ep GPUs; adds no GPUs.",
    )

    @model_validator(mode="after")
    def _attn_dp(self) -> Self:
        """SGLang 0.5.23's own checks (``arg_groups/parallel_hook.py: handle_data_parallelism``)."""
        if self.attn_dp > 1 and self.dp > 1:
            raise ValueError(
                f"parallelism.dp = {self.dp} with parallelism.attn_dp = {self.attn_dp}: SGLang refuses data-parallel "
                "replicas combined with attention DP (arg_groups/parallel_hook.py:287); set one of them to 1"
            )
        if self.tp % self.attn_dp:
            raise ValueError(
                f"parallelism.attn_dp = {self.attn_dp} does not divide parallelism.tp = {self.tp} (SGLang asserts "
                "tp_size % attn_dp_size == 0, arg_groups/parallel_hook.py:326); pick a divisor of tp"
            )
        if self.tp % self.ep:
            raise ValueError(
                f"parallelism.ep = {self.ep} does not divide parallelism.tp = {self.tp} (SGLang refuses it, "
                "model_executor/model_runner_components/moe_ep_setup.py:150); pick a divisor of tp"
            )
        return self

    @property
    def attn_tp(self) -> int:
        """The attention-TP width: each attention-DP group's GPUs (``runtime_context.py: derive_attn_tp_size``)."""
        return self.tp // self.attn_dp

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp * self.dp


class LimitsSpec(SpecModel):
    max_running_requests: int = Field(default=8, gt=0, description="Batch size per replica (source max_batch_size 8).")
    context_length: int = Field(default=4096, gt=0, description="Max sequence length (source max_seq_len 4096).")
    chunked_prefill_size: int = Field(default=4096, gt=0, description="Prefill chunk in tokens.")
    p99_concurrency_per_replica: int = Field(
        default=4, gt=0, description="Concurrent requests per replica that keep P99 under target (source: 4)."
    )
    p99_target_s: float = Field(default=2.0, gt=0, description="P99 latency target (source: < 2 s).")
    min_decode_tokens_per_s: float = Field(
        default=10.0,
        gt=0,
        description=(
            "The slowest decode a served request may have, in tokens/s of that request: the longest generation the "
            "spec allows (context_length tokens) at this rate sizes the routers' request timeout, which cuts a stream "
            "at that age (not in the source; 10 tokens/s is slower than any planned layout decodes at full batch)."
        ),
    )
    mean_request_s: float = Field(default=1.5, gt=0, description="Mean request time (source: 1.5 s).")
    balance_efficiency: float = Field(default=0.80, gt=0, le=1, description="Load-balance efficiency (80 %).")
    failure_reserve: float = Field(default=0.10, ge=0, lt=1, description="Reserved for failures/rollouts (10 %).")
    burst_buffer: float = Field(default=0.10, ge=0, lt=1, description="Headroom for bursts (≈ 8,847 → 8,000).")


class LogLevel(StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"

    @classmethod
    def _missing_(cls, value: object) -> LogLevel | None:
        if isinstance(value, str):
            v = value.lower()
            return cls.WARNING if v == "warn" else cls.__members__.get(v.upper())
        return None


ReleaseName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]


IMAGE_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")  # an OCI content digest, as a registry returns it on a push


IMAGE_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")  # the OCI distribution spec's tag grammar


def image_repository(ref: str) -> str:
    """``repo[:tag][@digest]`` → ``repo`` (a port's colon is in a host, before the last ``/``, never a tag's)."""
    name = ref.partition("@")[0]
    head, sep, tail = name.rpartition(":")
    return head if sep and "/" not in tail else name


def pinned_image(v: str) -> str:
    """Images are pinned: an explicit tag other than 'latest', or a digest: ``repo[:tag]@sha256:<64 hex digits>``,
    as the image workflow publishes it (.github/workflows/image.yml)."""
    if "@" in v:
        name, _, digest = v.partition("@")
        if name and IMAGE_DIGEST.fullmatch(digest):
            return v
        raise ValueError(
            f"image {v!r} is not pinned: {digest!r} after '@' is not a sha256:<64 hex digits> digest of a named "
            "repository; use repo@sha256:<digest> as the image workflow prints it, or an explicit tag"
        )
    name, _, tag = v.rpartition(":")
    if not name or not tag or tag == "latest" or "/" in tag:
        raise ValueError(f"image {v!r} is not pinned; use an explicit tag or @sha256 digest, never 'latest'")
    return v


class ServingSpec(SpecModel):
    replicas: int = Field(default=3072, gt=0, description="Serving replicas (SGLang servers).")
    target_replicas: int | None = Field(
        default=None, gt=0, description="The source's replica target, reported next to what the hardware allows."
    )
    replicas_per_node: int | None = Field(
        default=12, gt=0, description="Replicas per node; None when a replica spans nodes."
    )
    releases: dict[ReleaseName, str] = Field(
        default_factory=lambda: {"v1": "lmsysorg/sglang:v0.5.23-cu126"},
        min_length=1,
        description="Release label → serving container image, pinned (no 'latest'). Rollouts move between these.",
    )
    version: ReleaseName = Field(default="v1", description="The stable release the fleet runs.")
    port: int = Field(default=30000, gt=0, lt=65536, description="SGLang HTTP port.")
    heartbeat_interval_s: float = Field(default=5.0, gt=0, description="Heartbeat period (source: 5 s).")
    failure_threshold: int = Field(default=3, gt=0, description="Missed heartbeats before unhealthy (source: 3).")
    success_threshold: int = Field(default=2, gt=0, description="Good checks before a node is healthy again.")
    health_check_timeout_s: float = Field(
        default=3.0, gt=0, description="Health HTTP timeout (1 s flapped; 3 s fixed it)."
    )
    migration_timeout_s: float = Field(default=10.0, gt=0, description="Replica migration budget (source: 10 s).")
    recovery_target_s: float = Field(
        default=30.0, gt=0, description="Detect + migrate within this (source: ≈ 25 s, ≤ 30 s)."
    )
    startup_budget_s: float = Field(
        default=600.0, gt=0, description="Time a replica may take to load before it is killed."
    )
    warmup_share: float = Field(default=0.10, gt=0, le=1, description="Traffic share of a warming replica (10 %).")
    warmup_duration_s: float = Field(default=30.0, ge=0, description="Stable time before full traffic (30 s).")
    heartbeat_mode: Literal["aggregated", "direct"] = Field(
        default="aggregated", description="Node agents aggregate replica heartbeats (source node_aggregation)."
    )
    log_level: LogLevel = Field(default=LogLevel.WARNING, description="Serving log level (source: WARN).")
    watchdog_timeout_s: float = Field(default=300.0, gt=0, description="SGLang --watchdog-timeout.")
    mem_fraction_static: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="SGLang --mem-fraction-static; None = SGLang's own default for the GPU, TP and PP "
        "(the planner reproduces handle_gpu_memory_settings).",
    )
    shm_gb_per_gpu: float = Field(
        default=2.0,
        gt=0,
        description="Shared memory (the /dev/shm mount) per GPU of a serving pod, in GB: NCCL's shared-memory transport between the pod's "
        "GPUs and the tokenizer/scheduler IPC. Counted in the pod's memory request (memory-backed).",
    )
    cpus_per_gpu: int = Field(
        default=8,
        gt=0,
        le=64,
        description="Whole CPUs per GPU of a serving pod (request = limit: Guaranteed QoS, so the kubelet's static "
        "CPU manager pins them) for SGLang's scheduler, tokenizer and detokenizer processes.",
    )

    @field_validator("releases")
    @classmethod
    def _pinned_releases(cls, v: dict[str, str]) -> dict[str, str]:
        """Every release's image is pinned."""
        for name, image in v.items():
            try:
                pinned_image(image)
            except ValueError as exc:
                raise ValueError(f"release {name!r}: {exc}") from None
        return v

    @model_validator(mode="after")
    def _version_released(self) -> Self:
        """The stable version must be one of the releases, so its image is known."""
        if self.version not in self.releases:
            raise ValueError(
                f"version {self.version!r} is not in releases ({sorted(self.releases)}); add its image under "
                "serving.releases"
            )
        return self

    @property
    def image(self) -> str:
        """The stable release's image."""
        return self.releases[self.version]


LoadMetric = Literal["gpu_utilization", "memory_usage", "network_bandwidth"]


def _default_weights() -> dict[LoadMetric, float]:
    return {"gpu_utilization": 0.5, "memory_usage": 0.3, "network_bandwidth": 0.2}


class SchedulerSpec(SpecModel):
    strategy: Literal["weighted_round_robin", "round_robin", "cache_aware", "power_of_two", "random"] = Field(
        default="weighted_round_robin", description="Node-selection strategy (source: weighted_round_robin)."
    )
    node_aggregation: bool = Field(default=True, description="Two-level scheduling: node, then replica.")
    weights: dict[LoadMetric, float] = Field(
        default_factory=_default_weights,
        description="Load-metric weights; must sum to 1.",
    )
    period_ms: int = Field(default=100, gt=0, description="Scheduling period (10 ms saturated the CPU).")
    migration_load_ratio: float = Field(default=1.5, gt=1, description="Migrate above this × mean node load.")
    shed_min_load: float = Field(
        default=0.25,
        gt=0,
        le=1,
        description="The controller sheds a replica's load (out of every router, no restart) when its weighted load "
        "is above migration_load_ratio × the fleet's mean and at least this (a replica at half its batch, or a KV pool "
        "83 % full: below it, 1.5 × an idle fleet's mean is noise); it returns, after a warm-up, once its load is "
        "under half of it (the hysteresis).",
    )
    instances: int = Field(default=3, gt=0, description="Scheduler/router instances with leader election.")
    max_direct_heartbeat_replicas: int = Field(
        default=1500, gt=0, description="Replicas a central scheduler handled before jitter (source: ≈ 1,500)."
    )
    retries: int = Field(
        default=5,
        ge=0,
        description="Attempts the router makes per request, the first included (its --retry-max-retries: 1 means no "
        "retry; 0 renders --disable-retries). Above serving.failure_threshold, one dead replica cannot fail a "
        "request: its circuit breaker opens after failure_threshold consecutive failures and the router picks only "
        "among workers whose breaker is closed, so the next attempt lands elsewhere. At 3 (= the threshold) a request "
        "whose three picks all hit the dead replica fails (seen once in 560 requests on a killed replica).",
    )

    @field_validator("weights")
    @classmethod
    def _weights_sum(cls, v: dict[str, float]) -> dict[str, float]:
        """Load weights are a convex combination."""
        if any(w < 0 for w in v.values()):
            raise ValueError(f"weights {v} contain a negative weight")
        total = sum(v.values())
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"weights {v} sum to {total:g}; they must sum to 1 (source: 0.5/0.3/0.2)")
        return v


class HealthScoreSpec(SpecModel):
    start: int = Field(default=100, gt=0)
    timeout_penalty: int = Field(default=5, gt=0, description="Points lost per heartbeat timeout.")
    success_reward: int = Field(default=1, gt=0, description="Points gained per success.")
    cap: int = Field(default=100, gt=0)
    stop_routing_below: int = Field(default=60, ge=0, description="No new requests below this score.")
    migrate_below: int = Field(default=30, ge=0, description="Migrate replicas below this score.")
    readmit_at: int = Field(
        default=75,
        gt=0,
        description="Hysteresis: a replica taken out below stop_routing_below returns (after warm-up) only at this "
        "score or more: 15 straight successes above the 60 line, so one failure in six (net drift 0) cannot flap it.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        """0 ≤ migrate < stop-routing ≤ start ≤ cap, or the score cannot move through its states."""
        if not (self.migrate_below < self.stop_routing_below <= self.start <= self.cap):
            raise ValueError(
                f"need migrate_below ({self.migrate_below}) < stop_routing_below ({self.stop_routing_below}) "
                f"<= start ({self.start}) <= cap ({self.cap})"
            )
        if not self.stop_routing_below < self.readmit_at <= self.cap:
            raise ValueError(
                f"readmit_at ({self.readmit_at}) must lie above stop_routing_below ({self.stop_routing_below}) and "
                f"at most cap ({self.cap}), or a replica flaps in and out of rotation"
            )
        return self


class RuntimeSpec(SpecModel):
    """Node agents and the fleet controller (docs/runtime.md)."""

    max_eviction_share: float = Field(
        default=0.10,
        gt=0,
        le=1,
        description="Eviction cap: at most this share of the replicas out of rotation at once (Envoy's max "
        "ejection percent, 10 %); at least one.",
    )
    lease_ttl_s: float = Field(
        default=10.0, gt=0, description="Leader lease time; a follower takes over at most this long after a crash."
    )
    lease_name: str = Field(
        default="exaserve-controller",
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="etcd key suffix / Kubernetes Lease name of the controllers' election.",
    )
    etcd_endpoints: list[str] = Field(
        default_factory=lambda: ["http://127.0.0.1:2379"],
        min_length=1,
        description="etcd v3 JSON gateway URLs (bare metal).",
    )
    controller_port: int = Field(
        default=9410, gt=0, lt=65536, description="Controller HTTP port (reports, status, metrics)."
    )
    clock_skew_alert_s: float = Field(
        default=1.0,
        gt=0,
        description="A node whose reports' wall-clock send time differs from the controller's wall clock at receipt "
        "by more than this is named by alert ExaServeNodeClockSkew. Freshness is judged on the controller's own "
        "monotonic clock (the report's sequence number, the node's monotonic clock, orders it and dates it): a skewed "
        "clock never makes the controller refuse a report.",
    )
    restart_backoff_s: float = Field(
        default=10.0,
        gt=0,
        description="Wait before restarting a replica again after its first restart, doubled after each further "
        "one (kubelet's crash-loop back-off starts at 10 s).",
    )
    restart_backoff_max_s: float = Field(
        default=300.0,
        gt=0,
        description="Longest wait between two restarts of one replica (kubelet's MaxContainerBackOff, 300 s); a "
        "replica serving for twice this long starts its back-off again.",
    )
    quarantine_after: int = Field(
        default=3,
        gt=0,
        description="Restarts within runtime.quarantine_window_s, whatever warm-ups passed between them, before the "
        "replica is quarantined: no further restart until it has served for a whole window, alert "
        "ExaServeReplicaQuarantined names it (systemd's StartLimitBurst).",
    )
    quarantine_window_s: float = Field(
        default=3600.0,
        gt=0,
        description="The window runtime.quarantine_after counts restarts in (systemd's StartLimitIntervalSec); a "
        "quarantined replica is restarted again only after serving this long without a break.",
    )
    restart_rate_per_min: float | None = Field(
        default=None,
        gt=0,
        description="Fleet-wide restart budget: restarts started per minute at most, refilled continuously (a "
        "token bucket; the Kubernetes node lifecycle controller's eviction rate). Default: the eviction cap's "
        "worth of replicas per serving.startup_budget_s (prod: 204 per 600 s, 20.4 a minute).",
    )
    restart_burst: int | None = Field(
        default=None,
        gt=0,
        description="Restarts the budget allows at once. Default: one node's replicas or 1 % of the fleet, whichever "
        "is more (prod: 21).",
    )
    disrupted_share: float = Field(
        default=0.55,
        gt=0,
        le=1,
        description="A rack (its leaf switch) with more than 2 unhealthy nodes making at least this share of its nodes "
        "is disrupted: a partition or a rack outage, not replica faults; the controller restarts nothing there, "
        "removes within the eviction cap and alert ExaServeRackDisrupted names it (Kubernetes' "
        "--unhealthy-zone-threshold, 0.55).",
    )
    breaker_dwell_s: float | None = Field(
        default=None,
        gt=0,
        description="How long every router that tracks a replica must hold its circuit breaker open before the "
        "controller takes it out of rotation (never restarts it: request errors alone do not). Default: twice "
        "serving.failure_threshold × serving.heartbeat_interval_s (prod: 30 s), so a blip the routers' own breakers "
        "ride out (a 20 s one) changes no membership.",
    )
    latency_outlier_ratio: float = Field(
        default=3.0,
        gt=1,
        description="A serving replica whose mean time per output token over a report's interval (the deltas of "
        "SGLang's sglang:request_time_per_output_token_seconds sum and count, from its agent: decode time only, "
        "queueing and prefill excluded) is above this many times the fleet's median twice within 12 heartbeat "
        "intervals is a latency outlier: out of rotation within the shedding cap, never restarted for it (Envoy's outlier detection ejects, never restarts), readmitted "
        "through a warm-up after runtime.latency_ejection_s × its ejections in a row.",
    )
    latency_ejection_s: float = Field(
        default=30.0,
        gt=0,
        description="How long a latency outlier stays out of rotation, times its ejections in a row, at most 10 times "
        "this (Envoy's base_ejection_time and max_ejection_time, 30 s and 300 s).",
    )
    stall_gap_s: float = Field(
        default=4.0,
        description="A token that comes longer than this after its request's last output is a stall (a stopped "
        "scheduler, a GPU fault being retried, a host paused): read from SGLang's sglang:inter_token_latency_seconds "
        "by the agents, so it must be one of its bucket bounds of a second or more (1, 2, 4, 6, 8). A serving replica "
        "with such a token in a report while most of the fleet has none is a latency outlier for that report (the "
        "same ejection as runtime.latency_outlier_ratio's, never a restart). 4 s by default: a healthy replica's "
        "streams wait out the prefills SGLang runs before each decode step (a burst of long prompts, chunk by "
        "chunk), each well under a second, so a shorter bound would eject busy replicas. Only streamed requests "
        "see a stall whole: SGLang hands a non-streamed one's output over every 50 tokens, and a speculative step's "
        "several tokens share its interval (a stall must be that many times longer to show).",
    )
    image: str = Field(
        default="exaserve/exaserve-deploy:0.1.0",
        description="Container image with this package (the exaserve command) for the controller and the agents.",
    )

    @field_validator("stall_gap_s")
    @classmethod
    def _stall_bound(cls, value: float) -> float:
        if value not in STALL_BOUNDS_S:
            bounds = ", ".join(f"{b:g}" for b in STALL_BOUNDS_S)
            raise ValueError(
                f"{value:g} s is not a bound of SGLang's sglang:inter_token_latency_seconds buckets of a second or "
                f"more, so no agent can count tokens over it; use one of {bounds}"
            )
        return value

    @field_validator("image")
    @classmethod
    def _pinned(cls, v: str) -> str:
        """The runtime image is pinned like the serving image."""
        return pinned_image(v)

    @model_validator(mode="after")
    def _backoff_ordered(self) -> Self:
        if self.restart_backoff_s > self.restart_backoff_max_s:
            raise ValueError(
                f"runtime.restart_backoff_s ({self.restart_backoff_s:g}) is above runtime.restart_backoff_max_s "
                f"({self.restart_backoff_max_s:g}); set the first back-off at most the longest"
            )
        return self
