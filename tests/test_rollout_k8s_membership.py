"""Kubernetes membership: the routers' own service discovery, driven by the pods the API server holds.

What is REAL: three smg 1.13 gateway processes started with the fleet's rendered Kubernetes command
(``--service-discovery``, the rendered ``--selector`` with ``exaserve.io/admitted=true``, namespace and port), each
discovering pods through its own Kubernetes client (kube-rs, from ``KUBECONFIG``: plain HTTP to a loopback server);
one simulated SGLang worker process per serving pod (``serving.sandbox.worker``), listening on the pod's IP (a
127.x.y.z loopback address) at ``serving.port``, as the discovered URL ``http://POD_IP:PORT`` expects; the
updater's runner, the Kubernetes backend and its :class:`DiscoveryMembership`, unchanged.

What STANDS IN: the API server and the StatefulSet controller and kubelet behind it — ``ApiServerStandIn``
(tests/support/apiserver.py) with a pod watch (list, then ``watch=true`` from the list's resourceVersion, one JSON
event per line, as the router's client asks for it; a label-selector watch sees a pod that leaves the selector as
DELETED and one that enters it as ADDED, as the API server's watch filter sends them), and a kubelet that starts a
pod's worker process, marks the pod Ready once the worker answers ``/health`` and, when the updater deletes a pod to
replace it, first marks it terminating (``deletionTimestamp``), stops its process (SIGTERM, the worker's graceful
exit) and then deletes it. Pods carry the templates' labels; the router never sees anything but these pods.

Router flags the test changes: loopback listeners on free ports and ``--log-level info`` (the log names each worker
discovery registers). What smg 1.13.0's discovery does, each checked here on the real binary (its log names
``model_gateway/src/service_discovery/{kubernetes,reconciler}.rs``, whose 1.13.0 source is not stored here; the
nearest stored source, lightseekorg/smg 73da68c, has the same level-triggered design in one file,
``service_discovery.rs``): on every watch event (after 1 s) and every 60 s (its log: ``reconciling on change and every
60s``) it compares the pods its selector publishes with the workers it registered and submits the difference as jobs
— a pod that left the selector or turned unready is removed, drained (``Removing worker … no longer published``;
73da68c kept an unready pod's worker, 1.13.0 does not; a terminating one too at 73da68c, line 700, not checked apart
here: the updater deselects a batch before it deletes its pods); a selected Ready pod is registered
(``Registering worker IP:PORT (Regular) as NAME-N:PORT``); a worker added by hand carries no pod-uid label and is
never touched (73da68c ``k8s_owned_workers``, lines 747-778). So the updater only changes labels and proves each
change on every instance (module :mod:`serving.rollout.backends.kubernetes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import json
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from aiohttp import web

from serving.kubeapi import KubeApi
from serving.render.k8s.common import LABEL_ADMITTED
from serving.render.router import ROUTER_ENTRY, router_args
from serving.rollout.backends.kubernetes import KubernetesBackend, batch_lease_name
from serving.rollout.journal import Journal
from serving.rollout.machine import Event, Phase, initial
from serving.rollout.plan import kv_plan, plan_rollout
from serving.rollout.runner import Progress, Runner
from serving.router.loadgen import DEFAULT_BODY, PRODUCTION_MIX, LoadGenerator, LoadSpec, run_load
from serving.router.membership import DRAINING, Observed, RouterSet
from serving.sandbox.backend import health_poll_s
from serving.sandbox.processes import (
    ProcessRecord,
    StateDir,
    free_port,
    free_ports,
    start_router,
    start_worker,
    stop_process,
)
from serving.sandbox.worker_config import WorkerConfig
from serving.spec.schema import FleetSpec
from tests.support.apiserver import RELEASES, ApiServerStandIn
from tests.support.patience import PATIENCE_S, wait_until
from tests.support.stacks import fleet_of, request_timeout_of, spec_from

# real routers and workers, membership changes waited on in real time: the wait-bound phase (tests/conftest.py)
pytestmark = pytest.mark.sandbox

ROUTERS = 3
NEW_POD_LOAD_S = 2.0  # a new pod's "model load": its worker listens only after this (a real one: minutes)
WATCH_POLL_S = 0.02


def membership_spec(port: int) -> FleetSpec:
    """The sandbox stack on Kubernetes: 4 one-GPU replicas in 2 update groups, 3 router instances, 1 s heartbeats."""
    return spec_from(
        "sandbox",
        **{
            "sandbox": None,
            "serving.replicas": 4,
            "serving.port": port,
            "serving.releases": RELEASES,
            "serving.heartbeat_interval_s": 1,
            **request_timeout_of(3),  # its detection window (3 × 1 s), as before the timeout fit a generation
            "serving.health_check_timeout_s": 1,
            "rollout.batches": 2,
            "rollout.interval_s": 2,
            "rollout.baseline_window_s": 2,
            "scheduler.instances": ROUTERS,
        },
    )


class Kubelet:
    """Runs each serving pod's container as a simulated worker process on the pod's IP."""

    def __init__(self, spec: FleetSpec, state: StateDir) -> None:
        self.spec = spec
        self.state = state
        self.kv_pool_tokens = kv_plan(spec, fleet_of(spec).plan.memory).tokens
        self._ips = (f"127.77.{i // 250}.{i % 250 + 1}" for i in itertools.count())

    def config(self, pod: dict[str, Any], *, load_s: float) -> WorkerConfig:
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        return WorkerConfig(
            port=self.spec.serving.port,
            host=pod["status"]["podIP"],
            version=str(env["EXASERVE_RELEASE"]),
            latency_ms=20.0,
            jitter_ms=2.0,
            startup_delay_s=load_s,
            served_model_name=self.spec.model.name,
            kv_pool_tokens=self.kv_pool_tokens,  # what a real pod's SGLang exports: the plan's pool (no skew)
            health_poll_s=health_poll_s(self.spec),  # SGLang's /health poll at this stack's clock, as the sandbox's
        )

    def next_ip(self) -> str:
        return next(self._ips)

    @staticmethod
    def process(pod: dict[str, Any]) -> str:
        return f"pod-{pod['metadata']['name']}-{pod['status']['podIP']}"


class DiscoveryApiServer(ApiServerStandIn):
    """:class:`ApiServerStandIn` plus a pod watch and a kubelet (module docstring): pod changes are events."""

    def __init__(self, spec: FleetSpec, kubelet: Kubelet) -> None:
        self.kubelet = kubelet
        self.events: list[tuple[int, str, dict[str, Any]]] = []  # (resourceVersion, type, object)
        self.watches = 0
        self.closing = False  # ends the watch streams, so the server can stop
        super().__init__(spec)  # creates the first pods (their workers started and healthy: Ready)

    def __exit__(self, *exc: object) -> None:
        self.closing = True
        time.sleep(2 * WATCH_POLL_S)
        super().__exit__(*exc)

    def _emit(self, kind: str, pod: dict[str, Any]) -> None:
        rv = len(self.events) + 1
        pod["metadata"]["resourceVersion"] = str(rv)
        self.events.append((rv, kind, copy.deepcopy(pod)))

    def _create_pods(self, obj: dict[str, Any], ordinal: int, *, ready: bool) -> None:
        """Create replica ``ordinal``'s pod on a new IP (one pod per replica in this stack); its worker is started
        by the caller. ``ready``: Ready at once (the first pods, whose workers already answer)."""
        super()._create_pods(obj, ordinal, ready=ready)
        pod = self.pods[f"{obj['metadata']['name']}-{ordinal}"]
        pod["metadata"]["uid"] = f"{pod['metadata']['name']}-{len(self.events)}"
        pod["status"]["podIP"] = self.kubelet.next_ip()
        if ready:
            start_worker(self.kubelet.state, Kubelet.process(pod), self.kubelet.config(pod, load_s=0))
        self._emit("ADDED", pod)

    async def _replace(self, obj: dict[str, Any], ordinal: int) -> None:
        """The controller and kubelet replacing one pod: terminating (deletionTimestamp), its process stopped
        (SIGTERM), deleted; then the new pod, not Ready until its worker has loaded and answers ``/health``."""
        name = f"{obj['metadata']['name']}-{ordinal}"
        old = self.pods[name]
        old["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        self._emit("MODIFIED", old)
        await asyncio.to_thread(stop_process, self.kubelet.state, Kubelet.process(old), timeout_s=10)
        del self.pods[name]
        self._emit("DELETED", old)
        self._create_pods(obj, ordinal, ready=False)
        config = self.kubelet.config(self.pods[name], load_s=NEW_POD_LOAD_S)
        await asyncio.to_thread(
            start_worker, self.kubelet.state, Kubelet.process(self.pods[name]), config, timeout_s=30
        )
        pod = self.pods[name]  # as it is now: a patch (the updater's label) replaces the object
        pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        for c in pod["status"]["containerStatuses"]:
            c["ready"] = True
        self._emit("MODIFIED", pod)

    async def _get(self, request: web.Request) -> web.StreamResponse:  # type: ignore[override]  # a watch streams
        if request.path != self.pods_path:
            return await super()._get(request)
        wanted = dict(t.split("=", 1) for t in request.query.get("labelSelector", "").split(",") if t)

        def selected(pod: dict[str, Any]) -> bool:
            return wanted.items() <= pod["metadata"]["labels"].items()

        if request.query.get("watch") not in ("true", "1"):
            items = [p for p in self.pods.values() if selected(p)]
            listed = {"resourceVersion": str(len(self.events))}
            return web.json_response({"apiVersion": "v1", "kind": "PodList", "metadata": listed, "items": items})
        self.watches += 1
        seen = int(request.query.get("resourceVersion") or 0)
        # the selected pods as of ``seen``; from there the API server sends a pod that stops matching the selector as
        # DELETED and one that starts matching as ADDED (convertToWatchEvent, apiserver/pkg/storage/cacher/
        # cache_watcher.go)
        held: set[str] = set()
        for _, kind, pod in self.events[:seen]:
            (held.add if selected(pod) and kind != "DELETED" else held.discard)(pod["metadata"]["name"])
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        while not self.closing:
            for rv, kind, pod in self.events[seen:]:
                name, now = pod["metadata"]["name"], selected(pod) and kind != "DELETED"
                sent = kind if now and name in held else "ADDED" if now else "DELETED" if name in held else None
                (held.add if now else held.discard)(name)
                if sent is not None:
                    await response.write((json.dumps({"type": sent, "object": pod}) + "\n").encode())
                seen = rv
            await asyncio.sleep(WATCH_POLL_S)
        return response

    async def _patch(self, request: web.Request) -> web.Response:
        response = await super()._patch(request)
        if request.path.startswith(self.pods_path + "/") and response.status == 200:
            self._emit("MODIFIED", self.pods[request.path.rsplit("/", 1)[1]])
        return response


@dataclass
class Cluster:
    spec: FleetSpec
    api: DiscoveryApiServer
    kubeconfig: Path
    routers: list[str]  # API URLs
    metrics: list[str]
    logs: list[Path]
    state: StateDir

    def backend(self) -> KubernetesBackend:
        return KubernetesBackend(fleet_of(self.spec), KubeApi(self.api.url))

    def listed(self) -> list[dict[str, bool]]:
        """Per router: worker URL → healthy, for the workers it routes to (a draining one is out)."""
        out = []
        for url in self.routers:
            body = httpx.get(url + "/workers", timeout=5).json()
            out.append({w["url"]: w["is_healthy"] for w in body["workers"] if w["status"] != DRAINING})
        return out

    def pod_urls(self, group: int | None = None) -> dict[str, str]:
        """Pod name → http://POD_IP:PORT of the serving pods (of ``group``) that are not terminating."""
        return {
            name: f"http://{p['status']['podIP']}:{self.spec.serving.port}"
            for name, p in self.api.pods.items()
            if not p["metadata"].get("deletionTimestamp") and (group is None or name.startswith(f"sglang-g{group}-"))
        }

    def start_router(self, name: str, flags: list[str], *, selected: int) -> ProcessRecord:
        """A router process whose Kubernetes client reads this cluster's kubeconfig, once it lists ``selected``
        workers healthy."""
        previous = os.environ.get("KUBECONFIG")
        os.environ["KUBECONFIG"] = str(self.kubeconfig)  # the process's environment at spawn
        try:
            return start_router(self.state, flags, name=name, healthy_workers=selected, timeout_s=60)
        finally:
            if previous is None:
                del os.environ["KUBECONFIG"]
            else:
                os.environ["KUBECONFIG"] = previous


def router_flags(spec: FleetSpec, api_port: int, metrics_port: int, worker_urls: list[str] | None = None) -> list[str]:
    """The fleet's rendered Kubernetes router command (or, given ``worker_urls``, its static one: the bare-metal
    render), with loopback listeners on free ports and info logs."""
    args = (
        router_args(fleet_of(spec), kubernetes=True)
        if worker_urls is None
        else router_args(fleet_of(spec), worker_urls=worker_urls)
    )
    flags = args.to_argv()[len(ROUTER_ENTRY) :]
    for flag, value in (("--host", "127.0.0.1"), ("--port", str(api_port)), ("--prometheus-host", "127.0.0.1"),
                        ("--prometheus-port", str(metrics_port)), ("--log-level", "info")):  # fmt: skip
        flags[flags.index(flag) + 1] = value
    return flags


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("k8s-membership")
    spec = membership_spec(free_port())
    state = StateDir(root / "processes")

    def stop_all() -> None:
        for record in state.records():
            stop_process(state, record.name, timeout_s=10)

    with contextlib.ExitStack() as stack:
        stack.callback(stop_all)  # last: whatever is left (the stand-in's first pods start with it)
        api = stack.enter_context(DiscoveryApiServer(spec, Kubelet(spec, state)))
        # first: the routers, the stand-in's watch clients, stop before it does. Its cleanup waits for every request
        # in flight (a watch that a router still held, or a write it did not read, outlasted the 10 s the stand-in
        # gives its cleanup: a CI teardown error)
        stack.callback(stop_all)
        kubeconfig = root / "kubeconfig"
        kubeconfig.write_text(
            json.dumps({
                "apiVersion": "v1", "kind": "Config", "current-context": "stand-in",
                "clusters": [{"name": "stand-in", "cluster": {"server": api.url}}],
                "users": [{"name": "router", "user": {"token": "stand-in"}}],
                "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "router"}}],
            })
        )  # fmt: skip
        box = Cluster(spec, api, kubeconfig, [], [], [], state)
        ports = free_ports(2 * ROUTERS)
        for i in range(ROUTERS):
            flags = router_flags(spec, ports[2 * i], ports[2 * i + 1])
            record = box.start_router(f"router-{i}", flags, selected=spec.serving.replicas)
            box.routers.append(record.url)
            box.metrics.append(record.metrics_url)
            box.logs.append(Path(record.log_path))
        yield box


def test_every_router_discovers_the_pods_it_selects_from_the_stand_in(cluster: Cluster) -> None:
    """The starting point is discovery's own: each router watched the API and registered the four pods by IP (its
    log: ``Registering worker IP:PORT (Regular) for pod NAME``, service_discovery.rs ``reconcile_workers``)."""
    assert cluster.api.watches >= ROUTERS
    expected = set(cluster.pod_urls().values())
    assert len(expected) == cluster.spec.serving.replicas
    assert [set(r) for r in cluster.listed()] == [expected] * ROUTERS
    for log in cluster.logs:
        added = [
            line.split("Registering worker ", 1)[1]
            for line in log.read_text().splitlines()
            if "Registering worker " in line
        ]
        assert {f"http://{line.split(' ', 1)[0]}" for line in added} == expected, added


def test_production_clients_are_served_through_discovery_as_through_static_urls(cluster: Cluster) -> None:
    """Issue 39: on Kubernetes smg runs in IGW mode (``--service-discovery`` turns it on, smg launch_router.py:43-45,
    main.rs ``enable_igw_for_discovery``), where ``/generate`` without ``model`` is 400 ``missing_model``
    (gateway.rs): the load every test sent before. The production mix (chat, completions and /generate, streamed and
    not, with the served model's name) through every discovery-mode router and through a router started with the
    static render on the same pods: no error of any status, every stream read to its [DONE]."""
    legacy = httpx.post(cluster.routers[0] + "/generate", json=dict(DEFAULT_BODY), timeout=PATIENCE_S)
    assert legacy.status_code == 400 and legacy.json()["error"]["code"] == "missing_model", legacy.text
    pods = sorted(cluster.pod_urls().values())
    api_port, metrics_port = free_ports(2)
    static = cluster.start_router(
        "router-static", router_flags(cluster.spec, api_port, metrics_port, pods), selected=len(pods)
    )
    try:
        assert "--service-discovery" not in static.argv and "--worker-urls" in static.argv
        assert httpx.post(static.url + "/generate", json=dict(DEFAULT_BODY), timeout=PATIENCE_S).status_code == 200
        count = 2 * len(PRODUCTION_MIX) * ROUTERS

        def clients(urls: list[str]) -> LoadSpec:  # request i to instance i mod n
            return LoadSpec(url=urls[0], failover=tuple(urls[1:]), rate_per_s=40.0, duration_s=count / 40.0,
                            max_requests=count, timeout_s=PATIENCE_S, model=cluster.spec.model.name,
                            shapes=PRODUCTION_MIX)  # fmt: skip

        reports = {mode: asyncio.run(run_load(clients(urls)))
                   for mode, urls in (("discovery", cluster.routers), ("static", [static.url]))}  # fmt: skip
    finally:
        stop_process(cluster.state, "router-static")
    for mode, report in reports.items():
        assert report.count == count and report.errors == 0, f"{mode}: {report.summary()}"
        assert report.streamed == count * sum(s.stream for s in PRODUCTION_MIX) // len(PRODUCTION_MIX), mode
        assert all(r.ttft_s is not None for r in report.results if r.streamed), mode


def test_out_of_the_selection_on_every_router_and_a_restarted_router_keeps_it_out(cluster: Cluster) -> None:
    """``take_out`` deselects group 0's pods and every instance's discovery drains them; a router restarted meanwhile
    registers what its selector holds, without group 0; ``bring_back`` selects them again (the same pods, back within
    their drain: it waits the drain out first) and every instance's discovery registers them."""
    members = [r.id for r in fleet_of(cluster.spec).plan.replicas if r.group == 0]
    group0, others = set(cluster.pod_urls(0).values()), set(cluster.pod_urls(1).values())

    async def change(out: bool) -> Observed:
        backend = cluster.backend()
        try:
            membership = backend.membership(RouterSet(cluster.routers))
            async with asyncio.timeout(60):
                if out:
                    return await membership.take_out(members, 10)
                return await membership.bring_back(members, 30)
        finally:
            await backend.aclose()

    removed = asyncio.run(change(out=True))
    assert sorted(removed.seconds_by_router) == sorted(cluster.routers), removed
    assert all(not (group0 & set(r)) and others <= set(r) for r in cluster.listed())
    assert {cluster.api.pods[p]["metadata"]["labels"][LABEL_ADMITTED] for p in cluster.pod_urls(0)} == {"false"}
    # the batch is announced on its Lease before any worker leaves (alert ExaServeWorkersUnhealthy counts it planned)
    ns = cluster.spec.kubernetes.namespace
    lease = cluster.api.objects[f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{batch_lease_name(ns)}"]
    assert lease["spec"]["holderIdentity"] == f"exaserve-updater/{ns}", lease

    # Router 2 restarts: it lists and watches anew and registers exactly what the selection holds.
    record = cluster.state.read("router-2")
    assert record is not None
    log, start = cluster.logs[2], cluster.logs[2].stat().st_size  # its log is appended to: what the new process wrote
    stop_process(cluster.state, "router-2", timeout_s=10)
    cluster.start_router("router-2", list(record.argv[3:]), selected=len(others))  # argv: python -m … FLAGS

    # A registration of group 0 would come from its discovery's pass over what the selector publishes (and no pod
    # changes after it): the pass is the event, its log says what it wanted (``Reconciling workers: N to add, M to
    # remove (D desired)``, reconciler.rs) and what it registered, and group 0's absence is read after it
    def since_restart() -> str:
        return re.sub(r"\x1b\[[0-9;]*m", "", log.read_bytes()[start:].decode(errors="replace"))

    desired = wait_until(
        lambda: [int(d) for d in re.findall(r"Reconciling workers: .*\((\d+) desired\)", since_restart())],
        what="router 2's discovery to reconcile",
        seen=lambda: since_restart()[-2000:],
    )
    registered = {f"http://{a}" for a in re.findall(r"Registering worker (\S+) ", since_restart())}
    assert set(desired) == {len(others)} and registered == others, (desired, registered)
    assert set(cluster.listed()[2]) == others

    added = asyncio.run(change(out=False))
    assert sorted(added.seconds_by_router) == sorted(cluster.routers), added
    assert [set(r) for r in cluster.listed()] == [group0 | others] * ROUTERS


def test_discovery_drains_an_unready_pod_and_never_touches_a_worker_added_by_hand(cluster: Cluster) -> None:
    """A selected pod that turns unready is drained like one that leaves the selector (smg 1.13.0's Kubernetes
    provider publishes Ready pods only: ``Removing worker … no longer published``), and registered again once Ready;
    a worker added by hand (``POST /workers``: no pod-uid label) is never removed by discovery — judged after the
    reconcile pass that drained the other two."""
    spec = cluster.spec
    pods = cluster.pod_urls(1)
    unready, leaving = sorted(pods)
    hand = f"http://{cluster.api.kubelet.next_ip()}:{spec.serving.port}"
    config = WorkerConfig(
        port=spec.serving.port,
        host=urlsplit(hand).hostname or "",
        version="v1",
        latency_ms=20.0,
        served_model_name=spec.model.name,
        kv_pool_tokens=cluster.api.kubelet.kv_pool_tokens,
        health_poll_s=health_poll_s(spec),
    )
    start_worker(cluster.state, "hand-added", config)
    routers = RouterSet(cluster.routers)

    def patch(pod: str, body: dict[str, Any]) -> None:
        path = f"{cluster.api.url}{cluster.api.pods_path}/{pod}"
        headers = {"Content-Type": "application/merge-patch+json"}
        httpx.patch(path, content=json.dumps(body), headers=headers, timeout=5).raise_for_status()

    def ready(status: str) -> dict[str, Any]:
        return {"status": {"conditions": [{"type": "Ready", "status": status}]}}

    async def judged() -> Observed:
        await routers.add(hand, timeout_s=30)
        patch(unready, ready("False"))
        patch(leaving, {"metadata": {"labels": {LABEL_ADMITTED: "false"}}})
        return await routers.drained(pods[unready], pods[leaving], timeout_s=30)

    drained = asyncio.run(judged())
    assert sorted(drained.seconds_by_router) == sorted(cluster.routers), drained
    for routed in cluster.listed():
        assert hand in routed and not {pods[unready], pods[leaving]} & set(routed), routed

    async def restore() -> Observed:
        await routers.remove(hand, timeout_s=30)
        await routers.drains_ended(pods[unready], pods[leaving], timeout_s=30)
        patch(unready, ready("True"))
        patch(leaving, {"metadata": {"labels": {LABEL_ADMITTED: "true"}}})
        return await routers.discovered(pods[unready], pods[leaving], timeout_s=30)

    back = asyncio.run(restore())
    assert sorted(back.seconds_by_router) == sorted(cluster.routers), back
    stop_process(cluster.state, "hand-added", timeout_s=10)
    assert [set(r) for r in cluster.listed()] == [set(cluster.pod_urls().values())] * ROUTERS


def test_a_rollout_moves_each_group_through_discovery_on_every_router(cluster: Cluster, tmp_path: Path) -> None:
    """A full gated rollout v1 → v2 under client load through router 0. For each batch: its pods leave every router
    before the removal is recorded (proved on each, the journal names each); its pods are replaced; the new pods
    stay out of every router through health and warm-up (held out of discovery's selection) and come back only once
    readmitted, proved on each. At the end every router lists exactly the new pods, healthy: nothing stale, nothing
    twice."""
    spec = cluster.spec
    rollout = plan_rollout(fleet_of(spec, "k8s"), from_version="v1", to_version="v2")
    began: dict[tuple[int, Phase], float] = {}  # when each step of the rollout began (wall clock)
    events: list[Event] = []
    samples: list[tuple[float, float, list[set[str]]]] = []  # (asked at, answered at, every router's worker URLs)
    stop = threading.Event()

    def sample() -> None:
        with httpx.Client(timeout=5) as client:
            while not stop.is_set():
                asked = time.time()
                lists = [
                    {w["url"] for w in client.get(u + "/workers").json()["workers"] if w["status"] != DRAINING}
                    for u in cluster.routers
                ]
                samples.append((asked, time.time(), lists))
                time.sleep(0.05)

    def progress(p: Progress) -> None:
        if p.event is not None:
            events.append(p.event)
        step = p.state.step
        if step is not None and step.batch is not None and not step.rollback:
            began.setdefault((step.batch, step.phase), time.time())

    async def run() -> Any:
        backend = cluster.backend()
        try:
            routers = RouterSet(cluster.routers, metrics=cluster.metrics)  # the gates sum every router's metrics
            # 20 req/s over 4 replicas gives a 2-replica batch exactly the 20 requests its gates need in a 2 s soak:
            # on the edge, and discovery (not the gates) is what this test checks, so inconclusive gates pass
            runner = Runner(initial(rollout), Journal.create(tmp_path / "journal.jsonl", rollout), backend,
                            backend.membership(routers), progress=progress, accept_inconclusive=True)  # fmt: skip
            async with asyncio.timeout(240):
                return await runner.run()
        finally:
            await backend.aclose()

    # the client load runs in its own event loop: on a busy machine the updater's work in its loop would delay the
    # sends, a traffic dip that leaves the canary unjudged (seen once in CI, a pause before --accept-inconclusive took dips)
    load = LoadGenerator(LoadSpec(url=cluster.routers[0], rate_per_s=20, duration_s=180, timeout_s=10))
    load_loop, halt = asyncio.new_event_loop(), asyncio.Event()
    sender = threading.Thread(target=lambda: load_loop.run_until_complete(load.run(halt)), daemon=True)
    before = {g: set(cluster.pod_urls(g).values()) for g in (0, 1)}
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    sender.start()
    try:
        final = asyncio.run(run())
    finally:
        stop.set()
        load_loop.call_soon_threadsafe(halt.set)
        sender.join(30)
        load_loop.close()
        sampler.join(10)
    assert final.outcome is not None and final.outcome.value == "completed", (final.reason, events[-5:])
    after = {g: set(cluster.pod_urls(g).values()) for g in (0, 1)}
    for batch in rollout.batches:
        group = batch.index  # on Kubernetes a batch is one update group
        assert before[group].isdisjoint(after[group]), "every pod of the group was replaced (new IPs)"
        done: dict[Phase, float] = {}
        for phase, change in ((Phase.REMOVE, "removed"), (Phase.READMIT, "added")):
            ends = [e for e in events if e.step is not None and (e.step.batch, e.step.phase) == (batch.index, phase)]
            assert [e.kind for e in ends] == ["done"], ends
            assert ends[0].detail.startswith(f"{change} on every router ({ROUTERS}): "), ends[0].detail
            assert all(url in ends[0].detail for url in cluster.routers), ends[0].detail
            done[phase] = ends[0].at
            print(f"batch {batch.index} {change}: {ends[0].detail}")  # the per-router evidence, as journalled
        for i in range(ROUTERS):
            # no answer given after the removal was recorded lists an old pod; none given before readmission began
            # lists a new one (a pod held out through health and warm-up)
            late = [s for s in samples if s[0] > done[Phase.REMOVE] and s[2][i] & before[group]]
            early = [s for s in samples if s[1] < began[(batch.index, Phase.READMIT)] and s[2][i] & after[group]]
            assert late == [] and early == [], (cluster.routers[i], late[:1], early[:1])
            assert any(s[2][i] & after[group] for s in samples), "the sampler saw the readmission"
    final_lists = cluster.listed()
    assert [set(r) for r in final_lists] == [after[0] | after[1]] * ROUTERS
    assert all(all(r.values()) for r in final_lists)


def test_an_update_holds_the_new_pods_out_of_the_selection_and_pods_are_addressed_by_ip() -> None:
    """No processes: the plain stand-in re-creates group 1's pods from the patched template (``admitted=true``, as
    every new pod starts); the update leaves each of them ``false`` before it returns, and group 0 untouched. The
    backend addresses a replica by its pod's DNS name until it has listed the pods, by the pod's IP after."""
    spec = membership_spec(30000)
    members = [r.id for r in fleet_of(spec).plan.replicas if r.group == 1]
    with ApiServerStandIn(spec) as api:
        backend = KubernetesBackend(fleet_of(spec), KubeApi(api.url))
        assert backend.worker_url(members[0]) == "http://sglang-g1-0.sglang-workers.exaserve.svc:30000"

        async def scenario() -> None:
            try:
                await backend.leader_pods(members)
                await backend.update(members, "v2", timeout_s=10)
            finally:
                await backend.aclose()

        asyncio.run(scenario())
        labels = {name: pod["metadata"]["labels"][LABEL_ADMITTED] for name, pod in api.pods.items()}
        patched = {name for name, _ in api.pod_patches}
    assert labels == {"sglang-g0-0": "true", "sglang-g0-1": "true", "sglang-g1-0": "false", "sglang-g1-1": "false"}
    assert patched == {"sglang-g1-0", "sglang-g1-1"}
    assert backend.worker_url(members[0]) == f"http://{api.pods['sglang-g1-0']['status']['podIP']}:30000"
