"""Run one fault drill against a running fleet: settle, baseline, inject, watch, heal, measure.

The engine is the same on every backend; what a fault does to the fleet is the :class:`Injector`'s (the sandbox's
is :class:`serving.sandbox.faults.SandboxFaults`). Throughout, bounded client load goes through every router
instance (round robin; a refused connection is retried once on the next instance, as behind a load balancer) and
the fleet is probed every ``probe_s``: each router instance's ``GET /workers`` and every controller's status.

Holds: a fault the runtime clears by itself (a crashed, hung, slow or failing replica: its migration restarts it)
is left to it and healed at the end only if still in place; memory pressure, jitter, a lost node and a lost router
are held for the plan's restoration time (:func:`serving.drill.scenarios.fault_sizes`), then healed (the node or
router comes back); a lost leader is restarted, as a follower, once another controller leads.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from serving.drill.measure import (
    ORDER_PATIENCE,
    Check,
    Gap,
    Gates,
    Measured,
    Probe,
    counted_gaps,
    journaled,
    judge,
    judge_order,
    measure,
    out_and_back,
    slipped,
    verdict,
)
from serving.drill.scenarios import (
    OUT_OF_ROTATION,
    Component,
    Fault,
    FaultKind,
    FaultSizes,
    Judging,
    Scenario,
    Target,
    TargetName,
    plan_targets,
)
from serving.fleet_http import FleetHttp, HttpFailure
from serving.plan.model import Fleet
from serving.prometheus_api import FiredAlert, PrometheusError, alerts_fired
from serving.router.client import parse_workers
from serving.router.loadgen import LoadGenerator, LoadReport, LoadSpec, RequestResult

STATUS_PATH = "/v1/status"  # serving.runtime.service.STATUS_PATH (not imported: it loads the controller and its server)
Progress = Callable[[str], None]


class DrillError(RuntimeError):
    """The drill could not run (the fleet is not healthy before the fault); the message says what to do."""


class FleetDown(DrillError):
    """No router instance of the fleet answers: nothing to drill (bad input: start the fleet first)."""


@dataclass(frozen=True)
class Subject:
    """What a drill's faults hit."""

    replicas: tuple[str, ...] = ()  # replica ids
    urls: tuple[str, ...] = ()  # their URLs, as the routers know them
    node: str | None = None
    router: str | None = None  # API URL of the router instance
    controller: str | None = None  # identity of the controller (the leader when the drill started)

    def to_json(self) -> dict[str, Any]:
        return {
            "replicas": list(self.replicas),
            "urls": list(self.urls),
            "node": self.node,
            "router": self.router,
            "controller": self.controller,
        }


class Injector(Protocol):
    """What a fault does on one backend. ``inject`` breaks, ``heal`` mends what is still broken and says what it
    did (an empty list when the runtime had healed it already)."""

    async def inject(self, fault: Fault, subject: Subject, sizes: FaultSizes) -> str: ...

    async def heal(self, fault: Fault, subject: Subject) -> list[str]: ...


@dataclass(frozen=True)
class FleetUrls:
    """Where the fleet answers: every router instance, every controller, each replica's URL, Prometheus if any."""

    routers: tuple[str, ...]
    controllers: tuple[str, ...]
    replicas: Mapping[str, str]  # replica id → URL
    nodes: Mapping[str, tuple[str, ...]]  # node → its replica ids, in plan order
    prometheus: str | None = None


@dataclass(frozen=True)
class Settings:
    rate_per_s: float
    baseline_s: float
    probe_s: float
    gates: Gates
    hold_s: float
    settle_s: float
    min_requests: int  # the client requests the error gate needs to be judged at all (1 / the gate, with margin)
    # how long a replica must be out before ExaServeReplicaOutOfRotation is due: its `for` (failure_threshold ×
    # interval, serving.render.k8s.runtime) + a scrape and an evaluation (the sandbox's Prometheus: every interval)
    out_alert_due_s: float = 0.0
    # how long before the fault an alert the fault caused may say it became active: a scrape that started before the
    # fault and failed because of it is stamped with its start, and so is the evaluation that first sees it (the
    # sandbox's Prometheus scrapes and evaluates every heartbeat interval)
    alert_lead_s: float = 0.0
    # how long a replica the drill's heal brought back in place (not restarted by the runtime) may take to return:
    # out of rotation with a score anywhere in [migrate_below, readmit_at) it earns success_reward per report up to
    # readmit_at, then the warm-up and the tick that readmits it (below the migrate line it is restarted instead,
    # within the restoration target)
    return_s: float = 0.0
    # the health score under which the controller stops routing to a replica (serving.health.stop_routing_below): a
    # bystander out of rotation with a score at or above it, never restarted, was out for its load, not a failure
    routable_score: int = 0
    # what the drill is judged on: the plan's targets (times against them), or what happened in what order
    # (serving.drill.measure.judge_order), which waits ORDER_PATIENCE times longer for the events and the settling
    judging: Judging = "targets"

    @property
    def patience(self) -> float:
        """How many times the plan's times the drill waits for what it must see: 1 judged on targets (a later
        event missed its target anyway), ORDER_PATIENCE judged by order (a loaded machine is slower, not wrong)."""
        return ORDER_PATIENCE if self.judging == "order" else 1.0

    @classmethod
    def for_drill(
        cls,
        fleet: Fleet,
        targets: Sequence[Target],
        sizes: FaultSizes,
        rate_per_s: float | None = None,
        judging: Judging = "targets",
    ) -> Settings:
        """A drill's settings from the plan: client load enough for the error gate over the baseline and the
        longest target (or ``rate_per_s``), the updater's baseline window, the fault's hold and the time a
        restoration may take (times the patience of ``judging``)."""
        spec = fleet.spec
        hold = sizes.hold_s.value
        # the updater's baseline window, and at least 5 heartbeats: a short baseline on a busy machine sets a lax P99 limit
        baseline = max(spec.rollout.baseline_window_s, 5 * spec.serving.heartbeat_interval_s)
        gate = plan_targets(fleet)[TargetName.CLIENT_ERRORS].value
        longest = max([hold, *(t.value for t in targets if t.unit == "s")])
        return cls(
            rate_per_s=rate_per_s if rate_per_s is not None else max(10.0, math.ceil(2 / gate / (baseline + longest))),
            min_requests=math.ceil(1.2 / gate),
            baseline_s=baseline,
            probe_s=min(0.1, spec.serving.heartbeat_interval_s / 10),
            gates=Gates(
                spec.rollout.max_qps_drop,
                spec.rollout.max_p99_rise,
                spec.serving.heartbeat_interval_s,
                spec.serving.failure_threshold,
            ),
            hold_s=hold,
            settle_s=(plan_targets(fleet)[TargetName.RESTORATION].value + spec.serving.startup_budget_s)
            * (ORDER_PATIENCE if judging == "order" else 1.0),
            out_alert_due_s=(spec.serving.failure_threshold + 2) * spec.serving.heartbeat_interval_s,
            alert_lead_s=spec.serving.heartbeat_interval_s,
            return_s=max(plan_targets(fleet)[TargetName.RESTORATION].value, climb_s(fleet)),
            routable_score=spec.health.stop_routing_below,
            judging=judging,
        )


@dataclass
class Run:
    """Everything one drill observed; :attr:`t0` is the fault's monotonic time, :attr:`wall0` its Unix time."""

    scenario: Scenario
    subject: Subject
    targets: tuple[Target, ...]
    settings: Settings
    t0: float = 0.0
    wall0: float = 0.0
    probes: list[Probe] = field(default_factory=list)
    load: LoadReport | None = None
    load_started: float = 0.0
    injected: list[str] = field(default_factory=list)
    injection_s: float = 0.0  # how long injecting took: the fault took effect somewhere in [t0, t0 + this]
    healed_at: float | None = None
    healed: list[str] = field(default_factory=list)
    drill_healed: list[Fault] = field(default_factory=list)  # the faults the drill ended itself (held, lost leader)
    healing: list[tuple[float, float]] = field(default_factory=list)  # (start, end) of each heal inside the probe loop
    end: float = 0.0
    settled: bool = False
    alerts_checked: bool = False  # a Prometheus was there to ask
    alerts: list[FiredAlert] = field(default_factory=list)
    alerts_error: str | None = None
    measured: Measured | None = None
    checks: list[Check] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)  # probes further apart than the cadence bound: the run is invalid
    longest_gap_s: float = 0.0  # the widest gap between probes after the fault (the drill's own heals left out)

    @property
    def verdict(self) -> str:
        """Judged by order, a probe gap cannot reorder what the probes saw: it makes no run invalid."""
        return verdict(self.checks, self.gaps if self.settings.judging == "targets" else ())

    @property
    def ok(self) -> bool:
        return self.verdict == "passed"


# ----- observing the fleet -----------------------------------------------------------------------------------
async def _json(http: FleetHttp, url: str) -> Any:
    try:
        answer = await http.get(url)
        return answer.json() if answer.status == 200 else None
    except (HttpFailure, ValueError):
        return None


async def look(http: FleetHttp, fleet: FleetUrls) -> Probe:
    """One probe: every router instance's workers and every controller's status, at once; timed (monotonic) when
    its calls returned, so what it saw held by then (an upper bound), with when they began."""
    sent = time.monotonic()
    lists = await asyncio.gather(*(_json(http, r + "/workers") for r in fleet.routers))
    statuses = await asyncio.gather(*(_json(http, c + STATUS_PATH) for c in fleet.controllers))
    t = time.monotonic()
    routers: dict[str, dict[str, bool] | None] = {}
    for router, body in zip(fleet.routers, lists, strict=True):
        routers[router] = None if body is None else {w.url: w.is_healthy for w in parse_workers(body)}
    lead = next((s for s in statuses if isinstance(s, dict) and s.get("is_leader")), None)
    if lead is None:
        return Probe(t, routers, sent=sent)
    reps = [r for r in lead.get("replicas", []) if isinstance(r, dict)]
    return Probe(
        t,
        routers,
        str(lead.get("identity")),
        {r["url"]: bool(r["in_rotation"]) for r in reps},
        {r["url"]: int(r["score"]) for r in reps},
        {r["url"]: str(r["state"]) for r in reps},
        sent,
        {r["url"]: int(r.get("restarts_in_window", 0)) + int(r.get("restarts", 0)) for r in reps},
        journaled(lead.get("actions", [])),
    )


def _healthy_fleet(p: Probe, fleet: FleetUrls) -> list[str]:
    """What keeps the fleet from being ready for a drill: empty when every router instance answers and lists every
    replica healthy, a controller leads and has every replica in rotation."""
    problems = [f"router {r} does not answer" for r, m in p.routers.items() if m is None]
    urls = set(fleet.replicas.values())
    for r, m in p.routers.items():
        if m is not None and (missing := sorted(u for u in urls if not m.get(u, False))):
            problems.append(f"router {r} does not list healthy {', '.join(missing)}")
    if fleet.controllers:
        if p.leader is None:
            problems.append("no controller leads")
        elif out := sorted(u for u in urls if not p.in_rotation.get(u, False)):
            problems.append(f"the leader {p.leader} has {', '.join(out)} out of rotation")
    return problems


async def settle(fleet: FleetUrls, timeout_s: float, probe_s: float) -> list[str]:
    """Wait until the fleet is ready for a drill; what still keeps it from that after ``timeout_s`` (empty: ready)."""
    deadline = time.monotonic() + timeout_s
    async with FleetHttp(timeout_s=2.0) as http:
        while True:
            problems = _healthy_fleet(await look(http, fleet), fleet)
            if not problems or time.monotonic() >= deadline:
                return problems
            await asyncio.sleep(probe_s)


async def look_once(fleet: FleetUrls) -> Probe:
    async with FleetHttp(timeout_s=2.0) as http:
        return await look(http, fleet)


# ----- choosing what to break ---------------------------------------------------------------------------------
def choose_subject(
    scenario: Scenario, fleet: FleetUrls, leader: str | None, restarts: Mapping[str, int] | None = None
) -> Subject:
    """For a replica fault, the replica outside the last node with the fewest restarts as the leader reports them
    (``restarts``: URL → its restarts in the quarantine window and in its current run; the first in fleet order on
    a tie): the controller backs off a replica restarted lately (until it has served 2 ×
    ``runtime.restart_backoff_max_s``) and quarantines one restarted ``runtime.quarantine_after`` times in
    ``runtime.quarantine_window_s``, and the restoration target counts one restart, so drills run one after another
    must not all fault the same replica. The last node
    for a node fault, the last router instance, the current leader. A drill the fleet cannot run (one router, no
    controllers) raises naming the fix."""
    parts: dict[str, Any] = {}
    nodes = list(fleet.nodes)
    counts = restarts or {}
    for component in scenario.components:
        if component is Component.REPLICA:
            spare = [r for n in nodes[:-1] or nodes for r in fleet.nodes[n]]
            rid = min(spare, key=lambda r: counts.get(fleet.replicas[r], 0))
            parts.update(replicas=(rid,), urls=(fleet.replicas[rid],))
        elif component is Component.NODE:
            node = nodes[-1]
            ids = fleet.nodes[node]
            parts.update(replicas=ids, urls=tuple(fleet.replicas[i] for i in ids), node=node)
        elif component is Component.ROUTER:
            if len(fleet.routers) < 2:
                raise DrillError(
                    f"{scenario.name} needs at least 2 router instances, the fleet has {len(fleet.routers)}; raise "
                    "scheduler.instances (and sandbox.runtime: true in a sandbox stack)"
                )
            parts["router"] = fleet.routers[-1]
        elif component is Component.CONTROLLER:
            if len(fleet.controllers) < 2:
                raise DrillError(
                    f"{scenario.name} needs at least 2 controllers to take over, the fleet has "
                    f"{len(fleet.controllers)}; raise scheduler.instances"
                )
            if leader is None:
                raise DrillError(f"{scenario.name}: no controller leads, so there is no leader to lose")
            parts["controller"] = leader
    if (Component.REPLICA in scenario.components or Component.NODE in scenario.components) and not fleet.controllers:
        raise DrillError(
            f"{scenario.name} is judged on the runtime layer's recovery and this fleet runs no controller; start it "
            "with the runtime (sandbox.runtime: true)"
        )
    return Subject(**parts)


def _held(fault: Fault) -> bool:
    """Faults the drill holds and then heals itself (the others the runtime clears by restarting the replica)."""
    if fault.component is Component.REPLICA:
        return fault.kind is FaultKind.MEMORY
    return fault.component is not Component.CONTROLLER


# ----- the drill --------------------------------------------------------------------------------------------
def _exempt(subject: Subject) -> frozenset[str]:
    return frozenset({subject.router}) if subject.router else frozenset()


def _restored(run: Run) -> bool:
    """The faulted replicas were seen out of every router instance and, after that, back in everywhere."""
    relative = [dataclasses.replace(p, t=p.t - run.t0) for p in run.probes]
    return out_and_back(relative, run.subject.urls, _exempt(run.subject))[1] is not None


def _done(run: Run, now: float) -> bool:
    """Everything the scenario is judged on (or reports) was observed, the clients sent enough requests to judge
    the error gate, and a short tail passed since the last heal (the caller waits for the held faults' heals first)."""
    if run.scenario.evicts and run.subject.urls and not _restored(run):
        return False
    if (now - run.load_started) * run.settings.rate_per_s < run.settings.min_requests:
        return False  # a fast takeover ends before 1 / gate requests were sent: keep the load on
    since = run.healed_at if run.healed_at is not None else run.t0
    return now - since >= 2 * run.settings.gates.window_s


def climb_s(fleet: Fleet) -> float:
    """The longest a replica back in place takes to earn readmission: ⌈(readmit_at − (migrate_below − 1)) /
    success_reward⌉ reports (from just under the migrate line, where the breakers leave it), the warm-up and one
    interval for the tick that readmits it; counted from the heal (:func:`_watch`)."""
    health, s = fleet.spec.health, fleet.spec.serving
    reports = math.ceil(
        (health.readmit_at - (health.migrate_below - 1)) / health.success_reward
    )  # from the breakers' mark
    return reports * s.heartbeat_interval_s + s.warmup_duration_s + s.heartbeat_interval_s


def watch_s(scenario: Scenario, targets: Sequence[Target], settings: Settings) -> float:
    """How long after the fault the drill watches at most: 1.5 × its longest target (or the hold) + 10 s, the time
    the error gate's requests need, and, for a held fault that takes replicas out, the hold + the slowest return;
    times the patience of its judging (the watch ends as soon as everything was seen)."""
    longest = max([settings.hold_s, *(t.value for t in targets if t.unit == "s")])
    after = max(longest * 1.5 + 10, settings.min_requests / settings.rate_per_s - settings.baseline_s + 10)
    if scenario.evicts and any(_held(f) for f in scenario.faults):
        after = max(after, settings.hold_s + settings.return_s + 10)
    return after * settings.patience


async def run_drill(
    scenario: Scenario,
    targets: Sequence[Target],
    fleet: FleetUrls,
    injector: Injector,
    sizes: FaultSizes,
    settings: Settings,
    progress: Progress,
) -> Run:
    """One drill, start to end; raises :class:`DrillError` when the fleet is not ready for it."""
    progress("settling: every replica in rotation on every router instance, a leader")
    async with FleetHttp(timeout_s=2.0) as http:
        first = await look(http, fleet)
    if all(m is None for m in first.routers.values()):
        raise FleetDown(
            f"no router instance answers ({', '.join(fleet.routers)}): the fleet is not running; start it first "
            "(`exaserve sandbox up`)"
        )
    problems = await settle(fleet, settings.settle_s, settings.probe_s)
    if problems:
        raise DrillError(
            f"the fleet is not ready for a drill after {settings.settle_s:g} s: {'; '.join(problems)}; "
            "check `exaserve status` and the sandbox's logs"
        )
    seen = await look_once(fleet)
    subject = choose_subject(scenario, fleet, seen.leader, seen.restarts)
    run = Run(scenario, subject, tuple(targets), settings)
    deadline_after = watch_s(scenario, targets, settings)
    spec = LoadSpec(
        url=fleet.routers[0],
        failover=fleet.routers[1:],
        rate_per_s=settings.rate_per_s,
        duration_s=settings.baseline_s + deadline_after + settings.hold_s + 60,
        # a client gives up after 30 s (judged on targets); by order, after the patience's multiple of it: a request
        # a loaded machine made slow is served, not failed (only a router that fails it, or a hang, is an error)
        timeout_s=30.0 * settings.patience,
    )
    loadgen = LoadGenerator(spec)
    stop = asyncio.Event()
    load = asyncio.create_task(loadgen.run(stop))
    run.load_started = time.monotonic()
    try:
        async with FleetHttp(timeout_s=min(2.0, settings.probe_s * 4)) as http:
            await _watch(run, fleet, injector, sizes, http, progress, deadline_after)
    finally:
        stop.set()
        run.load = await load
        # what is still broken at the end (the runtime heals the rest; usually nothing is left)
        for fault in [f for f in scenario.faults if f not in run.drill_healed]:
            if done := await injector.heal(fault, subject):
                run.healed_at, run.healed = time.monotonic(), run.healed + done
    progress("settling after the drill")
    run.settled = not await settle(fleet, settings.settle_s, settings.probe_s)
    if fleet.prometheus:
        run.alerts_checked = True
        run.alerts, run.alerts_error = _alerts(fleet.prometheus, run.wall0 - settings.baseline_s)
    _judge(run)
    return run


async def _watch(
    run: Run,
    fleet: FleetUrls,
    injector: Injector,
    sizes: FaultSizes,
    http: FleetHttp,
    progress: Progress,
    deadline_after: float,
) -> None:
    settings, scenario = run.settings, run.scenario
    start = time.monotonic()
    progress(f"baseline: {settings.baseline_s:g} s of client load at {settings.rate_per_s:g}/s")
    while time.monotonic() - start < settings.baseline_s:
        run.probes.append(await look(http, fleet))
        await asyncio.sleep(settings.probe_s)
    run.t0, run.wall0 = time.monotonic(), time.time()
    run.injected = list(await asyncio.gather(*(injector.inject(f, run.subject, sizes) for f in scenario.faults)))
    run.injection_s = time.monotonic() - run.t0
    progress(f"fault injected: {'; '.join(run.injected)}")
    pending = [f for f in scenario.faults if _held(f) or f.component is Component.CONTROLLER]
    tick = run.t0
    while True:
        probe = await look(http, fleet)
        now = probe.t
        run.probes.append(probe)
        t = now - run.t0
        takeover = run.subject.controller is not None and probe.leader not in (None, run.subject.controller)
        due = [f for f in pending if (takeover if f.component is Component.CONTROLLER else t >= settings.hold_s)]
        for fault in due:  # held faults after the hold, a lost leader once another one leads
            pending.remove(fault)
            run.drill_healed.append(fault)
            began = time.monotonic()
            done = await injector.heal(fault, run.subject)
            run.healed_at, run.healed = time.monotonic(), run.healed + done
            run.healing.append((began, run.healed_at))
            progress(f"healed at {t:.1f} s: {'; '.join(done) or 'nothing left to heal'}")
        until = deadline_after
        if run.healed_at is not None and scenario.evicts and run.drill_healed:  # the slowest return, from the heal
            until = max(until, run.healed_at - run.t0 + settings.return_s * settings.patience + 10)
        if (not pending and _done(run, now)) or t >= until:
            run.end = time.monotonic()
            return
        progress(f"watching: {t:.1f} s after the fault{_status(probe, run.subject)}")
        # a fixed cadence: a probe that took long (a busy machine) is followed at once, not a whole period later
        tick = max(tick + settings.probe_s, time.monotonic())
        await asyncio.sleep(tick - time.monotonic())


def _status(p: Probe, subject: Subject) -> str:
    if not subject.urls:
        return f", leader {p.leader}"
    scores = [p.scores.get(u) for u in subject.urls]
    routers = sum(m is not None and all(m.get(u, False) for u in subject.urls) for m in p.routers.values())
    return f", {routers}/{len(p.routers)} routers route to it, score {scores}, leader {p.leader}"


def _alerts(prometheus: str, since: float) -> tuple[list[FiredAlert], str | None]:
    try:
        return alerts_fired(prometheus, since), None
    except PrometheusError as exc:
        return [], str(exc)


def _judge(run: Run) -> None:
    """Turn the observation into figures and checks, times relative to the fault."""
    assert run.load is not None
    offset = run.t0 - run.load_started  # load results are relative to the load's start
    results = [RequestResult(r.sent_at_s - offset, r.latency_s, r.status, r.error) for r in run.load.results]
    probes = [dataclasses.replace(p, t=p.t - run.t0, sent=p.began - run.t0) for p in run.probes]
    run.probes = probes
    run.load = LoadReport(tuple(results), run.load.wall_s, run.load.late)
    subject = run.subject
    run.measured = measure(
        probes,
        results,
        subjects=subject.urls,
        baseline_s=run.settings.baseline_s,
        gates=run.settings.gates,
        end=run.end - run.t0,
        healed=None if run.healed_at is None else run.healed_at - run.t0,
        exempt_routers=_exempt(subject),
        lost_leader=subject.controller,
        injection_s=run.injection_s,
        routable_score=run.settings.routable_score,
    )
    healing = [(a - run.t0, b - run.t0) for a, b in run.healing]
    run.gaps = slipped(probes, run.settings.probe_s, healing)
    run.longest_gap_s = max((g.gap_s for g in counted_gaps(probes, healing)), default=0.0)
    if run.settings.judging == "order":
        run.checks = judge_order(run.scenario, run.targets, run.measured)
    else:
        run.checks = judge(run.scenario, run.targets, run.measured, run.settings.probe_s)
    run.checks += alert_checks(run)
    run.checks.append(
        Check(
            "settled",
            None,
            0.0,
            "",
            run.settled,
            "the fleet was whole again after the drill" if run.settled else "the fleet did not settle after the drill",
        )
    )


def relevant_alerts(run: Run) -> list[FiredAlert]:
    """Alerts that became active at or after the fault (one already active before it is not the drill's), allowing
    for the stamp of a scrape that began before the fault (:attr:`Settings.alert_lead_s`)."""
    return [a for a in run.alerts if a.active_at >= run.wall0 - run.settings.probe_s - run.settings.alert_lead_s]


def alert_checks(run: Run) -> list[Check]:
    """The scenario's alerts that must fire did, and the quiet ones did not (nothing when no Prometheus runs)."""
    if not run.alerts_checked:
        return []
    if run.alerts_error is not None:
        return [Check("alerts", None, 0.0, "", False, f"alerts not read: {run.alerts_error}")]
    fired = {a.alertname for a in relevant_alerts(run)}
    required = list(run.scenario.alerts)
    m, not_due = run.measured, ""
    if OUT_OF_ROTATION in required and m is not None and m.detection_s is not None and m.restoration_s is not None:
        out_s = m.restoration_s - m.detection_s
        if out_s < run.settings.out_alert_due_s:  # back before the alert could fire: neither required nor forbidden
            required.remove(OUT_OF_ROTATION)
            not_due = (
                f"; {OUT_OF_ROTATION} not due: the replica was out {out_s:.1f} s, under its `for` + a scrape and an "
                f"evaluation ({run.settings.out_alert_due_s:g} s)"
            )
    missing = [a for a in required if a not in fired]
    noisy = [a for a in run.scenario.quiet if a in fired]
    due = (", ".join(required) or "none due") + not_due
    return [
        Check(
            "alerts_fired",
            float(len(required) - len(missing)),
            float(len(required)),
            "alerts",
            not missing,
            f"did not fire: {', '.join(missing)}" if missing else f"fired: {due}",
        ),
        Check(
            "alerts_quiet",
            float(len(noisy)),
            0.0,
            "alerts",
            not noisy,
            f"fired but must stay quiet: {', '.join(noisy)}" if noisy else "none of the quiet ones fired",
        ),
    ]
