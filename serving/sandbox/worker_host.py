"""Many SIMULATED SGLang workers in one process, for the scale sandbox: one asyncio event loop serves hundreds of ports.

Each port runs :class:`serving.sandbox.worker.SimulatedWorker` — the simulated worker (NOT SGLang, no model, no GPU) the
one-process-per-worker sandbox runs, with its own app, state and metrics — and lives as that worker's process would:
during ``startup_delay_s`` its port is closed ("model loading"), then it listens; a stop makes its health endpoints
answer 503, closes its port and gives in-flight requests up to the stop's timeout (0 cuts them at once: a killed
process). A stopped port answers nothing, as a dead process.

A control endpoint on loopback (the host's process record's URL) restarts or stops single ports and counts what the
workers received, by method, path and client (the first word of its ``User-Agent``):

* ``GET /v1/workers`` → ``{"workers": [{"port", "version", "state"}…], "requests": {"GET /health sgl-router": n…}}``;
* ``POST /v1/restart`` ``{"workers": [config…], "stop_timeout_s": s}``: stop each port that runs, start it again with
  its new config; answers once every old worker stopped and every new one is starting (its start-up delay runs on);
* ``POST /v1/stop`` ``{"ports": […], "stop_timeout_s": s}``: stop them.

A config is :class:`~serving.sandbox.worker_config.WorkerConfig` as a JSON object (:func:`config_json`). SIGTERM stops
every worker (each within its ``shutdown_timeout_s``) and exits.

Run: ``python -m serving.sandbox.worker_host --control-port P --configs FILE`` (FILE: a JSON list of configs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import signal
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import httpx
from aiohttp import web

from serving.fleet_http import http_client
from serving.sandbox.processes import ProcessRecord, SandboxError, StateDir, http_ok, start_service
from serving.sandbox.worker import SimulatedWorker, _DropGrpcProbes
from serving.sandbox.worker_config import LOOPBACK, WorkerConfig, ensure_model_dir

WORKERS_PATH = "/v1/workers"
RESTART_PATH = "/v1/restart"
STOP_PATH = "/v1/stop"
State = Literal["loading", "serving", "stopping", "stopped"]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def config_json(config: WorkerConfig) -> dict[str, Any]:
    return dataclasses.asdict(config)


def config_from_json(data: Mapping[str, Any]) -> WorkerConfig:
    """The inverse of :func:`config_json`; a wrong field or value raises ValueError naming it."""
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    try:
        return WorkerConfig(**fields)
    except TypeError as exc:
        raise ValueError(f"not a simulated worker config: {exc}") from None


class HostedWorker:
    """One port of the host: a :class:`SimulatedWorker` behind its own aiohttp runner."""

    def __init__(self, config: WorkerConfig, counts: Counter[str]) -> None:
        self.config = config
        self.state: State = "loading"
        self._counts = counts
        self._worker: SimulatedWorker | None = None
        self._runner: web.AppRunner | None = None
        self._started = asyncio.create_task(self._start())

    async def _start(self) -> None:
        await asyncio.sleep(self.config.startup_delay_s)  # "model loading": the port stays closed
        self._worker = SimulatedWorker(self.config)
        app = self._worker.build_app()
        app.middlewares.append(self._count)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=self.config.shutdown_timeout_s)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.config.host, self.config.port).start()
        self.state = "serving"

    @web.middleware
    async def _count(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        client = request.headers.get("User-Agent", "-").split("/", 1)[0] or "-"
        self._counts[f"{request.method} {request.path} {client}"] += 1
        return await handler(request)

    async def started(self) -> None:
        """Until the port listens; raises OSError when it cannot."""
        await asyncio.shield(self._started)

    async def stop(self, timeout_s: float) -> None:
        """Health 503, port closed, in-flight requests given ``timeout_s``, then cut."""
        self.state = "stopping"
        if not self._started.done():
            self._started.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await self._started
        runner = self._runner
        if self._worker is not None:
            self._worker.begin_shutdown()
        if runner is not None:
            for site in list(runner.sites):
                await site.stop()
            if runner.server is not None:
                runner.server.pre_shutdown()
                await runner.server.shutdown(timeout_s)
            await runner.cleanup()
        self.state = "stopped"


class WorkerHost:
    """The workers of one host process, by port, and the control endpoint's handlers."""

    def __init__(self) -> None:
        self.workers: dict[int, HostedWorker] = {}
        self.counts: Counter[str] = Counter()

    def start(self, configs: Iterable[WorkerConfig]) -> list[HostedWorker]:
        out = []
        for config in configs:
            if config.host != LOOPBACK:
                raise ValueError(f"worker on {config.host}:{config.port}: the sandbox listens on {LOOPBACK} only")
            ensure_model_dir(Path(config.model_path))
            self.workers[config.port] = HostedWorker(config, self.counts)
            out.append(self.workers[config.port])
        return out

    async def stop(self, ports: Iterable[int], timeout_s: float) -> None:
        running = [w for p in ports if (w := self.workers.get(p)) is not None and w.state != "stopped"]
        await asyncio.gather(*(w.stop(timeout_s) for w in running))

    async def restart(self, configs: Sequence[WorkerConfig], stop_timeout_s: float) -> None:
        await self.stop([c.port for c in configs], stop_timeout_s)
        await asyncio.gather(*(_listening_or_loading(w) for w in self.start(configs)))

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_get(WORKERS_PATH, self._on_workers)
        app.router.add_post(RESTART_PATH, self._on_restart)
        app.router.add_post(STOP_PATH, self._on_stop)
        return app

    async def _on_workers(self, _request: web.Request) -> web.Response:
        workers = [{"port": p, "version": w.config.version, "state": w.state} for p, w in sorted(self.workers.items())]
        return web.json_response({"workers": workers, "requests": dict(self.counts)})

    async def _on_restart(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            configs = [config_from_json(c) for c in body["workers"]]
            timeout_s = float(body["stop_timeout_s"])
        except (ValueError, KeyError, TypeError) as exc:
            return web.json_response({"error": f"{type(exc).__name__}: {exc}"}, status=400)
        try:
            await self.restart(configs, timeout_s)
        except OSError as exc:
            return web.json_response({"error": f"cannot listen: {exc}"}, status=500)
        return web.json_response({"restarted": [c.port for c in configs]})

    async def _on_stop(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            ports = [int(p) for p in body["ports"]]
            timeout_s = float(body["stop_timeout_s"])
        except (ValueError, KeyError, TypeError) as exc:
            return web.json_response({"error": f"{type(exc).__name__}: {exc}"}, status=400)
        await self.stop(ports, timeout_s)
        return web.json_response({"stopped": ports})


async def _listening_or_loading(worker: HostedWorker) -> None:
    """A worker with no start-up delay is listening before the restart answers; one that loads is left loading."""
    if worker.config.startup_delay_s == 0:
        await worker.started()


async def serve(control_port: int, configs: Sequence[WorkerConfig]) -> None:
    """Listen for control on loopback, start every worker, run until SIGTERM or SIGINT, then stop them all."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    host = WorkerHost()
    runner = web.AppRunner(host.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, LOOPBACK, control_port).start()
    host.start(configs)
    print(f"simulated worker host: {len(configs)} workers, control on {LOOPBACK}:{control_port}", file=sys.stderr)
    await stop.wait()
    await asyncio.gather(*(w.stop(w.config.shutdown_timeout_s) for w in host.workers.values()))
    await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m serving.sandbox.worker_host",
        description="Many SIMULATED SGLang workers (no model, no GPU) in one event loop, for the scale sandbox.",
        allow_abbrev=False,
    )
    parser.add_argument("--control-port", type=int, required=True, help="loopback port of the control endpoint")
    parser.add_argument("--configs", type=Path, required=True, help="JSON list of the workers' configs")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        configs = [config_from_json(c) for c in json.loads(args.configs.read_text())]
    except (OSError, ValueError, TypeError) as exc:
        print(f"error: --configs {args.configs}: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiohttp.server").addFilter(_DropGrpcProbes())
    try:
        asyncio.run(serve(args.control_port, configs))
    except OSError as exc:
        print(f"error: cannot listen: {exc}; choose free ports", file=sys.stderr)
        return 1
    return 0


# ----- the other side: starting hosts and calling their control endpoints ----------------------------------------
def host_name(index: int) -> str:
    """Process name of worker host ``index`` in the state directory (``worker-host-<index>``)."""
    return f"worker-host-{index}"


def start_host(
    state: StateDir, index: int, configs: Sequence[WorkerConfig], control_port: int, *, timeout_s: float
) -> ProcessRecord:
    """Start worker host ``index`` serving ``configs`` (its record lists their ports); wait until its control
    endpoint answers (the workers themselves are then starting)."""
    name = host_name(index)
    path = state.record_path(name).with_suffix(".workers")
    path.write_text(json.dumps([config_json(c) for c in configs]))
    url = f"http://{LOOPBACK}:{control_port}"
    argv = [
        sys.executable,
        "-m",
        "serving.sandbox.worker_host",
        "--control-port",
        str(control_port),
        "--configs",
        str(path),
    ]
    ports = [c.port for c in configs]
    return start_service(
        state, name, "worker-host", argv, url, lambda: http_ok(url + WORKERS_PATH), timeout_s, ports=ports
    )


def hosts_by_port(state: StateDir) -> dict[int, ProcessRecord]:
    """Port → the record of the worker host serving it."""
    return {port: r for r in state.records() if r.kind == "worker-host" for port in r.ports}


async def control(url: str, path: str, body: Mapping[str, Any] | None, timeout_s: float) -> dict[str, Any]:
    """One call to a host's control endpoint (GET without ``body``); raises SandboxError naming the host."""
    try:
        async with http_client(timeout=timeout_s) as http:
            response = await (http.get(url + path) if body is None else http.post(url + path, json=body))
    except httpx.HTTPError as exc:
        raise SandboxError(f"worker host {url}: {type(exc).__name__} {exc}; is the sandbox up?") from exc
    if response.status_code != 200:
        raise SandboxError(f"worker host {url}{path} answered {response.status_code}: {response.text[:300]}")
    return dict(response.json())


async def request_counts(hosts: Sequence[ProcessRecord], timeout_s: float = 120.0) -> dict[str, int]:
    """The requests the hosts' workers have served so far, summed over ``hosts`` (``METHOD PATH CLIENT`` → count,
    the client being its User-Agent or ``-``: the router sends none)."""
    answers = await asyncio.gather(*(control(h.url, WORKERS_PATH, None, timeout_s) for h in hosts))
    total: dict[str, int] = {}
    for answer in answers:
        for key, n in answer["requests"].items():
            total[key] = total.get(key, 0) + int(n)
    return total


async def _each_host(
    state: StateDir, ports: Sequence[int], call: Callable[[ProcessRecord, list[int]], Awaitable[object]]
) -> list[BaseException | None]:
    """``call(host, its ports)`` once per host serving ``ports`` (concurrently); per port, what went wrong."""
    hosts = hosts_by_port(state)
    by_host: dict[str, list[int]] = {}
    outcome: dict[int, BaseException | None] = {}
    for port in ports:
        if port in hosts:
            by_host.setdefault(hosts[port].name, []).append(port)
        else:
            outcome[port] = SandboxError(
                f"no worker host of {state.root} serves port {port}; run `exaserve sandbox up`"
            )
    records = {r.name: r for r in hosts.values()}
    done = await asyncio.gather(*(call(records[n], p) for n, p in by_host.items()), return_exceptions=True)
    for (_name, host_ports), result in zip(by_host.items(), done, strict=True):
        for port in host_ports:
            outcome[port] = result if isinstance(result, BaseException) else None
    return [outcome[p] for p in ports]


async def restart_hosted(
    state: StateDir, configs: Sequence[WorkerConfig], *, stop_timeout_s: float, timeout_s: float
) -> list[BaseException | None]:
    """Restart each config's port inside the host serving it (:data:`RESTART_PATH`); per config, what went wrong."""
    by_port = {c.port: c for c in configs}

    async def one(host: ProcessRecord, ports: list[int]) -> object:
        body = {"workers": [config_json(by_port[p]) for p in ports], "stop_timeout_s": stop_timeout_s}
        return await control(host.url, RESTART_PATH, body, stop_timeout_s + timeout_s)

    return await _each_host(state, [c.port for c in configs], one)


async def stop_hosted(state: StateDir, ports: Sequence[int], *, stop_timeout_s: float) -> None:
    """Stop the workers on ``ports`` inside their hosts (0 s: in-flight requests are cut, as by a kill)."""

    async def one(host: ProcessRecord, host_ports: list[int]) -> object:
        body = {"ports": host_ports, "stop_timeout_s": stop_timeout_s}
        return await control(host.url, STOP_PATH, body, stop_timeout_s + 10.0)

    problems = [exc for exc in await _each_host(state, ports, one) if exc is not None]
    if problems:
        raise problems[0]


if __name__ == "__main__":
    sys.exit(main())
