"""Issue 38's correlated faults, one function per row of its table, each driving the controller's state machine on
the simulated clock (:class:`tests.support.fleet_sim.FleetSim`) at prod settings and returning the measured figures
next to the issue's "Done when" expectations as numbers (:class:`Result`, ``met``).

Used by ``tests/test_runtime_correlated.py`` (asserts each row) and ``bench/runtime_bench.py --scenarios --json``
(prints each row's figures). Every scenario is prod's stack (``fleet_of(spec_from("prod"))``: 256 nodes × 8 = 2,048
replicas, 16 racks of 16 nodes, heartbeat 5 s, eviction cap 204) unless its ``nodes`` says fewer: a smaller cut keeps
every setting the controller reads except the eviction cap (10 % of the replicas) and is used only where the fault
involves a few replicas and the run is long (noted in the result).

What the service does with an action's outcome is :data:`SERVICE` (tests/support/fleet_sim.py's
:class:`~tests.support.fleet_sim.ServiceModel`): what this checkout's ``service.py`` and ``membership.py`` do, which
``test_the_sims_service_model_*`` in tests/test_runtime_correlated.py check against them (a scenario takes
``service=`` to run another).
"""

from __future__ import annotations

import functools
import math
import random
import statistics
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from serving.plan.model import Fleet
from serving.runtime.controller import Controller, ControllerConfig, Kind, replica_urls
from serving.runtime.reports import NodeReport, ReplicaProbe
from serving.sglang_metrics import STALL_BOUNDS_S
from tests.support.fleet_sim import FleetSim, ServiceModel, SimTooSlow, boot_id
from tests.support.stacks import fleet_of, spec_from

# What service.py and membership.py do in this checkout (tests/test_runtime_correlated.py's
# test_the_sims_service_model_* check it against them)
SERVICE = ServiceModel()
FAULT_AT = 10.0  # every fault starts here (s on the simulated clock)
CPU_BUDGET_S = 600.0  # per scenario, a liveness bound: a tick that is not O(n) fails the scenario, never hangs CI
# /health_generate on a healthy replica: SGLang polls for the one-token generation with sleep(1), so at least 1 s
# (serving/sglang_health.py), and answers 503 once SGLANG_HEALTH_CHECK_TIMEOUT (the agent's timeout - 1 s) passes
BASE_PER_TOKEN_S = 0.02  # a healthy replica's time per output token (the latency-outlier signal)
BASE_LATENCY_S = 1.0
STREAMS_IN_FLIGHT = 8  # a routed replica's streamed requests at any moment (the stall signal)
PROD_NODES = 256
HOUR = 3600.0


@functools.cache
def prod_fleet(nodes: int = PROD_NODES) -> Fleet:
    """Prod's stack; with fewer ``nodes``, cut to that many in racks of 16 (prod's rack size), every other setting
    prod's."""
    if nodes == PROD_NODES:
        return fleet_of(spec_from("prod"))
    return fleet_of(spec_from("prod", cluster__pools__0__count=nodes, cluster__pools__0__racks=max(1, nodes // 16)))


def load_time(rid: str) -> float:
    """A model load of 2–10 min, the same for a replica at every (re)start (seeded by its id)."""
    return 120.0 + 480.0 * random.Random(f"load/{rid}").random()


@dataclass(frozen=True)
class Expect:
    """One expectation of the issue's "Done when": ``measured[figure] op value``."""

    figure: str
    op: str  # "==", "<=", ">="
    value: float | bool

    def holds(self, measured: Mapping[str, Any]) -> bool:
        got = measured.get(self.figure)
        if got is None:
            return False  # never happened (never back, never detected) or not measured (aborted)
        if self.op == "==":
            return bool(got == self.value)
        if self.op == "<=":
            return bool(got <= self.value)
        return bool(got >= self.value)

    def __str__(self) -> str:
        return f"{self.figure} {self.op} {self.value}"


@dataclass
class Result:
    scenario: str
    replicas: int
    measured: dict[str, Any]
    expected: list[Expect]
    cpu_s: float = 0.0
    note: str = ""
    aborted: str | None = None  # why the run stopped early (SimTooSlow)

    @property
    def met(self) -> bool:
        return self.aborted is None and all(e.holds(self.measured) for e in self.expected)

    def unmet(self) -> list[str]:
        """Each expectation that does not hold, naming the measured figure."""
        out = [f"aborted: {self.aborted}"] if self.aborted else []
        out += [f"{e.figure} = {self.measured.get(e.figure)!r} (expected {e.op} {e.value})" for e in self.expected]
        return (
            out if self.aborted else [m for e, m in zip(self.expected, out, strict=True) if not e.holds(self.measured)]
        )

    def why(self) -> str:
        """The assertion message: what failed, then every figure measured."""
        figures = ", ".join(f"{k}={v!r}" for k, v in self.measured.items())
        return f"{self.scenario} ({self.replicas} replicas): {'; '.join(self.unmet())} | measured: {figures}"

    def json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "replicas": self.replicas,
            "measured": self.measured,
            "expected": {e.figure: f"{e.op} {e.value}" for e in self.expected},
            "met": self.met,
            "cpu_s": round(self.cpu_s, 2),
            **({"note": self.note} if self.note else {}),
            **({"aborted": self.aborted} if self.aborted else {}),
        }


def check(result: Result) -> None:
    """In a test: fails naming each unmet figure against its expectation, then every figure measured."""
    if not result.met:
        pytest.fail(result.why(), pytrace=False)


def _sim(fleet: Fleet, up: Callable[[str, float], bool], **kw: Any) -> FleetSim:
    """A FleetSim with this module's :data:`SERVICE` (unless ``service`` is given) and :data:`CPU_BUDGET_S`."""
    if kw.get("service") is None:
        kw["service"] = SERVICE
    return FleetSim(fleet, up, cpu_budget_s=CPU_BUDGET_S, **kw)


def _ids(fleet: Fleet, keep: Callable[[Any], bool]) -> list[str]:
    return [r.id for r in fleet.plan.replicas if keep(r)]


def _first_rack(fleet: Fleet) -> tuple[set[str], set[str]]:
    """rack-00's nodes and its replicas' ids: where the rack-wide faults strike."""
    rack = fleet.plan.replicas[0].node.rack
    return {r.node.name for r in fleet.plan.replicas if r.node.rack == rack}, set(
        _ids(fleet, lambda r: r.node.rack == rack)
    )


def _common(sim: FleetSim, during: tuple[float, float] | None = None) -> dict[str, Any]:
    """What every scenario reports: restarts asked (migrations started) and made (reached the node), per tick, the
    removals and those the cap refused, quarantines, rejected reports, the slowest tick."""
    ctl = sim.ctl
    out: dict[str, Any] = {
        "restarts_asked": sum(sim.asked.values()),
        "restarts_made": sum(sim.restarts.values()),
        "restarts_unreached": sum(sim.unreached.values()),
        "restarts_per_tick_max": sim.restarts_per_tick_max,
        "removals": sum(kind is Kind.REMOVE for _, kind, _ in sim.log),
        "removals_refused": ctl.counters.capped,
        "quarantined": sum(c.counters.quarantined for c in sim.controllers),  # put in quarantine (each time)
        "reports_rejected": sum(ctl.counters.rejected.values()),
        "out_of_rotation_max": sim.out_max,
        "tick_cpu_max_ms": round(sim.tick_cpu_max_s * 1000, 1),
    }
    if during is not None:
        a, b = during
        out["restarts_asked_during_fault"] = sum(kind is Kind.MIGRATE and a <= t < b for t, kind, _ in sim.log)
    return out


def _run(sim: FleetSim, until: float) -> str | None:
    try:
        sim.run(until)
    except SimTooSlow as exc:
        return str(exc)
    return None


def _first(sim: FleetSim, rid: str, kinds: Collection[Kind], after: float = 0.0) -> float | None:
    return next((t for t, kind, r in sim.log if r == rid and kind in kinds and t >= after), None)


def _back_after(sim: FleetSim, since: float) -> float | None:
    """Seconds after ``since`` from which every watched replica was listed by the routers and answering (to the end
    of the run); None when they were not all back by then."""
    return None if sim.whole_since is None else max(0.0, sim.whole_since - since)


def _finish(
    name: str,
    sim: FleetSim,
    measured: dict[str, Any],
    expected: list[Expect],
    started: float,
    aborted: str | None,
    note: str = "",
) -> Result:
    measured["simulated_s"] = sim.now
    return Result(name, len(sim.ids), measured, expected, time.process_time() - started, note, aborted)


# ----- the rows -------------------------------------------------------------------------------------------------------
def leaf_switch(
    breakers_after_s: float = 5.0, *, nodes: int = PROD_NODES, service: ServiceModel | None = None
) -> Result:
    """A leaf switch cuts rack-00 (16 nodes, 128 replicas) off for 120 s: their reports do not arrive, a restart
    (SSH) does not reach them, and the routers' breakers open ``breakers_after_s`` into the cut (5 s: before the
    nodes go suspect at 15 s; 20 s: after). Expected: 0 restarts during the partition (nor after it: nothing broke),
    the rack back in rotation ≤ 30 s after the heal."""
    started = time.process_time()
    fleet = prod_fleet(nodes)
    racked, ids = _first_rack(fleet)
    heal = FAULT_AT + 120.0

    def cut(node: str, t: float) -> bool:
        return node in racked and FAULT_AT <= t < heal

    sim = _sim(
        fleet,
        lambda _r, _t: True,
        load_s=load_time,
        reaches=lambda n, t: not cut(n, t),
        ssh=lambda n, t: not cut(n, t),
        breaker=lambda r, t: r in ids and FAULT_AT + breakers_after_s <= t < heal,
        watch=ids,
        service=service,
    )
    aborted = _run(sim, heal + 400.0)
    measured = _common(sim, (FAULT_AT, heal))
    measured["rack_replicas"] = len(ids)
    measured["rack_back_after_heal_s"] = _back_after(sim, heal)
    measured["rack_out_of_routing_s_max"] = max(sim.out_s.values(), default=0.0)
    expected = [
        Expect("restarts_asked_during_fault", "==", 0),
        Expect("restarts_asked", "==", 0),
        Expect("rack_back_after_heal_s", "<=", 30.0),
    ]
    name = "leaf_switch" if breakers_after_s < 15 else "leaf_switch_breakers_after_suspect"
    return _finish(name, sim, measured, expected, started, aborted)


def rack_probes_fail(*, nodes: int = PROD_NODES, service: ServiceModel | None = None) -> Result:
    """The same rack's replicas fail their probes for 120 s (the reports arrive, saying so), the routers' breakers
    open, SSH fails too. A correlated fault: removed within the cap, 0 restarts, 0 quarantined, back ≤ 30 s after the
    heal (the leaf switch's bound)."""
    started = time.process_time()
    fleet = prod_fleet(nodes)
    racked, ids = _first_rack(fleet)
    heal = FAULT_AT + 120.0
    sim = _sim(
        fleet,
        lambda r, t: r not in ids or not FAULT_AT <= t < heal,
        load_s=load_time,
        ssh=lambda n, t: n not in racked or not FAULT_AT <= t < heal,
        breaker_when_down=True,
        watch=ids,
        service=service,
    )
    aborted = _run(sim, heal + 600.0)
    measured = _common(sim, (FAULT_AT, heal))
    measured["rack_replicas"] = len(ids)
    measured["rack_back_after_heal_s"] = _back_after(sim, heal)
    expected = [
        Expect("restarts_asked_during_fault", "==", 0),
        Expect("quarantined", "==", 0),
        Expect("rack_back_after_heal_s", "<=", 30.0),
    ]
    return _finish("rack_probes_fail", sim, measured, expected, started, aborted)


def overload(*, nodes: int = PROD_NODES) -> Result:
    """The routers hold the breakers of 30 % of the replicas open for 60 s (an overload: requests time out), the
    agents' probes fine. Expected: 0 restarts (request errors alone never restart)."""
    started = time.process_time()
    fleet = prod_fleet(nodes)
    ids = set(_ids(fleet, lambda r: r.index % 10 < 3))
    end = FAULT_AT + 60.0
    sim = _sim(
        fleet,
        lambda _r, _t: True,
        load_s=load_time,
        breaker=lambda r, t: r in ids and FAULT_AT <= t < end,
    )
    aborted = _run(sim, end + 120.0)
    measured = _common(sim, (FAULT_AT, end))
    measured["breakers_open"] = len(ids)
    measured["out_of_rotation_at_end"] = len(sim.ids) - len(sim.routed)
    expected = [Expect("restarts_asked", "==", 0)]
    return _finish("overload", sim, measured, expected, started, aborted)


REBOOT_S = 120.0  # a node's reboot: no report from it meanwhile


def reboot_wave(*, nodes: int = PROD_NODES, wave_s: float = 60.0, after_s: float = 240.0) -> Result:
    """Every node reboots within ``wave_s`` (node i at FAULT_AT + wave_s × i / nodes, down 120 s), then its replicas
    load for 2–10 min (:func:`load_time`); the routers' breakers are open while a replica they list does not answer.
    Expected: 0 restarts (every replica was loading or serving), the fleet whole ≤ 60 s after the slowest load."""
    started = time.process_time()
    fleet = prod_fleet(nodes)
    names = sorted({r.node.name for r in fleet.plan.replicas})
    reboots = {
        n: (FAULT_AT + wave_s * i / len(names), FAULT_AT + wave_s * i / len(names) + REBOOT_S)
        for i, n in enumerate(names)
    }
    slowest = max(reboots[r.node.name][1] + load_time(r.id) for r in fleet.plan.replicas)
    sim = _sim(
        fleet,
        lambda _r, _t: True,
        load_s=load_time,
        reboots=reboots,
        breaker_when_down=True,
        watch=set(_ids(fleet, lambda _r: True)),
    )
    aborted = _run(sim, slowest + after_s)
    measured = _common(sim)
    measured["slowest_load_ends_s"] = round(slowest, 1)
    measured["whole_at_s"] = sim.whole_since
    measured["whole_after_slowest_load_s"] = _back_after(sim, slowest)
    measured["restarts_of_serving_replicas"] = sum(
        kind is Kind.MIGRATE and t >= reboots[sim.node_of[rid]][1] + load_time(rid) for t, kind, rid in sim.log
    )
    expected = [Expect("restarts_asked", "==", 0), Expect("whole_after_slowest_load_s", "<=", 60.0)]
    return _finish("reboot_wave", sim, measured, expected, started, aborted)


def router_500(*, nodes: int = PROD_NODES, service: ServiceModel | None = None) -> Result:
    """One router instance answers HTTP 500 to membership calls for 5 min; meanwhile a node's 8 replicas die (10 s in)
    and the lease moves to the warm follower (200 s in). Expected: a leader throughout, the dead replicas restarted
    within the 5 min, failed membership changes backed off (per replica, no more than the restart back-off allows in
    5 min). The service's half (membership.py, the campaign) is tested against real routers elsewhere; here the
    controller's half, under :data:`SERVICE`'s model of the service."""
    started = time.process_time()
    fleet = prod_fleet(nodes)
    node = fleet.plan.replicas[8].node.name
    dead = set(_ids(fleet, lambda r: r.node.name == node))
    end = FAULT_AT + 300.0
    sim = _sim(
        fleet,
        lambda r, t: r not in dead or t < FAULT_AT + 10 or sim.restarts[r] > 0,
        load_s=load_time,
        router_error=lambda t: FAULT_AT <= t < end,
        handover_at=FAULT_AT + 200.0,
        service=service,
    )
    aborted = _run(sim, end - 0.1)  # the last tick inside the window
    in_window = {rid: sim.failed_changes[rid] for rid in dead}
    restarted = sum(sim.restarts[rid] > 0 for rid in dead)
    aborted = aborted or _run(sim, end + 300.0)
    cfg = sim.ctl.config
    allowed = sum(sum(cfg.backoff_s(k) for k in range(1, n)) <= end - FAULT_AT for n in range(1, 100))
    measured = _common(sim)
    measured["leaderless_s"] = sim.leaderless_s
    measured["dead_replicas"] = len(dead)
    measured["dead_restarted_in_window"] = restarted
    measured["failed_changes_in_window"] = sum(in_window.values())
    measured["failed_changes_per_replica_max"] = max(in_window.values())
    measured["failed_changes_per_replica_per_hour"] = round(max(in_window.values()) * HOUR / (end - FAULT_AT))
    measured["dead_restarted_by_end"] = sum(sim.restarts[rid] > 0 for rid in dead)
    expected = [
        Expect("leaderless_s", "==", 0.0),
        Expect("dead_restarted_in_window", "==", len(dead)),
        Expect("failed_changes_per_replica_max", "<=", allowed),
    ]
    return _finish("router_500", sim, measured, expected, started, aborted)


def _node_fault(fleet: Fleet, seconds: float, handover_at: float | None) -> tuple[FleetSim, set[str], str | None]:
    node = fleet.plan.replicas[0].node.name
    on = set(_ids(fleet, lambda r: r.node.name == node))
    sim = _sim(
        fleet,
        lambda r, t: r not in on or not FAULT_AT <= t < FAULT_AT + seconds,
        load_s=120.0,
        handover_at=handover_at,
    )
    return sim, on, _run(sim, FAULT_AT + seconds + 600.0)


@functools.cache
def _handover_baseline(nodes: int) -> tuple[dict[str, int], int]:
    sim, _on, _aborted = _node_fault(prod_fleet(nodes), 300.0, None)
    return dict(sim.restarts), sim.restarts_per_tick_max


def handover(at_s: float, *, nodes: int = PROD_NODES) -> Result:
    """A 300 s node-wide fault (8 replicas down, its agent reporting, loads 120 s); the lease moves to the warm
    follower ``at_s`` into the fault (it adopts what the routers list). Expected: the same restarts as without a
    hand-over (8, one per replica), none of a replica outside the node."""
    started = time.process_time()
    fleet = prod_fleet(nodes)
    baseline, _ = _handover_baseline(nodes)
    sim, on, aborted = _node_fault(fleet, 300.0, FAULT_AT + at_s)
    measured = _common(sim)
    measured["handover_at_s"] = at_s
    measured["baseline_restarts_made"] = sum(baseline.values())
    measured["same_restarts_as_baseline"] = dict(sim.restarts) == baseline
    measured["restarts_outside_the_node"] = sum(n for rid, n in sim.restarts.items() if rid not in on)
    expected = [
        Expect("same_restarts_as_baseline", "==", True),
        Expect("restarts_made", "==", sum(baseline.values())),
        Expect("restarts_outside_the_node", "==", 0),
    ]
    note = "" if nodes == PROD_NODES else f"a {nodes}-node cut of prod (bench/runtime_bench.py --prod-size: 2,048)"
    return _finish(f"handover_at_{at_s:g}s", sim, measured, expected, started, aborted, note)


def _killed(fleet: Fleet, skew_s: float) -> tuple[FleetSim, str, str | None]:
    rid = fleet.plan.replicas[2].id
    sim = _sim(
        fleet,
        lambda r, t: r != rid or t < FAULT_AT or sim.restarts[r] > 0,
        load_s=120.0,
        skew_s=skew_s,
    )
    return sim, rid, _run(sim, FAULT_AT + 300.0)


def _detection(sim: FleetSim, rid: str) -> tuple[float | None, float | None]:
    out = _first(sim, rid, (Kind.REMOVE, Kind.MIGRATE), FAULT_AT)
    restart = _first(sim, rid, (Kind.MIGRATE,), FAULT_AT)
    return (None if out is None else out - FAULT_AT, None if restart is None else restart - FAULT_AT)


@functools.cache
def _skew_baseline(nodes: int) -> tuple[float | None, float | None]:
    sim, rid, _ = _killed(prod_fleet(nodes), 0.0)
    return _detection(sim, rid)


def clock_skew(skew_s: float, *, nodes: int = PROD_NODES) -> Result:
    """The agents' clocks are ``skew_s`` off the controller's (``sent_at`` = the controller's time + skew); one replica
    is killed 10 s in. Expected: every report accepted, the killed replica removed and restarted when it is without
    the skew (one tick's leeway). The alert on the skew is the status' (not measured here)."""
    started = time.process_time()
    fleet = prod_fleet(nodes)
    base_out, base_restart = _skew_baseline(nodes)
    sim, rid, aborted = _killed(fleet, skew_s)
    out, restart = _detection(sim, rid)
    c = sim.ctl.counters
    measured = _common(sim)
    measured["skew_s"] = skew_s
    measured["reports_accepted_share"] = round(c.accepted / max(1, c.accepted + sum(c.rejected.values())), 4)
    measured["killed_out_after_s"] = out
    measured["killed_restarted_after_s"] = restart
    measured["baseline_out_after_s"] = base_out
    measured["baseline_restarted_after_s"] = base_restart
    tick = fleet.spec.serving.heartbeat_interval_s / 2
    measured["detection_delay_vs_baseline_s"] = (
        None
        if out is None or restart is None or base_out is None or base_restart is None
        else max(abs(out - base_out), abs(restart - base_restart))
    )
    expected = [
        Expect("reports_accepted_share", "==", 1.0),
        Expect("detection_delay_vs_baseline_s", "<=", tick),
    ]
    return _finish(f"clock_skew_{skew_s:+g}s", sim, measured, expected, started, aborted)


FLAPS = ((3.0, 3.0), (20.0, 20.0), (60.0, 60.0), (120.0, 120.0), (300.0, 300.0))  # (down, up) seconds


def flapping(*, nodes: int = 16, hours: float = 4.0) -> Result:
    """Five replicas on five nodes flap, one per period of :data:`FLAPS` (down, then up, from 10 s in), for 4 h;
    loads take 120 s. Expected for each: ≤ 3 restarts, then quarantined. Run on a 16-node cut of prod (cap 12 ≥ 5)
    by default: 4 h at 2,048 replicas costs ~100 s of CPU for 5 replicas' behaviour."""
    started = time.process_time()
    fleet = prod_fleet(nodes)
    flappers = {fleet.plan.replicas[8 * k + 1].id: period for k, period in enumerate(FLAPS)}

    def up(rid: str, t: float) -> bool:
        period = flappers.get(rid)
        if period is None or t < FAULT_AT:
            return True
        down, upt = period
        return (t - FAULT_AT) % (down + upt) >= down

    sim = _sim(fleet, up, load_s=120.0)
    aborted = _run(sim, FAULT_AT + hours * HOUR)
    measured = _common(sim)
    expected = []
    for rid, (down, upt) in flappers.items():
        key = f"{down:g}/{upt:g}"
        measured[f"restarts_{key}"] = sim.restarts[rid]
        measured[f"quarantined_{key}"] = sim.ctl.replicas[rid].quarantined
        measured[f"warmups_failed_{key}"] = sim.warmups_failed[rid]
        expected += [Expect(f"restarts_{key}", "<=", 3), Expect(f"quarantined_{key}", "==", True)]
    note = "" if nodes == PROD_NODES else f"a {nodes}-node cut of prod (bench/runtime_bench.py --prod-size: 2,048)"
    return _finish("flapping", sim, measured, expected, started, aborted, note)


def stalls(*, nodes: int = PROD_NODES, stall_s: float = 4.0, every_s: float = 20.0) -> Result:
    """One replica stops for ``stall_s`` every ``every_s`` (SIGSTOP-like) from 10 s in; each stall catches one probe
    2 s in: its health generation waits out the stall's 2 s left and SGLang's own health timeout (the agent's
    3 s - 1 s) answers 503 first, so the probe fails (a probe is never slow but under the timeout: it polls in 1 s
    steps). The routers' breakers stay closed (requests wait, not fail). The time per output token of its requests
    finishing in a report's interval rises at most by interval ÷ (interval − the stall's share of it): 1.67× for each
    of the two reports a 4 s stall spans here, under the 3× ratio, and one failed probe in four moves its score down 2
    points per 20 s: neither signal sees it. What does: each of its :data:`STREAMS_IN_FLIGHT` streamed requests gets a
    token ``stall_s`` after its last when the stall ends (SGLang's inter-token latency histogram), in the report after
    it, while no other replica has one. Expected: out of routing within 60 s, never restarted for it."""
    started = time.process_time()
    fleet = prod_fleet(nodes)
    rid = fleet.plan.replicas[3].id
    first = FAULT_AT + 3.0  # reports land on multiples of 5 s: each stall covers one, 2 s into it
    timeout = fleet.spec.serving.health_check_timeout_s

    def latency(r: str, t: float) -> float | None:
        if r != rid or t < first or (t - first) % every_s >= stall_s:
            return BASE_LATENCY_S
        lat = stall_s - (t - first) % every_s + BASE_LATENCY_S
        return lat if lat <= timeout - 1 else None

    iv = fleet.spec.serving.heartbeat_interval_s

    def per_token(r: str, t: float) -> float:
        if r != rid or t < first:
            return BASE_PER_TOKEN_S
        starts = [first + k * every_s for k in range(int((t - iv - first) // every_s), int((t - first) // every_s) + 1)]
        stalled = sum(max(0.0, min(t, s + stall_s) - max(t - iv, s)) for s in starts if s >= first)
        return BASE_PER_TOKEN_S * iv / max(iv - stalled, 0.1 * iv)

    def gaps(r: str, t: float) -> dict[float, float]:
        ends = [first + k * every_s + stall_s for k in range(int((t - first) // every_s) + 1)] if r == rid else []
        ended = any(t - iv < end <= t for end in ends if end >= first)
        return {bound: STREAMS_IN_FLIGHT * (ended and stall_s + BASE_PER_TOKEN_S > bound) for bound in STALL_BOUNDS_S}

    sim = _sim(fleet, lambda _r, _t: True, load_s=load_time, latency=latency, per_token=per_token, gaps=gaps)
    aborted = _run(sim, FAULT_AT + 300.0)
    out = _first(sim, rid, (Kind.REMOVE, Kind.MIGRATE), FAULT_AT)
    measured = _common(sim)
    measured["stalling_out_after_s"] = None if out is None else out - FAULT_AT
    measured["stalling_restarts"] = sim.restarts[rid]
    expected = [Expect("stalling_out_after_s", "<=", 60.0), Expect("stalling_restarts", "==", 0)]
    return _finish("stalls", sim, measured, expected, started, aborted)


def generation_failing(*, nodes: int = PROD_NODES, run_s: float = 900.0) -> Result:
    """From 10 s in one replica fails every generation (the routers' breakers open while they list it, its warm-up
    requests fail) while its /health and the agent's probe pass; a restart does not fix it. Expected: quarantined
    after ≤ 2 restarts."""
    started = time.process_time()
    fleet = prod_fleet(nodes)
    rid = fleet.plan.replicas[4].id
    sim = _sim(
        fleet,
        lambda _r, _t: True,
        load_s=load_time,
        breaker=lambda r, t: r == rid and t >= FAULT_AT,
    )
    aborted = _run(sim, FAULT_AT + run_s)
    measured = _common(sim)
    measured["failing_restarts"] = sim.restarts[rid]
    measured["failing_quarantined"] = sim.ctl.replicas[rid].quarantined
    measured["failing_warmups_failed"] = sim.warmups_failed[rid]
    measured["failing_warmups_failed_per_hour"] = round(sim.warmups_failed[rid] * HOUR / run_s, 1)
    expected = [Expect("failing_quarantined", "==", True), Expect("failing_restarts", "<=", 2)]
    return _finish("generation_failing", sim, measured, expected, started, aborted)


SLOW_S = 600.0


def _slow_ids(fleet: Fleet) -> list[str]:
    """10 % of the replicas (every tenth), 204 of 2,048."""
    return [r.id for r in fleet.plan.replicas if r.index % 10 == 0][: len(fleet.plan.replicas) // 10]


def slow(*, nodes: int = PROD_NODES) -> Result:
    """10 % of the replicas answer 5× slower for 10 min. Their probes show nothing: a one-token generation 5× slower
    still ends within SGLang's first 1 s poll of /health_generate; their requests' time per output token is 5× the
    fleet's (the latency-outlier signal). Expected: out of routing within the cap (``ControllerConfig.max_evicted``)
    in ≤ 60 s, never more than the cap out, 0 restarts; back once the slowness ended (ejected again meanwhile each time
    its ejection time, growing, ran out: Envoy's outlier detection)."""
    started = time.process_time()
    fleet = prod_fleet(nodes)
    ids = set(_slow_ids(fleet))
    end = FAULT_AT + SLOW_S

    def per_token(r: str, t: float) -> float:
        return BASE_PER_TOKEN_S * (5.0 if r in ids and FAULT_AT <= t < end else 1.0)

    sim = _sim(fleet, lambda _r, _t: True, load_s=load_time, watch=ids, per_token=per_token)
    aborted = _run(sim, FAULT_AT + 60.0)
    out_at_60 = len(ids - sim.routed)
    aborted = aborted or _run(sim, end + 120.0)
    cap = sim.ctl.config.max_evicted
    measured = _common(sim)
    measured["slow_replicas"] = len(ids)
    measured["cap"] = cap
    measured["slow_out_at_60s"] = out_at_60
    measured["slow_back_after_end_s"] = _back_after(sim, end)
    expected = [
        Expect("slow_out_at_60s", ">=", min(len(ids), cap)),
        Expect("out_of_rotation_max", "<=", cap),
        Expect("restarts_asked", "==", 0),
        Expect("slow_back_after_end_s", "<=", 360.0),
    ]
    return _finish("slow", sim, measured, expected, started, aborted)


def slow_saturated(*, nodes: int = PROD_NODES) -> Result:
    """The slow 10 % are saturated too while routed (GPU 0.95, the others 0.3; KV pool 0.9 and 0.5), one out of
    rotation is idle (GPU 0, KV pool 0). Memory is what the agent reports: SGLang's token usage, never DCGM's frame
    buffer, which reads 0.9 on an idle replica since SGLang allocates its pool at start-up (until issue 38 the agent
    sent that with --dcgm-url, and a shed replica never looked idle: tests/test_runtime_agent.py holds the agent to
    it). A node's 8 replicas die
    120 s into it for 120 s. Expected: those 8 out of routing within 60 s (shedding leaves the failure budget alone),
    no restart of a healthy replica, every shed replica back ≤ 60 s after the slowness ends (it is idle)."""
    started = time.process_time()
    fleet = prod_fleet(nodes)
    ids = set(_slow_ids(fleet))
    end = FAULT_AT + SLOW_S
    node = fleet.plan.replicas[8 * 4].node.name  # replicas 32–39: none of them slow
    dead = set(_ids(fleet, lambda r: r.node.name == node)) - ids
    dead_at = FAULT_AT + 120.0

    def figures(r: str, t: float) -> tuple[float, float]:
        if r not in sim.routed:
            return 0.0, 0.0
        return (0.95, 0.9) if r in ids and FAULT_AT <= t < end else (0.3, 0.5)

    sim = _sim(
        fleet,
        lambda r, t: r not in dead or not dead_at <= t < dead_at + 120.0,
        load_s=load_time,
        figures=figures,
        watch=ids,
    )
    aborted = _run(sim, dead_at)
    shed_before = len(ids - sim.routed)
    aborted = aborted or _run(sim, dead_at + 60.0)
    dead_out = len(dead - sim.routed)
    aborted = aborted or _run(sim, end + 180.0)
    measured = _common(sim)
    measured["slow_replicas"] = len(ids)
    measured["cap"] = sim.ctl.config.max_evicted
    measured["shed_when_the_node_died"] = shed_before
    measured["dead_replicas"] = len(dead)
    measured["dead_out_within_60s"] = dead_out
    measured["restarts_of_healthy"] = sum(n for rid, n in sim.restarts.items() if rid not in dead)
    measured["shed_back_after_idle_s"] = _back_after(sim, end)
    expected = [
        Expect("dead_out_within_60s", "==", len(dead)),
        Expect("restarts_of_healthy", "==", 0),
        Expect("shed_back_after_idle_s", "<=", 60.0),
    ]
    return _finish("slow_saturated", sim, measured, expected, started, aborted)


def agent_dead(*, nodes: int = PROD_NODES) -> Result:
    """A node's agent is dead for 5 min (no report; its replicas serve); meanwhile one of its replicas' breakers opens
    for 20 s (a blip). Expected: nothing: 0 restarts, that replica out of routing no longer than the blip plus two
    intervals (30 s)."""
    started = time.process_time()
    fleet = prod_fleet(nodes)
    node = fleet.plan.replicas[0].node.name
    on = set(_ids(fleet, lambda r: r.node.name == node))
    rid = fleet.plan.replicas[1].id
    sim = _sim(
        fleet,
        lambda _r, _t: True,
        load_s=load_time,
        reaches=lambda n, t: n != node or not FAULT_AT <= t < FAULT_AT + 300.0,
        breaker=lambda r, t: r == rid and FAULT_AT + 100.0 <= t < FAULT_AT + 120.0,
        watch=on,
    )
    aborted = _run(sim, FAULT_AT + 600.0)
    measured = _common(sim)
    measured["blip_replica_out_of_routing_s"] = sim.out_s[rid]
    expected = [Expect("restarts_asked", "==", 0), Expect("blip_replica_out_of_routing_s", "<=", 30.0)]
    return _finish("agent_dead", sim, measured, expected, started, aborted)


def stale_breakers(*, nodes: int = PROD_NODES) -> Result:
    """Not a row of the issue: what the sandbox met under load. The routers read open the breakers of every replica
    of rack-00 and rack-01 but one node's (248 replicas, more than the eviction cap: none is taken out for it) for the
    whole run while their agents report every probe fine (smg publishes a breaker only at a transition and closes it
    only on requests that succeed: a replica that gets little traffic reads open long after it recovered); 60 s in,
    that one node dies (its replicas fail their probes until restarted). Expected: breakers the agents contradict
    disrupt no rack: the dead node's 8 replicas restarted as soon as without them, nothing else."""
    started = time.process_time()
    fleet = prod_fleet(nodes)
    racks = {r.node.rack for r in fleet.plan.replicas[: 2 * 16 * 8]}
    dead_node = fleet.plan.replicas[0].node.name
    dead = set(_ids(fleet, lambda r: r.node.name == dead_node))
    stale = set(_ids(fleet, lambda r: r.node.rack in racks and r.node.name != dead_node))
    died = FAULT_AT + 60.0
    sim = _sim(
        fleet,
        lambda r, t: r not in dead or t < died or sim.restarts[r] > 0,
        load_s=120.0,
        breaker=lambda r, t: r in dead and t >= died and sim.restarts[r] == 0,
        stale_breaker=lambda r, t: r in stale and t >= FAULT_AT,
        watch=dead,
    )
    aborted = _run(sim, FAULT_AT + 600.0)
    measured = _common(sim)
    asked = [_first(sim, r, (Kind.MIGRATE,), died) for r in dead]
    measured["dead_replicas_restarted"] = sum(sim.restarts[r] > 0 for r in dead)
    measured["dead_restart_asked_after_s"] = None if None in asked else max(a for a in asked if a is not None) - died
    measured["restarts_outside_the_dead_node"] = sum(n for rid, n in sim.restarts.items() if rid not in dead)
    # as without the stale breakers: the report that takes a score from its start under health.migrate_below, then
    # the leader's next tick (half an interval)
    health, interval = fleet.spec.health, fleet.spec.serving.heartbeat_interval_s
    due_s = math.ceil((health.start - health.migrate_below + 1) / health.timeout_penalty) * interval + interval / 2
    expected = [
        Expect("dead_replicas_restarted", "==", len(dead)),
        Expect("dead_restart_asked_after_s", "<=", due_s),
        Expect("restarts_outside_the_dead_node", "==", 0),
    ]
    return _finish("stale_breakers", sim, measured, expected, started, aborted)


def rack_blip(*, nodes: int = PROD_NODES) -> Result:
    """Not a row of the issue: what the sandbox met under load (one process hosts a rack's workers, and a loaded
    machine starved it). Every replica of rack-00 fails one round of probes (one heartbeat interval), then all pass.
    Expected: one failed probe moves a score by 5 outside a disrupted rack and takes nothing out; inside one it
    must not either: 0 removals, 0 restarts."""
    started = time.process_time()
    fleet = prod_fleet(nodes)
    _, ids = _first_rack(fleet)
    blip = fleet.spec.serving.heartbeat_interval_s
    sim = _sim(fleet, lambda r, t: r not in ids or not FAULT_AT <= t < FAULT_AT + blip, load_s=120.0, watch=ids)
    aborted = _run(sim, FAULT_AT + 120.0)
    measured = _common(sim)
    expected = [Expect("removals", "==", 0), Expect("restarts_asked", "==", 0)]
    return _finish("rack_blip", sim, measured, expected, started, aborted)


def _two_nodes_then_their_rack(fleet: Fleet, rack_joins: bool) -> tuple[FleetSim, set[str], str | None]:
    first = {r.node.name for r in fleet.plan.replicas[:16]}  # the rack's first two nodes
    early = set(_ids(fleet, lambda r: r.node.name in first))
    _, racked = _first_rack(fleet)
    joins = FAULT_AT + 4 * fleet.spec.serving.heartbeat_interval_s

    def up(r: str, t: float) -> bool:
        return not ((r in early and t >= FAULT_AT) or (rack_joins and r in racked and t >= joins))

    sim = _sim(fleet, up, load_s=120.0, watch=early)
    return sim, early, _run(sim, FAULT_AT + 120.0)


def rack_degrades(*, nodes: int = PROD_NODES) -> Result:
    """Not a row of the issue: two of rack-00's nodes fail their probes from 10 s, and 4 reports later the whole rack
    does (it is disrupted from then on). Expected: those two nodes' replicas leave rotation no sooner than when their
    rack stays whole (their failures before the disruption are in their frozen score and count once)."""
    started = time.process_time()
    fleet = prod_fleet(nodes)
    alone, early, _ = _two_nodes_then_their_rack(fleet, rack_joins=False)
    sim, early, aborted = _two_nodes_then_their_rack(fleet, rack_joins=True)
    measured = _common(sim)

    def out_at(s: FleetSim) -> float | None:
        times = [_first(s, r, (Kind.REMOVE, Kind.MIGRATE), FAULT_AT) for r in early]
        return None if None in times else min(t for t in times if t is not None) - FAULT_AT

    measured["out_after_s"] = out_at(sim)
    measured["out_after_s_rack_whole"] = out_at(alone)
    measured["not_sooner_than_whole"] = (
        measured["out_after_s"] is not None
        and measured["out_after_s_rack_whole"] is not None
        and measured["out_after_s"] >= measured["out_after_s_rack_whole"]
    )
    expected = [Expect("not_sooner_than_whole", "==", True), Expect("restarts_asked", "==", 0)]
    return _finish("rack_degrades", sim, measured, expected, started, aborted)


HANDOVER_AT_S = (30.0, 100.0, 200.0, 290.0, 310.0)  # seconds into the 300 s node fault (310: its replicas warming)
SKEWS_S = (30.0, -30.0)


def every_scenario(*, cut_nodes: int = 16) -> list[tuple[str, Callable[[], Result]]]:
    """Each row as (its result's name, a call), in the issue's table order; the hand-over sweep and the flapping run on
    ``cut_nodes`` (:data:`PROD_NODES` for prod size)."""
    rows: list[tuple[str, Callable[[], Result]]] = [
        ("leaf_switch", leaf_switch),
        ("leaf_switch_breakers_after_suspect", functools.partial(leaf_switch, 20.0)),
        ("rack_probes_fail", rack_probes_fail),
        ("overload", overload),
        ("reboot_wave", reboot_wave),
        ("router_500", router_500),
    ]
    rows += [(f"handover_at_{at:g}s", functools.partial(handover, at, nodes=cut_nodes)) for at in HANDOVER_AT_S]
    rows += [(f"clock_skew_{s:+g}s", functools.partial(clock_skew, s)) for s in SKEWS_S]
    rows += [
        ("flapping", functools.partial(flapping, nodes=cut_nodes)),
        ("stalls", stalls),
        ("generation_failing", generation_failing),
        ("slow", slow),
        ("slow_saturated", slow_saturated),
        ("agent_dead", agent_dead),
        ("stale_breakers", stale_breakers),
        ("rack_blip", rack_blip),
        ("rack_degrades", rack_degrades),
    ]
    return rows


# ----- one tick's CPU -------------------------------------------------------------------------------------------------
def _ticks(fleet: Fleet, ticks: int, failing: Callable[[int, random.Random], bool]) -> list[float]:
    """CPU of each of ``ticks`` leader ticks, a round of reports applied before every other one (load figures spread;
    replica ``i``'s probe fails where ``failing(i, rng)``), actions completed at once (not timed)."""
    plan = fleet.plan
    ctl = Controller(ControllerConfig.from_spec(fleet.spec, len(plan.replicas)), plan.replicas, replica_urls(plan), 0.0)
    by_node: dict[str, list[tuple[int, str]]] = {}
    for r in plan.replicas:
        by_node.setdefault(r.node.name, []).append((r.index, r.id))
    rng = random.Random(38)
    iv = fleet.spec.serving.heartbeat_interval_s
    cpu: list[float] = []
    now = 1_800_000_000.0
    for i in range(ticks):
        now += iv / 2
        if i % 2 == 0:
            for node, replicas in by_node.items():
                probes = tuple(
                    ReplicaProbe(
                        id=rid,
                        ok=not failing(index, rng),
                        latency_s=BASE_LATENCY_S,
                        gpu_utilization=rng.random(),
                        memory_usage=0.9,
                        requests_total=float(i),
                    )
                    for index, rid in replicas
                )
                report = NodeReport(
                    schema_version=2,
                    node=node,
                    seq=round((86_400 + i * iv / 2) * 1e9),
                    boot_id=boot_id(node, 0),
                    sent_at=now,
                    replicas=probes,
                )
                ctl.receive(report, now)
        t = time.process_time()
        actions = ctl.tick(now, acting=True)
        cpu.append(time.process_time() - t)
        for action in actions:
            ctl.complete(action, ok=True)
    return cpu


def reports_cpu(rounds: int = 5, nodes: int = PROD_NODES) -> list[float]:
    """CPU of each of ``rounds`` rounds of every node's report (``Controller.receive``) with the replicas discovered
    from the reports (Kubernetes: pod names and URLs), as the service applies them in one heartbeat interval."""
    fleet = prod_fleet(nodes)
    plan = fleet.plan
    ctl = Controller(
        ControllerConfig.from_spec(fleet.spec, len(plan.replicas)),
        plan.replicas,
        replica_urls(plan),
        0.0,
        discovered=True,
    )
    by_node: dict[str, list[tuple[str, str]]] = {}
    for r in plan.replicas:
        by_node.setdefault(r.node.name, []).append((r.id, f"http://10.{r.index // 250}.{r.index % 250}.1:30000"))
    iv = fleet.spec.serving.heartbeat_interval_s
    cpu: list[float] = []
    now = 1_800_000_000.0
    for i in range(rounds):
        now += iv
        t = time.process_time()
        for node, pods in by_node.items():
            probes = tuple(ReplicaProbe(id=rid, url=url, ok=True, latency_s=BASE_LATENCY_S) for rid, url in pods)
            report = NodeReport(
                schema_version=2, node=node, seq=round((86_400 + i * iv) * 1e9), boot_id=boot_id(node, 0), sent_at=now,
                replicas=probes,
            )  # fmt: skip
            ctl.receive(report, now)
        cpu.append(time.process_time() - t)
    return cpu


def tick_cpu(ticks: int = 60, nodes: int = PROD_NODES) -> dict[str, Any]:
    """CPU of one ``Controller.tick`` (the leader's) at prod size, timed with ``time.process_time``: steady (1 % of the
    probes failing at random), and over the cap (30 % of the replicas failing every probe: from the 20th tick on more
    replicas are due out than the eviction cap allows, so every tick refuses hundreds of removals). Median and worst
    of each; the goal (issue 38) is ≤ 50 ms for every tick."""
    fleet = prod_fleet(nodes)
    steady = _ticks(fleet, ticks, lambda _i, rng: rng.random() < 0.01)
    over = _ticks(fleet, ticks, lambda i, _rng: i % 10 < 3)[ticks // 2 :]
    # a round of discovered reports (Kubernetes) within a tenth of one core's heartbeat interval: each report had
    # re-listed every node's replicas from the whole fleet (4.5 s of CPU a round at 2,048 replicas, 2026-12-06)
    rounds = reports_cpu(nodes=nodes)
    reports_goal_ms = fleet.spec.serving.heartbeat_interval_s * 1000 / 10
    return {
        "scenario": "tick",
        "replicas": len(fleet.plan.replicas),
        "ticks": ticks,
        "tick_cpu_ms": round(statistics.median(steady) * 1000, 2),
        "tick_cpu_ms_max": round(max(steady) * 1000, 2),
        "tick_cpu_ms_over_cap": round(statistics.median(over) * 1000, 2),
        "tick_cpu_ms_over_cap_max": round(max(over) * 1000, 2),
        "reports_round_cpu_ms_discovered": round(max(rounds) * 1000, 1),
        "expected": {
            "tick_cpu_ms_max": "<= 50",
            "tick_cpu_ms_over_cap_max": "<= 50",
            "reports_round_cpu_ms_discovered": f"<= {reports_goal_ms:g}",
        },
        "met": max(steady + over) * 1000 <= 50 and max(rounds) * 1000 <= reports_goal_ms,
    }
