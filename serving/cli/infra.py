"""``exaserve render``, ``exaserve check`` and ``exaserve diff``: the Pulumi program without the Pulumi engine; and
``exaserve image``: where the stack pulls the runtime image from (the image workflow pushes there).

All three run ``infra/__main__.py`` in-process under Pulumi's mocks (:mod:`serving.pulumi.program`): render writes
and schema-validates every object, check runs the policy pack's rules, diff compares with a git revision.
"""

from __future__ import annotations

import shlex
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from serving.checks import policy, promtool, rules
from serving.cli import report
from serving.cli.options import (
    DEFAULT_STACK,
    EXIT_PROBLEM,
    AllowTagsOpt,
    CrdDirOpt,
    JsonOpt,
    StackFileOpt,
    StackOpt,
    app,
    console,
    emit_json,
    errors_exit,
    fail,
    render_errors,
    resolve_stack,
)
from serving.paths import ProjectNotFoundError, project_dir
from serving.plan.loader import load_fleet
from serving.pulumi import diff as fleetdiff
from serving.pulumi import output
from serving.pulumi.crds import CrdError, NoCrdDirError, resolve_crd_dir
from serving.pulumi.program import RenderedObject, render_stack
from serving.pulumi.validate import SchemaSetupError, Validator
from serving.render.k8s.common import image
from serving.result import Status
from serving.spec.schema import IMAGE_DIGEST, IMAGE_TAG, image_repository
from serving.spec.stack import Stack

OutOpt = Annotated[Path, typer.Option("--out", "-o", help="Directory for the YAML files and index.json.")]
ProgramDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--program-dir", hidden=True, help="Another Pulumi program directory (the benchmark's avoided shape)."
    ),
]
ValidateOpt = Annotated[
    bool, typer.Option("--validate/--no-validate", help="Validate every object against its schema.")
]
SummaryOpt = Annotated[
    bool,
    typer.Option(
        "--summary",
        help="The images pending under --allow-tags as one line (how many, and the command that lists each with the "
        "digest to set) instead of a block each: scripts/run.sh's first screen. Violations are listed in full either "
        "way; --json is unchanged.",
    ),
]


def _objects(st: Stack, from_file: bool, program_dir: Path | None = None) -> list[RenderedObject]:
    """Run the Pulumi program; rendering problems exit as :func:`render_errors` says."""
    with render_errors(st.path):
        return render_stack(st, from_file=from_file, program_dir=program_dir)


@app.command()
def render(
    out: OutOpt,
    stack: StackOpt = DEFAULT_STACK,
    stack_file: StackFileOpt = None,
    crd_dir: CrdDirOpt = None,
    validate: ValidateOpt = True,
    as_json: JsonOpt = False,
    program_dir: ProgramDirOpt = None,
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
    crds: Path | None = None
    no_crds = ""
    if validate:
        try:
            crds = resolve_crd_dir(crd_dir)
        except NoCrdDirError as exc:  # built-in kinds are still validated; custom resources are listed as unvalidated
            no_crds = str(exc)
        except CrdError as exc:
            fail(str(exc))
        try:
            validator = Validator(st.spec.kubernetes.version, crds)
        except SchemaSetupError as exc:
            fail(str(exc))
        problems = validator.validate_all(o.obj for o in objects)
        unvalidated = validator.unvalidated
    rules_check = promtool.check_rules(o.obj for o in objects)
    try:
        index = output.write(out, objects)
    except output.OutputError as exc:
        fail(str(exc))
    replica_units = output.write_units(out, load_fleet(st.name, st.spec))
    if as_json:
        emit_json(
            {
                "out": str(out),
                "objects": len(index),
                "replica_units": replica_units,
                "validated": validate,
                "kubernetes_version": st.spec.kubernetes.version,
                "crd_dir": str(crds) if crds else None,
                "problems": [{"resource": p.resource, "path": p.path, "message": p.message} for p in problems],
                "unvalidated": unvalidated,
                "promtool": rules_check.to_json(),
            },
            stack=st.name,
            ok=not problems and rules_check.status is not Status.FAIL,
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
                f"warning: {len(unvalidated)} custom resource(s) not validated: {', '.join(unvalidated)}; {no_crds}",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )
        if rules_check.status is Status.SKIP:
            console.print(f"warning: {rules_check.observed}", highlight=False, markup=False, soft_wrap=True)
        else:
            console.print(f"{rules_check.check}: {rules_check.status}", highlight=False, soft_wrap=True)
            if rules_check.status is Status.FAIL:
                console.print(f"  ✗ {rules_check.message}", highlight=False, markup=False, soft_wrap=True)
    if problems or rules_check.status is Status.FAIL:
        raise typer.Exit(EXIT_PROBLEM)


@app.command()
def check(
    stack: StackOpt = DEFAULT_STACK,
    stack_file: StackFileOpt = None,
    allow_tags: AllowTagsOpt = False,
    summary: SummaryOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Run the CrossGuard policy pack's rules on the stack offline. Exit 1 on any violation."""
    st = resolve_stack(stack, stack_file)
    objects = _objects(st, stack_file is not None)
    found = policy.check([(o.resource_type, o.obj) for o in objects], load_fleet(st.name, st.spec))
    waived = {"images-by-digest"} if allow_tags else set()
    findings = [f for f in found if f.check not in waived]
    pending = [replace(f, status=Status.WARN) for f in found if f.check in waived]
    names = [*policy.RESOURCE_RULES, *policy.STACK_RULES]
    if as_json:
        emit_json(
            {
                "resources": len(objects),
                "rules": names,
                "violations": [f.to_json() for f in findings],
                "pending": [f.to_json() for f in pending],
            },
            stack=st.name,
            ok=not findings,
        )
    else:
        report.print_results(console, findings if summary else [*findings, *pending])
        verdict = f"{len(findings)} violation(s)" if findings else "no violations"
        if pending and summary:
            # the command that lists each one: the same stack, without the waiver (each a violation, with its fix)
            where = f"--stack-file {shlex.quote(str(stack_file))}" if stack_file is not None else f"--stack {st.name}"
            verdict += (
                f"; {len(pending)} container images pending a digest (tags allowed by --allow-tags, refused by "
                f"`pulumi up`): `exaserve check {where}` lists each with the digest to set"
            )
        elif pending:
            verdict += (
                f", {len(pending)} pending under --allow-tags (images not yet pinned by digest: `pulumi up` refuses "
                "them)"
            )
        console.print(
            f"{st.name}: {len(objects)} resources, {len(names)} policies: {verdict}", highlight=False, soft_wrap=True
        )
    if findings:
        raise typer.Exit(EXIT_PROBLEM)


@app.command("image")
def image_ref(
    stack: StackOpt = DEFAULT_STACK,
    stack_file: StackFileOpt = None,
    tag: Annotated[str | None, typer.Option("--tag", help="The tag the image is built and pushed as.")] = None,
    digest: Annotated[
        str | None,
        typer.Option("--digest", help="The digest the push returned (sha256:…): print the runtime.image to set."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Where the stack's controllers and agents pull runtime.image from: its repository through
    kubernetes.image_registry, as `render` writes it, which is where the image workflow pushes (with --tag, that
    tag). With --digest: the runtime.image value that pins the pushed image (the mirror is added at render)."""
    st = resolve_stack(stack, stack_file)
    if tag is not None and not IMAGE_TAG.fullmatch(tag):
        fail(f"--tag {tag!r} is not an image tag: up to 128 of A-Z a-z 0-9 _ . -, not starting with . or -")
    if digest is not None and not IMAGE_DIGEST.fullmatch(digest):
        fail(f"--digest {digest!r} is not sha256:<64 hex digits>; pass the digest the push printed")
    repository = image_repository(st.spec.runtime.image)
    pulled = image(st.spec, repository)
    push = pulled if tag is None else f"{pulled}:{tag}"
    field = None if digest is None else f"{repository}{'' if tag is None else f':{tag}'}@{digest}"
    if as_json:
        emit_json(
            {"repository": repository, "pulled": pulled, "push": push, "runtime_image": field}, stack=st.name, ok=True
        )
    else:
        typer.echo(push if field is None else field)


DIFF_CHANGES = 2  # diff --detailed-exitcode: there are changes (helm diff's and terraform plan's code)


@app.command()
def diff(
    base: Annotated[str, typer.Option("--base", help="Git revision to compare with (branch, tag or commit).")],
    stack: StackOpt = DEFAULT_STACK,
    stack_file: StackFileOpt = None,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print a pull-request comment (Markdown).")] = False,
    detailed_exitcode: Annotated[
        bool,
        typer.Option(
            "--detailed-exitcode",
            help=f"Exit {DIFF_CHANGES} when there are changes, 0 when there are none, 1 on an error (as terraform plan"
            " has it; without it diff exits 0 either way and 2 on bad input). With --json, ok is then false on"
            " changes.",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Objects added, removed and changed (with fields, SGLang and router flags by name) and capacity deltas
    between --base and the working tree. A --stack-file must lie in the repository: it is compared with its
    own copy at --base."""
    if detailed_exitcode:
        errors_exit(EXIT_PROBLEM)  # 2 is "changes" now: a bad --base or stack must not read as one
    st = resolve_stack(stack, stack_file)
    try:
        root = project_dir()
    except ProjectNotFoundError as exc:
        fail(f"diff needs the git repository of the Pulumi project: {exc}")
    if stack_file is None:
        base_stack = ["--stack", st.name]
    else:
        try:
            relative = stack_file.resolve().relative_to(root.resolve())
        except ValueError:
            fail(
                f"--stack-file {stack_file}: not inside the repository at {root}; diff compares the file with its "
                "copy at --base, so pass a stack file of the repository (or --stack NAME)"
            )
    # The base first: a bad --base is rejected before the working tree's program runs at all.
    with tempfile.TemporaryDirectory(prefix="exaserve-diff-") as tmp:
        tree, out = Path(tmp) / "tree", Path(tmp) / "render"
        try:
            commit = fleetdiff.export_revision(root, base, tree)
            if stack_file is not None:
                base_stack = ["--stack-file", str(fleetdiff.file_at_revision(tree, relative, base))]
            base_capacity = fleetdiff.render_revision(tree, base_stack, out)
        except fleetdiff.BaseRenderError as exc:
            fail(str(exc))
        base_objects = output.read(out)
    head = _objects(st, stack_file is not None)
    fleet = load_fleet(st.name, st.spec)
    head_capacity = report.plan_json(fleet, st.path, rules.check(fleet))["capacity"]
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
    flagged = detailed_exitcode and result.changes
    if as_json:
        emit_json(result.as_dict(), stack=st.name, ok=not flagged)
    elif markdown:
        sys.stdout.write(fleetdiff.markdown_report(result))
    else:
        console.print(fleetdiff.text_report(result), highlight=False, markup=False, soft_wrap=True)
    if flagged:
        raise typer.Exit(DIFF_CHANGES)
