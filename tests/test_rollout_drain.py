"""The updater's drain, against the real gateway (``smg`` 1.13.0) and simulated SGLang workers (the stand-in
for GPU workers: real processes speaking SGLang's HTTP API and metrics, ``serving/sandbox/worker.py``).

Router retries and the workers' own graceful shutdown hide a drain that does not wait: clients see no error either
way. So these tests look where the difference is: what a removed worker was still running when the backend
restarted it (must be nothing), what the drain step recorded when requests cannot finish (a timeout, named), and
what it recorded when a worker's count cannot be read at all (unknown, never 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest

from serving.plan.model import Fleet
from serving.rollout.journal import Journal
from serving.rollout.machine import Event, Phase, RolloutState, initial
from serving.rollout.membership import Membership, RouterApiMembership
from serving.rollout.plan import plan_rollout
from serving.rollout.runner import Runner
from serving.router.membership import Observed, RouterSet
from serving.sandbox.backend import LocalBackend, worker_name
from tests.support.sandbox import Sandbox, in_flight, running_sandbox, until_each
from tests.support.stacks import fleet_of

LONG_REQUEST_MS = 1500  # each request runs 1.5 s on a worker: removal always finds some in flight
DRAIN_TIMEOUT_S = 10


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    changes = {
        "rollout.batches": 2,
        "rollout.drain_timeout_s": DRAIN_TIMEOUT_S,
        "sandbox.versions.v1.latency_ms": LONG_REQUEST_MS,
        "sandbox.versions.v2.latency_ms": LONG_REQUEST_MS,
    }
    with running_sandbox(tmp_path_factory.mktemp("drain"), replicas=2, changes=changes) as box:
        yield box


class RestartRecorder(LocalBackend):
    """The real local backend (restarts the worker processes), recording what each worker was still running at
    the moment it was restarted, what the workers ran before the run and the clients' response statuses."""

    def __init__(self, fleet: Fleet, processes_dir: Path) -> None:
        super().__init__(fleet, processes_dir)
        self.at_restart: dict[str, float] = {}
        self.before: dict[str, float] = {}
        self.statuses: list[int] = []

    async def update(self, replica_ids: Sequence[str], version: str, timeout_s: float) -> None:
        async with httpx.AsyncClient() as client:
            for r in replica_ids:
                with contextlib.suppress(httpx.HTTPError):  # a worker the test killed has nothing to record
                    self.at_restart[r] = await in_flight(client, self.worker_url(r))
        await super().update(replica_ids, version, timeout_s)


class KillAfterRemoval(RouterApiMembership):
    """The real router-API membership; once the first batch's removal is proved, its first replica's worker process
    is killed (SIGKILL): from then on its ``/metrics`` refuses connections while the drain asks it."""

    def __init__(self, sb: Sandbox, backend: RestartRecorder) -> None:
        super().__init__(RouterSet([sb.router_url], metrics=[sb.metrics_url]), backend.worker_url)
        self.processes = sb.processes
        self.killed: str | None = None

    async def take_out(self, replica_ids: Sequence[str], timeout_s: float) -> Observed:
        seen = await super().take_out(replica_ids, timeout_s)
        if self.killed is None:
            self.killed = replica_ids[0]
            port = int(self.worker_url(self.killed).rsplit(":", 1)[1])
            record = self.processes.read(worker_name(port))
            assert record is not None, port
            os.killpg(record.pid, signal.SIGKILL)
        return seen


class FreshRequestAtRemoval(RouterApiMembership):
    """The real router-API membership; once each removal is proved, the requests the router had sent the batch's
    workers are waited out (1.5 s at most: the router sends them no more), then one request is sent straight to each
    worker, and the drain starts only once the worker counts it: the drain then always meets one request with about
    1.5 s left. CI found both ways to lose that: the removed worker's routed requests all within 0.36 s of their end
    (a 0.5 s drain finished); a request sent before the removal, which on a loaded machine ended before the restart."""

    def __init__(self, sb: Sandbox, backend: RestartRecorder) -> None:
        super().__init__(RouterSet([sb.router_url], metrics=[sb.metrics_url]), backend.worker_url)
        self.sent: list[asyncio.Task[None]] = []

    async def take_out(self, replica_ids: Sequence[str], timeout_s: float) -> Observed:
        seen = await super().take_out(replica_ids, timeout_s)
        urls = [self.worker_url(r) for r in replica_ids]
        await until_each(urls, busy=False)
        self.sent += [asyncio.create_task(one_request(u)) for u in urls]
        await until_each(urls, busy=True)
        return seen


async def one_request(worker_url: str) -> None:
    """One generation straight to a worker; the worker may be restarted under it (what the drain test is about)."""
    async with httpx.AsyncClient(timeout=30) as client:
        with contextlib.suppress(httpx.HTTPError):
            await client.post(worker_url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 4}})


async def traffic(router_url: str, stop: asyncio.Event, statuses: list[int], streams: int = 6) -> None:
    """``streams`` clients sending long requests back to back through the router until ``stop``."""

    async def one(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            r = await client.post(
                router_url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 4}}
            )
            statuses.append(r.status_code)

    async with httpx.AsyncClient(timeout=30) as client:
        await asyncio.gather(*(one(client) for _ in range(streams)))


async def revert(
    sb: Sandbox, backend: RestartRecorder, journal: Path, membership: Membership | None = None
) -> tuple[RolloutState, list[Event]]:
    """Run an ungated plan (a revert: remove, drain, update, health, readmit per batch) to the other of v1/v2 under
    long-request traffic through the router (``membership``: the backend's own by default); the final state and the
    committed events of the drain steps, each preceded by its batch's removal."""
    current = set(sb.versions().values())
    target = "v2" if current == {"v1"} else "v1"
    rollout = plan_rollout(fleet_of(sb.spec, sb.spec.cluster.name), from_version=current.pop(), to_version=target,
                           kind="revert")  # fmt: skip
    events: list[Event] = []
    stop = asyncio.Event()
    load = asyncio.create_task(traffic(sb.router_url, stop, backend.statuses))
    try:
        backend.before = await until_each(sb.worker_urls, busy=True)
        routers = RouterSet([sb.router_url], metrics=[sb.metrics_url])
        runner = Runner(initial(rollout), Journal.create(journal, rollout), backend,
                        membership or backend.membership(routers), poll_s=0.05,
                        progress=lambda p: events.append(p.event) if p.event else None)  # fmt: skip
        final = await runner.run()
    finally:
        stop.set()
        await load
        await backend.aclose()
    return final, [e for e in events if e.step is not None and e.step.phase in (Phase.REMOVE, Phase.DRAIN)]


def test_in_flight_requests_on_a_removed_worker_finish_before_it_is_restarted(tmp_path: Path, sandbox: Sandbox) -> None:
    backend = RestartRecorder(fleet_of(sandbox.spec), sandbox.paths.sandbox_dir)
    final, moves = asyncio.run(revert(sandbox, backend, tmp_path / "journal.jsonl"))
    drains = moves[1::2]
    assert final.outcome is not None and final.outcome.value == "completed", final
    assert all(n > 0 for n in backend.before.values()), backend.before  # the drain had something to wait for
    # The backend found nothing running on any worker it restarted: the drain waited for every request.
    assert backend.at_restart == dict.fromkeys(final.plan.replicas, 0.0)
    assert len(drains) == 2 and all(e.detail.startswith("drained in ") for e in drains), drains
    assert backend.statuses and set(backend.statuses) == {200}, sorted(set(backend.statuses))


def test_a_drain_that_cannot_finish_times_out_by_name(tmp_path: Path, sandbox: Sandbox) -> None:
    """A removed worker whose requests outlast the drain timeout (0.5 s < 1.5 s requests): the step ends on the
    timeout and says so, how many requests after how long, rather than waiting on or claiming it drained."""
    short = sandbox.variant("short-drain", {"rollout.drain_timeout_s": 0.5})
    backend = RestartRecorder(fleet_of(short.spec), short.paths.sandbox_dir)
    membership = FreshRequestAtRemoval(short, backend)
    _final, moves = asyncio.run(revert(short, backend, tmp_path / "journal.jsonl", membership))
    drains = moves[1::2]
    assert drains, "no drain step ran"
    first = drains[0].detail
    assert first.startswith("drain timeout: ") and "still running after 0.5 s" in first, first
    assert int(first.split()[2]) >= 1  # "drain timeout: N requests still running …"
    assert any(n > 0 for n in backend.at_restart.values()), backend.at_restart  # it did not wait on


def test_a_worker_that_does_not_answer_is_unknown_not_idle_and_the_drain_waits_it_out(
    tmp_path: Path, sandbox: Sandbox
) -> None:
    """A batch's worker killed right after its removal (its ``/metrics`` refuses connections): its in-flight count
    is unknown, not 0, so the drain never reports "drained": it runs to its timeout (2 s) and names the replica and
    why; the update then restarts the worker like the others and the revert completes."""
    short = sandbox.variant("unknown-drain", {"rollout.drain_timeout_s": 2})
    backend = RestartRecorder(fleet_of(short.spec), short.paths.sandbox_dir)
    membership = KillAfterRemoval(short, backend)
    final, moves = asyncio.run(revert(short, backend, tmp_path / "journal.jsonl", membership))
    assert final.outcome is not None and final.outcome.value == "completed", final
    removed, drained = moves[0], moves[1]
    assert drained.step is not None and drained.step.phase is Phase.DRAIN, moves
    killed = membership.killed
    assert killed is not None and killed in final.plan.batch(0).replicas
    assert drained.detail.startswith("drain timeout: ") and "after 2 s" in drained.detail, drained.detail
    assert f"in flight unknown on 1: {killed} (no answer from {backend.worker_url(killed)}/metrics" in drained.detail
    assert drained.at - removed.at >= 2.0, (removed, drained)  # it waited the whole timeout out
    assert set(short.versions().values()) == {final.plan.to_version}  # the killed worker was restarted and updated
