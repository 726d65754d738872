"""The simulated worker serves only what the pinned SGLang serves, in SGLang's shape.

The route table and the ``/v1/loads`` fields are derived from the pinned SGLang's installed source
(tests/support/sglang_routes.py), as the flag manifests are derived from its parser: a simulated route SGLang does not
serve (``/get_load`` was one: SGLang 0.5.23 has none) or a load field it does not report fails here. The one
simulation-only route, ``/sim/fault`` (fault injection for the drills), is named and allowed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from serving.sandbox.worker import FAULT_PATH, SimulatedWorker
from serving.sandbox.worker_config import WorkerConfig
from tests.support.sglang_routes import load_snapshot_fields, routes_in, sglang_routes

SIMULATION_ONLY = {FAULT_PATH}


@pytest.fixture(scope="module")
def pinned_routes(regenerated: Path) -> set[tuple[str, str]]:
    del regenerated  # builds the SGLang venv on first use
    return sglang_routes()


def simulated_routes(tmp_path: Path) -> set[tuple[str, str]]:
    app = SimulatedWorker(WorkerConfig(port=1, model_path=str(tmp_path / "model"))).build_app()
    return {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None  # aiohttp adds HEAD to every GET
    }


def test_every_simulated_route_is_one_the_pinned_sglang_serves(
    tmp_path: Path, pinned_routes: set[tuple[str, str]]
) -> None:
    simulated = {r for r in simulated_routes(tmp_path) if r[1] not in SIMULATION_ONLY}
    assert ("GET", "/v1/loads") in pinned_routes and ("GET", "/health") in pinned_routes  # the parse found them
    assert not {p for _, p in pinned_routes} & {"/get_load", "/get_loads"}
    assert simulated - pinned_routes == set()
    assert ("GET", "/v1/loads") in simulated


def test_a_route_sglang_does_not_serve_is_caught(tmp_path: Path, pinned_routes: set[tuple[str, str]]) -> None:
    """The check can fail: sglang-router 0.3.2's /get_load, which the worker served before, is not in the table."""
    stale = simulated_routes(tmp_path) | {("GET", "/get_load")}
    assert {r for r in stale if r[1] not in SIMULATION_ONLY} - pinned_routes == {("GET", "/get_load")}


def test_the_route_parser_reads_methods_and_skips_computed_paths(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import os\n"
        '@app.api_route("/generate", methods=["POST", "PUT"])\nasync def g(): ...\n'
        '@router.get("/v1/loads")\nasync def l(): ...\n'
        '@app.post(os.environ.get("X", "/api/chat"))\nasync def c(): ...\n'
    )
    assert routes_in(module) == {("POST", "/generate"), ("PUT", "/generate"), ("GET", "/v1/loads")}


def test_v1_loads_carries_sglang_s_load_snapshot_fields(tmp_path: Path, pinned_routes: set[tuple[str, str]]) -> None:
    del pinned_routes  # the SGLang venv is built
    core, sections = load_snapshot_fields()
    worker = SimulatedWorker(WorkerConfig(port=1, model_path=str(tmp_path / "model")))

    async def ask() -> tuple[Any, Any]:
        async with TestClient(TestServer(worker.build_app())) as client:
            full = await (await client.get("/v1/loads")).json()
            only = await (await client.get("/v1/loads", params={"include": "core"})).json()
        return full, only

    body, core_only = asyncio.run(ask())
    assert set(body) == {"timestamp", "version", "accelerator", "num_accelerators", "loads"}  # v1_loads.py's answer
    [load] = body["loads"]
    shown = {k for k in load if k not in sections}
    assert shown == core, (sorted(shown - core), sorted(core - shown))
    for name in set(load) & set(sections):
        assert set(load[name]) == sections[name], name
    assert set(core_only["loads"][0]) == core


@pytest.mark.parametrize(("priority", "dp_size"), [(False, 1), (True, 2)])
def test_metrics_render_once_per_state_and_never_show_a_stale_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, priority: bool, dp_size: int
) -> None:
    """A node agent reads /metrics while its own generating health check runs, so the scheduler gauges alternate
    between one running request and none: each state is rendered once between counter updates, every answer is what a
    fresh rendering gives at its time, and a counter update (a failed generation) is shown at once."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    import serving.sandbox.worker_metrics as metrics_module

    renders = 0

    def counted(registry: Any) -> bytes:
        nonlocal renders
        renders += 1
        return generate_latest(registry)

    monkeypatch.setattr(metrics_module, "generate_latest", counted)

    def value(text: str, name: str) -> float:
        return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)

    async def scenario() -> None:
        config = WorkerConfig(
            port=1,
            model_path=str(tmp_path / "model"),
            health_poll_s=0.05,
            latency_ms=38400.0,
            priority_scheduling=priority,
            dp_size=dp_size,
        )
        worker = SimulatedWorker(config)

        def fresh() -> str:  # what the worker renders with no cache, now
            metrics, scheduler = worker.metrics, worker.scheduler
            for rank, labels in enumerate(metrics.scheduler_labels):
                metrics.export_rank(rank, labels, scheduler.load, scheduler.kv_usage())
            return generate_latest(metrics.registry).decode()

        async with TestClient(TestServer(worker.build_app())) as client:

            async def metrics() -> str:
                text = await (await client.get("/metrics")).text()
                assert text == fresh()
                return text

            for _ in range(dp_size):  # every rank's gauges now have their labels
                assert (await client.get("/health_generate")).status == 200
            idle = await metrics()
            rendered = renders
            for _ in range(3):
                check = asyncio.create_task(client.get("/health_generate"))
                await asyncio.sleep(0.1)  # the check's one-step generation (0.3 s) is running
                assert value(await metrics(), "sglang:num_running_reqs") == (2.0 if priority else 1.0)
                assert (await check).status == 200
                assert await metrics() == idle
            assert renders - rendered <= dp_size  # one running request (on whichever rank), then served from the cache
            assert (await client.put(FAULT_PATH, json={"generation_errors": True})).status == 200
            failed = await client.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}})
            assert failed.status == 500  # a counter update: sim_worker_injected_errors_total
            after = await metrics()
            assert (
                value(after, "sim_worker_injected_errors_total") == value(idle, "sim_worker_injected_errors_total") + 1
            )

    asyncio.run(scenario())
