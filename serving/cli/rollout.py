"""``exaserve rollout`` and ``exaserve rollback``: batch by batch, with metric gates, on a backend.

Both take the same :class:`FleetOptions`, declared once, and hand them to a
:class:`~serving.rollout.operation.RolloutOperation`, which owns the flow: a new rollout or revert first reads what
every replica runs and plans from that (:func:`serving.rollout.session.plan_from_fleet`); ``--resume`` follows the
journal. This module parses, calls and presents (:class:`Display`, the report).
Exit codes as in :mod:`serving.cli.options`: 0 completed (for ``rollback``: the fleet is on the stable version);
1 rolled back or paused (or a prod change declined at the prompt); 2 bad input (no stack named, prod changed off a
terminal without ``--yes``, unknown version, nothing to resume, another updater holds the lock, a replica down
without ``--allow-degraded``, …).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from serving.cli.options import (
    DEFAULT_KNOWN_HOSTS,
    EXIT_OK,
    EXIT_PROBLEM,
    IdentityOpt,
    JsonOpt,
    KnownHostsOpt,
    KubeCaOpt,
    KubeconfigOpt,
    KubeContextOpt,
    KubeServerOpt,
    KubeTokenOpt,
    SshConfigOpt,
    StackFileOpt,
    StackOpt,
    StateDirOpt,
    app,
    console,
    emit_json,
    err_console,
    fail,
    resolve_stack,
    shared_options,
)
from serving.plan.loader import load_fleet
from serving.rollout.journal import JournalError, LockedError, StackState, history
from serving.rollout.machine import RolloutState
from serving.rollout.operation import (
    BackendConfig,
    BackendKind,
    NothingToDo,
    Planned,
    PlatformError,
    Ran,
    RolloutOperation,
    RouterTargets,
)
from serving.rollout.runner import Progress
from serving.rollout.session import RolloutInputError
from serving.sandbox.endpoints import register as register_sandbox
from serving.spec.stack import PRODUCTION_STACK, Stack, kubernetes_context

register_sandbox()  # --backend local, a sandbox stack's routers
BackendOpt = Annotated[
    BackendKind,
    typer.Option("--backend", help="auto: local processes for a sandbox stack, kubernetes otherwise."),
]
RoutersOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--router",
        help="Every router instance's API URL, repeated (ssh: one per scheduler.instances): membership changes go to "
        "each and are proved on each, and the gates sum each one's metrics (sandbox default: its routers; "
        "kubernetes default: --router-service).",
    ),
]
RouterServiceOpt = Annotated[
    str | None,
    typer.Option(
        "--router-service",
        help="HOST:PORT of the routers' headless Service, one address per router pod (kubernetes default: the "
        "gateway's sglang-router-pods Service).",
    ),
]
MetricsPortOpt = Annotated[
    int | None,
    typer.Option(
        "--router-metrics-port",
        min=1,
        max=65535,
        help="Port of every router instance's Prometheus listener, on the instance's own host (default: the port the "
        "stack renders for the router; sandbox: each of its routers' own).",
    ),
]
GraceOpt = Annotated[
    float, typer.Option("--router-grace-s", min=1.0, help="Pause if the router does not answer for this long.")
]
YesOpt = Annotated[
    bool,
    typer.Option(
        "--yes",
        "-y",
        help=f"Change the {PRODUCTION_STACK} stack without asking: rollout and rollback ask for confirmation there "
        "on a terminal and refuse without --yes when stdin is not one.",
    ),
]
AcceptInconclusiveOpt = Annotated[
    bool,
    typer.Option(
        "--accept-inconclusive",
        help="Go on when there is too little traffic to judge a batch's gates (QPS, P99, error rate need "
        "20 requests each), or the baseline's latency was not measured: they pass unjudged for the rest of the run, "
        "and the report says so. Without it such a rollout pauses, saying what it needs.",
    ),
]
AllowDegradedOpt = Annotated[
    bool,
    typer.Option(
        "--allow-degraded",
        help="Start even though replicas are down: leave them as they are (on Kubernetes: their update groups) "
        "and update the rest; the report names them under held.",
    ),
]


@dataclass(frozen=True)
class FleetOptions:
    """The options ``rollout`` and ``rollback`` share, declared once: the stack, where its state lives, the
    router to watch and the backend that updates replicas (``--known-hosts``/``-i`` for ssh, ``--kube-*``)."""

    stack: StackOpt = None
    stack_file: StackFileOpt = None
    as_json: JsonOpt = False
    state_dir: StateDirOpt = None
    routers: RoutersOpt = None
    router_metrics_port: MetricsPortOpt = None
    router_service: RouterServiceOpt = None
    router_grace_s: GraceOpt = 30.0
    backend_kind: BackendOpt = "auto"
    known_hosts: KnownHostsOpt = DEFAULT_KNOWN_HOSTS
    identity: IdentityOpt = None
    ssh_config: SshConfigOpt = None
    kube_server: KubeServerOpt = None
    kube_token_file: KubeTokenOpt = None
    kube_ca_file: KubeCaOpt = None
    kubeconfig: KubeconfigOpt = None
    kube_context: KubeContextOpt = None
    allow_degraded: AllowDegradedOpt = False
    yes: YesOpt = False


def _confirm_production(st: Stack, opts: FleetOptions, action: str) -> None:
    """Changing the production stack is confirmed: on a terminal by a prompt, elsewhere by ``--yes`` (exit 2 without
    it, naming the flag); a declined prompt exits 1 with nothing changed."""
    if st.name != PRODUCTION_STACK or opts.yes:
        return
    if not sys.stdin.isatty():
        fail(
            f"{action} changes the production stack {st.name!r} and stdin is not a terminal to confirm on: pass --yes "
            "to confirm (or --dry-run to see the plan first)"
        )
    if not typer.confirm(f"{action} changes the production stack {st.name!r}. Continue?", err=True):
        fail(f"{action} on stack {st.name!r} not confirmed: nothing was changed", EXIT_PROBLEM)


def _operation(st: Stack, opts: FleetOptions, *, accept_inconclusive: bool = False) -> RolloutOperation:
    """``st``'s rollout operation as ``opts`` describe it."""
    backend = BackendConfig(opts.backend_kind, opts.known_hosts, opts.identity, opts.kube_server,
                            opts.kube_token_file, opts.kube_ca_file, opts.ssh_config, opts.kubeconfig,
                            opts.kube_context, kubernetes_context(st.path))  # fmt: skip
    routers = RouterTargets(tuple(opts.routers or ()), opts.router_service, opts.router_metrics_port)
    with _refusals():
        return RolloutOperation.open(StackState.for_stack(st.name, opts.state_dir), load_fleet(st.name, st.spec),
                                     backend, routers, router_grace_s=opts.router_grace_s,
                                     allow_degraded=opts.allow_degraded,
                                     accept_inconclusive=accept_inconclusive)  # fmt: skip


@contextmanager
def _refusals() -> Iterator[None]:
    """Bad input (a refused request, a held lock, an unreadable journal) exits 2; a platform that fails, 1."""
    try:
        yield
    except (RolloutInputError, LockedError, JournalError) as exc:
        fail(str(exc))
    except PlatformError as exc:
        fail(str(exc), EXIT_PROBLEM)


# ----------------------------------------------------------------------------------------- display


class Display:
    """Live progress (batch, phase, gate values) on a terminal; plain event lines otherwise. The plan is the
    one the run reports (planned from the fleet once the run has started)."""

    def __init__(self, *, quiet_stdout: bool) -> None:
        self.backend_name = ""
        self.out = err_console if quiet_stdout else console
        self.live: Live | None = None
        self.message = ""
        self.gates: dict[int, Any] = {}
        self.state: RolloutState | None = None

    def __enter__(self) -> Display:
        if self.out.is_terminal:
            self.live = Live(self._render(), console=self.out, refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.update(self._render())
            self.live.__exit__(None, None, None)

    def via(self, backend: str) -> None:
        """The backend the run goes through, for the table's title."""
        self.backend_name = backend

    def note(self, text: str) -> None:
        """A line for the operator before the run (what the fleet runs, where the journal disagrees)."""
        self.out.print(f"{time.strftime('%H:%M:%S')} {text}", highlight=False, markup=False)

    def __call__(self, p: Progress) -> None:
        self.state, self.message = p.state, p.message
        step = p.state.step
        if p.gates is not None and step is not None and step.batch is not None:
            self.gates[step.batch] = p.gates
        if p.event is not None:
            self.out.print(f"{time.strftime('%H:%M:%S')} {p.message}", highlight=False, markup=False)
        if self.live is not None:
            self.live.update(self._render())

    def _render(self) -> Group:
        s = self.state
        if s is None:
            return Group(Text(self.message or "reading what the fleet runs"))
        plan = s.plan
        lim = plan.limits
        table = Table(
            title=f"{plan.kind} {plan.stack}: {plan.from_version} → {plan.to_version} via {self.backend_name}",
            caption=f"gates: QPS drop ≤ {lim.max_qps_drop:.0%}, P99 rise ≤ {lim.max_p99_rise:.0%}, "
            f"error rate ≤ {lim.max_error_rate:.2%}",
        )
        for col in ("batch", "replicas", "racks", "phase", "QPS drop", "P99 rise", "error rate", "passed"):
            table.add_column(col)
        for b in plan.batches:
            rec = s.batches[b.index]
            gates = rec.gates or self.gates.get(b.index)
            phase = ""
            if s.step and s.step.batch == b.index:
                phase = ("rollback " if s.step.rollback else "") + s.step.phase.value
            table.add_row(
                str(b.index),
                str(len(b.replicas)),
                str(len(b.racks)),
                phase,
                _pct(gates.qps_drop if gates else None),
                _pct(gates.p99_rise if gates else None),
                _pct(gates.error_rate if gates else None, 3),
                {True: "yes", False: "NO", None: ""}[rec.passed],
            )
        return Group(table, Text(self.message))


def _pct(v: float | None, digits: int = 1) -> str:
    return "" if v is None else f"{v:.{digits}%}"


def _finish(stack: str, outcome: Planned | Ran | NothingToDo, as_json: bool) -> NoReturn:
    """Present what the operation did; exit 0 when it reached what was asked (a dry run, nothing to do), 1 if not."""
    if isinstance(outcome, Planned):
        _show_plan(stack, outcome, as_json)
    elif isinstance(outcome, NothingToDo):
        _nothing_to_do(stack, outcome, as_json)
    elif as_json:
        emit_json(outcome.result.report, stack=outcome.result.report["stack"], ok=outcome.done)
    else:
        _print_report(outcome)
    raise typer.Exit(EXIT_OK if not isinstance(outcome, Ran) or outcome.done else EXIT_PROBLEM)


def _print_report(ran: Ran) -> None:
    rep = ran.result.report
    console.print(
        f"[bold]{rep['outcome']}[/]: {rep['from_version']} → {rep['to_version']} on stack {rep['stack']}, "
        f"{rep['client_errors']} client-facing errors"
    )
    if ran.result.state.reason:
        console.print(f"reason: {ran.result.state.reason}", markup=False, highlight=False)
    if ran.held:
        console.print(f"held (left as they were): {ran.held}", markup=False, highlight=False)
    console.print("final versions: " + ran.final_versions, markup=False, highlight=False)


# ----------------------------------------------------------------------------------------- rollout


@app.command()
@shared_options(FleetOptions, "opts")
def rollout(
    opts: FleetOptions,
    to: Annotated[str | None, typer.Option("--to", help="Version to roll out, e.g. v2.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan; touch nothing.")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the unfinished rollout of the stack.")] = False,
    accept_inconclusive: AcceptInconclusiveOpt = False,
) -> None:
    """Roll the fleet to a new version in rollout.batches batches with metric gates; roll back on a breach.
    Plans from what each replica runs: replicas already on the version are left alone."""
    display = Display(quiet_stdout=opts.as_json or dry_run)
    st = resolve_stack(opts.stack, opts.stack_file)
    if resume == (to is not None):
        fail("give either --to VERSION (a new rollout) or --resume (continue the unfinished one)")
    if dry_run and to is None:
        fail("--dry-run plans a new rollout: give --to VERSION instead of --resume")
    if not dry_run:
        _confirm_production(st, opts, f"rollout {'--resume' if resume else f'--to {to}'}")
    op = _operation(st, opts, accept_inconclusive=accept_inconclusive)
    outcome: Planned | Ran | NothingToDo
    with _refusals():
        if dry_run and to is not None:
            outcome = op.dry_run(to, display)
        else:
            outcome = op.start(to, display) if to is not None else op.resume(display)
    _finish(st.name, outcome, opts.as_json)


def _nothing_to_do(stack: str, nothing: NothingToDo, as_json: bool) -> None:
    if as_json:
        emit_json(nothing.report, stack=stack, ok=True)
        return
    for line in nothing.notes:
        console.print(line, markup=False, highlight=False)
    which = "every replica" if not nothing.held else f"every replica not held ({nothing.held} held)"
    console.print(f"nothing to do: on stack {stack} {which} runs {nothing.to_version} ({nothing.versions})")


def _show_plan(stack: str, planned: Planned, as_json: bool) -> None:
    plan, t = planned.plan, planned.plan.timings
    if as_json:
        emit_json(planned.report, stack=stack, ok=True)
        return
    for line in planned.notes:
        console.print(line, markup=False, highlight=False)
    table = Table(title=f"rollout plan {stack}: {plan.from_version} → {plan.to_version} ({len(plan.batches)} batches)")
    for col in ("batch", "replicas", "racks", "nodes", "first replicas"):
        table.add_column(col)
    for b in plan.batches:
        table.add_row(
            str(b.index), str(len(b.replicas)), str(len(b.racks)), str(len(b.nodes)), ", ".join(b.replicas[:3])
        )
    console.print(table)
    console.print(
        f"per batch: remove → drain (≤ {t.drain_timeout_s:g} s) → update → health (≤ {t.health_timeout_s:g} s) → "
        f"warm-up {t.warmup_s:g} s at {t.warmup_share:.0%} → readmit → soak {t.interval_s:g} s; "
        f"baseline {t.baseline_window_s:g} s first.\nconfigured waits {planned.configured_wait_s:g} s, "
        f"worst case {planned.worst_case_s:g} s. Nothing was changed (--dry-run)."
    )


# ----------------------------------------------------------------------------------------- rollback


@app.command()
@shared_options(FleetOptions, "opts")
def rollback(opts: FleetOptions) -> None:
    """Return the fleet to the last stable version: undo an unfinished or paused rollout, or bring every replica
    that runs something else back to the version the journal's last rollout started from (a completed one is
    reverted), batch by batch with the same drain discipline."""
    display = Display(quiet_stdout=opts.as_json)
    st = resolve_stack(opts.stack, opts.stack_file)
    _confirm_production(st, opts, "rollback")
    op = _operation(st, opts)
    with _refusals():
        outcome = op.rollback(display)
    _finish(st.name, outcome, opts.as_json)


# ----------------------------------------------------------------------------------------- history


@app.command("history")
def rollout_history(
    stack: StackOpt = None, stack_file: StackFileOpt = None, state_dir: StateDirOpt = None, as_json: JsonOpt = False
) -> None:
    """Every rollout, rollback and revert of the stack from its journals, oldest first: when, from and to which
    version, the outcome, the batches that passed, client errors and the reason of a pause or rollback."""
    st = resolve_stack(stack, stack_file)
    paths = StackState.for_stack(st.name, state_dir)
    try:
        past = history(paths)
    except JournalError as exc:
        fail(str(exc))
    rows: list[dict[str, Any]] = [
        {
            "journal": str(p.path),
            "started_at": _iso(p.first_at),
            "ended_at": _iso(p.last_at),
            "kind": p.state.plan.kind,
            "from_version": p.state.plan.from_version,
            "to_version": p.state.plan.to_version,
            "outcome": p.state.outcome.value if p.state.outcome else "unfinished",
            "batches": len(p.state.batches),
            "batches_passed": sum(rec.passed is True for rec in p.state.batches),
            "client_errors": int(p.state.client_errors),
            "reason": p.state.reason,
        }
        for p in past
    ]
    if as_json:
        emit_json({"rollouts": rows}, stack=st.name, ok=True)
        return
    if not rows:
        console.print(f"no rollout on stack {st.name} yet (no journal under {paths.root})", highlight=False)
        return
    table = Table(title=f"rollouts of {st.name} ({paths.root})")
    for col in ("started (UTC)", "kind", "from → to", "outcome", "batches passed", "client errors", "reason"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(
            (r["started_at"] or "")[:19].replace("T", " "),
            r["kind"],
            f"{r['from_version']} → {r['to_version']}",
            r["outcome"],
            f"{r['batches_passed']}/{r['batches']}",
            str(r["client_errors"]),
            r["reason"],
        )
    console.print(table)


def _iso(t: float | None) -> str | None:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds") if t is not None else None
