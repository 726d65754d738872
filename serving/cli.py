"""The ``exaserve`` command line: ``plan`` and ``schema`` here, other commands in ``serving.commands``.

See :mod:`serving.cliutil` for the exit codes every command follows.
"""

from __future__ import annotations

import sys

import typer

from serving import planner, report, rules
from serving.cliutil import (
    DEFAULT_STACK,
    EXIT_PROBLEM,
    JsonOpt,
    StackFileOpt,
    StackOpt,
    app,
    console,
    emit_json,
    err_console,
    resolve_stack,
)
from serving.spec import json_schema


@app.command()
def plan(stack: StackOpt = DEFAULT_STACK, stack_file: StackFileOpt = None, as_json: JsonOpt = False) -> None:
    """Compute the capacity plan and check it against the rules. Exit 1 on any error-level violation."""
    st = resolve_stack(stack, stack_file)
    pl = planner.plan(st.spec)
    violations = rules.check(st.spec, pl)
    if as_json:
        emit_json(report.plan_json(st, pl, violations))
    else:
        report.print_plan(console, st, pl, violations)
    if any(v.severity == "error" for v in violations):
        raise typer.Exit(EXIT_PROBLEM)


@app.command()
def schema() -> None:
    """Print the JSON Schema of the fleet spec (the exaserve: keys of a stack), for editors."""
    emit_json(json_schema())


def _register_commands() -> None:
    """Import the command modules; each registers its commands on ``app``."""
    import serving.commands  # noqa: F401, PLC0415


def main() -> None:
    _register_commands()
    try:
        app()
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
