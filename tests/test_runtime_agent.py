"""The node agent and its fleet-wide HTTP (serving.fleet_http) against real processes on loopback.

The replicas are SIMULATED SGLang workers (serving.sandbox.worker_host, a real process serving real ports); the
controllers' report endpoint and the DCGM exporter are stand-ins served here (no controller needed to read a report,
no GPU for DCGM): the report is read back with the controller's own parser, the exporter's text is DCGM's format.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from serving.fleet_http import FleetHttp, HttpFailure
from serving.runtime.agent import AGENT_USER_AGENT, BOOT_ID, Agent, AgentConfig, Boot
from serving.runtime.reports import NodeReport, ReplicaProbe, parse_report
from serving.sandbox.processes import StateDir, free_port, free_port_block, stop_process
from serving.sandbox.worker import SimulatedWorker
from serving.sandbox.worker_config import WorkerConfig, health_answer_bound_s
from serving.sandbox.worker_host import WORKERS_PATH, control, start_host
from serving.sglang_health import HEALTH_POLL_S
from serving.sglang_metrics import STALL_BOUNDS_S
from tests.support.drain_waits import drain_waits

# The agent's probe timeout must exceed a healthy /health (one poll period of SGLang's 1 s and its step): the bound the
# sandbox gives it; the slow worker answers one poll after its 2.5 s delay, past it.
PROBE_TIMEOUT_S = health_answer_bound_s(WorkerConfig(port=1))
SLOW_DELAY_MS = 1000 * (PROBE_TIMEOUT_S + HEALTH_POLL_S / 2)
DCGM_TEXT = """\
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a"} 40
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b"} 60
DCGM_FI_DEV_GPU_UTIL{gpu="2",UUID="GPU-c"} 100
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a"} 30000
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-b"} 50000
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-a"} 50000
DCGM_FI_DEV_FB_FREE{gpu="1",UUID="GPU-b"} 30000
"""


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Three simulated workers in one worker-host process: ``ready``, ``warming`` (its /health answers 503 for ever)
    and ``slow`` (every answer later than the agent's probe timeout, set through the simulator's fault route); ``closed``: a port nobody
    listens on. Name → URL, plus ``control``: the host's control endpoint."""
    base = free_port_block(3)
    configs = [
        WorkerConfig(port=base),
        WorkerConfig(port=base + 1, never_ready=True),
        WorkerConfig(port=base + 2),
    ]
    state = StateDir(tmp_path_factory.mktemp("agent-host"))
    host = start_host(state, 0, configs, free_port(), timeout_s=30)
    urls = {"ready": configs[0].url, "warming": configs[1].url, "slow": configs[2].url}
    try:
        deadline = time.monotonic() + 30
        asyncio.run(_until_listening(list(urls.values()), deadline))
        asyncio.run(_put_fault(urls["slow"], {"delay_ms": SLOW_DELAY_MS}))
        yield {**urls, "closed": f"http://127.0.0.1:{free_port()}", "control": host.url}
    finally:
        stop_process(state, host.name, timeout_s=10)


async def _until_listening(urls: list[str], deadline: float) -> None:
    http = FleetHttp(timeout_s=1.0)
    try:
        for url in urls:
            while True:
                try:
                    await http.get(url + "/model_info")
                    break
                except HttpFailure:
                    assert time.monotonic() < deadline, f"{url} never listened"
                    await asyncio.sleep(0.1)
    finally:
        await http.aclose()


async def _put_fault(url: str, fault: dict[str, float]) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as s, s.put(url + "/sim/fault", json=fault) as r:
        assert r.status == 200, await r.text()


class Stand:
    """A loopback server for the stand-ins: ``POST /v1/reports`` records bodies (202), ``GET /dcgm`` serves DCGM's
    text, ``GET /slow`` answers after 0.3 s counting how many it serves at once; under ``/hung`` a controller and a
    replica that accept and never answer."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.arrived: list[float] = []  # time.monotonic() of each report
        self.released = asyncio.Event()  # ends the hung answers (before the server's cleanup, which waits for them)
        self.at_once = 0
        self.most_at_once = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/reports", self._report)
        app.router.add_post("/hung/v1/reports", self._hang)
        app.router.add_get("/hung/health_generate", self._hang)
        app.router.add_get("/dcgm", self._dcgm)
        app.router.add_get("/slow", self._slow)
        return app

    async def _report(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.read())
        self.arrived.append(time.monotonic())
        return web.json_response({"accepted": True}, status=202)

    async def _hang(self, _request: web.Request) -> web.Response:
        await self.released.wait()
        return web.Response(status=500)

    async def _dcgm(self, _request: web.Request) -> web.Response:
        return web.Response(text=DCGM_TEXT)

    async def _slow(self, _request: web.Request) -> web.Response:
        self.at_once += 1
        self.most_at_once = max(self.most_at_once, self.at_once)
        await asyncio.sleep(0.3)
        self.at_once -= 1
        return web.Response(text="ok")


async def _serving(stand: Stand) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(stand.app(), access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def test_one_report_per_node_says_what_each_replica_answered_and_reaches_every_controller(
    workers: dict[str, str],
) -> None:
    async def run() -> tuple[NodeReport, dict[str, int], list[bytes], str]:
        stand = Stand()
        runner, base = await _serving(stand)
        dead_controller = f"http://127.0.0.1:{free_port()}"
        config = AgentConfig(
            node="gpu-r00-n00",
            replicas=tuple(
                (name, workers[name], gpus)
                for name, gpus in (("ready", (0, 1)), ("warming", (2,)), ("slow", ()), ("closed", ()))
            ),
            controllers=(base, dead_controller),
            interval_s=5.0,
            timeout_s=PROBE_TIMEOUT_S,
            max_running_requests=256,
            link_rate_gbps=400.0,
            dcgm_url=base + "/dcgm",
        )
        agent = Agent(config)
        try:
            report = await agent.report()
            codes = await agent.send(report)
        finally:
            await agent.aclose()
            await runner.cleanup()
        return report, dict(codes), stand.bodies, dead_controller

    report, codes, bodies, dead = asyncio.run(run())
    probes = {p.id: p for p in report.replicas}
    assert report.node == "gpu-r00-n00" and list(probes) == ["ready", "warming", "slow", "closed"]
    assert report.boot_id == BOOT_ID.read_text().strip() and 0 < report.seq < time.monotonic_ns()  # this boot's clock
    ready = probes["ready"]
    assert ready.ok and ready.error is None and ready.latency_s is not None
    assert ready.latency_s >= HEALTH_POLL_S  # SGLang's /health: one poll period at least (ok: within the timeout)
    assert ready.gpu_utilization == pytest.approx(0.5)  # DCGM, averaged over its GPUs 0 and 1: (40 + 60) / 2 %
    # SGLang's KV pool fill, not DCGM's frame buffer (80,000 of 160,000 MiB used: the pool allocated at start-up)
    assert ready.memory_usage == 0.0  # idle: its KV pool is empty, though DCGM says its frame buffer is half full
    assert ready.running == 0 and ready.queued == 0
    assert not probes["warming"].ok and probes["warming"].error == "/health_generate 503"
    assert probes["warming"].gpu_utilization == 0.0  # a failed probe reports no figures
    assert not probes["slow"].ok and probes["slow"].latency_s is None
    assert probes["slow"].error == f"Timeout {PROBE_TIMEOUT_S:g} s"
    assert not probes["closed"].ok and probes["closed"].error == "ConnectError"
    # every controller was sent the report; the one that does not listen is 0
    assert codes == {next(c for c in codes if c != dead): 202, dead: 0}
    assert len(bodies) == 1 and parse_report(bodies[0]) == report
    # the workers saw the agent's probes under its own name
    counted = asyncio.run(control(workers["control"], WORKERS_PATH, None, 10))["requests"]
    client = AGENT_USER_AGENT.split("/", 1)[0]
    assert client == "exaserve-agent"
    assert counted.get(f"GET /health_generate {client}", 0) >= 2 and counted.get(f"GET /metrics {client}", 0) >= 1


INTERVAL_S = 0.4  # the schedule tests' heartbeat, with a 0.3 s timeout (prod: 5 s and 3 s)


def _reports_arriving(seconds: float, changes: Callable[[str], dict[str, Any]]) -> list[float]:
    """Run an agent (0.4 s interval, 0.3 s timeout, no replica, the Stand as its controller, then ``changes`` of the
    Stand's URL) for ``seconds``; when each report reached the Stand's ``/v1/reports``."""

    async def run() -> list[float]:
        stand = Stand()
        runner, base = await _serving(stand)
        config = AgentConfig(
            **{
                "node": "gpu-r00-n00",
                "replicas": (),
                "controllers": (base,),
                "interval_s": INTERVAL_S,
                "timeout_s": 0.3,
                "max_running_requests": 256,
                "link_rate_gbps": 400.0,
                **changes(base),
            }
        )
        agent = Agent(config)
        stop = asyncio.Event()
        running = asyncio.create_task(agent.run(stop))
        try:
            await asyncio.sleep(seconds)
        finally:
            stop.set()
            await running
            await agent.aclose()
            stand.released.set()
            await runner.cleanup()
        return stand.arrived

    return asyncio.run(run())


def test_a_hung_controller_does_not_stretch_the_agents_heartbeat() -> None:
    """A replica whose probe times out and a controller that never answers: awaited in the round, the send waited out
    its own timeout after the probe's, and each round took both (0.3 + 0.3 s against a 0.4 s interval, as prod's
    3 + 3 s against 5 s), so the node's reports came late and its replica's score moved slower than the plan says.
    The report is sent while the next round waits: the other controller gets one every interval."""
    arrived = _reports_arriving(
        12 * INTERVAL_S,
        lambda base: {"replicas": (("hung", base + "/hung", ()),), "controllers": (base, base + "/hung")},
    )
    gaps = [b - a for a, b in itertools.pairwise(arrived)]
    assert len(arrived) >= 8, f"{len(arrived)} reports in {12 * INTERVAL_S:g} s at a {INTERVAL_S:g} s interval: {gaps}"
    assert sum(gaps) / len(gaps) < 1.1 * INTERVAL_S, f"reports {sum(gaps) / len(gaps):.2f} s apart on average: {gaps}"


def test_a_slow_lookup_of_the_controllers_service_does_not_stop_the_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controllers' headless Service resolved per report: a lookup that hangs (a DNS outage; the event loop's
    getaddrinfo for that name never returns) held each send, and a send superseded by the next report was cancelled
    before it posted anything, so no controller heard from the node. The lookup is bounded by the probe timeout, runs
    once at a time, and the reports go to the controllers known without it every interval."""
    service = "exaserve-controller.exaserve.svc"
    lookups: list[str] = []
    real = asyncio.base_events.BaseEventLoop.getaddrinfo

    async def getaddrinfo(loop: asyncio.AbstractEventLoop, host: str, *args: Any, **kwargs: Any) -> Any:
        if host != service:
            return await real(loop, host, *args, **kwargs)  # type: ignore[arg-type]
        lookups.append(host)
        await asyncio.sleep(3600)  # the DNS does not answer

    monkeypatch.setattr(asyncio.base_events.BaseEventLoop, "getaddrinfo", getaddrinfo)
    arrived = _reports_arriving(8 * INTERVAL_S, lambda _base: {"controller_service": f"{service}:8480"})
    assert len(arrived) >= 6, f"{len(arrived)} reports in {8 * INTERVAL_S:g} s at a {INTERVAL_S:g} s interval"
    assert lookups == [service], "one lookup at a time, awaited again while it runs"


def test_a_lookup_that_ends_after_its_report_stopped_waiting_still_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lookup of the controllers' Service outlives its report's wait (0.3 s), then ends: its addresses are what the
    next report sends to while that report's own lookup is still running, and a late failure is retrieved, not left
    for the event loop to report as a task exception never retrieved (the last addresses stay); a name the resolver
    refuses outright (ValueError, not OSError) leaves them too instead of failing the report's every send."""
    late = ["http://10.0.0.7:8480"]
    # each ends 0.5 s after it started, but a name idna refuses (at once) and the DNS that hangs
    answers = iter(["answer", "fail", "refused", "hang"])

    async def lookup(service: str) -> list[str]:
        kind = next(answers)
        if kind == "refused":
            raise UnicodeError("encoding with 'idna' codec failed (UnicodeError: label empty or too long)")
        await asyncio.sleep(0.5 if kind != "hang" else 3600)
        if kind == "fail":
            raise OSError(-2, "Name or service not known")
        return late

    monkeypatch.setattr(Agent, "_lookup_service", staticmethod(lookup))
    config = AgentConfig(node="gpu-r00-n00", replicas=(), controllers=(), interval_s=INTERVAL_S, timeout_s=0.3,
                         max_running_requests=256, link_rate_gbps=400.0,
                         controller_service="exaserve-controller.exaserve.svc:8480")  # fmt: skip

    async def run() -> tuple[list[list[str]], list[dict[str, Any]]]:
        unretrieved: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _loop, context: unretrieved.append(context))
        agent = Agent(config)
        seen = []
        try:
            for _ in range(4):  # a report every 0.6 s: each lookup ends (or not) after its report stopped waiting
                seen.append(await agent._resolved())
                await asyncio.sleep(0.3)
        finally:
            await agent.aclose()
        gc.collect()  # a task's unretrieved exception is reported when the task is collected
        await asyncio.sleep(0)
        return seen, unretrieved

    seen, unretrieved = asyncio.run(run())
    assert seen == [[], late, late, late], seen
    assert unretrieved == []


def test_fleet_http_bounds_calls_in_flight_and_their_timeout_does_not_count_the_wait() -> None:
    """Eight calls of 0.3 s with 2 in flight take four turns (1.2 s), each within its 0.5 s time-out."""

    async def run() -> tuple[list[int], int, float]:
        stand = Stand()
        runner, base = await _serving(stand)
        http = FleetHttp(timeout_s=0.5, at_once=2)
        try:
            started = time.monotonic()
            answers = await asyncio.gather(*(http.get(base + "/slow") for _ in range(8)))
            took = time.monotonic() - started
        finally:
            await http.aclose()
            await runner.cleanup()
        return [a.status for a in answers], stand.most_at_once, took

    statuses, most, took = asyncio.run(run())
    assert statuses == [200] * 8
    assert most == 2
    assert took >= 4 * 0.3


def test_fleet_http_names_the_url_and_why_when_nothing_answers() -> None:
    url = f"http://127.0.0.1:{free_port()}/metrics"

    async def run() -> HttpFailure:
        http = FleetHttp(timeout_s=1.0)
        try:
            await http.get(url)
        except HttpFailure as exc:
            return exc
        finally:
            await http.aclose()
        raise AssertionError(f"{url} answered")

    failure = asyncio.run(run())
    assert failure.url == url and failure.why == "ConnectError" and str(failure) == f"{url}: ConnectError"


def test_the_agent_counts_each_scheduler_once_with_priority_scheduling_and_dp_ranks(tmp_path: Path) -> None:
    """Issue 24: SGLang labels its scheduler gauges per DP rank and, with priority scheduling, writes the total under
    ``priority=""`` beside one series per priority. Three long generations on a worker with two DP ranks and priority
    scheduling are 3 running, not 6 (the agent summed every series before)."""
    config = WorkerConfig(
        port=1, model_path=str(tmp_path / "model"), latency_ms=5000.0, jitter_ms=0.0, health_poll_s=0.2,
        priority_scheduling=True, dp_size=2,
    )  # fmt: skip
    worker = SimulatedWorker(config)

    async def run() -> tuple[int, int, float]:
        async with TestClient(TestServer(worker.build_app())) as client:
            held = [asyncio.create_task(client.post("/generate", json={"text": "a", "priority": p})) for p in (1, 2, 2)]
            running = 0
            while running < len(held):
                await asyncio.sleep(0.01)
                states = (await (await client.get("/server_info")).json())["internal_states"]
                running = sum(s["num_running_reqs"] for s in states)
            await client.put("/sim/fault", json={"token_usage": 0.4})
            agent = Agent(
                AgentConfig(
                    node="n0",
                    replicas=(("r0", str(client.make_url("")).rstrip("/"), ()),),
                    controllers=(),
                    interval_s=5.0,
                    timeout_s=2.0,
                    max_running_requests=256,
                    link_rate_gbps=400.0,
                )
            )
            try:
                [probe] = (await agent.report()).replicas
            finally:
                await agent.aclose()
            for task in held:
                task.cancel()
        assert probe.ok, probe.error
        return probe.running, probe.queued, probe.memory_usage

    assert asyncio.run(run()) == (3, 0, pytest.approx(0.4))


def probed_around(
    tmp_path: Path, latency_ms: float, between: Callable[[TestClient[Any, Any], SimulatedWorker], Awaitable[None]]
) -> tuple[ReplicaProbe, ReplicaProbe]:
    """An agent's probe of one simulated worker (``latency_ms`` a generation) before and after ``between`` ran."""
    config = WorkerConfig(
        port=1, model_path=str(tmp_path / "model"), latency_ms=latency_ms, jitter_ms=0.0, health_poll_s=0.2
    )
    worker = SimulatedWorker(config)

    async def run() -> tuple[ReplicaProbe, ReplicaProbe]:
        async with TestClient(TestServer(worker.build_app())) as client:
            agent = Agent(
                AgentConfig(
                    node="n0", replicas=(("r0", str(client.make_url("")).rstrip("/"), ()),), controllers=(),
                    interval_s=5.0, timeout_s=2.0, max_running_requests=256, link_rate_gbps=400.0,
                )
            )  # fmt: skip
            try:
                first = (await agent.report()).replicas[0]
                await between(client, worker)
                return first, (await agent.report()).replicas[0]
            finally:
                await agent.aclose()

    return asyncio.run(run())


def test_the_agent_reports_a_replicas_time_per_output_token_for_the_latency_signal(tmp_path: Path) -> None:
    """Issue 38 (report version 3): the agent reads SGLang's ``sglang:request_time_per_output_token_seconds`` _sum and
    _count (summed over their series: streaming or not, each priority), cumulative, from which the controller takes
    a replica's mean time per output token. Before the worker finished a request neither series exists
    (prometheus_client creates a labelled series at its first observation, as SGLang's collector does): the probe
    carries none, no figure. A request of one output token has no TPOT (SGLang's get_time_per_output_token)."""

    async def three(client: TestClient[Any, Any], _worker: SimulatedWorker) -> None:
        for tokens in (7, 13, 1):
            body = {"text": "a", "sampling_params": {"max_new_tokens": tokens}}
            answer = await client.post("/generate", json=body)
            assert answer.status == 200, await answer.text()

    idle, served = probed_around(tmp_path, 60.0, three)
    assert idle.ok and (idle.tpot_seconds_total, idle.tpot_requests_total) == (None, None)
    assert served.ok and served.tpot_requests_total == 2  # the one-token request has none
    # each generated for its 60 ms at least (a loaded machine's event loop may add to it, never take from it: no upper
    # bound, which would judge this machine's speed), over its tokens but the first
    assert served.tpot_seconds_total is not None and served.tpot_seconds_total >= 0.06 / 6 + 0.06 / 12


def test_the_agent_reports_a_replicas_stalled_tokens_for_the_stall_signal(tmp_path: Path) -> None:
    """Issue 38 (report version 4): the agent counts, per bound of a second or more of SGLang's
    ``sglang:inter_token_latency_seconds``, the tokens that came longer than it after their request's last output
    (count − bucket, cumulative). None before the histogram has a series; after a stream stalled 2.5 s, at least one
    token over 1 s and 2 s; the bounds nest (a token over 2 s is over 1 s)."""

    async def stalled_stream(client: TestClient[Any, Any], worker: SimulatedWorker) -> None:
        before = worker.scheduler.last_output
        body = {"text": "a", "stream": True, "sampling_params": {"max_new_tokens": 4}}
        answer = asyncio.ensure_future(client.post("/generate", json=body))
        while worker.scheduler.last_output == before:  # its first token is out
            await asyncio.sleep(0.01)
        await worker.scheduler.stall(2.5)
        assert (await answer).status == 200
        await (await answer).read()

    idle, stalled = probed_around(tmp_path, 300.0, stalled_stream)
    assert idle.ok and idle.token_gaps_over_s is None
    gaps = stalled.token_gaps_over_s
    assert stalled.ok and gaps is not None and set(gaps) == set(STALL_BOUNDS_S), gaps
    assert gaps[1.0] >= gaps[2.0] >= 1 and all(gaps[a] >= gaps[b] for a, b in itertools.pairwise(STALL_BOUNDS_S))


def test_a_simulated_boot_gives_the_reports_its_boot_id_and_the_time_since_it(tmp_path: Path) -> None:
    """The sandbox's reboot drill (SIMULATION ONLY): an agent given ``--simulated-boot`` reports that boot id and its
    monotonic clock from the simulated boot, which the controller reads as a node booted that long ago."""
    path, rebooted = tmp_path / "boot.json", "0b6e2d94-13a7-4c5f-8e20-9d4a6c1f3e58"
    booted_at = time.monotonic_ns() - 5 * 10**9  # 5 s ago on the shared clock
    path.write_text(json.dumps({"boot_id": rebooted, "booted_at_ns": booted_at}))
    agent = Agent(
        AgentConfig(node="n0", replicas=(), controllers=(), interval_s=5.0, timeout_s=2.0, max_running_requests=1,
                    link_rate_gbps=400.0),
        boot=Boot.simulated(path),
    )  # fmt: skip
    try:
        report = asyncio.run(agent.report())
    finally:
        asyncio.run(agent.aclose())
    assert report.boot_id == rebooted != Boot.of_this_machine().id
    assert 5 * 10**9 <= report.seq < time.monotonic_ns() - booted_at + 1, report.seq  # since the boot, not the kernel's


def test_wedged_scheduler_a_migration_does_not_wait_for_requests_that_never_finish(tmp_path: Path) -> None:
    """Issue 24, found by the scheduler-wedged drill: a wedged replica's /metrics still answers and shows its
    requests in flight for ever, so the controller's drain before a migration waited all of rollout.drain_timeout_s
    (restoration 30.6 s against 27 s). The drain now waits only while the replica's /health (its scheduler) answers;
    a request longer than a health check on a healthy replica is waited for."""
    waits = drain_waits(tmp_path)
    # the request on the healthy replica was in flight when the wait began, and ended (200) before it returned
    assert waits.finished == 200, waits
    # the wedged replica's wait gave up on its health, not on its timeout (the patience); how soon (within a health
    # check, 1 s) is the rehearsal's: tests/rehearsal/test_runtime_timing.py
    assert "/health_generate answers 503" in waits.gave_up and "will not finish" in waits.gave_up, waits
