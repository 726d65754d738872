"""Every router instance, for membership and for the gates: a sandbox with three REAL ``smg`` 1.13.0 gateway
instances (router 0 from ``exaserve sandbox up``, routers 1 and 2 started with the same rendered command,
:func:`serving.sandbox.runtime.start_extra_routers`) in front of SIMULATED SGLang workers (no GPU here), client load
spread over all three routers (each sees a third of it), and the updater run as users run it: ``exaserve rollout
--router URL`` for each instance.

* Membership (router ``/workers`` API): each batch's removal and readmission must be proved on all three before the
  next phase (the journal names each instance's seconds), and a sampler asking the three routers' worker lists
  throughout must agree.
* Gates: they scrape every instance and sum its per-worker counters. A broken release rolls back; a healthy one
  passes, and each batch's canary and baseline figures are the sum over the three instances of each instance's own
  counter deltas over the window (each instance carrying a part of them).
* SSH: fewer ``--router`` than ``scheduler.instances`` is refused before anything is touched.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from serving.cli.options import resolve_stack
from serving.render.k8s.gateway import PODS_SERVICE, cluster_router
from serving.render.k8s.gateway import render as render_gateway
from serving.rollout import session
from serving.rollout.gates.window import RouterReading
from serving.rollout.machine import Event, Outcome, Phase, Step
from serving.rollout.operation import RouterTargets, resolve_endpoints
from serving.rollout.plan import plan_rollout
from serving.rollout.runner import Reading, Runner
from serving.rollout.session import Endpoints
from serving.router.loadgen import LoadGenerator, LoadReport, LoadSpec
from serving.sandbox.backend import LocalBackend
from serving.sandbox.endpoints import sandbox_endpoints, sandbox_routers
from serving.sandbox.processes import free_port_block
from serving.sandbox.runtime import router_urls, start_extra_routers
from tests.support.cli import exaserve, json_object
from tests.support.sandbox import CI_TIER, Sandbox, running_sandbox
from tests.support.stacks import fleet_of, spec_from

REPLICAS = 4
ROUTERS = 3
CHANGES: dict[str, Any] = {
    "scheduler.instances": ROUTERS,
    "rollout.batches": 2,
    "serving.heartbeat_interval_s": 1,
    "rollout.interval_s": 2,  # the shortest soak the stack loader accepts: two of the router's 1 s load polls
    "rollout.baseline_window_s": 1.5,
    **CI_TIER,  # QPS and P99 measured, not enforced: not what this module checks (the error gate stays 0.1 %)
}
LIMITS_ERROR = 0.001  # rollout.max_error_rate
RATE_PER_ROUTER = 30.0  # requests/s sent to each router instance


class SpreadLoad:
    """Open-loop client load on every router instance at once (as clients behind a load balancer), in a thread."""

    def __init__(self, routers: list[str], max_s: float = 180) -> None:
        self.gens = [LoadGenerator(LoadSpec(url=u, rate_per_s=RATE_PER_ROUTER, duration_s=max_s, timeout_s=10))
                     for u in routers]  # fmt: skip
        self.reports: list[LoadReport] = []
        self._loop = asyncio.new_event_loop()
        self._halt = asyncio.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def all_of() -> list[LoadReport]:
            return list(await asyncio.gather(*(g.run(self._halt) for g in self.gens)))

        self.reports = self._loop.run_until_complete(all_of())

    def __enter__(self) -> SpreadLoad:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._loop.call_soon_threadsafe(self._halt.set)
        self._thread.join(30)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Sandbox, list[str]]]:
    """The sandbox and its three routers' API URLs (their metrics: :func:`serving.sandbox.endpoints.sandbox_routers`)."""
    changes = {**CHANGES, "sandbox.runtime_base_port": free_port_block(24)}
    with running_sandbox(tmp_path_factory.mktemp("routers"), replicas=REPLICAS, changes=changes) as sb:
        extra = start_extra_routers(
            sb.processes, fleet_of(sb.spec), sb.worker_urls, healthy=REPLICAS, timeout_s=60
        )  # stopped by `sandbox down` with the rest of the sandbox's processes
        yield sb, [sb.router_url, *(r.url for r in extra)]


def test_sandbox_endpoints_name_every_router_the_runtime_starts() -> None:
    spec = spec_from("sandbox", **{"scheduler.instances": ROUTERS, "sandbox.runtime": True})
    endpoints = sandbox_endpoints(spec)
    assert endpoints.routers == tuple(router_urls(spec)) and len(endpoints.routers) == ROUTERS
    assert endpoints.routers[0] == endpoints.router_url
    assert endpoints.metrics == tuple(m for _, m in sandbox_routers(spec))  # each router's own Prometheus port
    assert len(set(endpoints.metrics)) == ROUTERS
    alone = sandbox_endpoints(spec_from("sandbox", **{"scheduler.instances": ROUTERS, "sandbox.runtime": False}))
    assert (alone.routers, alone.metrics) == ((endpoints.router_url,), (endpoints.metrics_url,))


def test_each_batch_leaves_and_rejoins_every_router_before_the_next_phase(
    sandbox: tuple[Sandbox, list[str]],
) -> None:
    sb, routers = sandbox
    samples: list[tuple[float, float, list[list[str]]]] = []  # (asked at, answered at, each router's routed URLs)
    stop = threading.Event()

    def sample() -> None:
        with httpx.Client(timeout=5) as client:
            while not stop.is_set():
                asked = time.time()
                # in rotation: smg keeps a removed worker listed, draining, for its drain_settle_secs
                lists = [
                    [w["url"] for w in client.get(u + "/workers").json()["workers"] if w["status"] != "draining"]
                    for u in routers
                ]
                samples.append((asked, time.time(), lists))
                time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        with SpreadLoad(routers) as load:
            every = [arg for url in routers for arg in ("--router", url)]
            result = sb.cli("rollout", "--to", "v2", "--json", *every, timeout_s=240)
    finally:
        stop.set()
        sampler.join(10)
    assert result.returncode == 0, result.stdout + result.stderr
    assert json_object(result)["outcome"] == "completed"
    assert [r.count > 0 for r in load.reports] == [True] * ROUTERS

    lines = sb.paths.journal_path.read_text().splitlines()
    rollout = json.loads(lines[0])["plan"]
    events = [json.loads(line)["event"] for line in lines[1:]]
    url_of = {
        r.id: url for r, url in zip(fleet_of(sb.spec).plan.replicas, sb.worker_urls, strict=True)
    }  # replica order
    evidence: dict[str, str] = {}
    for batch in rollout["batches"]:
        index, urls = batch["index"], {url_of[r] for r in batch["replicas"]}
        at: dict[str, float] = {}
        for i, ev in enumerate(events):
            step = ev.get("step") or {}
            if step.get("batch") == index and not step.get("rollback"):
                phase = step["phase"]
                if phase == Phase.READMIT.value:
                    at["readmit began"] = events[i - 1]["at"]  # the step before it ended: readmission starts
                for p, change in ((Phase.REMOVE.value, "removed"), (Phase.READMIT.value, "added")):
                    if phase == p:
                        assert ev["kind"] == "done", ev
                        assert ev["detail"].startswith(f"{change} on every router ({ROUTERS}): "), ev["detail"]
                        assert all(f"{u} " in ev["detail"] for u in routers), ev["detail"]
                        at[p] = ev["at"]
                        evidence[f"batch {index} {change}"] = ev["detail"]
        for r, url in enumerate(routers):
            # while the batch is out (removal proved → readmission begun) no router lists it, and each router was
            # seen without it (the sampler saw the removal on every instance)
            out = [s for s in samples if s[0] > at[Phase.REMOVE.value] and s[1] < at["readmit began"]]
            assert out, f"no sample of router {url} while batch {index} was out"
            assert all(not (urls & set(s[2][r])) for s in out), (url, index)
    final = [httpx.get(u + "/workers", timeout=5).json()["workers"] for u in routers]
    for workers in final:  # every replica once on every router, healthy: nothing double-registered
        assert sorted(w["url"] for w in workers) == sorted(sb.worker_urls)
        assert all(w["is_healthy"] for w in workers)
    assert set(sb.versions().values()) == {"v2"}
    print(json.dumps(evidence, indent=1))  # the per-router evidence, as the journal has it


class Recording(Runner):
    """The updater's own runner, keeping the two full reads of every router instance that bound each judged soak."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.full_reads: list[Reading] = []
        self.windows: list[tuple[Event, Reading, Reading]] = []  # (verdict event, start, end)

    async def _read(self, urls: Mapping[str, str], *, workers: bool) -> Reading:
        reading = await super()._read(urls, workers=workers)
        if workers:
            self.full_reads.append(reading)
        return reading

    async def _soak(self, step: Step) -> Event | None:
        event = await super()._soak(step)
        if event is not None and event.gates is not None and event.gates.verdict is not None:
            # the window it judged: the last full read, and the one the judged seconds before it (a soak judged early
            # and soaked on, or measured again after a router restart, made more full reads)
            end = self.full_reads[-1]
            assert event.gates.canary is not None
            start = next(r for r in self.full_reads if math.isclose(end.at - r.at, event.gates.canary.seconds))
            self.windows.append((event, start, end))
        return event


def rollout_to(sb: Sandbox, routers: list[str], version: str, monkeypatch: pytest.MonkeyPatch) -> tuple[
    session.RunResult, Recording, list[Event]]:  # fmt: skip
    """A gated rollout of the whole fleet to ``version`` through :func:`serving.rollout.session.run` (what ``exaserve
    rollout`` runs) with every router instance given by API URL, under load spread over them."""
    spec = sb.spec
    fleet = fleet_of(spec, spec.cluster.name)
    (current,) = set(sb.versions().values())
    rollout = plan_rollout(fleet, from_version=current, to_version=version)
    known = dict(sandbox_routers(spec))
    endpoints = Endpoints(tuple(routers), tuple(known[r] for r in routers))
    made: list[Recording] = []
    events: list[Event] = []
    monkeypatch.setattr(session, "Runner", lambda *a, **k: made.append(Recording(*a, **k)) or made[-1])

    async def run() -> session.RunResult:
        backend = LocalBackend(fleet, sb.paths.sandbox_dir)
        try:
            return await session.run(sb.paths, backend, endpoints, fleet=[r.id for r in fleet.plan.replicas],
                                     plan=rollout, progress=lambda p: events.append(p.event) if p.event else None)  # fmt: skip
        finally:
            await backend.aclose()

    with SpreadLoad(routers) as load:
        result = asyncio.run(run())
    assert [r.count > 0 for r in load.reports] == [True] * ROUTERS
    return result, made[0], events


def summed(start: Reading, end: Reading, urls: set[str]) -> dict[str, tuple[float, float]]:
    """Router instance → (successes, failures) of the ``urls`` over the window, from that instance's own counters."""
    out = {}
    for router, after in end.routers.items():
        before: RouterReading = start.routers[router]
        out[router] = tuple(
            sum(after.outcomes.get(u, (0.0, 0.0))[i] - before.outcomes.get(u, (0.0, 0.0))[i] for u in urls)
            for i in (0, 1)
        )
    return out  # type: ignore[return-value]


def test_the_gates_sum_every_router_instance_a_broken_release_rolls_back_a_healthy_one_passes(
    sandbox: tuple[Sandbox, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    sb, routers = sandbox
    stable = set(sb.versions().values())

    broken, _, events = rollout_to(sb, routers, "v2-broken", monkeypatch)
    assert broken.state.outcome is Outcome.ROLLED_BACK, broken.state.reason
    failed = [e for e in events if e.kind == "failed"]
    assert failed and failed[0].gates is not None and failed[0].gates.error_rate > LIMITS_ERROR, failed[0].detail
    assert set(sb.versions().values()) == stable, "the broken release was rolled back"

    target = "v1" if stable == {"v2"} else "v2"
    healthy, runner, events = rollout_to(sb, routers, target, monkeypatch)
    assert healthy.state.outcome is Outcome.COMPLETED, (healthy.state.reason, [e.detail for e in events[-3:]])
    assert set(sb.versions().values()) == {target}
    assert len(runner.windows) == CHANGES["rollout.batches"]
    url_of = {r: runner.backend.worker_url(r) for r in healthy.state.plan.replicas}
    for event, start, end in runner.windows:
        gates = event.gates
        assert gates is not None and gates.canary is not None and gates.baseline is not None
        assert gates.verdict is not None and gates.verdict.decision == "pass", gates.verdict
        assert sorted(end.routers) == sorted(routers)  # every instance was read, by its API URL …
        for group in (gates.canary, gates.baseline):
            per_router = summed(start, end, {url_of[r] for r in group.replicas})
            # … each carried a part of the group's traffic (load went through all three) …
            assert all(ok > 0 for ok, _ in per_router.values()), per_router
            # … and the group's figures are the sum over the instances, never one instance's share.
            assert group.requests == sum(ok + bad for ok, bad in per_router.values()), (group, per_router)
            assert group.errors == sum(bad for _, bad in per_router.values())
            assert all(ok + bad < group.requests for ok, bad in per_router.values())
        print(f"batch {event.step.batch if event.step else '?'}: canary {gates.canary.requests:.0f} attempts = "
              + " + ".join(f"{sum(v):.0f}" for v in summed(start, end, {url_of[r] for r in gates.canary.replicas}).values())
              + f" over {len(routers)} routers")  # fmt: skip


def test_a_kubernetes_rollout_reaches_every_router_pod_through_the_gateways_headless_service() -> None:
    """Without ``--router``/``--router-service`` the updater resolves the gateway's headless Service (one address per
    router pod), never the ClusterIP Service that reaches one of them; the gates read each pod's Prometheus listener
    on the port the gateway renders (or ``--router-metrics-port``)."""
    st = resolve_stack("dev", None)
    fleet = fleet_of(st.spec, st.name)
    endpoints = resolve_endpoints(fleet, "kubernetes", RouterTargets())
    service = next(o for o in render_gateway(fleet) if o["metadata"]["name"] == PODS_SERVICE)
    assert service["spec"]["clusterIP"] == "None"
    assert endpoints.router_service == f"{PODS_SERVICE}.exaserve.svc:{service['spec']['ports'][0]['port']}"
    routers = endpoints.router_set()
    assert routers.routers == []  # the Service's addresses only, resolved before each change and each read
    metrics_port = cluster_router(fleet).metrics_port
    assert routers.metrics_url("http://10.1.2.3:30000") == f"http://10.1.2.3:{metrics_port}/metrics"
    assert routers.metrics_url("http://[fd00::7]:30000") == f"http://[fd00::7]:{metrics_port}/metrics"
    explicit = resolve_endpoints(
        fleet, "kubernetes", RouterTargets(("http://r0:30000", "http://r1:30000"), metrics_port=9100)
    )
    assert (explicit.routers, explicit.router_service) == (("http://r0:30000", "http://r1:30000"), None)
    assert explicit.router_set().metrics_url("http://r1:30000") == "http://r1:9100/metrics"


def test_an_ssh_rollout_with_fewer_routers_than_the_stack_runs_is_refused(tmp_path: Path) -> None:
    """The dev stack runs ``scheduler.instances`` = 2 routers and names no router hosts: one ``--router`` would move
    replicas on half the routers and gate on half the traffic, so it exits 2 naming both numbers and the fix, before
    any host or state is touched."""
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    args = ["rollout", "--stack", "dev", "--backend", "ssh", "--known-hosts", str(known_hosts), "--to", "v1",
            "--state-dir", str(tmp_path / "state")]  # fmt: skip
    result = exaserve(*args, "--router", "http://10.0.0.1:30000")
    assert result.returncode == 2, result.stdout + result.stderr
    said = " ".join(result.stderr.split())  # the error console wraps long lines
    assert "1 --router given, but the stack runs scheduler.instances = 2 router instances" in said
    assert "Pass --router http://HOST:PORT once for each router instance" in said
    assert "Traceback" not in said and not (tmp_path / "state").exists()
    none = exaserve(*args)
    assert none.returncode == 2 and "0 --router given" in none.stderr, none.stderr
