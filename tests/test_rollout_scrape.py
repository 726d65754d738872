"""A replica's scrape for the gates (serving.rollout.runner.asked_again_after_a_timeout): a time-out is asked once more
before the replica reads as down; a refused connection or an error answer is down at once. On a real aiohttp stand-in
worker through the updater's own FleetHttp."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import TestServer

from serving.fleet_http import FleetHttp, HttpFailure
from serving.rollout.gates.window import ReplicaReading
from serving.rollout.runner import Reading, asked_again_after_a_timeout, asked_again_note, spread
from serving.router.client import MetricsSnapshot, parse_only
from serving.sandbox.processes import free_port

METRICS = "# TYPE sglang:num_requests_total counter\nsglang:num_requests_total 7.0\n"


def scrape_with(stalls: list[float], status: int = 200) -> tuple[tuple[MetricsSnapshot | str, int], int]:
    """Scrape a worker whose n-th /metrics answers after ``stalls[n]`` seconds (the last repeats), 0.3 s bound: what
    the scrape returned (the answer or why none, and the asks it counted), and the asks the worker received."""
    asked = 0

    async def metrics(_request: web.Request) -> web.Response:
        nonlocal asked
        asked += 1
        await asyncio.sleep(stalls[min(asked, len(stalls)) - 1])
        return web.Response(text=METRICS, status=status)

    async def scrape() -> tuple[MetricsSnapshot | str, int]:
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        async with TestServer(app) as server, FleetHttp(timeout_s=0.3) as http:
            url = str(server.make_url("/metrics"))

            async def once() -> MetricsSnapshot:
                answer = await http.get(url)
                if answer.status != 200:
                    raise HttpFailure(url, f"HTTP {answer.status}")
                return parse_only(answer.text, ("sglang:",))

            return await asked_again_after_a_timeout(once, once)

    return asyncio.run(scrape()), asked


def test_one_time_out_is_asked_again_and_the_answer_counts() -> None:
    (found, counted), asked = scrape_with([1.0, 0.0])
    assert isinstance(found, MetricsSnapshot) and found.value("sglang:num_requests_total") == 7.0
    assert asked == counted == 2


def test_an_answer_in_time_is_asked_once() -> None:
    (found, counted), asked = scrape_with([0.0])
    assert isinstance(found, MetricsSnapshot) and asked == counted == 1


def test_two_time_outs_read_as_down_saying_so() -> None:
    assert scrape_with([1.0]) == (("Timeout 0.3 s, asked twice", 2), 2)


def test_an_error_answer_is_down_at_once() -> None:
    assert scrape_with([0.0], status=500) == (("HTTP 500", 1), 1)


def test_a_refused_connection_is_down_at_once() -> None:
    async def refused() -> tuple[MetricsSnapshot | str, int]:
        calls = 0
        async with FleetHttp(timeout_s=0.3) as http:

            async def once() -> MetricsSnapshot:
                nonlocal calls
                calls += 1
                answer = await http.get(f"http://127.0.0.1:{free_port()}/metrics")
                return parse_only(answer.text, ("sglang:",))

            found = await asked_again_after_a_timeout(once, once)
        assert calls == 1
        return found

    assert asyncio.run(refused()) == ("ConnectError", 1)


def test_the_replicas_are_scraped_spread_over_the_nodes_in_the_same_order_each_read() -> None:
    """A read of every replica goes in a shuffled order, fixed for the list: the scrapes in flight at once are not
    one node's (or one scale-sandbox worker process's) consecutive replicas, and both ends of a window take the same
    path."""
    replicas = [f"gpu-r00-n{n:02d}-s{s}" for n in range(32) for s in range(8)]
    order = spread(replicas)
    assert sorted(order) == sorted(replicas) and order == spread(replicas)
    first_wave = order[:32]  # a wave as large as four nodes' replicas
    nodes = {r.rsplit("-s", 1)[0] for r in first_wave}
    assert len(nodes) > 16, nodes  # in replica order: 4 nodes


def test_a_window_says_which_replicas_answered_only_a_second_ask() -> None:
    """The journal's soak and baseline details carry the replicas a second ask saved, at each end of the window."""
    replica = ReplicaReading(successes=0.0, failures=0.0, healthy=True, circuit_open=False, latency=None)
    names = [f"gpu-r00-n00-s{s}" for s in range(8)]
    reads = {n: replica for n in names}

    def reading(again: list[str]) -> Reading:
        return Reading({}, reads, at=0.0, took=1.0, asked_again=tuple(again))

    assert asked_again_note(reading([]), reading([])) == ""
    assert asked_again_note(reading(names[:1]), reading([])) == (
        "; answered only when asked again after a time-out: 1 of 8 (gpu-r00-n00-s0) at the start, 0 of 8 at the end"
    )
    note = asked_again_note(reading([]), reading(names[:7]))
    assert note.endswith(
        "7 of 8 (gpu-r00-n00-s0, gpu-r00-n00-s1, gpu-r00-n00-s2, gpu-r00-n00-s3, gpu-r00-n00-s4, …) at the end"
    )


def test_the_second_ask_goes_through_its_own_call() -> None:
    """The runner's first asks share SCRAPES_AT_ONCE slots; a second ask goes through the other session, so it does not
    queue behind the first asks of the rest of the read."""
    calls: list[str] = []

    async def first() -> MetricsSnapshot:
        calls.append("first")
        raise HttpFailure("http://r/metrics", "Timeout 3 s")

    async def again() -> MetricsSnapshot:
        calls.append("again")
        return parse_only(METRICS, ("sglang:",))

    found, asks = asyncio.run(asked_again_after_a_timeout(first, again))
    assert isinstance(found, MetricsSnapshot) and asks == 2 and calls == ["first", "again"]
