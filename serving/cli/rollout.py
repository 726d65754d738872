"""``exaserve rollout`` and ``exaserve rollback``: batch by batch, with metric gates, on a backend.

Both take the same :class:`FleetOptions`, declared once. Exit codes as in :mod:`serving.cli.options`: 0 completed
(for ``rollback``: the fleet is on the stable version); 1 rolled back or paused; 2 bad input (unknown version,
nothing to resume, another updater holds the lock, …).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn

import httpx
import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from serving.cli.options import (
    DEFAULT_KNOWN_HOSTS,
    DEFAULT_STACK,
    EXIT_OK,
    EXIT_PROBLEM,
    IdentityOpt,
    JsonOpt,
    KnownHostsOpt,
    StackFileOpt,
    StackOpt,
    StateDirOpt,
    app,
    console,
    emit_json,
    err_console,
    fail,
    require_file,
    resolve_stack,
    shared_options,
)
from serving.cli.state import locked, stack_state
from serving.plan.planner import plan as plan_fleet
from serving.rollout.backends import Backend, BackendError
from serving.rollout.backends.kubernetes import KubeApi, KubernetesBackend
from serving.rollout.backends.ssh import SshBackend
from serving.rollout.journal import JournalError, StackState, load_state
from serving.rollout.machine import Outcome, RolloutState
from serving.rollout.plan import RolloutPlan, plan_rollout
from serving.rollout.runner import Progress
from serving.rollout.session import (
    Endpoints,
    RolloutInputError,
    RunResult,
    check_fleet,
    check_version,
    run,
    stable_version,
    unfinished_message,
)
from serving.sandbox.endpoints import sandbox_endpoints
from serving.spec.stack import Stack

BackendKind = Literal["auto", "local", "ssh", "kubernetes"]
BackendOpt = Annotated[
    BackendKind,
    typer.Option("--backend", help="auto: local processes for a sandbox stack, kubernetes otherwise."),
]
RouterUrlOpt = Annotated[str | None, typer.Option("--router-url", help="Router API URL (sandbox: from the stack).")]
MetricsUrlOpt = Annotated[
    str | None, typer.Option("--metrics-url", help="Router Prometheus URL (sandbox: from the stack).")
]
GraceOpt = Annotated[
    float, typer.Option("--router-grace-s", min=1.0, help="Pause if the router does not answer for this long.")
]
KubeServerOpt = Annotated[
    str | None, typer.Option("--kube-server", help="kubernetes: API server URL (default: in-cluster).")
]
KubeTokenOpt = Annotated[Path | None, typer.Option("--kube-token-file", help="kubernetes: bearer token file.")]
KubeCaOpt = Annotated[Path | None, typer.Option("--kube-ca-file", help="kubernetes: CA bundle of the API server.")]


@dataclass(frozen=True)
class FleetOptions:
    """The options ``rollout`` and ``rollback`` share, declared once: the stack, where its state lives, the
    router to watch and the backend that updates replicas (``--known-hosts``/``-i`` for ssh, ``--kube-*``)."""

    stack: StackOpt = DEFAULT_STACK
    stack_file: StackFileOpt = None
    as_json: JsonOpt = False
    state_dir: StateDirOpt = None
    router_url: RouterUrlOpt = None
    metrics_url: MetricsUrlOpt = None
    router_grace_s: GraceOpt = 30.0
    backend_kind: BackendOpt = "auto"
    known_hosts: KnownHostsOpt = DEFAULT_KNOWN_HOSTS
    identity: IdentityOpt = None
    kube_server: KubeServerOpt = None
    kube_token_file: KubeTokenOpt = None
    kube_ca_file: KubeCaOpt = None


def _backend(stack: Stack, paths: StackState, opts: FleetOptions) -> Backend:
    kind = opts.backend_kind
    if kind == "auto":
        kind = "local" if stack.spec.sandbox is not None else "kubernetes"
    try:
        if kind == "local":
            from serving.sandbox.backend import LocalBackend  # noqa: PLC0415 - loads the router launcher

            return LocalBackend(stack.spec, plan_fleet(stack.spec), paths.sandbox_dir)
        if kind == "ssh":
            require_file(opts.known_hosts, "--known-hosts", "the SSH backend verifies every host key")
            require_file(opts.identity, "--identity", "pass an existing private key, or none to use your agent")
            return SshBackend(stack.spec, plan_fleet(stack.spec), known_hosts=opts.known_hosts, identity=opts.identity)
        if opts.kube_server is None:
            api = KubeApi.in_cluster()
        else:
            token = opts.kube_token_file.read_text().strip() if opts.kube_token_file else None
            api = KubeApi(opts.kube_server, token, opts.kube_ca_file)
        return KubernetesBackend(stack.spec, plan_fleet(stack.spec), api)
    except (BackendError, OSError) as exc:
        fail(f"--backend {kind}: {exc}")


def _endpoints(stack: Stack, router_url: str | None, metrics_url: str | None) -> Endpoints:
    if router_url and metrics_url:
        return Endpoints(router_url.rstrip("/"), metrics_url)
    try:
        return sandbox_endpoints(stack.spec)
    except RolloutInputError as exc:
        fail(str(exc))


def _latest(paths: StackState) -> RolloutState | None:
    try:
        return load_state(paths.journal_path)
    except JournalError as exc:
        fail(str(exc))


# ----------------------------------------------------------------------------------------- display


class Display:
    """Live progress (batch, phase, gate values) on a terminal; plain event lines otherwise."""

    def __init__(self, plan: RolloutPlan, backend: Backend, *, quiet_stdout: bool) -> None:
        self.plan = plan
        self.backend = backend
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
        plan, s = self.plan, self.state
        lim = plan.limits
        table = Table(
            title=f"{plan.kind} {plan.stack}: {plan.from_version} → {plan.to_version} via {self.backend.name}",
            caption=f"gates: QPS drop ≤ {lim.max_qps_drop:.0%}, P99 rise ≤ {lim.max_p99_rise:.0%}, "
            f"error rate ≤ {lim.max_error_rate:.2%}",
        )
        for col in ("batch", "replicas", "racks", "phase", "QPS drop", "P99 rise", "error rate", "passed"):
            table.add_column(col)
        for b in plan.batches:
            rec = s.batches[b.index] if s else None
            gates = (rec.gates if rec and rec.gates else None) or self.gates.get(b.index)
            phase = ""
            if s and s.step and s.step.batch == b.index:
                phase = ("rollback " if s.step.rollback else "") + s.step.phase.value
            table.add_row(
                str(b.index),
                str(len(b.replicas)),
                str(len(b.racks)),
                phase,
                _pct(gates.qps_drop if gates else None),
                _pct(gates.p99_rise if gates else None),
                _pct(gates.error_rate if gates else None, 3),
                {True: "yes", False: "NO", None: ""}[rec.passed if rec else None],
            )
        return Group(table, Text(self.message))


def _pct(v: float | None, digits: int = 1) -> str:
    return "" if v is None else f"{v:.{digits}%}"


def _finish(result: RunResult, as_json: bool, *, ok: set[Outcome]) -> NoReturn:
    done = result.state.outcome in ok
    if as_json:
        emit_json(result.report, stack=result.report["stack"], ok=done)
    else:
        _print_report(result)
    raise typer.Exit(EXIT_OK if done else EXIT_PROBLEM)


def _print_report(result: RunResult) -> None:
    rep = result.report
    console.print(
        f"[bold]{rep['outcome']}[/]: {rep['from_version']} → {rep['to_version']} on stack {rep['stack']}, "
        f"{rep['client_errors']} client-facing errors"
    )
    if result.state.reason:
        console.print(f"reason: {result.state.reason}", markup=False, highlight=False)
    counts: dict[str, int] = {}
    for v in rep["final_versions"].values():
        counts[str(v)] = counts.get(str(v), 0) + 1
    console.print("final versions: " + ", ".join(f"{n} × {v}" for v, n in sorted(counts.items())))


def _run(
    paths: StackState, backend: Backend, endpoints: Endpoints, display: Display, opts: FleetOptions, **kwargs: Any
) -> RunResult:
    try:
        with display:
            return asyncio.run(
                run(paths, backend, endpoints, progress=display, router_grace_s=opts.router_grace_s, **kwargs)
            )
    except RolloutInputError as exc:
        fail(str(exc))
    except (httpx.HTTPError, BackendError) as exc:
        fail(str(exc), EXIT_PROBLEM)


# ----------------------------------------------------------------------------------------- rollout


@app.command()
@shared_options(FleetOptions, "opts")
def rollout(
    opts: FleetOptions,
    to: Annotated[str | None, typer.Option("--to", help="Version to roll out, e.g. v2.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan; touch nothing.")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the unfinished rollout of the stack.")] = False,
) -> None:
    """Roll the fleet to a new version in rollout.batches batches with metric gates; roll back on a breach."""
    st = resolve_stack(opts.stack, opts.stack_file)
    if resume == (to is not None):
        fail("give either --to VERSION (a new rollout) or --resume (continue the unfinished one)")
    if dry_run and to is None:
        fail("--dry-run plans a new rollout: give --to VERSION instead of --resume")
    paths = stack_state(st, opts.state_dir)
    backend = _backend(st, paths, opts)
    if dry_run and to is not None:
        _dry_run(st, paths, backend, to, opts.as_json)
        return
    endpoints = _endpoints(st, opts.router_url, opts.metrics_url)
    with locked(paths, f"rollout {'--resume' if resume else '--to ' + str(to)}"):
        latest = _latest(paths)
        if to is None:  # --resume
            if latest is None or latest.finished:
                fail(f"nothing to resume on stack {st.name!r}: no unfinished rollout in {paths.journal_path}")
            display = Display(latest.plan, backend, quiet_stdout=opts.as_json)
            _finish(_run(paths, backend, endpoints, display, opts, operator_event="resume"), opts.as_json,
                    ok={Outcome.COMPLETED})  # fmt: skip
        if latest is not None and not latest.finished:
            fail(unfinished_message(latest, st.name))
        plan = _new_plan(st, backend, latest, to)
        if plan is None:
            _nothing_to_do(st, to, opts.as_json)
        display = Display(plan, backend, quiet_stdout=opts.as_json)
        result = _run(
            paths, backend, endpoints, display, opts, plan=plan,
            before_start=lambda: check_fleet(backend, plan, plan.from_version),
        )  # fmt: skip
        _finish(result, opts.as_json, ok={Outcome.COMPLETED})


def _new_plan(st: Stack, backend: Backend, latest: RolloutState | None, to: str) -> RolloutPlan | None:
    try:
        check_version(to, st.spec, backend)
    except RolloutInputError as exc:
        fail(str(exc))
    stable = stable_version(latest, st.spec.serving.version)
    if to == stable:
        return None
    return plan_rollout(st.spec, plan_fleet(st.spec), st.name, from_version=stable, to_version=to)


def _nothing_to_do(st: Stack, version: str, as_json: bool) -> NoReturn:
    if as_json:
        emit_json(
            {"from_version": version, "to_version": version, "outcome": "completed", "batches": [],
             "client_errors": 0, "final_versions": {}},
            stack=st.name, ok=True,
        )  # fmt: skip
    else:
        console.print(f"stack {st.name} is on {version}, its last stable version: nothing to do")
    raise typer.Exit(EXIT_OK)


def _dry_run(st: Stack, paths: StackState, backend: Backend, to: str, as_json: bool) -> None:
    latest = _latest(paths)
    plan = _new_plan(st, backend, latest, to)
    if plan is None:
        _nothing_to_do(st, to, as_json)
    t = plan.timings
    if as_json:
        emit_json(
            {**plan.to_json(), "dry_run": True, "configured_wait_s": plan.configured_wait_s(),
             "worst_case_s": plan.worst_case_s()},
            stack=st.name, ok=True,
        )  # fmt: skip
        return
    table = Table(
        title=f"rollout plan {st.name}: {plan.from_version} → {plan.to_version} ({len(plan.batches)} batches)"
    )
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
        f"baseline {t.baseline_window_s:g} s first.\nconfigured waits {plan.configured_wait_s():g} s, "
        f"worst case {plan.worst_case_s():g} s. Nothing was changed (--dry-run)."
    )


# ----------------------------------------------------------------------------------------- rollback


@app.command()
@shared_options(FleetOptions, "opts")
def rollback(opts: FleetOptions) -> None:
    """Return the fleet to the last stable version: undo an unfinished or paused rollout, or revert
    the last completed one, batch by batch with the same drain discipline."""
    st = resolve_stack(opts.stack, opts.stack_file)
    paths = stack_state(st, opts.state_dir)
    backend = _backend(st, paths, opts)
    endpoints = _endpoints(st, opts.router_url, opts.metrics_url)
    as_json = opts.as_json
    with locked(paths, "rollback"):
        latest = _latest(paths)
        if latest is None or latest.outcome is Outcome.ROLLED_BACK or (latest.finished and not latest.plan.gated):
            _nothing_to_do(st, stable_version(latest, st.spec.serving.version), as_json)
        if not latest.finished:
            display = Display(latest.plan, backend, quiet_stdout=as_json)
            event = "resume" if not latest.plan.gated else "rollback"
            result = _run(paths, backend, endpoints, display, opts, operator_event=event)
            _finish(result, as_json, ok={Outcome.ROLLED_BACK, Outcome.COMPLETED})
        plan = plan_rollout(
            st.spec,
            plan_fleet(st.spec),
            st.name,
            from_version=latest.plan.to_version,
            to_version=latest.plan.from_version,
            kind="revert",
        )
        display = Display(plan, backend, quiet_stdout=as_json)
        result = _run(paths, backend, endpoints, display, opts, plan=plan)
        _finish(result, as_json, ok={Outcome.COMPLETED})
