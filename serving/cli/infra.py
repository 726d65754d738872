"""``exaserve render``, ``exaserve check`` and ``exaserve diff``: the Pulumi program without the Pulumi engine.

All three run ``infra/__main__.py`` in-process under Pulumi's mocks (:mod:`serving.pulumi.program`): render writes
and schema-validates every object, check runs the policy pack's rules, diff compares with a git revision.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from serving.checks import policy, rules
from serving.checks.flags import FlagValidationError
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
from serving.plan import planner
from serving.pulumi import diff as fleetdiff
from serving.pulumi import output
from serving.pulumi.program import INFRA_DIR, RenderedObject, render_stack
from serving.pulumi.validate import DEFAULT_CRD_DIR, SchemaSetupError, Validator
from serving.render.units import RenderError
from serving.spec.stack import PROJECT_ROOT, Stack

OutOpt = Annotated[Path, typer.Option("--out", "-o", help="Directory for the YAML files and index.json.")]
CrdDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--crd-dir",
        help=f"Directory of upstream CRD YAML files for custom resources [default: {DEFAULT_CRD_DIR}, when present].",
        file_okay=False,
    ),
]
ProgramDirOpt = Annotated[
    Path,
    typer.Option(
        "--program-dir", hidden=True, help="Another Pulumi program directory (the benchmark's avoided shape)."
    ),
]
ValidateOpt = Annotated[
    bool, typer.Option("--validate/--no-validate", help="Validate every object against its schema.")
]


def _objects(st: Stack, from_file: bool, program_dir: Path = INFRA_DIR) -> list[RenderedObject]:
    """Run the Pulumi program; a spec the units cannot render exits 2 with its message."""
    try:
        return render_stack(st, from_file=from_file, program_dir=program_dir)
    except (RenderError, FlagValidationError) as exc:
        fail(f"{st.path}: {exc}")


@app.command()
def render(
    out: OutOpt,
    stack: StackOpt = DEFAULT_STACK,
    stack_file: StackFileOpt = None,
    crd_dir: CrdDirOpt = None,
    validate: ValidateOpt = True,
    as_json: JsonOpt = False,
    program_dir: ProgramDirOpt = INFRA_DIR,
) -> None:
    """Render every Kubernetes object of the stack (the Pulumi program under mocks) to YAML + index.json,
    and the bare-metal units (systemd unit per replica, router argv/env, chrony.conf) to DIR/units/.

    Each object is validated against the Kubernetes OpenAPI schema of kubernetes.version (strict) and each
    custom resource against its CRD. Exit 1 when any object fails validation.
    """
    st = resolve_stack(stack, stack_file)
    objects = _objects(st, stack_file is not None, program_dir)
    problems = []
    unvalidated: list[str] = []
    crds = crd_dir if crd_dir is not None else (DEFAULT_CRD_DIR if DEFAULT_CRD_DIR.is_dir() else None)
    if validate:
        try:
            validator = Validator(st.spec.kubernetes.version, crds)
        except SchemaSetupError as exc:
            fail(str(exc))
        problems = validator.validate_all(o.obj for o in objects)
        unvalidated = validator.unvalidated
    try:
        index = output.write(out, objects)
    except output.OutputError as exc:
        fail(str(exc))
    replica_units = output.write_units(out, st.spec)
    if as_json:
        emit_json(
            {
                "stack": st.name,
                "out": str(out),
                "objects": len(index),
                "replica_units": replica_units,
                "validated": validate,
                "kubernetes_version": st.spec.kubernetes.version,
                "crd_dir": str(crds) if crds else None,
                "problems": [{"resource": p.resource, "path": p.path, "message": p.message} for p in problems],
                "unvalidated": unvalidated,
            }
        )
    else:
        counts: dict[str, int] = {}
        for entry in index:
            counts[entry["component"]] = counts.get(entry["component"], 0) + 1
        summary = ", ".join(f"{c} {n}" for c, n in sorted(counts.items()))
        console.print(
            f"rendered {len(index)} objects of stack {st.name} to {out} ({summary}) and "
            f"{replica_units} bare-metal replica units to {out / output.UNITS}",
            highlight=False,
            soft_wrap=True,
        )
        if validate:
            where = f"CRDs in {crds}" if crds else "no CRD directory"
            console.print(
                f"validated against Kubernetes {st.spec.kubernetes.version} (strict) and {where}: "
                f"{len(problems)} problem(s)",
                highlight=False,
                soft_wrap=True,
            )
        for p in problems:
            console.print(f"  ✗ {p}", highlight=False, markup=False, soft_wrap=True)
        if unvalidated:
            console.print(
                f"warning: {len(unvalidated)} custom resource(s) not validated, no CRD directory "
                f"({DEFAULT_CRD_DIR} is absent): {', '.join(unvalidated)}; pass --crd-dir with the "
                "upstream CRDs (docs/infra.md lists them) to validate them too",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )
    if problems:
        raise typer.Exit(EXIT_PROBLEM)


@app.command()
def check(stack: StackOpt = DEFAULT_STACK, stack_file: StackFileOpt = None, as_json: JsonOpt = False) -> None:
    """Run the CrossGuard policy pack's rules on the stack offline. Exit 1 on any violation."""
    st = resolve_stack(stack, stack_file)
    objects = _objects(st, stack_file is not None)
    findings = policy.check([(o.resource_type, o.obj) for o in objects], st.spec)
    names = [*policy.RESOURCE_RULES, *policy.STACK_RULES]
    if as_json:
        emit_json(
            {
                "stack": st.name,
                "resources": len(objects),
                "rules": names,
                "ok": not findings,
                "violations": [f.as_dict() for f in findings],
            }
        )
    else:
        for f in findings:
            console.print(
                f"✗ {f.resource} [{f.rule}]\n    {f.message}\n    fix: {f.fix}", highlight=False, markup=False
            )
        verdict = f"{len(findings)} violation(s)" if findings else "no violations"
        console.print(
            f"{st.name}: {len(objects)} resources, {len(names)} policies: {verdict}", highlight=False, soft_wrap=True
        )
    if findings:
        raise typer.Exit(EXIT_PROBLEM)


@app.command()
def diff(
    base: Annotated[str, typer.Option("--base", help="Git revision to compare with (branch, tag or commit).")],
    stack: StackOpt = DEFAULT_STACK,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print a pull-request comment (Markdown).")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Objects added, removed and changed (with fields) and capacity deltas between --base and the working tree."""
    st = resolve_stack(stack, None)
    # The base first: a bad --base is rejected before the working tree's program runs at all.
    with tempfile.TemporaryDirectory(prefix="exaserve-diff-") as tmp:
        tree, out = Path(tmp) / "tree", Path(tmp) / "render"
        try:
            commit = fleetdiff.export_revision(PROJECT_ROOT, base, tree)
            base_capacity = fleetdiff.render_revision(tree, st.name, out)
        except fleetdiff.BaseRenderError as exc:
            fail(str(exc))
        base_objects = output.read(out)
    head = _objects(st, False)
    pl = planner.plan(st.spec)
    head_capacity = report.plan_json(st, pl, rules.check(st.spec, pl))["capacity"]
    added, removed, changed = fleetdiff.diff_objects(base_objects, head)
    result = fleetdiff.FleetDiff(
        stack=st.name,
        base_ref=base,
        base_commit=commit,
        base_objects=len(base_objects),
        head_objects=len(head),
        added=added,
        removed=removed,
        changed=changed,
        capacity=fleetdiff.capacity_changes(base_capacity, head_capacity),
    )
    if as_json:
        emit_json(result.as_dict())
    elif markdown:
        sys.stdout.write(fleetdiff.markdown_report(result))
    else:
        console.print(fleetdiff.text_report(result), highlight=False, markup=False, soft_wrap=True)
