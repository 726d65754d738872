"""``exaserve fleet exec``: one read-only probe on every node at once over SSH (paramiko).

    exaserve fleet exec --stack prod -- nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader

Host keys are verified against known_hosts (never auto-added); every node has a connect timeout
and an overall timeout; at most ``--max-parallel`` connections are open at once. Exit 0 when the
command succeeded everywhere, 1 when any node failed, timed out or was unreachable, 2 on bad input.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from serving.cli.options import (
    DEFAULT_KNOWN_HOSTS,
    EXIT_OK,
    EXIT_PROBLEM,
    IdentityOpt,
    JsonOpt,
    KnownHostsOpt,
    SshConfigOpt,
    StackFileOpt,
    StackOpt,
    app,
    console,
    emit_json,
    fail,
    require_file,
    resolve_stack,
)
from serving.remote.fanout import HostResult, Target, fan_out, load_ssh_config
from serving.remote.probes import FanoutError, check_read_only
from serving.render.inventory import limit_nodes, unmatched_limit_patterns

fleet_app = typer.Typer(help="Act on every node of the fleet at once over SSH.", no_args_is_help=True)
app.add_typer(fleet_app, name="fleet")


def result_json(r: HostResult) -> dict[str, object]:
    return {
        "host": r.host,
        "address": r.address,
        "status": r.status,
        "exit_code": r.exit_code,
        "stdout": r.stdout,
        "stderr": r.stderr,
        "error": r.error,
        "seconds": round(r.seconds, 3),
    }


@fleet_app.command("exec", context_settings={"allow_extra_args": True})
def fleet_exec(
    ctx: typer.Context,
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    as_json: JsonOpt = False,
    limit: Annotated[str | None, typer.Option("--limit", "-l", help="Node names or groups (globs allowed).")] = None,
    known_hosts: KnownHostsOpt = DEFAULT_KNOWN_HOSTS,
    identity: IdentityOpt = None,
    ssh_config: SshConfigOpt = None,
    timeout_s: Annotated[
        float, typer.Option("--timeout-s", help="Seconds per node, connect included.", min=0.1)
    ] = 15.0,
    connect_timeout_s: Annotated[float, typer.Option("--connect-timeout-s", help="Seconds to connect.", min=0.1)] = 5.0,
    max_parallel: Annotated[int, typer.Option("--max-parallel", help="Open connections at most.", min=1)] = 64,
) -> None:
    """Run a read-only probe on every node at once; a table (or JSON) of per-node results.

    The probe and its flags go after --, so that an option of this command is never taken for one of the probe's
    (an unknown option before -- exits 2)."""
    argv = list(ctx.args)
    try:
        check_read_only(argv)
    except FanoutError as exc:
        fail(str(exc))
    st = resolve_stack(stack, stack_file)
    require_file(known_hosts, "--known-hosts", "host keys are always verified, pass the fleet's known_hosts")
    require_file(identity, "--identity", "pass an existing private key, or none to use your agent")
    if limit is not None:
        bad = unmatched_limit_patterns(st.spec, limit)
        if bad:
            fail(f"--limit {limit!r}: {', '.join(map(repr, bad))} match no node or group of stack {st.name!r}")
    nodes = limit_nodes(st.spec, limit)
    try:
        config_text = load_ssh_config(ssh_config)
    except FanoutError as exc:
        fail(str(exc))
    results = fan_out(
        [Target.from_node(n) for n in nodes],
        argv,
        known_hosts=known_hosts,
        identity=identity,
        connect_timeout_s=connect_timeout_s,
        timeout_s=timeout_s,
        max_parallel=max_parallel,
        ssh_config=config_text,
    )
    if as_json:
        doc = {"command": argv, "results": [result_json(r) for r in results]}
        emit_json(doc, stack=st.name, ok=all(r.ok for r in results))
    else:
        table = Table(title=f"{' '.join(argv)} on {len(results)} nodes of {st.name}", header_style="bold")
        for col in ("node", "status", "exit", "seconds", "output / error"):
            table.add_column(col, overflow="fold")
        for r in results:
            out = (
                (r.stdout.strip() or r.stderr.strip())
                if r.ok
                else (r.error or "") + (f"\n{r.stderr.strip()}" if r.stderr.strip() else "")
            )
            style = "green" if r.ok else "bold red"
            table.add_row(
                r.host,
                f"[{style}]{r.status}[/]",
                "" if r.exit_code is None else str(r.exit_code),
                f"{r.seconds:.2f}",
                out,
            )
        console.print(table)
        bad_count = sum(not r.ok for r in results)
        console.print(f"{len(results) - bad_count}/{len(results)} nodes ok", style="green" if not bad_count else "red")
    raise typer.Exit(EXIT_OK if all(r.ok for r in results) else EXIT_PROBLEM)
