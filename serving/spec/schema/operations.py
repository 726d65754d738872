"""How the fleet is deployed, changed and rehearsed: the fault drills, the rolling update, the Kubernetes target and
the local sandbox."""

from __future__ import annotations

from collections import Counter
from typing import Literal, Self

from pydantic import Field, field_validator, model_validator

from serving.spec.schema.base import SpecModel
from serving.spec.schema.serving import pinned_image

DrillName = Literal[
    "replica-crash",
    "replica-hang",
    "scheduler-wedged",
    "replica-flapping",
    "replica-slow",
    "error-burst",
    "generation-errors",
    "memory-pressure",
    "network-jitter",
    "node-loss",
    "node-stall",
    "router-loss",
    "leader-loss",
    "double-fault",
    "router-and-replica-loss",
]
"""The fault drills' scenarios (what each does: ``serving.drill.scenarios.SCENARIOS``, docs/drills.md)."""

_CRON_FIELD = r"[0-9A-Za-z*?/,-]+"
_CRON = rf"^(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|@every [0-9]+[smh]|{_CRON_FIELD}( {_CRON_FIELD}){{4}})$"


def _regular_drills() -> list[DrillName]:
    return ["replica-crash", "network-jitter", "memory-pressure"]


class DrillSpec(SpecModel):
    """Fault drills (docs/drills.md): the regular ones a cluster runs as a Chaos Mesh Schedule."""

    schedule: str = Field(
        default="0 10 * * 2",
        pattern=_CRON,
        description="When the regular drills run: a cron expression (minute hour day-of-month month day-of-week, in "
        "the Chaos Mesh controller's time zone) or a descriptor (@weekly, @every 168h). Default Tuesdays 10:00: a "
        "working day, with people at hand.",
    )
    scheduled: list[DrillName] = Field(
        default_factory=_regular_drills,
        min_length=1,
        description="Scenarios of the regular drills, run one after another, each followed by the plan's restoration "
        "time (the source's drills: kill replicas, inject network jitter, create memory pressure).",
    )

    @field_validator("scheduled")
    @classmethod
    def _once_each(cls, v: list[str]) -> list[str]:
        """A scenario runs once per drill window."""
        twice = sorted(name for name, n in Counter(v).items() if n > 1)
        if twice:
            raise ValueError(f"scheduled names {twice} more than once; list each scenario once")
        return v


class RolloutSpec(SpecModel):
    batches: int = Field(default=5, gt=0, le=100, description="Update batches (source: 5).")
    interval_s: float = Field(default=300.0, ge=0, description="Soak between batches (source: 5 min).")
    max_qps_drop: float = Field(default=0.20, gt=0, lt=1, description="Gate: QPS drop vs baseline (20 %).")
    max_p99_rise: float = Field(default=0.30, gt=0, description="Gate: P99 rise vs baseline (30 %).")
    max_error_rate: float = Field(default=0.001, ge=0, lt=1, description="Gate: error rate (0.1 %).")
    drain_timeout_s: float = Field(default=120.0, gt=0, description="Wait for in-flight requests at most this.")
    health_timeout_s: float = Field(default=900.0, gt=0, description="Wait for an updated batch's health.")
    baseline_window_s: float = Field(default=60.0, gt=0, description="Window the baseline is measured over.")
    max_kv_pool_miss: float = Field(
        default=0.15,
        gt=0,
        lt=1,
        description="Gate: a canary's KV pool (SGLang's sglang:max_total_num_tokens) off the plan's "
        "kv_pool_tokens_per_replica by more than this share holds the rollout, naming the planner input likely wrong "
        "(beyond 5 % it warns).",
    )
    group_versions: dict[int, str] = Field(
        default_factory=dict, description="Per update group version overrides (group index → version)."
    )
    dry_run_gates: tuple[Literal["qps", "p99"], ...] = Field(
        default=(),
        description="Gates measured and journaled but not enforced (Argo Rollouts' analysis dryRun): a breach of "
        "one is shown in the batch's verdict as what it would have done and neither pauses nor rolls back. For a "
        "test bed whose throughput and latency are its machine's, not the release's (the CI suite's sandbox, on a "
        "shared 2-core machine); the error, health and KV pool gates are never dry run. Refused on a stack whose "
        "fleet serves clients: exaserve plan (rule rollout.dry-run-gates), exaserve check and the policy pack "
        "(rollout-gates-enforced), and exaserve rollout with --backend ssh or kubernetes.",
    )

    @field_validator("dry_run_gates")
    @classmethod
    def _each_gate_once(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        """A gate is named once."""
        if len(set(v)) != len(v):
            raise ValueError(f"dry_run_gates {list(v)} names a gate twice; list each of qps, p99 at most once")
        return v

    @model_validator(mode="after")
    def _groups(self) -> Self:
        """Group indices must name existing update groups."""
        bad = sorted(i for i in self.group_versions if not 0 <= i < self.batches)
        if bad:
            raise ValueError(f"group_versions keys {bad} are outside 0..{self.batches - 1}")
        return self


class KubernetesSpec(SpecModel):
    version: str = Field(default="1.33", pattern=r"^1\.\d+$", description="Target Kubernetes minor version.")
    namespace: str = Field(default="exaserve", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    context: str | None = Field(default=None, description="kubeconfig context for the explicit provider.")
    rdma_resource: str = Field(default="rdma/hca_shared_devices_a", description="RDMA extended resource.")
    router_image: str = Field(
        # smg's release image (docker/Dockerfile: ENTRYPOINT python3 -m smg.launch_router, user smg, uid 65532 =
        # the router pod's runAsUser), at the version pyproject.toml pins and the flag manifest was dumped from
        default="lightseekorg/smg:1.13.0",
        description="The gateway's image (smg).",
    )
    monitoring_namespace: str = Field(default="monitoring")
    prometheus_selector_labels: dict[str, str] = Field(
        default_factory=lambda: {"release": "kube-prometheus-stack"},
        description="Labels put on the PrometheusRule and ServiceMonitors so the cluster's Prometheus selects them "
        "(kube-prometheus-stack selects its Helm release name under 'release').",
    )
    production: bool = Field(
        default=False,
        description="A production stack: every image is pulled through image_registry and by digest "
        "(repo[:tag]@sha256:…), never by a mutable tag (guards images-through-mirror and images-by-digest).",
    )
    image_registry: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)*$",
        description="Registry mirror every image is pulled through ('mirror.example:5000/proxy'); "
        "None pulls each image by its own name.",
    )
    image_pull_secret: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="Name of an existing docker-registry Secret in the namespace for pulling images (a name "
        "only: the secret itself is created outside this program and never rendered).",
    )
    prerequisites: Literal["check", "skip"] = Field(
        default="check",
        description="'check': `pulumi up` reads the CRDs the stack needs (LeaderWorkerSet, prometheus-operator, "
        "NetworkAttachmentDefinition when used) before creating anything that uses them and fails naming the "
        "missing one; 'skip': trust the cluster (docs/infra.md lists every prerequisite with its version).",
    )

    @field_validator("router_image")
    @classmethod
    def _pinned(cls, v: str) -> str:
        """Router image is pinned like the serving image."""
        return pinned_image(v)


class SandboxVersion(SpecModel):
    latency_ms: float = Field(default=20.0, ge=0)
    error_rate: float = Field(default=0.0, ge=0, le=1, description="Share of generations answered HTTP 500.")
    bad_request_rate: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Share of generations refused as SGLang refuses one it cannot serve: HTTP 400 (a streamed "
        "/generate: 200 and an error chunk). smg passes a 4xx through and counts it a success for the worker.",
    )
    stream_break_rate: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Share of streamed generations whose connection the worker drops after the first chunk.",
    )
    startup_s: float = Field(default=0.5, ge=0)
    never_ready: bool = False
    kv_skew: float = Field(
        default=0.0,
        gt=-1,
        le=1,
        description="The simulated worker's KV pool is the plan's × (1 + kv_skew), as if the planner's start-up "
        "overhead were wrong by that much (-0.2: a pool 20 % smaller than planned).",
    )


class SandboxSpec(SpecModel):
    """Local rehearsal: the real router in front of simulated SGLang workers on loopback.

    The default ports lie in 20000-20199, below Linux's ephemeral port range (32768-60999 by default), from which
    every outgoing connection of the machine takes its source port: a sandbox port inside it can be taken by a
    connection before the sandbox binds it. The range is the machine's (``/proc/sys/net/ipv4/ip_local_port_range``),
    so ``sandbox up`` checks the ports against it on the machine that binds them
    (:func:`serving.sandbox.scale.check_machine`), not this model."""

    router_port: int = Field(default=20000, gt=1024, lt=65536, description="Router 0's HTTP API port.")
    prometheus_port: int = Field(
        default=20001, gt=1024, lt=65536, description="Router 0's Prometheus metrics port (--prometheus-port)."
    )
    worker_base_port: int = Field(
        default=20100, gt=1024, lt=65000, description="Replica i's simulated worker listens on this + i."
    )
    versions: dict[str, SandboxVersion] = Field(
        default_factory=lambda: {"v1": SandboxVersion()}, description="Simulated releases."
    )
    runtime: bool = Field(
        default=False, description="`sandbox up` also starts etcd, one agent per node and the controllers."
    )
    runtime_base_port: int = Field(
        default=20050,
        gt=1024,
        lt=65000,
        description="etcd client/peer on base, base+1; controller i on base+2+i; Prometheus on base+19; extra router "
        "i on base+20+2i.",
    )
    prometheus: bool = Field(
        default=False,
        description="`sandbox up` also starts a real Prometheus server (on runtime_base_port+19) that scrapes what the "
        "rendered ServiceMonitors describe and evaluates the rendered alert rules every serving.heartbeat_interval_s.",
    )
    nodes_per_process: int | None = Field(
        default=None,
        gt=0,
        description="None: one process per simulated worker and per node agent. N (the scale layout of `sandbox up "
        "--simulate`): the workers of N nodes share one process (one event loop, a loopback control endpoint on "
        "control_base_port + its index) and the agents of the same N nodes another.",
    )
    control_base_port: int = Field(
        default=20040,
        gt=1024,
        lt=65000,
        description="The scale layout's worker processes: process i's control endpoint (restart or stop one port, "
        "request counts) on this + i.",
    )
