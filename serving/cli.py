"""The ``exaserve`` command line.

Exit codes (all commands): 0 success; 1 the operation ran and found a problem (plan violations,
policy violations, failed preflight, rolled-back rollout); 2 bad input (malformed stack or
arguments: the message names the field, the value and the fix). No traceback reaches a user for a
mistake they made.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from serving import planner, report, rules
from serving.spec import json_schema
from serving.stack import DEFAULT_STACK, SpecError, Stack, load_stack, load_stack_file

EXIT_OK, EXIT_PROBLEM, EXIT_BAD_INPUT = 0, 1, 2

app = typer.Typer(
    name="exaserve",
    help="ExaServe deploy: plan, render, check, preflight and roll out an SGLang serving fleet.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)

StackOpt = Annotated[str, typer.Option("--stack", "-s", help="Stack name (Pulumi.<stack>.yaml).")]
StackFileOpt = Annotated[
    Path | None, typer.Option("--stack-file", help="Any stack file; overrides --stack.", dir_okay=False)
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]


def resolve_stack(stack: str, stack_file: Path | None) -> Stack:
    """Load the stack or exit 2 with the spec's problems (field, value, fix)."""
    try:
        return load_stack_file(stack_file) if stack_file else load_stack(stack)
    except SpecError as exc:
        err_console.print(f"[red]error:[/] {exc}", highlight=False, markup=False)
        raise typer.Exit(EXIT_BAD_INPUT) from None


def emit_json(obj: object) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


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


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
