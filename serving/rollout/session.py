"""What ``exaserve rollout`` / ``rollback`` decide before the runner starts — which rollout, from where
to where, with which backend — and the run itself. Inputs a user can get wrong raise
:class:`RolloutInputError` with the value, the rule and the fix.

The fleet is the truth, the journal a log: a new rollout (or revert) reads the version every replica runs
(:meth:`Backend.versions <serving.rollout.backends.Backend.versions>`) and plans from that
(:func:`plan_from_fleet`): replicas already on the target are left alone, the others are planned from the
version they run, a replica that is down stops the start unless the operator proceeds degraded, and where
the journal says otherwise the report says so. The journal still drives ``--resume`` and the rollback of
an unfinished rollout, and names the version ``rollback`` returns to.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from serving.plan.model import Fleet, Plan
from serving.rollout.backends import Backend
from serving.rollout.journal import Journal, StackState
from serving.rollout.machine import EventKind, RolloutState, contract, initial, replay
from serving.rollout.plan import PlanKind, RolloutPlan, plan_rollout
from serving.rollout.runner import ProgressFn, Runner
from serving.router.membership import RouterSet
from serving.spec.schema import FleetSpec

VERSION_RULE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")  # serving.version's pattern


class RolloutInputError(ValueError):
    """A request the updater refuses before touching the fleet (exit 2)."""


@dataclass(frozen=True)
class Endpoints:
    """Every router instance the rollout moves replicas on and whose metrics the gates sum: ``routers`` by API URL
    and/or ``router_service``, their headless Service (``HOST:PORT``, one address per instance). Each instance's
    Prometheus listener: ``metrics`` (one URL per entry of ``routers``: a sandbox's routers each have their own
    port), else ``metrics_port`` on the instance's own host."""

    routers: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ()
    router_service: str | None = None
    metrics_port: int | None = None

    @property
    def router_url(self) -> str:
        """The first listed instance's API URL (a sandbox's router 0: where its clients and ``sandbox status`` go)."""
        return self.routers[0]

    @property
    def metrics_url(self) -> str:
        return self.router_set().metrics_url(self.router_url)

    def router_set(self) -> RouterSet:
        return RouterSet(
            self.routers, metrics=self.metrics, service=self.router_service, metrics_port=self.metrics_port
        )


def check_version(version: str, spec: FleetSpec, backend: Backend, field: str = "--to") -> None:
    if not VERSION_RULE.match(version):
        raise RolloutInputError(
            f"{field} {version!r} is not a version label: use letters, digits, '.', '_' or '-' "
            "(at most 63, starting with a letter or digit), e.g. v2"
        )
    releases = spec.serving.releases
    if version not in releases:
        raise RolloutInputError(
            f"{field} {version!r} is not in serving.releases ({', '.join(sorted(releases))}); "
            "add the release and its pinned image under serving.releases in the stack"
        )
    known = backend.known_versions()
    if known is not None and version not in known:
        raise RolloutInputError(
            f"{field} {version!r} is not a release this stack can run; known: {', '.join(sorted(known))}. "
            "Add it (for the sandbox: under sandbox.versions) or pick one of these"
        )


def unfinished_message(state: RolloutState, stack: str) -> str:
    plan = state.plan
    where = f"at batch {state.step.batch} ({state.step.phase.value})" if state.step else "paused"
    what = "rollout" if plan.gated else "revert"
    return (
        f"a {what} {plan.from_version} → {plan.to_version} of stack {stack!r} is unfinished ({where}); "
        f"run `exaserve rollout --stack {stack} --resume` to continue it or `exaserve rollback --stack {stack}`"
    )


DOWN = "down"  # a replica that is down or unreachable, as reports show it


def shown(version: str | None) -> str:
    return DOWN if version is None else version


def listed(replicas: Sequence[str], limit: int = 8) -> str:
    """``a, b, c and 5 more``: replica names in a message, bounded for a 2,048-replica fleet."""
    more = f" and {len(replicas) - limit} more" if len(replicas) > limit else ""
    return ", ".join(replicas[:limit]) + more


def journal_versions(latest: RolloutState | None) -> dict[str, str | None]:
    """What the journal's latest rollout says each replica runs: the fleet as it observed it at its start,
    then the version it last set on each of its batches (a journal from before observations were recorded:
    its from-version). Empty without a journal."""
    if latest is None:
        return {}
    plan = latest.plan
    out: dict[str, str | None] = dict(plan.observed)
    for rec in latest.batches:
        for r in plan.batch(rec.index).replicas:
            out[r] = rec.version or out.get(r, plan.from_version)
    return out


@dataclass(frozen=True)
class FleetView:
    """Every replica of the stack with the version it runs (None: down or unreachable), in fleet order, and
    what the journal says it runs (replicas the journal does not know are absent)."""

    observed: Mapping[str, str | None]
    journal: Mapping[str, str | None] = field(default_factory=dict)
    unreachable: Mapping[str, str] = field(default_factory=dict)  # node → why its replicas could not be read

    @property
    def down(self) -> tuple[str, ...]:
        return tuple(r for r, v in self.observed.items() if v is None)

    def final_versions(self) -> dict[str, str]:
        return {r: shown(v) for r, v in self.observed.items()}

    def disagreements(self) -> list[dict[str, str]]:
        """Replicas whose observed version is not the journal's: ``{replica, journal, observed}``."""
        return [
            {"replica": r, "journal": shown(self.journal[r]), "observed": shown(v)}
            for r, v in self.observed.items()
            if r in self.journal and self.journal[r] != v
        ]

    def summary(self) -> str:
        """``8 × v1, 1 × down``."""
        counts = Counter(shown(v) for v in self.observed.values())
        return ", ".join(f"{n} × {v}" for v, n in sorted(counts.items()))


async def observe(backend: Backend, replicas: Sequence[str], latest: RolloutState | None) -> FleetView:
    """Read what the fleet runs now, next to what the journal says."""
    observed = await backend.versions(list(replicas))
    return FleetView(observed, journal_versions(latest), backend.unreachable())


@dataclass(frozen=True)
class Scope:
    """A rollout planned from the fleet: the plan (None: nothing to do), the replicas left as they are with
    why, and the observation it came from."""

    to_version: str
    plan: RolloutPlan | None
    held: Mapping[str, str]
    view: FleetView

    def report(self) -> dict[str, Any]:
        """The observation's part of the ``--json`` report."""
        return {"journal_disagreements": self.view.disagreements(), "held": dict(self.held)}

    def notes(self) -> list[str]:
        """What the operator reads before the run: disagreements with the journal, held replicas, the scope."""
        out = []
        if off := self.view.disagreements():
            by = Counter((d["journal"], d["observed"]) for d in off)
            pairs = "; ".join(f"{n} say {j}, run {o}" for (j, o), n in sorted(by.items()))
            out.append(
                f"the journal disagrees with the fleet on {len(off)} replicas ({pairs}): "
                f"{listed([d['replica'] for d in off])}; planning from what they run"
            )
        reasons: dict[str, list[str]] = {}
        for r, why in self.held.items():
            reasons.setdefault(why, []).append(r)
        out += [f"held, left as they are ({why}): {listed(rs)}" for why, rs in reasons.items()]
        if self.plan is not None:
            n, total = len(self.plan.replicas), len(self.view.observed)
            out.append(
                f"fleet: {self.view.summary()}; planned {n} of {total} replicas "
                f"{self.plan.from_version} → {self.plan.to_version} in {len(self.plan.batches)} batches"
            )
        return out


def plan_from_fleet(
    fleet: Fleet,
    view: FleetView,
    to_version: str,
    *,
    kind: PlanKind = "rollout",
    allow_degraded: bool = False,
    whole_groups: bool = False,
) -> Scope:
    """Plan ``to_version`` for the replicas that do not run it (pure).

    * A replica that is down refuses the start (:class:`RolloutInputError` naming it and the fix) unless
      ``allow_degraded``: then it is held — not removed, updated or readmitted. With ``whole_groups`` (an
      update moves a whole group, as on Kubernetes) a group with a down replica is held as a whole, and a
      group with any replica off the target is planned whole.
    * The from-version is what the planned replicas run. A gated rollout needs exactly one, and a release
      of the stack: it is what a breach rolls back to. A revert (no rollback of its own) records several
      as ``v2+v3``.
    """
    groups: dict[int, list[str]] = {}
    for r in fleet.plan.replicas:
        groups.setdefault(r.group if whole_groups else r.index, []).append(r.id)
    observed = view.observed
    down = [r for r in (x.id for x in fleet.plan.replicas) if observed.get(r) is None]
    if down and not allow_degraded:
        raise RolloutInputError(_down_message(down, fleet.plan, whole_groups, kind, view.unreachable))
    held: dict[str, str] = {}
    planned: list[str] = []
    for members in groups.values():
        if all(observed.get(r) == to_version for r in members):
            continue
        dead = [r for r in members if observed.get(r) is None]
        if dead:
            held.update({r: DOWN if r in dead else f"in an update group with {listed(dead, 3)} down" for r in members})
            continue
        planned += members
    sources = Counter(v for r in planned if (v := observed.get(r)) not in (None, to_version))
    if not sources:
        return Scope(to_version, None, held, view)
    if kind == "rollout":
        _check_source(sources, planned, observed, to_version, fleet.spec)
    from_version = "+".join(sorted(sources))
    plan = plan_rollout(
        fleet, from_version=from_version, to_version=to_version, kind=kind, only=set(planned),
        observed=observed,
    )  # fmt: skip
    return Scope(to_version, plan, held, view)


def _down_message(
    down: list[str], fleet_plan: Plan, whole_groups: bool, kind: PlanKind, unreachable: Mapping[str, str]
) -> str:
    what = "rollout" if kind == "rollout" else "revert"
    held = "their update groups are held whole" if whole_groups else "they are held"
    causes: dict[str, list[str]] = {}
    for node, why in sorted(unreachable.items()):
        causes.setdefault(why, []).append(node)
    reached = "".join(
        f"\n  {len(nodes)} node(s) not reached: {listed(nodes, 4)}: {why}" for why, nodes in causes.items()
    )
    if unreachable:  # what --dry-run needs: the plan starts from what every replica runs
        reached += (
            "\n  every command that plans, --dry-run included, first reads what each replica runs over SSH: for the "
            "nodes not reached, check the route to them and their sshd, that --known-hosts holds their host keys "
            "and that -i/--identity (or your agent) holds a key they accept (`exaserve fleet exec --stack NAME -- "
            "uptime` tries every node the same way)"
        )
    return (
        f"{len(down)} of {len(fleet_plan.replicas)} replicas are down or unreachable: {listed(down)}; the {what} "
        "would drain, update and health-check around them blind, so it does not start. Bring them back (start "
        "the replica's unit or pod; for a sandbox `exaserve sandbox up`) and run it again, or pass "
        f"--allow-degraded to go ahead without them ({held}: not removed, updated or readmitted, and named in "
        f"the report){reached}"
    )


def _check_source(
    sources: Counter[str], planned: list[str], observed: Mapping[str, str | None], to_version: str, spec: FleetSpec
) -> None:
    """A gated rollout rolls a breach back to one release: the planned replicas must run exactly one."""
    if len(sources) > 1:
        by = "; ".join(
            f"{v} on {listed([r for r in planned if observed.get(r) == v], 4)}" for v, _ in sources.most_common()
        )
        common = sources.most_common(1)[0][0]
        raise RolloutInputError(
            f"the replicas off {to_version} run {len(sources)} versions ({by}); a breach could roll back to only "
            f"one. Bring them onto one version first, e.g. `exaserve rollout --to {common}` (it plans only the "
            f"replicas off {common}), then roll out {to_version}"
        )
    (source,) = sources
    if source not in spec.serving.releases:
        raise RolloutInputError(
            f"replicas {listed([r for r in planned if observed.get(r) == source], 4)} run {source}, which is no "
            f"release of serving.releases; a breach could not roll back to it. Re-apply the stack (`pulumi up`) "
            "or add the release, then run the rollout again"
        )


@dataclass(frozen=True)
class RunResult:
    state: RolloutState
    report: dict[str, Any]
    readmitted_at: dict[int, float]
    rollback_started_at: float | None


async def run(
    paths: StackState,
    backend: Backend,
    endpoints: Endpoints,
    *,
    fleet: Sequence[str],
    plan: RolloutPlan | None = None,
    scope: Scope | None = None,
    operator_event: EventKind | None = None,
    progress: ProgressFn | None = None,
    router_grace_s: float = 30.0,
    accept_inconclusive: bool = False,
) -> RunResult:
    """Start ``plan`` (a new journal) or continue the stack's journal with ``operator_event``
    (``resume`` or ``rollback``); SIGINT/SIGTERM pause at the next safe point; ``accept_inconclusive``: gates that
    too little traffic leaves unjudged pass instead of pausing. The report's
    ``final_versions`` is what every replica of ``fleet`` runs at the end (``down`` if it does not answer),
    with ``scope``'s observation (journal disagreements, held replicas) when the plan came from one."""
    if plan is not None:
        journal = Journal.create(paths.journal_path, plan)
        state = initial(plan)
    else:
        journal, old_plan, events = Journal.open(paths.journal_path)
        state = replay(old_plan, events)
    membership = backend.membership(endpoints.router_set())
    runner = Runner(state, journal, backend, membership, progress=progress, router_grace_s=router_grace_s,
                    accept_inconclusive=accept_inconclusive)  # fmt: skip
    if operator_event is not None:
        runner.record(operator_event)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, runner.request_pause)
    try:
        final = await runner.run()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError, RuntimeError):
                loop.remove_signal_handler(sig)
    versions = await backend.versions(list(fleet))
    report = contract(final, {r: shown(v) for r, v in versions.items()})
    report |= scope.report() if scope is not None else {"journal_disagreements": [], "held": {}}
    return RunResult(final, report, runner.readmitted_at, runner.rollback_started_at)
