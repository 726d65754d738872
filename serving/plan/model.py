"""The plan's value types: one immutable :class:`Plan` and the figures in it, and the :class:`Fleet` a command works
on (a stack's name, spec and plan).

Renderers, policies and rollout backends import these types only; the functions that compute them
live in :mod:`serving.plan.planner`, called by the stack loader alone (:func:`serving.plan.loader.load_fleet`;
import- and call-walking tests keep it that way). Units: bytes, seconds and messages per second; GB means 10^9
bytes, GiB 2^30.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from serving.spec.schema import GB, GIB, FleetSpec, Node

MemoryModel = Literal["sglang", "source"]
MEMORY_MODELS: tuple[MemoryModel, ...] = ("sglang", "source")

# The source's link-rate → expected GPU utilisation table (§3.3), Gb/s → (low, high) fraction.
UTILISATION_BY_LINK_GBPS: tuple[tuple[int, float, float, str], ...] = (
    (25, 0.15, 0.25, "data parallel only"),
    (100, 0.45, 0.60, "small tensor parallel"),
    (200, 0.65, 0.80, "tensor + pipeline parallel"),
    (400, 0.80, 0.92, "all strategies"),
)


def utilisation_band(link_rate_gbps: float) -> tuple[float, float, str]:
    """The source's table: the band of the fastest listed rate not above the link rate."""
    band = (
        0.0,
        UTILISATION_BY_LINK_GBPS[0][1],
        f"below {UTILISATION_BY_LINK_GBPS[0][0]} Gb/s: not in the source's table",
    )
    for rate, lo, hi, note in UTILISATION_BY_LINK_GBPS:
        if link_rate_gbps >= rate:
            band = (lo, hi, f"≥ {rate} Gb/s: {note}")
    return band


HOURS_PER_MONTH = 730.0  # 8,760 h / 12

# Where a sandbox stack's simulated workers (and every other sandbox listener) serve.
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Figure:
    """One computed number, its unit and the formula (with the numbers put in) that produced it."""

    value: float
    unit: str
    formula: str

    def __float__(self) -> float:
        return float(self.value)


def fmt_bytes(n: float) -> str:
    return f"{n / GB:,.2f} GB"


def fmt_gib(n: float) -> str:
    """Bytes in GiB, the unit of SGLang's own memory arithmetic (its logs and ``--mem-fraction-static``)."""
    return f"{n / GIB:,.2f} GiB"


@dataclass(frozen=True)
class MemoryPlan:
    """Per-GPU memory of one replica. ``model`` says which arithmetic produced it: ``sglang`` (the pinned
    SGLang's own, :mod:`serving.plan.memory`) or ``source`` (the source plan's heuristic budget)."""

    model: MemoryModel
    weights: Figure
    per_gpu: dict[str, Figure]
    usable_per_gpu: Figure
    per_replica_total: Figure
    usable_per_node: Figure
    kv_per_token: Figure
    kv_per_token_per_gpu: Figure
    kv_pool_per_gpu: Figure
    max_concurrent_sequences: Figure
    mem_fraction_static: Figure
    max_total_tokens: Figure
    free_at_start: Figure | None = None
    """What each GPU has free once the CUDA context and NCCL are up (SGLang's arithmetic only)."""
    load_peak_per_gpu: Figure | None = None
    """Online FP8 only: the fullest stage's GPU while SGLang loads the 16-bit checkpoint and quantises it."""


@dataclass(frozen=True)
class Placement:
    gpus_per_node: int
    gpus_per_replica: int
    max_replicas_per_node: int
    nodes_per_replica: int
    replicas_per_node: int | None
    tp_crosses_nodes: bool
    pp_crosses_nodes: bool
    nodes: int
    max_replicas: int
    replicas: int
    nodes_used: int
    formula: str


@dataclass(frozen=True)
class Endpoint:
    """Where a replica's HTTP server answers: its first node's address and its ``port``, or, in a sandbox stack,
    its simulated worker on loopback (``sandbox.worker_base_port`` + the replica's index)."""

    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass(frozen=True)
class Replica:
    """One SGLang server of the fleet, where it runs and which update group it belongs to. ``port`` is the
    server's ``--port`` on its node; ``endpoint`` is where routers, agents and the updater reach it."""

    id: str
    index: int
    nodes: tuple[Node, ...]
    gpu_ids: tuple[int, ...]
    group: int
    port: int
    endpoint: Endpoint

    @property
    def node(self) -> Node:
        return self.nodes[0]

    @property
    def url(self) -> str:
        """The URL the routers know this replica by."""
        return self.endpoint.url


@dataclass(frozen=True)
class CapacityChain:
    per_replica_concurrency: Figure
    raw: Figure
    balanced: Figure
    after_reserve: Figure
    sustained: Figure
    requests_per_second: Figure


@dataclass(frozen=True)
class HeartbeatPlan:
    direct_per_interval: Figure
    aggregated_per_interval: Figure
    direct_per_s: Figure
    aggregated_per_s: Figure
    central_limit_per_s: Figure
    active_per_s: Figure
    failure_detection_s: Figure
    recovery_s: Figure
    timeouts_to_stop_routing: Figure
    timeouts_to_migrate: Figure
    successes_to_readmit: Figure
    router_hung_capacity: Figure  # workers that may hang at once before one router's health checks queue
    request_timeout_s: Figure  # the routers' --request-timeout-secs: the longest generation the spec allows
    # the weighted load the controller sheds on, as production's signals make it (no DCGM exporter is rendered)
    shed_load_ceiling: Figure


@dataclass(frozen=True)
class NetworkPlan:
    source_allreduce_per_layer: Figure
    source_allreduce_per_forward: Figure
    tp_allreduce_per_forward: Figure
    fabric_bytes_per_forward: Figure
    fabric_time_per_forward_s: Figure
    utilisation_band: tuple[float, float, str]
    utilisation_formula: str


@dataclass(frozen=True)
class CostPlan:
    currency: str
    nodes_low: Figure
    nodes_high: Figure
    network_low: Figure
    network_high: Figure
    hardware_low: Figure
    hardware_high: Figure
    power_kw: Figure
    electricity_month_low: Figure
    electricity_month_high: Figure
    node_failures_per_month: Figure


@dataclass(frozen=True)
class Plan:
    """Everything the planner derives from one spec, computed once by :func:`serving.plan.planner.plan` when a
    command loads its stack (:func:`serving.plan.loader.load_fleet`).

    Renderers, policies and rollout backends take it inside a :class:`Fleet` and never call the planner: one
    rollout step re-renders the fleet with other versions, and versions change nothing here.
    """

    placement: Placement
    memory: MemoryPlan
    capacity: CapacityChain
    heartbeats: HeartbeatPlan
    network: NetworkPlan
    cost: CostPlan
    restart_from_cache_s: Figure
    rollout_group_sizes: list[int]
    replicas: tuple[Replica, ...] = field(repr=False)
    """The replica inventory in placement order (node by node), at most what the nodes hold."""
    rollout_groups: tuple[tuple[int, ...], ...] = field(repr=False)
    """Replica indices of each update group (round-robin over the placement order)."""
    notes: list[str] = field(default_factory=list)

    @property
    def multi_node(self) -> bool:
        """A replica spans more than one node (one pod per node: a LeaderWorkerSet group)."""
        return self.placement.nodes_per_replica > 1


@dataclass(frozen=True)
class Fleet:
    """One stack as a command works on it: its name, its spec and the plan computed from that spec once, by the
    stack loader (:func:`serving.plan.loader.load_fleet`). Renderers, backends, policies and the Pulumi program take
    this value (or the one part they need); none plans again."""

    name: str
    spec: FleetSpec
    plan: Plan
