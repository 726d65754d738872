"""The ``exaserve`` typer app and its command table.

Each command module does ``from serving.cli.options import app`` and decorates its commands. :data:`COMMANDS` names
every top-level command, the module that defines it and the help ``exaserve --help`` lists for it, so that the top
level never imports a command module: ``--help`` lists the table (no spec, planner, Pulumi, torch or aiohttp loaded),
and a command imports its own module when it is resolved to run (:class:`LazyGroup`). tests/test_cli_startup.py
checks the table against the real commands. Add a line per new command.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup


@dataclass(frozen=True)
class Entry:
    module: str  # serving.cli.<module> defines the command
    help: str  # the first paragraph of the command's help, as `exaserve --help` lists it


COMMANDS: dict[str, Entry] = {
    "plan": Entry(
        "plancmd", "Compute the capacity plan and check it against the rules. Exit 1 on any error-level violation."
    ),
    "fit": Entry(
        "fit",
        "Enumerate the layouts (precision, KV dtype, TP, PP, attention DP, EP, replicas per node) that serve a model "
        "on the cluster by SGLang's memory arithmetic, ranked by the output tokens a second the fleet makes at the "
        "load (every replica running what --max-running-requests and its KV pool allow; a decode step's roofline, "
        "docs/planner.md). Exit 1 when none meets the target. The stack (default prod) gives the cluster, the limits "
        "and the base for --write-stack.",
    ),
    "audit-source": Entry(
        "plancmd",
        "Recompute the source plan's own figures and say which are right, wrong or misleading, with the math.",
    ),
    "schema": Entry("plancmd", "Print the JSON Schema of the fleet spec (the exaserve: keys of a stack), for editors."),
    "render": Entry(
        "infra",
        "Render every Kubernetes object of the stack (the Pulumi program under mocks) to YAML + index.json, and the "
        "bare-metal units (systemd unit per replica, router argv/env, chrony.conf) to DIR/units/.",
    ),
    "check": Entry("infra", "Run the CrossGuard policy pack's rules on the stack offline. Exit 1 on any violation."),
    "diff": Entry(
        "infra",
        "Objects added, removed and changed (with fields, SGLang and router flags by name) and capacity deltas "
        "between --base and the working tree. A --stack-file must lie in the repository: it is compared with its own "
        "copy at --base.",
    ),
    "image": Entry(
        "infra",
        "Where the stack's controllers and agents pull runtime.image from: its repository through "
        "kubernetes.image_registry, as `render` writes it, which is where the image workflow pushes (with --tag, that "
        "tag). With --digest: the runtime.image value that pins the pushed image (the mirror is added at render).",
    ),
    "units": Entry(
        "unitscmd", "Print one replica's systemd unit, command and environment, or (--router) the router's command."
    ),
    "preflight": Entry(
        "preflight", "Check every node against the spec (ansible/preflight.yml). Exit 1 when any node fails."
    ),
    "fleet": Entry("fleet", "Act on every node of the fleet at once over SSH."),
    "sandbox": Entry("sandbox", "The local sandbox: the real SGLang router in front of simulated SGLang workers."),
    "rollout": Entry(
        "rollout",
        "Roll the fleet to a new version in rollout.batches batches with metric gates; roll back on a breach. Plans "
        "from what each replica runs: replicas already on the version are left alone.",
    ),
    "rollback": Entry(
        "rollout",
        "Return the fleet to the last stable version: undo an unfinished or paused rollout, or bring every replica "
        "that runs something else back to the version the journal's last rollout started from (a completed one is "
        "reverted), batch by batch with the same drain discipline.",
    ),
    "history": Entry(
        "rollout",
        "Every rollout, rollback and revert of the stack from its journals, oldest first: when, from and to which "
        "version, the outcome, the batches that passed, client errors and the reason of a pause or rollback.",
    ),
    "controller": Entry("runtime", "The fleet controller (one of scheduler.instances, one leader)."),
    "agent": Entry("runtime", "The node agent: one batched report per node per heartbeat."),
    "status": Entry(
        "runtime",
        "Replicas as every router instance routes them (routes, unhealthy, absent, unknown), beside the "
        "controllers' view: state, score, rotation and load, the version each runs as its backend observes it, the "
        "leader, each node's last report.",
    ),
    "drill": Entry(
        "drill",
        "Fault drills. --scenario NAME runs one against the running sandbox under bounded client load: "
        "inject, watch, heal, measure detection, recovery, restoration and client errors against the plan's "
        "targets, check the alerts in the sandbox's Prometheus, and write drill.json and a timeline.png "
        "(--report DIR). --list names the scenarios with the plan's targets (and their formulas) and the "
        "alerts that must fire or stay quiet; --render-only --out DIR writes them as Chaos Mesh experiments "
        "(one file per scenario, applied on its own) and a Schedule for the regular drills (drills.schedule, "
        "drills.scheduled), each object validated against the pinned Chaos Mesh CRDs. --judge order asks what "
        "happened and in what order instead of how long each step took (CI on a shared machine). Exit 1 when "
        "a drill misses a target (or, judged by order, an event or its order) or an object fails validation, "
        "2 on bad input, 3 when a drill judged on targets is invalid: its probes of the fleet came further "
        "apart than max(3 x the probe period, the period + 1 s), or a time was over its target only by what "
        "the probes cannot resolve, so it is not judged (docs/drills.md).",
    ),
}


def register(command: str | None = None) -> None:
    """Import the module that defines ``command`` (every command module when None)."""
    modules = [COMMANDS[command].module] if command is not None else sorted({e.module for e in COMMANDS.values()})
    for module in modules:
        importlib.import_module(f"serving.cli.{module}")


class _Listed(TyperCommand):
    """A command of :data:`COMMANDS` whose module is not imported: its name and help, for listings only."""


class LazyGroup(TyperGroup):
    """The top-level group: every command of :data:`COMMANDS` in the table's order, listed from the table until its
    module is imported, which :meth:`resolve_command` does for the command being run."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        built = dict(self.commands)
        listed = {
            name: built.pop(name) if name in built else _Listed(name, help=entry.help)
            for name, entry in COMMANDS.items()
        }
        self.commands = {**listed, **built}

    # ctx: the Context of the click typer runs on (its own copy in recent typer), hence Any
    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[str | None, Any, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if isinstance(command, _Listed) and name is not None:
            register(name)
            group = typer.main.get_command(app)
            assert isinstance(group, TyperGroup)
            command = self.commands[name] = group.commands[name]
        return name, command, rest


app = typer.Typer(
    name="exaserve",
    cls=LazyGroup,
    help="ExaServe deploy: plan, render, check, preflight and roll out an SGLang serving fleet.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version  # noqa: PLC0415 - its import costs more than the rest of --version

        typer.echo(f"exaserve {version('exaserve-deploy')}")
        raise typer.Exit


@app.callback()
def _top_level(
    version: Annotated[
        bool, typer.Option("--version", help="Print the version and exit.", callback=_print_version, is_eager=True)
    ] = False,
) -> None:
    """The options before the command (only --version)."""
