"""What ``exaserve rollout`` / ``rollback`` decide before the runner starts — which rollout, from where
to where, with which backend — and the run itself. Inputs a user can get wrong raise
:class:`RolloutInputError` with the value, the rule and the fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from serving.rollout.backends import Backend
from serving.rollout.journal import Journal, StackState
from serving.rollout.machine import EventKind, Outcome, RolloutState, contract, initial, replay
from serving.rollout.plan import RolloutPlan
from serving.rollout.runner import ProgressFn, Runner
from serving.router.client import RouterClient
from serving.spec.schema import FleetSpec

VERSION_RULE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")  # serving.version's pattern


class RolloutInputError(ValueError):
    """A request the updater refuses before touching the fleet (exit 2)."""


@dataclass(frozen=True)
class Endpoints:
    router_url: str
    metrics_url: str


def stable_version(latest: RolloutState | None, declared: str) -> str:
    """The last version known good: the stack's ``serving.version`` until a rollout completes; a
    rollout that is unfinished, paused or rolled back leaves its from-version; a revert's target is it."""
    if latest is None:
        return declared
    plan = latest.plan
    if plan.kind == "revert" or latest.outcome is Outcome.COMPLETED:
        return plan.to_version
    return plan.from_version


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


async def check_fleet(backend: Backend, plan: RolloutPlan, expected: str) -> None:
    """Refuse to start when the fleet does not run the version the plan starts from."""
    running = await backend.versions(list(plan.replicas))
    off = {r: v for r, v in running.items() if v != expected}
    if off:
        shown = ", ".join(f"{r}={v or 'unreachable'}" for r, v in sorted(off.items())[:6])
        more = f" and {len(off) - 6} more" if len(off) > 6 else ""
        raise RolloutInputError(
            f"the fleet is not on {expected}: {shown}{more}. Bring it back first "
            "(`exaserve rollback`, or for the sandbox `exaserve sandbox up`)"
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
    plan: RolloutPlan | None = None,
    operator_event: EventKind | None = None,
    progress: ProgressFn | None = None,
    router_grace_s: float = 30.0,
    before_start: Callable[[], Awaitable[None]] | None = None,
) -> RunResult:
    """Start ``plan`` (a new journal) or continue the stack's journal with ``operator_event``
    (``resume`` or ``rollback``); SIGINT/SIGTERM pause at the next safe point. ``before_start`` runs
    before anything is written (a pre-flight check that may raise :class:`RolloutInputError`)."""
    if before_start is not None:
        await before_start()
    if plan is not None:
        journal = Journal.create(paths.journal_path, plan)
        state = initial(plan)
    else:
        journal, old_plan, events = Journal.open(paths.journal_path)
        state = replay(old_plan, events)
    async with RouterClient(endpoints.router_url, endpoints.metrics_url) as router:
        runner = Runner(state, journal, backend, router, progress=progress, router_grace_s=router_grace_s)
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
        versions = await backend.versions(list(final.plan.replicas))
    return RunResult(final, contract(final, versions), runner.readmitted_at, runner.rollback_started_at)
