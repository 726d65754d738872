"""The REAL gateway (``smg``) started with the flags ``serving.render.router`` renders, in front of two workers.

The workers are SIMULATED SGLang servers (``serving.sandbox.worker``: no model, no GPU — SGLang itself
cannot run here); the router is the real binary from the pinned wheel. Only the listeners (loopback,
free ports) and the worker URLs are overridden; every other flag is the rendered one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from serving.render.router import request_timeout_s
from serving.router.client import ROUTER_WORKER_HEALTH, RouterClient, WorkerInfo
from serving.router.membership import MembershipTimeout, RouterSet
from serving.sandbox.processes import StateDir, free_ports, start_worker, stop_all, stop_process
from serving.sandbox.worker_config import WorkerConfig
from serving.spec.stack import load_stack
from tests.support.rendered_router import (
    LOOPBACK,
    Workers,
    heartbeat_spec,
    running_workers,
    start_rendered_router,
    stop_and_restart_a_worker,
)
from tests.support.smg import DRAIN_SETTLE_S, removal_job_noticed_s
from tests.support.stacks import fleet_of

# real routers, waited on while they notice a worker's failure: the wait-bound phase (tests/conftest.py)
pytestmark = pytest.mark.sandbox


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    with running_workers(tmp_path) as w:
        yield w


@pytest.mark.slow
def test_real_router_with_the_rendered_dev_flags_reports_both_workers_healthy(workers: Workers) -> None:
    spec = load_stack("dev").spec

    async def body() -> None:
        async with start_rendered_router(spec, workers) as rc:
            listed = await rc.list_workers()
            metrics = await rc.metrics()
        assert {w.url for w in listed} == {c.url for c in workers.configs}
        assert all(w.is_healthy for w in listed)
        assert metrics.worker_gauge(ROUTER_WORKER_HEALTH) == {c.url: 1.0 for c in workers.configs}

    asyncio.run(body())


@pytest.mark.slow
def test_rendered_heartbeat_flags_govern_the_real_routers_health_checks(workers: Workers) -> None:
    """With the spec's heartbeat at 1 s × 2 failures the router takes a stopped worker out of its healthy list and
    readmits it once restarted, the other worker healthy throughout. That it notices within the budget the flags give
    (failures × interval + timeout + 2 s; the router's own default, a 60 s interval, would not) is the rehearsal's:
    tests/rehearsal/test_router_timing.py."""
    detection = stop_and_restart_a_worker(heartbeat_spec(workers), workers)
    assert detection.survivor_healthy, detection


@pytest.mark.slow
def test_a_worker_added_back_before_smg_notices_its_removal_job_ended_is_admitted(
    workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rollback's order on one URL: remove (drain), restart the worker, add it back once its entry is gone (404).
    smg keeps job statuses by URL and erases the URL's status when it notices the removal job ended, on a backed-off
    poll (6.4 s after a DELETE with the 5 s drain): the new registration, still waiting for its worker then, answers
    404 although it goes on and admits the worker. Before the fix the updater took that 404 for a dropped
    registration and the readmission failed (RegistrationFailed) at 6.4 s."""
    spec = load_stack("dev").spec
    victim = workers.configs[0]
    erased_s = removal_job_noticed_s()
    answers: list[tuple[float, str, WorkerInfo | None]] = []
    real_get_worker = RouterClient.get_worker

    async def recorded(self: RouterClient, worker_id: str) -> WorkerInfo | None:
        worker = await real_get_worker(self, worker_id)
        answers.append((time.monotonic(), worker_id, worker))
        return worker

    monkeypatch.setattr(RouterClient, "get_worker", recorded)

    async def restart(at: float) -> float:
        await asyncio.sleep(at - time.monotonic())
        await asyncio.to_thread(start_worker, workers.state, f"worker-{victim.port}", victim)
        return time.monotonic()

    async def body() -> tuple[float, float, float, list[WorkerInfo]]:
        async with start_rendered_router(spec, workers) as rc:
            routers = RouterSet([rc.base_url])
            deleted = time.monotonic()
            await routers.remove(victim.url, timeout_s=DRAIN_SETTLE_S)
            stop_process(workers.state, f"worker-{victim.port}")
            restarted = asyncio.create_task(restart(deleted + erased_s + 1.0))
            await routers.add(victim.url, timeout_s=30)
            admitted = time.monotonic()
            return deleted, await restarted, admitted, await rc.list_workers()

    deleted, restarted, admitted, listed = asyncio.run(body())
    # the premise: the new registration answered pending, then 404 from when smg noticed the removal job's end while
    # its worker was still down, then ready
    (new_id,) = {i for _, i, w in answers if w is not None and w.status == "pending"}
    kinds = [(w.status if w else 404) for _, i, w in answers if i == new_id]
    assert kinds[0] == "pending" and kinds[-1] == "ready" and 404 in kinds, kinds
    first_404_at = next(at for at, i, w in answers if i == new_id and w is None)
    assert first_404_at < restarted, (first_404_at, restarted)  # erased while its worker was still down
    # not before smg's backed-off poll noticed the removal job's end: the 404 is that erasure
    noticed_s = first_404_at - deleted
    assert noticed_s > erased_s - 0.5, noticed_s  # not a timing judgment: a lower bound (smg's erase schedule)
    assert admitted > restarted
    assert {w.url: (w.status, w.is_healthy) for w in listed} == {c.url: ("ready", True) for c in workers.configs}


@pytest.mark.slow
def test_a_registration_the_router_gives_up_answers_404_and_the_addition_says_so(workers: Workers) -> None:
    """What the addition's timeout message relies on, on the pinned smg: a registration given up after
    ``--worker-startup-timeout-secs`` leaves no entry (404), not a failed job status. Nothing listens on the added
    URL; the start-up timeout is 2 s."""
    spec = load_stack("dev").spec
    (port,) = free_ports(1)
    nowhere = f"http://{LOOPBACK}:{port}"

    async def body() -> str:
        async with start_rendered_router(spec, workers, {"--worker-startup-timeout-secs": ["2"]}) as rc:
            with pytest.raises(MembershipTimeout) as timed_out:
                await RouterSet([rc.base_url]).add(nowhere, timeout_s=15)
            return str(timed_out.value)

    message = asyncio.run(body())
    assert f"it holds no entry (404) for 1: ['{nowhere}']" in message, message
    assert "--worker-startup-timeout-secs" in message


@pytest.mark.slow
def test_an_addition_retried_while_its_registration_is_pending_waits_for_that_one(workers: Workers) -> None:
    """``GET /workers`` does not list a pending registration, so an addition retried while the first waits for its
    worker POSTs again; smg 1.13.0 answers 409 WORKER_CREATE_IN_PROGRESS naming the pending id. Before the fix the
    retried addition failed on that 409; now it waits for the pending registration."""
    spec = load_stack("dev").spec
    victim = workers.configs[0]

    async def body() -> tuple[str, str, list[WorkerInfo]]:
        async with start_rendered_router(spec, workers) as rc:
            routers = RouterSet([rc.base_url])
            deleted = time.monotonic()
            await routers.remove(victim.url, timeout_s=30)
            await routers.drains_ended(victim.url, timeout_s=30)
            # The second POST must find the first registration pending. smg erases the job status it keeps under
            # the URL when it notices the removal job ended (removal_job_noticed_s, 6.4 s after the DELETE), and
            # then takes a POST of that URL for a new job: measured, the 409 window closed 1.5 s after the drain
            # ended, which a CI run on a loaded machine overran. The registration starts after that.
            await asyncio.sleep(max(0.0, deleted + removal_job_noticed_s() + 0.5 - time.monotonic()))
            stop_process(workers.state, f"worker-{victim.port}")
            first = await rc.add_worker(victim.url)  # pending: its worker does not answer
            async with httpx.AsyncClient(timeout=10) as http:
                raw = await http.post(rc.base_url + "/workers", json={"url": victim.url})
            retried = asyncio.create_task(routers.add(victim.url, timeout_s=60))
            await asyncio.sleep(1.0)
            assert not retried.done(), retried
            await asyncio.to_thread(start_worker, workers.state, f"worker-{victim.port}", victim)
            await retried
            return first, raw.text, await rc.list_workers()

    first, second_answer, listed = asyncio.run(body())
    assert "WORKER_CREATE_IN_PROGRESS" in second_answer and first in second_answer, second_answer  # the premise
    assert {w.url: (w.status, w.is_healthy) for w in listed} == {c.url: ("ready", True) for c in workers.configs}


def test_a_generation_longer_than_the_old_15_s_timeout_streams_to_the_end_through_the_rendered_router(
    tmp_path: Path,
) -> None:
    """Issue 39, item 2: smg's ``--request-timeout-secs`` is its upstream client's total timeout, streamed body
    included (``worker/http_client.rs``, reqwest ``.timeout``), and the routers rendered 15 s (the detection window):
    every stream past 15 s was cut. The dev stack now renders the longest generation it allows (⌈4,096 tokens ÷ 10
    tokens/s + 2 s⌉ = 412 s). One streamed /generate whose generation takes 16 s goes through the router started with
    the dev stack's rendered flags, and at once through one started with the old 15 s: the first streams every chunk
    to ``[DONE]``; the second is cut at 15 s, which smg tells in-band (a ``stream_error`` chunk, "operation timed
    out", then ``[DONE]``, the status 200): what the test would see on the old render."""
    spec = load_stack("dev").spec
    assert request_timeout_s(fleet_of(spec).plan) == 412
    state = StateDir(tmp_path / "state")
    (tmp_path / "model").mkdir()
    slow = tuple(  # two: the rendered policy (power_of_two) refuses to start with fewer
        WorkerConfig(port=port, latency_ms=16_000, jitter_ms=0, model_path=str(tmp_path / "model"))
        for port in free_ports(2)
    )
    try:
        for config in slow:
            start_worker(state, f"slow-worker-{config.port}", config)
        workers = Workers(state, slow)
        rendered = start_rendered_router(spec, workers)
        old = start_rendered_router(spec, workers, {"--request-timeout-secs": ["15"]}, name="router-15s")
        body = {"text": "a long story", "sampling_params": {"max_new_tokens": 8}, "stream": True}

        async def stream(url: str) -> tuple[list[str], float]:
            chunks: list[str] = []
            t0 = time.monotonic()
            async with (
                httpx.AsyncClient(timeout=60) as client,
                client.stream("POST", url + "/generate", json=body) as r,
            ):
                assert r.status_code == 200, await r.aread()
                try:
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            chunks.append(line.removeprefix("data: "))
                except httpx.HTTPError as exc:  # the router cut the body mid-stream
                    chunks.append(f"cut: {type(exc).__name__}")
            return chunks, time.monotonic() - t0

        async def both() -> list[tuple[list[str], float]]:
            return list(await asyncio.gather(stream(rendered.base_url), stream(old.base_url)))

        (whole, took), (cut, _) = asyncio.run(both())
    finally:
        stop_all(state)
    print(f"rendered: {len(whole)} chunks in {took:.1f} s; old 15 s: {cut[-2:]}")
    assert took > 15.0, "the generation did not outlast the old timeout: the test proves nothing"  # a lower bound
    assert whole[-1] == "[DONE]" and len(whole) == 8 + 1, whole  # every token's chunk, then the terminator
    assert not any("stream_error" in c for c in whole), whole
    # smg ends a cut stream cleanly: an in-band error chunk, then [DONE] (the status stays 200)
    errors = [c for c in cut if '"type":"stream_error"' in c]
    assert len(errors) == 1 and "timed out" in errors[0] and len(cut) < len(whole) + 1, cut
