"""``exaserve units``: one replica's systemd unit, command and environment, or the router's command.

Every command line printed here has passed the pinned parser check in :mod:`serving.render.sglang` and
:mod:`serving.render.router`; a flag the pinned SGLang or router version does not know exits 1 naming the flag
and the version (:func:`serving.cli.options.render_errors`, as for ``render`` and ``check``).
"""

from __future__ import annotations

import difflib
import shlex
from collections.abc import Mapping, Sequence
from typing import Annotated

import typer

from serving.cli.options import (
    DEFAULT_STACK,
    JsonOpt,
    StackFileOpt,
    StackOpt,
    app,
    emit_json,
    fail,
    render_errors,
    resolve_stack,
)
from serving.plan.loader import load_fleet
from serving.plan.model import Replica
from serving.render.router import router_args, router_env
from serving.render.sglang import server_argv, server_env
from serving.render.systemd import systemd_unit, unit_name

ReplicaOpt = Annotated[
    str | None, typer.Option("--replica", "-r", help="Replica id, e.g. gpu-r00-n00-s0 (see `exaserve plan`).")
]
NodeRankOpt = Annotated[
    int, typer.Option("--node-rank", min=0, help="Node of a multi-node replica (0 = the one serving HTTP).")
]
RouterOpt = Annotated[bool, typer.Option("--router", help="The SGLang router (gateway) instead of a replica.")]
KubernetesOpt = Annotated[
    bool, typer.Option("--kubernetes", help="Router: Kubernetes service discovery instead of static worker URLs.")
]


def _find(replicas: Sequence[Replica], replica_id: str) -> Replica:
    for r in replicas:
        if r.id == replica_id:
            return r
    ids = [r.id for r in replicas]
    close = difflib.get_close_matches(replica_id, ids, n=5, cutoff=0.5)
    hint = f"closest: {', '.join(close)}" if close else f"ids run {ids[0]} … {ids[-1]}"
    fail(f"--replica {replica_id!r}: no such replica among the stack's {len(ids):,}; {hint}")


def _env_lines(env: Mapping[str, str]) -> str:
    return "\n".join(f"{k}={shlex.quote(v)}" for k, v in env.items())


def _text(sections: Mapping[str, str]) -> None:
    for title, body in sections.items():
        typer.echo(f"# {title}\n{body.rstrip()}\n")


@app.command()
def units(
    stack: StackOpt = DEFAULT_STACK,
    stack_file: StackFileOpt = None,
    replica: ReplicaOpt = None,
    node_rank: NodeRankOpt = 0,
    router: RouterOpt = False,
    kubernetes: KubernetesOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Print one replica's systemd unit, command and environment, or (--router) the router's command."""
    if router == (replica is not None):
        fail("give exactly one of --replica ID or --router")
    if kubernetes and not router:
        fail("--kubernetes applies to --router only")
    st = resolve_stack(stack, stack_file)
    spec = st.spec
    with render_errors(st.path):
        fleet = load_fleet(st.name, spec)
        if replica is None:  # --router
            argv = router_args(fleet, kubernetes=kubernetes).to_argv()
            env = router_env(spec)
            if as_json:
                emit_json({"argv": argv, "env": env}, stack=st.name, ok=True)
            else:
                _text({"router command": shlex.join(argv), "environment": _env_lines(env)})
            return
        rep = _find(fleet.plan.replicas, replica)
        argv = server_argv(fleet, rep, node_rank)
        env = server_env(fleet, rep, node_rank)
        unit = systemd_unit(fleet, rep, node_rank)
    if as_json:
        emit_json({"replica": rep.id, "argv": argv, "env": env, "systemd_unit": unit}, stack=st.name, ok=True)
    else:
        _text(
            {
                f"systemd unit {unit_name(rep, node_rank)}": unit,
                "command": shlex.join(argv),
                "environment": _env_lines(env),
            }
        )
