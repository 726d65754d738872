"""The controller under correlated faults (issue 38): every row of the issue's table at prod size on the simulated
clock, each asserting the issue's "Done when" as numbers.

The scenarios are tests/support/fleet_scenarios.py (``bench/runtime_bench.py --scenarios --json`` prints the same
figures); each drives the controller's state machine as ``service.py`` does (tests/support/fleet_sim.py) on prod's
stack, 2,048 replicas, unless the scenario says it runs on a cut (the hand-over sweep, the 4 h flapping run). A
failure names the measured figure against the expected one, then every figure measured. The "alert fires" and
``status`` parts of the rows are not asserted here. The row of 10 % slow replicas (the latency-outlier signal: a
report's time per output token against the fleet's median) and the row of repeated stalls (a report's stalled tokens
against the fleet's) are tests/test_runtime_correlated_state.py's.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiohttp import web

from serving.rollout.backends import RestartUnreached
from serving.router.membership import Observed, RouterSet
from serving.runtime.controller import Action, Kind
from serving.runtime.leader import Term
from serving.runtime.service import ControllerService
from tests.support import fleet_scenarios as fs
from tests.support.fault_proxy import QUEUE_SUBMIT_FAILED
from tests.support.fleet_sim import FleetSim

CUT = fs.prod_fleet(16)  # prod's settings on 16 nodes: what the cheap checks of the harness itself run on


@pytest.mark.parametrize("breakers_after_s", [5.0, 20.0], ids=["breakers-before-suspect", "breakers-after-suspect"])
def test_leaf_switch_restarts_nothing_and_the_rack_is_back_within_30_s_of_the_heal(breakers_after_s: float) -> None:
    fs.check(fs.leaf_switch(breakers_after_s))


def test_a_rack_failing_its_probes_is_a_correlated_fault_restarted_nor_quarantined() -> None:
    fs.check(fs.rack_probes_fail())


def test_overload_breakers_alone_restart_nothing() -> None:
    fs.check(fs.overload())


def test_reboot_wave_restarts_nothing_and_is_whole_within_60_s_of_the_slowest_load() -> None:
    fs.check(fs.reboot_wave())


def test_one_router_answering_500_keeps_a_leader_restarts_the_dead_and_backs_off() -> None:
    fs.check(fs.router_500())


def test_breakers_the_agents_contradict_disrupt_no_rack_and_a_dead_node_there_is_restarted() -> None:
    fs.check(fs.stale_breakers())


def test_one_failed_round_of_a_racks_probes_takes_nothing_out() -> None:
    fs.check(fs.rack_blip())


def test_failures_before_a_racks_disruption_count_once() -> None:
    fs.check(fs.rack_degrades())


def test_the_sims_warm_up_waits_for_health_then_judges_the_load_as_the_service_does() -> None:
    """``ControllerService._warm_up`` waits for /health up to the startup budget, then runs its load and judges it at
    the end. FleetSim failed a warm-up at once when the replica's requests failed, while it was still loading (the
    suite showed a quarantine the service never reaches): now a replica failing its generations fails its warm-up
    only once it answers /health and its load has run."""
    rid = CUT.plan.replicas[0].id
    load = 120.0

    def restarted(r: str) -> bool:
        return sim.restarts[r] > 0

    sim = FleetSim(
        CUT,
        lambda r, t: r != rid or t < fs.FAULT_AT or restarted(r),  # dead until restarted
        load_s=load,
        breaker=lambda r, t: r == rid and restarted(r),  # then its generations fail
    )
    step = CUT.spec.serving.heartbeat_interval_s / 2
    while not sim.restarts[rid] and sim.now < fs.FAULT_AT + 300.0:
        sim.run(sim.now + step)
    at = fs._first(sim, rid, (Kind.MIGRATE,))
    assert at is not None and sim.restarts[rid] == 1, (at, sim.restarts)
    sim.run(at + load - 1.0)
    assert sim.warmups_failed[rid] == 0, "a warm-up failed while the replica was still loading"
    sim.run(at + load + CUT.spec.serving.warmup_duration_s + 2 * CUT.spec.serving.heartbeat_interval_s)
    assert sim.warmups_failed[rid] == 1, "the warm-up of a replica answering /health and failing its requests passed"


class _Fenced:
    async def verify(self, term: Term) -> bool:
        return True


class _Routers:
    """The routers as a migration's removal sees them: every instance applies it."""

    timeout_s = 2.0

    async def remove(self, *urls: str, timeout_s: float) -> Observed:
        return Observed("remove", urls, {"http://router-0": 0.01})


class _Unreachable:
    """What the SSH backend raises when no node's sshd could be reached before any command ran (the real backend
    against a closed port: tests/test_runtime_routers_and_restarts.py)."""

    async def restart(self, replica_id: str, timeout_s: float) -> None:
        raise RestartUnreached(f"ssh {replica_id}: connect to host: No route to host")


def test_the_sims_service_model_is_service_py_for_an_unreached_restart() -> None:
    """fleet_scenarios.SERVICE says how service.py completes a migration whose restart never reached the node (SSH
    failed); the scenarios' figures stand on it. Run service.py's own _execute and compare."""
    svc = ControllerService(
        CUT,
        identity="c0",
        election=_Fenced(),  # type: ignore[arg-type]  # only verify() is reached
        routers=_Routers(),  # type: ignore[arg-type]  # only remove() is reached
        restarter=_Unreachable(),
    )
    seen: dict[str, Any] = {}
    complete = svc.controller.complete

    def recorded(action: Action, ok: bool, **kw: Any) -> None:
        seen.update(ok=ok, **kw)
        complete(action, ok, **kw)

    async def no_drain(url: str) -> None:
        return None

    svc.controller.complete = recorded  # type: ignore[method-assign]
    svc._drain = no_drain  # type: ignore[method-assign]
    term = Term("c0", 7, time.monotonic() + 60)
    svc.term = term
    replica = CUT.plan.replicas[2]
    action = Action(Kind.MIGRATE, replica.id, svc.controller.replicas[replica.id].url, "a test")
    asyncio.run(svc._execute(action, term))
    assert seen["ok"] is False
    assert seen.get("restart_made", True) is fs.SERVICE.unreached_restart_counts, (
        f"service.py completes a restart that never reached the node with restart_made={seen.get('restart_made')}; "
        f"fleet_scenarios.SERVICE says {fs.SERVICE.unreached_restart_counts}: set it to the service's behaviour"
    )


async def _one_router_answering_500() -> tuple[bool, bool]:
    """Two router instances, one answering 500 to every call (smg's QueueSubmitFailed): whether a removal through the
    controller's RouterSet fails, and whether a new leader's listing does."""

    async def workers(_request: web.Request) -> web.Response:
        return web.json_response({"workers": []})

    async def error(_request: web.Request) -> web.Response:
        return web.Response(body=QUEUE_SUBMIT_FAILED, status=500, content_type="application/json")

    good, bad = web.Application(), web.Application()
    good.router.add_get("/workers", workers)
    bad.router.add_route("*", "/{tail:.*}", error)
    runners = [web.AppRunner(app, access_log=None) for app in (good, bad)]
    urls = []
    for runner in runners:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        urls.append(f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}")  # type: ignore[union-attr]
    routers = RouterSet(urls, timeout_s=2.0, answering_only=True)
    try:
        change_fails = adopt_fails = False
        try:
            await routers.remove("http://10.40.0.11:30000", timeout_s=2.0)
        except Exception:
            change_fails = True
        try:
            await routers.membership()
        except Exception:
            adopt_fails = True
        return change_fails, adopt_fails
    finally:
        for runner in runners:
            await runner.cleanup()


def test_the_sims_service_model_is_membership_py_for_a_router_answering_500() -> None:
    """fleet_scenarios.SERVICE says what a router answering HTTP 500 does to a membership change (it fails, or the
    others' answers count) and to a new leader's listing (it resigns, or takes office on the others): the router-500
    row stands on it. Ask membership.py's RouterSet, as the controller configures it, and compare."""
    change_fails, adopt_fails = asyncio.run(_one_router_answering_500())
    model = fs.SERVICE
    assert (change_fails, adopt_fails) == (model.router_error_fails_change, model.adopt_needs_every_router), (
        f"membership.py: a change {'fails' if change_fails else 'goes on'} and a listing "
        f"{'fails' if adopt_fails else 'goes on'} with one router answering 500; fleet_scenarios.SERVICE says "
        f"router_error_fails_change={model.router_error_fails_change}, "
        f"adopt_needs_every_router={model.adopt_needs_every_router}: set it to membership.py's behaviour"
    )
