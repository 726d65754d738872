"""Shared pieces of the ``exaserve`` CLI: the typer app, consoles, options, stack loading, exit codes.

Exit codes (all commands): 0 success; 1 the operation ran and found a problem (plan violations,
policy violations, failed preflight, rolled-back rollout); 2 bad input (malformed stack or
arguments: the message names the field, the value and the fix). No traceback reaches a user for a
mistake they made.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console

from serving.spec.stack import DEFAULT_STACK, SpecError, Stack, load_stack, load_stack_file

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
__all__ = ["DEFAULT_STACK", "EXIT_BAD_INPUT", "EXIT_OK", "EXIT_PROBLEM", "app", "console", "err_console"]


def resolve_stack(stack: str, stack_file: Path | None) -> Stack:
    """Load the stack or exit 2 with the spec's problems (field, value, fix)."""
    try:
        return load_stack_file(stack_file) if stack_file else load_stack(stack)
    except SpecError as exc:
        fail(str(exc))


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print an error for the user (no traceback) and exit with ``code``."""
    err_console.print(f"error: {message}", highlight=False, markup=False)
    raise typer.Exit(code)


def emit_json(obj: object) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
