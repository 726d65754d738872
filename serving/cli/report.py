"""Plan → JSON contract and plan → rich tables; check results → text. Pure: no I/O beyond the console passed in."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from serving.plan.model import Figure, Fleet, fmt_bytes, fmt_gib
from serving.render.k8s import system
from serving.result import CheckResult, Status, failures


def _fig(f: Figure) -> dict[str, Any]:
    return {"value": f.value, "unit": f.unit, "formula": f.formula}


def _section(obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    assert is_dataclass(obj)
    for f in fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, Figure):
            out[f.name] = _fig(v)
        elif isinstance(v, dict):
            out[f.name] = {k: _fig(x) for k, x in v.items()}
        else:
            out[f.name] = v
    return out


def violation_json(result: CheckResult) -> dict[str, Any]:
    """A rule's result in ``plan --json``: the record, plus the names the first contract used (``rule``,
    ``path``, ``severity``: ``error`` or ``warning``), kept so existing consumers read it unchanged."""
    return {
        **result.to_json(),
        "rule": result.check,
        "path": result.subject,
        "severity": "error" if result.status is Status.FAIL else "warning",
    }


def system_pool_json(fleet: Fleet) -> dict[str, Any] | None:
    """The declared system pool and the least size its pods need (``serving.render.k8s.system``); None without one."""
    pool = fleet.spec.cluster.system_pool
    if pool is None:
        return None
    return {
        "nodes": pool.count,
        "min_nodes": system.min_nodes(fleet.spec, pool),
        "cpu_per_node": pool.cpu,
        "memory_gb_per_node": pool.memory_gb,
        "pods": [
            {"name": k.name, "replicas": k.replicas, **k.requests.quantities(), "one_per_node": k.one_per_node}
            for k in system.system_pods(fleet.spec)
        ],
    }


def plan_json(fleet: Fleet, stack_file: Path, violations: Sequence[CheckResult]) -> dict[str, Any]:
    """The ``exaserve plan --json`` contract (documented in the README); ``stack_file`` is the fleet's stack file."""
    plan = fleet.plan
    m, p, hb = plan.memory, plan.placement, plan.heartbeats
    net = _section(plan.network)
    net["utilisation_band"] = {
        "low": plan.network.utilisation_band[0],
        "high": plan.network.utilisation_band[1],
        "note": plan.network.utilisation_band[2],
    }
    return {
        "stack": fleet.name,
        "stack_file": str(stack_file),
        "ok": not failures(violations),
        "violations": [violation_json(v) for v in violations],
        "notes": plan.notes,
        "system_pool": system_pool_json(fleet),
        "capacity": {
            "weights_bytes": m.weights.value,
            "kv_cache_bytes_per_token": m.kv_per_token.value,
            "gpus_per_replica": p.gpus_per_replica,
            "replicas": p.replicas,
            "replicas_per_node": p.replicas_per_node,
            "nodes_per_replica": p.nodes_per_replica,
            "nodes": p.nodes,
            "per_gpu_memory_bytes": {k: f.value for k, f in m.per_gpu.items()},
            "usable_gpu_memory_bytes": m.usable_per_gpu.value,
            "memory_model": m.model,
            "mem_fraction_static": m.mem_fraction_static.value,
            "kv_pool_tokens_per_replica": int(m.max_total_tokens.value),
            "kv_pool_bytes_per_gpu": m.kv_pool_per_gpu.value,
            "max_concurrent_sequences_per_replica": int(m.max_concurrent_sequences.value),
            "sustained_concurrency": round(plan.capacity.sustained.value, 3),
            "requests_per_second": round(plan.capacity.requests_per_second.value, 3),
            "heartbeat_messages_per_second": {"direct": hb.direct_per_s.value, "aggregated": hb.aggregated_per_s.value},
            "failure_detection_s": hb.failure_detection_s.value,
            "recovery_s": hb.recovery_s.value,
            "rollout_group_sizes": plan.rollout_group_sizes,
        },
        "placement": _section(p),
        "memory": _section(m),
        "capacity_chain": _section(plan.capacity),
        "heartbeats": _section(hb),
        "network": net,
        "cost": _section(plan.cost),
        "restart_from_cache_s": _fig(plan.restart_from_cache_s),
    }


def _table(title: str, rows: list[tuple[str, str, str]]) -> Table:
    t = Table(title=title, title_justify="left", show_lines=False, expand=False)
    t.add_column("figure", style="bold")
    t.add_column("value", justify="right")
    t.add_column("how", overflow="fold")
    for r in rows:
        t.add_row(*r)
    return t


_MARK = {
    Status.FAIL: ("✗ fail", "red"),
    Status.WARN: ("! warn", "yellow"),
    Status.PASS: ("✓ pass", "green"),
    Status.SKIP: ("- skip", "dim"),
}


def print_results(console: Console, results: Sequence[CheckResult]) -> None:
    """Each result as a block: status, check and subject on one line, then observed, expected and fix.

    Blocks rather than a table: observed values and fixes are sentences, which table cells would fold into
    narrow columns; each block line stays whole (and greppable) however wide the terminal is."""
    for r in results:
        mark, style = _MARK[r.status]
        head = Text.assemble((mark, style), " ", (f"[{r.check}]", "bold"))
        if r.subject:
            head.append(f" {r.subject}", "cyan")
        console.print(head, soft_wrap=True)
        for label, value in (("observed", r.observed), ("expected", r.expected), ("fix", r.fix)):
            if value:
                console.print(Text(f"    {label + ':':<9} {value}"), soft_wrap=True)


def print_plan(console: Console, fleet: Fleet, stack_file: Path, violations: Sequence[CheckResult]) -> None:
    spec, plan = fleet.spec, fleet.plan
    p, m, c, hb, n, cost = plan.placement, plan.memory, plan.capacity, plan.heartbeats, plan.network, plan.cost
    console.print(
        f"[bold]ExaServe plan[/] — stack [cyan]{fleet.name}[/] ({stack_file.name}): {spec.model.name} "
        f"{spec.model.precision.value}, TP {spec.parallelism.tp} × PP {spec.parallelism.pp} × DP {spec.parallelism.dp}"
        + (f" (attention DP {spec.parallelism.attn_dp})" if spec.parallelism.attn_dp > 1 else "")
        + ", "
        f"{p.nodes} nodes × {p.gpus_per_node} GPUs"
    )
    console.print(
        _table(
            "Placement",
            [
                (
                    "GPUs per replica",
                    str(p.gpus_per_replica),
                    f"TP {spec.parallelism.tp} × PP {spec.parallelism.pp} × DP {spec.parallelism.dp}",
                ),
                (
                    "replicas per node",
                    str(p.replicas_per_node if p.replicas_per_node is not None else "—"),
                    f"max {p.max_replicas_per_node}",
                ),
                (
                    "nodes per replica",
                    str(p.nodes_per_replica),
                    "TP crosses nodes"
                    if p.tp_crosses_nodes
                    else ("PP crosses nodes" if p.pp_crosses_nodes else "fits in one node"),
                ),
                ("replicas", f"{p.replicas:,}", f"cluster holds {p.max_replicas:,}: {p.formula}"),
                (
                    "rollout groups",
                    " / ".join(str(s) for s in plan.rollout_group_sizes),
                    f"{spec.rollout.batches} batches, each spread over all racks",
                ),
            ],
        )
    )
    size = fmt_gib if m.model == "sglang" else fmt_bytes  # one unit per figure: the one its formula works in
    console.print(
        _table(
            f"Memory per GPU ({'SGLang 0.5.23 arithmetic' if m.model == 'sglang' else 'source heuristic'})",
            [
                *((k.replace("_", " "), size(f.value), f.formula) for k, f in m.per_gpu.items()),
                ("usable", size(m.usable_per_gpu.value), m.usable_per_gpu.formula),
                ("per replica", size(m.per_replica_total.value), m.per_replica_total.formula),
                ("KV bytes / token", f"{m.kv_per_token.value:,.0f} B", m.kv_per_token.formula),
                ("KV pool / GPU", size(m.kv_pool_per_gpu.value), m.kv_pool_per_gpu.formula),
                ("KV pool tokens", f"{int(m.max_total_tokens.value):,}", m.max_total_tokens.formula),
                ("max sequences", f"{int(m.max_concurrent_sequences.value):,}", m.max_concurrent_sequences.formula),
                ("mem-fraction-static", f"{m.mem_fraction_static.value:.3f}", m.mem_fraction_static.formula),
            ],
        )
    )
    console.print(
        _table(
            "Capacity chain",
            [
                ("per replica", f"{c.per_replica_concurrency.value:,.0f}", c.per_replica_concurrency.formula),
                ("raw", f"{c.raw.value:,.0f}", c.raw.formula),
                ("balanced", f"{c.balanced.value:,.0f}", c.balanced.formula),
                ("after reserve", f"{c.after_reserve.value:,.0f}", c.after_reserve.formula),
                ("sustained", f"{c.sustained.value:,.0f}", c.sustained.formula),
                ("requests / s", f"{c.requests_per_second.value:,.0f}", c.requests_per_second.formula),
            ],
        )
    )
    console.print(
        _table(
            "Heartbeats and recovery",
            [
                (
                    "direct",
                    f"{hb.direct_per_s.value:,.1f} msg/s",
                    f"{hb.direct_per_interval.formula}; {hb.direct_per_s.formula}",
                ),
                (
                    "aggregated",
                    f"{hb.aggregated_per_s.value:,.1f} msg/s",
                    f"{hb.aggregated_per_interval.formula}; {hb.aggregated_per_s.formula}",
                ),
                ("central limit", f"{hb.central_limit_per_s.value:,.1f} msg/s", hb.central_limit_per_s.formula),
                ("in use", f"{hb.active_per_s.value:,.1f} msg/s", hb.active_per_s.formula),
                ("failure detection", f"{hb.failure_detection_s.value:g} s", hb.failure_detection_s.formula),
                ("recovery", f"{hb.recovery_s.value:g} s", hb.recovery_s.formula),
                (
                    "routers' checks: hung at once",
                    f"{hb.router_hung_capacity.value:,.0f}",
                    hb.router_hung_capacity.formula,
                ),
                ("restart from cache", f"{plan.restart_from_cache_s.value:.1f} s", plan.restart_from_cache_s.formula),
                ("router request timeout", f"{hb.request_timeout_s.value:,.0f} s", hb.request_timeout_s.formula),
                ("shed load, at most", f"{hb.shed_load_ceiling.value:g}", hb.shed_load_ceiling.formula),
                ("score: stop routing", f"{hb.timeouts_to_stop_routing.value:g}", hb.timeouts_to_stop_routing.formula),
                ("score: migrate", f"{hb.timeouts_to_migrate.value:g}", hb.timeouts_to_migrate.formula),
            ],
        )
    )
    console.print(
        _table(
            "Network",
            [
                (
                    "source all-reduce / layer",
                    f"{n.source_allreduce_per_layer.value / 2**20:,.0f} MiB",
                    n.source_allreduce_per_layer.formula,
                ),
                (
                    "source all-reduce / pass",
                    f"{n.source_allreduce_per_forward.value / 2**30:,.1f} GiB",
                    n.source_allreduce_per_forward.formula,
                ),
                (
                    "TP all-reduce / pass",
                    f"{n.tp_allreduce_per_forward.value / 2**30:,.1f} GiB",
                    n.tp_allreduce_per_forward.formula,
                ),
                (
                    "fabric bytes / pass",
                    fmt_bytes(n.fabric_bytes_per_forward.value),
                    n.fabric_bytes_per_forward.formula,
                ),
                (
                    "fabric time / pass",
                    f"{n.fabric_time_per_forward_s.value * 1e3:,.1f} ms",
                    n.fabric_time_per_forward_s.formula,
                ),
                ("GPU utilisation", f"{n.utilisation_band[0]:.0%}–{n.utilisation_band[1]:.0%}", n.utilisation_formula),
            ],
        )
    )
    cur = cost.currency
    console.print(
        _table(
            f"Cost ({cur})",
            [
                (
                    "nodes",
                    f"{cost.nodes_low.value:,.0f}–{cost.nodes_high.value:,.0f}",
                    f"{cost.nodes_low.formula}; {cost.nodes_high.formula}",
                ),
                ("network", f"{cost.network_low.value:,.0f}–{cost.network_high.value:,.0f}", cost.network_low.formula),
                (
                    "hardware",
                    f"{cost.hardware_low.value:,.0f}–{cost.hardware_high.value:,.0f}",
                    cost.hardware_high.formula,
                ),
                ("power", f"{cost.power_kw.value:,.0f} kW", cost.power_kw.formula),
                (
                    "electricity / month",
                    f"{cost.electricity_month_low.value:,.0f}–{cost.electricity_month_high.value:,.0f}",
                    cost.electricity_month_high.formula,
                ),
                (
                    "node failures / month",
                    f"{cost.node_failures_per_month.value:.2f}",
                    cost.node_failures_per_month.formula,
                ),
            ],
        )
    )
    for note in plan.notes:
        console.print(f"[yellow]note:[/] {note}")
    if (pool := system_pool_json(fleet)) is not None:
        pods = ", ".join(
            f"{k['replicas']} × {k['name']} ({k['cpu']} CPU, {k['memory']}{', one per node' if k['one_per_node'] else ''})"
            for k in pool["pods"]
        )
        need = pool["min_nodes"] if pool["min_nodes"] is not None else "none fit"
        console.print(
            f"system pool: {pool['nodes']} nodes of {pool['cpu_per_node']:g} CPU, {pool['memory_gb_per_node']:g} GB; "
            f"least {need} for {pods}",
            highlight=False,
            soft_wrap=True,
        )
    if violations:
        console.print("[bold]Violations[/]")
        print_results(console, violations)
    errors = len(failures(violations))
    console.print("[green]plan OK[/]" if not errors else f"[red]plan rejected: {errors} error(s)[/]")
