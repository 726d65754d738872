"""The rollout state machine — pure: the state is data, events are data, :func:`advance` folds them.

The I/O shell (:mod:`serving.rollout.runner`) asks :attr:`RolloutState.step` what to do, does it,
and reports the result as an :class:`Event`; the journal stores the events, so the state after a
crash is ``replay(plan, events)``. Every step is idempotent (removing a worker that is gone, draining
an idle worker, setting a version a replica already runs, readmitting a registered worker are
no-ops), so re-running the step that was in flight when the updater died is always safe.

Forward path of each batch (gated rollout)::

    remove → drain → update → health → warmup → readmit → soak → next batch … → completed

A failed step (update error, health timeout, warm-up errors, a gate breach) pauses the forward path
and rolls back every batch whose update had begun, newest first, with the same drain discipline::

    remove → drain → update (old version) → health → readmit → … → rolled_back

A revert (``exaserve rollback`` after a completed rollout) runs the rollback discipline forward with
no baseline, warm-up or soak. A pause request (SIGINT/SIGTERM) takes effect at the next point where
every replica is in the router; ``--resume`` continues from there. If a rollback step fails the batch
stays out of the router (it is not healthy) and the outcome is ``paused`` with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from serving.rollout.gates.verdict import Gates
from serving.rollout.gates.window import WindowStats
from serving.rollout.plan import RolloutPlan


class Phase(StrEnum):
    BASELINE = "baseline"
    REMOVE = "remove"
    DRAIN = "drain"
    UPDATE = "update"
    HEALTH = "health"
    WARMUP = "warmup"
    READMIT = "readmit"
    SOAK = "soak"


class Outcome(StrEnum):
    COMPLETED = "completed"
    ROLLED_BACK = "rolled_back"
    PAUSED = "paused"


FORWARD_GATED = (Phase.REMOVE, Phase.DRAIN, Phase.UPDATE, Phase.HEALTH, Phase.WARMUP, Phase.READMIT, Phase.SOAK)
RESTORE = (Phase.REMOVE, Phase.DRAIN, Phase.UPDATE, Phase.HEALTH, Phase.READMIT)
# Phases during which a batch is (or may be) out of the router: after its removal began, before readmission.
OUT_OF_ROUTER = frozenset({Phase.DRAIN, Phase.UPDATE, Phase.HEALTH, Phase.WARMUP, Phase.READMIT})

EventKind = Literal["baseline", "blocked", "done", "failed", "outside", "pause", "resume", "rollback", "router_lost"]


@dataclass(frozen=True)
class Step:
    """What the shell should do next: a phase of one batch (``batch`` is None for the baseline)."""

    phase: Phase
    batch: int | None
    rollback: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase.value, "batch": self.batch, "rollback": self.rollback}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Step:
        return cls(Phase(data["phase"]), data["batch"], bool(data["rollback"]))


@dataclass(frozen=True)
class Event:
    """The result of a step (or an operator action). ``at`` is wall-clock Unix time.

    ``client_errors`` is the cumulative count of client-facing router errors since the rollout
    began, as the shell measured it when the event happened.
    """

    kind: EventKind
    at: float
    step: Step | None = None
    detail: str = ""
    gates: Gates | None = None
    baseline: WindowStats | None = None
    client_errors: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "at": self.at,
            "step": self.step.to_json() if self.step else None,
            "detail": self.detail,
            "gates": self.gates.to_json() if self.gates else None,
            "baseline": self.baseline.to_json() if self.baseline else None,
            "client_errors": self.client_errors,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Event:
        return cls(
            kind=data["kind"],
            at=float(data["at"]),
            step=Step.from_json(data["step"]) if data.get("step") else None,
            detail=str(data.get("detail", "")),
            gates=Gates.from_json(data["gates"]) if data.get("gates") else None,
            baseline=WindowStats.from_json(data["baseline"]) if data.get("baseline") else None,
            client_errors=float(data.get("client_errors", 0.0)),
        )


@dataclass(frozen=True)
class BatchRecord:
    index: int
    started_at: float | None = None
    finished_at: float | None = None
    gates: Gates | None = None
    passed: bool | None = None
    version: str | None = None  # the version its replicas were last set to (None: untouched)
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class RolloutState:
    plan: RolloutPlan
    step: Step | None
    batches: tuple[BatchRecord, ...]
    outcome: Outcome | None = None
    resume_step: Step | None = None  # where a paused rollout continues
    baseline: WindowStats | None = None
    rollback_queue: tuple[int, ...] = ()
    reason: str = ""
    pause_requested: bool = False
    client_errors: float = 0.0
    failed_restores: tuple[int, ...] = ()
    events: int = field(default=0, compare=False)

    @property
    def finished(self) -> bool:
        """Terminal (completed or rolled back); a paused rollout can still resume or roll back."""
        return self.outcome in (Outcome.COMPLETED, Outcome.ROLLED_BACK)

    @property
    def active(self) -> bool:
        return self.outcome is None

    @property
    def rolling_back(self) -> bool:
        return self.step is not None and self.step.rollback

    def out_of_router(self) -> frozenset[str]:
        """Replicas that must not be in the router now (the shell keeps the router in line with this)."""
        out: set[str] = set()
        if self.step is not None and self.step.batch is not None and self.step.phase in OUT_OF_ROUTER:
            out.update(self.plan.batch(self.step.batch).replicas)
        for b in self.failed_restores:
            out.update(self.plan.batch(b).replicas)
        return frozenset(out)

    def expected_versions(self) -> dict[str, str]:
        """The version each replica should run once the current step has finished."""
        out: dict[str, str] = {}
        for rec in self.batches:
            for r in self.plan.batch(rec.index).replicas:
                out[r] = rec.version or self.plan.from_version
        return out


def initial(plan: RolloutPlan) -> RolloutState:
    first = Step(Phase.BASELINE, None) if plan.gated else Step(Phase.REMOVE, 0)
    return RolloutState(plan=plan, step=first, batches=tuple(BatchRecord(b.index) for b in plan.batches))


def replay(plan: RolloutPlan, events: list[Event]) -> RolloutState:
    state = initial(plan)
    for ev in events:
        state = advance(state, ev)
    return state


class TransitionError(ValueError):
    """An event that cannot follow the current state (a corrupt or foreign journal)."""


def _set_batch(state: RolloutState, index: int, **changes: Any) -> tuple[BatchRecord, ...]:
    return tuple(replace(b, **changes) if b.index == index else b for b in state.batches)


def _phases(state: RolloutState, rollback: bool) -> tuple[Phase, ...]:
    return FORWARD_GATED if state.plan.gated and not rollback else RESTORE


def _next_in_batch(state: RolloutState, step: Step) -> Phase | None:
    phases = _phases(state, step.rollback)
    i = phases.index(step.phase)
    return phases[i + 1] if i + 1 < len(phases) else None


def _start_rollback(state: RolloutState, reason: str) -> RolloutState:
    """Stop the forward path and queue every touched batch for restore, newest first.

    Touched: set to the new version (its update may have begun) or a restore that failed before.
    A batch that was being removed or drained but not yet updated only needs readmission.
    """
    plan = state.plan
    touched = sorted(
        {b.index for b in state.batches if b.version not in (None, plan.from_version)} | set(state.failed_restores),
        reverse=True,
    )
    state = replace(state, failed_restores=(), reason=reason, resume_step=None, outcome=None, pause_requested=False)
    current = state.step
    if (
        current is not None
        and current.batch is not None
        and current.batch not in touched
        and current.phase in (Phase.REMOVE, Phase.DRAIN)
    ):
        return replace(state, step=Step(Phase.READMIT, current.batch, rollback=True), rollback_queue=tuple(touched))
    if not touched:
        return replace(state, step=None, outcome=Outcome.ROLLED_BACK)
    return replace(state, step=Step(Phase.REMOVE, touched[0], rollback=True), rollback_queue=tuple(touched[1:]))


def _after_restore(state: RolloutState) -> RolloutState:
    """The current restore is over (done or failed): next queued batch, or the end. A batch whose restore failed
    stays out of the router, so nothing more is removed: pause (``exaserve rollback`` retries, newest first)."""
    if state.failed_restores:
        return replace(state, step=None, outcome=Outcome.PAUSED, resume_step=None)
    if state.rollback_queue:
        nxt, *rest = state.rollback_queue
        return replace(state, step=Step(Phase.REMOVE, nxt, rollback=True), rollback_queue=tuple(rest))
    return replace(state, step=None, outcome=Outcome.ROLLED_BACK)


def _pause(state: RolloutState, resume_at: Step, reason: str) -> RolloutState:
    return replace(state, step=None, outcome=Outcome.PAUSED, resume_step=resume_at, reason=reason)


def advance(state: RolloutState, ev: Event) -> RolloutState:
    """The state after ``ev``. Raises :class:`TransitionError` for an event that cannot happen now."""
    state = replace(state, events=state.events + 1, client_errors=max(state.client_errors, ev.client_errors))
    if ev.kind == "resume":
        return _resume(state)
    if ev.kind == "rollback":
        return _operator_rollback(state, ev)
    if state.finished:
        raise TransitionError(f"event {ev.kind!r} after the rollout ended ({state.outcome})")
    if ev.kind == "pause":
        return _pause_request(state)
    step = state.step
    if step is None:
        raise TransitionError(f"event {ev.kind!r} while paused; resume or roll back first")
    if ev.step is not None and ev.step != step:
        raise TransitionError(f"event for {ev.step} but the current step is {step}")
    if ev.kind == "router_lost":
        return _pause(state, step, f"router lost during {_where(step)}: {ev.detail}")
    if ev.kind == "blocked":  # the platform waits on an operator (PodsStuck): a rollback would wait on the same pods
        return _pause(state, step, f"{_where(step)} blocked: {ev.detail}")
    if ev.kind == "outside":
        return _outside(state, step, ev)
    if ev.kind == "baseline":
        if step.phase is not Phase.BASELINE or ev.baseline is None:
            raise TransitionError("a baseline event needs the baseline step and its measurement")
        state = replace(state, baseline=ev.baseline)
        if state.pause_requested:
            return _pause(state, Step(Phase.REMOVE, 0), "paused by the operator before the first batch")
        return replace(state, step=Step(Phase.REMOVE, 0))
    if step.batch is None:
        raise TransitionError(f"event {ev.kind!r} needs a batch step, the current step is {step}")
    if ev.kind == "done":
        return _done(state, step, step.batch, ev)
    if ev.kind == "failed":
        return _failed(state, step, step.batch, ev)
    raise TransitionError(f"unknown event kind {ev.kind!r}")


def _outside(state: RolloutState, step: Step, ev: Event) -> RolloutState:
    """A soak's verdict found evidence outside the batch: pause with the batch in the router and its verdict on
    record, never roll back; ``--resume`` soaks it again, ``exaserve rollback`` undoes the touched batches."""
    if step.phase is Phase.BASELINE:  # too little traffic to judge any batch: nothing changed, resume measures again
        return _pause(state, step, f"paused before the first batch: {ev.detail}")
    if step.phase is not Phase.SOAK or step.batch is None or step.rollback:
        raise TransitionError(
            f"an 'outside' verdict needs a forward soak or the baseline step, the current step is {step}"
        )
    b = step.batch
    state = replace(state, batches=_set_batch(state, b, gates=ev.gates, notes=(*state.batches[b].notes, ev.detail)))
    return _pause(state, step, f"{_where(step)} paused: {ev.detail}")


def _where(step: Step) -> str:
    what = "rollback of " if step.rollback else ""
    return f"{what}batch {step.batch} ({step.phase.value})" if step.batch is not None else step.phase.value


def _done(state: RolloutState, step: Step, b: int, ev: Event) -> RolloutState:
    plan = state.plan
    target = plan.from_version if step.rollback else plan.to_version
    if step.phase is Phase.REMOVE and not step.rollback and state.batches[b].started_at is None:
        state = replace(state, batches=_set_batch(state, b, started_at=ev.at))
    if step.phase is Phase.DRAIN:
        # From here on the batch's replicas may run the target version: the update is about to start.
        state = replace(state, batches=_set_batch(state, b, version=target))
    if ev.detail:
        state = replace(state, batches=_set_batch(state, b, notes=(*state.batches[b].notes, ev.detail)))
    nxt = _next_in_batch(state, step)
    if step.rollback:
        return replace(state, step=Step(nxt, b, rollback=True)) if nxt is not None else _after_restore(state)
    if nxt is None:  # the batch's last phase passed (soak, or readmit in a revert)
        state = replace(state, batches=_set_batch(state, b, finished_at=ev.at, gates=ev.gates, passed=True))
        return _next_forward_batch(state, b)
    if nxt is Phase.SOAK and state.pause_requested:
        return _pause(state, Step(Phase.SOAK, b), f"paused by the operator after batch {b} was readmitted")
    return replace(state, step=Step(nxt, b))


def _next_forward_batch(state: RolloutState, b: int) -> RolloutState:
    if b + 1 >= len(state.plan.batches):
        return replace(state, step=None, outcome=Outcome.COMPLETED)
    nxt = Step(Phase.REMOVE, b + 1)
    if state.pause_requested:
        return _pause(state, nxt, f"paused by the operator after batch {b}")
    return replace(state, step=nxt)


def _failed(state: RolloutState, step: Step, b: int, ev: Event) -> RolloutState:
    reason = f"{_where(step)} failed: {ev.detail}" if ev.detail else f"{_where(step)} failed"
    notes = (*state.batches[b].notes, reason)
    if step.rollback:
        state = replace(
            state,
            batches=_set_batch(state, b, notes=notes),
            failed_restores=(*state.failed_restores, b),
            reason="; ".join(x for x in (state.reason, reason) if x),
        )
        return _after_restore(state)
    state = replace(state, batches=_set_batch(state, b, finished_at=ev.at, gates=ev.gates, passed=False, notes=notes))
    if not state.plan.gated:
        # A revert restores the known-good release; if that fails there is nothing older to go back
        # to: stop with the batch out of the router and let the operator fix it and resume.
        state = replace(state, failed_restores=(*state.failed_restores, b))
        return _pause(state, Step(Phase.REMOVE, b), reason)
    return _start_rollback(state, reason)


def _pause_request(state: RolloutState) -> RolloutState:
    step = state.step
    if step is None or step.rollback:
        return state  # already paused, or restoring: a rollback always runs to its end
    if step.phase in (Phase.BASELINE, Phase.SOAK) or (step.phase is Phase.REMOVE and step.batch is not None):
        # Nothing of this step is out of the router: stop here (a soak restarts on resume).
        return _pause(state, step, f"paused by the operator at {_where(step)}")
    return replace(state, pause_requested=True)


def _resume(state: RolloutState) -> RolloutState:
    if state.outcome is Outcome.PAUSED and state.resume_step is not None:
        return replace(
            state,
            step=state.resume_step,
            outcome=None,
            resume_step=None,
            pause_requested=False,
            reason="",
            failed_restores=() if not state.plan.gated else state.failed_restores,
        )
    return replace(state, pause_requested=False)


def _operator_rollback(state: RolloutState, ev: Event) -> RolloutState:
    """``exaserve rollback`` on an unfinished or paused rollout: restore every touched batch."""
    if state.finished:
        raise TransitionError(f"the rollout already ended ({state.outcome}); plan a revert instead")
    if state.rolling_back:
        return state
    if state.resume_step is not None and state.resume_step.rollback:
        # a rollback paused mid-restore (router lost, a restore blocked on stuck pods) goes on from that step: started
        # afresh, its queue would be rebuilt from the batches' versions, which the restore's drain already set back,
        # and the batch being restored would be skipped, left out of the routers
        return _resume(state)
    if not state.plan.gated:
        raise TransitionError("a revert cannot itself be rolled back; run `exaserve rollout --to` instead")
    state = replace(state, step=state.step or state.resume_step)
    return _start_rollback(state, ev.detail or "rollback requested by the operator")


def _judgement(rec: BatchRecord) -> dict[str, Any]:
    """The batch's ``canary`` and ``baseline`` figures, its ``verdict`` (decision, basis, evidence, replicas) and its
    ``kv_pool`` check (the canary's pool against the plan, :mod:`serving.rollout.kvpool`): the soak's own; for a
    batch that failed before its soak, a rollback naming the failed step; null when undecided."""
    g = rec.gates
    verdict = g.verdict.to_json() if g is not None and g.verdict is not None else None
    if verdict is None and rec.passed is False:
        verdict = {"decision": "rollback", "basis": None, "evidence": list(rec.notes[-1:]), "replicas": []}
    return {
        "canary": g.canary.to_json() if g is not None and g.canary is not None else None,
        "baseline": g.baseline.to_json() if g is not None and g.baseline is not None else None,
        "verdict": verdict,
        "kv_pool": g.kv_pool.to_json() if g is not None and g.kv_pool is not None else None,
    }


def contract(state: RolloutState, final_versions: dict[str, str | None]) -> dict[str, Any]:
    """The ``--json`` report of the issue's contract (timestamps ISO 8601, UTC)."""

    def iso(t: float | None) -> str | None:
        return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds") if t is not None else None

    plan = state.plan
    outcome = state.outcome or Outcome.PAUSED
    return {
        "stack": plan.stack,
        "from_version": plan.from_version,
        "to_version": plan.to_version,
        "outcome": outcome.value,
        # why it paused or rolled back, as the journal records it (a pause before batch 0 for too little traffic
        # names the req/s the gates need); None when it completed
        "reason": state.reason or None,
        "batches": [
            {
                "index": rec.index,
                "replicas": list(plan.batch(rec.index).replicas),
                "started_at": iso(rec.started_at),
                "finished_at": iso(rec.finished_at),
                "gates": rec.gates.contract()
                if rec.gates
                else {"qps_drop": None, "p99_rise": None, "error_rate": None},
                "passed": rec.passed,
                "inconclusive": rec.gates.inconclusive_json() if rec.gates else None,
                **_judgement(rec),
            }
            for rec in state.batches
        ],
        "client_errors": int(state.client_errors),
        "final_versions": final_versions,
    }
