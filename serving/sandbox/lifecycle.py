"""The sandbox's bring-up and tear-down: :func:`up` starts the real router on loopback in front of one simulated
worker per replica (with ``sandbox.runtime`` the runtime layer, with ``sandbox.prometheus`` a Prometheus server,
last); ``--simulate`` derives a sandbox for a stack without one, at its own size, after measuring this machine's
CPU costs. :func:`down` stops every process. Both hold the stack's lock (:class:`LockedError` when another
updater has it). A request the machine or the stack cannot serve raises :class:`SandboxInputError` (exit 2); a
sandbox that did not start, :class:`SandboxStartError` (exit 1).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from serving.fleet_http import FleetHttp, HttpFailure
from serving.plan.loader import load_fleet
from serving.plan.model import Fleet
from serving.rollout.backends import BackendError
from serving.rollout.journal import StackLock, StackState
from serving.sandbox import capacity, processes, scale
from serving.sandbox.backend import node_groups, router_flags, worker_config, worker_name
from serving.sandbox.prometheus import start_prometheus
from serving.sandbox.runtime import router_urls, start_extra_routers, start_runtime
from serving.sandbox.worker_config import health_answer_bound_s
from serving.sandbox.worker_host import start_host
from serving.spec.stack import SpecError, Stack


class SandboxInputError(ValueError):
    """The sandbox was not started: the stack, the flags or this machine do not allow it (exit 2)."""


class SandboxStartError(RuntimeError):
    """The sandbox did not start, or the machine could not be measured (exit 1)."""


@dataclass(frozen=True)
class Started:
    """A sandbox that runs: its stack (with ``--simulate`` the derived one), fleet, every worker's URL and version,
    the runtime layer's URLs (None without ``sandbox.runtime``) and what it needs of the machine."""

    stack: Stack
    fleet: Fleet
    workers: dict[str, tuple[str, str]]
    runtime: dict[str, list[str]] | None
    needs: scale.Needs


def up(st: Stack, state_dir: Path | None, *, simulate: bool, cpu_share: float, note: Callable[[str], None]) -> Started:
    """Start ``st``'s sandbox (stopping what its state directory still runs first); ``note`` is told what takes
    time: measuring this machine, each step of the start and the workers healthy so far."""
    if st.spec.sandbox is None and not simulate:
        raise SandboxInputError(
            f"stack {st.name!r} has no sandbox: section; `exaserve sandbox` runs only sandbox stacks, or add "
            "--simulate to rehearse this one's replicas as simulated workers on loopback"
        )
    if st.spec.sandbox is not None and simulate:
        raise SandboxInputError(
            f"stack {st.name!r} already has a sandbox: section; run `exaserve sandbox up` without --simulate"
        )
    paths = StackState.for_stack(scale.simulated_name(st.name) if simulate else st.name, state_dir)
    with StackLock(paths.lock_path).held("sandbox up"):
        processes.stop_all(processes.StateDir(paths.sandbox_dir))
        fleet = load_fleet(st.name, st.spec)
        if simulate:
            try:
                st = scale.write_simulated_stack(st, fleet.plan, state_dir)
            except (SpecError, ValueError, processes.SandboxError) as exc:
                raise SandboxInputError(f"cannot derive the simulated stack: {exc}") from None
            fleet = load_fleet(st.name, st.spec)  # the derived stack's own fleet
        costs = None
        if simulate:
            note(
                f"measuring this machine's CPU costs: {capacity.CALIBRATION_WORKERS} simulated workers, "
                f"{capacity.CALIBRATION_PROBES:,} agent probes"
            )
            try:
                costs = capacity.measure_costs()
            except processes.SandboxError as exc:
                raise SandboxStartError(f"sandbox of {st.name!r} not started: {exc}") from None
        try:
            needs = scale.check_machine(fleet, costs=costs, cpu_share=cpu_share)
        except scale.MachineTooSmall as exc:
            raise SandboxInputError(f"sandbox of {st.name!r} not started: {exc}") from None
        try:
            workers, runtime = asyncio.run(_start(st, paths, fleet, note))
        except (processes.SandboxError, BackendError, TimeoutError) as exc:
            processes.stop_all(processes.StateDir(paths.sandbox_dir))
            raise SandboxStartError(f"sandbox did not start: {exc}") from None
    return Started(st, fleet, workers, runtime, needs)


def down(st: Stack, state_dir: Path | None, *, simulate: bool) -> tuple[str, list[str]]:
    """Stop every process of ``st``'s sandbox (with ``simulate``: of its simulated sandbox): the sandbox's name
    and the processes stopped."""
    name = scale.simulated_name(st.name) if simulate else st.name
    paths = StackState.for_stack(name, state_dir)
    with StackLock(paths.lock_path).held("sandbox down"):
        return name, processes.stop_all(processes.StateDir(paths.sandbox_dir))


async def _start(
    st: Stack, paths: StackState, fleet: Fleet, note: Callable[[str], None]
) -> tuple[dict[str, tuple[str, str]], dict[str, list[str]] | None]:
    """Workers, then the routers once the workers are healthy, the runtime layer, Prometheus; ``note`` is told each
    step and how many workers are healthy while they load."""
    spec = fleet.spec
    assert spec.sandbox is not None
    state = processes.StateDir(paths.sandbox_dir)
    budget = spec.serving.startup_budget_s
    configs = {r.id: worker_config(spec, r, spec.group_version(r.group)) for r in fleet.plan.replicas}
    note(f"starting {len(configs)} simulated workers")
    if spec.sandbox.nodes_per_process is None:
        await asyncio.gather(
            *(
                asyncio.to_thread(processes.start_worker, state, worker_name(c.port), c, wait="started")
                for c in configs.values()
            )
        )
    else:
        by_port = {c.port: c for c in configs.values()}
        await asyncio.gather(
            *(
                asyncio.to_thread(
                    start_host,
                    state,
                    g.index,
                    [by_port[p] for p in g.ports],
                    spec.sandbox.control_base_port + g.index,
                    timeout_s=budget,
                )
                for g in node_groups(fleet)
            )
        )
    waited = [c for c in configs.values() if not c.never_ready]
    bound = max((health_answer_bound_s(c) for c in waited), default=1.0)
    await _healthy([c.url for c in waited], budget, bound, note)
    ready = sum(not c.never_ready for c in configs.values())
    count = len(router_urls(spec)) if spec.sandbox.runtime else 1
    note(f"starting {count} router(s), each registering {ready} workers")
    worker_urls = [c.url for c in configs.values()]
    flags = router_flags(fleet, worker_urls)
    routers: list[Awaitable[object]] = [
        asyncio.to_thread(processes.start_router, state, flags, healthy_workers=ready, timeout_s=budget)
    ]
    if spec.sandbox.runtime:  # every router at once: each one's registration of the workers takes its own CPU time
        routers.append(
            asyncio.to_thread(start_extra_routers, state, fleet, worker_urls, healthy=ready, timeout_s=budget)
        )
    await asyncio.gather(*routers)
    runtime = None
    if spec.sandbox.runtime:
        note("starting the runtime layer: etcd, controllers, node agents")
        runtime = await asyncio.to_thread(
            start_runtime, state, fleet, stack_file=st.path, state_dir=paths.root.parent, timeout_s=budget
        )
    if spec.sandbox.prometheus:  # last: its first scrapes find everything up
        note("starting prometheus")
        await asyncio.to_thread(start_prometheus, state, fleet, timeout_s=budget)
    return {rid: (c.url, c.version) for rid, c in configs.items()}, runtime


async def _healthy(urls: list[str], budget: float, answer_s: float, note: Callable[[str], None]) -> None:
    """Until every worker's ``/health`` answers 200 within ``answer_s``, telling ``note`` how many do; TimeoutError
    past ``serving.startup_budget_s``."""
    deadline = time.monotonic() + budget
    http = FleetHttp(timeout_s=answer_s)

    async def ok(url: str) -> bool:
        try:
            return (await http.get(url + "/health")).status == 200
        except HttpFailure:
            return False

    pending = set(urls)
    try:
        while pending:
            order = sorted(pending)
            answers = await asyncio.gather(*(ok(u) for u in order))
            pending -= {u for u, good in zip(order, answers, strict=True) if good}
            note(f"workers healthy: {len(urls) - len(pending)}/{len(urls)}")
            if pending and time.monotonic() > deadline:
                shown = ", ".join(sorted(pending)[:8])
                raise TimeoutError(
                    f"{len(pending)} workers ({shown}, …) not healthy within serving.startup_budget_s={budget:g}"
                )
            if pending:
                await asyncio.sleep(0.1)
    finally:
        await http.aclose()
