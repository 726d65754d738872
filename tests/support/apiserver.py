"""STAND-IN for the Kubernetes API server and the StatefulSet/LeaderWorkerSet controllers, for the updater's and the
runtime's Kubernetes tests (there is no API server here).

It speaks the API's REST paths, JSON merge patch (RFC 7386) and the generation/status bookkeeping of the StatefulSet and
LeaderWorkerSet controllers; every patched object is validated with the real Kubernetes OpenAPI schema
(kubernetes-validate) or the upstream LeaderWorkerSet CRD, as an API server would. Its pods are made from the
workload's templates the way the LeaderWorkerSet controller names and labels them (`sglang-g1-3`, `sglang-g1-3-1` for
a second node), listed by label selector, patched by merge patch.
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


def make_pod(obj: dict[str, Any], ordinal: int, worker: int = 0, *, ready: bool = True) -> dict[str, Any]:
    """Pod ``worker`` of replica ``ordinal`` of a LeaderWorkerSet as its controller creates it from the templates,
    running (its serving container started; Ready unless ``ready`` is false)."""
    lwt = obj["spec"]["leaderWorkerTemplate"]
    leader = worker == 0 and "leaderTemplate" in lwt
    template = copy.deepcopy(lwt["leaderTemplate"] if leader else lwt["workerTemplate"])
    name = obj["metadata"]["name"]
    lws = {LWS_NAME: name, LWS_GROUP_INDEX: str(ordinal), LWS_WORKER_INDEX: str(worker)}
    group = int(name.removeprefix("sglang-g"))
    containers = template["spec"]["containers"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template.get("metadata", {}), "name": f"{name}-{ordinal}" + (f"-{worker}" if worker else ""),
                     "namespace": obj["metadata"]["namespace"],
                     "labels": {**template.get("metadata", {}).get("labels", {}), **lws}},
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


class ApiServerStandIn:
    """STAND-IN for the API server and the StatefulSet/LeaderWorkerSet controllers (see module doc).

    A patched pod template rolls out `maxUnavailable` pods per tick; a pod whose serving container
    runs a release named `*-stuck` never becomes ready, so the rollout halts like a real one.
    """

    def __init__(self, spec: FleetSpec) -> None:
        self.validator = Validator(spec.kubernetes.version, crd_dir())
        self.objects: dict[str, dict[str, Any]] = {}
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.pods_path = f"/api/v1/namespaces/{spec.kubernetes.namespace}/pods"
        self.pods: dict[str, dict[str, Any]] = {}  # name → pod
        self.pod_patches: list[tuple[str, dict[str, Any]]] = []  # (pod name, merge patch); workloads' in patches
        for rendered in render(fleet_of(spec)):
            if rendered["kind"] in ("StatefulSet", "LeaderWorkerSet"):
                group = int(rendered["metadata"]["name"].removeprefix("sglang-g"))
                obj = copy.deepcopy(rendered)
                obj["metadata"]["generation"] = 1
                n = obj["spec"]["replicas"]
                obj["status"] = self._status(obj, updated=n, ready=n, current=_revision(obj))
                self.objects[workload_path(spec, group)] = obj
                for ordinal in range(n):
                    self._create_pods(obj, ordinal, ready=True)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.url = ""

    @staticmethod
    def _status(obj: dict[str, Any], *, updated: int, ready: int, current: str) -> dict[str, Any]:
        n = obj["spec"]["replicas"]
        status: dict[str, Any] = {"observedGeneration": obj["metadata"]["generation"], "replicas": n,
                                  "updatedReplicas": updated, "readyReplicas": ready}  # fmt: skip
        if obj["kind"] == "StatefulSet":
            status |= {"currentRevision": current, "updateRevision": _revision(obj)}
        else:
            rolling = updated < n or ready < n
            status["conditions"] = [
                {"type": "Available", "status": "True" if ready == n else "False"},
                {"type": "UpdateInProgress", "status": "True" if rolling else "False"},
            ]
        return status

    def _create_pods(self, obj: dict[str, Any], ordinal: int, *, ready: bool) -> None:
        """(Re)create replica ``ordinal``'s pods from the workload's current templates (LWS recreates the group)."""
        for worker in range(int(obj["spec"]["leaderWorkerTemplate"]["size"])):
            pod = make_pod(obj, ordinal, worker, ready=ready)
            self.pods[pod["metadata"]["name"]] = pod

    async def _get(self, request: web.Request) -> web.Response:
        if request.path == self.pods_path:
            wanted = dict(t.split("=", 1) for t in request.query.get("labelSelector", "").split(",") if t)
            items = [p for p in self.pods.values() if wanted.items() <= p["metadata"]["labels"].items()]
            return web.json_response({"apiVersion": "v1", "kind": "PodList", "items": items})
        obj = self.objects.get(request.path)
        if obj is None:
            return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)
        return web.json_response(obj)

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
        old_revision = obj["status"].get("currentRevision", _revision(obj))
        merged["status"] = obj["status"]
        self.objects[request.path] = merged
        if merged["metadata"]["generation"] != obj["metadata"]["generation"]:
            asyncio.get_running_loop().create_task(self._controller(request.path, old_revision))
        return web.json_response(merged)

    async def _controller(self, path: str, old_revision: str) -> None:
        obj = self.objects[path]
        n = obj["spec"]["replicas"]
        strategy = obj["spec"].get("updateStrategy") or obj["spec"]["rolloutStrategy"]
        config = strategy.get("rollingUpdate") or strategy.get("rollingUpdateConfiguration")
        step = int(config["maxUnavailable"])
        env = {e["name"]: e.get("value") for e in serving_pod(obj)["spec"]["containers"][0]["env"]}
        stuck = str(env.get("EXASERVE_RELEASE", "")).endswith("-stuck")
        updated = 0
        while updated < n:
            await asyncio.sleep(0.02)
            for ordinal in range(updated, min(n, updated + step)):
                self._create_pods(obj, ordinal, ready=not stuck)
            updated = min(n, updated + step)
            ready = n - min(step, updated) if stuck else n
            obj["status"] = self._status(obj, updated=updated, ready=ready, current=old_revision)
            if stuck:
                return  # the first wave never becomes ready: the rollout halts
        obj["status"] = self._status(obj, updated=n, ready=n, current=_revision(obj))

    def __enter__(self) -> ApiServerStandIn:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._get)
        app.router.add_patch("/{tail:.*}", self._patch)
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
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def k8s_spec(multi: bool) -> FleetSpec:
    changes: dict[str, Any] = {"serving.releases": RELEASES}
    if multi:  # 16 GPUs per replica: every replica spans two 8-GPU nodes → LeaderWorkerSets
        changes |= {"parallelism.tp": 8, "parallelism.pp": 2, "serving.replicas": 8, "serving.replicas_per_node": None}
    return spec_from("dev", **changes)
