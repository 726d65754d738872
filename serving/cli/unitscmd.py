"""``exaserve units``: one replica's systemd unit, command and environment, or the router's command.

Every command line printed here has passed the pinned parser check in :mod:`serving.render.units`; a flag
the pinned SGLang or router version does not know exits 1 naming the flag and the version.
"""

from __future__ import annotations

import difflib
import shlex
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Annotated

import typer

from serving.checks.flags import FlagValidationError, ManifestError
from serving.cli.options import (
    DEFAULT_STACK,
    EXIT_BAD_INPUT,
    EXIT_PROBLEM,
    JsonOpt,
    StackFileOpt,
    StackOpt,
    app,
    emit_json,
    fail,
    resolve_stack,
)
from serving.plan.planner import Replica, fleet_replicas
from serving.render import units as render

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


@contextmanager
def _render_errors() -> Iterator[None]:
    """Rendering problems become exit codes: 2 for a spec that cannot be rendered, 1 for a command
    line the pinned parser would reject (or a broken manifest)."""
    try:
        yield
    except render.RenderError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    except (FlagValidationError, ManifestError) as exc:
        fail(str(exc), EXIT_PROBLEM)


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
    spec = resolve_stack(stack, stack_file).spec
    with _render_errors():
        if replica is None:  # --router
            argv = render.router_argv(spec, kubernetes=kubernetes)
            env = render.router_env(spec)
            if as_json:
                emit_json({"argv": argv, "env": env})
            else:
                _text({"router command": shlex.join(argv), "environment": _env_lines(env)})
            return
        rep = _find(fleet_replicas(spec), replica)
        argv = render.server_argv(spec, rep, node_rank)
        env = render.server_env(spec, rep, node_rank)
        unit = render.systemd_unit(spec, rep, node_rank)
    if as_json:
        emit_json({"replica": rep.id, "argv": argv, "env": env, "systemd_unit": unit})
    else:
        _text(
            {
                f"systemd unit {render.unit_name(rep, node_rank)}": unit,
                "command": shlex.join(argv),
                "environment": _env_lines(env),
            }
        )
