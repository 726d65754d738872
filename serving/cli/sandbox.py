"""``exaserve sandbox up|down|load``: the local sandbox, the real SGLang router on loopback in front of simulated
SGLang workers, one per replica of a stack with a ``sandbox:`` section; ``rollout`` and ``rollback`` drive it
like a fleet. ``--simulate`` rehearses any other stack at its own size (``--stack prod``: 2,048 replicas): the
sandbox section is derived from the stack and written as its own stack file (:mod:`serving.sandbox.scale`).
Exit codes as in :mod:`serving.cli.options`: 2 when the machine lacks the file descriptors, memory or (``--simulate``,
measured first) CPU the sandbox needs, 1 when the sandbox did not start or the load saw client errors.
"""

from __future__ import annotations

import asyncio
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from serving.cli.options import (
    EXIT_PROBLEM,
    JsonOpt,
    ProgressLines,
    StackFileOpt,
    StackOpt,
    StateDirOpt,
    app,
    console,
    emit_json,
    err_console,
    fail,
    resolve_stack,
)
from serving.plan.model import Fleet
from serving.rollout.journal import LockedError
from serving.sandbox.endpoints import sandbox_endpoints

if TYPE_CHECKING:
    from serving.router.loadgen import LoadReport, LoadSpec

SANDBOX_STACK = "sandbox"
sandbox_app = typer.Typer(
    help="The local sandbox: the real SGLang router in front of simulated SGLang workers.", no_args_is_help=True
)
app.add_typer(sandbox_app, name="sandbox")
SimulateOpt = Annotated[
    bool,
    typer.Option(
        "--simulate",
        help="Rehearse a stack without a sandbox: section at its own size: its replicas as simulated workers on "
        "loopback (many per process), its routers, controllers and node agents, ports and shortened waits derived "
        "and written to <state-dir>/<stack>-simulated/ (drive it with --stack-file there).",
    ),
]

CpuShareOpt = Annotated[
    float,
    typer.Option(
        "--cpu-share",
        min=0.05,
        max=1.0,
        help="With --simulate: the most of this machine's CPUs the sandbox's steady state may need, from costs "
        "measured here before it starts (the rest is for client load, a rollout's router changes and measuring). "
        "1.0 lets it saturate the machine.",
    ),
]


@sandbox_app.command("up")
def sandbox_up(
    stack: StackOpt = SANDBOX_STACK,
    stack_file: StackFileOpt = None,
    state_dir: StateDirOpt = None,
    simulate: SimulateOpt = False,
    cpu_share: CpuShareOpt = 0.5,
    as_json: JsonOpt = False,
) -> None:
    """Start the real router on loopback and one simulated worker per replica at the stack's version; with
    sandbox.runtime the runtime layer, with sandbox.prometheus a real Prometheus server (started last)."""
    st = resolve_stack(stack, stack_file)
    from serving.sandbox import lifecycle, scale  # noqa: PLC0415 - loads aiohttp, the router launcher
    from serving.sandbox.prometheus import prometheus_url  # noqa: PLC0415

    lines = ProgressLines(err_console, every_s=5.0, on_terminal=True)  # what takes the time, piped or not
    try:
        started = lifecycle.up(st, state_dir, simulate=simulate, cpu_share=cpu_share, note=lines)
    except (lifecycle.SandboxInputError, LockedError) as exc:
        fail(str(exc))
    except lifecycle.SandboxStartError as exc:
        fail(str(exc), EXIT_PROBLEM)
    st, fleet, urls, runtime, need = started.stack, started.fleet, started.workers, started.runtime, started.needs
    assert st.spec.sandbox is not None
    ep = sandbox_endpoints(st.spec)
    prom_url = prometheus_url(st.spec) if st.spec.sandbox.prometheus else None
    if as_json:
        doc = {"router_url": ep.router_url, "metrics_url": ep.metrics_url, "workers": urls}
        if simulate:
            doc["stack_file"] = str(st.path)
        if need.cpu is not None:
            doc["cpu"] = {
                "cores_needed": {k: round(v, 3) for k, v in need.cpu.cores.items()},
                "cores_available": round(need.cpu.available, 2),
                "request_ms": round(need.cpu.costs.request_ms, 4),
                "probe_ms": round(need.cpu.costs.probe_ms, 3),
            }
        if runtime:
            doc["runtime"] = runtime
        if prom_url:
            doc["prometheus_url"] = prom_url
        emit_json(doc, stack=st.name, ok=True)
        return
    console.print(_layout_table(fleet, urls, ep.router_url, ep.metrics_url))
    if runtime:
        console.print("runtime: " + "; ".join(f"{k} {', '.join(v)}" for k, v in runtime.items()), highlight=False)
    if prom_url:
        console.print(f"prometheus: {prom_url} (alerts: {prom_url}/alerts)", highlight=False)
    if need.cpu is not None:
        parts = ", ".join(f"{k} {v:.2f}" for k, v in need.cpu.cores.items())
        console.print(
            f"cpu: the steady state needs about {need.cpu.total:.2f} of the {need.cpu.available:.2f} cores it may use "
            f"({parts})",
            highlight=False,
        )
    if simulate:
        console.print(
            f"stack file: {st.path} (pass --stack-file to rollout, status and sandbox load; sandbox down --stack "
            f"{st.name.removesuffix(scale.SIMULATED_SUFFIX)} --simulate stops it)",
            highlight=False,
        )


def _layout_table(fleet: Fleet, urls: dict[str, tuple[str, str]], router: str, metrics: str) -> Table:
    """One row per worker, or in the scale layout one per worker process (its nodes, ports and control URL)."""
    from serving.sandbox.backend import node_groups  # noqa: PLC0415

    sandbox = fleet.spec.sandbox
    assert sandbox is not None
    table = Table(title=f"sandbox {fleet.name}: router {router} (metrics {metrics})")
    if sandbox.nodes_per_process is None:
        for col in ("replica", "url", "version"):
            table.add_column(col)
        for rid, (url, version) in urls.items():
            table.add_row(rid, url, version)
        return table
    for col in ("worker process", "nodes", "workers (ports)", "control"):
        table.add_column(col)
    for group in node_groups(fleet):
        control = f"http://127.0.0.1:{sandbox.control_base_port + group.index}"
        nodes = f"{group.nodes[0]} … {group.nodes[-1]} ({len(group.nodes)})"
        table.add_row(str(group.index), nodes, f"{len(group.ports)} ({group.ports[0]}-{group.ports[-1]})", control)
    return table


@sandbox_app.command("down")
def sandbox_down(
    stack: StackOpt = SANDBOX_STACK,
    stack_file: StackFileOpt = None,
    state_dir: StateDirOpt = None,
    simulate: SimulateOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Stop every process of the sandbox (the routers first), Prometheus and the runtime layer included; with
    --simulate, of the stack's simulated sandbox."""
    st = resolve_stack(stack, stack_file)
    from serving.sandbox import lifecycle  # noqa: PLC0415

    try:
        name, stopped = lifecycle.down(st, state_dir, simulate=simulate)
    except LockedError as exc:
        fail(str(exc))
    if as_json:
        emit_json({"stopped": stopped}, stack=name, ok=True)
    else:
        console.print(f"stopped {len(stopped)} process(es): {', '.join(stopped) or 'none was running'}")


async def _load(spec: LoadSpec, lines: ProgressLines) -> LoadReport:
    """The bounded load, telling ``lines`` what it has seen so far (piped: a line every 10 s)."""
    from serving.router.loadgen import LoadGenerator  # noqa: PLC0415

    generator = LoadGenerator(spec)
    run = asyncio.create_task(generator.run())
    while not run.done():
        await asyncio.wait({run}, timeout=1.0)
        if not run.done():
            lines(f"load: {generator.report().summary()}")
    return run.result()


class LoadMix(StrEnum):
    production = "production"
    generate = "generate"


@sandbox_app.command("load")
def sandbox_load(
    stack: StackOpt = SANDBOX_STACK,
    stack_file: StackFileOpt = None,
    rate: Annotated[float, typer.Option("--rate", help="Requests per second, sent at a fixed rate.")] = 50.0,
    duration_s: Annotated[float, typer.Option("--duration-s", help="Seconds to run; bounded.")] = 60.0,
    mix: Annotated[
        LoadMix,
        typer.Option(
            "--mix",
            help="production: chat, completions and /generate, streamed and not, short and long (what clients "
            "send; serving.router.loadgen.PRODUCTION_MIX); generate: one short non-streamed /generate each.",
        ),
    ] = LoadMix.production,
    model: Annotated[
        str | None,
        typer.Option("--model", help="The model name every request carries. Default: the stack's model.name."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Bounded client load on the sandbox router (run it beside a rollout so the gates have traffic).

    Every request carries the served model's name (smg in Kubernetes discovery mode refuses one without it). Exit 1
    when any request failed as a client sees it: any status but 2xx, or a stream that did not end in [DONE]."""
    from serving.router.loadgen import PRODUCTION_MIX, LoadSpec  # noqa: PLC0415

    st = resolve_stack(stack, stack_file)
    try:
        spec = LoadSpec(
            url=sandbox_endpoints(st.spec).router_url,
            rate_per_s=rate,
            duration_s=duration_s,
            model=model or st.spec.model.name,
            shapes=PRODUCTION_MIX if mix is LoadMix.production else (),
        )
    except ValueError as exc:  # RolloutInputError (no sandbox: section) included
        fail(str(exc))
    report = asyncio.run(_load(spec, ProgressLines(err_console)))
    if as_json:
        emit_json(report.to_json(), stack=st.name, ok=not report.errors)
    else:
        console.print(report.summary(), highlight=False)
    if report.errors:
        raise typer.Exit(EXIT_PROBLEM)
