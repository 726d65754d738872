"""``exaserve sandbox up|down|load``: the local sandbox, the real SGLang router on loopback in front of simulated
SGLang workers, one per replica of a stack with a ``sandbox:`` section; ``rollout`` and ``rollback`` drive it
like a fleet. Exit codes as in :mod:`serving.cli.options`: 1 when the sandbox did not start or the load saw
client errors.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

import httpx
import typer
from rich.table import Table

from serving.cli.options import (
    EXIT_PROBLEM,
    JsonOpt,
    StackFileOpt,
    StackOpt,
    StateDirOpt,
    app,
    console,
    emit_json,
    fail,
    resolve_stack,
)
from serving.cli.state import locked, stack_state
from serving.plan.planner import plan as plan_fleet
from serving.rollout.backends import BackendError
from serving.rollout.journal import StackState
from serving.sandbox.endpoints import sandbox_endpoints
from serving.spec.stack import Stack

SANDBOX_STACK = "sandbox"
sandbox_app = typer.Typer(
    help="The local sandbox: the real SGLang router in front of simulated SGLang workers.", no_args_is_help=True
)
app.add_typer(sandbox_app, name="sandbox")


@sandbox_app.command("up")
def sandbox_up(
    stack: StackOpt = SANDBOX_STACK,
    stack_file: StackFileOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Start the real router on loopback and one simulated worker per replica at the stack's version; with
    sandbox.runtime the runtime layer, with sandbox.prometheus a real Prometheus server (started last)."""
    st = resolve_stack(stack, stack_file)
    if st.spec.sandbox is None:
        fail(f"stack {st.name!r} has no sandbox: section; `exaserve sandbox` runs only sandbox stacks")
    from serving.sandbox import processes  # noqa: PLC0415 - loads the router launcher (≈ 1 s): on use only
    from serving.sandbox.prometheus import prometheus_url  # noqa: PLC0415

    paths = stack_state(st, state_dir)
    with locked(paths, "sandbox up"):
        processes.stop_all(processes.StateDir(paths.sandbox_dir))
        try:
            urls, runtime = asyncio.run(_start_sandbox(st, paths))
        except (processes.SandboxError, BackendError, TimeoutError) as exc:
            processes.stop_all(processes.StateDir(paths.sandbox_dir))
            fail(f"sandbox did not start: {exc}", EXIT_PROBLEM)
    ep = sandbox_endpoints(st.spec)
    prom_url = prometheus_url(st.spec) if st.spec.sandbox.prometheus else None
    if as_json:
        doc = {"router_url": ep.router_url, "metrics_url": ep.metrics_url, "workers": urls}
        if runtime:
            doc["runtime"] = runtime
        if prom_url:
            doc["prometheus_url"] = prom_url
        emit_json(doc, stack=st.name, ok=True)
        return
    table = Table(title=f"sandbox {st.name}: router {ep.router_url} (metrics {ep.metrics_url})")
    for col in ("replica", "url", "version"):
        table.add_column(col)
    for rid, (url, version) in urls.items():
        table.add_row(rid, url, version)
    console.print(table)
    if runtime:
        console.print("runtime: " + "; ".join(f"{k} {', '.join(v)}" for k, v in runtime.items()), highlight=False)
    if prom_url:
        console.print(f"prometheus: {prom_url} (alerts: {prom_url}/alerts)", highlight=False)


async def _start_sandbox(
    st: Stack, paths: StackState
) -> tuple[dict[str, tuple[str, str]], dict[str, list[str]] | None]:
    from serving.sandbox import processes  # noqa: PLC0415
    from serving.sandbox.backend import router_flags, worker_config, worker_name  # noqa: PLC0415

    spec = st.spec
    state = processes.StateDir(paths.sandbox_dir)
    budget = spec.serving.startup_budget_s
    out: dict[str, tuple[str, str]] = {}
    configs = []
    fleet_plan = plan_fleet(spec)
    for replica in fleet_plan.replicas:
        cfg = worker_config(spec, replica, spec.group_version(replica.group))
        configs.append(cfg)
        out[replica.id] = (cfg.url, cfg.version)
    await asyncio.gather(
        *(asyncio.to_thread(processes.start_worker, state, worker_name(c.port), c, wait="started") for c in configs)
    )
    deadline = time.monotonic() + budget
    async with httpx.AsyncClient(timeout=1.0) as http:
        pending = {c.url for c in configs if not c.never_ready}
        while pending:
            for url in sorted(pending):
                try:
                    if (await http.get(url + "/health")).status_code == 200:
                        pending.discard(url)
                except httpx.HTTPError:
                    pass
            if pending and time.monotonic() > deadline:
                raise TimeoutError(f"workers {sorted(pending)} not healthy within serving.startup_budget_s={budget:g}")
            await asyncio.sleep(0.1)
    ready = sum(not c.never_ready for c in configs)
    flags = router_flags(spec, fleet_plan, [c.url for c in configs])
    await asyncio.to_thread(processes.start_router, state, flags, healthy_workers=ready, timeout_s=budget)
    runtime = None
    if spec.sandbox is not None and spec.sandbox.runtime:
        from serving.sandbox.runtime import start_runtime  # noqa: PLC0415

        runtime = await asyncio.to_thread(
            start_runtime,
            state,
            spec,
            fleet_plan,
            [c.url for c in configs],
            stack_file=st.path,
            state_dir=paths.root.parent,
            healthy=ready,
            timeout_s=budget,
        )
    if spec.sandbox is not None and spec.sandbox.prometheus:  # last: its first scrapes find everything up
        from serving.sandbox.prometheus import start_prometheus  # noqa: PLC0415

        await asyncio.to_thread(start_prometheus, state, spec, fleet_plan, timeout_s=budget)
    return out, runtime


@sandbox_app.command("down")
def sandbox_down(
    stack: StackOpt = SANDBOX_STACK,
    stack_file: StackFileOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Stop every process of the sandbox (the routers first), Prometheus and the runtime layer included."""
    st = resolve_stack(stack, stack_file)
    paths = stack_state(st, state_dir)
    from serving.sandbox import processes  # noqa: PLC0415

    with locked(paths, "sandbox down"):
        stopped = processes.stop_all(processes.StateDir(paths.sandbox_dir))
    if as_json:
        emit_json({"stopped": stopped}, stack=st.name, ok=True)
    else:
        console.print(f"stopped {len(stopped)} process(es): {', '.join(stopped) or 'none was running'}")


@sandbox_app.command("load")
def sandbox_load(
    stack: StackOpt = SANDBOX_STACK,
    stack_file: StackFileOpt = None,
    rate: Annotated[float, typer.Option("--rate", help="Requests per second, sent at a fixed rate.")] = 50.0,
    duration_s: Annotated[float, typer.Option("--duration-s", help="Seconds to run; bounded.")] = 60.0,
    as_json: JsonOpt = False,
) -> None:
    """Bounded client load on the sandbox router (run it beside a rollout so the gates have traffic).

    Exit 1 when any request failed as a client sees it."""
    from serving.router.loadgen import LoadSpec, run_load_sync  # noqa: PLC0415

    st = resolve_stack(stack, stack_file)
    try:
        spec = LoadSpec(url=sandbox_endpoints(st.spec).router_url, rate_per_s=rate, duration_s=duration_s)
    except ValueError as exc:  # RolloutInputError (no sandbox: section) included
        fail(str(exc))
    report = run_load_sync(spec)
    if as_json:
        emit_json(
            {
                "count": report.count,
                "errors": report.errors,
                "error_rate": report.error_rate,
                "qps": report.qps,
                "p50_s": report.p50_s,
                "p99_s": report.p99_s,
                "status_counts": report.status_counts,
            },
            stack=st.name,
            ok=not report.errors,
        )
    else:
        console.print(report.summary(), highlight=False)
    if report.errors:
        raise typer.Exit(EXIT_PROBLEM)
