"""The rollout plan: which replicas go in which batch, the waits and the gates — pure, from the spec.

Batches are the planner's update groups (:func:`serving.plan.planner.rollout_groups` over
:func:`serving.plan.planner.fleet_replicas`): exactly ``rollout.batches`` batches, every replica once,
striding over the placement order so each batch is spread across racks and nodes. Batch ``i`` is
update group ``i``, the same group the Pulumi program gives its own version. A plan made from what the
fleet runs (:func:`serving.rollout.session.plan_from_fleet`) keeps only the replicas that need the
update: groups left empty are dropped and the rest renumbered in order.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from serving.plan.model import Fleet, MemoryPlan, Plan
from serving.render.common import whole_seconds
from serving.render.router import detection_window_s, router_policy
from serving.rollout.kvpool import KvPlan
from serving.spec.schema import FleetSpec

PlanKind = Literal["rollout", "revert"]


@dataclass(frozen=True)
class Timings:
    """Every configured wait of a rollout, in seconds (from ``rollout:`` and ``serving:``)."""

    baseline_window_s: float
    drain_timeout_s: float
    health_timeout_s: float
    warmup_s: float
    warmup_share: float
    interval_s: float
    health_check_timeout_s: float
    # A warm-up request's bound: the detection window (serving.failure_threshold × serving.heartbeat_interval_s,
    # what the routers' --request-timeout-secs was until it was sized to the longest generation; a warm-up request
    # is short). The name stays for the journals that carry it. Journals written before it bounded warm-up requests
    # by the health-check timeout, which a saturated fleet's P99 can pass.
    request_timeout_s: float = 0.0

    @classmethod
    def from_spec(cls, spec: FleetSpec) -> Timings:
        r, s = spec.rollout, spec.serving
        return cls(
            baseline_window_s=r.baseline_window_s,
            drain_timeout_s=r.drain_timeout_s,
            health_timeout_s=r.health_timeout_s,
            warmup_s=s.warmup_duration_s,
            warmup_share=s.warmup_share,
            interval_s=r.interval_s,
            health_check_timeout_s=s.health_check_timeout_s,
            request_timeout_s=detection_window_s(spec),
        )


@dataclass(frozen=True)
class GateLimits:
    """The source's gates against the pre-update baseline (§4.4), the shortest window whose QPS split is evidence
    about the replicas (:func:`qps_window_min_s`; 0 in journals written before it), and the gates measured but not
    enforced (``rollout.dry_run_gates``: none in journals written before it)."""

    max_qps_drop: float
    max_p99_rise: float
    max_error_rate: float
    qps_window_min_s: float = 0.0
    dry_run: tuple[str, ...] = ()

    @classmethod
    def from_spec(cls, spec: FleetSpec) -> GateLimits:
        r = spec.rollout
        return cls(r.max_qps_drop, r.max_p99_rise, r.max_error_rate, qps_window_min_s(spec), tuple(r.dry_run_gates))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GateLimits:
        return cls(**{**data, "dry_run": tuple(data.get("dry_run", ()))})


def kv_plan(spec: FleetSpec, m: MemoryPlan) -> KvPlan:
    """The planner's KV pool of one replica and its inputs (the plan's memory by SGLang's arithmetic, per GPU of the
    stage SGLang counts) for the canary to check (:mod:`serving.rollout.kvpool`)."""
    gpu = m.per_gpu
    return KvPlan(
        tokens=int(m.max_total_tokens.value),
        kv_bytes_per_token=m.kv_per_token_per_gpu.value,
        weights_bytes=gpu["weights"].value + gpu["load_overhead"].value,
        free_at_start_bytes=gpu["total"].value - gpu["cuda_context"].value,
        mem_fraction_static=m.mem_fraction_static.value,
        max_miss=spec.rollout.max_kv_pool_miss,
    )


LOAD_POLLS_PER_QPS_WINDOW = 2


def qps_window_min_s(spec: FleetSpec) -> float:
    """The shortest soak whose per-replica QPS says something about the replicas rather than the router.

    ``power_of_two`` picks the less loaded of two workers by the loads it polled last (each worker's ``/v1/loads``,
    smg's load monitor, every ``--load-monitor-interval``: ``serving.heartbeat_interval_s`` rounded up to whole
    seconds, :data:`serving.render.router.ROUTER_FLAGS`): between two polls the ranking is fixed, the worker that
    looked busiest gets nothing and the least busy one 2/n of the traffic. Measured in the sandbox (6 replicas,
    60 req/s, 5 s polls): a healthy worker at 0 requests for 4.5 s while a peer served 3× its share. A window must span
    :data:`LOAD_POLLS_PER_QPS_WINDOW` polls for the split to average out; other policies route on the router's own
    in-flight counts (0: any window). The stack loader refuses a soak shorter than this
    (:func:`serving.spec.stack.parse_spec`)."""
    if router_policy(spec) != "power_of_two":
        return 0.0
    return float(LOAD_POLLS_PER_QPS_WINDOW * whole_seconds(spec.serving.heartbeat_interval_s))


def soak_problem(spec: FleetSpec) -> str | None:
    """Why ``rollout.interval_s`` is too short for the QPS gate to judge any batch (None: it is not): a soak of
    ``0 < interval_s <`` :func:`qps_window_min_s` leaves every batch's QPS gate inconclusive (issue 28: 4 of 5
    sandbox batches had it "not judged"). The message names the fields, their values and the three fixes."""
    r, s = spec.rollout, spec.serving
    least = qps_window_min_s(spec)
    if not 0 < r.interval_s < least:
        return None
    poll = whole_seconds(s.heartbeat_interval_s)
    most_poll = math.floor(r.interval_s / LOAD_POLLS_PER_QPS_WINDOW)
    shorter = (
        f"set serving.heartbeat_interval_s to at most {most_poll} (polls every {most_poll} s; it also sets the "
        "health-check cadence and the request timeout, docs/units.md), "
        if most_poll >= 1
        else ""
    )
    return (
        f"shorter than {least:g} s, {LOAD_POLLS_PER_QPS_WINDOW} of the router's load polls: scheduler.strategy "
        f"{spec.scheduler.strategy!r} routes with power_of_two, which polls every worker's /v1/loads every "
        f"{poll} s (serving.heartbeat_interval_s {s.heartbeat_interval_s:g}, rounded up to whole seconds), and within "
        "a poll its split is the router's ranking, not the replicas': no batch's QPS gate could be judged. "
        f"Set rollout.interval_s to at least {least:g}, {shorter}or choose a scheduler.strategy that does not "
        "rank workers by polled loads (round_robin, cache_aware, random)"
    )


@dataclass(frozen=True)
class BatchPlan:
    index: int
    replicas: tuple[str, ...]
    racks: tuple[str, ...]
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class RolloutPlan:
    """Everything the state machine needs; recorded as the first line of the journal.

    ``observed`` is what every replica of the stack ran when the plan was made (None: down or unreachable),
    planned or not: the journal's record of the fleet it started from.
    """

    stack: str
    kind: PlanKind
    from_version: str
    to_version: str
    batches: tuple[BatchPlan, ...]
    timings: Timings
    limits: GateLimits
    observed: Mapping[str, str | None] = field(default_factory=dict)
    kv: KvPlan | None = None  # the pool the canaries are checked against (None in journals written before it)

    @property
    def gated(self) -> bool:
        """A rollout is gated (baseline, warm-up, soak, rollback on breach); a revert to the last
        stable version restores a known-good release with the same drain discipline and no gates."""
        return self.kind == "rollout"

    @property
    def replicas(self) -> tuple[str, ...]:
        return tuple(r for b in self.batches for r in b.replicas)

    def batch(self, index: int) -> BatchPlan:
        return self.batches[index]

    def configured_wait_s(self) -> float:
        """Sum of the waits the plan itself asks for (baseline, warm-ups, soaks), the floor of its
        wall time; drain and health waits are bounds, not waits, and are not included."""
        t = self.timings
        if not self.gated:
            return 0.0
        return t.baseline_window_s + len(self.batches) * (t.warmup_s + t.interval_s)

    def worst_case_s(self) -> float:
        """Upper bound of the forward path: every drain and health wait running to its timeout."""
        t = self.timings
        return self.configured_wait_s() + len(self.batches) * (t.drain_timeout_s + t.health_timeout_s)

    def to_json(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "kind": self.kind,
            "from_version": self.from_version,
            "to_version": self.to_version,
            "batches": [
                {"index": b.index, "replicas": list(b.replicas), "racks": list(b.racks), "nodes": list(b.nodes)}
                for b in self.batches
            ],
            "timings": vars(self.timings),
            "limits": vars(self.limits),
            "observed": dict(self.observed),
            "kv": self.kv.to_json() if self.kv is not None else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RolloutPlan:
        return cls(
            stack=str(data["stack"]),
            kind="revert" if data["kind"] == "revert" else "rollout",
            from_version=str(data["from_version"]),
            to_version=str(data["to_version"]),
            batches=tuple(
                BatchPlan(int(b["index"]), tuple(b["replicas"]), tuple(b["racks"]), tuple(b["nodes"]))
                for b in data["batches"]
            ),
            timings=Timings(**data["timings"]),
            limits=GateLimits.from_json(data["limits"]),
            observed={str(r): None if v is None else str(v) for r, v in data.get("observed", {}).items()},
            kv=KvPlan.from_json(data["kv"]) if data.get("kv") else None,
        )


def plan_batches(fleet_plan: Plan, only: Collection[str] | None = None) -> tuple[BatchPlan, ...]:
    """``rollout.batches`` batches over the fleet's replicas (the plan's update groups), each spread across racks;
    with ``only``, each group keeps just those replicas and groups left empty are dropped (indices stay 0, 1, …)."""
    replicas = fleet_plan.replicas
    out: list[BatchPlan] = []
    for group in fleet_plan.rollout_groups:
        members = [replicas[j] for j in group if only is None or replicas[j].id in only]
        if not members:
            continue
        out.append(
            BatchPlan(
                index=len(out),
                replicas=tuple(r.id for r in members),
                racks=tuple(sorted({r.node.rack for r in members})),
                nodes=tuple(sorted({n.name for r in members for n in r.nodes})),
            )
        )
    return tuple(out)


def plan_rollout(
    fleet: Fleet,
    *,
    from_version: str,
    to_version: str,
    kind: PlanKind = "rollout",
    only: Collection[str] | None = None,
    observed: Mapping[str, str | None] | None = None,
) -> RolloutPlan:
    """The plan over every replica of ``fleet``, or over ``only`` (see :func:`plan_batches`), recording
    ``observed``."""
    return RolloutPlan(
        stack=fleet.name,
        kind=kind,
        from_version=from_version,
        to_version=to_version,
        batches=plan_batches(fleet.plan, only),
        timings=Timings.from_spec(fleet.spec),
        limits=GateLimits.from_spec(fleet.spec),
        observed=dict(observed or {}),
        kv=kv_plan(fleet.spec, fleet.plan.memory),
    )


def warmup_requests(per_replica_qps: float, share: float, duration_s: float, floor: int = 5) -> int:
    """Synthetic warm-up requests per replica: the source's traffic share of one replica's baseline
    load over the warm-up, at least ``floor`` so that even an idle fleet exercises the new version."""
    return max(floor, math.ceil(per_replica_qps * share * duration_s))


def with_group_version(fleet: Fleet, group: int, version: str) -> Fleet:
    """The fleet with update group ``group`` moved to ``version``, its spec validated like the stack file (the
    version must be one of ``serving.releases``); the plan is the same, versions change nothing in it."""
    data = fleet.spec.model_dump()
    data["rollout"]["group_versions"] = {**fleet.spec.rollout.group_versions, group: version}
    return replace(fleet, spec=FleetSpec.model_validate(data))
