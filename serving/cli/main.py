"""The ``exaserve`` command line: ``plan`` and ``schema`` here, other commands in ``serving.cli.commands``.

See :mod:`serving.cli.options` for the exit codes every command follows.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from serving.checks import rules
from serving.cli import report
from serving.cli.commands import register
from serving.cli.options import (
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
from serving.plan import audit as sourcecheck
from serving.plan import planner
from serving.spec.schema import json_schema
from serving.spec.stack import PROJECT_ROOT


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


SOURCE_PLAN = PROJECT_ROOT / "tests" / "data" / "source-plan.yaml"


@app.command("audit-source")
def audit_source(
    stack_file: Annotated[
        Path, typer.Option("--stack-file", help="The source document's config as a stack.", dir_okay=False)
    ] = SOURCE_PLAN,
    as_json: JsonOpt = False,
) -> None:
    """Recompute the source plan's own figures and say which are right, wrong or misleading, with the math."""
    claims = sourcecheck.audit(resolve_stack(DEFAULT_STACK, stack_file).spec)
    if as_json:
        emit_json([asdict(c) for c in claims])
        return
    table = Table(title="The source plan, recomputed", title_justify="left", show_lines=True)
    for col in ("§", "claim", "source", "recomputed", "verdict", "correction"):
        table.add_column(col, overflow="fold")
    style = {"right": "green", "wrong": "red", "misleading": "yellow"}
    for c in claims:
        table.add_row(
            c.section, c.claim, c.source_value, c.computed, f"[{style[c.verdict]}]{c.verdict}[/]", c.correction
        )
    console.print(table)


@app.command()
def schema() -> None:
    """Print the JSON Schema of the fleet spec (the exaserve: keys of a stack), for editors."""
    emit_json(json_schema())


def main() -> None:
    first = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
    register(first)
    try:
        app()
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
