"""Issue 38, "Routers" and "Actions counted as they happened": a real ``ControllerService`` and ``RouterSet`` against
router stand-ins on loopback that answer as smg 1.13.0's worker API does, and restarters against a closed SSH port and
an API server stand-in.

Before: an instance answering HTTP 500 re-raised in ``RouterSet._gather`` (only ``httpx.TransportError`` was silent),
so a removal two instances had applied failed, and a controller that won the election resigned (no leader); a
migration's record said ``restarted: true`` before the restarter was called, so a restart whose SSH never connected was
a step towards quarantine; a failed removal was asked again on every tick.

What smg answers (``model_gateway/src/worker/service.rs`` of the smg 1.13.0 sdist, cited per answer below): 202 to
``POST /workers`` and ``DELETE /workers/{id}``; 404 ``WORKER_NOT_FOUND`` for an id it does not hold (``delete_worker``,
service.rs:681-686; 244); 409 ``WORKER_ALREADY_EXISTS`` for a URL it holds (``create_worker``, service.rs:485-491; 247;
message 267-274); 400 ``BAD_REQUEST`` for a request it refuses (245-246); 500 ``INTERNAL_SERVER_ERROR`` when its job
queue takes no job (``QueueSubmitFailed``, 250-251, 697; "Job queue full", ``model_gateway/src/workflow/job_queue.rs``
277-281).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from serving.kubeapi import KubeApi
from serving.plan.model import Fleet
from serving.rollout.backends import BackendError, RestartUnreached
from serving.rollout.backends.ssh import SshBackend
from serving.router.client import RouterApiError
from serving.router.membership import MembershipTimeout, NoRouterAnswered, RouterSet
from serving.runtime.controller import Kind, ReplicaState
from serving.runtime.eviction import PodEvictionRestarter
from serving.runtime.leader import Term
from serving.runtime.service import BackendRestarter, ControllerService, Restarter
from serving.sandbox.processes import free_port_block
from tests.support.stacks import fleet_of, spec_from

BACKOFF_S = 0.5  # runtime.restart_backoff_s here: the first back-off (doubling, as prod's 10 s does)
QUEUE_FULL = (500, {"error": "Job queue full: 1024 jobs pending (capacity: 1024)", "code": "INTERNAL_SERVER_ERROR"})
REFUSED = (400, {"error": "Invalid worker_id 'x' (expected UUID). Error: invalid length", "code": "BAD_REQUEST"})
UNAUTHORIZED = (401, {"error": "Unauthorized"})


def sandbox_fleet() -> Fleet:
    """The sandbox stack (2 nodes × 4 replicas) with nothing listening where its workers and its nodes' sshd would: a
    drain asks a refused port, an SSH restart is refused before any command."""
    workers = free_port_block(8)
    ssh = free_port_block(1)
    return fleet_of(
        spec_from(
            "sandbox",
            sandbox__worker_base_port=workers,
            cluster__pools__0__ssh_port=ssh,
            runtime__restart_backoff_s=BACKOFF_S,
            runtime__quarantine_after=2,
            runtime__max_eviction_share=0.25,  # 2 of the 8 replicas out at once
        )
    )


@dataclass
class Smg:
    """One router instance's worker API as smg 1.13.0 answers it (module docstring), on loopback. A removal drains
    for ``drain_s`` (smg: ``drain_settle_secs``), then the id answers 404. ``error``: every ``/workers`` call answers
    this (status, body) instead; ``stuck``: a DELETE is accepted (202) but the worker stays ready (a job queue that does
    not run its jobs); ``unlisted``: URLs held but left out of ``GET /workers`` (registered between a caller's list and
    its POST)."""

    urls: list[str]
    drain_s: float = 0.05
    error: tuple[int, dict[str, Any]] | None = None
    stuck: bool = False
    unlisted: set[str] = field(default_factory=set)
    workers: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: list[tuple[str, str, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for url in self.urls:
            self._register(url)

    def _register(self, url: str) -> str:
        wid = str(uuid.uuid4())
        self.workers[wid] = {
            "id": wid,
            "url": url,
            "model_id": "m",
            "status": "ready",
            "is_healthy": True,
            "load": 0,
            "worker_type": "regular",
            "connection_mode": "http",
            "labels": {},
        }
        return wid

    def routes(self) -> set[str]:
        """The URLs this instance routes to: held and not draining."""
        return {w["url"] for w in self.workers.values() if w["status"] != "draining"}

    def app(self) -> web.Application:
        @web.middleware
        async def answer(request: web.Request, handler: Any) -> web.StreamResponse:
            if self.error is not None:
                status, body = self.error
                response: web.StreamResponse = web.json_response(body, status=status)
            else:
                response = await handler(request)
            self.calls.append((request.method, request.path, response.status))
            return response

        async def listing(_request: web.Request) -> web.Response:
            shown = [w for w in self.workers.values() if w["url"] not in self.unlisted]
            return web.json_response({"workers": shown, "total": len(shown), "stats": {}})

        async def create(request: web.Request) -> web.Response:
            url = (await request.json())["url"]
            held = next((w for w in self.workers.values() if w["url"] == url), None)
            if held is not None:  # service.rs:485-491
                message = (
                    f"Worker already exists at URL '{url}' with ID {held['id']}. Use PUT /workers/{held['id']} to "
                    f"replace or PATCH /workers/{held['id']} to update."
                )
                return web.json_response({"error": message, "code": "WORKER_ALREADY_EXISTS"}, status=409)
            wid = self._register(url)
            return web.json_response({"status": "accepted", "worker_id": wid, "url": url}, status=202)

        def not_found(wid: str) -> web.Response:
            return web.json_response({"error": f"Worker {wid} not found", "code": "WORKER_NOT_FOUND"}, status=404)

        async def get(request: web.Request) -> web.Response:
            wid = request.match_info["wid"]
            return web.json_response(self.workers[wid]) if wid in self.workers else not_found(wid)

        async def delete(request: web.Request) -> web.Response:
            wid = request.match_info["wid"]
            if wid not in self.workers:  # service.rs:681-686
                return not_found(wid)
            if not self.stuck:
                self.workers[wid].update(
                    status="draining",
                    is_healthy=False,
                    job_status={"job_type": "RemoveWorker", "status": "processing", "message": None},
                )
                asyncio.get_running_loop().call_later(self.drain_s, self.workers.pop, wid, None)
            return web.json_response({"status": "accepted", "worker_id": wid}, status=202)

        app = web.Application(middlewares=[answer])
        app.add_routes(
            [
                web.get("/workers", listing),
                web.post("/workers", create),
                web.get("/workers/{wid}", get),
                web.delete("/workers/{wid}", delete),
            ]
        )
        return app


@contextlib.asynccontextmanager
async def serving(*instances: Smg) -> AsyncIterator[list[str]]:
    """Each stand-in on its own loopback port; yields their base URLs, in order."""
    async with contextlib.AsyncExitStack() as stack:
        servers = [await stack.enter_async_context(TestServer(i.app())) for i in instances]
        yield [str(s.make_url("")).rstrip("/") for s in servers]


class Leading:
    """The coordination service as the instance that wins it sees it: every campaign won, every check confirmed. It
    records resignations; what is under test is what the routers make of the instance's leadership."""

    def __init__(self) -> None:
        self.resigned: list[int] = []
        self.tokens = 0

    async def campaign(self) -> Term | None:
        self.tokens += 1
        return Term("c0", self.tokens, time.monotonic() + 600)

    async def renew(self, term: Term) -> Term | None:
        return term

    async def verify(self, term: Term) -> bool:
        return True

    async def leader(self) -> str | None:
        return None if self.resigned else "c0"

    async def resign(self, term: Term) -> None:
        self.resigned.append(term.token)

    async def aclose(self) -> None:
        return None


class Recorded:
    """A deployment whose restarts always work; it records what it was asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def restart(self, replica_id: str, timeout_s: float) -> None:
        self.asked.append(replica_id)


def service(
    fleet: Fleet,
    routers: list[str],
    election: Leading,
    restarter: Restarter | None = None,
    clock: Callable[[], float] = time.time,
) -> ControllerService:
    return ControllerService(
        fleet,
        identity="c0",
        election=election,
        routers=RouterSet(routers, timeout_s=2.0, answering_only=True),
        restarter=restarter,
        clock=clock,
        wall_clock=clock,  # one clock, often simulated: the actions' "at" read on it
    )


# ----- routers ------------------------------------------------------------------------------------------------------
def test_one_router_answering_500_keeps_the_leader_and_the_changes_go_on_on_the_others() -> None:
    """One instance of three answers 500 to every membership call (smg's job queue taking no job): the controller
    that won the election leads (before: it resigned), a removal and a migration are made on the two that answer
    (before: both failed, the migration restarted nothing), the third is unsynced with its answer's status, and once it
    answers again the leader's reconciliation takes both replicas out of it too."""
    fleet = sandbox_fleet()
    urls = [r.url for r in fleet.plan.replicas]
    good, also, bad = Smg(urls), Smg(urls), Smg(urls, error=QUEUE_FULL)
    election, restarts = Leading(), Recorded()
    removed, migrated = fleet.plan.replicas[1], fleet.plan.replicas[6]

    async def scenario() -> tuple[ControllerService, list[str]]:
        async with serving(good, also, bad) as routers:
            svc = service(fleet, routers, election, restarts)
            await svc._lease_step()
            assert svc.term is not None and election.resigned == [], "the campaign was won: it must lead"
            assert list(svc.unsynced) == [routers[2]] and "answered 500" in svc.unsynced[routers[2]]
            assert "Job queue full" in svc.unsynced[routers[2]]  # why: the status and a bit of the body
            health = fleet.spec.health
            svc.controller.replicas[removed.id].score = health.stop_routing_below - 1  # out of routing
            svc.controller.replicas[migrated.id].score = health.migrate_below - 1  # restarted
            actions = svc.controller.tick(svc.clock(), acting=True)
            assert {(a.kind, a.replica) for a in actions} == {(Kind.REMOVE, removed.id), (Kind.MIGRATE, migrated.id)}
            await asyncio.gather(*(svc._execute(a, svc.term) for a in actions))
            assert bad.calls and {status for _m, _p, status in bad.calls} == {500}  # it was asked, and answered 500
            assert list(svc.unsynced) == [routers[2]]
            bad.error = None  # it answers again
            await svc._reconcile(routers[2], svc.term)
            return svc, routers

    svc, routers = asyncio.run(scenario())
    entries = {e["kind"]: e for e in svc.recent}
    assert entries["remove"]["ok"] and entries["migrate"]["ok"], list(svc.recent)
    assert entries["migrate"]["restarted"] is True and restarts.asked == [migrated.id]
    assert set(entries["remove"]["detail"]["silent"]) == {routers[2]}
    gone = {removed.url, migrated.url}
    assert not gone & good.routes() and not gone & also.routes()
    assert not gone & bad.routes(), "reconciled: the instance that missed both removals no longer routes to them"
    assert svc.unsynced == {} and svc.reconciled[-1]["removed"] == sorted(gone)
    assert election.resigned == []


@pytest.mark.parametrize("fault", ["500", "401", "refused"])
def test_a_campaign_won_with_one_router_failing_leads(fault: str) -> None:
    """Leadership never depends on one router: a listing one instance answers with an error (any status: a listing
    changes nothing) or not at all leaves that instance unsynced and the winner in office, adopting what the others
    list."""
    fleet = sandbox_fleet()
    urls = [r.url for r in fleet.plan.replicas]
    error = {"500": QUEUE_FULL, "401": UNAUTHORIZED, "refused": None}[fault]
    instances = [Smg(urls), Smg(urls[1:]), Smg(urls, error=error)]  # the second one lost replica 0
    election = Leading()

    async def scenario() -> ControllerService:
        async with serving(*instances) as routers:
            if fault == "refused":
                routers[2] = f"http://127.0.0.1:{free_port_block(1)}"
            svc = service(fleet, routers, election)
            await svc._lease_step()
            return svc

    svc = asyncio.run(scenario())
    assert svc.term is not None and election.resigned == []
    assert len(svc.unsynced) == 1
    first = fleet.plan.replicas[0].id
    assert not svc.controller.replicas[first].in_rotation  # not on every instance that answered
    assert all(rec.in_rotation for rid, rec in svc.controller.replicas.items() if rid != first)


def test_a_campaign_won_with_no_router_answering_resigns() -> None:
    """The one case where a winner resigns: no instance answers, so it cannot know what is in rotation."""
    fleet = sandbox_fleet()
    urls = [r.url for r in fleet.plan.replicas]
    election = Leading()

    async def scenario() -> ControllerService:
        async with serving(Smg(urls, error=QUEUE_FULL), Smg(urls, error=QUEUE_FULL)) as routers:
            svc = service(fleet, routers, election)
            with pytest.raises(NoRouterAnswered, match="answered 500"):
                await svc._lease_step()
            return svc

    svc = asyncio.run(scenario())
    assert svc.term is None and election.resigned == [1]


def test_a_4xx_that_says_the_request_is_wrong_still_fails_the_change() -> None:
    """A 400 (smg's BAD_REQUEST: an id that is no UUID, a URL it refuses; service.rs:245-246) is no "not now": asking
    again will not fix it, so it raises though the other instances applied the change. A 500 of the same instance is
    silent (module docstring of serving/router/membership.py)."""
    urls = ["http://10.0.0.1:30000", "http://10.0.0.2:30000"]
    instances = [Smg(urls), Smg(urls, error=REFUSED)]

    async def scenario() -> tuple[RouterApiError, set[str]]:
        async with serving(*instances) as routers:
            with pytest.raises(RouterApiError) as refused:
                await RouterSet(routers, answering_only=True).remove(urls[0], timeout_s=5)
            instances[1].error = QUEUE_FULL
            observed = await RouterSet(routers, answering_only=True).remove(urls[1], timeout_s=5)
            assert set(observed.seconds_by_router) == {routers[0]}
            return refused.value, set(observed.silent)

    error, silent = asyncio.run(scenario())
    assert error.status == 400 and error.code == "BAD_REQUEST" and not error.transient
    assert len(silent) == 1
    assert instances[0].routes() == set()


def test_an_addition_smg_answers_409_already_exists_for_is_done() -> None:
    """smg answers 409 WORKER_ALREADY_EXISTS to a POST of a URL it holds (service.rs:485-491): a registration that
    ended between the addition's list and its POST. The URL is where the addition wants it: done, with the worker's own
    id proven ready (before: RouterApiError, the readmission failed and was retried)."""
    url = "http://10.0.0.3:30000"
    held = Smg([url], unlisted={url})

    async def scenario() -> None:
        async with serving(held) as routers:
            observed = await RouterSet(routers, answering_only=True).add(url, timeout_s=5)
            assert set(observed.seconds_by_router) == set(routers) and not observed.silent

    asyncio.run(scenario())
    assert [s for m, _p, s in held.calls if m == "POST"] == [409] and len(held.workers) == 1


def test_an_instance_that_does_not_show_a_removal_in_time_is_left_out_only_when_another_did() -> None:
    """An instance whose job queue does not run the removal (DELETE accepted, the worker still ready) lags behind the
    others: silent and unsynced, the change made. When no instance shows it, the change failed: it raises."""
    urls = ["http://10.0.0.4:30000"]
    lagging = [Smg(urls), Smg(urls, stuck=True)]
    every = [Smg(urls, stuck=True), Smg(urls, stuck=True)]

    async def scenario() -> set[str]:
        async with serving(*lagging) as routers:
            observed = await RouterSet(routers, answering_only=True).remove(*urls, timeout_s=0.5)
        async with serving(*every) as routers:
            with pytest.raises(MembershipTimeout, match="still routes to"):
                await RouterSet(routers, answering_only=True).remove(*urls, timeout_s=0.5)
        return {why.split(":")[0] for why in observed.silent.values()}

    assert asyncio.run(scenario()) == {"MembershipTimeout"}
    assert lagging[0].routes() == set() and lagging[1].routes() == set(urls)


# ----- failed membership changes back off --------------------------------------------------------------------------
def test_a_failed_removal_is_decided_again_only_after_its_back_off() -> None:
    """Every instance answers 500: the removal fails (NoRouterAnswered). The controller used to decide it again at its
    next tick (2.5 s at prod: routers refusing every change were asked 1,440 times an hour); now its next tick inside
    runtime.restart_backoff_s of the failure decides nothing for the replica, one after decides the removal again,
    the next failure doubles the wait, and one that works ends the back-off. On the controller's clock (injected)."""
    fleet = sandbox_fleet()
    urls = [r.url for r in fleet.plan.replicas]
    instances = [Smg(urls, error=QUEUE_FULL), Smg(urls, error=QUEUE_FULL)]
    replica = fleet.plan.replicas[2]
    now = [1_800_000_000.0]

    async def scenario() -> tuple[ControllerService, list[list[Kind]]]:
        async with serving(*instances) as routers:
            svc = service(fleet, routers, Leading(), clock=lambda: now[0])
            svc.term = Term("c0", 1, time.monotonic() + 600)
            rec = svc.controller.replicas[replica.id]
            decided: list[list[Kind]] = []

            async def tick_at(t: float) -> None:
                now[0] = 1_800_000_000.0 + t
                rec.score = fleet.spec.health.stop_routing_below - 1  # its probes say: out of rotation
                actions = [a for a in svc.controller.tick(now[0], acting=True) if a.replica == replica.id]
                decided.append([a.kind for a in actions])
                for a in actions:
                    await svc._execute(a, svc.term)

            await tick_at(0.0)  # decided, fails on every router
            await tick_at(BACKOFF_S / 2)  # inside the back-off: nothing
            await tick_at(BACKOFF_S + 0.01)  # decided again, fails again: the wait doubles
            await tick_at(BACKOFF_S + 0.01 + 1.5 * BACKOFF_S)  # inside the doubled wait: nothing
            for i in instances:
                i.error = None
            await tick_at(BACKOFF_S + 0.01 + 2 * BACKOFF_S + 0.01)  # decided, works
            return svc, decided

    svc, decided = asyncio.run(scenario())
    assert decided == [[Kind.REMOVE], [], [Kind.REMOVE], [], [Kind.REMOVE]]
    first, second, third = svc.recent
    assert not first["ok"] and first["detail"].startswith("NoRouterAnswered") and not second["ok"] and third["ok"]
    rec = svc.controller.replicas[replica.id]
    assert (rec.failed_removals, rec.remove_after, rec.state) == (0, None, ReplicaState.OUT)
    assert all(replica.url not in i.routes() for i in instances)


# ----- restarts counted as they happened ----------------------------------------------------------------------------
@dataclass
class ApiServer:
    """The Kubernetes API server's pod and eviction endpoints: the pod is read (its UID), and the eviction answers
    ``eviction_status``: 500 once the request was received (an etcd timeout: the eviction may or may not be applied)."""

    eviction_status: int = 500
    evictions: int = 0

    def app(self) -> web.Application:
        async def pod(request: web.Request) -> web.Response:
            return web.json_response({"metadata": {"name": request.match_info["pod"], "uid": "uid-1"}})

        async def evict(_request: web.Request) -> web.Response:
            self.evictions += 1
            status = {"kind": "Status", "message": "etcdserver: request timed out"}
            return web.json_response(status, status=self.eviction_status)

        app = web.Application()
        app.add_routes(
            [
                web.get("/api/v1/namespaces/{ns}/pods/{pod}", pod),
                web.post("/api/v1/namespaces/{ns}/pods/{pod}/eviction", evict),
            ]
        )
        return app


async def migrations(fleet: Fleet, restarter: Restarter, routers: list[str], span_s: float) -> ControllerService:
    """One replica failing (its score in the migrate band), the controller ticking every 0.1 s of a simulated clock
    for ``span_s``; each migration it decides is carried out by the service with ``restarter``."""
    now = [1_800_000_000.0]
    svc = service(fleet, routers, Leading(), restarter, clock=lambda: now[0])
    svc.term = Term("c0", 1, time.monotonic() + 600)
    failing = fleet.plan.replicas[3].id
    svc.controller.replicas[failing].score = fleet.spec.health.migrate_below - 1
    end = now[0] + span_s
    while now[0] < end:
        for action in svc.controller.tick(now[0], acting=True):
            assert (action.kind, action.replica) == (Kind.MIGRATE, failing), action
            await svc._execute(action, svc.term)
        now[0] += 0.1
    return svc


@pytest.mark.parametrize("where", ["ssh never connected", "api server never answered", "eviction sent, then failed"])
def test_a_restart_counts_towards_quarantine_only_if_it_reached_the_deployment(where: str, tmp_path: Path) -> None:
    """A restart whose SSH connection was refused (no command ran on the node) or whose API server never answered the
    pod's read (no eviction was sent) restarted nothing: its record says ``restarted: false``, the controller backs it
    off as a failed action (runtime.restart_backoff_s, doubling) and it is no step towards quarantine, however many
    there are (before: each one counted, and the replica was quarantined after runtime.quarantine_after of them). An
    eviction the API server received and then failed (500) may have been applied: it still counts, and quarantine ends
    the asking."""
    fleet = sandbox_fleet()
    quarantine_after = fleet.spec.runtime.quarantine_after
    span_s = 6 * BACKOFF_S  # room for 3 back-offs of 0.5, 1 and 2 s: more attempts than quarantine_after

    async def routers_and_run() -> tuple[ControllerService, int]:
        urls = [r.url for r in fleet.plan.replicas]
        api = ApiServer()
        async with serving(Smg(urls), Smg(urls)) as routers, TestServer(api.app()) as server:
            restarter: Restarter
            if where == "ssh never connected":
                (tmp_path / "known_hosts").write_text("")
                ssh = SshBackend(fleet, known_hosts=tmp_path / "known_hosts", connect_timeout_s=2.0)
                restarter = BackendRestarter(fleet, ssh)
            else:
                closed = f"http://127.0.0.1:{free_port_block(1)}"
                where_api = closed if where == "api server never answered" else str(server.make_url("")).rstrip("/")
                restarter = PodEvictionRestarter(KubeApi(where_api), "fleet", poll_s=0.01)
            svc = await migrations(fleet, restarter, routers, span_s)
            if isinstance(restarter, PodEvictionRestarter):
                await restarter.aclose()
            return svc, api.evictions

    svc, evictions = asyncio.run(routers_and_run())
    entries = [e for e in svc.recent if e["kind"] == "migrate"]
    rec = svc.controller.replicas[fleet.plan.replicas[3].id]
    at = [e["at"] for e in entries]
    if where == "eviction sent, then failed":
        assert evictions == len(entries) == quarantine_after, entries
        assert all(e["restarted"] is True and not e["ok"] for e in entries)
        assert rec.quarantined and svc.controller.replica_state(rec.id) == "quarantined"
        return
    assert evictions == 0
    assert len(entries) > quarantine_after, entries
    assert all(e["restarted"] is False and not e["ok"] for e in entries), entries
    assert all(e["detail"].startswith("RestartUnreached: ") for e in entries), entries
    assert not rec.quarantined and svc.controller.counters.quarantined == 0
    assert svc.controller.counters.failed[Kind.MIGRATE] == len(entries)
    backoffs = [svc.controller.config.backoff_s(n) for n in range(1, len(entries))]
    assert all(b - a >= wait - 1e-6 for a, b, wait in zip(at[:-1], at[1:], backoffs, strict=True)), (at, backoffs)


def test_the_ssh_backend_says_unreached_only_when_no_node_ran_anything(tmp_path: Path) -> None:
    """The SSH backend's update raises RestartUnreached when every node failed before a command was sent (the TCP
    connect refused here); the message names the node and why, as every BackendError does."""
    fleet = sandbox_fleet()
    (tmp_path / "known_hosts").write_text("")
    backend = SshBackend(fleet, known_hosts=tmp_path / "known_hosts", connect_timeout_s=2.0)
    replica = fleet.plan.replicas[0]
    with pytest.raises(RestartUnreached, match=rf"{replica.node.name} \(127\.0\.0\.1\): cannot connect") as err:
        asyncio.run(backend.update([replica.id], fleet.spec.serving.version, timeout_s=5))
    assert isinstance(err.value, BackendError) and "nothing ran" in str(err.value)
