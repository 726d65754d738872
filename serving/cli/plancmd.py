"""``exaserve plan``, ``audit-source`` and ``schema``: the capacity plan and its rules, the source plan recomputed, the
JSON Schema of the spec."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from importlib.resources import as_file
from typing import Annotated

import typer
from rich.table import Table

from serving.checks import rules
from serving.cli import report
from serving.cli.options import (
    DEFAULT_STACK,
    EXIT_PROBLEM,
    JsonOpt,
    StackFileOpt,
    StackOpt,
    app,
    console,
    emit_json,
    fail,
    resolve_stack,
)
from serving.plan import audit as sourcecheck
from serving.plan.loader import load_fleet
from serving.plan.model import MEMORY_MODELS, MemoryModel
from serving.result import failures
from serving.spec.schema import json_schema
from serving.spec.stack import stack_file_schema

MemoryModelOpt = Annotated[
    str,
    typer.Option(
        "--memory-model",
        help="Memory arithmetic: 'sglang' (the pinned SGLang's own, default) or 'source' (the source plan's "
        "heuristic: activations 15 % of weights, 5 GB overhead, 15 % margin).",
    ),
]


@app.command()
def plan(
    stack: StackOpt = DEFAULT_STACK,
    stack_file: StackFileOpt = None,
    as_json: JsonOpt = False,
    memory_model: MemoryModelOpt = "sglang",
) -> None:
    """Compute the capacity plan and check it against the rules. Exit 1 on any error-level violation."""
    if memory_model not in MEMORY_MODELS:
        fail(f"--memory-model {memory_model!r} is not a memory model; use one of {', '.join(MEMORY_MODELS)}")
    model: MemoryModel = "source" if memory_model == "source" else "sglang"
    st = resolve_stack(stack, stack_file)
    fleet = load_fleet(st.name, st.spec, model)
    violations = rules.check(fleet)
    ok = not failures(violations)
    if as_json:
        emit_json(report.plan_json(fleet, st.path, violations), stack=st.name, ok=ok)
    else:
        report.print_plan(console, fleet, st.path, violations)
    if not ok:
        raise typer.Exit(EXIT_PROBLEM)


@app.command("audit-source")
def audit_source(stack: StackOpt = None, stack_file: StackFileOpt = None, as_json: JsonOpt = False) -> None:
    """Recompute the source plan's own figures and say which are right, wrong or misleading, with the math.

    Without --stack or --stack-file it audits the source document's own config (the source plan)."""
    with as_file(sourcecheck.SOURCE_PLAN) as shipped:  # package data
        st = resolve_stack(stack, shipped if stack is None and stack_file is None else stack_file)
    claims = sourcecheck.audit(st.spec)
    if as_json:
        emit_json({"claims": [asdict(c) for c in claims]}, stack=st.name, ok=True)
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
def schema(
    pulumi_file: Annotated[
        bool,
        typer.Option(
            "--pulumi-file",
            help="The schema of a whole Pulumi.<stack>.yaml (its config: mapping of exaserve:<section> keys), to "
            "validate stack files against, e.g. in an editor through a yaml-language-server modeline.",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Print the JSON Schema of the fleet spec (the exaserve: keys of a stack), for editors.

    With --json the schema is the 'schema' key of the usual object (stack null: no stack is read)."""
    doc = stack_file_schema() if pulumi_file else json_schema()
    if as_json:
        emit_json({"schema": doc}, stack=None, ok=True)
    else:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
