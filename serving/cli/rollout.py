"""``exaserve sandbox up|down``, ``exaserve rollout`` and ``exaserve rollback``.

Exit codes: 0 completed (for ``rollback``: the fleet is on the stable version); 1 rolled back or
paused; 2 bad input (unknown version, nothing to resume, another updater holds the lock, …).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
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
    DEFAULT_STACK,
    EXIT_OK,
    EXIT_PROBLEM,
    JsonOpt,
    StackFileOpt,
    StackOpt,
    app,
    console,
    emit_json,
    err_console,
    fail,
    resolve_stack,
)
from serving.plan.planner import fleet_replicas
from serving.rollout.backends import Backend, BackendError
from serving.rollout.backends.kubernetes import KubeApi, KubernetesBackend
from serving.rollout.backends.ssh import SshBackend
from serving.rollout.journal import JournalError, LockedError, StackLock, StackState, load_state, state_root
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
    sandbox_endpoints,
    stable_version,
    unfinished_message,
)
from serving.spec.stack import Stack

sandbox_app = typer.Typer(help="The local sandbox: the real SGLang router in front of simulated SGLang workers.")
app.add_typer(sandbox_app, name="sandbox")

StateDirOpt = Annotated[
    Path | None,
    typer.Option("--state-dir", help="Root of the per-stack state (journal, lock); default .exaserve/state.",
                 envvar="EXASERVE_STATE_DIR", file_okay=False),
]  # fmt: skip
RouterUrlOpt = Annotated[str | None, typer.Option("--router-url", help="Router API URL (sandbox: from the stack).")]
MetricsUrlOpt = Annotated[
    str | None, typer.Option("--metrics-url", help="Router Prometheus URL (sandbox: from the stack).")
]
DEFAULT_KNOWN_HOSTS = Path.home() / ".ssh" / "known_hosts"
GraceOpt = Annotated[
    float, typer.Option("--router-grace-s", min=1.0, help="Pause if the router does not answer for this long.")
]


def _paths(stack: Stack, state_dir: Path | None) -> StackState:
    return StackState.for_stack(stack.name, state_dir or state_root())


@contextmanager
def _locked(paths: StackState, purpose: str) -> Iterator[None]:
    lock = StackLock(paths.lock_path)
    try:
        lock.acquire(purpose)
    except LockedError as exc:
        fail(str(exc))
    try:
        yield
    finally:
        lock.release()


BackendKind = Literal["auto", "local", "ssh", "kubernetes"]
BackendOpt = Annotated[
    BackendKind,
    typer.Option("--backend", help="auto: local processes for a sandbox stack, kubernetes otherwise."),
]
KnownHostsOpt = Annotated[
    Path, typer.Option("--known-hosts", help="ssh: known_hosts the nodes' host keys are checked against.")
]
IdentityOpt = Annotated[Path | None, typer.Option("--identity", help="ssh: private key (default: agent/~/.ssh).")]
KubeServerOpt = Annotated[
    str | None, typer.Option("--kube-server", help="kubernetes: API server URL (default: in-cluster).")
]
KubeTokenOpt = Annotated[Path | None, typer.Option("--kube-token-file", help="kubernetes: bearer token file.")]
KubeCaOpt = Annotated[Path | None, typer.Option("--kube-ca-file", help="kubernetes: CA bundle of the API server.")]


@dataclass(frozen=True)
class BackendChoice:
    kind: BackendKind
    known_hosts: Path
    identity: Path | None
    kube_server: str | None
    kube_token_file: Path | None
    kube_ca_file: Path | None


def _backend(stack: Stack, paths: StackState, choice: BackendChoice) -> Backend:
    kind = choice.kind
    if kind == "auto":
        kind = "local" if stack.spec.sandbox is not None else "kubernetes"
    try:
        if kind == "local":
            from serving.sandbox.backend import LocalBackend  # noqa: PLC0415 - loads the router launcher

            return LocalBackend(stack.spec, paths.sandbox_dir)
        if kind == "ssh":
            if not choice.known_hosts.is_file():
                fail(f"--known-hosts {choice.known_hosts}: no such file; the SSH backend verifies every host key")
            return SshBackend(stack.spec, known_hosts=choice.known_hosts, identity=choice.identity)
        if choice.kube_server is None:
            api = KubeApi.in_cluster()
        else:
            token = choice.kube_token_file.read_text().strip() if choice.kube_token_file else None
            api = KubeApi(choice.kube_server, token, choice.kube_ca_file)
        return KubernetesBackend(stack.spec, api)
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


# ----------------------------------------------------------------------------------------- sandbox


@sandbox_app.command("up")
def sandbox_up(
    stack: StackOpt = "sandbox",
    stack_file: StackFileOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Start the real router on loopback and one simulated worker per replica at the stack's version."""
    st = resolve_stack(stack, stack_file)
    if st.spec.sandbox is None:
        fail(f"stack {st.name!r} has no sandbox: section; `exaserve sandbox` runs only sandbox stacks")
    from serving.sandbox import processes  # noqa: PLC0415 - loads the router launcher (≈ 1 s): on use only

    paths = _paths(st, state_dir)
    with _locked(paths, "sandbox up"):
        processes.stop_all(processes.StateDir(paths.sandbox_dir))
        try:
            urls = asyncio.run(_start_sandbox(st, paths))
        except (processes.SandboxError, BackendError, TimeoutError) as exc:
            processes.stop_all(processes.StateDir(paths.sandbox_dir))
            fail(f"sandbox did not start: {exc}", EXIT_PROBLEM)
    ep = sandbox_endpoints(st.spec)
    doc = {"stack": st.name, "router_url": ep.router_url, "metrics_url": ep.metrics_url, "workers": urls}
    if as_json:
        emit_json(doc)
        return
    table = Table(title=f"sandbox {st.name}: router {ep.router_url} (metrics {ep.metrics_url})")
    for col in ("replica", "url", "version"):
        table.add_column(col)
    for rid, (url, version) in urls.items():
        table.add_row(rid, url, version)
    console.print(table)


async def _start_sandbox(st: Stack, paths: StackState) -> dict[str, tuple[str, str]]:
    from serving.sandbox import processes  # noqa: PLC0415
    from serving.sandbox.backend import router_flags, worker_config, worker_name  # noqa: PLC0415

    spec = st.spec
    state = processes.StateDir(paths.sandbox_dir)
    budget = spec.serving.startup_budget_s
    out: dict[str, tuple[str, str]] = {}
    configs = []
    for replica in fleet_replicas(spec):
        cfg = worker_config(spec, replica, spec.group_version(replica.group))
        configs.append(cfg)
        out[replica.id] = (cfg.url, cfg.version)
    await asyncio.gather(
        *(asyncio.to_thread(processes.start_worker, state, worker_name(c.port), c, wait="started") for c in configs)
    )
    deadline = time.monotonic() + budget
    async with httpx.AsyncClient(timeout=1.0) as http:
        pending = {c.url for c in configs if not c.never_ready}
        while pending:
            for url in sorted(pending):
                try:
                    if (await http.get(url + "/health")).status_code == 200:
                        pending.discard(url)
                except httpx.HTTPError:
                    pass
            if pending and time.monotonic() > deadline:
                raise TimeoutError(f"workers {sorted(pending)} not healthy within serving.startup_budget_s={budget:g}")
            await asyncio.sleep(0.1)
    ready = sum(not c.never_ready for c in configs)
    flags = router_flags(spec, [c.url for c in configs])
    await asyncio.to_thread(processes.start_router, state, flags, healthy_workers=ready, timeout_s=budget)
    return out


@sandbox_app.command("down")
def sandbox_down(stack: StackOpt = "sandbox", stack_file: StackFileOpt = None, state_dir: StateDirOpt = None) -> None:
    """Stop the sandbox's router and workers (the router first)."""
    st = resolve_stack(stack, stack_file)
    paths = _paths(st, state_dir)
    from serving.sandbox import processes  # noqa: PLC0415

    with _locked(paths, "sandbox down"):
        stopped = processes.stop_all(processes.StateDir(paths.sandbox_dir))
    console.print(f"stopped {len(stopped)} process(es): {', '.join(stopped) or 'none was running'}")


@sandbox_app.command("load")
def sandbox_load(
    stack: StackOpt = "sandbox",
    stack_file: StackFileOpt = None,
    rate: Annotated[float, typer.Option("--rate", help="Requests per second, sent at a fixed rate.")] = 50.0,
    duration_s: Annotated[float, typer.Option("--duration", help="Seconds to run; bounded.")] = 60.0,
    as_json: JsonOpt = False,
) -> None:
    """Bounded client load on the sandbox router (run it beside a rollout so the gates have traffic).

    Exit 1 when any request failed as a client sees it."""
    from serving.router.loadgen import LoadSpec, run_load_sync  # noqa: PLC0415

    st = resolve_stack(stack, stack_file)
    try:
        spec = LoadSpec(url=sandbox_endpoints(st.spec).router_url, rate_per_s=rate, duration_s=duration_s)
    except ValueError as exc:
        fail(str(exc))
    report = run_load_sync(spec)
    if as_json:
        emit_json(
            {
                "count": report.count,
                "errors": report.errors,
                "error_rate": report.error_rate,
                "qps": report.qps,
                "p50_s": report.p50_s,
                "p99_s": report.p99_s,
                "status_counts": report.status_counts,
            }
        )
    else:
        console.print(report.summary(), highlight=False)
    if report.errors:
        raise typer.Exit(EXIT_PROBLEM)


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


def _finish(result: RunResult, as_json: bool, *, ok: set[Outcome]) -> None:
    if as_json:
        emit_json(result.report)
    else:
        _print_report(result)
    raise typer.Exit(EXIT_OK if result.state.outcome in ok else EXIT_PROBLEM)


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
    paths: StackState, backend: Backend, endpoints: Endpoints, display: Display, grace: float, **kwargs: Any
) -> RunResult:
    try:
        with display:
            return asyncio.run(run(paths, backend, endpoints, progress=display, router_grace_s=grace, **kwargs))
    except RolloutInputError as exc:
        fail(str(exc))
    except (httpx.HTTPError, BackendError) as exc:
        fail(str(exc), EXIT_PROBLEM)


# ----------------------------------------------------------------------------------------- rollout


@app.command()
def rollout(
    stack: StackOpt = DEFAULT_STACK,
    stack_file: StackFileOpt = None,
    to: Annotated[str | None, typer.Option("--to", help="Version to roll out, e.g. v2.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan; touch nothing.")] = False,
    as_json: JsonOpt = False,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the unfinished rollout of the stack.")] = False,
    state_dir: StateDirOpt = None,
    router_url: RouterUrlOpt = None,
    metrics_url: MetricsUrlOpt = None,
    router_grace_s: GraceOpt = 30.0,
    backend_kind: BackendOpt = "auto",
    known_hosts: KnownHostsOpt = DEFAULT_KNOWN_HOSTS,
    identity: IdentityOpt = None,
    kube_server: KubeServerOpt = None,
    kube_token_file: KubeTokenOpt = None,
    kube_ca_file: KubeCaOpt = None,
) -> None:
    """Roll the fleet to a new version in rollout.batches batches with metric gates; roll back on a breach."""
    st = resolve_stack(stack, stack_file)
    if resume == (to is not None):
        fail("give either --to VERSION (a new rollout) or --resume (continue the unfinished one)")
    paths = _paths(st, state_dir)
    choice = BackendChoice(backend_kind, known_hosts, identity, kube_server, kube_token_file, kube_ca_file)
    backend = _backend(st, paths, choice)
    if dry_run:
        assert to is not None
        _dry_run(st, paths, backend, to, as_json)
        return
    endpoints = _endpoints(st, router_url, metrics_url)
    with _locked(paths, f"rollout {'--resume' if resume else '--to ' + str(to)}"):
        latest = _latest(paths)
        if resume:
            if latest is None or latest.finished:
                fail(f"nothing to resume on stack {st.name!r}: no unfinished rollout in {paths.journal_path}")
            display = Display(latest.plan, backend, quiet_stdout=as_json)
            result = _run(paths, backend, endpoints, display, router_grace_s, operator_event="resume")
            _finish(result, as_json, ok={Outcome.COMPLETED})
        assert to is not None
        if latest is not None and not latest.finished:
            fail(unfinished_message(latest, st.name))
        plan = _new_plan(st, backend, latest, to)
        if plan is None:
            _nothing_to_do(st, to, as_json)
        display = Display(plan, backend, quiet_stdout=as_json)
        result = _run(
            paths, backend, endpoints, display, router_grace_s, plan=plan,
            before_start=lambda: check_fleet(backend, plan, plan.from_version),
        )  # fmt: skip
        _finish(result, as_json, ok={Outcome.COMPLETED})


def _new_plan(st: Stack, backend: Backend, latest: RolloutState | None, to: str) -> RolloutPlan | None:
    try:
        check_version(to, st.spec, backend)
    except RolloutInputError as exc:
        fail(str(exc))
    stable = stable_version(latest, st.spec.serving.version)
    if to == stable:
        return None
    return plan_rollout(st.spec, st.name, from_version=stable, to_version=to)


def _nothing_to_do(st: Stack, version: str, as_json: bool) -> NoReturn:
    if as_json:
        emit_json(
            {"stack": st.name, "from_version": version, "to_version": version, "outcome": "completed",
             "batches": [], "client_errors": 0, "final_versions": {}}
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
             "worst_case_s": plan.worst_case_s()}
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
def rollback(
    stack: StackOpt = DEFAULT_STACK,
    stack_file: StackFileOpt = None,
    as_json: JsonOpt = False,
    state_dir: StateDirOpt = None,
    router_url: RouterUrlOpt = None,
    metrics_url: MetricsUrlOpt = None,
    router_grace_s: GraceOpt = 30.0,
    backend_kind: BackendOpt = "auto",
    known_hosts: KnownHostsOpt = DEFAULT_KNOWN_HOSTS,
    identity: IdentityOpt = None,
    kube_server: KubeServerOpt = None,
    kube_token_file: KubeTokenOpt = None,
    kube_ca_file: KubeCaOpt = None,
) -> None:
    """Return the fleet to the last stable version: undo an unfinished or paused rollout, or revert
    the last completed one, batch by batch with the same drain discipline."""
    st = resolve_stack(stack, stack_file)
    paths = _paths(st, state_dir)
    choice = BackendChoice(backend_kind, known_hosts, identity, kube_server, kube_token_file, kube_ca_file)
    backend = _backend(st, paths, choice)
    endpoints = _endpoints(st, router_url, metrics_url)
    with _locked(paths, "rollback"):
        latest = _latest(paths)
        if latest is None or latest.outcome is Outcome.ROLLED_BACK or (latest.finished and not latest.plan.gated):
            _nothing_to_do(st, stable_version(latest, st.spec.serving.version), as_json)
        if not latest.finished:
            display = Display(latest.plan, backend, quiet_stdout=as_json)
            event = "resume" if not latest.plan.gated else "rollback"
            result = _run(paths, backend, endpoints, display, router_grace_s, operator_event=event)
            _finish(result, as_json, ok={Outcome.ROLLED_BACK, Outcome.COMPLETED})
        plan = plan_rollout(
            st.spec, st.name, from_version=latest.plan.to_version, to_version=latest.plan.from_version, kind="revert"
        )
        display = Display(plan, backend, quiet_stdout=as_json)
        result = _run(paths, backend, endpoints, display, router_grace_s, plan=plan)
        _finish(result, as_json, ok={Outcome.COMPLETED})
