"""The runtime against real failures (issue 24), each finding driven through the controller's pure state machine on a
simulated clock with prod's settings (tests/support/fleet_sim.py models the service's restarts and warm-ups).

Prod's fleet is cut to 16 nodes (128 replicas) to keep the simulation fast; every setting the controller reads is
prod's: heartbeat 5 s, health score, eviction cap 10 % (12 replicas, more than a node's 8), warm-up 30 s, startup
budget 600 s, the restart back-off and the quarantine.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from serving.plan.model import Fleet
from serving.router.membership import RouterSet
from serving.runtime.controller import Action, Kind, ReplicaState
from serving.runtime.leader import ElectionError, Term
from serving.runtime.service import ControllerService
from serving.sandbox.processes import free_port_block
from tests.support.fault_proxy import QUEUE_SUBMIT_FAILED
from tests.support.fleet_sim import FleetSim
from tests.support.stacks import fleet_of, spec_from

PROD: Fleet = fleet_of(spec_from("prod", cluster__pools__0__count=16, cluster__pools__0__racks=2))
NODE = PROD.plan.replicas[0].node.name
ON_NODE = {r.id for r in PROD.plan.replicas if r.node.name == NODE}
FAULT_AT = 10.0
HOUR = 3600.0


def node_fault(seconds: float) -> FleetSim:
    """Every replica of one node stops answering for ``seconds`` (its agent alive and reporting); loads take 120 s."""
    return FleetSim(PROD, lambda rid, t: rid not in ON_NODE or not FAULT_AT <= t < FAULT_AT + seconds, load_s=120)


def test_prod_settings_are_the_ones_the_findings_were_measured_with() -> None:
    cfg = node_fault(0).ctl.config
    assert (PROD.spec.serving.heartbeat_interval_s, cfg.max_evicted, len(ON_NODE)) == (5.0, 12, 8)
    assert (cfg.restart_backoff_s, cfg.restart_backoff_max_s, cfg.quarantine_after) == (10.0, 300.0, 3)


@pytest.mark.parametrize(("fault_s", "restarts"), [(60, 0), (90, 1), (300, 1)])
def test_restart_storm_after_a_node_wide_fault(fault_s: float, restarts: int) -> None:
    """Finding 1: a 90 s node-wide fault with agents alive drove the node score under the migrate line; each
    restarted replica got the node's score again at once and was restarted on every tick (2.5 s), so it never
    finished loading and the node never recovered (692 restarts per replica in 30 minutes). Now the node's score is
    a node decision carried out once per replica, restarting replicas are no evidence against their node, and the
    node recovers with one restart per replica (none for a 60 s fault, which stays above the migrate line)."""
    sim = node_fault(fault_s)
    sim.run(1800)
    assert sim.serving() == set(sim.ctl.replicas), sorted(set(sim.ctl.replicas) - sim.serving())
    assert {rid: sim.restarts[rid] for rid in ON_NODE} == dict.fromkeys(ON_NODE, restarts)
    assert not set(sim.restarts) - ON_NODE  # no replica outside the fault restarted
    assert sim.ctl.nodes[NODE].score >= PROD.spec.health.stop_routing_below


def test_a_node_fault_that_outlasts_the_restarts_quarantines_its_replicas_and_they_return_unrestarted() -> None:
    """Restarts that do not help back off (10 s, 20 s, … at most 300 s) and stop after runtime.quarantine_after (3):
    the replicas are quarantined (state and count visible), and when the fault ends they return through a warm-up
    on their own probes, with no further restart."""
    sim = node_fault(HOUR)
    sim.run(HOUR)
    quarantine = PROD.spec.runtime.quarantine_after
    assert {rid: sim.restarts[rid] for rid in ON_NODE} == dict.fromkeys(ON_NODE, quarantine)
    assert {sim.ctl.replica_state(rid) for rid in ON_NODE} == {"quarantined"}
    assert sim.ctl.counters.quarantined == len(ON_NODE)
    sim.run(HOUR + 1800)
    assert sim.serving() == set(sim.ctl.replicas)
    assert {rid: sim.restarts[rid] for rid in ON_NODE} == dict.fromkeys(ON_NODE, quarantine)
    assert not {sim.ctl.replica_state(rid) for rid in ON_NODE} - {"serving"}
    # back in rotation, still not to be restarted until it has served a whole quarantine window
    assert all(sim.ctl.replicas[rid].quarantined for rid in ON_NODE)
    sim.run(HOUR + 1800 + PROD.spec.runtime.quarantine_window_s + 10)
    assert not any(rec.quarantined for rec in sim.ctl.replicas.values())


def test_a_flapping_replica_is_quarantined_with_backoff() -> None:
    """Finding 3: SIGSTOP 6 s / SIGCONT 6 s at prod settings (the routers never see 3 failures in a row) was
    removed, then restarted about every 150 s, 22 times an hour, and never readmitted. Now it is quarantined, named in
    status and in the quarantine count: its restarted process answers /health and fails its warm-up's requests (a
    stall in every 12 s), which a restart did not fix (issue 38: quarantined at once, not after
    runtime.quarantine_after restarts). Restarts that do not help back off (10 s, 20 s, 40 s)."""
    flapping = PROD.plan.replicas[3].id
    sim = FleetSim(PROD, lambda rid, t: rid != flapping or t < FAULT_AT or (t - FAULT_AT) % 12 >= 6, load_s=120)
    sim.run(HOUR)
    assert sim.restarts == {flapping: 1}
    rec = sim.ctl.replicas[flapping]
    assert rec.quarantined and rec.state is ReplicaState.OUT and sim.ctl.replica_state(flapping) == "quarantined"
    assert sim.serving() == set(sim.ctl.replicas) - {flapping}
    gaps = sorted(sim.ctl.config.backoff_s(n) for n in range(1, PROD.spec.runtime.quarantine_after + 1))
    assert gaps == [10.0, 20.0, 40.0]


@pytest.mark.parametrize("why", ["refused", "unroutable"])
def test_a_migration_that_restarted_nothing_backs_off_and_never_quarantines(why: str) -> None:
    """Finding 4: on Kubernetes a migration evicts the pod, and the Eviction API refuses (429) while the group's
    PodDisruptionBudget allows no disruption (a node drain, a rollout batch). And a migration removes the replica from
    every router instance before it restarts anything: when no instance answers (a loaded or partitioned control
    plane), it fails having restarted nothing. Neither is a failed restart: the controller asks again after its
    back-off, the replica is not quarantined after more than runtime.quarantine_after of them, and it is restarted
    once and readmitted when the budget allows or the routers answer."""
    hung = PROD.plan.replicas[5].id
    blocked_until = FAULT_AT + 900.0  # 15 min of refusals or silent routers: many more than quarantine_after
    blocked = {"refuse" if why == "refused" else "unroutable": lambda rid, t: t < blocked_until}
    sim = FleetSim(
        PROD,
        lambda rid, t: rid != hung or t < FAULT_AT or rid in sim.restarts,  # hung until restarted
        load_s=120,
        **blocked,  # type: ignore[arg-type]
    )
    sim.run(blocked_until - 1)
    asks = sim.refused[hung] if why == "refused" else sim.ctl.counters.failed[Kind.MIGRATE]
    assert asks > PROD.spec.runtime.quarantine_after and sim.restarts[hung] == 0, asks
    assert not sim.ctl.replicas[hung].quarantined and sim.ctl.counters.quarantined == 0
    if why == "refused":
        assert sim.ctl.counters.refused == asks
        assert sim.ctl.counters.failed[Kind.MIGRATE] == 0, "a refusal is no failed action (ActionsFailing stays quiet)"
    # backed off as restarts are (10 s doubling to 300 s): no more asks than fit in the 900 s
    waits = [sum(sim.ctl.config.backoff_s(k) for k in range(1, n)) for n in range(1, 100)]
    assert asks <= sum(w <= blocked_until - FAULT_AT for w in waits) == 7
    sim.run(blocked_until + 900)
    assert sim.restarts[hung] == 1 and hung in sim.serving() and sim.ctl.counters.quarantined == 0


class _Election:
    """The election as the leader's fencing check sees it: the coordination service confirms this instance still
    leads, or does not answer."""

    def __init__(self, *, answers: bool) -> None:
        self.answers = answers

    async def verify(self, term: Term) -> bool:
        if not self.answers:
            raise ElectionError("etcd: connection refused")
        return True


class _NeverRestarts:
    def __init__(self) -> None:
        self.asked: list[str] = []

    async def restart(self, replica_id: str, timeout_s: float) -> None:
        self.asked.append(replica_id)


def carried_out(
    kind: Kind, *, election: _Election, routers: RouterSet, restarter: _NeverRestarts | None
) -> tuple[ControllerService, dict[str, Any]]:
    """One action on replica 2 by a leading controller service, carried out: the service and the action's record."""
    svc = ControllerService(
        PROD,
        identity="c0",
        election=election,  # type: ignore[arg-type]  # only verify() is reached
        routers=routers,
        restarter=restarter,
    )
    term = Term("c0", 7, time.monotonic() + 60)
    svc.term = term
    replica = PROD.plan.replicas[2]
    asyncio.run(svc._execute(Action(kind, replica.id, svc.controller.replicas[replica.id].url, "a test"), term))
    [entry] = svc.recent
    return svc, entry


@pytest.mark.parametrize("backend", [True, False])
def test_the_service_counts_a_migration_its_fencing_check_stopped_as_a_restart_only_without_a_backend(
    backend: bool,
) -> None:
    """The service's side of the rule above: a migration the leader's fencing check stopped (the coordination service
    did not answer) asked for no restart; its record says ``"restarted": false`` and the replica is one step no
    nearer quarantine. Without a deployment backend no migration can restart anything, so each counts (quarantine
    then ends the asking and its alert names the replica)."""
    restarter = _NeverRestarts() if backend else None
    svc, entry = carried_out(
        Kind.MIGRATE,
        election=_Election(answers=False),
        routers=RouterSet(["http://127.0.0.1:9"]),  # never reached: the fence fails first
        restarter=restarter,
    )
    assert entry["ok"] is False and entry["restarted"] is False, entry
    assert entry["detail"] == "ElectionError: etcd: connection refused", entry
    assert svc.controller.counters.failed[Kind.MIGRATE] == 1
    assert len(svc.controller.replicas[entry["replica"]].restart_times) == (0 if backend else 1)
    assert restarter is None or restarter.asked == []


class _DeposedWhileAsked:
    """The fencing check's answer comes after the lease loop ended the term (it sets ``term`` to None, as ``_depose``
    does while the check waits): a yes from the service about a term this instance no longer holds."""

    def __init__(self) -> None:
        self.service: ControllerService | None = None

    async def verify(self, term: Term) -> bool:
        assert self.service is not None
        self.service.term = None
        return True


def test_a_fencing_answer_that_comes_after_the_term_ended_stops_the_action() -> None:
    """The check reads the term again once the service answers: it read ``self.term`` after the await, found None and
    raised AttributeError, which no handler of the action expects."""
    election = _DeposedWhileAsked()
    svc = ControllerService(
        PROD,
        identity="c0",
        election=election,  # type: ignore[arg-type]  # only verify() is reached
        routers=RouterSet(["http://127.0.0.1:9"]),  # never reached: the fence stops the action first
        restarter=None,
    )
    election.service = svc
    term = Term("c0", 7, time.monotonic() + 60)
    svc.term = term
    replica = PROD.plan.replicas[2]
    asyncio.run(svc._execute(Action(Kind.REMOVE, replica.id, svc.controller.replicas[replica.id].url, "a test"), term))
    [entry] = svc.recent
    assert entry["ok"] is False and entry["detail"] == "Deposed: term ended", entry
    assert svc.controller.replicas[replica.id].state is ReplicaState.SERVING


def test_a_change_no_router_instance_answered_leaves_every_instance_unsynced_until_it_answers() -> None:
    """Finding 2's other half: with every router instance silent, a membership change failed and the instances that
    missed it were forgotten (only a partial failure marked its silent ones), so ExaServeRouterUnsynced stayed quiet
    and nothing brought them in line when they answered again. Now each is kept unsynced, with why, for the leader's
    reconciliation."""
    base = free_port_block(2)  # nothing listens there: every instance refuses
    routers = [f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 1}"]
    svc, entry = carried_out(
        Kind.REMOVE,
        election=_Election(answers=True),
        routers=RouterSet(routers, timeout_s=2.0, answering_only=True),
        restarter=None,
    )
    assert entry["ok"] is False and entry["detail"].startswith("NoRouterAnswered: no router instance answered: ")
    assert sorted(svc.unsynced) == routers and all("ConnectError" in why for why in svc.unsynced.values())
    assert svc.controller.replicas[entry["replica"]].state is ReplicaState.SERVING  # retried, not assumed removed


@pytest.mark.parametrize("changes_fail", [True, False], ids=["its-changes-fail", "its-listing-fails"])
def test_an_unsynced_router_failing_its_changes_is_backed_off_and_one_not_answering_is_listed_each_interval(
    changes_fail: bool,
) -> None:
    """Issue 38: the leader asked an unsynced router instance again every heartbeat interval however long it kept
    failing (a router failing its changes for an hour: 720 tries at prod). Now an instance that lists its workers and
    then fails the change that would make it match (smg's job queue answering 500) is asked again one interval later,
    doubling up to runtime.restart_backoff_max_s (300 s), shown in ``status``; one whose listing fails is listed
    again every interval (cheap, and it is made whole within one once it answers)."""
    replica = PROD.plan.replicas[2]
    calls: list[tuple[str, float]] = []
    now = [1000.0]

    async def listing(_request: web.Request) -> web.Response:
        calls.append(("GET", now[0]))
        if not changes_fail:
            return web.Response(body=QUEUE_SUBMIT_FAILED, status=500, content_type="application/json")
        url = svc.controller.replicas[replica.id].url  # out of rotation here, still listed: to be removed
        worker = {"id": "0f5d5c1e-9a51-4a43-9a7e-2d6d2c1f0a11", "url": url, "status": "ready", "is_healthy": True}
        return web.json_response({"workers": [worker]})

    async def change(_request: web.Request) -> web.Response:
        calls.append(("DELETE", now[0]))
        return web.Response(body=QUEUE_SUBMIT_FAILED, status=500, content_type="application/json")

    app = web.Application()
    app.router.add_get("/workers", listing)
    app.router.add_delete("/workers/{id}", change)

    async def rounds() -> None:
        server = TestServer(app)
        await server.start_server()
        router = str(server.make_url("")).rstrip("/")
        svc.term, svc.unsynced = term, {router: "RouterApiError: a test"}
        try:
            for second in range(0, 700):  # the loop's rounds, as if one ran each second (prod's interval is 5 s)
                now[0] = 1000.0 + second
                if second % 5 == 0:
                    await svc._reconcile_due(term)
        finally:
            await server.close()

    svc = ControllerService(
        PROD,
        identity="c0",
        election=_Election(answers=True),  # type: ignore[arg-type]  # only verify() is reached
        routers=RouterSet(["http://127.0.0.1:9"], timeout_s=2.0, answering_only=True),  # the set it acts through
        restarter=None,
        clock=lambda: now[0],
    )
    svc.controller.replicas[replica.id].state = ReplicaState.OUT
    term = Term("c0", 7, time.monotonic() + 60)
    asyncio.run(rounds())
    listings = [at for method, at in calls if method == "GET"]
    if changes_fail:
        changes = [at for method, at in calls if method == "DELETE"]
        waits = [b - a for a, b in itertools.pairwise(changes)]
        assert waits == [5, 10, 20, 40, 80, 160, 300], waits  # the interval, doubled, capped at restart_backoff_max_s
        assert set(listings) == set(changes)  # listed only for a try, none between
        [resync] = svc.status()["router_resync"].values()
        assert resync == {"failed_tries": 8, "next_try_in_s": changes[-1] + 300 - now[0]}, resync
    else:
        assert len(listings) == 140 and svc.status()["router_resync"] == {}  # every interval, no back-off
    assert len(svc.unsynced) == 1  # still missing what it missed


def test_restarts_in_a_row_end_after_twice_the_longest_backoff_in_service() -> None:
    """A replica that served 2 × runtime.restart_backoff_max_s since its last restart starts its back-off again: two
    unrelated crashes a day apart are not a crash loop."""
    down = {PROD.plan.replicas[5].id}
    windows = [(FAULT_AT, FAULT_AT + 120), (2000.0, 2120.0), (4000.0, 4120.0), (6000.0, 6120.0)]
    sim = FleetSim(PROD, lambda rid, t: rid not in down or not any(a <= t < b for a, b in windows), load_s=30)
    sim.run(8000)
    [rid] = down
    assert sim.restarts[rid] == len(windows) > PROD.spec.runtime.quarantine_after
    assert rid in sim.serving() and not sim.ctl.replicas[rid].quarantined


def test_clocks_an_agent_restarted_with_its_wall_clock_behind_is_not_refused() -> None:
    """Finding 6 (clocks): reports were ordered by (agent_start, seq) with agent_start on the agent's wall clock, so an
    agent restarted with its clock 5 s behind (inside the accepted skew and age) had every report refused as
    replayed. Now they are ordered by the node's boot id and its monotonic clock, which a wall-clock step does not
    move; only a report from an earlier boot, or not after the last one of this boot, is a replay."""
    sim = node_fault(0)
    sim.run(20)
    node = sim.ctl.nodes[NODE]
    boot, seq = node.last_key or ("", 0)
    accepted = sim.ctl.counters.accepted
    behind = sim._report(NODE).model_copy(update={"seq": seq + 10**9, "sent_at": sim.t0 + sim.now - 5})
    sim.ctl.receive(behind, sim.t0 + sim.now)  # the restarted agent: same boot, its wall clock 5 s behind
    assert sim.ctl.counters.accepted == accepted + 1 and node.last_key == (boot, seq + 10**9)


def test_a_crash_loop_is_quarantined_whatever_warm_ups_passed_between_its_restarts() -> None:
    """Issue 38: quarantine counted only restarts that failed (no passed warm-up since), so a replica that crashed
    every 200 s, each restart readmitting it, was restarted for ever. Now runtime.quarantine_after (3) restarts within
    runtime.quarantine_window_s (1 h) quarantine it (systemd's start limit): its later crashes take it out of
    rotation, it comes back through a warm-up when it answers again, and it is not restarted. (The drills choose the
    replica with the fewest restarts in the window, so one replica is not crashed by drill after drill.)"""
    down = {PROD.plan.replicas[6].id}
    windows = [(FAULT_AT + 200 * i, FAULT_AT + 200 * i + 120) for i in range(5)]
    sim = FleetSim(PROD, lambda rid, t: rid not in down or not any(a <= t < b for a, b in windows), load_s=30)
    sim.run(1500)
    [rid] = down
    assert sim.restarts[rid] == PROD.spec.runtime.quarantine_after < len(windows)
    assert rid in sim.serving() and sim.ctl.replicas[rid].quarantined and sim.ctl.counters.quarantined == 1


def test_generation_errors_a_replica_failing_its_requests_with_health_fine_is_restarted() -> None:
    """Issue 24: a replica failing every generation while its /health answers (SGLang's health_generate only needs
    the scheduler to produce output) was invisible to the controller, whose agents read only /health: it was never
    restarted. The routers' circuit breakers count its failures; the leader reads them before each tick. Issue 38:
    request errors alone restart nothing (an overload opens breakers on healthy replicas): held open
    runtime.breaker_dwell_s (30 s) they take it out of rotation; its readmission's warm-up then fails on requests
    while /health answers, the controller's own evidence, and that restarts it (the restart clears the fault here)."""
    rid = PROD.plan.replicas[0].id
    dwell = 2 * PROD.spec.serving.failure_threshold * PROD.spec.serving.heartbeat_interval_s

    def failing(r: str, t: float) -> bool:  # from the fault until its first restart
        return r == rid and t >= FAULT_AT and sim.restarts[rid] == 0

    sim = FleetSim(PROD, lambda _r, _t: True, load_s=120, breaker=failing)
    sim.run(FAULT_AT + dwell - PROD.spec.serving.heartbeat_interval_s)
    assert rid in sim.serving() and not sim.restarts  # inside the dwell: nothing
    sim.run(FAULT_AT + dwell + PROD.spec.serving.heartbeat_interval_s / 2)  # the first tick past the dwell
    assert rid not in sim.serving() and not sim.restarts  # out of rotation, not restarted
    sim.run(FAULT_AT + dwell + 60)
    assert sim.restarts == {rid: 1}  # after its warm-up failed on requests
    sim.run(HOUR)
    assert sim.serving() == set(sim.ctl.replicas) and sim.restarts == {rid: 1}
    assert sim.ctl.counters.breakers == 1


def test_generation_errors_that_a_restart_does_not_clear_end_in_quarantine_not_a_storm() -> None:
    """The generations keep failing after the restart: the warm-up after it fails on requests while /health answers,
    so a restart did not fix it and it is quarantined at once (issue 38: at most 2 restarts; before, the old FleetSim
    failed the warm-up while the replica still loaded, which the service never does, and the service retried failed
    warm-ups 24 times an hour for ever)."""
    rid = PROD.plan.replicas[0].id
    sim = FleetSim(PROD, lambda _r, _t: True, load_s=120, breaker=lambda r, t: r == rid and t >= FAULT_AT)
    sim.run(HOUR)
    assert sim.restarts == {rid: 1}
    assert sim.ctl.replica_state(rid) == "quarantined"


def test_breakers_are_counted_against_the_cap_not_scaled_by_the_replicas_already_out() -> None:
    """As many breakers held open as the eviction cap, with 2 replicas already out of rotation: after the dwell the
    cap's remaining room is taken out (10 of them). Counting them as a share of the serving replicas scaled to the
    whole fleet (12 / 126 × 128 = 12.2 > 12) read an overload and took none out."""
    sim = node_fault(0)
    ctl, cap = sim.ctl, sim.ctl.config.max_evicted
    ids = [r.id for r in PROD.plan.replicas]
    for rid in ids[:2]:
        ctl.replicas[rid].state = ReplicaState.OUT
    held = ids[8 : 8 + cap]
    urls = {ctl.replicas[rid].url for rid in held}
    t = sim.t0 + 1.0
    assert ctl.breakers_open(urls, t) == held
    t += ctl.config.breaker_dwell_s
    for node in ctl.nodes.values():
        node.last_report_at = t  # every agent reporting: nothing is suspect
    assert ctl.breakers_open(urls, t) == []
    removed = [a.replica for a in ctl.tick(t, acting=True) if a.kind is Kind.REMOVE]
    assert removed == held[: cap - 2], removed
