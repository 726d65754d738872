"""The scale sandbox at a reduced size (tests/test_sandbox_scale.py's module docstring says what runs): `exaserve
sandbox up --simulate` on the prod stack cut to 64 nodes × 8 = 512 replicas, shared by the CI tests (what the
controller received, what the workers saw) and the rehearsal (tests/rehearsal/test_scale.py: whether the agents keep
their heartbeat, a rate in real time)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.sandbox.processes import StateDir
from serving.sandbox.worker_host import WORKERS_PATH, control
from serving.spec.schema import FleetSpec
from serving.spec.stack import load_stack_file
from tests.support.cli import exaserve, json_object
from tests.support.controllers import leading_controller
from tests.support.etcd import require_etcd
from tests.support.stacks import write_variant

NODES, PER_NODE = 64, 8
REPLICAS = NODES * PER_NODE
WINDOW = 10  # heartbeats the report rate is counted over: one report more or less per agent at its edges is ±10 %
REDUCED = {
    "cluster.pools.0.count": NODES,
    "cluster.pools.0.racks": 4,
    "serving.replicas": REPLICAS,
    "serving.target_replicas": REPLICAS,
    "serving.heartbeat_interval_s": 3,
}
AGENT_PROBE = "GET /health_generate exaserve-agent"  # as a worker host counts it: method, path, client


@dataclass(frozen=True)
class Scale:
    stack_file: Path  # the derived Pulumi.prod-simulated.yaml
    spec: FleetSpec
    state: StateDir
    router_url: str
    env: dict[str, str]


@contextmanager
def running_scale(tmp: Path) -> Iterator[Scale]:
    """The reduced prod stack's scale sandbox under ``tmp``, brought down (every process gone) after."""
    require_etcd()
    source = write_variant(tmp, "prod", changes=REDUCED)
    env = {"EXASERVE_STATE_DIR": str(tmp / "state")}
    # --cpu-share 1.0: the CPU bound is tests/test_sandbox_capacity.py's; here the mechanics run on whatever machine CI
    # has, beside the session's other sandboxes (696 replicas took 0.63 cores on a slow 2-core machine: docs/scale.md)
    up = exaserve(
        "sandbox", "up", "--stack-file", str(source), "--simulate", "--cpu-share", "1.0", "--json", env=env,
        timeout_s=420,
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        doc = json_object(up)
        stack = load_stack_file(Path(doc["stack_file"]))
        assert doc["stack"] == stack.name == "prod-simulated" and len(doc["workers"]) == REPLICAS
        state = StateDir(tmp / "state" / stack.name / "sandbox")
        yield Scale(stack.path, stack.spec, state, doc["router_url"], env)
    finally:
        down = exaserve("sandbox", "down", "--stack-file", str(source), "--simulate", "--json", env=env)
        assert down.returncode == 0, down.stdout + down.stderr
        leftover = [r.name for r in StateDir(tmp / "state" / "prod-simulated" / "sandbox").records()]
        assert leftover == [], f"sandbox down left processes behind: {leftover}"


def leader(sc: Scale) -> dict[str, Any]:
    return leading_controller(sc.spec)


def agent_probes(sc: Scale) -> float:
    """``GET /health`` requests from the agents (exaserve-agent) that the worker hosts counted, summed."""
    hosts = [r for r in sc.state.records() if r.kind == "worker-host"]
    return sum(asyncio.run(control(h.url, WORKERS_PATH, None, 10))["requests"].get(AGENT_PROBE, 0) for h in hosts)


@dataclass(frozen=True)
class ReportWindow:
    """What reached the leading controller, and what the worker hosts counted, over :data:`WINDOW` heartbeats."""

    accepted: float  # node reports the leader accepted
    carried: float  # replica probes those reports carried
    probed: float  # agent probes the worker hosts counted
    seconds: float  # the window's length, measured
    interval_s: float  # the heartbeat

    @property
    def rate(self) -> float:
        """Reports per second."""
        return self.accepted / self.seconds

    @property
    def intervals(self) -> float:
        return self.seconds / self.interval_s

    def summary(self) -> str:
        return (
            f"controller: {self.rate:.1f} msg/s carrying {self.carried / self.seconds:.1f} replica probes/s (the "
            f"workers counted {self.probed / self.seconds:.1f}/s) over {self.intervals:.2f} intervals; direct: "
            f"{REPLICAS / self.interval_s:.1f} msg/s"
        )


def report_window(sc: Scale) -> ReportWindow:
    interval = sc.spec.serving.heartbeat_interval_s
    probes0, reports0, t0 = agent_probes(sc), leader(sc)["reports"], time.monotonic()
    time.sleep(WINDOW * interval)
    probes1, reports1, t1 = agent_probes(sc), leader(sc)["reports"], time.monotonic()
    return ReportWindow(
        accepted=reports1["accepted"] - reports0["accepted"],
        carried=reports1["replicas"] - reports0["replicas"],
        probed=probes1 - probes0,
        seconds=t1 - t0,
        interval_s=interval,
    )
