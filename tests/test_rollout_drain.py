"""The updater's drain, against the real router (``sglang-router`` 0.3.2) and simulated SGLang workers (the stand-in
for GPU workers: real processes speaking SGLang's HTTP API and metrics, ``serving/sandbox/worker.py``).

Router retries and the workers' own graceful shutdown hide a drain that does not wait: clients see no error either
way. So these tests look where the difference is: what a removed worker was still running when the backend
restarted it (must be nothing), and what the drain step recorded when requests cannot finish (a timeout, named).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest

from serving.plan.model import Plan
from serving.plan.planner import plan
from serving.rollout.journal import Journal
from serving.rollout.machine import Event, Phase, RolloutState, initial
from serving.rollout.plan import plan_rollout
from serving.rollout.runner import Runner
from serving.router.client import WORKER_QUEUED, WORKER_RUNNING, MetricsSnapshot, RouterClient
from serving.sandbox.backend import LocalBackend
from serving.spec.schema import FleetSpec
from tests.support.sandbox import Sandbox, running_sandbox

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


async def in_flight(client: httpx.AsyncClient, url: str) -> float:
    """Running + queued requests, as the worker itself reports them (SGLang's gauges)."""
    snap = MetricsSnapshot.parse((await client.get(url + "/metrics", timeout=5)).text)
    return snap.value(WORKER_RUNNING) + snap.value(WORKER_QUEUED)


class RestartRecorder(LocalBackend):
    """The real local backend (restarts the worker processes), recording what each worker was still running at
    the moment it was restarted, what the workers ran before the run and the clients' response statuses."""

    def __init__(self, spec: FleetSpec, fleet_plan: Plan, processes_dir: Path) -> None:
        super().__init__(spec, fleet_plan, processes_dir)
        self.at_restart: dict[str, float] = {}
        self.before: dict[str, float] = {}
        self.statuses: list[int] = []

    async def update(self, replica_ids: Sequence[str], version: str, timeout_s: float) -> None:
        async with httpx.AsyncClient() as client:
            for r in replica_ids:
                self.at_restart[r] = await in_flight(client, self.worker_url(r))
        await super().update(replica_ids, version, timeout_s)


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


async def busy(urls: Sequence[str], deadline_s: float = 10) -> dict[str, float]:
    """Wait until every worker in ``urls`` runs a request; their in-flight counts then."""
    async with httpx.AsyncClient() as client:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            counts = {u: await in_flight(client, u) for u in urls}
            if all(counts.values()):
                return counts
            await asyncio.sleep(0.05)
    raise AssertionError(f"workers {list(urls)} never all had a request in flight: {counts}")


async def revert(sb: Sandbox, backend: RestartRecorder, journal: Path) -> tuple[RolloutState, list[Event]]:
    """Run an ungated plan (a revert: remove, drain, update, health, readmit per batch) to the other of v1/v2 under
    long-request traffic through the router; the final state and the committed events."""
    current = set(sb.versions().values())
    target = "v2" if current == {"v1"} else "v1"
    rollout = plan_rollout(sb.spec, plan(sb.spec), sb.spec.cluster.name, from_version=current.pop(), to_version=target,
                           kind="revert")  # fmt: skip
    events: list[Event] = []
    stop = asyncio.Event()
    load = asyncio.create_task(traffic(sb.router_url, stop, backend.statuses))
    try:
        backend.before = await busy(sb.worker_urls)
        async with RouterClient(sb.router_url, sb.metrics_url) as router:
            runner = Runner(initial(rollout), Journal.create(journal, rollout), backend, router, poll_s=0.05,
                            progress=lambda p: events.append(p.event) if p.event else None)  # fmt: skip
            final = await runner.run()
    finally:
        stop.set()
        await load
        await backend.aclose()
    return final, [e for e in events if e.step is not None and e.step.phase is Phase.DRAIN]


def test_in_flight_requests_on_a_removed_worker_finish_before_it_is_restarted(tmp_path: Path, sandbox: Sandbox) -> None:
    backend = RestartRecorder(sandbox.spec, plan(sandbox.spec), sandbox.paths.sandbox_dir)
    final, drains = asyncio.run(revert(sandbox, backend, tmp_path / "journal.jsonl"))
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
    backend = RestartRecorder(short.spec, plan(short.spec), short.paths.sandbox_dir)
    _final, drains = asyncio.run(revert(short, backend, tmp_path / "journal.jsonl"))
    assert drains, "no drain step ran"
    first = drains[0].detail
    assert first.startswith("drain timeout: ") and "still running after 0.5 s" in first, first
    assert int(first.split()[2]) >= 1  # "drain timeout: N requests still running …"
    assert any(n > 0 for n in backend.at_restart.values()), backend.at_restart  # it did not wait on
