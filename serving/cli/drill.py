"""``exaserve drill``: run one fault drill against a running fleet (``--scenario NAME``: the sandbox here), the
catalogue (``--list``), and the same drills as Chaos Mesh experiments for a cluster (``--render-only --out DIR``),
validated against the pinned Chaos Mesh CRDs (docs/drills.md).

Exit codes (serving.cli.options): 0 the drill met every target (or listed, or rendered and valid); 1 the drill
missed a target, an alert that must fire did not or a quiet one fired, the fleet was not healthy before it, or a
rendered object fails its CRD schema (nothing is written); 2 bad input: an unknown scenario, no scenario to run,
``--render-only`` without ``--out`` or the other way round, ``--list`` with ``--render-only``, no CRD directory, an
output directory that holds something else, a scheduled scenario Chaos Mesh cannot run, a stack with no sandbox to
drill (SSH and Kubernetes fleets: ``--render-only``), a fleet that is not running, a drill the fleet cannot run
(one router instance for router-loss), or another updater or drill holding the stack's lock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from serving.cli.options import (
    EXIT_INVALID,
    EXIT_PROBLEM,
    CrdDirOpt,
    JsonOpt,
    ProgressLines,
    StackFileOpt,
    StackOpt,
    StateDirOpt,
    app,
    console,
    emit_json,
    err_console,
    fail,
    render_errors,
    resolve_stack,
)
from serving.cli.state import locked, stack_state
from serving.drill.scenarios import (
    NAMES,
    SCENARIOS,
    Judging,
    Scenario,
    fault_sizes,
    plan_targets,
    scenario_json,
    scenario_targets,
)
from serving.plan.loader import load_fleet
from serving.plan.model import Fleet
from serving.pulumi.crds import CrdError, resolve_crd_dir
from serving.pulumi.validate import SchemaSetupError, Validator
from serving.render.k8s import chaos
from serving.render.k8s.common import K8sObject
from serving.spec.schema import DrillName
from serving.spec.stack import Stack

if TYPE_CHECKING:
    from serving.drill.engine import FleetUrls

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
ReportOpt = Annotated[
    Path | None,
    typer.Option(
        "--report",
        help="Directory for the drill's drill.json and timeline.png (default: <state-dir>/<stack>/drills/<time>-<scenario>).",
        file_okay=False,
    ),
]
JudgeOpt = Annotated[
    Judging,
    typer.Option(
        "--judge",
        help="targets: each time against the plan's target (exit 3 when the probes cannot resolve it); order: what "
        "happened and in what order (out of rotation, restarted, back, a new leader, clients served again), the client "
        "error share, false detections and alerts, never how long each step took, waiting up to 3 x the plan's times "
        "for each (a loaded machine; scripts/test.sh judges by order, scripts/rehearse.sh on targets).",
    ),
]
RateOpt = Annotated[
    float | None,
    typer.Option(
        "--rate",
        help="Client requests per second during the drill (default: enough that one failed request stays within "
        "rollout.max_error_rate even if the drill ends at half its longest target, at least 10/s).",
        min=0.1,
    ),
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


def _list(fleet: Fleet, only: Scenario | None, as_json: bool) -> None:
    stack = fleet.name
    chosen = [only] if only else list(SCENARIOS.values())
    rendered = {s.name: chaos.experiment(s, fleet) for s in chosen}
    sizes = fault_sizes(fleet)
    if as_json:
        emit_json(
            {
                "scenarios": [{**scenario_json(s, fleet), "chaos_mesh": _chaos_json(rendered[s.name])} for s in chosen],
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
        targets = "\n".join(f"{t.name} ≤ {t.value:.4g} {t.unit}" for t in scenario_targets(s, fleet))
        eviction = "replicas leave rotation" if s.evicts else "nothing leaves rotation"
        alerts = f"fire: {', '.join(s.alerts) or 'none'}\nquiet: {', '.join(s.quiet)}"
        found = rendered[s.name]
        mesh = found.summary() if isinstance(found, chaos.Experiment) else "not rendered"
        table.add_row(s.name, f"{faults}\n{eviction}", targets, alerts, mesh)
    console.print(table)
    for t in plan_targets(fleet).values():
        console.print(f"{t.name}: {t.formula} ({t.meaning})", highlight=False, markup=False, soft_wrap=True)
    for figure in (
        sizes.hold_s,
        sizes.slow_latency_s,
        sizes.jitter_delay_s,
        sizes.jitter_s,
        sizes.memory_token_usage,
        sizes.memory_admit,
        sizes.memory_slowdown,
    ):
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


def _render(st: Stack, fleet: Fleet, only: Scenario | None, out: Path, crd_dir: Path | None, as_json: bool) -> None:
    spec, stack = fleet.spec, fleet.name
    chosen = [only] if only else list(SCENARIOS.values())
    found = [chaos.experiment(s, fleet) for s in chosen]
    experiments = [e for e in found if isinstance(e, chaos.Experiment)]
    skipped = [e for e in found if isinstance(e, chaos.NotRendered)]
    with render_errors(st.path):
        regular = chaos.schedule(fleet)
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


def _urls(fleet: Fleet) -> FleetUrls:
    """Where the sandbox fleet to drill answers; a stack with no sandbox cannot be drilled from here (exit 2)."""
    if fleet.spec.sandbox is None:
        fail(
            f"stack {fleet.name!r} has no sandbox: section; drills run against the sandbox here (`exaserve sandbox up`). "
            "For a cluster, write them as Chaos Mesh experiments: --render-only --out DIR (an SSH injector for bare "
            "metal is not built)"
        )
    from serving.sandbox.faults import fleet_urls  # noqa: PLC0415 - loads httpx and the load generator: on use only

    return fleet_urls(fleet)


def _run(
    st: Stack,
    fleet: Fleet,
    scenario: Scenario,
    state_dir: Path | None,
    report: Path | None,
    rate: float | None,
    judging: Judging,
    as_json: bool,
) -> None:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn  # noqa: PLC0415

    from serving.drill.engine import DrillError, FleetDown, Settings, run_drill  # noqa: PLC0415
    from serving.drill.report import write_report  # noqa: PLC0415
    from serving.sandbox.faults import SandboxFaults  # noqa: PLC0415
    from serving.sandbox.processes import SandboxError  # noqa: PLC0415

    urls = _urls(fleet)
    paths = stack_state(st, state_dir)
    sizes = fault_sizes(fleet)
    targets = scenario_targets(scenario, fleet)
    settings = Settings.for_drill(fleet, targets, sizes, rate, judging)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    directory = report if report is not None else paths.root / "drills" / f"{stamp}-{scenario.name}"
    injector = SandboxFaults(fleet, paths.sandbox_dir)
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    lines = ProgressLines(err_console)  # piped: the spinner shows nothing, these lines say what the drill does

    def step(what: str) -> None:
        bar.update(task, description=f"{scenario.name}: {what}")
        lines(what)

    with locked(paths, f"drill {scenario.name}"), Progress(*columns, console=err_console, transient=True) as bar:
        task = bar.add_task(f"drill {scenario.name}", total=None)
        try:
            run = asyncio.run(
                run_drill(
                    scenario,
                    targets,
                    urls,
                    injector,
                    sizes,
                    settings,
                    step,
                )
            )
        except FleetDown as exc:
            fail(str(exc))
        except DrillError as exc:
            fail(str(exc), EXIT_PROBLEM)
        except SandboxError as exc:
            fail(f"{exc} (the drill needs the sandbox running: `exaserve sandbox up --stack {st.name}`)")
        step(f"writing the report to {directory}")
        doc = write_report(run, st.name, directory)
    if as_json:
        emit_json(doc, stack=st.name, ok=run.ok)
    else:
        shown_verdict = run.verdict if run.ok else run.verdict.upper()
        table = Table(title=f"drill {scenario.name}, stack {st.name}: {shown_verdict}")
        for column in ("check", "measured", "target", "verdict"):
            table.add_column(column, overflow="fold")
        for c in run.checks:
            shown = "-" if c.measured is None else f"{c.measured:.4g} {c.unit}".strip()
            target = (
                "observed, in order" if c.judged == "order" else f"≤ {c.target:g} {c.unit}".strip() if c.unit else ""
            )
            table.add_row(c.name, shown, target, ("✓ " if c.ok else "✗ ") + c.reason)
        console.print(table)
        console.print(f"injected: {'; '.join(run.injected)}", highlight=False, markup=False, soft_wrap=True)
        console.print(f"healed: {'; '.join(run.healed) or 'by the runtime'}", highlight=False, markup=False)
        console.print(f"report: {directory / 'drill.json'}, timeline: {doc['timeline']}", highlight=False)
        if run.gaps:
            console.print(f"INVALID: {doc['cadence']['why']}", highlight=False, markup=False, soft_wrap=True)
        for c in (c for c in run.checks if c.undecided):
            console.print(f"INVALID: {c.name} {c.reason}", highlight=False, markup=False, soft_wrap=True)
    if run.verdict == "invalid":
        raise typer.Exit(EXIT_INVALID)
    if not run.ok:
        raise typer.Exit(EXIT_PROBLEM)


@app.command()
def drill(
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    list_: ListOpt = False,
    scenario: ScenarioOpt = None,
    render_only: RenderOnlyOpt = False,
    out: OutOpt = None,
    crd_dir: CrdDirOpt = None,
    report: ReportOpt = None,
    rate: RateOpt = None,
    judge: JudgeOpt = "targets",
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Fault drills. --scenario NAME runs one against the running sandbox under bounded client load: inject, watch,
    heal, measure detection, recovery, restoration and client errors against the plan's targets, check the alerts
    in the sandbox's Prometheus, and write drill.json and a timeline.png (--report DIR). --list names the scenarios
    with the plan's targets (and their formulas) and the alerts that must fire or stay quiet; --render-only --out
    DIR writes them as Chaos Mesh experiments (one file per scenario, applied on its own) and a Schedule for the
    regular drills (drills.schedule, drills.scheduled), each object validated against the pinned Chaos Mesh CRDs.
    --judge order asks what happened and in what order instead of how long each step took (CI on a shared machine).
    Exit 1 when a drill misses a target (or, judged by order, an event or its order) or an object fails validation,
    2 on bad input, 3 when a drill judged on targets is invalid: its probes of the fleet came further apart than
    max(3 x the probe period, the period + 1 s), or a time was over its target only by what the probes cannot
    resolve, so it is not judged (docs/drills.md)."""
    st = resolve_stack(stack, stack_file)
    only = _scenario(scenario)
    if list_ and render_only:
        fail("--list and --render-only ask for two things; run one, then the other")
    if render_only and out is None:
        fail("--render-only needs --out DIR: the directory the Chaos Mesh experiments are written to")
    if out is not None and not render_only:
        fail(f"--out {out} is only used with --render-only; add --render-only to write the Chaos Mesh experiments")
    running = not list_ and not render_only
    if running and only is None:
        fail(f"name the drill to run: --scenario NAME ({', '.join(NAMES)}); --list shows what each does")
    if not running and (report is not None or rate is not None or judge != "targets"):
        fail("--report, --rate and --judge are for running a drill (--scenario NAME without --list or --render-only)")
    fleet = load_fleet(st.name, st.spec)
    if running and only is not None:
        _run(st, fleet, only, state_dir, report, rate, judge, as_json)
    elif list_:
        _list(fleet, only, as_json)
    elif out is not None:
        _render(st, fleet, only, out, crd_dir, as_json)
