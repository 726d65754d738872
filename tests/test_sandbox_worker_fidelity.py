"""The simulated worker is no kinder than the pinned SGLang 0.5.23: its ``/health`` and its metrics, held against the
installed source (tests/support/sglang_worker_facts.py parses it; the route table is tests/test_sandbox_worker_routes.py).

- ``/health`` (``http_server.py`` ``health_generate``): the same two paths, answered by one handler; only 200 or 503,
  in every state and fault of the worker; a one-token generation through the scheduler, polled after SGLang's sleep,
  so a healthy answer takes at least one poll period; 503 once the scheduler answered nothing for the timeout
  (a wedged scheduler), while HTTP, ``/metrics`` and ``/model_info`` still answer; 200 while generations fail.
- Metrics (``metrics_collector.py``): every ``sglang:`` family the worker exports is one SGLang's scheduler or
  tokenizer collector declares, of the same type, with exactly the labels SGLang puts on it — with and without
  priority scheduling and data-parallel ranks.

Each fails on the worker before issue 24: it answered ``/health`` at once (no poll, no scheduler), 500 under the
error fault, had no wedged scheduler, and labelled its metrics ``model_name`` only.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

from serving.render.sglang import server_env
from serving.router.client import WORKER_QUEUED, WORKER_RUNNING, HistogramSnapshot, MetricsSnapshot
from serving.runtime.agent import PROBED_METRICS
from serving.sandbox.backend import worker_config
from serving.sandbox.worker import HEALTH_PATHS, SimulatedWorker
from serving.sandbox.worker_config import HEALTH_CHECK_TIMEOUT_S, HEALTH_MAX_NEW_TOKENS, WorkerConfig
from serving.sglang_health import HEALTH_ENDPOINT_GENERATION, HEALTH_PATH, HEALTH_POLL_S
from serving.sglang_metrics import FORCE_STREAM_INTERVAL, INTER_TOKEN_LATENCY, ITL_BUCKETS_S, gaps_over
from serving.spec.stack import load_stack
from tests.support.sglang_routes import sglang_source
from tests.support.sglang_worker_facts import (
    SCHEDULER,
    CollectorLabels,
    HealthFacts,
    MetricFamily,
    collector_labels,
    health_facts,
    metric_families,
)
from tests.support.sim_worker import (
    FLAP_STALL_S,
    POLL_S,
    TIMEOUT_S,
    cheap_and_scheduler_health,
    flapping_scheduler,
    healthy_then_wedged,
    make_worker,
    timed_health,
    with_client,
)
from tests.support.stacks import fleet_of

STALL_S = 2.5  # a stall the stall signal's default bound (2 s) counts


@pytest.fixture(scope="module")
def health(regenerated: Path) -> HealthFacts:
    del regenerated  # builds the SGLang venv on first use
    return health_facts()


def test_health_serves_sglang_s_paths_and_polls_as_it_does(health: HealthFacts) -> None:
    assert health.paths == set(HEALTH_PATHS) == {"/health", "/health_generate"}
    assert health.generates and health.max_new_tokens == HEALTH_MAX_NEW_TOKENS == 1
    assert health.poll_s == (HEALTH_POLL_S,) == (1.0,)
    assert health.timeout_default_s == HEALTH_CHECK_TIMEOUT_S == 20.0
    defaults = WorkerConfig(port=1)
    assert (defaults.health_poll_s, defaults.health_timeout_s) == (HEALTH_POLL_S, HEALTH_CHECK_TIMEOUT_S)


def test_a_healthy_answer_takes_a_poll_period_and_needs_the_scheduler(tmp_path: Path, health: HealthFacts) -> None:
    """200 after one poll (SGLang: ≥ 1 s); with the scheduler wedged, 503 after the timeout while /model_info and
    /metrics answer and a generation does not complete; healthy again once the scheduler runs."""
    seen = healthy_then_wedged(tmp_path, health.paths)
    for status, took in seen["healthy"]:
        assert status == 200 and took >= POLL_S, seen
    status, took = seen["wedged"]
    assert status == 503 and took >= TIMEOUT_S, seen  # not before its timeout; how soon after: the rehearsal's
    assert (seen["model_info"], seen["metrics"], seen["generation_done"]) == (200, 200, False), seen
    assert seen["generation"] == 200 and seen["again"][0] == 200, seen


def test_health_without_generation_is_sglang_s_switch_and_what_the_sandbox_runs(
    tmp_path: Path, health: HealthFacts
) -> None:
    """SGLang answers ``/health`` 200 at once, without a generation, when SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION is
    false (the rendered servers set it: the routers' cheap check); ``/health_generate`` still needs the scheduler. The
    sandbox's workers run as rendered; a wedged scheduler then passes ``/health`` and fails ``/health_generate``."""
    assert health.generation_switch == ("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", HEALTH_PATH)
    spec = load_stack("sandbox").spec
    fleet = fleet_of(spec)
    rendered = server_env(fleet, fleet.plan.replicas[0])["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"]
    assert rendered == str(HEALTH_ENDPOINT_GENERATION).lower() == "false"
    assert worker_config(spec, fleet.plan.replicas[0], "v1").health_generation is HEALTH_ENDPOINT_GENERATION
    seen = cheap_and_scheduler_health(tmp_path)
    # the cheap check needs no scheduler (200 with it wedged); that it answers within a poll: the rehearsal's
    assert seen["cheap"][0] == 200, seen
    assert seen["scheduler"][0] == 200 and seen["scheduler"][1] >= POLL_S, seen
    assert seen["wedged_cheap"][0] == 200 and seen["wedged_scheduler"][0] == 503, seen


def test_health_answers_only_what_sglang_answers_in_every_state(tmp_path: Path, health: HealthFacts) -> None:
    """Starting, ready, every fault (the error fault included, which answered 500 before), shutting down."""
    codes: set[int] = set()
    starting = make_worker(tmp_path, warmup_s=60.0)

    async def warming(client: TestClient[Any, Any]) -> None:
        codes.add((await client.get("/health")).status)

    with_client(starting, warming)
    worker = make_worker(tmp_path)
    faults = [
        {"errors": True},
        {"generation_errors": True},
        {"wedged": True},
        {"flap_stall_s": FLAP_STALL_S},
        {"delay_ms": 10.0},
        {"token_usage": 0.99},
    ]

    async def each(client: TestClient[Any, Any]) -> None:
        codes.add((await client.get("/health")).status)
        for fault in faults:
            await client.put("/sim/fault", json=fault)
            codes.add((await client.get("/health")).status)
        await client.delete("/sim/fault")
        worker.begin_shutdown()
        codes.add((await client.get("/health")).status)

    with_client(worker, each)
    assert codes == health.status_codes == {200, 503}


def test_generation_errors_leave_health_fine(tmp_path: Path, health: HealthFacts) -> None:
    """The scheduler runs, so SGLang's /health answers 200 while every generation fails."""
    del health
    worker = make_worker(tmp_path)

    async def body(client: TestClient[Any, Any]) -> tuple[list[int], tuple[int, float], str]:
        await client.put("/sim/fault", json={"generation_errors": True})
        failed = [(await client.post("/generate", json={"text": "hello"})).status for _ in range(3)]
        return failed, await timed_health(client), await (await client.get("/metrics")).text()

    failed, (status, took), text = with_client(worker, body)
    assert failed == [500, 500, 500] and status == 200 and took >= POLL_S
    [injected] = [f for f in text_string_to_metric_families(text) if f.name == "sim_worker_injected_errors"]
    assert sum(s.value for s in injected.samples if s.name.endswith("_total")) == 3


def test_a_flapping_scheduler_stalls_at_every_other_check_failing_it_and_holding_up_generations(
    tmp_path: Path,
) -> None:
    """``flap_stall_s``: the 1st, 3rd … ``/health_generate`` after the fault find the scheduler stalled that long, so
    no output comes (SGLang's 503 after its timeout) and a generation sent meanwhile finishes only after the stall;
    the 2nd, 4th … answer 200 after their poll; the cheap ``/health`` (generation off, as rendered) answers at once;
    without the fault every check passes. Before this change the fault answered 503 while generations flowed, a
    state SGLang cannot be in: its check passes on any request's output."""
    seen = flapping_scheduler(tmp_path)
    assert seen["before"][0] == 200, seen
    assert seen["first"][0] == 503 and seen["first"][1] >= TIMEOUT_S, seen  # no output for its whole timeout
    status, took = seen["generation"]
    assert status == 200 and took >= FLAP_STALL_S - 0.05 - 0.1, seen  # held up until the stall ended
    # the cheap check answered during the stall, before the stalled check; within a poll: the rehearsal's
    assert seen["cheap"][0] == 200 and seen["order"] == ["cheap", "first"], seen
    assert seen["checks"] == [200, 503, 200, 503], seen
    assert seen["after"] == [200, 200], seen


def _exported(worker: SimulatedWorker) -> dict[str, Any]:
    async def body(client: TestClient[Any, Any]) -> str:
        await asyncio.gather(*(client.post("/generate", json={"text": "a b", "priority": p}) for p in (1, 2, 2)))
        streamed = {"text": "a b", "priority": 2, "stream": True, "sampling_params": {"max_new_tokens": 3}}
        await (await client.post("/generate", json=streamed)).read()  # its later tokens: inter-token latency
        return await (await client.get("/metrics")).text()

    return {f.name: f for f in text_string_to_metric_families(with_client(worker, body))}


def _declared(families: dict[str, MetricFamily], name: str, kind: str) -> MetricFamily:
    """SGLang's declaration of an exported family (prometheus_client drops a counter's ``_total`` from its name)."""
    declared = families.get(name + "_total" if kind == "counter" else name) or families.get(name)
    assert declared is not None, f"{name}: the pinned SGLang declares no such metric"
    return declared


@pytest.mark.parametrize(("priority", "dp_size"), [(False, 1), (True, 2)])
def test_metrics_carry_sglang_s_names_and_label_sets(
    tmp_path: Path, health: HealthFacts, priority: bool, dp_size: int
) -> None:
    del health
    families, own = metric_families(), collector_labels()
    exported = _exported(make_worker(tmp_path, priority_scheduling=priority, dp_size=dp_size))
    sglang = {name: f for name, f in exported.items() if name.startswith("sglang:")}
    # what the agent reads: a counter's family and a histogram's, whose _sum and _count it reads
    assert {n.removesuffix("_total").removesuffix("_sum").removesuffix("_count") for n in PROBED_METRICS} <= set(sglang)

    def expected(labels: CollectorLabels) -> set[str]:
        on = {"priority"} if priority else set()
        return set(labels.always) | (on | ({"dp_rank"} if dp_size > 1 else set())) & set(labels.optional)

    for name, family in sglang.items():
        # prometheus_client (SGLang's library too) writes a counter's and a histogram's start time as X_created
        created = name.endswith("_created") and name.removesuffix("_created") in sglang
        base = name.removesuffix("_created") if created else name
        declared = _declared(families, base, sglang[base].type)
        assert created or declared.kind.lower() == family.type, (name, declared.kind, family.type)
        want = expected(own[declared.collector]) | set(declared.extra_labels)
        for sample in family.samples:
            shown = set(sample.labels) - {"le"}
            assert shown == want, (name, sample.name, sorted(shown ^ want))
    for gauge in (WORKER_RUNNING, WORKER_QUEUED):
        ranks = {s.labels.get("dp_rank") for s in sglang[gauge].samples}
        assert len(ranks) == dp_size and _declared(families, gauge, "gauge").collector == SCHEDULER
        if priority:  # the total under priority="", each priority under its own value: summing all double-counts
            assert {s.labels["priority"] for s in sglang[gauge].samples} == {"", "1", "2"}


def test_a_wedged_scheduler_s_loads_and_gauges_freeze_at_its_last_publication(tmp_path: Path) -> None:
    """Issue 39: SGLang's ``/v1/loads`` and its scheduler gauges are what the scheduler loop last published
    (``publish_load_snapshot`` after each batch and at least every ``LOAD_STALL_REFRESH_S`` while not idle); a wedged
    scheduler publishes nothing, so its figures and their timestamp freeze while requests pile up unseen (smg's
    overload check, which reads ``num_waiting_reqs``, never sees the pile). The simulated worker computed them live:
    its queue showed, and smg took the wedged worker out sooner than it would a real one."""
    scheduler_py = (sglang_source() / "srt" / "managers" / "scheduler.py").read_text()
    assert "LOAD_STALL_REFRESH_S = 0.05" in scheduler_py
    assert scheduler_py.count("self.publish_load_snapshot(") >= 2  # after a batch; in on_idle's stall refresh
    worker = make_worker(tmp_path, max_running_requests=1)

    async def loads(client: TestClient[Any, Any]) -> dict[str, Any]:
        [load] = (await (await client.get("/v1/loads")).json())["loads"]
        return dict(load)

    async def queued(client: TestClient[Any, Any]) -> float:
        text = await (await client.get("/metrics")).text()
        [family] = [f for f in text_string_to_metric_families(text) if f.name == WORKER_QUEUED]
        return sum(s.value for s in family.samples)

    async def body(client: TestClient[Any, Any]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        first = asyncio.create_task(
            client.post("/generate", json={"text": "a", "sampling_params": {"max_new_tokens": 1}})
        )
        await asyncio.sleep(0.001)  # the first request is admitted: it runs, one slot
        await client.put("/sim/fault", json={"wedged": True})
        seen["at_wedge"] = await loads(client)
        seen["queued_at_wedge"] = await queued(client)
        piled = [asyncio.create_task(client.post("/generate", json={"text": "b"})) for _ in range(4)]
        await asyncio.sleep(0.05)  # SGLang's refresh floor: a running scheduler would have published by now
        seen["wedged"] = await loads(client)
        seen["queued_wedged"] = await queued(client)
        seen["live_waiting"] = worker.scheduler.waiting
        await client.delete("/sim/fault")
        seen["running_again"] = await loads(client)
        await asyncio.gather(first, *piled)
        return seen

    seen = with_client(worker, body)
    assert seen["live_waiting"] >= 4, "the requests piled up behind the wedge"
    assert seen["wedged"] == seen["at_wedge"], "frozen: figures and timestamp as the scheduler stopped"
    assert seen["queued_wedged"] == seen["queued_at_wedge"] and seen["wedged"]["num_waiting_reqs"] < 4
    after = seen["running_again"]
    assert after["timestamp"] > seen["at_wedge"]["timestamp"] and after["num_waiting_reqs"] >= 3, after


def test_inter_token_latency_is_observed_as_sglang_does_and_a_stall_shows_only_in_a_stream(tmp_path: Path) -> None:
    """The stall signal's source (issue 38): SGLang 0.5.23 observes ``sglang:inter_token_latency_seconds`` at each
    output of a request after its first, the interval over the tokens it brought, once per token, the interval into
    the sum (``observe_inter_token_latency``), in its default buckets (``bucket_inter_token_latency``); a non-streamed
    request's outputs come every ``SGLANG_FORCE_STREAM_INTERVAL`` tokens. Each is read from the pinned source, and the
    simulated worker's histogram after a stall is held to it: a stream's token after the stall is one observation
    of the stall's length (so the agents count it), a non-streamed request's is spread over its 50 tokens."""
    source = sglang_source() / "srt"
    collector = (source / "observability" / "metrics_collector.py").read_text()
    [observe] = [
        f for f in ast.walk(ast.parse(collector)) if isinstance(f, ast.FunctionDef) and f.name == "observe_inter_token_latency"
    ]  # fmt: skip
    text = ast.unparse(observe)
    assert "adjusted_interval = internval / num_new_tokens" in text and "his._sum.inc(internval)" in text, text
    assert "his._buckets[i].inc(num_new_tokens)" in text, text
    [default] = [
        n.body[0].value
        for n in ast.walk(ast.parse(collector))
        if isinstance(n, ast.If) and ast.unparse(n.test) == "bucket_inter_token_latency is None"
    ]
    assert tuple(ast.literal_eval(default)) == ITL_BUCKETS_S
    environ = (source / "environ.py").read_text()
    assert f"SGLANG_FORCE_STREAM_INTERVAL = EnvInt({FORCE_STREAM_INTERVAL})" in environ
    streamer = (source / "managers" / "scheduler_components" / "output_streamer.py").read_text()
    assert "default_force_stream_interval=DEFAULT_FORCE_STREAM_INTERVAL" in streamer

    worker = make_worker(tmp_path, latency_ms=300.0, jitter_ms=0.0)

    async def stalled(client: TestClient[Any, Any], stream: bool, tokens: int) -> None:
        body = {"text": "a", "stream": stream, "sampling_params": {"max_new_tokens": tokens}}
        before = worker.scheduler.last_output
        answer = asyncio.ensure_future(client.post("/generate", json=body))
        while worker.scheduler.last_output == before:  # its first output is out: the next one waits out the stall
            await asyncio.sleep(0.01)
        await worker.scheduler.stall(STALL_S)
        await (await answer).read()

    async def body(client: TestClient[Any, Any]) -> list[HistogramSnapshot]:
        seen = []
        for stream, tokens in ((False, 120), (True, 6)):
            await stalled(client, stream, tokens)
            exposition = await (await client.get("/metrics")).text()
            seen.append(MetricsSnapshot.parse(exposition).histogram(INTER_TOKEN_LATENCY))
        return seen

    plain, streamed = with_client(worker, body)
    # 120 tokens not streamed: outputs at 50, 100 and 120 tokens, the last two observed (70 observations); the stall
    # is one of their intervals, over 50 or 20 tokens: every observation under a second
    assert plain.count == 70 and dict(plain.buckets)[1.0] == 70, plain
    # 6 streamed tokens: 5 more observations, the one after the stall at least its length
    assert streamed.count == 75 and streamed.sum >= plain.sum + STALL_S, streamed
    over = gaps_over(streamed.buckets, streamed.count)
    assert over[1.0] >= 1 and over[2.0] >= 1, over
