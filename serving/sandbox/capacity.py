"""What the scale sandbox asks of this machine's CPU, from costs measured on it before the sandbox starts.

The scale sandbox's steady state is a fixed set of loops, each a rate of one kind of work, all from the stack:

* every router checks each worker's ``/health`` every heartbeat and polls its ``/v1/loads`` (smg's load monitor,
  ``model_gateway/src/worker/monitor.rs``, on for overload protection whatever the policy);
* every node's agent probes each of its replicas every heartbeat: ``/health``, then ``/metrics`` (parsed);
* every controller instance applies every node's report.

So its CPU is rates × costs. The costs differ from machine to machine (two 2-core machines with the same ``nproc`` did
the same work at 2–2.7× the CPU, docs/scale.md), so the two Python paths that dominate are measured here, with the real
code, before the sandbox starts (:func:`measure_costs`: one worker host of :data:`CALIBRATION_WORKERS` simulated
workers probed by a real :class:`~serving.runtime.agent.Agent` for :data:`CALIBRATION_PROBES` probes): a worker's
request and an agent's probe. Measured alone they are cheaper than in the fleet, where ~20 processes share the cores:
:data:`IN_FLEET` is that ratio, measured on the reference machine. The routers' (Rust) share is smg 1.13.0's, measured at
2,048 workers (``bench/router_steady_bench.py``) and brought to the reference machine's terms; the controllers' is the
reference machine's (docs/scale.md, 2,048 replicas); both scaled by this machine's speed against it (the agent's probe).

:func:`cpu_need` turns the costs into cores by kind; :func:`serving.sandbox.scale.check_machine` refuses a sandbox that
needs more than :data:`CPU_SHARE` of the cores in its steady state (the rest is for the client load, a rollout's
membership changes and the measurements) and names the replicas this machine holds.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from serving.runtime.agent import Agent, AgentConfig
from serving.sandbox.processes import SandboxError, StateDir, cpu_seconds, free_port, free_port_block, stop_all
from serving.sandbox.worker_config import WorkerConfig, ensure_model_dir
from serving.sandbox.worker_host import start_host
from serving.spec.schema import FleetSpec

CALIBRATION_WORKERS = 64  # one worker host's share of a node group, small enough to start in a second
CALIBRATION_PROBES = 2_000  # agent probes measured (4,000 worker requests): ~1 s of CPU on the slow machine
AGENT_CALLS = 2  # an agent's probe: GET /health, then GET /metrics
# a router's calls to each worker per heartbeat: /health, and /v1/loads, which smg polls whenever a load-aware policy or
# overload protection reads it: the render leaves protection on, so under every policy (docs/units.md)
ROUTER_CALLS = 2
# The reference machine (docs/scale.md, 2,048 replicas, 3 routers, 3 controllers, 5 s heartbeat, power_of_two):
REFERENCE_PROBE_MS = 0.28  # an agent's probe alone (256 workers), its CPU in the agent's process
IN_FLEET = 0.5 / 0.28  # an agent's probe in the fleet (0.5 ms) against alone (0.28 ms): the cores' contention
# smg 1.13.0 with the prod flags in front of 2,048 workers whose /health is the servers' as rendered (no generation):
# 0.0716 cores for its 410 health checks and load polls a second, on a machine at 0.917 × the reference's CPU per unit
# of work (bench/router_steady_bench.py, 2026-12-04; sglang-router 0.3.2 took 0.05 a router on the reference machine)
REFERENCE_ROUTER_CORES_PER_WORKER = 0.0716 / 0.917 / 2048
REFERENCE_CONTROLLER_CORES_PER_REPORT = 0.11 / (3 * 51.2)  # 0.11 cores for 3 instances × 51.2 reports/s
CPU_SHARE = 0.5  # of the cores, the most the steady state may take


@dataclass(frozen=True)
class Costs:
    """CPU per unit of work on this machine, measured alone (:func:`measure_costs`)."""

    request_ms: float  # a simulated worker's request (in its worker host)
    probe_ms: float  # an agent's probe of one replica (in the agent's process)

    @property
    def speed(self) -> float:
        """This machine's CPU per unit of work against the reference machine's (2.0: half as fast)."""
        return self.probe_ms / REFERENCE_PROBE_MS


@dataclass(frozen=True)
class CpuNeed:
    cores: Mapping[str, float]  # by kind of process
    available: float  # the cores the sandbox may use: CPU_SHARE of this process's CPUs
    costs: Costs

    @property
    def total(self) -> float:
        return sum(self.cores.values())


def cpus() -> int:
    """The CPUs this process may run on (its affinity, as ``nproc``)."""
    return len(os.sched_getaffinity(0))


def cpu_need(spec: FleetSpec, replicas: int, nodes: int, costs: Costs, share: float = CPU_SHARE) -> CpuNeed:
    """The steady state's cores by kind of process: rates from the stack × costs (measured here, × :data:`IN_FLEET`;
    the routers' and controllers' from the reference machine × this machine's speed)."""
    beat = spec.serving.heartbeat_interval_s
    instances = spec.scheduler.instances  # routers, and controllers
    requests = replicas / beat * (instances * ROUTER_CALLS + AGENT_CALLS)
    reports = (replicas if spec.serving.heartbeat_mode == "direct" else nodes) / beat
    cores = {
        "workers": requests * costs.request_ms / 1000 * IN_FLEET,
        "agents": replicas / beat * costs.probe_ms / 1000 * IN_FLEET,
        "routers": instances * replicas * REFERENCE_ROUTER_CORES_PER_WORKER * costs.speed,
        "controllers": instances * reports * REFERENCE_CONTROLLER_CORES_PER_REPORT * costs.speed,
    }
    return CpuNeed(cores, share * cpus(), costs)


async def _all_answer(agent: Agent, timeout_s: float) -> None:
    """Probe until every replica answers (a worker host opens its ports as it goes): connections open, not counted."""
    deadline = time.monotonic() + timeout_s
    while True:
        report = await agent.report()
        down = [p for p in report.replicas if not p.ok]
        if not down:
            return
        if time.monotonic() > deadline:
            raise SandboxError(
                f"calibration: {len(down)} simulated workers did not answer within {timeout_s:g} s (first: "
                f"{down[0].id}, {down[0].error})"
            )
        await asyncio.sleep(0.1)


async def _probe_rounds(agent: Agent, rounds: int) -> float:
    """Probe every replica of the agent ``rounds`` times; the agent's CPU seconds for them."""
    started = time.process_time()
    for _ in range(rounds):
        report = await agent.report()
        if down := [p for p in report.replicas if not p.ok]:
            raise SandboxError(f"calibration: simulated worker {down[0].id} stopped answering ({down[0].error})")
    return time.process_time() - started


def measure_costs(workers: int = CALIBRATION_WORKERS, probes: int = CALIBRATION_PROBES) -> Costs:
    """Start one worker host of ``workers`` simulated workers (the real :mod:`serving.sandbox.worker_host`), probe
    them ``probes`` times with a real agent in this process, stop the host: the CPU per request in the host and per
    probe in the agent. Takes a few seconds; raises :class:`SandboxError` when the host does not start."""
    with tempfile.TemporaryDirectory(prefix="exaserve-calibrate-") as tmp:
        state = StateDir(Path(tmp) / "processes")
        model = ensure_model_dir(Path(tmp) / "model")
        base = free_port_block(workers)
        configs = [
            WorkerConfig(port=base + i, latency_ms=0.0, jitter_ms=0.0, model_path=str(model)) for i in range(workers)
        ]
        host = start_host(state, 0, configs, free_port(), timeout_s=60.0)
        try:
            agent = Agent(
                AgentConfig(
                    node="calibration",
                    replicas=tuple((f"r{c.port}", f"http://{c.host}:{c.port}", ()) for c in configs),
                    controllers=(),
                    interval_s=1.0,
                    timeout_s=30.0,
                    max_running_requests=configs[0].max_running_requests,
                    link_rate_gbps=10.0,
                )
            )

            rounds = max(1, probes // workers)

            async def calibrate() -> tuple[float, float]:
                try:
                    await _all_answer(agent, timeout_s=60.0)
                    before = cpu_seconds(host.pid)
                    agent_s = await _probe_rounds(agent, rounds)
                    return agent_s, cpu_seconds(host.pid) - before
                finally:
                    await agent.aclose()

            agent_s, host_s = asyncio.run(calibrate())
        finally:
            stop_all(state)
    made = rounds * workers
    return Costs(request_ms=host_s / (made * AGENT_CALLS) * 1000, probe_ms=agent_s / made * 1000)
