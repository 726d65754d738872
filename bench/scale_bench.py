"""Benchmark: the rehearsal at the reference size — the prod stack's 2,048 replicas (256 nodes) as SIMULATED SGLang
workers (256 per process) behind 3 REAL smg 1.13 gateway instances, 3 REAL controllers on a REAL etcd and 256 node agents
(``exaserve sandbox up --stack prod --simulate``), on one machine, all four sections on one sandbox.

    PYTHONPATH=. .venv/bin/python bench/scale_bench.py [--replicas 2048] [--rate 100] [--sections S,…] [--json]

``--sections`` picks of ``reference,rollout,node-loss,scheduling`` (default all; each runs after ``sandbox up``).
``sandbox up`` measures this machine's CPU costs first and refuses a size whose steady state needs more than
``--cpu-share`` of the cores (default 0.5), naming the replicas the machine holds: the bench then runs at that size,
less 10 %, and prints the refusal first (docs/scale.md, *The CPU bound*).

1. ``sandbox up``'s wall time and each router's CPU time to register the workers; then over four heartbeats: each
   router's memory, open files, CPU share and health checks by result, the healthy workers each router lists; the
   requests the workers served (counted inside the worker processes by path and client: the routers' and the agents'
   health checks against their intervals); controller-0's messages per second against the planner's
   ``aggregated_per_s``/``direct_per_s`` and the replicas probed per message (the aggregation ratio); every kind of
   process's CPU and memory, CPU per worker request and per agent probe.
2. The 5-batch rollout of every replica (``exaserve rollout --to rehearsal``, the stack's waits ÷ 60) under ``--rate``
   client requests per second, paused (SIGINT) after ``--rollout-batches`` batches (default 1: at 2,048 a batch takes
   ~7 min here, the routers' ring rebuilds, docs/scale.md; 0 runs all five) and the rest extrapolated from them: wall
   time, overhead ratio, each batch's removal from and readmission to every router, router API calls per batch and
   their latency in the router, client errors.
3. Node loss: one node's 8 workers stopped (in-flight requests cut, as by a kill) under ``--rate``: when the routers
   mark them unhealthy, when the controller takes them out of every router and migrates them, client errors.
4. The controller's scheduling period: a controller instance (the same ``ControllerService`` ``exaserve controller
   run`` runs, a follower on the sandbox's etcd) in its own process, fed by real agents in two others — one per node
   (aggregated) or one per replica (direct), for half and all of the replicas, at ``scheduler.period_ms`` and at
   10 ms: how late each period of its ``_load_loop`` runs (p50/p99/max), the work per period, its CPU share, the
   messages it receives. The sandbox's own agents are stopped first.

Prints figures; asserts nothing. A section that fails prints the figures measured before it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from serving.plan.loader import load_fleet
from serving.rollout.journal import load_state
from serving.router.loadgen import LoadGenerator, LoadSpec
from serving.router.membership import RouterSet
from serving.runtime.agent import Agent, AgentConfig
from serving.runtime.leader import EtcdElection
from serving.runtime.service import ControllerService
from serving.sandbox.processes import (
    ProcessRecord,
    SandboxError,
    StateDir,
    cpu_seconds,
    free_port,
    rss_mib,
    stop_process,
)
from serving.sandbox.runtime import etcd_url, router_urls
from serving.sandbox.worker_host import request_counts, stop_hosted
from serving.sglang_health import SCHEDULER_HEALTH_PATH
from serving.spec.schema import FleetSpec
from serving.spec.stack import load_stack_file
from tests.support.cli import exaserve, exaserve_started, flat, json_object
from tests.support.controllers import leading_controller, status
from tests.support.paths import REPO
from tests.support.stacks import stack_doc, write_variant

SECTIONS = ("reference", "rollout", "node-loss", "scheduling")
TRIAL_S = 15.0  # measured, after one heartbeat interval (+ 1 s) from the probe's first report
JITTER_SHARE = 0.10  # a period "jitters" when its p99 lateness exceeds this share of the period
ROUTER_CLIENT = "-"  # the router sends no User-Agent; the agents are exaserve-agent, the updater python-httpx
# an agent's probe as a worker host counts it (method, path, client): the scheduler's health, which the agents ask
# (counted as /health until they moved to /health_generate, the bench then saw no probe and 2e11 ms of CPU per probe)
AGENT_PROBE = f"GET {SCHEDULER_HEALTH_PATH} exaserve-agent"


# ----- process figures -------------------------------------------------------------------------------------------
def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def machine() -> dict[str, Any]:
    load = Path("/proc/loadavg").read_text().split()[:3]
    return {"cores": os.cpu_count(), "loadavg_1_5_15": [float(x) for x in load]}


# ----- the sandbox -------------------------------------------------------------------------------------------------
def source_stack(directory: Path, replicas: int, heartbeat_s: float | None = None) -> Path:
    """The prod stack, or the prod stack cut to ``replicas`` (whole nodes, racks dividing them) and a heartbeat."""
    doc = stack_doc("prod")
    per_node = int(doc["serving"]["replicas_per_node"])
    if replicas == int(doc["serving"]["replicas"]) and heartbeat_s is None:
        return REPO / "Pulumi.prod.yaml"
    nodes = math.ceil(replicas / per_node)
    changes: dict[str, Any] = {
        "cluster.pools.0.count": nodes,
        "cluster.pools.0.racks": math.gcd(nodes, int(doc["cluster"]["pools"][0]["racks"])),
        "serving.replicas": replicas,
        "serving.target_replicas": replicas,
    }
    if heartbeat_s is not None:
        changes["serving.heartbeat_interval_s"] = heartbeat_s
    directory.mkdir(parents=True, exist_ok=True)
    return write_variant(directory, "prod", changes=changes)


class TooSlow(RuntimeError):
    """``sandbox up`` refused the size for CPU, naming the replicas this machine holds."""

    def __init__(self, fits: int, message: str) -> None:
        super().__init__(message)
        self.fits = fits


class Scale:
    """``sandbox up --simulate`` of ``source`` under ``state_dir``; ``sandbox down`` on exit."""

    def __init__(self, source: Path, state_dir: Path, cpu_share: float) -> None:
        self.source, self.env = source, {"EXASERVE_STATE_DIR": str(state_dir)}
        self.state_dir, self.cpu_share = state_dir, cpu_share
        self.up_s = 0.0
        self.cpu: dict[str, Any] = {}  # sandbox up's measured costs and the steady state's cores it predicts

    def __enter__(self) -> Scale:
        t0 = time.monotonic()
        up = exaserve(
            "sandbox", "up", "--stack-file", str(self.source), "--simulate", "--cpu-share", f"{self.cpu_share:g}",
            "--json", env=self.env, timeout_s=1500,
        )  # fmt: skip
        self.up_s = time.monotonic() - t0
        if up.returncode != 0:
            self.__exit__()
            if up.returncode == 2 and (fits := re.search(r"holds about ([\d,]+) replicas", flat(up.stderr))):
                raise TooSlow(int(fits[1].replace(",", "")), flat(up.stderr).split("error: ", 1)[-1])
            raise RuntimeError(f"sandbox up failed ({up.returncode}): {up.stderr[-3000:]}")
        doc = json_object(up)
        stack = load_stack_file(Path(doc["stack_file"]))
        self.stack_file, self.spec, self.name = stack.path, stack.spec, stack.name
        self.plan = load_fleet(stack.name, stack.spec).plan
        self.state = StateDir(state_dir_of(self.state_dir, stack.name))
        self.router_url = doc["router_url"]
        self.cpu = doc["cpu"]
        return self

    def __exit__(self, *_exc: object) -> None:
        down = exaserve(
            "sandbox", "down", "--stack-file", str(self.source), "--simulate", "--json", env=self.env, timeout_s=600
        )
        if down.returncode != 0:
            print(f"sandbox down failed: {down.stderr[-2000:]}", file=sys.stderr)

    def records(self, kind: str) -> list[ProcessRecord]:
        return [r for r in self.state.records() if r.kind == kind]

    def cli(self, *args: str, timeout_s: float = 1800) -> subprocess.CompletedProcess[str]:
        return exaserve(*args, "--stack-file", str(self.stack_file), env=self.env, timeout_s=timeout_s)


def state_dir_of(root: Path, stack: str) -> Path:
    return root / stack / "sandbox"


def leader(sc: Scale) -> dict[str, Any]:
    return leading_controller(sc.spec, timeout_s=30, request_timeout_s=30)


def host_counts(sc: Scale) -> dict[str, int]:
    """Requests every worker host counted, summed (``METHOD PATH CLIENT`` → count)."""
    return asyncio.run(request_counts(sc.records("worker-host")))


def cpu_of(records: list[ProcessRecord]) -> float:
    return sum(cpu_seconds(r.pid) for r in records)


# ----- 1: the reference size -----------------------------------------------------------------------------------------
_HEALTH_CHECKS = re.compile(r'^smg_worker_health_checks_total\{[^}]*result="(\w+)"[^}]*\} (\S+)$')


def health_checks(metrics_url: str) -> dict[str, float]:
    """A router's health checks so far by result (``success``, ``failure``)."""
    out: dict[str, float] = {}
    for line in httpx.get(metrics_url, timeout=120).text.splitlines():
        if m := _HEALTH_CHECKS.match(line):
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def reference(sc: Scale, window_s: float) -> dict[str, Any]:
    """With the whole fleet registered, over ``window_s``: each router's memory, open files, CPU share and health
    checks by result, the healthy workers each router lists; what the workers served (by path and client, counted
    inside the worker processes) against what the routers' and agents' intervals call for; controller-0's messages
    against the planner's and the replicas probed per message (the aggregation ratio); every kind of process's CPU
    and memory, and the CPU per worker request and per agent probe."""
    kinds = ("router", "worker-host", "agent", "controller", "etcd")
    groups = {k: sc.records(k) for k in kinds}
    routers, ctl = groups["router"], sc.state.read("controller-0")
    assert ctl is not None
    cpu0, each0 = {k: cpu_of(v) for k, v in groups.items()}, {r.name: cpu_seconds(r.pid) for r in routers}
    checks0 = {r.name: health_checks(r.metrics_url) for r in routers}
    counts0, accepted0, t0 = host_counts(sc), status(ctl.url, 30)["reports"]["accepted"], time.monotonic()
    time.sleep(window_s)
    counts1, accepted1, t1 = host_counts(sc), status(ctl.url, 30)["reports"]["accepted"], time.monotonic()
    checks1 = {r.name: health_checks(r.metrics_url) for r in routers}
    dt = t1 - t0
    cores = {k: (cpu_of(v) - cpu0[k]) / dt for k, v in groups.items()}
    rates = {k: (counts1.get(k, 0) - counts0.get(k, 0)) / dt for k in counts1}
    replicas, interval = len(sc.plan.replicas), sc.spec.serving.heartbeat_interval_s
    healthy = [
        sum(w["is_healthy"] for w in httpx.get(r.url + "/workers", timeout=120).json()["workers"]) for r in routers
    ]
    rows = []
    for r in routers:
        done = {k: checks1[r.name].get(k, 0.0) - checks0[r.name].get(k, 0.0) for k in ("success", "failure")}
        rows.append({
            "name": r.name, "rss_mib": round(rss_mib(r.pid), 1), "open_files": open_files(r.pid),
            "cpu_share": round((cpu_seconds(r.pid) - each0[r.name]) / dt, 3),
            "health_checks_per_s": round(sum(done.values()) / dt, 1),
            "health_check_failures": round(done["failure"] / max(sum(done.values()), 1), 3),
        })  # fmt: skip
    messages = (accepted1 - accepted0) / dt
    hb = sc.plan.heartbeats
    return {
        "window_s": round(dt, 1),
        "heartbeat_s": interval,
        "routers": rows,
        "healthy_workers_per_router": healthy,
        "health_checks_per_s": {
            "routers": round(rates.get(f"GET /health {ROUTER_CLIENT}", 0.0), 1),
            "routers_expected": round(len(routers) * replicas / interval, 1),
            "agents": round(rates.get(AGENT_PROBE, 0.0), 1),
            "agents_expected": round(replicas / interval, 1),
        },
        "worker_requests_per_s": {k: round(v, 1) for k, v in sorted(rates.items(), key=lambda kv: -kv[1]) if v > 0},
        "heartbeats": {
            "aggregated_measured_per_s": round(messages, 1),
            "replicas_probed_per_message": round(rates.get(AGENT_PROBE, 0.0) / max(messages, 1e-9), 2),
            "aggregated_planner_per_s": hb.aggregated_per_s.value,
            "direct_planner_per_s": hb.direct_per_s.value,
        },
        "cores": {k: round(v, 2) for k, v in cores.items()},
        "rss_mib": {k: round(sum(rss_mib(r.pid) for r in v), 1) for k, v in groups.items()},
        "worker_cpu_ms_per_request": round(cores["worker-host"] / max(sum(rates.values()), 1e-9) * 1000, 3),
        "agent_cpu_ms_per_probe": round(cores["agent"] / max(rates.get(AGENT_PROBE, 0.0), 1e-9) * 1000, 2),
    }


# ----- 4: node loss --------------------------------------------------------------------------------------------------
class Load:
    """Open-loop client load through router 0 in a background thread."""

    def __init__(self, url: str, rate: float) -> None:
        self.gen = LoadGenerator(LoadSpec(url=url, rate_per_s=rate, duration_s=3600, timeout_s=30.0))
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._thread = threading.Thread(target=lambda: self._loop.run_until_complete(self.gen.run(self._stop)))

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)


def node_loss(sc: Scale, rate: float) -> dict[str, Any]:
    spec = sc.spec
    assert spec.sandbox is not None
    node = sc.plan.replicas[len(sc.plan.replicas) // 2].node.name
    victims = [r for r in sc.plan.replicas if r.node.name == node]
    ports = [r.endpoint.port for r in victims]
    urls = {r.url for r in victims}
    iv = spec.serving.heartbeat_interval_s
    window = (sc.plan.heartbeats.timeouts_to_migrate.value + 2) * iv + 10
    unhealthy: dict[str, float] = {}
    with Load(sc.router_url, rate) as load:
        time.sleep(5)
        wall0, t0 = time.time(), time.monotonic()
        asyncio.run(stop_hosted(sc.state, ports, stop_timeout_s=0))
        acts: list[dict[str, Any]] = []
        while time.monotonic() - t0 < window:
            for router in router_urls(spec):
                workers = httpx.get(router + "/workers", timeout=30).json()["workers"]
                if all(not w["is_healthy"] for w in workers if w["url"] in urls) and router not in unhealthy:
                    unhealthy[router] = time.monotonic() - t0
            lead = leader(sc)
            acts = [a for a in lead["actions"] if a["url"] in urls and a["at"] >= wall0 and a["ok"]]
            if {a["url"] for a in acts if a["kind"] == "migrate"} == urls and len(unhealthy) == len(router_urls(spec)):
                break
            time.sleep(2)  # each GET /workers of 2,048 costs a router ≈ 0.1 s of CPU
        lead = leader(sc)
        node_score = next(n["score"] for n in lead["nodes"] if n["name"] == node)
        time.sleep(2)
    report = load.gen.report()

    def when(kind: str) -> list[float]:
        return sorted(a["at"] - wall0 + (a["seconds"] if kind == "remove" else 0.0) for a in acts if a["kind"] == kind)

    removed, migrated, readmitted = when("remove"), when("migrate"), when("readmit")
    health = spec.health
    return {
        "node": node,
        "replicas": len(ports),
        "routers_all_unhealthy_s": sorted(round(v, 1) for v in unhealthy.values()),
        "router_detection_bound_s": spec.serving.failure_threshold * iv + spec.serving.health_check_timeout_s,
        "out_of_every_router_s": [round(removed[0], 1), round(removed[-1], 1)] if removed else None,
        "planned_out_s": sc.plan.heartbeats.timeouts_to_stop_routing.value * iv,
        "migrated_s": [round(migrated[0], 1), round(migrated[-1], 1)] if migrated else None,
        "planned_migrate_s": sc.plan.heartbeats.timeouts_to_migrate.value * iv,
        "readmitted": len({a["url"] for a in acts if a["kind"] == "readmit"}),
        "readmitted_s": [round(readmitted[0], 1), round(readmitted[-1], 1)] if readmitted else None,
        "node_score_at_end": node_score,
        "readmission_needs_s": max(0, health.readmit_at - node_score) / health.success_reward * iv,
        "client_rate_per_s": rate,
        "client_requests": report.count,
        "client_errors": report.errors,
        "client_p99_ms": round(report.p99_s * 1000, 1),
    }


# ----- 5: the scheduling period --------------------------------------------------------------------------------------
def trial_spec(spec: FleetSpec, replicas: int, period_ms: int) -> FleetSpec:
    """The stack with ``replicas`` (the first ones of the fleet, whose workers run) and ``scheduler.period_ms``."""
    return spec.model_copy(
        update={
            "serving": spec.serving.model_copy(update={"replicas": replicas}),
            "scheduler": spec.scheduler.model_copy(update={"period_ms": period_ms}),
        }
    )


def probe_controller(args: argparse.Namespace) -> None:
    """Child process: one controller instance, its ``_load_loop``'s calls timed from outside, for the window."""
    stack = load_stack_file(args.stack_file)
    spec = trial_spec(stack.spec, args.trial_replicas, args.period_ms)
    fleet = load_fleet(stack.name, spec)
    election = EtcdElection(
        [args.etcd], f"/exaserve/{stack.name}/{spec.runtime.lease_name}", "bench-probe", spec.runtime.lease_ttl_s
    )
    service = ControllerService(
        fleet, identity="bench-probe", election=election, routers=RouterSet([args.router]), restarter=None
    )
    calls: list[tuple[float, float]] = []
    loads = service.controller.loads

    def timed() -> dict[str, float]:
        started = time.monotonic()
        out = loads()
        calls.append((started, time.monotonic()))
        return out

    service.controller.loads = timed  # type: ignore[method-assign]

    async def run() -> dict[str, Any]:
        stop = asyncio.Event()
        task = asyncio.create_task(service.run("127.0.0.1", args.port, stop))
        counters = service.controller.counters
        for _ in range(600):  # until the agents' first reports arrive (their processes start meanwhile)
            if counters.accepted + sum(counters.rejected.values()):
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(args.warmup_s)  # every agent's first report in
        first, got0, cpu0, t0 = (
            len(calls),
            counters.accepted + sum(counters.rejected.values()),
            cpu_seconds(os.getpid()),
            time.monotonic(),
        )
        await asyncio.sleep(args.seconds)
        got1, cpu1, t1 = counters.accepted + sum(counters.rejected.values()), cpu_seconds(os.getpid()), time.monotonic()
        window = calls[first:]
        stop.set()
        await task
        period = args.period_ms / 1000
        late = [(b[0] - a[1] - period) * 1000 for a, b in itertools.pairwise(window)]
        work = [(b - a) * 1000 for a, b in window]
        return {
            "periods": len(late),
            "late_ms": quantiles(late),
            "work_ms": quantiles(work),
            "messages_per_s": round((got1 - got0) / (t1 - t0), 1),
            "cpu_share": round((cpu1 - cpu0) / (t1 - t0), 3),
        }

    Path(args.out).write_text(json.dumps(asyncio.run(run())))


def quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50": round(pick(0.5), 2), "p99": round(pick(0.99), 2), "max": round(ordered[-1], 2)}


def reporters(args: argparse.Namespace) -> None:
    """Child process: real agents for the trial's replicas (shard ``args.shard`` of ``args.shards``), one per node
    (aggregated) or one per replica (direct), reporting to the probe controller. Replica ``i`` is probed on the
    running sandbox's worker ``i mod workers``; each agent probes once and then sends its report again every interval
    with ``seq`` and ``sent_at`` advanced, its start spread over the interval as agents on separate nodes start: the
    controller receives what agents send, without this machine paying for thousands of probes (section 1 does)."""
    stack = load_stack_file(args.stack_file)
    spec = trial_spec(stack.spec, args.trial_replicas, args.period_ms)
    fleet = load_fleet(stack.name, spec)
    urls = {r.id: f"http://127.0.0.1:{args.worker_base_port + r.index % args.workers}" for r in fleet.plan.replicas}
    nodes = list(dict.fromkeys(r.node.name for r in fleet.plan.replicas))[args.shard :: args.shards]
    agents = []
    for node in nodes:
        whole = AgentConfig.for_node(fleet, node, [args.controller])
        mine = tuple((rid, urls[rid], gpus) for rid, _url, gpus in whole.replicas)
        singles = [(one,) for one in mine] if args.mode == "direct" else [mine]
        agents += [Agent(AgentConfig(**{**whole.__dict__, "replicas": replicas})) for replicas in singles]
    interval = spec.serving.heartbeat_interval_s

    async def resend(i: int, agent: Agent, stop: asyncio.Event) -> None:
        report = await agent.report()
        due = time.monotonic() + interval * i / len(agents)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=max(0.0, due - time.monotonic()))
            if stop.is_set():
                break
            await agent.send(report.model_copy(update={"seq": report.seq + 1, "sent_at": time.time()}))
            report = report.model_copy(update={"seq": report.seq + 1})
            due += interval

    async def run() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await asyncio.gather(*(resend(i, a, stop) for i, a in enumerate(agents)))
        await asyncio.gather(*(a.aclose() for a in agents))

    asyncio.run(run())


def trial(sc: Scale, full: Path, mode: str, replicas: int, period_ms: int, directory: Path) -> dict[str, Any]:
    """One trial: the probe controller and two reporter processes for ``replicas`` of the full-size stack ``full``,
    on the sandbox ``sc`` (its etcd, its workers probed)."""
    assert sc.spec.sandbox is not None
    spec = load_stack_file(full).spec
    port = free_port()
    warmup = spec.serving.heartbeat_interval_s + 1.0
    out = directory / f"trial-{mode}-{replicas}-{period_ms}.json"
    common = ["--stack-file", str(full), "--trial-replicas", str(replicas), "--period-ms", str(period_ms)]
    me = [sys.executable, str(Path(__file__).resolve())]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    probe = subprocess.Popen(
        [
            *me,
            "--probe-controller",
            *common,
            "--port",
            str(port),
            "--out",
            str(out),
            "--warmup-s",
            str(warmup),
            "--seconds",
            str(TRIAL_S),
            "--etcd",
            etcd_url(sc.spec),
            "--router",
            sc.router_url,
        ],
        env=env,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.2)
    shards = 2
    feeders = [
        subprocess.Popen(
            [
                *me,
                "--reporters",
                *common,
                "--mode",
                mode,
                "--controller",
                f"http://127.0.0.1:{port}",
                "--shard",
                str(i),
                "--shards",
                str(shards),
                "--worker-base-port",
                str(sc.spec.sandbox.worker_base_port),
                "--workers",
                str(len(sc.plan.replicas)),
            ],
            env=env,
        )
        for i in range(shards)
    ]
    probe.wait(warmup + TRIAL_S + 120)
    for f in feeders:
        f.terminate()
        f.wait(60)
    result = json.loads(out.read_text())
    hb = load_fleet("trial", trial_spec(spec, replicas, period_ms)).plan.heartbeats
    planned = hb.aggregated_per_s.value if mode == "aggregated" else hb.direct_per_s.value
    return {"mode": mode, "replicas": replicas, "period_ms": period_ms, "planner_per_s": planned, **result}


def scheduling(sc: Scale, full: Path, directory: Path) -> dict[str, Any]:
    for agent in sc.records("agent"):  # give their CPU to the trials' own agents
        stop_process(sc.state, agent.name, timeout_s=10)
    period = sc.spec.scheduler.period_ms
    full_stack = load_stack_file(full)
    size = len(load_fleet(full_stack.name, full_stack.spec).plan.replicas)
    counts = sorted({size // 2, size})
    plan = [("aggregated", size, period), ("aggregated", size, 10)]
    plan += [("direct", n, period) for n in counts] + [("direct", size, 10)]
    trials = [trial(sc, full, mode, n, p, directory) for mode, n, p in plan]
    direct = [t for t in trials if t["mode"] == "direct" and t["period_ms"] == period]
    knee = next((t["replicas"] for t in direct if t["late_ms"]["p99"] > JITTER_SHARE * period), None)
    return {
        "trials": trials,
        "jitter_rule": f"p99 lateness > {JITTER_SHARE:.0%} of the {period} ms period",
        "knee_direct_replicas": knee,
        "source_claim_replicas": sc.spec.scheduler.max_direct_heartbeat_replicas,
    }


# ----- 6: the rollout ------------------------------------------------------------------------------------------------
_ROUTER_CALL = re.compile(
    r'^(smg_http_requests_total|smg_http_request_duration_seconds_sum)\{method="(\w+)",path="([^"]*)"\} (\S+)$'
)
_PER_ROUTER = re.compile(r"(http://\S+) ([\d.]+) s")
# serving.rollout.runner.asked_again_note: "…after a time-out: 2 of 2048 (gpu-…, …) at the start, 0 of 2048 at the end"
_ASKED_AGAIN = re.compile(r"after a time-out: (\d+) of \d+.*? at the start, (\d+) of \d+")


def asked_again(detail: str) -> list[int]:
    """The two counts of a soak's or the baseline's :func:`~serving.rollout.runner.asked_again_note` ([0, 0] when the
    detail has none: nothing was asked again); a note the pattern does not read is an error, not a 0."""
    found = _ASKED_AGAIN.findall(detail)
    if len(found) > 1 or (not found and "asked again after a time-out" in detail):
        raise ValueError(f"cannot read the second asks in {detail!r}")
    return [int(n) for n in found[0]] if found else [0, 0]


def router_calls(metrics_urls: list[str]) -> dict[str, list[float]]:
    """``METHOD /path`` (worker ids as ``{id}``) → [calls, seconds in the router's handler], summed over routers."""
    out: dict[str, list[float]] = {}
    for url in metrics_urls:
        for line in httpx.get(url, timeout=60).text.splitlines():
            m = _ROUTER_CALL.match(line)
            if m is None:
                continue
            name, method, path, value = m.groups()
            key = f"{method} {re.sub(r'^/workers/.+', '/workers/{id}', path)}"
            slot = out.setdefault(key, [0.0, 0.0])
            slot[0 if name == "smg_http_requests_total" else 1] += float(value)
    return out


def soaked(journal: Path, batch: int) -> bool:
    """Whether the journal records ``batch``'s soak passed."""
    state = load_state(journal)
    return state is not None and bool(state.batches[batch].passed)


ROLLOUT_CPU_KINDS = ("router", "worker-host", "agent", "controller", "etcd")


def cpu_by_kind(sc: Scale, updater: int) -> dict[str, float]:
    """CPU seconds so far of each kind of the sandbox's processes and of the updater (pid ``updater``)."""
    out = {k: cpu_of(sc.records(k)) for k in ROLLOUT_CPU_KINDS}
    with contextlib.suppress(SandboxError):  # it has exited
        out["updater"] = cpu_seconds(updater)
    return out


def run_rollout(
    sc: Scale, journal: Path, batches: int | None, cpu: list[tuple[float, dict[str, float]]]
) -> subprocess.CompletedProcess[str]:
    """``exaserve rollout --to rehearsal``; with ``batches``, paused (SIGINT, as an operator's Ctrl-C) once that many
    batches passed their soak. The updater pauses where every replica is in the router: when the next batch already
    started leaving (it starts at once after the soak), it is brought back first, and shown as cut short. Appends
    ``(time.time(), CPU seconds by kind)`` to ``cpu`` every half second while it runs."""
    # a router that a rollout's changes keep busy may answer its metrics late (3 routers on 2 cores beside 2,048
    # workers): a longer grace than the default 30 s
    args = ("rollout", "--to", "rehearsal", "--json", "--router-grace-s", "600", "--stack-file", str(sc.stack_file))
    output = sc.state_dir / "rollout-cli"  # files, not pipes: its progress at scale fills a pipe and blocks it
    proc = exaserve_started(*args, env=sc.env, to=output)
    paused = False
    try:
        while proc.poll() is None:
            cpu.append((time.time(), cpu_by_kind(sc, proc.pid)))
            if batches is not None and not paused and soaked(journal, batches - 1):
                proc.send_signal(signal.SIGINT)
                paused = True
            time.sleep(0.5)
    finally:  # the bench interrupted: the rollout holds the stack's lock, and `sandbox down` waits for no updater
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()  # its lock is an flock: released when the process dies
    proc.wait(60)
    out, err = (output.with_suffix(suffix).read_text() for suffix in (".out", ".err"))
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def cores_between(cpu: list[tuple[float, dict[str, float]]], start: float, end: float) -> dict[str, float]:
    """Cores by kind of process between wall-clock times ``start`` and ``end``, from the samples nearest to them."""
    if not cpu:
        return {}
    (t0, a), (t1, b) = (min(cpu, key=lambda sample: abs(sample[0] - t)) for t in (start, end))
    return {k: round((b[k] - a[k]) / (t1 - t0), 3) for k in a if k in b} if t1 > t0 else {}


def rollout(sc: Scale, rate: float, batches: int | None) -> dict[str, Any]:
    metrics = [r.metrics_url for r in sc.records("router")]
    journal = sc.state.root.parent / "rollout" / "journal.jsonl"
    with Load(sc.router_url, rate) as load:
        time.sleep(10)
        dry = json_object(sc.cli("rollout", "--to", "rehearsal", "--dry-run", "--json"))
        before, started = router_calls(metrics), time.monotonic()
        cpu: list[tuple[float, dict[str, float]]] = []
        run = run_rollout(sc, journal, batches, cpu)
        wall = time.monotonic() - started
        after = router_calls(metrics)
        report = load.gen.report()
    if not journal.is_file():  # refused before its first batch: say why instead of timing nothing
        return {
            "replicas": len(sc.plan.replicas),
            "outcome": f"did not start (exit {run.returncode})",
            "error": (run.stdout[-1500:] + " | " + run.stderr[-1500:]).strip(" |"),
        }
    outcome = json_object(run)
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    span = records[-1]["written_at"] - records[0]["written_at"]
    planned = len(dry["batches"])
    per_batch: list[dict[str, Any]] = []
    for b in range(planned):
        # the batch's own records (the first is the plan), forward path only; it began when the record before them
        # was written (the baseline or the previous batch's soak) and its first record is its removal, done
        mine = [i for i, rec in enumerate(records[1:], 1)
                if (step := rec["event"].get("step") or {}).get("batch") == b and not step.get("rollback")]  # fmt: skip
        if not mine:
            continue
        row: dict[str, Any] = {
            "batch": b,
            "span_s": round(records[mine[-1]]["written_at"] - records[mine[0] - 1]["written_at"], 1),
            "ends_at": records[mine[-1]]["written_at"],
            "passed": any(
                records[i]["event"]["step"]["phase"] == "soak" and records[i]["event"]["kind"] == "done" for i in mine
            ),
        }
        row["cores"] = cores_between(cpu, records[mine[0] - 1]["written_at"], records[mine[-1]]["written_at"])
        for i in mine:
            ev = records[i]["event"]
            if ev["step"]["phase"] in ("remove", "readmit"):
                seconds = [float(s) for _u, s in _PER_ROUTER.findall(ev["detail"])]
                row[f"{ev['step']['phase']}_s_slowest_router"] = max(seconds) if seconds else None
            if ev["step"]["phase"] == "soak":  # the soak's two reads: replicas that answered only a second ask
                row["soak_asked_again"] = asked_again(ev["detail"])
        per_batch.append(row)
    baseline = next((rec["event"]["detail"] for rec in records[1:] if rec["event"]["kind"] == "baseline"), "")
    passed = [row for row in per_batch if row["passed"]]  # a batch the pause cut short is shown, not extrapolated
    ran = len(passed)
    calls = {
        k: {
            "per_batch": round((after[k][0] - before.get(k, [0, 0])[0]) / max(len(per_batch), 1), 1),
            "router_handler_ms": round(
                (after[k][1] - before.get(k, [0, 0])[1]) / max(after[k][0] - before.get(k, [0, 0])[0], 1) * 1000, 2
            ),
        }
        for k in after
        if k.split()[1].startswith("/workers") and after[k][0] > before.get(k, [0, 0])[0]
    }
    timings = dry["timings"]
    full: float | None = span  # every batch passed: measured
    if ran < planned:  # paused after `ran` batches passed: up to the last one's soak, the rest at their mean
        mean = sum(row["span_s"] for row in passed) / ran if ran else None
        full = passed[-1]["ends_at"] - records[0]["written_at"] + (planned - ran) * mean if mean else None
    return {
        "replicas": len(sc.plan.replicas),
        "routers": len(metrics),
        "outcome": outcome.get("outcome"),
        "reason": outcome.get("reason"),
        "batches_run": ran,
        "batches_planned": planned,
        "batch_sizes": [len(b["replicas"]) for b in dry["batches"]],
        "configured_wait_s": dry["configured_wait_s"],
        "configured_wait_per_batch_s": timings["warmup_s"] + timings["interval_s"],
        "journal_span_s": round(span, 1),
        "cli_wall_s": round(wall, 1),
        "full_rollout_s": round(full, 1) if full is not None else None,
        "full_rollout_extrapolated": ran < planned,
        "overhead_ratio": round(full / dry["configured_wait_s"], 2) if full is not None else None,
        "baseline_asked_again": asked_again(baseline),
        "per_batch": [{k: v for k, v in row.items() if k != "ends_at"} for row in per_batch],
        "router_api_calls": calls,
        "client_requests": report.count,
        "client_errors": report.errors,
        "client_p99_ms": round(report.p99_s * 1000, 1),
    }


# ----- output ----------------------------------------------------------------------------------------------------------
def print_table(f: dict[str, Any]) -> None:
    for refused in f.get("refused", []):
        print(f"== {refused['replicas']} replicas refused by sandbox up: {refused['reason']}")
    a = f["bring_up"]
    print(
        f"== {a['replicas']} replicas on {a['nodes']} nodes, {a['routers']} routers, {a['controllers']} controllers, "
        f"{a['worker_processes']} worker and {a['agent_processes']} agent processes; machine {f['machine']}; "
        f"sandbox up {a['up_s']:.0f} s"
    )
    for key, show in (
        ("reference", print_reference),
        ("rollout", print_rollout),
        ("node_loss", print_node_loss),
        ("scheduling", print_scheduling),
    ):
        if key in f:
            show(f[key], f)


def print_reference(ref: dict[str, Any], f: dict[str, Any]) -> None:
    print(f"1. over {ref['window_s']:.0f} s with everything registered (heartbeat {ref['heartbeat_s']:g} s):")
    for row in ref["routers"]:
        print(
            f"   {row['name']:<9} RSS {row['rss_mib']:6.1f} MiB  open files {row['open_files']:5d}  registration CPU "
            f"{row['registration_cpu_s']:6.1f} s  CPU now {row['cpu_share']:6.1%}  health checks "
            f"{row['health_checks_per_s']:6.1f}/s, {row['health_check_failures']:.1%} failing"
        )
    hc = ref["health_checks_per_s"]
    print(
        f"   healthy workers per router {ref['healthy_workers_per_router']}; /health on the workers: routers "
        f"{hc['routers']}/s (expected {hc['routers_expected']}), agents {hc['agents']}/s (expected {hc['agents_expected']})"
    )
    print(
        "   all requests on the workers/s: "
        + ", ".join(f"{k} {v:.1f}" for k, v in list(ref["worker_requests_per_s"].items())[:6])
    )
    hb = ref["heartbeats"]
    print(
        f"   controller-0: aggregated {hb['aggregated_measured_per_s']} msg/s (planner "
        f"{hb['aggregated_planner_per_s']:.1f}), {hb['replicas_probed_per_message']} replicas probed per message; "
        f"direct would be {hb['direct_planner_per_s']:.1f} msg/s"
    )
    print(
        "   cores: "
        + ", ".join(f"{k} {v:.2f}" for k, v in ref["cores"].items())
        + "; RSS MiB: "
        + ", ".join(f"{k} {v:.0f}" for k, v in ref["rss_mib"].items())
        + f"; CPU per request on a worker process {ref['worker_cpu_ms_per_request']} ms, per agent probe "
        f"{ref['agent_cpu_ms_per_probe']} ms"
    )
    cpu = f["bring_up"]["cpu"]
    print(
        f"   sandbox up's prediction from costs measured alone ({cpu['request_ms']} ms a request, {cpu['probe_ms']} ms "
        "a probe): " + ", ".join(f"{k} {v:.2f}" for k, v in cpu["cores_needed"].items())
    )


def print_rollout(r: dict[str, Any], f: dict[str, Any]) -> None:
    if "error" in r:
        print(f"2. rollout of {r['replicas']} replicas: {r['outcome']}: {r['error']}")
        r = {**r, "per_batch": [], "router_api_calls": {}}
    else:
        full = "extrapolated from the batches run" if r["full_rollout_extrapolated"] else "measured"
        print(
            f"2. rollout of {r['replicas']} replicas ({r['outcome']}, {r['batches_run']} of {r['batches_planned']} "
            f"batches passed), batches {r['batch_sizes']}, {r['routers']} routers, {f['rate']:g} req/s: journal "
            f"{r['journal_span_s']} s (CLI {r['cli_wall_s']} s); all {r['batches_planned']} batches {r['full_rollout_s']} s "
            f"({full}) against {r['configured_wait_s']} s configured: overhead ratio {r['overhead_ratio']}; client "
            f"errors {r['client_errors']} of {r['client_requests']}, P99 {r['client_p99_ms']} ms"
        )
        if r["reason"]:
            print(f"   {r['reason']}")
    for row in r["per_batch"]:
        print(
            f"   batch {row['batch']}{'' if row['passed'] else ' (cut short)'}: {row['span_s']} s "
            f"({r['configured_wait_per_batch_s']} s configured waits); out of "
            f"every router {row.get('remove_s_slowest_router')} s, back on every router "
            f"{row.get('readmit_s_slowest_router')} s (slowest router); cores "
            + ", ".join(f"{k} {v:.2f}" for k, v in row.get("cores", {}).items())
        )
    for key, c in r["router_api_calls"].items():
        print(
            f"   {key:<22} {c['per_batch']:8.1f} calls per batch (all routers), {c['router_handler_ms']:7.2f} ms in the "
            "router's handler"
        )


def print_node_loss(n: dict[str, Any], _f: dict[str, Any]) -> None:
    print(
        f"3. node loss ({n['node']}, {n['replicas']} replicas, {n['client_rate_per_s']:g} req/s): routers all-unhealthy "
        f"at {n['routers_all_unhealthy_s']} s (bound {n['router_detection_bound_s']:g} s); out of every router "
        f"{n['out_of_every_router_s']} s (plan {n['planned_out_s']:g} s); migrated {n['migrated_s']} s (plan "
        f"{n['planned_migrate_s']:g} s); readmitted {n['readmitted']} (node score {n['node_score_at_end']}, "
        f"≥ {n['readmission_needs_s']:.0f} s more); client errors {n['client_errors']} of {n['client_requests']}, "
        f"P99 {n['client_p99_ms']} ms"
    )


def print_scheduling(sch: dict[str, Any], _f: dict[str, Any]) -> None:
    knee = sch["knee_direct_replicas"]
    most = max(t["replicas"] for t in sch["trials"])
    where = f"at {knee} replicas" if knee else f"none up to {most} replicas"
    print(
        f"4. scheduling period, jitter = {sch['jitter_rule']}: knee of direct reports {where} "
        f"(source: above {sch['source_claim_replicas']})"
    )
    print("   mode        replicas period  msg/s (planner)  late p50/p99/max ms      work p50/p99 ms  CPU")
    for t in sch["trials"]:
        late, work = t["late_ms"], t["work_ms"]
        print(
            f"   {t['mode']:<11} {t['replicas']:8d} {t['period_ms']:4d} ms {t['messages_per_s']:7.1f} "
            f"({t['planner_per_s']:6.1f})  {late['p50']:6.2f}/{late['p99']:7.2f}/{late['max']:7.2f}   "
            f"{work['p50']:6.2f}/{work['p99']:6.2f}   {t['cpu_share']:5.1%}"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, default=int(stack_doc("prod")["serving"]["replicas"]))
    ap.add_argument(
        "--rate", type=float, default=100.0, help="client requests per second during the node loss and the rollout"
    )
    ap.add_argument(
        "--sections",
        type=lambda v: v.split(","),
        default=list(SECTIONS),
        help=f"comma-separated, of {','.join(SECTIONS)} (default: all, in that order, on one sandbox)",
    )
    ap.add_argument(
        "--rollout-batches",
        type=int,
        default=1,
        help="batches the rollout runs before it is paused (SIGINT), the rest extrapolated from them; 0: all "
        "(at 2,048 replicas on 2 cores each batch takes 1.5-2.5 min on smg 1.13, with --cpu-share 1.0: docs/scale.md)",
    )
    ap.add_argument(
        "--cpu-share",
        type=float,
        default=0.5,
        help="passed to sandbox up: the most of the CPUs the sandbox's steady state may need (1.0: let it saturate)",
    )
    ap.add_argument("--json", action="store_true")
    # the child processes of section 5
    ap.add_argument("--probe-controller", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--reporters", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--stack-file", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--trial-replicas", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--period-ms", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--warmup-s", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=["aggregated", "direct"], help=argparse.SUPPRESS)
    ap.add_argument("--controller", help=argparse.SUPPRESS)
    ap.add_argument("--shard", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--shards", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--etcd", help=argparse.SUPPRESS)
    ap.add_argument("--router", help=argparse.SUPPRESS)
    ap.add_argument("--worker-base-port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--workers", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.probe_controller:
        probe_controller(args)
        return 0
    if args.reporters:
        reporters(args)
        return 0
    if unknown := sorted(set(args.sections) - set(SECTIONS)):
        ap.error(f"--sections: unknown {unknown}; choose from {','.join(SECTIONS)}")
    figures: dict[str, Any] = {"machine": machine(), "rate": args.rate}
    started = time.monotonic()
    try:
        measure(args, figures)
    except BaseException:  # a section that fails must not lose the sections measured before it
        print("scale_bench: stopped early; the figures measured so far:", file=sys.stderr)
        print(json.dumps(figures, indent=2), file=sys.stderr)
        raise
    figures["bench_wall_s"] = round(time.monotonic() - started, 1)
    figures["machine"]["end_loadavg"] = machine()["loadavg_1_5_15"]
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print_table(figures)
        print(f"bench wall time {figures['bench_wall_s']:.0f} s")
    return 0


FIT_MARGIN = 0.9  # below the size sandbox up said fits: its next measurement of the costs may come out higher


@contextlib.contextmanager
def largest_that_fits(args: argparse.Namespace, tmp: Path, figures: dict[str, Any]) -> Iterator[Scale]:
    """``sandbox up`` at ``--replicas``, or, when it refuses for CPU, at the whole nodes it says this machine holds
    (less :data:`FIT_MARGIN`); each refusal is kept in ``figures["refused"]``. ``sandbox down`` on exit."""
    per_node = int(stack_doc("prod")["serving"]["replicas_per_node"])
    replicas = args.replicas
    while True:
        sc = Scale(source_stack(tmp / f"stack-{replicas}", replicas), tmp / "state", args.cpu_share)
        try:
            sc.__enter__()
        except TooSlow as exc:
            figures.setdefault("refused", []).append({"replicas": replicas, "reason": str(exc)})
            print(f"scale_bench: {replicas} replicas refused: {exc}", file=sys.stderr)
            smaller = int(exc.fits * FIT_MARGIN) // per_node * per_node
            if not 0 < smaller < replicas:
                raise
            replicas = smaller
            continue
        try:
            yield sc
        finally:
            sc.__exit__()
        return


def measure(args: argparse.Namespace, figures: dict[str, Any]) -> None:
    """Sections 1-4 into ``figures``, each added as soon as it is measured, on one sandbox."""
    with tempfile.TemporaryDirectory(prefix="scale-bench-") as tmp_name:
        tmp = Path(tmp_name)
        with largest_that_fits(args, tmp, figures) as sc:
            routers = sc.records("router")
            registration = {r.name: round(cpu_seconds(r.pid), 1) for r in routers}
            figures["bring_up"] = {
                "replicas": len(sc.plan.replicas),
                "nodes": len({r.node.name for r in sc.plan.replicas}),
                "routers": len(routers),
                "controllers": len(sc.records("controller")),
                "worker_processes": len(sc.records("worker-host")),
                "agent_processes": len(sc.records("agent")),
                "up_s": round(sc.up_s, 1),
                "cpu": sc.cpu,
            }
            time.sleep(2 * sc.spec.serving.heartbeat_interval_s)  # every agent's first reports in
            if "reference" in args.sections:
                figures["reference"] = reference(sc, 4 * sc.spec.serving.heartbeat_interval_s)
                for row in figures["reference"]["routers"]:
                    row["registration_cpu_s"] = registration[row["name"]]
            if "rollout" in args.sections:
                figures["rollout"] = rollout(sc, args.rate, args.rollout_batches or None)
            if "node-loss" in args.sections:
                figures["node_loss"] = node_loss(sc, args.rate)
            if "scheduling" in args.sections:
                figures["scheduling"] = scheduling(sc, sc.stack_file, tmp)


if __name__ == "__main__":
    sys.exit(main())
