"""One ``rollout`` or ``rollback`` of a stack: observe what the fleet runs, decide (:func:`plan_from_fleet`), run.

:class:`RolloutOperation` owns that flow for one fleet, one backend and its routers; the command line parses its
options into the values here (:class:`BackendConfig`, :class:`RouterTargets`), calls one method and presents the
result (:class:`Ran`, :class:`Planned` for a dry run, or :class:`NothingToDo`, each with its ``--json`` report).
Progress goes to a :class:`Reporter`. A request the updater refuses raises :class:`RolloutInputError` (also
:class:`LockedError`, :class:`JournalError`); a platform that fails during the run raises :class:`PlatformError`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import httpx

from serving.kubeapi import KubeApi, KubeConfigError
from serving.paths import MissingFileError, require_file
from serving.plan.model import Fleet
from serving.remote.fanout import load_ssh_config
from serving.remote.probes import FanoutError
from serving.render.k8s import gateway
from serving.rollout.backends import Backend, BackendError, local
from serving.rollout.backends.kubernetes import KubernetesBackend
from serving.rollout.backends.ssh import SshBackend
from serving.rollout.journal import StackLock, StackState, load_state
from serving.rollout.machine import EventKind, Outcome, RolloutState
from serving.rollout.plan import PlanKind, RolloutPlan
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

BackendKind = Literal["auto", "local", "ssh", "kubernetes"]
T = TypeVar("T")


class PlatformError(RuntimeError):
    """The platform (a backend, a router) failed during the run (exit 1); the message says what failed."""


# ----------------------------------------------------------------------------------------- backend


@dataclass(frozen=True)
class BackendConfig:
    """Which backend updates the replicas (``auto``: local processes for a sandbox stack, kubernetes otherwise)
    and what it needs: ``known_hosts``/``identity``/``ssh_config`` for ssh; for kubernetes the API server as
    :meth:`serving.kubeapi.KubeApi.resolve` finds it: ``kube_server`` with its bearer token file and CA bundle, or a
    kubeconfig (``kubeconfig``, ``kube_context``, else the stack's ``kubernetes:context``), or in-cluster."""

    kind: BackendKind = "auto"
    known_hosts: Path | None = None
    identity: Path | None = None
    kube_server: str | None = None
    kube_token_file: Path | None = None
    kube_ca_file: Path | None = None
    ssh_config: Path | None = None  # OpenSSH client configuration (serving.remote.fanout.load_ssh_config)
    kubeconfig: Path | None = None
    kube_context: str | None = None
    stack_kube_context: str | None = None  # the stack file's kubernetes:context (the Pulumi provider's)

    def resolved(self, fleet: Fleet) -> BackendKind:
        if self.kind == "auto":
            return "local" if fleet.spec.sandbox is not None else "kubernetes"
        return self.kind


def open_backend(fleet: Fleet, paths: StackState, config: BackendConfig) -> Backend:
    """The backend ``config`` names, over ``fleet``; :class:`RolloutInputError` when it cannot be opened."""
    kind = config.resolved(fleet)
    if kind != "local" and fleet.spec.rollout.dry_run_gates:
        raise RolloutInputError(
            f"--backend {kind}: rollout.dry_run_gates {list(fleet.spec.rollout.dry_run_gates)} would roll out to a "
            "fleet that serves clients with those gates never pausing or rolling back; they are for a sandbox's own "
            "processes (--backend local). Remove rollout.dry_run_gates from the stack"
        )
    try:
        if kind == "local":
            return local.registered().open(fleet, paths.sandbox_dir)
        if kind == "ssh":
            require_file(config.known_hosts, "--known-hosts", "the SSH backend verifies every host key")
            require_file(config.identity, "--identity", "pass an existing private key, or none to use your agent")
            if config.known_hosts is None:
                raise RolloutInputError("--backend ssh: pass --known-hosts, the SSH backend verifies every host key")
            try:
                ssh_config = load_ssh_config(config.ssh_config)
            except FanoutError as exc:
                raise RolloutInputError(str(exc)) from None
            return SshBackend(fleet, known_hosts=config.known_hosts, identity=config.identity, ssh_config=ssh_config)
        api = KubeApi.resolve(
            server=config.kube_server,
            token_file=config.kube_token_file,
            ca_file=config.kube_ca_file,
            kubeconfig=config.kubeconfig,
            context=config.kube_context,
            stack_context=config.stack_kube_context,
        )
        return KubernetesBackend(fleet, api)
    except MissingFileError as exc:
        raise RolloutInputError(str(exc)) from None
    except (BackendError, KubeConfigError, OSError) as exc:
        raise RolloutInputError(f"--backend {kind}: {exc}") from None


# ----------------------------------------------------------------------------------------- routers


@dataclass(frozen=True)
class RouterTargets:
    """The router instances as the operator names them: API URLs (``routers``), their headless Service
    (``service``, ``HOST:PORT``) and the port of each one's Prometheus listener (``metrics_port``)."""

    routers: tuple[str, ...] = ()
    service: str | None = None
    metrics_port: int | None = None


def resolve_endpoints(fleet: Fleet, kind: BackendKind, targets: RouterTargets) -> Endpoints:
    """Every router instance: ``targets``' routers and/or Service; on Kubernetes the gateway's headless Service by
    default, in a sandbox its routers. Their metrics: ``metrics_port`` on each instance's host, by default the port
    the stack renders (a sandbox's routers: each one's own port, from the stack)."""
    spec = fleet.spec
    routers = tuple(r.rstrip("/") for r in targets.routers)
    service = targets.service
    if spec.sandbox is not None and targets.metrics_port is None:
        sandbox = local.registered()
        if not routers and service is None:
            return sandbox.endpoints(spec)
        known = dict(sandbox.routers(spec))
        if unknown := [r for r in routers if r not in known]:
            raise RolloutInputError(
                f"--router {unknown[0]} is not a router of sandbox {fleet.name!r} (its routers listen on "
                f"{', '.join(known)}): name those, or give --router-metrics-port for routers of your own"
            )
        return Endpoints(routers, tuple(known[r] for r in routers), service)
    if kind == "ssh" and service is None and len(routers) < spec.scheduler.instances:
        raise RolloutInputError(
            f"{len(routers)} --router given, but the stack runs scheduler.instances = {spec.scheduler.instances} router "
            "instances: each must be told of every membership change and the gates must read every one's metrics. "
            "Pass --router http://HOST:PORT once for each router instance"
        )
    if service is None and not routers and kind == "kubernetes":
        http_port = gateway.cluster_router(fleet).port
        service = f"{gateway.PODS_SERVICE}.{spec.kubernetes.namespace}.svc:{http_port}"
    if not routers and service is None:
        raise RolloutInputError("no router instance given: pass --router http://HOST:PORT for each router instance")
    metrics_port = targets.metrics_port or gateway.cluster_router(fleet).metrics_port
    return Endpoints(routers, router_service=service, metrics_port=metrics_port)


# ----------------------------------------------------------------------------------------- the operation


class Reporter(Protocol):
    """Where an operation's progress goes (the command line's display): told the backend the run goes through
    (``via``), entered around the run, told what the operator reads before it (``note``) and every progress of
    the runner."""

    def via(self, backend: str) -> None: ...

    def __enter__(self) -> object: ...

    def __exit__(self, *exc: object) -> None: ...

    def note(self, text: str) -> None: ...

    def __call__(self, progress: Progress, /) -> None: ...


@dataclass(frozen=True)
class Ran:
    """A run to its end: the runner's result, whether it reached what was asked (exit 0 when ``done``), what every
    replica runs at the end (``8 × v2``) and the replicas held out of it (``a, b and 3 more``; empty: none)."""

    result: RunResult
    done: bool
    final_versions: str
    held: str

    @classmethod
    def of(cls, result: RunResult, done: bool) -> Ran:
        report = result.report
        return cls(result, done, FleetView(report["final_versions"]).summary(), listed(list(report["held"])))


@dataclass(frozen=True)
class NothingToDo:
    """Every replica in scope already runs ``to_version``: nothing ran. What the operator reads (``notes``), the
    fleet's versions (``8 × v2``), how many replicas were held, and the ``--json`` report."""

    to_version: str
    notes: tuple[str, ...]
    versions: str
    held: int
    report: dict[str, Any]

    @classmethod
    def of(cls, scope: Scope) -> NothingToDo:
        version, view = scope.to_version, scope.view
        report = {"from_version": version, "to_version": version, "outcome": "completed", "batches": [],
                  "client_errors": 0, "final_versions": view.final_versions(), **scope.report()}  # fmt: skip
        return cls(version, tuple(scope.notes()), view.summary(), len(scope.held), report)


@dataclass(frozen=True)
class Planned:
    """A dry run's plan (nothing changed): what the operator reads before it (``notes``), its configured waits and
    worst case, and the ``--json`` report."""

    plan: RolloutPlan
    notes: tuple[str, ...]
    configured_wait_s: float
    worst_case_s: float
    report: dict[str, Any]

    @classmethod
    def of(cls, scope: Scope) -> Planned | NothingToDo:
        plan = scope.plan
        if plan is None:
            return NothingToDo.of(scope)
        waits, worst = plan.configured_wait_s(), plan.worst_case_s()
        report = {**plan.to_json(), "dry_run": True, "configured_wait_s": waits, "worst_case_s": worst,
                  **scope.report()}  # fmt: skip
        return cls(plan, tuple(scope.notes()), waits, worst, report)


class RolloutOperation:
    """The rollouts and rollbacks of one stack's ``fleet`` through ``backend``, with its journal and lock under
    ``paths``; the routers (``targets``) are resolved when a run needs them (a dry run does not)."""

    def __init__(
        self,
        fleet: Fleet,
        paths: StackState,
        backend: Backend,
        *,
        kind: BackendKind,
        targets: RouterTargets = RouterTargets(),
        router_grace_s: float = 30.0,
        allow_degraded: bool = False,
        accept_inconclusive: bool = False,
    ) -> None:
        self.fleet, self.paths, self.backend, self.kind = fleet, paths, backend, kind
        self.targets, self.router_grace_s, self.allow_degraded = targets, router_grace_s, allow_degraded
        self.accept_inconclusive = accept_inconclusive
        self.replica_ids = [r.id for r in fleet.plan.replicas]

    @classmethod
    def open(
        cls,
        paths: StackState,
        fleet: Fleet,
        config: BackendConfig,
        targets: RouterTargets = RouterTargets(),
        *,
        router_grace_s: float = 30.0,
        allow_degraded: bool = False,
        accept_inconclusive: bool = False,
    ) -> RolloutOperation:
        """The operation over the backend ``config`` names (:func:`open_backend`)."""
        return cls(fleet, paths, open_backend(fleet, paths, config), kind=config.resolved(fleet), targets=targets,
                   router_grace_s=router_grace_s, allow_degraded=allow_degraded,
                   accept_inconclusive=accept_inconclusive)  # fmt: skip

    def dry_run(self, to: str, reporter: Reporter) -> Planned | NothingToDo:
        """Plan a rollout to ``to`` from what the fleet runs; touch nothing."""
        check_version(to, self.fleet.spec, self.backend)
        latest = self._latest()

        async def work() -> Planned | NothingToDo:
            return Planned.of(self._decider(to, "rollout")(await observe(self.backend, self.replica_ids, latest)))

        return self._sync(reporter, work())

    def start(self, to: str, reporter: Reporter) -> Ran | NothingToDo:
        """A new rollout to ``to``, planned from what the fleet runs; refused while one is unfinished."""
        check_version(to, self.fleet.spec, self.backend)
        endpoints = self._endpoints()
        with StackLock(self.paths.lock_path).held(f"rollout --to {to}"):
            latest = self._latest()
            if latest is not None and not latest.finished:
                raise RolloutInputError(unfinished_message(latest, self.fleet.name))
            return self._from_fleet(endpoints, reporter, self._decider(to, "rollout"), latest)

    def resume(self, reporter: Reporter) -> Ran:
        """Continue the journal's unfinished rollout."""
        endpoints = self._endpoints()
        with StackLock(self.paths.lock_path).held("rollout --resume"):
            latest = self._latest()
            if latest is None or latest.finished:
                raise RolloutInputError(
                    f"nothing to resume on stack {self.fleet.name!r}: no unfinished rollout in {self.paths.journal_path}"
                )
            return self._continue(endpoints, reporter, "resume", ok={Outcome.COMPLETED})

    def rollback(self, reporter: Reporter) -> Ran | NothingToDo:
        """Return to the last stable version: undo an unfinished rollout (finish an unfinished revert), or revert
        every replica that runs something else to the version the journal's last rollout started from."""
        endpoints = self._endpoints()
        with StackLock(self.paths.lock_path).held("rollback"):
            latest = self._latest()
            if latest is not None and not latest.finished:
                event: EventKind = "resume" if not latest.plan.gated else "rollback"
                return self._continue(endpoints, reporter, event, ok={Outcome.ROLLED_BACK, Outcome.COMPLETED})
            if latest is None:
                version = self.fleet.spec.serving.version
                decide: Callable[[FleetView], Scope] = lambda view: Scope(version, None, {}, view)  # noqa: E731
            else:
                # A gated rollout's stable version is its from-version (a completed one is reverted); a revert's, its target.
                stable = latest.plan.from_version if latest.plan.gated else latest.plan.to_version
                decide = self._decider(stable, "revert")
            return self._from_fleet(endpoints, reporter, decide, latest)

    def _endpoints(self) -> Endpoints:
        return resolve_endpoints(self.fleet, self.kind, self.targets)

    def _latest(self) -> RolloutState | None:
        return load_state(self.paths.journal_path)

    def _decider(self, to: str, kind: PlanKind) -> Callable[[FleetView], Scope]:
        def decide(view: FleetView) -> Scope:
            return plan_from_fleet(self.fleet, view, to, kind=kind, allow_degraded=self.allow_degraded,
                                   whole_groups=self.backend.updates_whole_groups)  # fmt: skip

        return decide

    def _from_fleet(
        self,
        endpoints: Endpoints,
        reporter: Reporter,
        decide: Callable[[FleetView], Scope],
        latest: RolloutState | None,
    ) -> Ran | NothingToDo:
        """Read what the fleet runs, plan from it with ``decide``, and run that plan (or say there is nothing to do)."""

        async def work() -> Ran | NothingToDo:
            scope = decide(await observe(self.backend, self.replica_ids, latest))
            for line in scope.notes():
                reporter.note(line)
            if scope.plan is None:
                return NothingToDo.of(scope)
            result = await run(self.paths, self.backend, endpoints, fleet=self.replica_ids, plan=scope.plan,
                               scope=scope, progress=reporter, router_grace_s=self.router_grace_s,
                               accept_inconclusive=self.accept_inconclusive)  # fmt: skip
            return Ran.of(result, result.state.outcome == Outcome.COMPLETED)

        return self._sync(reporter, work())

    def _continue(self, endpoints: Endpoints, reporter: Reporter, event: EventKind, *, ok: set[Outcome]) -> Ran:
        """Continue the journal's rollout with an operator event (``resume`` or ``rollback``): the journal drives."""

        async def work() -> Ran:
            result = await run(self.paths, self.backend, endpoints, fleet=self.replica_ids, operator_event=event,
                               progress=reporter, router_grace_s=self.router_grace_s,
                               accept_inconclusive=self.accept_inconclusive)  # fmt: skip
            return Ran.of(result, result.state.outcome in ok)

        return self._sync(reporter, work())

    def _sync(self, reporter: Reporter, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` (one event loop for the backend's connections) under ``reporter``; a platform that fails
        raises :class:`PlatformError`."""

        async def closing() -> T:  # the backend's connections close in the loop that opened them
            try:
                return await work
            finally:
                await self.backend.aclose()

        reporter.via(self.backend.name)
        try:
            with reporter:
                return asyncio.run(closing())
        except (httpx.HTTPError, BackendError) as exc:
            raise PlatformError(str(exc)) from exc
