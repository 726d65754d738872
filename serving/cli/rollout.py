"""``exaserve rollout`` and ``exaserve rollback``: batch by batch, with metric gates, on a backend.

Both take the same :class:`FleetOptions`, declared once. A new rollout or revert first reads what every replica
runs and plans from that (:func:`serving.rollout.session.plan_from_fleet`); ``--resume`` follows the journal.
Exit codes as in :mod:`serving.cli.options`: 0 completed (for ``rollback``: the fleet is on the stable version);
1 rolled back or paused; 2 bad input (unknown version, nothing to resume, another updater holds the lock, a
replica down without ``--allow-degraded``, …).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn, TypeVar

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
from serving.plan.loader import load_fleet
from serving.plan.model import Fleet
from serving.render.k8s import gateway
from serving.rollout.backends import Backend, BackendError
from serving.rollout.backends.kubernetes import KubeApi, KubernetesBackend
from serving.rollout.backends.ssh import SshBackend
from serving.rollout.journal import JournalError, StackState, load_state
from serving.rollout.machine import Outcome, RolloutState
from serving.rollout.plan import PlanKind
from serving.rollout.runner import Progress
from serving.rollout.session import (
    Endpoints,
    FleetView,
    RolloutInputError,
    RunResult,
    Scope,
    check_version,
    listed,
    observe,
    plan_from_fleet,
    run,
    unfinished_message,
)
from serving.sandbox.endpoints import sandbox_endpoints, sandbox_routers

BackendKind = Literal["auto", "local", "ssh", "kubernetes"]
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
KubeServerOpt = Annotated[
    str | None, typer.Option("--kube-server", help="kubernetes: API server URL (default: in-cluster).")
]
KubeTokenOpt = Annotated[Path | None, typer.Option("--kube-token-file", help="kubernetes: bearer token file.")]
KubeCaOpt = Annotated[Path | None, typer.Option("--kube-ca-file", help="kubernetes: CA bundle of the API server.")]
AllowDegradedOpt = Annotated[
    bool,
    typer.Option(
        "--allow-degraded",
        help="Start even though replicas are down: leave them as they are (on Kubernetes: their update groups) "
        "and update the rest; the report names them under held.",
    ),
]
T = TypeVar("T")


@dataclass(frozen=True)
class FleetOptions:
    """The options ``rollout`` and ``rollback`` share, declared once: the stack, where its state lives, the
    router to watch and the backend that updates replicas (``--known-hosts``/``-i`` for ssh, ``--kube-*``)."""

    stack: StackOpt = DEFAULT_STACK
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
    kube_server: KubeServerOpt = None
    kube_token_file: KubeTokenOpt = None
    kube_ca_file: KubeCaOpt = None
    allow_degraded: AllowDegradedOpt = False


def _kind(fleet: Fleet, opts: FleetOptions) -> BackendKind:
    if opts.backend_kind == "auto":
        return "local" if fleet.spec.sandbox is not None else "kubernetes"
    return opts.backend_kind


def _backend(fleet: Fleet, paths: StackState, opts: FleetOptions) -> Backend:
    """The backend ``opts`` names, over ``fleet``."""
    kind = _kind(fleet, opts)
    try:
        if kind == "local":
            from serving.sandbox.backend import LocalBackend  # noqa: PLC0415 - loads the router launcher

            return LocalBackend(fleet, paths.sandbox_dir)
        if kind == "ssh":
            require_file(opts.known_hosts, "--known-hosts", "the SSH backend verifies every host key")
            require_file(opts.identity, "--identity", "pass an existing private key, or none to use your agent")
            return SshBackend(fleet, known_hosts=opts.known_hosts, identity=opts.identity)
        if opts.kube_server is None:
            api = KubeApi.in_cluster()
        else:
            token = opts.kube_token_file.read_text().strip() if opts.kube_token_file else None
            api = KubeApi(opts.kube_server, token, opts.kube_ca_file)
        return KubernetesBackend(fleet, api)
    except (BackendError, OSError) as exc:
        fail(f"--backend {kind}: {exc}")


def _endpoints(fleet: Fleet, opts: FleetOptions) -> Endpoints:
    """Every router instance: ``--router`` and/or ``--router-service``; on Kubernetes the gateway's headless Service by
    default, in a sandbox its routers. Their metrics: ``--router-metrics-port`` on each instance's host, by default
    the port the stack renders (a sandbox's routers: each one's own port, from the stack)."""
    spec = fleet.spec
    kind = _kind(fleet, opts)
    routers = tuple(r.rstrip("/") for r in opts.routers or ())
    service = opts.router_service
    if spec.sandbox is not None and opts.router_metrics_port is None:
        if not routers and service is None:
            return sandbox_endpoints(spec)
        known = dict(sandbox_routers(spec))
        if unknown := [r for r in routers if r not in known]:
            fail(
                f"--router {unknown[0]} is not a router of sandbox {fleet.name!r} (its routers listen on "
                f"{', '.join(known)}): name those, or give --router-metrics-port for routers of your own"
            )
        return Endpoints(routers, tuple(known[r] for r in routers), service)
    if kind == "ssh" and service is None and len(routers) < spec.scheduler.instances:
        fail(
            f"{len(routers)} --router given, but the stack runs scheduler.instances = {spec.scheduler.instances} router "
            "instances: each must be told of every membership change and the gates must read every one's metrics. "
            "Pass --router http://HOST:PORT once for each router instance"
        )
    if service is None and not routers and kind == "kubernetes":
        http_port = gateway.cluster_router(fleet).port
        service = f"{gateway.PODS_SERVICE}.{spec.kubernetes.namespace}.svc:{http_port}"
    if not routers and service is None:
        fail("no router instance given: pass --router http://HOST:PORT for each router instance")
    metrics_port = opts.router_metrics_port or gateway.cluster_router(fleet).metrics_port
    return Endpoints(routers, router_service=service, metrics_port=metrics_port)


def _latest(paths: StackState) -> RolloutState | None:
    try:
        return load_state(paths.journal_path)
    except JournalError as exc:
        fail(str(exc))


# ----------------------------------------------------------------------------------------- display


class Display:
    """Live progress (batch, phase, gate values) on a terminal; plain event lines otherwise. The plan is the
    one the run reports (planned from the fleet once the run has started)."""

    def __init__(self, backend: Backend, *, quiet_stdout: bool) -> None:
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
            title=f"{plan.kind} {plan.stack}: {plan.from_version} → {plan.to_version} via {self.backend.name}",
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
    if rep["held"]:
        console.print(f"held (left as they were): {listed(list(rep['held']))}", markup=False, highlight=False)
    console.print("final versions: " + FleetView(rep["final_versions"]).summary(), markup=False, highlight=False)


def _sync(display: Display, work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` (one event loop for the backend's connections) under the display; bad input exits 2, a
    platform that fails exits 1."""

    async def closing() -> T:  # the backend's connections close in the loop that opened them
        try:
            return await work
        finally:
            await display.backend.aclose()

    try:
        with display:
            return asyncio.run(closing())
    except RolloutInputError as exc:
        fail(str(exc))
    except (httpx.HTTPError, BackendError) as exc:
        fail(str(exc), EXIT_PROBLEM)


def _continue(
    paths: StackState, backend: Backend, endpoints: Endpoints, opts: FleetOptions, fleet: Fleet, event: str
) -> RunResult:
    """Continue the journal's rollout with an operator event (``resume`` or ``rollback``): the journal drives."""
    display = Display(backend, quiet_stdout=opts.as_json)
    replica_ids = [r.id for r in fleet.plan.replicas]
    work = run(paths, backend, endpoints, fleet=replica_ids, operator_event="resume" if event == "resume" else "rollback",
               progress=display, router_grace_s=opts.router_grace_s)  # fmt: skip
    return _sync(display, work)


def _from_fleet(
    fleet: Fleet,
    paths: StackState,
    backend: Backend,
    endpoints: Endpoints,
    opts: FleetOptions,
    decide: Callable[[FleetView], Scope],
    latest: RolloutState | None,
) -> NoReturn:
    """Read what the fleet runs, plan from it with ``decide``, and run that plan (or say there is nothing to do)."""
    display = Display(backend, quiet_stdout=opts.as_json)
    replica_ids = [r.id for r in fleet.plan.replicas]

    async def work() -> tuple[Scope, RunResult | None]:
        scope = decide(await observe(backend, replica_ids, latest))
        for line in scope.notes():
            display.note(line)
        if scope.plan is None:
            return scope, None
        result = await run(paths, backend, endpoints, fleet=replica_ids, plan=scope.plan, scope=scope, progress=display,
                           router_grace_s=opts.router_grace_s)  # fmt: skip
        return scope, result

    scope, result = _sync(display, work())
    if result is None:
        _nothing_to_do(fleet, scope, opts.as_json)
    _finish(result, opts.as_json, ok={Outcome.COMPLETED})


def _decide(
    fleet: Fleet, backend: Backend, opts: FleetOptions, to: str, kind: PlanKind
) -> Callable[[FleetView], Scope]:
    def decide(view: FleetView) -> Scope:
        return plan_from_fleet(fleet, view, to, kind=kind, allow_degraded=opts.allow_degraded,
                               whole_groups=backend.updates_whole_groups)  # fmt: skip

    return decide


# ----------------------------------------------------------------------------------------- rollout


@app.command()
@shared_options(FleetOptions, "opts")
def rollout(
    opts: FleetOptions,
    to: Annotated[str | None, typer.Option("--to", help="Version to roll out, e.g. v2.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan; touch nothing.")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the unfinished rollout of the stack.")] = False,
) -> None:
    """Roll the fleet to a new version in rollout.batches batches with metric gates; roll back on a breach.
    Plans from what each replica runs: replicas already on the version are left alone."""
    st = resolve_stack(opts.stack, opts.stack_file)
    if resume == (to is not None):
        fail("give either --to VERSION (a new rollout) or --resume (continue the unfinished one)")
    if dry_run and to is None:
        fail("--dry-run plans a new rollout: give --to VERSION instead of --resume")
    paths = stack_state(st, opts.state_dir)
    fleet = load_fleet(st.name, st.spec)
    backend = _backend(fleet, paths, opts)
    if to is not None:
        try:
            check_version(to, st.spec, backend)
        except RolloutInputError as exc:
            fail(str(exc))
    if dry_run and to is not None:
        _dry_run(fleet, paths, backend, _decide(fleet, backend, opts, to, "rollout"), opts.as_json)
        return
    endpoints = _endpoints(fleet, opts)
    with locked(paths, f"rollout {'--resume' if resume else '--to ' + str(to)}"):
        latest = _latest(paths)
        if to is None:  # --resume
            if latest is None or latest.finished:
                fail(f"nothing to resume on stack {st.name!r}: no unfinished rollout in {paths.journal_path}")
            _finish(_continue(paths, backend, endpoints, opts, fleet, "resume"), opts.as_json, ok={Outcome.COMPLETED})
        if latest is not None and not latest.finished:
            fail(unfinished_message(latest, st.name))
        decide = _decide(fleet, backend, opts, to, "rollout")
        _from_fleet(fleet, paths, backend, endpoints, opts, decide, latest)


def _nothing_to_do(fleet: Fleet, scope: Scope, as_json: bool) -> NoReturn:
    version, view = scope.to_version, scope.view
    if as_json:
        emit_json(
            {"from_version": version, "to_version": version, "outcome": "completed", "batches": [],
             "client_errors": 0, "final_versions": view.final_versions(), **scope.report()},
            stack=fleet.name, ok=True,
        )  # fmt: skip
    else:
        for line in scope.notes():
            console.print(line, markup=False, highlight=False)
        which = "every replica" if not scope.held else f"every replica not held ({len(scope.held)} held)"
        console.print(f"nothing to do: on stack {fleet.name} {which} runs {version} ({view.summary()})")
    raise typer.Exit(EXIT_OK)


def _dry_run(
    fleet: Fleet,
    paths: StackState,
    backend: Backend,
    decide: Callable[[FleetView], Scope],
    as_json: bool,
) -> None:
    latest = _latest(paths)
    replica_ids = [r.id for r in fleet.plan.replicas]

    async def work() -> Scope:
        return decide(await observe(backend, replica_ids, latest))

    scope = _sync(Display(backend, quiet_stdout=True), work())
    plan = scope.plan
    if plan is None:
        _nothing_to_do(fleet, scope, as_json)
    t = plan.timings
    if as_json:
        emit_json(
            {**plan.to_json(), "dry_run": True, "configured_wait_s": plan.configured_wait_s(),
             "worst_case_s": plan.worst_case_s(), **scope.report()},
            stack=fleet.name, ok=True,
        )  # fmt: skip
        return
    for line in scope.notes():
        console.print(line, markup=False, highlight=False)
    table = Table(
        title=f"rollout plan {fleet.name}: {plan.from_version} → {plan.to_version} ({len(plan.batches)} batches)"
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
    """Return the fleet to the last stable version: undo an unfinished or paused rollout, or bring every replica
    that runs something else back to the version the journal's last rollout started from (a completed one is
    reverted), batch by batch with the same drain discipline."""
    st = resolve_stack(opts.stack, opts.stack_file)
    paths = stack_state(st, opts.state_dir)
    fleet = load_fleet(st.name, st.spec)
    backend = _backend(fleet, paths, opts)
    endpoints = _endpoints(fleet, opts)
    with locked(paths, "rollback"):
        latest = _latest(paths)
        if latest is not None and not latest.finished:
            event = "resume" if not latest.plan.gated else "rollback"
            result = _continue(paths, backend, endpoints, opts, fleet, event)
            _finish(result, opts.as_json, ok={Outcome.ROLLED_BACK, Outcome.COMPLETED})
        if latest is None:
            decide: Callable[[FleetView], Scope] = lambda view: Scope(st.spec.serving.version, None, {}, view)  # noqa: E731
        else:
            # A gated rollout's stable version is its from-version (a completed one is reverted); a revert's, its target.
            stable = latest.plan.from_version if latest.plan.gated else latest.plan.to_version
            decide = _decide(fleet, backend, opts, stable, "revert")
        _from_fleet(fleet, paths, backend, endpoints, opts, decide, latest)
