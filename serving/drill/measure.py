"""What a drill measured, from what it observed: pure functions over the probes of the fleet and the client requests.

Times are seconds since the fault (the baseline is before 0); a probe is timed when its calls returned (what it saw
held by then), and also keeps when they began. The figures, as the plan defines them:

* **detection** — the first probe at which every faulted replica is out of every router instance (not listed, or
  listed unhealthy: the router routes to neither), each instance answering except one the fault itself took down: a
  router that does not answer is *unknown*, it may still route to the replica;
* **recovery** — traffic fully served by the others at the baseline rate and latency: the start of the first run
  of ``stable`` good windows (``window_s`` long, counted from the fault) after which the fault's degradation did
  not come back within the run; a window is bad when a client request failed in it, significantly more of its
  requests than 1 % were slower than the baseline's P99 × (1 + ``rollout.max_p99_rise``) (:data:`WINDOW_ALPHA`), or
  fewer requests succeeded than ``1 − rollout.max_qps_drop`` of the baseline rate. 0 when the first ``stable`` windows are good; ``None`` when no such run came before the end of
  the judged span (restoration, else the heal, else the end). A bad window after the run (a one-off slow request
  on a busy machine) is counted in ``late_blips``, not taken as the fault's;
* **restoration** — the first probe after detection at which every faulted replica is listed healthy on every
  router instance (each answering) and the leading controller has it in rotation (after its warm-up);
* **takeover** — the first probe at which a controller other than the lost leader leads;
* **false detections** — replicas that were in rotation before the fault and left it on some router instance,
  other than the faulted ones (and any replica at all in a scenario that takes none out).

Two judges read them. :func:`judge` holds each time against the plan's target (``exaserve drill``, the rehearsal:
``scripts/rehearse.sh``). :func:`judge_order` asks what happened and in what order, never how long it took
(``exaserve drill --judge order``, the CI suite): every event the scenario is about was observed (out of rotation,
restarted, back; a new leader; clients served again without errors), each after the one it follows, and the counts
(client error share, false detections) as :func:`judge` holds them, except that a replica the leader only shed for
its load or latency is reported, not failed: those figures follow the machine's speed. Its verdict depends on the
machine's speed only through the drill's patience, which is a liveness bound (:data:`ORDER_PATIENCE`), never a judged
figure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from serving.drill.scenarios import Judging, Scenario, Target, TargetName
from serving.router.loadgen import LoadReport, RequestResult, latency_quantile
from serving.stats import P99, nearest_rank, p_slower_than_reference

# How many times longer than the plan's targets a drill judged by order waits for the events it needs and for the
# fleet to settle: a patience bound on a loaded machine, never a judged figure (the watch ends when all was seen)
ORDER_PATIENCE = 3.0
Membership = Mapping[str, bool]  # worker URL → healthy, as one router instance lists its workers
# A window is slow when more of its requests are slower than the baseline's P99 × (1 + rollout.max_p99_rise) than the
# 1 % a P99 allows, by an exact test at this level that counts the baseline's own noise (the rollout gates' P99 test,
# serving.stats): a window's P99 over the ~60 requests a second of a drill is nearly their maximum, and one request
# slowed by a busy machine is no evidence.
WINDOW_ALPHA = 0.001


@dataclass(frozen=True)
class Probe:
    """One look at the fleet: what every router instance lists, and what the leading controller says."""

    t: float
    routers: Mapping[str, Membership | None]  # router API URL → its workers; None when it did not answer
    leader: str | None = None  # the identity of the controller that leads; None when none answered as leader
    in_rotation: Mapping[str, bool] = field(default_factory=dict)  # replica URL → in rotation (the leader's view)
    scores: Mapping[str, int] = field(default_factory=dict)  # replica URL → health score (the leader's view)
    states: Mapping[str, str] = field(default_factory=dict)  # replica URL → state (the leader's view)
    sent: float | None = None  # when its calls began; None: at ``t``
    restarts: Mapping[str, int] = field(default_factory=dict)  # replica URL → restarts in its current run (leader)
    # replica URL → the leader's journaled migrations of it whose restart was asked for (:func:`journaled`); the
    # leader journals a migration when it ended: after the replica's removal from every router, its drain and restart
    migrated: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @property
    def began(self) -> float:
        return self.t if self.sent is None else self.sent

    def answering(self, exempt: frozenset[str]) -> dict[str, Membership]:
        return {r: m for r, m in self.routers.items() if m is not None and r not in exempt}

    def known(self, exempt: frozenset[str]) -> dict[str, Membership] | None:
        """Every instance's list but the exempt ones', or None when one of them did not answer (unknown)."""
        routers = {r: m for r, m in self.routers.items() if r not in exempt}
        if not routers or any(m is None for m in routers.values()):
            return None
        return {r: m for r, m in routers.items() if m is not None}

    def out_everywhere(self, urls: Sequence[str], exempt: frozenset[str]) -> bool:
        routers = self.known(exempt)
        return routers is not None and all(not m.get(u, False) for m in routers.values() for u in urls)

    def in_everywhere(self, urls: Sequence[str], exempt: frozenset[str]) -> bool:
        routers = self.known(exempt)
        return (
            routers is not None
            and all(m.get(u, False) for m in routers.values() for u in urls)
            and all(self.in_rotation.get(u, False) for u in urls)
        )

    def out_on(self, url: str, exempt: frozenset[str]) -> list[str]:
        """The answering router instances that do not list ``url`` healthy."""
        return [r for r, m in self.answering(exempt).items() if not m.get(url, False)]

    def out_somewhere(self, urls: set[str], exempt: frozenset[str]) -> set[str]:
        """Which of ``urls`` some answering router instance does not list healthy."""
        return {u for u in urls if self.out_on(u, exempt)}

    def healthy(self) -> set[str]:
        """Worker URLs listed healthy on every router instance that answered."""
        sets = [{u for u, h in m.items() if h} for m in self.routers.values() if m is not None]
        return set.intersection(*sets) if sets else set()


@dataclass(frozen=True)
class Gates:
    """The rollout's thresholds, reused to say when traffic is back to its baseline."""

    max_qps_drop: float
    max_p99_rise: float
    window_s: float
    stable: int = 3  # good windows in a row that make a recovery (serving.failure_threshold)


@dataclass(frozen=True)
class Baseline:
    requests: int
    ok: int  # the successes, whose latency the P99 is of
    ok_per_s: float
    p99_s: float

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "ok": self.ok,
            "ok_per_s": round(self.ok_per_s, 3),
            "p99_s": _round(self.p99_s),
        }


@dataclass(frozen=True)
class Window:
    start: float
    requests: int
    ok: int
    errors: int
    p99_s: float
    bad: str | None  # why the window counts as degraded, None when it is not


@dataclass(frozen=True)
class Check:
    """One figure against its target: ``measured`` None when it was never observed."""

    name: str
    measured: float | None
    target: float
    unit: str
    ok: bool
    reason: str
    # over the target on its upper bound but within it on its lower one (the probe resolution): the run cannot tell
    # whether the target was met, so it is neither passed nor failed (the verdict is invalid)
    undecided: bool = False
    # "target": the figure against the plan's target; "order": an event observed in its place (its time is shown,
    # never judged: ``target`` is 0 and means nothing)
    judged: Judging = "targets"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "measured": _round(self.measured),
            "target": self.target,
            "unit": self.unit,
            "ok": self.ok,
            "undecided": self.undecided,
            "judged": self.judged,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Measured:
    detection_s: float | None
    recovery_s: float | None
    restoration_s: float | None
    takeover_s: float | None
    client_requests: int
    client_errors: int
    baseline: Baseline
    windows: tuple[Window, ...]
    false_detections: tuple[str, ...]
    late_blips: int = 0  # bad windows after the recovery
    # how much earlier than measured each probed time may have been: the change came after the probe before the one
    # that saw it, and the fault took effect up to the injection's length after the time it is measured from
    uncertainty: Mapping[TargetName, float] = field(default_factory=dict)
    # false detection URL → where and when it was seen out, and what the leader made of it then (the evidence)
    false_seen: Mapping[str, str] = field(default_factory=dict)
    # the first probe after the fault at which the leader's journal held a migration of every faulted replica that
    # it did not hold before the fault, its restart asked for: the process that had the fault was replaced by then;
    # None when not seen (or nothing was detected)
    restarted_s: float | None = None
    # the start of the span after the fault, to the end of the load, in which no client request failed and some
    # succeeded (the first request sent after the last failure); None when the load ended on a failure
    served_again_s: float | None = None
    # what the failed client requests got, the commonest first (an error body's head, a timeout, a broken stream)
    client_failures: Mapping[str, int] = field(default_factory=dict)
    # the false detections the leader had out for their load or latency, never for failing (:data:`SOFT_STATES`): a
    # decision on figures that follow the machine's speed, judged in the rehearsal and reported by the order judge
    shed: tuple[str, ...] = ()

    @property
    def client_error_rate(self) -> float:
        return self.client_errors / self.client_requests if self.client_requests else 0.0


def _round(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else round(x, 3)


def p99(results: Sequence[RequestResult]) -> float:
    """Nearest-rank P99 of the successful requests' latency (as :class:`serving.router.loadgen.LoadReport`)."""
    return latency_quantile(results, P99)


def baseline_of(results: Sequence[RequestResult], seconds: float) -> Baseline:
    """The client figures of the ``seconds`` before the fault (requests sent at t < 0)."""
    before = [r for r in results if -seconds <= r.sent_at_s < 0]
    ok = sum(r.ok for r in before)
    return Baseline(len(before), ok, ok / seconds if seconds > 0 else 0.0, p99(before))


def windows(results: Sequence[RequestResult], base: Baseline, gates: Gates, until: float) -> list[Window]:
    """The requests sent in ``[0, until)``, in windows of ``gates.window_s``, each judged against the baseline."""
    w = gates.window_s
    count = max(0, math.ceil(until / w))
    buckets: list[list[RequestResult]] = [[] for _ in range(count)]
    for r in results:
        if 0 <= r.sent_at_s < until:
            buckets[min(count - 1, int(r.sent_at_s // w))].append(r)
    out = []
    limit = base.p99_s * (1 + gates.max_p99_rise)
    least = (1 - gates.max_qps_drop) * base.ok_per_s * w
    rank = nearest_rank(P99, base.ok)  # the baseline's P99 is its rank-th smallest success (p99 above)
    for i, bucket in enumerate(buckets):
        ok, latency = sum(r.ok for r in bucket), p99(bucket)
        errors = len(bucket) - ok
        slow = sum(1 for r in bucket if r.ok and r.latency_s > limit)
        chance = p_slower_than_reference(slow, ok, rank, base.ok) if not math.isnan(limit) else 1.0
        bad = None
        if errors:
            bad = f"{errors} of {len(bucket)} requests failed"
        elif chance < WINDOW_ALPHA:
            bad = (
                f"{slow} of {ok} requests slower than {limit * 1000:.0f} ms (baseline P99 × {1 + gates.max_p99_rise:g}; "
                f"P99 {latency * 1000:.0f} ms), p = {chance:.1g}"
            )
        elif i < count - 1 and ok < least:  # the last window may be cut short
            bad = f"{ok} requests served < {least:.1f} ({1 - gates.max_qps_drop:.0%} of the baseline rate)"
        out.append(Window(round(i * w, 3), len(bucket), ok, errors, latency, bad))
    return out


def recovered(judged: Sequence[Window], gates: Gates) -> tuple[float | None, int]:
    """(recovery, bad windows after it): the start of the first run of ``gates.stable`` good windows, or of the
    good windows that end the span when it is shorter than that; None when the span ends bad."""
    run = 0
    for i, w in enumerate(judged):
        run = 0 if w.bad else run + 1
        if run == gates.stable or (run and i == len(judged) - 1):
            start = i - run + 1
            return judged[start].start, sum(1 for later in judged[i + 1 :] if later.bad)
    return (0.0, 0) if not judged else (None, 0)


Seen = tuple[
    float, float
]  # (when the first probe at which something held returned, the time since the one before it began)


def out_and_back(
    probes: Sequence[Probe], subjects: Sequence[str], exempt: frozenset[str]
) -> tuple[Seen | None, Seen | None]:
    """(detection, restoration) of ``subjects`` over the probes from the fault on; None where not (yet) seen."""
    if not subjects:
        return None, None
    detection = _first(probes, 0.0, lambda p: p.out_everywhere(subjects, exempt))
    if detection is None:
        return None, None
    return detection, _first(probes, detection[0], lambda p: p.in_everywhere(subjects, exempt))


def _first(probes: Sequence[Probe], after: float, holds: Any) -> Seen | None:
    """The first probe returning at or after ``after`` (≥ 0, the fault) at which ``holds``, with how long before its
    return the change may have come: back to when the probe before it began (it did not see the change), or to
    ``after`` when that probe began earlier."""
    previous = after
    for p in probes:
        if p.t >= after and holds(p):
            return p.t, p.t - previous
        previous = max(p.began, after)
    return None


def cadence_bound(probe_s: float) -> float:
    """The longest gap between probes a drill may judge: ``max(3 × probe_s, probe_s + 1 s)``. A probe loop keeping
    its cadence returns every ``probe_s`` plus its calls' time (milliseconds); one instance that does not answer
    holds a probe up to the probe client's timeout (``min(2 s, 4 × probe_s)``, 0.4 s at the sandbox's 0.1 s), which
    the 1 s over the cadence takes in. A wider gap is the prober's own stall, not the fleet's: the judge allows a
    probed time the gap since the probe before as slack (:func:`judge`), so a run with such a gap is invalid rather
    than judged (the issue's probe loop stalled 2.4 s and passed a 5.9 s detection against 4 s)."""
    return max(3 * probe_s, probe_s + 1.0)


@dataclass(frozen=True)
class Gap:
    """Probes that came further apart than :func:`cadence_bound`: from ``after_s`` (a probe's return, or 0, the
    injection) to the next probe's return ``gap_s`` later."""

    after_s: float
    gap_s: float

    def to_json(self) -> dict[str, float]:
        return {"after_s": round(self.after_s, 3), "gap_s": round(self.gap_s, 3)}


def counted_gaps(probes: Sequence[Probe], paused: Sequence[tuple[float, float]] = ()) -> list[Gap]:
    """Every gap between probes from the fault (0) to the last probe, but those during which the drill itself was
    healing the fault (``paused``: (start, end) spans): the probe loop waits for the drill's own heal, and what it
    watches for then (the fault's replica or router back) cannot come before the heal began."""
    times = [0.0, *(p.t for p in probes if p.t >= 0)]
    return [Gap(a, b - a) for a, b in pairwise(times) if not any(start < b and end > a for start, end in paused)]


def slipped(probes: Sequence[Probe], probe_s: float, paused: Sequence[tuple[float, float]] = ()) -> list[Gap]:
    """The :func:`counted_gaps` wider than :func:`cadence_bound`."""
    bound = cadence_bound(probe_s)
    return [g for g in counted_gaps(probes, paused) if g.gap_s > bound]


def measure(
    probes: Sequence[Probe],
    results: Sequence[RequestResult],
    *,
    subjects: Sequence[str],
    baseline_s: float,
    gates: Gates,
    end: float,
    healed: float | None,
    exempt_routers: frozenset[str] = frozenset(),
    lost_leader: str | None = None,
    injection_s: float = 0.0,
    routable_score: int | None = None,
) -> Measured:
    """The drill's figures. ``subjects``: URLs of the faulted replicas (none for a router or controller fault);
    ``exempt_routers``: router instances the fault itself took down; ``lost_leader``: the identity of the killed
    leader; ``healed``: when the drill ended the fault (None when the fleet healed itself); ``injection_s``: how long
    injecting the fault took (times count from its start: the fault took effect somewhere in that span);
    ``routable_score``: serving.health.stop_routing_below, under which a replica out of rotation was failing (None: no
    bystander counts as only shed, :attr:`Measured.shed`)."""
    after = [p for p in probes if p.t >= 0]
    seen_out, seen_back = out_and_back(probes, subjects, exempt_routers)
    seen_lead = None
    if lost_leader is not None:
        seen_lead = _first(probes, 0.0, lambda p: p.leader is not None and p.leader != lost_leader)
    seen = {
        TargetName.DETECTION: seen_out,
        TargetName.RESTORATION: seen_back,
        TargetName.TAKEOVER: seen_lead,
    }
    detection, restoration, takeover = (None if x is None else x[0] for x in seen.values())
    before = [p for p in probes if p.t < 0]
    serving_before = before[-1].healthy() - set(subjects) if before else set()
    false_seen, shed = _false_seen(after, serving_before, exempt_routers, routable_score)
    false = sorted(false_seen)
    until = restoration if restoration is not None else healed if healed is not None else end
    base = baseline_of(results, baseline_s)
    judged = windows(results, base, gates, until)
    recovery, blips = recovered(judged, gates)
    during = [r for r in results if r.sent_at_s >= -baseline_s]
    # from the fault on, not from the detection: a restart of a replica still in rotation is the wrong order
    restarted = None if detection is None else restarted_after(probes, subjects, 0.0)
    served_again = served_again_after(results)
    return Measured(
        detection,
        None if recovery is None else round(min(recovery, until), 3),
        restoration,
        takeover,
        len(during),
        sum(not r.ok for r in during),
        base,
        tuple(judged),
        tuple(false),
        blips,
        {name: round(x[1] + injection_s, 3) for name, x in seen.items() if x is not None},
        false_seen,
        restarted,
        served_again,
        LoadReport(tuple(during), 0.0).distinct_errors(),
        tuple(sorted(shed)),
    )


def served_again_after(results: Sequence[RequestResult]) -> float | None:
    """When the clients were served again for good: the send time of the first request after the fault that came
    after its last failed one (0 when none failed), provided one of those succeeded; None when the load ended on a
    failure or sent nothing after the fault. Counts requests, never compares a latency."""
    after = sorted((r for r in results if r.sent_at_s >= 0), key=lambda r: r.sent_at_s)
    last_failed = max((i for i, r in enumerate(after) if not r.ok), default=-1)
    tail = after[last_failed + 1 :]
    if not any(r.ok for r in tail):
        return None
    return 0.0 if last_failed < 0 else tail[0].sent_at_s


def journaled(actions: Sequence[Any]) -> dict[str, frozenset[str]]:
    """Replica URL → the migrations of it in a leader's action journal (``exaserve status``'s ``actions``) whose
    restart reached the deployment (``restarted: true``; one the deployment refused or never got, SSH not connected or
    the API server silent before the eviction, says false), each named by its term and start (a new leader's journal
    starts empty; one leader's entries differ in their start)."""
    out: dict[str, set[str]] = {}
    for a in actions:
        if isinstance(a, dict) and a.get("kind") == "migrate" and a.get("restarted") is True:
            out.setdefault(str(a.get("url")), set()).add(f"{a.get('term')}@{a.get('at')}")
    return {u: frozenset(keys) for u, keys in out.items()}


def restarted_after(probes: Sequence[Probe], subjects: Sequence[str], after: float) -> float | None:
    """The first probe at or after ``after`` by which the leading controller had journaled a migration of each of
    ``subjects`` that no probe saw before the fault, its restart asked for (the leader journals a migration when it
    ended, so its removal from every router and the restart came before); None while one was never seen so."""
    before: dict[str, set[str]] = {}
    for p in probes:
        if p.t < 0:
            for u, keys in p.migrated.items():
                before.setdefault(u, set()).update(keys)
    left = set(subjects)
    for p in probes:
        if p.t >= after:
            left -= {u for u in left if p.migrated.get(u, frozenset()) - before.get(u, set())}
            if not left:
                return p.t
    return None


# What the leader shows a replica it took out for its load or its latency, not for failing (``exaserve status``'s
# ``shed`` and ``slow``), and the states it passes through on the way out and back in
SOFT_STATES = frozenset({"shed", "slow"})
_PASSING_STATES = frozenset({"removing", "warming", "serving"})


def _false_seen(
    after: Sequence[Probe], serving: set[str], exempt: frozenset[str], routable_score: int | None
) -> tuple[dict[str, str], set[str]]:
    """Each replica of ``serving`` that some answering router instance did not list healthy after the fault: the
    probes that saw it out (first and last time, how many), the routers, and the leader's state and score for it at
    the first such probe; and which of them were out for load only (:func:`_only_shed`)."""
    seen: dict[str, list[tuple[Probe, list[str]]]] = {}
    for p in after:
        for u in serving:
            if routers := p.out_on(u, exempt):
                seen.setdefault(u, []).append((p, routers))
    evidence, shed = {}, set()
    for u, probes in seen.items():
        first = probes[0][0]
        routers = sorted({r for _, rs in probes for r in rs})
        states = [p.states.get(u, "unknown") for p, _ in probes]
        if routable_score is not None and _only_shed(u, after, [p for p, _ in probes], routable_score):
            shed.add(u)
        evidence[u] = (
            f"out at {first.t:.1f}-{probes[-1][0].t:.1f} s ({len(probes)} probes) on {', '.join(routers)}; "
            f"the leader had it {' then '.join(dict.fromkeys(states))}, score {first.scores.get(u, 'unknown')}"
        )
    return evidence, shed


def _only_shed(url: str, after: Sequence[Probe], out: Sequence[Probe], routable_score: int) -> bool:
    """The leader had ``url`` shed or slow (:data:`SOFT_STATES`) at some probe that saw it out, and at every such
    probe in a state it only passes through on the way out and back, with a score it still routes at (the label
    alone is no proof: the controller keeps it while the score falls, and after a warm-up that failed); and no
    probe after the fault saw its restart count grow (a restart between two probes is a failure the states missed)."""
    states = {p.states.get(url, "unknown") for p in out}
    if not SOFT_STATES & states or not states <= SOFT_STATES | _PASSING_STATES:
        return False
    if any(p.scores.get(url, -1) < routable_score for p in out):
        return False
    restarts = [p.restarts[url] for p in after if url in p.restarts]
    return all(b <= a for a, b in pairwise(restarts))


def judge(
    scenario: Scenario, targets: Sequence[Target], m: Measured, resolution_s: float = 0.0, *, by_order: bool = False
) -> list[Check]:
    """Every target of the scenario against what was measured, plus the false detections.

    A time is judged on its upper bound, the moment the probe that saw it returned, counted from the moment the
    injection began: within its target it passes. It may have been earlier by its :attr:`Measured.uncertainty` (the
    change came after the probe before the one that saw it, and the fault took effect up to the injection's length
    after the time counts from): over its target, but within it on that lower bound, the check is *undecided* (the
    run cannot tell, :func:`verdict` calls it invalid, never passed): detection 4.12 s against 4 s, seen 0.11 s after
    the probe before it, from an injection that took 0.02 s, may have been 3.99 s. Over its target on both bounds it
    fails. A time from the client's windows (recovery) is known to ``resolution_s``. Shares (the client error rate)
    are counted exactly. ``by_order``: the false detections as :func:`judge_order` holds them
    (:func:`_false_detections`)."""
    found: dict[TargetName, float | None] = {
        TargetName.DETECTION: m.detection_s,
        TargetName.RECOVERY: m.recovery_s,
        TargetName.RESTORATION: m.restoration_s,
        TargetName.TAKEOVER: m.takeover_s,
        TargetName.CLIENT_ERRORS: m.client_error_rate,
    }
    checks = []
    for t in targets:
        value = found[t.name]
        if value is None:
            why = (
                "traffic was still degraded when the judged span ended (restoration, the heal or the drill's end)"
                if t.name is TargetName.RECOVERY
                else f"not observed ({t.meaning})"
            )
            checks.append(Check(t.name.value, None, t.value, t.unit, False, why))
            continue
        slack = m.uncertainty.get(t.name, resolution_s) if t.unit == "s" else 0.0
        ok = value <= t.value
        undecided = not ok and value - slack <= t.value
        shown = f"{value:.2f} {t.unit}" if t.unit == "s" else f"{value:.2%}"
        limit = f"{t.value:g} {t.unit}" if t.unit == "s" else f"{t.value:.2%}"
        detail = f" ({m.client_errors} of {m.client_requests} requests)" if t.name is TargetName.CLIENT_ERRORS else ""
        reason = f"{shown}{detail} {'≤' if ok else '>'} {limit}"
        if undecided:
            reason += (
                f", but it may have come up to {slack:g} s earlier (the probe before the one that saw it, and the "
                f"injection's length): within the target on that bound, so this run cannot tell; run it again"
            )
        checks.append(Check(t.name.value, value, t.value, t.unit, ok, reason, undecided))
    if scenario.fails == "every other":
        checks.append(_stayed_out(m))
    checks.append(_false_detections(scenario, m, by_order))
    return checks


def _false_detections(scenario: Scenario, m: Measured, by_order: bool) -> Check:
    """No replica outside the fault left rotation. Judged by order, one the leader only shed or found slow
    (:attr:`Measured.shed`) is reported and not failed: that decision weighs its load or latency, which on a
    simulated fleet follow how fast and how loaded the machine is (a busy 2-core machine queues more), so it is the
    rehearsal's to judge (issue 37). A replica it failed, restarted or quarantined fails either way."""
    forgiven = set(m.shed) if by_order else set()
    false = [f"{u} ({m.false_seen[u]})" if u in m.false_seen else u for u in m.false_detections if u not in forgiven]
    what = "replicas outside the fault" if scenario.evicts else "replicas (this fault must take none out)"
    reason = f"{what} left rotation: {'; '.join(false)}" if false else "no other replica left rotation"
    if shed := [f"{u} ({m.false_seen.get(u, 'seen out')})" for u in m.false_detections if u in forgiven]:
        reason += f"; shed for load or latency, not failed (judged in the rehearsal, not by order): {'; '.join(shed)}"
    return Check("false_detections", float(len(false)), 0.0, "replicas", not false, reason)


def _stayed_out(m: Measured) -> Check:
    """A flapping replica comes back only as a new process: its flapping lasts as long as the process, and the score
    cannot climb to readmit_at while one probe in two fails (hysteresis), so a restoration before the leader
    journaled its restart was a readmission of a replica that still flapped. (That the restart replaced the process
    is the backend's to prove: the sandbox's starts a new one.)"""
    if m.restoration_s is None:
        return Check("stayed_out", None, 0.0, "", True, "not back: restoration is judged on its own")
    early = m.restarted_s is None or m.restarted_s > m.restoration_s
    if early:
        return Check(
            "stayed_out",
            None,
            0.0,
            "",
            False,
            f"back in rotation at {m.restoration_s:.2f} s without a restart (a restart "
            f"{'never journaled' if m.restarted_s is None else f'journaled at {m.restarted_s:.2f} s'}): readmitted while "
            "it still flapped",
        )
    return Check(
        "stayed_out",
        None,
        0.0,
        "",
        True,
        f"out from detection until its restart (journaled at {m.restarted_s:.2f} s), back as a new process at "
        f"{m.restoration_s:.2f} s",
    )


# what each time target says happened, for the order judge
_EVENTS = {
    TargetName.DETECTION: ("out of rotation", "every faulted replica out of every router instance"),
    TargetName.RESTORATION: ("back in rotation", "every faulted replica healthy on every router and in rotation"),
    TargetName.TAKEOVER: ("new leader", "a controller other than the lost leader leads"),
    TargetName.RECOVERY: ("served again", "client requests succeed again with no failure after"),
}


def judge_order(scenario: Scenario, targets: Sequence[Target], m: Measured) -> list[Check]:
    """What happened and in what order, never how long it took: each event the scenario's time targets stand for
    was observed (:data:`_EVENTS`; recovery, the clients' latency back to the baseline, is judged here as the
    clients served again without a failure: :attr:`Measured.served_again_s`), the faulted replicas left rotation
    before a restart of each was journaled and came back after it (a restart the scenario's fault calls for: every
    replica fault but the node's, whose replicas come back when the node does), the client error share within the
    plan's gate and no false detection, as :func:`judge` holds them (a replica only shed for its load or latency
    reported, not failed: :func:`_false_detections`), and no client error at all (the router's retries
    and the load generator's failover hide a lost replica from clients: one that reaches them is the runtime's miss,
    on any machine). A probe gap cannot reorder what the probes saw, so the cadence is not judged here; back and
    restarted first seen on the same probe are no order (:func:`_in_order`)."""
    found: dict[TargetName, float | None] = {
        TargetName.DETECTION: m.detection_s,
        TargetName.RESTORATION: m.restoration_s,
        TargetName.TAKEOVER: m.takeover_s,
        TargetName.RECOVERY: m.served_again_s,
    }
    checks = []
    for t in targets:
        if t.name is TargetName.CLIENT_ERRORS:
            continue
        event, meaning = _EVENTS[t.name]
        value = found[t.name]
        reason = (
            f"{event} at {value:.2f} s (its time is not judged here)"
            if value is not None
            else (f"never observed: {meaning}")
        )
        checks.append(Check(f"{event}", value, 0.0, "s", value is not None, reason, judged="order"))
    if scenario.evicts and m.detection_s is not None:
        checks.append(_in_order(scenario, m))
    errors = Check(
        "client_errors",
        float(m.client_errors),
        0.0,
        "requests",
        m.client_errors == 0,
        f"{m.client_errors} of {m.client_requests} client requests failed (none may)"
        + "".join(f"; {n} × {what}" for what, n in m.client_failures.items()),
        judged="order",
    )
    return [*checks, errors, *judge(scenario, [t for t in targets if t.unit != "s"], m, by_order=True)]


def _in_order(scenario: Scenario, m: Measured) -> Check:
    """Out, then restarted (where the scenario restarts the replica), then back: the restart no earlier than the
    probe that saw the replica out (looked for from the fault on: one journaled while a router still listed the
    replica is out of order: the leader journals a migration after its removal from every router), back on a later
    probe than the restart."""
    events = [("out of rotation", m.detection_s)]
    if scenario.restarts:
        events.append(("restart journaled", m.restarted_s))
    events.append(("back in rotation", m.restoration_s))
    seen = [(name, t) for name, t in events if t is not None]
    shown = ", ".join(f"{name} at {t:.2f} s" for name, t in seen)
    missing = [name for name, t in events if t is None and name != "back in rotation"]
    # A restart first seen on the probe that first saw the replica out is in order (the leader journals a migration
    # once it ended, so by then the removal it began with was over); back must come on a later probe than the restart:
    # back and restarted first seen together (a gap in the probing) came in an order nobody saw
    in_order = all(a[1] <= b[1] if a[0] == "out of rotation" else a[1] < b[1] for a, b in pairwise(seen))
    ok = in_order and not missing
    problem = f"never seen: {', '.join(missing)}" if missing else "out of order, or back seen on the restart's probe"
    reason = shown if ok else f"{shown}; {problem}"
    return Check("in_order", None, 0.0, "", ok, reason, judged="order")


def verdict(checks: Sequence[Check], gaps: Sequence[Gap]) -> str:
    """``invalid`` when the probes slipped (:func:`slipped`; whatever the checks say: never passed), else ``failed``
    when a check failed outright, else ``invalid`` when a time was over its target only by what the probes cannot
    resolve (:attr:`Check.undecided`: never passed on the best case), else ``passed``."""
    if gaps:
        return "invalid"
    if not checks or any(not c.ok and not c.undecided for c in checks):
        return "failed"
    return "invalid" if any(c.undecided for c in checks) else "passed"
