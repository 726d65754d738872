"""What the fault drills do to the sandbox: real signals to its real processes, and the simulated worker's fault
route for what a signal cannot do (SIMULATION ONLY: delay, jitter, HTTP 500, memory pressure; on real nodes that is
``tc netem``, a proxy or stress-ng, on a cluster Chaos Mesh — docs/drills.md).

| fault | inject | heal (only what is still broken at the end) |
|---|---|---|
| replica sigkill | SIGKILL the worker's process | start it again, if the controller did not |
| replica sigstop | SIGSTOP it | SIGCONT, if the same process is still stopped |
| replica latency, errors, generation errors, a wedged or flapping scheduler, memory | ``PUT /sim/fault`` on the worker | ``DELETE /sim/fault`` (a restarted worker has none) |
| node jitter | ``PUT /sim/fault`` on every worker of the node | ``DELETE /sim/fault`` on each |
| node sigkill | SIGKILL the node's agent and every worker of the node | start the workers, then the agent |
| router / controller sigkill | SIGKILL the instance | start it again with its own command line |
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path

import httpx

from serving.drill.engine import FleetUrls, Subject
from serving.drill.scenarios import Component, Fault, FaultKind, FaultSizes
from serving.fleet_http import http_client
from serving.plan.model import Fleet
from serving.runtime.controller import replica_urls
from serving.sandbox.backend import worker_config, worker_name
from serving.sandbox.endpoints import sandbox_endpoints
from serving.sandbox.processes import (
    ProcessRecord,
    SandboxError,
    StateDir,
    http_ok,
    respawn,
    running,
    start_worker,
)
from serving.sandbox.prometheus import prometheus_url
from serving.sandbox.runtime import controller_urls
from serving.sandbox.worker import FAULT_PATH

CONTROL_TIMEOUT_S = 60.0  # a worker host's fault endpoint, on loopback


class SandboxFaults:
    """Faults on the sandbox whose process records are in ``processes_dir``."""

    def __init__(self, fleet: Fleet, processes_dir: Path) -> None:
        self.spec = fleet.spec
        self.replicas = {r.id: r for r in fleet.plan.replicas}
        self.state = StateDir(processes_dir)
        self.stopped: dict[str, ProcessRecord] = {}  # SIGSTOPped worker records, by URL
        self.killed: dict[str, ProcessRecord] = {}  # SIGKILLed router, controller and agent records, by name

    def _record(self, name: str, what: str) -> ProcessRecord:
        record = self.state.read(name)
        if record is None or not running(record):
            raise SandboxError(f"{what} ({name}) is not running in {self.state.root}; run `exaserve sandbox up` first")
        return record

    def _worker(self, url: str) -> ProcessRecord:
        return self._record(worker_name(int(url.rsplit(":", 1)[1])), f"the worker at {url}")

    def _by_url(self, kind: str, url: str) -> ProcessRecord:
        found = [r for r in self.state.records() if r.kind == kind and r.url.rstrip("/") == url.rstrip("/")]
        if not found:
            raise SandboxError(f"no {kind} process at {url} in {self.state.root}; run `exaserve sandbox up` first")
        return self._record(found[0].name, f"the {kind} at {url}")

    def _kill(self, record: ProcessRecord) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record.pid, signal.SIGKILL)
        self.killed[record.name] = record

    async def _put(self, urls: tuple[str, ...], body: dict[str, object] | None) -> None:
        # a loaded machine answers late (CI beside stress-ng: ConnectTimeout at 2 s); a fault not injected fails the
        # drill, a late one only widens its injection time, which the drill measures (Run.injection_s)
        async with http_client(timeout=CONTROL_TIMEOUT_S) as http:
            for url in urls:
                if body is None:
                    with contextlib.suppress(httpx.HTTPError):  # restarted since: a fresh worker has no fault
                        await http.delete(url + FAULT_PATH)
                else:
                    (await http.put(url + FAULT_PATH, json=body)).raise_for_status()

    async def inject(self, fault: Fault, subject: Subject, sizes: FaultSizes) -> str:
        kind, component = fault.kind, fault.component
        urls = subject.urls
        if component is Component.ROUTER:
            assert subject.router is not None
            self._kill(self._by_url("router", subject.router))
            return f"SIGKILL router {subject.router}"
        if component is Component.CONTROLLER:
            assert subject.controller is not None
            self._kill(self._record(subject.controller, f"the leading controller {subject.controller}"))
            return f"SIGKILL controller {subject.controller} (the leader)"
        if kind is FaultKind.SIGKILL:
            records = [self._worker(u) for u in urls]
            if component is Component.NODE:
                assert subject.node is not None
                self._kill(self._record(f"agent-{subject.node}", f"the agent of {subject.node}"))
            for record in records:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(record.pid, signal.SIGKILL)
            return f"SIGKILL {'the agent and ' if component is Component.NODE else ''}{', '.join(urls)}"
        if kind is FaultKind.SIGSTOP:
            for url in urls:
                self.stopped[url] = self._worker(url)
                os.kill(self.stopped[url].pid, signal.SIGSTOP)
            return f"SIGSTOP {', '.join(urls)}"
        bodies: dict[FaultKind, dict[str, object]] = {
            FaultKind.LATENCY: {"delay_ms": sizes.slow_latency_s.value * 1000},
            FaultKind.ERRORS: {"errors": True},
            FaultKind.WEDGED: {"wedged": True},
            FaultKind.FLAP: {"flap_stall_s": sizes.flap_stall_s.value},
            FaultKind.GENERATION_ERRORS: {"generation_errors": True},
            FaultKind.MEMORY: {
                "token_usage": sizes.memory_token_usage.value,
                "admit": int(sizes.memory_admit.value),
                "slowdown": sizes.memory_slowdown.value,
            },
            FaultKind.JITTER: {"delay_ms": sizes.jitter_delay_s.value * 1000, "jitter_ms": sizes.jitter_s.value * 1000},
        }
        body = bodies[kind]
        await self._put(urls, body)
        return f"PUT {FAULT_PATH} {body} on {', '.join(urls)}"

    async def heal(self, fault: Fault, subject: Subject) -> list[str]:
        done: list[str] = []
        kind, component = fault.kind, fault.component
        if component in (Component.ROUTER, Component.CONTROLLER) or (
            component is Component.NODE and kind is FaultKind.SIGKILL
        ):
            if component is Component.NODE:
                done += await self._restart_workers(subject)
            for name, record in list(self.killed.items()):
                await asyncio.to_thread(respawn, self.state, record, self._ready(record), self._budget())
                del self.killed[name]
                done.append(f"started {name} again")
            return done
        if kind is FaultKind.SIGKILL:
            return await self._restart_workers(subject)
        if kind is FaultKind.SIGSTOP:
            for url, record in list(self.stopped.items()):
                if running(record):
                    os.kill(record.pid, signal.SIGCONT)
                    done.append(f"SIGCONT {url}")
                del self.stopped[url]
            return done
        await self._put(subject.urls, None)
        return [f"DELETE {FAULT_PATH} on {', '.join(subject.urls)}"]

    def _budget(self) -> float:
        return self.spec.serving.startup_budget_s

    def _ready(self, record: ProcessRecord) -> Callable[[], bool]:
        if record.kind == "router":
            return lambda: http_ok(record.url + "/workers")
        if record.kind == "controller":
            return lambda: http_ok(record.url + "/v1/status")
        return lambda: True

    async def _restart_workers(self, subject: Subject) -> list[str]:
        """Start the subject's workers that are not running (the controller restarts a crashed one itself)."""
        done = []
        for rid, url in zip(subject.replicas, subject.urls, strict=True):
            name = worker_name(int(url.rsplit(":", 1)[1]))
            record = self.state.read(name)
            if record is not None and running(record):
                continue
            replica = self.replicas[rid]
            config = worker_config(self.spec, replica, self.spec.group_version(replica.group))
            await asyncio.to_thread(start_worker, self.state, name, config, timeout_s=self._budget())
            done.append(f"started {rid} again")
        return done


def fleet_urls(fleet: Fleet) -> FleetUrls:
    """Where a sandbox fleet answers a drill: its routers, controllers (with ``sandbox.runtime``), replicas by node
    and Prometheus (with ``sandbox.prometheus``)."""
    spec = fleet.spec
    assert spec.sandbox is not None  # callers drill sandbox stacks only
    nodes: dict[str, list[str]] = {}
    for r in fleet.plan.replicas:
        nodes.setdefault(r.node.name, []).append(r.id)
    return FleetUrls(
        routers=sandbox_endpoints(spec).routers,
        controllers=tuple(controller_urls(spec)) if spec.sandbox.runtime else (),
        replicas=replica_urls(fleet.plan),
        nodes={n: tuple(ids) for n, ids in nodes.items()},
        prometheus=prometheus_url(spec) if spec.sandbox.prometheus else None,
    )
