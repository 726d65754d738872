"""STAND-IN for the Kubernetes API server and the StatefulSet/LeaderWorkerSet controllers, for the updater's and the
runtime's Kubernetes tests (there is no API server here).

It speaks the API's REST paths, JSON merge patch (RFC 7386), pod DELETE and the generation/status bookkeeping of the
StatefulSet and LeaderWorkerSet controllers; every patched object is validated with the real Kubernetes OpenAPI schema
(kubernetes-validate) or the upstream LeaderWorkerSet CRD, as an API server would. Its pods are made from the
workload's templates the way the controllers name and label them (`sglang-g1-3`, `sglang-g1-3-1` for a second node,
`controller-revision-hash`), listed by label selector, patched by merge patch.

No kinder than the controllers it stands for (upstream file and line in docs/k8s-semantics.md):
* an OnDelete StatefulSet replaces no pod when its template changes; a deleted pod is recreated from the template at
  ``status.updateRevision`` (Parallel: each at once); ``currentRevision`` never moves (kubernetes
  ``pkg/controller/statefulset/stateful_set_utils.go``, ``completeRollingUpdate`` acts on RollingUpdate only);
* a LeaderWorkerSet replaces one replica at a time, highest ordinal first, whatever its ``maxUnavailable``: LWS copies
  it onto its leader StatefulSet, where it is ignored without the alpha MaxUnavailableStatefulSet gate (lws
  ``site/content/en/docs/installation/_index.md``: "Or lws will roll out the pods one by one").
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import threading
from typing import Any

from aiohttp import web

from serving.pulumi.validate import Validator
from serving.render.k8s.fleet import render
from serving.rollout.backends.kubernetes import workload_path
from serving.spec.schema import FleetSpec
from tests.support.k8s import crd_dir
from tests.support.stacks import fleet_of, spec_from

RELEASES = {
    "v1": "lmsysorg/sglang:v0.5.23-cu126",
    "v2": "lmsysorg/sglang:v0.5.24-cu126",
    "v2-stuck": "lmsysorg/sglang:v0.5.24-cu126-stuck",
}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _revision(obj: dict[str, Any]) -> str:
    spec = obj["spec"]
    template = spec.get("template") or spec.get("leaderWorkerTemplate")
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


LWS_NAME, LWS_GROUP_INDEX, LWS_WORKER_INDEX = (
    f"leaderworkerset.sigs.k8s.io/{k}" for k in ("name", "group-index", "worker-index")
)
REVISION_LABEL = "controller-revision-hash"
TICK_S = 0.02


def _pod_count(obj: dict[str, Any]) -> int:
    """Pods per replica: a LeaderWorkerSet's group size, one for a StatefulSet."""
    return int(obj["spec"]["leaderWorkerTemplate"]["size"]) if obj["kind"] == "LeaderWorkerSet" else 1


def make_pod(obj: dict[str, Any], ordinal: int, worker: int = 0, *, ready: bool = True) -> dict[str, Any]:
    """Pod ``worker`` of replica ``ordinal`` of a StatefulSet or LeaderWorkerSet as its controller creates it from the
    templates, running (its serving container started; Ready unless ``ready`` is false)."""
    name = obj["metadata"]["name"]
    extra = {REVISION_LABEL: _revision(obj)}
    if obj["kind"] == "LeaderWorkerSet":
        lwt = obj["spec"]["leaderWorkerTemplate"]
        leader = worker == 0 and "leaderTemplate" in lwt
        template = copy.deepcopy(lwt["leaderTemplate"] if leader else lwt["workerTemplate"])
        extra |= {LWS_NAME: name, LWS_GROUP_INDEX: str(ordinal), LWS_WORKER_INDEX: str(worker)}
    else:
        template = copy.deepcopy(obj["spec"]["template"])
    group = int(name.removeprefix("sglang-g"))
    containers = template["spec"]["containers"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template.get("metadata", {}), "name": f"{name}-{ordinal}" + (f"-{worker}" if worker else ""),
                     "namespace": obj["metadata"]["namespace"],
                     "labels": {**template.get("metadata", {}).get("labels", {}), **extra}},
        "spec": template["spec"],
        "status": {
            "phase": "Running",
            "podIP": f"10.{group}.{ordinal}.{worker + 1}",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [
                {"name": c["name"], "ready": ready, "image": c["image"], "state": {"running": {}}} for c in containers
            ],
        },
    }  # fmt: skip


def serving_pod(obj: dict[str, Any]) -> dict[str, Any]:
    """The pod template that serves HTTP: a StatefulSet's template, a LeaderWorkerSet's leader template, or its
    worker template when the group has one pod (size 1: LWS renders no separate leader template)."""
    spec = obj["spec"]
    if "template" in spec:
        return dict(spec["template"])
    lwt = spec["leaderWorkerTemplate"]
    return dict(lwt.get("leaderTemplate") or lwt["workerTemplate"])


def _stuck(obj: dict[str, Any]) -> bool:
    """The template runs a release named ``*-stuck``: its pods never become Ready."""
    env = {e["name"]: e.get("value") for e in serving_pod(obj)["spec"]["containers"][0]["env"]}
    return str(env.get("EXASERVE_RELEASE", "")).endswith("-stuck")


def _ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


class ApiServerStandIn:
    """STAND-IN for the API server and the StatefulSet/LeaderWorkerSet controllers (see module doc).

    A pod whose serving container runs a release named `*-stuck` never becomes ready, so the rollout halts like a real
    one. ``deleted`` records every pod the client deleted, in order.
    """

    def __init__(self, spec: FleetSpec) -> None:
        self.validator = Validator(spec.kubernetes.version, crd_dir())
        self.objects: dict[str, dict[str, Any]] = {}
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.pods_path = f"/api/v1/namespaces/{spec.kubernetes.namespace}/pods"
        self.pods: dict[str, dict[str, Any]] = {}  # name → pod
        self.pod_patches: list[tuple[str, dict[str, Any]]] = []  # (pod name, merge patch); workloads' in patches
        self.deleted: list[str] = []
        self._tasks: set[asyncio.Task[None]] = set()
        for rendered in render(fleet_of(spec)):
            if rendered["kind"] in ("StatefulSet", "LeaderWorkerSet"):
                obj = copy.deepcopy(rendered)
                obj["metadata"]["generation"] = 1
                obj["status"] = {"observedGeneration": 1, "currentRevision": _revision(obj)}
                self.objects[workload_path(obj)] = obj
                for ordinal in range(obj["spec"]["replicas"]):
                    self._create_pods(obj, ordinal, ready=True)
                self._refresh(obj)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.url = ""

    def _leader(self, obj: dict[str, Any], ordinal: int) -> dict[str, Any] | None:
        pod = self.pods.get(f"{obj['metadata']['name']}-{ordinal}")
        return None if pod is None or pod["metadata"].get("deletionTimestamp") else pod

    def _refresh(self, obj: dict[str, Any]) -> None:
        """The controller's status, from the pods as they are: updated = at the update revision, ready = Ready."""
        n, revision = obj["spec"]["replicas"], _revision(obj)
        leaders = [p for o in range(n) if (p := self._leader(obj, o)) is not None]
        updated = sum(p["metadata"]["labels"].get(REVISION_LABEL) == revision for p in leaders)
        ready = sum(_ready(p) for p in leaders)
        status = obj["status"]
        status |= {"replicas": len(leaders), "updatedReplicas": updated, "readyReplicas": ready}
        if obj["kind"] == "StatefulSet":
            if status["observedGeneration"] == obj["metadata"]["generation"]:
                status["updateRevision"] = revision
        else:
            status["observedGeneration"] = obj["metadata"]["generation"]
            rolling = updated < n or ready < n
            status["conditions"] = [
                {"type": "Available", "status": "True" if ready == n else "False"},
                {"type": "UpdateInProgress", "status": "True" if rolling else "False"},
            ]

    def _create_pods(self, obj: dict[str, Any], ordinal: int, *, ready: bool) -> None:
        """(Re)create replica ``ordinal``'s pods from the workload's current templates (LWS recreates the group)."""
        for worker in range(_pod_count(obj)):
            pod = make_pod(obj, ordinal, worker, ready=ready)
            self.pods[pod["metadata"]["name"]] = pod

    async def _replace(self, obj: dict[str, Any], ordinal: int) -> None:
        """Replica ``ordinal``'s pods gone, then recreated a tick later from the current template."""
        for worker in range(_pod_count(obj)):
            self.pods.pop(f"{obj['metadata']['name']}-{ordinal}" + (f"-{worker}" if worker else ""), None)
        self._refresh(obj)
        await asyncio.sleep(TICK_S)
        self._create_pods(obj, ordinal, ready=not _stuck(obj))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _get(self, request: web.Request) -> web.Response:
        if request.path == self.pods_path:
            wanted = dict(t.split("=", 1) for t in request.query.get("labelSelector", "").split(",") if t)
            items = [p for p in self.pods.values() if wanted.items() <= p["metadata"]["labels"].items()]
            return web.json_response({"apiVersion": "v1", "kind": "PodList", "items": items})
        obj = self.objects.get(request.path)
        if obj is None:
            return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)
        return web.json_response(obj)

    async def _delete(self, request: web.Request) -> web.Response:
        """DELETE of a pod: its StatefulSet recreates it at the update revision; LeaderWorkerSet pods are not
        deleted by the updater (the stand-in answers 405 so a test sees it if they were)."""
        name = request.path.rsplit("/", 1)[1] if request.path.startswith(self.pods_path + "/") else ""
        if name not in self.pods:
            return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)
        owner = next(o for o in self.objects.values() if name.startswith(o["metadata"]["name"] + "-"))
        if owner["kind"] != "StatefulSet":
            return web.json_response({"kind": "Status", "code": 405}, status=405)
        self.deleted.append(name)
        pod = self.pods[name]
        self._spawn(self._recreate(owner, int(name.rsplit("-", 1)[1])))
        return web.json_response(pod)

    async def _recreate(self, obj: dict[str, Any], ordinal: int) -> None:
        await self._replace(obj, ordinal)
        self._refresh(obj)

    async def _patch(self, request: web.Request) -> web.Response:
        if request.content_type != "application/merge-patch+json":
            return web.json_response({"kind": "Status", "code": 415}, status=415)
        if request.path.startswith(self.pods_path + "/"):
            name = request.path.rsplit("/", 1)[1]
            if name not in self.pods:
                return web.json_response({"kind": "Status", "code": 404}, status=404)
            self.pod_patches.append((name, await request.json()))
            self.pods[name] = merge_patch(self.pods[name], self.pod_patches[-1][1])
            return web.json_response(self.pods[name])
        obj = self.objects.get(request.path)
        if obj is None:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        patch = await request.json()
        self.patches.append((request.path, patch))
        merged = merge_patch({k: v for k, v in obj.items() if k != "status"}, patch)
        problems = self.validator.problems(merged)
        if problems:
            return web.json_response({"kind": "Status", "code": 422, "message": str(problems)}, status=422)
        if merged["spec"] != obj["spec"]:
            merged["metadata"]["generation"] = obj["metadata"]["generation"] + 1
        merged["status"] = obj["status"]
        self.objects[request.path] = merged
        if merged["metadata"]["generation"] != obj["metadata"]["generation"]:
            self._spawn(self._controller(merged))
        return web.json_response(merged)

    async def _controller(self, obj: dict[str, Any]) -> None:
        """The workload's controller observing a new template, a tick later. A StatefulSet (OnDelete) records the
        update revision and replaces nothing; a LeaderWorkerSet replaces one replica at a time, highest ordinal
        first, each Ready before the next (module doc)."""
        await asyncio.sleep(TICK_S)
        if obj["kind"] == "StatefulSet":
            obj["status"]["observedGeneration"] = obj["metadata"]["generation"]
            self._refresh(obj)
            return
        for ordinal in reversed(range(obj["spec"]["replicas"])):
            await self._replace(obj, ordinal)
            self._refresh(obj)
            if _stuck(obj):
                return  # the replica never becomes ready: the rollout halts

    def __enter__(self) -> ApiServerStandIn:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._get)
        app.router.add_patch("/{tail:.*}", self._patch)
        app.router.add_delete("/{tail:.*}", self._delete)
        runner = web.AppRunner(app, access_log=None)

        async def start() -> int:
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            return int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]

        self._thread.start()
        port = asyncio.run_coroutine_threadsafe(start(), self._loop).result(10)
        self.url = f"http://127.0.0.1:{port}"
        self._runner = runner
        return self

    def __exit__(self, *exc: object) -> None:
        for task in list(self._tasks):  # a halted rollout's controller, still waiting
            self._loop.call_soon_threadsafe(task.cancel)
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def k8s_spec(multi: bool) -> FleetSpec:
    changes: dict[str, Any] = {"serving.releases": RELEASES}
    if multi:  # 16 GPUs per replica: every replica spans two 8-GPU nodes → LeaderWorkerSets
        changes |= {"parallelism.tp": 8, "parallelism.pp": 2, "serving.replicas": 8, "serving.replicas_per_node": None}
    return spec_from("dev", **changes)
