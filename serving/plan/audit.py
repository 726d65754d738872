"""The source plan's own figures, recomputed by the planner: right, wrong, or right-for-the-wrong-reason.

Each claim quotes the source's number (MISSION.md, with its section) and recomputes it with the same
pure functions ``exaserve plan`` uses, on the source's own inputs (:data:`SOURCE_PLAN`, package data, for
the cluster and config, plus the 100 B-parameter example of §4.2).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Final, Literal

from serving.plan import planner
from serving.plan.model import HOURS_PER_MONTH
from serving.spec.schema import GB, FleetSpec

# The source document's own configuration as a stack file (`exaserve audit-source`'s default input).
SOURCE_PLAN: Final[Traversable] = files("serving").joinpath("data", "source-plan.yaml")

Verdict = Literal["right", "wrong", "misleading"]


@dataclass(frozen=True)
class Claim:
    section: str
    claim: str
    source_value: str
    computed: str
    verdict: Verdict
    correction: str = ""


def _close(a: float, b: float, tol: float) -> bool:
    return abs(a - b) <= tol * max(abs(a), abs(b))


def audit(source: FleetSpec) -> list[Claim]:
    """Recompute the source's figures from ``source`` (the source's config as a spec)."""
    gpu = source.cluster.gpu
    nodes = source.cluster.node_count
    out: list[Claim] = []

    usable_node = gpu.memory_gb * gpu.usable_memory_fraction * gpu.count_per_node
    out.append(
        Claim(
            "2.1",
            "usable memory per node",
            "544 GB",
            f"{gpu.count_per_node} × {gpu.memory_gb:g} GB × {gpu.usable_memory_fraction:.0%} = {usable_node:g} GB",
            "right" if _close(usable_node, 544, 0.005) else "wrong",
        )
    )

    w100 = planner.weights_bytes(100_000_000_000, 2.0)
    out.append(
        Claim(
            "4.2",
            "100 B parameters in FP16",
            "200 GB",
            w100.formula,
            "right" if _close(w100.value, 200 * GB, 0.005) else "wrong",
        )
    )

    arch = source.model.architecture
    mha = planner.kv_bytes_per_token(arch.model_copy(update={"num_kv_heads": arch.num_attention_heads}), 2)
    gqa = planner.kv_bytes_per_token(arch, 2)
    batch, seq = source.limits.max_running_requests, source.limits.context_length
    kv_src, kv_real = mha.value * seq * batch, gqa.value * seq * batch
    out.append(
        Claim(
            "4.2",
            f"KV cache at batch {batch}, seq {seq}",
            "≈ 86 GB",
            f"{mha.formula} × {seq} × {batch} = {kv_src / GB:.1f} GB",
            "misleading",
            f"{source.model.name} has {arch.num_kv_heads} KV heads (GQA), not {arch.num_attention_heads}: "
            f"{gqa.formula} × {seq} × {batch} = {kv_real / GB:.1f} GB, {kv_src / kv_real:.0f}× less",
        )
    )

    budget = planner.replica_memory_budget(200 * GB, kv_src, 0.15, 5 * GB, source.model.safety_margin)
    out.append(
        Claim(
            "4.2",
            "memory per replica",
            "≈ 369 GB",
            budget["total"].formula,
            "right" if _close(budget["total"].value, 369 * GB, 0.01) else "wrong",
        )
    )

    p = planner.placement(source)
    rpn = source.serving.replicas_per_node or 0
    out.append(
        Claim(
            "4.1",
            f"{source.serving.replicas:,} replicas, {rpn} per node",
            f"{rpn} × {nodes} = {rpn * nodes:,}",
            f"TP {source.parallelism.tp} × PP {source.parallelism.pp} = {p.gpus_per_replica} GPUs per replica; "
            f"{rpn} per node need {rpn * p.gpus_per_replica} GPUs, the node has {p.gpus_per_node}",
            "wrong",
            f"{p.formula}; {source.serving.replicas:,} one-GPU replicas would still need "
            f"{source.serving.replicas:,} GPUs, the cluster has {nodes * p.gpus_per_node:,}",
        )
    )

    lim = source.limits
    chain = planner.capacity_chain(
        lim.p99_concurrency_per_replica,
        source.serving.replicas,
        lim.balance_efficiency,
        lim.failure_reserve,
        lim.burst_buffer,
        lim.mean_request_s,
    )
    out.append(
        Claim(
            "3.2",
            "sustained concurrency",
            "12,288 → 9,830 → 8,847 → ≈ 8,000",
            f"{chain.raw.formula}; {chain.balanced.formula}; {chain.after_reserve.formula}; {chain.sustained.formula}",
            "right" if round(chain.sustained.value, -2) == 8000 else "wrong",
            "only if 3,072 replicas existed; see the placement claim",
        )
    )
    out.append(
        Claim(
            "3.2",
            "requests per second",
            "≈ 5,300",
            chain.requests_per_second.formula,
            "right" if round(chain.requests_per_second.value, -2) == 5300 else "wrong",
        )
    )

    hb = planner.heartbeat_plan(source, source.serving.replicas, nodes)
    out.append(
        Claim(
            "3.4",
            "central scheduler load",
            "256 messages instead of 3,072",
            f"{hb.aggregated_per_interval.formula} vs {hb.direct_per_interval.formula}",
            "misleading",
            f"that is per {source.serving.heartbeat_interval_s:g} s interval; per second {hb.aggregated_per_s.formula} vs "
            f"{hb.direct_per_s.formula}",
        )
    )
    fast = planner.heartbeat_plan(
        source.model_copy(update={"serving": source.serving.model_copy(update={"heartbeat_interval_s": 2.0})}),
        source.serving.replicas,
        nodes,
    )
    ratio = fast.direct_per_s.value / hb.direct_per_s.value
    out.append(
        Claim(
            "2.2",
            "a 2 s interval costs more messages",
            "2.5×",
            f"{hb.direct_per_s.value:g} → {fast.direct_per_s.value:g} msg/s = {ratio:g}×",
            "right" if _close(ratio, 2.5, 1e-9) else "wrong",
        )
    )
    s = source.serving
    naive = s.failure_threshold * s.heartbeat_interval_s
    out.append(
        Claim(
            "2.2",
            "failure detection / recovery",
            f"{naive:g} s / ≈ {naive + s.migration_timeout_s:g} s",
            f"{hb.failure_detection_s.formula}; {hb.recovery_s.formula}",
            "wrong",
            f"the last probe only fails after its {s.health_check_timeout_s:g} s timeout: worst case "
            f"{hb.failure_detection_s.value:g} s / {hb.recovery_s.value:g} s",
        )
    )

    net = planner.network_plan(source)
    out.append(
        Claim(
            "3.3",
            "all-reduce per layer / per forward pass",
            "512 MB / 40 GB",
            f"{net.source_allreduce_per_layer.formula}; {net.source_allreduce_per_forward.formula}",
            "misleading",
            f"MiB and GiB, not MB and GB; Megatron TP all-reduces twice per layer "
            f"({net.tp_allreduce_per_forward.formula}); and with TP × PP inside one node none of it crosses "
            "the fabric",
        )
    )

    cost = planner.cost_plan(source)
    out.append(
        Claim(
            "6.1",
            f"{nodes} nodes at 150–200 k",
            "40–50 M",
            f"{cost.nodes_low.formula}; {cost.nodes_high.formula}",
            "wrong",
            f"{cost.nodes_low.value / 1e6:.1f}–{cost.nodes_high.value / 1e6:.1f} M; with the network at 15–20 % of total "
            f"hardware, {cost.hardware_low.value / 1e6:.1f}–{cost.hardware_high.value / 1e6:.1f} M in all",
        )
    )
    out.append(
        Claim("6.1", "power", "768 kW", cost.power_kw.formula, "right" if cost.power_kw.value == 768 else "wrong")
    )
    kwh = cost.power_kw.value * HOURS_PER_MONTH
    out.append(
        Claim(
            "6.1",
            "electricity a month",
            "400–500 k",
            f"{cost.power_kw.value:g} kW × {HOURS_PER_MONTH:g} h = {kwh:,.0f} kWh",
            "right",
            f"implies a tariff of {400_000 / kwh:.2f}–{500_000 / kwh:.2f} per kWh (industrial rates)",
        )
    )
    out.append(
        Claim(
            "6.3",
            "node failures",
            "≈ 1 a month",
            cost.node_failures_per_month.formula,
            "right" if round(cost.node_failures_per_month.value) == 1 else "wrong",
        )
    )
    sizes = [len(g) for g in planner.rollout_groups(source.serving.replicas, source.rollout.batches)]
    out.append(
        Claim(
            "4.4",
            f"{source.rollout.batches} rollout batches",
            "≈ 614 replicas each",
            f"{source.serving.replicas:,} / {source.rollout.batches} → {sizes}",
            "right" if min(sizes) == 614 else "wrong",
        )
    )
    return out
