"""scale_bench.py's section 4 (``bench/scale_bench.py``): the controller's scheduling period. Each trial (:func:`trial`)
runs this file again as its child processes: the probe controller (``--probe-controller``) and two of reporting agents
(``--reporters``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.scale_sandbox import Scale
from serving.plan.loader import load_fleet
from serving.router.membership import RouterSet
from serving.runtime.agent import Agent, AgentConfig
from serving.runtime.leader import EtcdElection
from serving.runtime.service import ControllerService
from serving.sandbox.processes import cpu_seconds, free_port, stop_process
from serving.sandbox.runtime import etcd_url
from serving.spec.schema import FleetSpec
from serving.spec.stack import load_stack_file
from tests.support.paths import REPO

TRIAL_S = 15.0  # measured, after one heartbeat interval (+ 1 s) from the probe's first report
JITTER_SHARE = 0.10  # a period "jitters" when its p99 lateness exceeds this share of the period


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


def main() -> int:
    """A trial's child process: the probe controller or a shard of the reporters, as :func:`trial` starts them."""
    ap = argparse.ArgumentParser(
        description="scale_bench.py's trial processes (section 4); bench/scale_bench.py runs them"
    )
    role = ap.add_mutually_exclusive_group(required=True)
    role.add_argument("--probe-controller", action="store_true")
    role.add_argument("--reporters", action="store_true")
    ap.add_argument("--stack-file", type=Path)
    ap.add_argument("--trial-replicas", type=int)
    ap.add_argument("--period-ms", type=int)
    ap.add_argument("--port", type=int)
    ap.add_argument("--out")
    ap.add_argument("--warmup-s", type=float)
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--mode", choices=["aggregated", "direct"])
    ap.add_argument("--controller")
    ap.add_argument("--shard", type=int, default=0)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--etcd")
    ap.add_argument("--router")
    ap.add_argument("--worker-base-port", type=int)
    ap.add_argument("--workers", type=int)
    args = ap.parse_args()
    if args.probe_controller:
        probe_controller(args)
    else:
        reporters(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
