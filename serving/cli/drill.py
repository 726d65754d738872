"""``exaserve drill``: the fault drills' catalogue (``--list``) and the same drills as Chaos Mesh experiments for a
cluster (``--render-only --out DIR``), validated against the pinned Chaos Mesh CRDs (docs/drills.md).

Exit codes (serving.cli.options): 0 listed or rendered and valid; 1 a rendered object fails its CRD schema (nothing
is written); 2 bad input: an unknown scenario, ``--render-only`` without ``--out`` or the other way round,
``--list`` with ``--render-only``, no CRD directory, an output directory that holds something else, a scheduled
scenario Chaos Mesh cannot run, or a drill against a fleet (not available yet: list or render).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from serving.cli.options import (
    DEFAULT_STACK,
    EXIT_PROBLEM,
    CrdDirOpt,
    JsonOpt,
    StackFileOpt,
    StackOpt,
    app,
    console,
    emit_json,
    fail,
    render_errors,
    resolve_stack,
)
from serving.drill.scenarios import (
    NAMES,
    SCENARIOS,
    Scenario,
    fault_sizes,
    plan_targets,
    scenario_json,
    scenario_targets,
)
from serving.plan.model import Plan
from serving.plan.planner import plan as plan_fleet
from serving.pulumi.crds import CrdError, resolve_crd_dir
from serving.pulumi.validate import SchemaSetupError, Validator
from serving.render.k8s import chaos
from serving.render.k8s.common import K8sObject
from serving.spec.schema import DrillName
from serving.spec.stack import Stack

INDEX = "drills.json"
EXPERIMENTS = "experiments"
SCHEDULE_FILE = "schedule.yaml"

ListOpt = Annotated[bool, typer.Option("--list", help="Name every scenario with its targets and expected alerts.")]
ScenarioOpt = Annotated[
    str | None,
    typer.Option("--scenario", help=f"One scenario: {', '.join(NAMES)} (with --render-only: only its experiment)."),
]
RenderOnlyOpt = Annotated[
    bool,
    typer.Option("--render-only", help="Write the drills as Chaos Mesh experiments and a Schedule instead of running."),
]
OutOpt = Annotated[
    Path | None,
    typer.Option(
        "--out", "-o", help="With --render-only: directory for the experiments, schedule.yaml and drills.json."
    ),
]


def _scenario(name: str | None) -> Scenario | None:
    if name is None:
        return None
    for s in SCENARIOS.values():
        if s.name == name:
            return s
    fail(f"--scenario {name}: no such scenario; use one of {', '.join(NAMES)} (exaserve drill --list)")


def _chaos_json(found: chaos.Experiment | chaos.NotRendered) -> dict[str, Any]:
    if isinstance(found, chaos.NotRendered):
        return {"rendered": False, "reason": found.reason}
    return {"rendered": True, "experiment": found.summary(), "notes": list(found.notes)}


def _list(st: Stack, plan: Plan, only: Scenario | None, as_json: bool) -> None:
    spec, stack = st.spec, st.name
    chosen = [only] if only else list(SCENARIOS.values())
    rendered = {s.name: chaos.experiment(s, spec, plan) for s in chosen}
    sizes = fault_sizes(spec, plan)
    if as_json:
        emit_json(
            {
                "scenarios": [
                    {**scenario_json(s, spec, plan), "chaos_mesh": _chaos_json(rendered[s.name])} for s in chosen
                ],
                "fault_sizes": dataclasses.asdict(sizes),
            },
            stack=stack,
            ok=True,
        )
        return
    table = Table(title=f"fault drills, stack {stack}", show_lines=True)
    for column in ("scenario", "fault", "targets", "alerts", "Chaos Mesh"):
        table.add_column(column, overflow="fold")
    for s in chosen:
        faults = " + ".join(f"{f.kind} {f.component}" for f in s.faults)
        targets = "\n".join(f"{t.name} ≤ {t.value:.4g} {t.unit}" for t in scenario_targets(s, spec, plan))
        eviction = "replicas leave rotation" if s.evicts else "nothing leaves rotation"
        alerts = f"fire: {', '.join(s.alerts) or 'none'}\nquiet: {', '.join(s.quiet)}"
        found = rendered[s.name]
        mesh = found.summary() if isinstance(found, chaos.Experiment) else "not rendered"
        table.add_row(s.name, f"{faults}\n{eviction}", targets, alerts, mesh)
    console.print(table)
    for t in plan_targets(spec, plan).values():
        console.print(f"{t.name}: {t.formula} ({t.meaning})", highlight=False, markup=False, soft_wrap=True)
    for figure in (sizes.hold_s, sizes.slow_latency_s, sizes.jitter_delay_s, sizes.jitter_s):
        console.print(f"size: {figure.formula}", highlight=False, markup=False, soft_wrap=True)


def _prepare(out: Path) -> None:
    """An empty or missing directory, or a previous drill render (whose files are replaced)."""
    if out.exists() and not out.is_dir():
        fail(f"--out {out} is a file; pass a directory")
    if out.exists() and any(out.iterdir()):
        if not (out / INDEX).is_file():
            fail(f"--out {out} is not empty and holds no previous drill render ({INDEX}); pass an empty directory")
        shutil.rmtree(out / EXPERIMENTS, ignore_errors=True)
        (out / SCHEDULE_FILE).unlink(missing_ok=True)
        (out / INDEX).unlink()
    (out / EXPERIMENTS).mkdir(parents=True, exist_ok=True)


def _yaml(objects: tuple[K8sObject, ...] | list[K8sObject], header: str) -> str:
    from serving.pulumi.output import to_yaml  # noqa: PLC0415 - loads Pulumi: only when writing

    return header + "---\n".join(to_yaml(o) for o in objects)


def _render(st: Stack, plan: Plan, only: Scenario | None, out: Path, crd_dir: Path | None, as_json: bool) -> None:
    spec, stack = st.spec, st.name
    chosen = [only] if only else list(SCENARIOS.values())
    found = [chaos.experiment(s, spec, plan) for s in chosen]
    experiments = [e for e in found if isinstance(e, chaos.Experiment)]
    skipped = [e for e in found if isinstance(e, chaos.NotRendered)]
    with render_errors(st.path):
        regular = chaos.schedule(spec, plan)
    try:
        crds = resolve_crd_dir(crd_dir)
        validator = Validator(spec.kubernetes.version, crds)
    except (CrdError, SchemaSetupError) as exc:
        fail(f"{exc} (every drill object is a Chaos Mesh custom resource: without the CRDs none can be validated)")
    problems = validator.validate_all([*(o for e in experiments for o in e.objects), regular])
    files: dict[DrillName, str] = {}
    if not problems:
        _prepare(out)
        for e in experiments:
            path = out / EXPERIMENTS / f"{e.scenario}.yaml"
            header = (
                f"# exaserve drill {e.scenario} (stack {stack}): generated by `exaserve drill --render-only`, do not "
                "edit.\n# Applying this file starts the drill at once: kubectl apply -f it on its own.\n"
            )
            path.write_text(_yaml(e.objects, header))
            files[e.scenario] = str(path.relative_to(out))
        names = ", ".join(spec.drills.scheduled)
        header = f"# The regular drills of stack {stack} ({names}) on '{spec.drills.schedule}' (drills.schedule).\n"
        (out / SCHEDULE_FILE).write_text(_yaml([regular], header))
    doc = {
        "out": str(out),
        "crd_dir": str(crds),
        "kubernetes_version": spec.kubernetes.version,
        "experiments": [
            {
                "scenario": e.scenario,
                "file": files.get(e.scenario),
                "objects": [{"kind": o["kind"], "name": o["metadata"]["name"]} for o in e.objects],
                "notes": list(e.notes),
            }
            for e in experiments
        ],
        "not_rendered": [{"scenario": e.scenario, "reason": e.reason} for e in skipped],
        "schedule": {
            "file": SCHEDULE_FILE if not problems else None,
            "name": regular["metadata"]["name"],
            "cron": spec.drills.schedule,
            "scenarios": list(spec.drills.scheduled),
        },
        "problems": [{"resource": p.resource, "path": p.path, "message": p.message} for p in problems],
    }
    if not problems:
        (out / INDEX).write_text(json.dumps({"stack": stack, **doc}, indent=2) + "\n")
    if as_json:
        emit_json(doc, stack=stack, ok=not problems)
    else:
        for e in experiments:
            console.print(
                f"{e.scenario}: {e.summary()} → {files.get(e.scenario, '-')}", highlight=False, soft_wrap=True
            )
            for note in e.notes:
                console.print(f"  {note}", highlight=False, markup=False, soft_wrap=True)
        for n in skipped:
            console.print(f"{n.scenario}: {n.reason}", highlight=False, markup=False, soft_wrap=True)
        console.print(
            f"schedule {regular['metadata']['name']}: {', '.join(spec.drills.scheduled)} on '{spec.drills.schedule}'",
            highlight=False,
            soft_wrap=True,
        )
        verdict = f"{len(problems)} problem(s), nothing written" if problems else f"written to {out}"
        console.print(f"validated against the Chaos Mesh CRDs in {crds}: {verdict}", highlight=False, soft_wrap=True)
        for p in problems:
            console.print(f"  ✗ {p}", highlight=False, markup=False, soft_wrap=True)
    if problems:
        raise typer.Exit(EXIT_PROBLEM)


@app.command()
def drill(
    stack: StackOpt = DEFAULT_STACK,
    stack_file: StackFileOpt = None,
    list_: ListOpt = False,
    scenario: ScenarioOpt = None,
    render_only: RenderOnlyOpt = False,
    out: OutOpt = None,
    crd_dir: CrdDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Fault drills. --list names the scenarios with the plan's targets (and their formulas) and the alerts that
    must fire or stay quiet; --render-only --out DIR writes them as Chaos Mesh experiments (one file per scenario,
    applied on its own) and a Schedule for the regular drills (drills.schedule, drills.scheduled), each object
    validated against the pinned Chaos Mesh CRDs. Exit 1 when an object fails validation, 2 on bad input."""
    st = resolve_stack(stack, stack_file)
    only = _scenario(scenario)
    if list_ and render_only:
        fail("--list and --render-only ask for two things; run one, then the other")
    if render_only and out is None:
        fail("--render-only needs --out DIR: the directory the Chaos Mesh experiments are written to")
    if out is not None and not render_only:
        fail(f"--out {out} is only used with --render-only; add --render-only to write the Chaos Mesh experiments")
    if not list_ and not render_only:
        fail(
            "running a drill against a fleet is not available yet; use --list to see the scenarios or "
            "--render-only --out DIR to write them as Chaos Mesh experiments"
        )
    plan = plan_fleet(st.spec)
    if list_:
        _list(st, plan, only, as_json)
    elif out is not None:
        _render(st, plan, only, out, crd_dir, as_json)
