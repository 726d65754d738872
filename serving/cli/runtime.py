"""``exaserve controller run``, ``exaserve agent run`` and ``exaserve status``: the runtime layer (docs/runtime.md).

A sandbox stack needs no URLs: routers, controllers and etcd sit on its loopback ports
(:mod:`serving.sandbox.runtime`). Elsewhere pass each router (``--router``), each controller (``--controller``)
and the coordination service (``--etcd`` or ``--election kubernetes``). ``status`` exits 1 when no controller
answers, no leader is known, a node is suspect or a replica is out of rotation.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import httpx
import typer
from rich.table import Table

from serving.cli.options import (
    DEFAULT_KNOWN_HOSTS,
    EXIT_PROBLEM,
    IdentityOpt,
    JsonOpt,
    KnownHostsOpt,
    KubeconfigOpt,
    KubeContextOpt,
    OutputOpt,
    SshConfigOpt,
    StackFileOpt,
    StackOpt,
    StateDirOpt,
    app,
    console,
    emit_json,
    fail,
    print_table,
    resolve_stack,
)
from serving.cli.state import stack_state
from serving.fleet_http import http_client
from serving.kubeapi import KubeApi, KubeConfigError
from serving.plan.loader import load_fleet
from serving.plan.model import Fleet
from serving.render.router import router_args, server_selector
from serving.rollout.backends import BackendError
from serving.rollout.session import RolloutInputError, shown
from serving.router.client import RouterApiError
from serving.router.membership import RouterSet
from serving.runtime.agent import Agent, AgentConfig, Boot
from serving.runtime.discovery import NodePods
from serving.runtime.eviction import PodEvictionRestarter
from serving.runtime.leader import Election, EtcdElection, KubernetesLeaseElection
from serving.runtime.service import STATUS_PATH, BackendRestarter, ControllerService, Restarter
from serving.spec.stack import Stack, kubernetes_context

if TYPE_CHECKING:
    from serving.rollout.operation import BackendConfig  # at run time where used: it loads the ssh client

controller_app = typer.Typer(
    help="The fleet controller (one of scheduler.instances, one leader).", no_args_is_help=True
)
agent_app = typer.Typer(help="The node agent: one batched report per node per heartbeat.", no_args_is_help=True)
app.add_typer(controller_app, name="controller")
app.add_typer(agent_app, name="agent")

RouterOpt = Annotated[list[str] | None, typer.Option("--router", help="A router instance's API URL; repeat for each.")]
ControllerOpt = Annotated[
    list[str] | None, typer.Option("--controller", help="A controller instance's URL; repeat for each.")
]
RestartBackend = Literal["auto", "local", "ssh", "kubernetes", "none"]
DiscoverOpt = Annotated[
    Literal["plan", "kubernetes"],
    typer.Option(
        "--discover",
        help="Replicas: the plan's placement (bare metal, sandbox) or, on Kubernetes, the serving pods per node.",
    ),
]


def _sandbox_urls(st: Stack, what: Literal["routers", "router-metrics", "controllers", "etcd"]) -> list[str]:
    if st.spec.sandbox is None:
        return []
    from serving.sandbox import runtime as sandbox_runtime  # noqa: PLC0415 - sandbox stacks only

    if what == "routers":
        return sandbox_runtime.router_urls(st.spec)
    if what == "router-metrics":
        return sandbox_runtime.router_metrics_urls(st.spec)
    if what == "controllers":
        return sandbox_runtime.controller_urls(st.spec)
    return [sandbox_runtime.etcd_url(st.spec)]


def _restarter(
    st: Stack,
    fleet: Fleet,
    kind: RestartBackend,
    state_dir: Path | None,
    known_hosts: Path,
    identity: Path | None,
    ssh_config: Path | None,
) -> Restarter | None:
    if kind == "auto":
        kind = "local" if st.spec.sandbox is not None else "none"
    if kind == "none":
        return None
    if kind == "local":
        if st.spec.sandbox is None:
            fail("--backend local runs only sandbox stacks; use ssh or kubernetes")
        from serving.sandbox.runtime import SandboxRestarter  # noqa: PLC0415

        return SandboxRestarter(fleet, stack_state(st, state_dir).sandbox_dir)
    if kind == "kubernetes":  # a migration evicts the replica's pod, within its disruption budget
        try:
            return PodEvictionRestarter(KubeApi.in_cluster(), st.spec.kubernetes.namespace)
        except KubeConfigError as exc:
            fail(f"--backend kubernetes: {exc}")
    from serving.rollout.operation import BackendConfig, open_backend  # noqa: PLC0415 - loads the ssh client

    config = BackendConfig(kind, known_hosts=known_hosts, identity=identity, ssh_config=ssh_config)
    try:
        return BackendRestarter(fleet, open_backend(fleet, stack_state(st, state_dir), config))
    except RolloutInputError as exc:
        fail(str(exc))


def _election(st: Stack, kind: str, etcd: list[str] | None, identity: str) -> Election:
    rt = st.spec.runtime
    if kind == "kubernetes":
        try:
            api = KubeApi.in_cluster()
        except KubeConfigError as exc:
            fail(f"--election kubernetes runs inside a pod: {exc}")
        return KubernetesLeaseElection(api, st.spec.kubernetes.namespace, rt.lease_name, identity, rt.lease_ttl_s)
    endpoints = etcd or _sandbox_urls(st, "etcd") or list(rt.etcd_endpoints)
    return EtcdElection(endpoints, f"/exaserve/{st.name}/{rt.lease_name}", identity, rt.lease_ttl_s)


@controller_app.command("run")
def controller_run(
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    state_dir: StateDirOpt = None,
    name: Annotated[str | None, typer.Option("--name", help="This instance's name (default host-pid).")] = None,
    host: Annotated[str | None, typer.Option("--host", help="Listen address (sandbox: 127.0.0.1).")] = None,
    port: Annotated[
        int | None, typer.Option("--port", min=1, max=65535, help="Default runtime.controller_port.")
    ] = None,
    routers: RouterOpt = None,
    router_service: Annotated[
        str | None,
        typer.Option("--router-service", help="HOST:PORT of the routers' headless Service (every router pod)."),
    ] = None,
    election: Annotated[
        Literal["etcd", "kubernetes"], typer.Option("--election", help="etcd (bare metal) or a Kubernetes Lease.")
    ] = "etcd",
    etcd: Annotated[list[str] | None, typer.Option("--etcd", help="etcd URL; default runtime.etcd_endpoints.")] = None,
    backend: Annotated[
        RestartBackend,
        typer.Option(
            "--backend",
            help="How to restart a migrated replica (kubernetes: evict its pod); auto: local in a sandbox, else none.",
        ),
    ] = "auto",
    known_hosts: KnownHostsOpt = DEFAULT_KNOWN_HOSTS,
    ssh_identity: IdentityOpt = None,
    ssh_config: SshConfigOpt = None,
    discover: DiscoverOpt = "plan",
    as_json: JsonOpt = False,
) -> None:
    """Run one controller instance until SIGTERM/Ctrl-C: apply reports, elect a leader, act when leader."""
    del as_json  # a long-running service: logs go to stderr
    st = resolve_stack(stack, stack_file)
    router_list = routers or ([] if router_service else _sandbox_urls(st, "routers"))
    if not router_list and not router_service:
        fail("pass --router URL for each router instance or --router-service HOST:PORT")
    name = name or f"{socket.gethostname()}-{os.getpid()}"
    listen = host or ("127.0.0.1" if st.spec.sandbox is not None else "0.0.0.0")  # noqa: S104 - agents report in
    fleet = load_fleet(st.name, st.spec)
    service = ControllerService(
        fleet,
        identity=name,
        election=_election(st, election, etcd, name),
        routers=RouterSet(
            router_list,
            service=router_service,
            timeout_s=st.spec.serving.health_check_timeout_s,
            answering_only=True,  # one router instance down must not stall the runtime
            # their metrics (circuit breakers): a sandbox's routers each on their own port, else the rendered port
            metrics=_sandbox_urls(st, "router-metrics") if not routers and not router_service else (),
            metrics_port=router_args(fleet).metrics_port,
        ),
        restarter=_restarter(st, fleet, backend, state_dir, known_hosts, ssh_identity, ssh_config),
        discovered=discover == "kubernetes",
    )
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s {name} %(levelname)s %(message)s")
    asyncio.run(_serve(service, listen, port or st.spec.runtime.controller_port))


async def _serve(service: ControllerService, host: str, port: int) -> None:
    import signal  # noqa: PLC0415

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await service.run(host, port, stop)


@agent_app.command("run")
def agent_run(
    nodes: Annotated[
        list[str],
        typer.Option(
            "--node",
            help="The node this agent runs on (a node name of the stack); repeat it to run several nodes' agents in "
            "one process, as the scale sandbox does.",
        ),
    ],
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    controllers: ControllerOpt = None,
    dcgm_url: Annotated[
        str | None, typer.Option("--dcgm-url", help="NVIDIA DCGM exporter metrics URL on this node.")
    ] = None,
    controller_service: Annotated[
        str | None,
        typer.Option("--controller-service", help="HOST:PORT of the controllers' headless Service (every address)."),
    ] = None,
    discover: DiscoverOpt = "plan",
    simulated_boot: Annotated[
        Path | None,
        typer.Option(
            "--simulated-boot",
            hidden=True,
            help="SIMULATION ONLY (the sandbox's reboot drill): the boot id and boot time to report, from this JSON "
            "file, instead of this machine's.",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Run the node agent until SIGTERM/Ctrl-C: probe this node's replicas and report once per interval."""
    del as_json
    st = resolve_stack(stack, stack_file)
    targets = controllers or ([] if controller_service else _sandbox_urls(st, "controllers"))
    if not targets and not controller_service:
        fail("pass --controller URL for each controller instance or --controller-service HOST:PORT")
    if controller_service and not controller_service.rpartition(":")[2].isdigit():
        fail(f"--controller-service {controller_service!r}: give HOST:PORT, e.g. exaserve-controller.exaserve.svc:9410")
    fleet = load_fleet(st.name, st.spec)
    configs = []
    for node in nodes:
        try:
            configs.append(AgentConfig.for_node(fleet, node, targets, dcgm_url, controller_service))
        except ValueError as exc:
            fail(f"--node {node}: {exc}")
    api = None
    if discover == "kubernetes":
        try:
            api = KubeApi.in_cluster()
        except KubeConfigError as exc:
            fail(f"--discover kubernetes: {exc}")
    selector, port, namespace = server_selector(fleet.plan), st.spec.serving.port, st.spec.kubernetes.namespace
    try:
        boot = None if simulated_boot is None else Boot.simulated(simulated_boot)
    except (OSError, ValueError, KeyError) as exc:
        fail(f"--simulated-boot {simulated_boot}: {exc}; give a JSON file with boot_id and booted_at_ns")
    agents = [
        Agent(c, None if api is None else NodePods(api, namespace, selector, c.node, port), boot) for c in configs
    ]
    asyncio.run(_agents(agents))


async def _agents(agents: list[Agent]) -> None:
    import signal  # noqa: PLC0415

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await asyncio.gather(*(a.run(stop) for a in agents))
    finally:
        await asyncio.gather(*(a.aclose() for a in agents))


async def _statuses(urls: list[str], timeout_s: float) -> dict[str, dict[str, Any] | str]:
    async with http_client(timeout=timeout_s) as http:

        async def one(url: str) -> dict[str, Any] | str:
            try:
                response = await http.get(url.rstrip("/") + STATUS_PATH)
                response.raise_for_status()
                return dict(response.json())
            except (httpx.HTTPError, ValueError) as exc:
                return f"{type(exc).__name__}: {exc}"

        found = await asyncio.gather(*(one(u) for u in urls))
    return dict(zip(urls, found, strict=True))


async def _router_views(routers: list[str], timeout_s: float) -> tuple[dict[str, dict[str, bool]], dict[str, str]]:
    """Router URL → (worker URL → healthy) for the instances that answer, and why the others did not."""
    if not routers:
        return {}, {}
    try:
        listed, silent = await RouterSet(routers, timeout_s=timeout_s, answering_only=True).membership()
    except (httpx.HTTPError, RouterApiError, OSError) as exc:
        return {}, dict.fromkeys(routers, f"{type(exc).__name__}: {exc}")
    return {r: {u: w.is_healthy for u, w in workers.items()} for r, workers in listed.items()}, silent


def _on_routers(url: str, views: dict[str, dict[str, bool]], silent: dict[str, str]) -> dict[str, str]:
    """What each router instance does with the replica at ``url``: routes (healthy), unhealthy, absent, or unknown
    (the instance did not answer)."""
    out = {r: "unknown" for r in silent}
    for router, workers in views.items():
        out[router] = "absent" if url not in workers else "routes" if workers[url] else "unhealthy"
    return dict(sorted(out.items()))


async def _versions(
    st: Stack,
    fleet: Fleet,
    config: BackendConfig | None,
    state_dir: Path | None,
) -> tuple[dict[str, str | None], str | None]:
    """What each replica runs as its backend observes it (the reading a rollout plans from: None is down), or why
    it could not be read; ``config`` None: ``--backend none``."""
    from serving.rollout.operation import open_backend  # noqa: PLC0415 - loads the ssh client

    if config is None:
        return {}, "not read (--backend none)"
    if st.spec.sandbox is not None:
        from serving.sandbox.endpoints import register  # noqa: PLC0415 - sandbox stacks only

        register()  # the sandbox's workers are --backend local
    try:
        backend = open_backend(fleet, stack_state(st, state_dir), config)
    except RolloutInputError as exc:
        return {}, str(exc)
    try:
        return await backend.versions([r.id for r in fleet.plan.replicas]), None
    except (BackendError, httpx.HTTPError, OSError) as exc:
        return {}, f"--backend {config.resolved(fleet)}: {exc}"
    finally:
        await backend.aclose()


@app.command("status")
def status(
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    controllers: ControllerOpt = None,
    routers: RouterOpt = None,
    backend: Annotated[
        RestartBackend,
        typer.Option(
            "--backend",
            help="Where each replica's version is read, as a rollout reads it; auto: local processes for a sandbox "
            "stack, kubernetes otherwise; none: no version column.",
        ),
    ] = "auto",
    known_hosts: KnownHostsOpt = DEFAULT_KNOWN_HOSTS,
    identity: IdentityOpt = None,
    ssh_config: SshConfigOpt = None,
    kubeconfig: KubeconfigOpt = None,
    kube_context: KubeContextOpt = None,
    state_dir: StateDirOpt = None,
    output: OutputOpt = "table",
    as_json: JsonOpt = False,
) -> None:
    """Replicas as every router instance routes them (routes, unhealthy, absent, unknown), beside the controllers'
    view: state, score, rotation and load, the version each runs as its backend observes it, the leader, each
    node's last report."""
    st = resolve_stack(stack, stack_file)
    urls = controllers or _sandbox_urls(st, "controllers")
    if not urls:
        fail("pass --controller URL for each controller instance (a sandbox stack knows its own)")
    router_list = routers or _sandbox_urls(st, "routers")
    timeout = st.spec.serving.health_check_timeout_s
    found = asyncio.run(_statuses(urls, timeout))
    views, silent = asyncio.run(_router_views(router_list, timeout))
    answers = {u: s for u, s in found.items() if isinstance(s, dict)}
    if not answers:
        fail(f"no controller answered: {found}", EXIT_PROBLEM)
    fleet = load_fleet(st.name, st.spec)
    from serving.rollout.operation import BackendConfig  # noqa: PLC0415 - loads the ssh client

    config = None
    if backend != "none":
        config = BackendConfig(backend, known_hosts, identity, ssh_config=ssh_config, kubeconfig=kubeconfig,
                               kube_context=kube_context, stack_kube_context=kubernetes_context(st.path))  # fmt: skip
    versions, versions_unread = asyncio.run(_versions(st, fleet, config, state_dir))
    # the leader's view acts; any follower's is as fresh for scores (every instance applies every report)
    view = next((s for s in answers.values() if s.get("is_leader")), next(iter(answers.values())))
    leader = view.get("leader")
    nodes = [{k: n[k] for k in ("name", "score", "state", "last_report_s")} for n in view["nodes"]]
    replicas = [
        {
            **{k: r[k] for k in ("id", "node", "url", "state", "score", "in_rotation", "load")},
            "routers": _on_routers(r["url"], views, silent),
            "version": None if versions_unread else shown(versions.get(r["id"])),
        }
        for r in view["replicas"]
    ]
    ok = (
        bool(leader)
        and not silent
        and all(n["state"] != "suspect" for n in nodes)
        and all(r["in_rotation"] and set(r["routers"].values()) <= {"routes"} for r in replicas)
    )
    unreachable = {u: s for u, s in found.items() if isinstance(s, str)}
    if as_json:
        doc = {
            "leader": leader,
            "nodes": nodes,
            "replicas": replicas,
            "controllers": {
                u: ("unreachable: " + s if isinstance(s, str) else ("leader" if s.get("is_leader") else "follower"))
                for u, s in found.items()
            },
            "routers": {r: ("unreachable: " + silent[r] if r in silent else "answering") for r in router_list},
            "eviction_cap": view.get("eviction_cap"),
            "move_candidates": view.get("move_candidates", []),
            "reports": view.get("reports"),
            "versions_unread": versions_unread,
        }
        emit_json(doc, stack=st.name, ok=ok)
    else:
        console.print(f"leader: {leader or 'none'}; controllers answering {len(answers)}/{len(found)}", highlight=False)
        for url, why in unreachable.items():
            console.print(f"  {url}: {why}", highlight=False)
        console.print(f"routers answering {len(views)}/{len(router_list)}", highlight=False)
        for url, why in silent.items():
            console.print(f"  {url}: {why}", highlight=False)
        if versions_unread:
            console.print(f"versions unknown: {versions_unread}", highlight=False)
        table = Table(title=f"nodes of {st.name}")
        for col in ("node", "score", "state", "last report (s)"):
            table.add_column(col)
        for n in nodes:
            table.add_row(
                n["name"],
                str(n["score"]),
                n["state"],
                "-" if n["last_report_s"] is None else f"{n['last_report_s']:.1f}",
            )
        print_table(table, output)
        table = Table(title="replicas")
        for col in ("replica", "node", "url", "version", "routers", "state", "score", "in-rotation", "load"):
            table.add_column(col)
        for r in sorted(replicas, key=lambda r: (r["in_rotation"], r["id"])):
            table.add_row(
                r["id"],
                r["node"],
                r["url"],
                r["version"] or "unknown",
                ",".join(r["routers"].values()),  # one field per column in -o wide: awk reads columns
                r["state"],
                str(r["score"]),
                "yes" if r["in_rotation"] else "no",
                f"{r['load']:.3f}",
            )
        print_table(table, output)
    if not ok:
        raise typer.Exit(EXIT_PROBLEM)
