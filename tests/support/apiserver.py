"""STAND-IN for the Kubernetes API server and the StatefulSet/LeaderWorkerSet controllers, for the updater's and the
runtime's Kubernetes tests (there is no API server here).

It speaks the API's REST paths, JSON merge patch (RFC 7386), pod DELETE, Lease create/get/update (with
``resourceVersion`` conflicts), pod eviction (``policy/v1`` Eviction, judged
against the rendered PodDisruptionBudgets as ``eviction.go`` judges it) and the generation/status bookkeeping of the
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
  ``site/content/en/docs/installation/_index.md``: "Or lws will roll out the pods one by one"); scaled (its
  ``spec.replicas`` below the groups it has, or from none) it removes or creates every group at once, at the current
  template (the leader StatefulSet is Parallel, and from 0 the partition is 0: docs/k8s-semantics.md rows 47-48);
* nodes fail as the control plane sees it (docs/k8s-semantics.md rows 43-46): every pod is placed on the node the plan
  gives its replica (with no spare GPU the scheduler has no other choice); a node whose kubelet is gone
  (:meth:`ApiServerStandIn.fail_node`) has its pods marked not Ready, and a pod deleted there stays Terminating, so
  its StatefulSet ordinal is not recreated; a replacement for a cordoned, failed or out-of-service node stays Pending
  (``PodScheduled=False``, ``Unschedulable``, the scheduler's reasons); the out-of-service taint makes the pod garbage
  collector delete the node's terminating pods (:meth:`ApiServerStandIn.taint_out_of_service`); a node back
  (:meth:`ApiServerStandIn.restore_node`) finishes its terminations and takes its pending pods.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import threading
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from serving.pulumi.validate import Validator
from serving.render.k8s.fleet import group_name, render
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
TERMINATING_TICKS = 10  # an evicted pod terminates this many ticks (terminationGracePeriodSeconds, scaled down)


def _pod_count(obj: dict[str, Any]) -> int:
    """Pods per replica: a LeaderWorkerSet's group size, one for a StatefulSet."""
    return int(obj["spec"]["leaderWorkerTemplate"]["size"]) if obj["kind"] == "LeaderWorkerSet" else 1


def pod_name(workload: str, ordinal: int, worker: int = 0) -> str:
    """A replica's pod as its controller names it: ``sglang-g1-3`` (a StatefulSet's pod, an LWS group's leader) and
    ``sglang-g1-3-1`` (that LWS group's second pod)."""
    return f"{workload}-{ordinal}" + (f"-{worker}" if worker else "")


def _replica_pods(obj: dict[str, Any], ordinal: int) -> list[str]:
    """Every pod name of replica ``ordinal`` of ``obj``."""
    return [pod_name(obj["metadata"]["name"], ordinal, w) for w in range(_pod_count(obj))]


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
        "metadata": {**template.get("metadata", {}), "name": pod_name(name, ordinal, worker),
                     "namespace": obj["metadata"]["namespace"], "uid": str(uuid.uuid4()),
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


def _status(code: int, reason: str, message: str, **extra: Any) -> web.Response:
    """A ``Status`` failure as the API server answers it."""
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.json_response(body | extra, status=code)


def _ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def _set_ready(pod: dict[str, Any], ready: bool) -> None:
    """The pod's Ready condition and its containers' readiness (the kubelet's, or the node lifecycle controller's
    ``MarkPodsNotReady`` for a node that stopped reporting)."""
    pod["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    for c in pod["status"].get("containerStatuses", []):
        c["ready"] = ready


@dataclass
class StandInNode:
    """What the control plane knows of one node: its kubelet reporting (Ready), cordoned, the out-of-service taint."""

    ready: bool = True
    unschedulable: bool = False
    out_of_service: bool = False

    def refusal(self) -> str | None:
        """Why the scheduler does not place a pod here (its plugins' messages), None when it does."""
        if self.out_of_service:
            return "1 node(s) had untolerated taint {node.kubernetes.io/out-of-service: nodeshutdown}"
        if not self.ready:
            return "1 node(s) had untolerated taint {node.kubernetes.io/unreachable: }"
        if self.unschedulable:
            return "1 node(s) were unschedulable"
        return None


class ApiServerStandIn:
    """STAND-IN for the API server and the StatefulSet/LeaderWorkerSet controllers (see module doc).

    A pod whose serving container runs a release named `*-stuck` never becomes ready, so the rollout halts like a real
    one. ``deleted`` records every pod the client deleted, in order.
    """

    def __init__(self, spec: FleetSpec, *, token: str | None = None) -> None:
        """``token``: every request must carry it as its bearer token. As the API server with anonymous requests
        enabled (its default) answers: another bearer token 401 (no authenticator accepts it; a bad token is never
        taken for anonymous), none 403 to ``system:anonymous``. ``Authorization`` headers seen are kept in
        ``authorizations``; ``token`` may change while it serves (a rotated credential)."""
        self.token = token
        self.authorizations: list[str | None] = []
        self.validator = Validator(spec.kubernetes.version, crd_dir())
        self.objects: dict[str, dict[str, Any]] = {}
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.field_managers: set[str | None] = set()  # every PATCH's fieldManager (None: the request named none)
        self.pods_path = f"/api/v1/namespaces/{spec.kubernetes.namespace}/pods"
        self.pods: dict[str, dict[str, Any]] = {}  # name → pod
        self.pod_patches: list[tuple[str, dict[str, Any]]] = []  # (pod name, merge patch); workloads' in patches
        self.deleted: list[str] = []
        self.evicted: list[str] = []  # pods the Eviction API deleted, in order (also in ``deleted``)
        self.budgets: dict[str, dict[str, Any]] = {}  # PodDisruptionBudget name → object, as rendered
        self.versions = 0  # the last resourceVersion given (Leases)
        self.lease_writes: list[tuple[str, dict[str, Any]]] = []  # (Lease name, spec) of every update, in order
        self._tasks: set[asyncio.Task[None]] = set()
        self.placement = _placement(spec)  # pod name → node
        self.nodes = {node: StandInNode() for node in self.placement.values()}
        for rendered in render(fleet_of(spec)):
            if rendered["kind"] == "PodDisruptionBudget":
                self.budgets[rendered["metadata"]["name"]] = copy.deepcopy(rendered)
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
        """(Re)create replica ``ordinal``'s pods from the workload's current templates (LWS recreates the group), each
        on its node, or Pending where the scheduler cannot place it (:meth:`_schedule`)."""
        for worker in range(_pod_count(obj)):
            pod = make_pod(obj, ordinal, worker, ready=ready)
            self.pods[pod["metadata"]["name"]] = pod
            self._schedule(pod)

    def _schedule(self, pod: dict[str, Any]) -> None:
        """Bind the pod to its node; where that node refuses it, the pod stays Pending as the scheduler leaves one:
        no node, ``PodScheduled=False`` with reason ``Unschedulable`` and the per-node reasons (every other node's
        GPUs are taken)."""
        name = pod["metadata"]["name"]
        node = self.placement[name]
        refusal = self.nodes[node].refusal()
        if refusal is None:
            pod["spec"]["nodeName"] = node
            return
        pod["spec"].pop("nodeName", None)
        others = len(self.nodes) - 1
        message = f"0/{len(self.nodes)} nodes are available: {refusal}" + (
            f", {others} Insufficient nvidia.com/gpu." if others else "."
        )
        pod["status"] = {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}],
        }

    async def _remove(self, obj: dict[str, Any], ordinal: int) -> None:
        """Replica ``ordinal``'s pods terminate (a tick) and are gone, not recreated: a scale-down. A pod on a node
        whose kubelet is gone stays Terminating (as after a DELETE there)."""
        names = _replica_pods(obj, ordinal)
        for pod in (self.pods[n] for n in names if n in self.pods):
            pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
            pod["metadata"]["deletionGracePeriodSeconds"] = pod["spec"].get("terminationGracePeriodSeconds", 30)
        await asyncio.sleep(TICK_S)
        for name in names:
            node = (self.pods.get(name) or {}).get("spec", {}).get("nodeName")
            if node is None or self.nodes[node].ready:
                self.pods.pop(name, None)

    async def _replace(self, obj: dict[str, Any], ordinal: int) -> None:
        """Replica ``ordinal``'s pods gone, then recreated a tick later from the current template."""
        for name in _replica_pods(obj, ordinal):
            self.pods.pop(name, None)
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
        if request.path.startswith(self.pods_path + "/"):
            pod = self.pods.get(request.path.rsplit("/", 1)[1])
            return web.json_response(pod) if pod is not None else _status(404, "NotFound", "pod not found")
        obj = self.objects.get(request.path)
        if obj is None:
            return _status(404, "NotFound", "not found")
        return web.json_response(obj)

    def _owner(self, name: str) -> dict[str, Any]:
        return next(o for o in self.objects.values() if name.startswith(o["metadata"]["name"] + "-"))

    def _budget_verdict(self, pod: dict[str, Any]) -> tuple[int, str] | None:
        """The Eviction API's answer for ``pod`` when it refuses (status code, Status message), None when it may go:
        kubernetes ``pkg/registry/core/pod/storage/eviction.go`` (EvictionREST.Create, checkAndDecrement), with
        the budget's status as the disruption controller computes it for ``maxUnavailable`` (desiredHealthy =
        expected pods − maxUnavailable; disruptionsAllowed = currentHealthy − desiredHealthy)."""
        if pod["status"].get("phase") in ("Pending", "Succeeded", "Failed") or pod["metadata"].get("deletionTimestamp"):
            return None  # canIgnorePDB
        labels = pod["metadata"]["labels"]
        budgets = [b for b in self.budgets.values() if b["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        if len(budgets) > 1:
            return (
                500,
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            )
        if not budgets:
            return None
        budget = budgets[0]
        selected = [
            p
            for p in self.pods.values()
            if budget["spec"]["selector"]["matchLabels"].items() <= p["metadata"]["labels"].items()
        ]
        owner = self._owner(pod["metadata"]["name"])
        expected = owner["spec"]["replicas"] * _pod_count(owner)
        desired = max(0, expected - int(budget["spec"]["maxUnavailable"]))
        healthy = sum(_ready(p) for p in selected)
        if not _ready(pod):
            if budget["spec"].get("unhealthyPodEvictionPolicy") == "AlwaysAllow":
                return None
            if healthy >= desired > 0:  # IfHealthyBudget (the default): the application is not disrupted now
                return None
        if healthy - desired <= 0:
            return 429, (
                f"Cannot evict pod as it would violate the pod's disruption budget.|The disruption budget "
                f"{budget['metadata']['name']} needs {desired} healthy pods and has {healthy} currently"
            )
        return None

    async def _post(self, request: web.Request) -> web.Response:
        """POST: a Lease created (coordination.k8s.io/v1 ``leases``), or a pod's eviction."""
        if request.path.endswith("/leases"):
            return await self._create_lease(request)
        return await self._evict(request)

    async def _create_lease(self, request: web.Request) -> web.Response:
        """A Lease created as the API server creates one: validated against the OpenAPI schema, 409 AlreadyExists
        when the name is taken, ``resourceVersion`` set (an update must carry the one it read)."""
        body = await request.json()
        problems = self.validator.problems(body)
        if problems:
            return _status(422, "Invalid", str(problems))
        name = body["metadata"]["name"]
        path = f"{request.path}/{name}"
        if path in self.objects:
            return _status(409, "AlreadyExists", f'leases.coordination.k8s.io "{name}" already exists')
        self.versions += 1
        body["metadata"]["resourceVersion"] = str(self.versions)
        self.objects[path] = body
        return web.json_response(body, status=201)

    async def _put(self, request: web.Request) -> web.Response:
        """PUT (update) of a Lease: 409 Conflict unless it carries the stored ``resourceVersion`` (optimistic
        concurrency, as client-go's leader election relies on)."""
        body = await request.json()  # first: the version compared is the one stored when the update is applied
        stored = self.objects.get(request.path)
        if stored is None or request.path.rsplit("/", 2)[-2] != "leases":
            return _status(404, "NotFound", "not found")
        if body.get("metadata", {}).get("resourceVersion") != stored["metadata"]["resourceVersion"]:
            return _status(409, "Conflict", "the object has been modified; please apply your changes to the latest")
        problems = self.validator.problems(body)
        if problems:
            return _status(422, "Invalid", str(problems))
        self.versions += 1
        body["metadata"]["resourceVersion"] = str(self.versions)
        self.objects[request.path] = body
        self.lease_writes.append((request.path.rsplit("/", 1)[1], copy.deepcopy(body["spec"])))
        return web.json_response(body)

    async def _evict(self, request: web.Request) -> web.Response:
        """POST pods/NAME/eviction (policy/v1 Eviction): the pod goes, within its budget (:meth:`_budget_verdict`),
        and its StatefulSet recreates it as after a DELETE; a UID precondition that no longer matches is 409."""
        if not request.path.startswith(self.pods_path + "/") or not request.path.endswith("/eviction"):
            return _status(404, "NotFound", "no such path")
        name = request.path.removesuffix("/eviction").rsplit("/", 1)[1]
        body = await request.json()
        if body.get("apiVersion") not in ("policy/v1", "policy/v1beta1") or body.get("kind") != "Eviction":
            return _status(400, "BadRequest", f"not an Eviction: {body.get('apiVersion')}/{body.get('kind')}")
        pod = self.pods.get(name)
        if pod is None:
            return _status(404, "NotFound", f'pods "{name}" not found')
        verdict = self._budget_verdict(pod)  # the budget first, the UID precondition at the delete (eviction.go)
        if verdict is not None:
            code, text = verdict
            message, _, cause = text.partition("|")
            causes = {"details": {"causes": [{"reason": "DisruptionBudget", "message": cause}]}} if cause else {}
            return _status(code, "TooManyRequests" if code == 429 else "InternalError", message, **causes)
        uid = ((body.get("deleteOptions") or {}).get("preconditions") or {}).get("uid")
        if uid and uid != pod["metadata"]["uid"]:
            return _status(409, "Conflict", f"the UID in the precondition ({uid}) does not match the UID in record")
        if not pod["metadata"].get("deletionTimestamp"):
            self.evicted.append(name)
            self.deleted.append(name)
            pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
            self._spawn(self._terminate(self._owner(name), int(name.split("-")[2])))
        return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success"}, status=201)

    async def _terminate(self, obj: dict[str, Any], ordinal: int) -> None:
        """The evicted pod terminates (its old UID, a deletionTimestamp) for a while before its controller can
        create the replacement under the same name."""
        await asyncio.sleep(TERMINATING_TICKS * TICK_S)
        await self._recreate(obj, ordinal)

    async def _delete(self, request: web.Request) -> web.Response:
        """DELETE of a pod: its StatefulSet recreates it at the update revision; LeaderWorkerSet pods are not
        deleted by the updater (the stand-in answers 405 so a test sees it if they were)."""
        name = request.path.rsplit("/", 1)[1] if request.path.startswith(self.pods_path + "/") else ""
        if name not in self.pods:
            return _status(404, "NotFound", "not found")
        owner = next(o for o in self.objects.values() if name.startswith(o["metadata"]["name"] + "-"))
        if owner["kind"] != "StatefulSet":
            return _status(405, "MethodNotAllowed", "the updater does not delete LeaderWorkerSet pods")
        self.deleted.append(name)
        pod = self.pods[name]
        node = pod["spec"].get("nodeName")
        if node is not None and not self.nodes[node].ready:  # no kubelet to confirm it: Terminating until one does
            if not pod["metadata"].get("deletionTimestamp"):
                pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
                grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
                pod["metadata"]["deletionGracePeriodSeconds"] = grace
            return web.json_response(pod)
        self._spawn(self._recreate(owner, int(name.rsplit("-", 1)[1])))
        return web.json_response(pod)

    async def _recreate(self, obj: dict[str, Any], ordinal: int) -> None:
        await self._replace(obj, ordinal)
        self._refresh(obj)

    async def _patch(self, request: web.Request) -> web.Response:
        if request.content_type != "application/merge-patch+json":
            return _status(415, "UnsupportedMediaType", "only application/merge-patch+json")
        self.field_managers.add(request.query.get("fieldManager"))
        if request.path.startswith(self.pods_path + "/"):
            name = request.path.rsplit("/", 1)[1]
            body = await request.json()  # first: the controller may delete the pod while the body is read
            if name not in self.pods:  # (a CI run's 500 was the KeyError of a pod replaced meanwhile)
                return _status(404, "NotFound", "not found")
            self.pod_patches.append((name, body))
            self.pods[name] = merge_patch(self.pods[name], body)
            return web.json_response(self.pods[name])
        obj = self.objects.get(request.path)
        if obj is None:
            return _status(404, "NotFound", "not found")
        patch = await request.json()
        self.patches.append((request.path, patch))
        # a copy: merge_patch shares the subtrees the patch leaves alone (a patch without metadata would bump the
        # generation of the stored object itself, and no controller would run)
        merged = merge_patch(copy.deepcopy({k: v for k, v in obj.items() if k != "status"}), patch)
        problems = self.validator.problems(merged)
        if problems:
            return _status(422, "Invalid", str(problems))
        if merged["spec"] != obj["spec"]:
            merged["metadata"]["generation"] = obj["metadata"]["generation"] + 1
        merged["status"] = obj["status"]
        self.objects[request.path] = merged
        if merged["metadata"]["generation"] != obj["metadata"]["generation"]:
            self._spawn(self._controller(merged))
        return web.json_response(merged)

    async def _controller(self, obj: dict[str, Any]) -> None:
        """The workload's controller observing a new generation, a tick later. A StatefulSet (OnDelete) records the
        update revision and replaces nothing; a LeaderWorkerSet scaled removes or creates every group at once, and
        one with a new template at the same count replaces one replica at a time, highest ordinal first, each Ready
        before the next (module doc)."""
        await asyncio.sleep(TICK_S)
        if obj["kind"] == "StatefulSet":
            obj["status"]["observedGeneration"] = obj["metadata"]["generation"]
            self._refresh(obj)
            return
        replicas, name = obj["spec"]["replicas"], obj["metadata"]["name"]
        present = {
            int(n.split("-")[2])
            for n, p in self.pods.items()
            if n.startswith(name + "-") and not p["metadata"].get("deletionTimestamp")
        }
        if replicas < len(present) or not present:  # scaled: the leader StatefulSet is Parallel, all at once
            for ordinal in sorted(present):
                if ordinal >= replicas:  # gone, workers with their leader (garbage collection)
                    await self._remove(obj, ordinal)
            for ordinal in range(replicas):
                if ordinal not in present:  # created at the current template, every group at once
                    self._create_pods(obj, ordinal, ready=not _stuck(obj))
            self._refresh(obj)
            return
        for ordinal in reversed(range(replicas)):
            await self._replace(obj, ordinal)
            self._refresh(obj)
            if _stuck(obj):
                return  # the replica never becomes ready: the rollout halts

    # ----- nodes failing, as a test drives them (each runs on the server's loop, between requests) -----
    def _on_loop(self, change: Callable[[], None]) -> None:
        async def run() -> None:
            change()

        asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def _on(self, node: str) -> list[dict[str, Any]]:
        return [p for p in self.pods.values() if p["spec"].get("nodeName") == node]

    def _gone(self, pod: dict[str, Any]) -> None:
        """The pod object removed (a kubelet's final delete, or the pod GC's force delete); its StatefulSet creates the
        ordinal again (as after a DELETE)."""
        name = pod["metadata"]["name"]
        self.pods.pop(name, None)
        owner, ordinal = self._owner(name), int(name.split("-")[2])
        if ordinal < owner["spec"]["replicas"]:  # not when the workload was scaled below it meanwhile
            self._spawn(self._recreate(owner, ordinal))

    def fail_node(self, node: str) -> None:
        """The node's kubelet stops reporting: Ready turns Unknown and its pods are marked not Ready."""

        def change() -> None:
            self.nodes[node].ready = False
            for pod in self._on(node):
                _set_ready(pod, False)
            for obj in self.objects.values():
                if obj["kind"] in ("StatefulSet", "LeaderWorkerSet"):
                    self._refresh(obj)

        self._on_loop(change)

    def cordon(self, node: str) -> None:
        """``kubectl cordon``: ``spec.unschedulable``; running pods stay, no new pod is placed there."""
        self._on_loop(lambda: setattr(self.nodes[node], "unschedulable", True))

    def taint_out_of_service(self, node: str) -> None:
        """``node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`` on a node whose kubelet is gone: the pod
        garbage collector force-deletes its terminating pods (and the taint's NoExecute evicts the rest, which then
        terminate there too)."""

        def change() -> None:
            self.nodes[node].out_of_service = True
            if not self.nodes[node].ready:
                for pod in self._on(node):
                    self._gone(pod)

        self._on_loop(change)

    def restore_node(self, node: str) -> None:
        """The node back, schedulable and untainted: its kubelet finishes the terminations it missed and reports its
        pods Ready again; the scheduler places the pods that waited for it."""

        def change() -> None:
            self.nodes[node] = StandInNode()
            for pod in self._on(node):
                if pod["metadata"].get("deletionTimestamp"):
                    self._gone(pod)
                else:
                    _set_ready(pod, True)
            for name, pod in list(self.pods.items()):
                if self.placement[name] == node and pod["status"].get("phase") == "Pending":
                    self._gone(pod)  # the stand-in's scheduler: placed as a new pod, the template's revision
            for obj in self.objects.values():
                if obj["kind"] in ("StatefulSet", "LeaderWorkerSet"):
                    self._refresh(obj)

        self._on_loop(change)

    @web.middleware
    async def _authenticate(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        given = request.headers.get("Authorization")
        self.authorizations.append(given)
        if self.token is not None and given is None:
            return _status(403, "Forbidden", f'{request.path} is forbidden: User "system:anonymous" cannot access it')
        if self.token is not None and given != f"Bearer {self.token}":
            return _status(401, "Unauthorized", "Unauthorized")
        return await handler(request)

    def __enter__(self) -> ApiServerStandIn:
        app = web.Application(middlewares=[self._authenticate])
        app.router.add_get("/{tail:.*}", self._get)
        app.router.add_patch("/{tail:.*}", self._patch)
        app.router.add_delete("/{tail:.*}", self._delete)
        app.router.add_post("/{tail:.*}", self._post)
        app.router.add_put("/{tail:.*}", self._put)
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


def _placement(spec: FleetSpec) -> dict[str, str]:
    """Pod name → node: a group's replicas, in index order, are its workload's ordinals (the backend's mapping), and
    pod ``w`` of a replica runs on the replica's ``w``-th node, as the plan places it."""
    out = {}
    replicas = fleet_of(spec).plan.replicas
    for group in sorted({r.group for r in replicas}):
        members = sorted((r for r in replicas if r.group == group), key=lambda r: r.index)
        for ordinal, replica in enumerate(members):
            for worker, node in enumerate(replica.nodes):
                out[pod_name(group_name(group), ordinal, worker)] = node.name
    return out


def k8s_spec(multi: bool, **more: Any) -> FleetSpec:
    """The dev stack with the stand-in's releases; ``multi``: two-node replicas (LeaderWorkerSets); ``more``: other
    dotted changes."""
    changes: dict[str, Any] = {"serving.releases": RELEASES, **more}
    if multi:  # 16 GPUs per replica: every replica spans two 8-GPU nodes → LeaderWorkerSets
        changes |= {"parallelism.tp": 8, "parallelism.pp": 2, "serving.replicas": 8, "serving.replicas_per_node": None}
    return spec_from("dev", **changes)


Rules = Sequence[Mapping[str, Any]]


def allowed(rules: Rules, verb: str, group: str, resource: str, name: str | None) -> bool:
    """STAND-IN for the API server's RBAC authorizer on one namespaced request: a rule allows it when the group,
    resource and verb match and, if the rule names resources, the request names one of them (a list has no name)."""
    return any(
        group in r["apiGroups"]
        and resource in r["resources"]
        and verb in r["verbs"]
        and (not r.get("resourceNames") or name in r["resourceNames"])
        for r in rules
    )


def request_attributes(method: str, path: str) -> tuple[str, str, str, str, str | None]:
    """(namespace, verb, API group, resource, name) of a namespaced request, as the API server derives them."""
    parts = path.strip("/").split("/")
    if parts[0] == "api":  # /api/v1/namespaces/NS/RESOURCE[/NAME[/SUB]]
        group, rest = "", parts[2:]
    else:  # /apis/GROUP/VERSION/namespaces/NS/RESOURCE[/NAME[/SUB]]
        group, rest = parts[1], parts[3:]
    assert rest[0] == "namespaces", f"not a namespaced request: {path}"
    namespace, resource, name = rest[1], "/".join([rest[2], *rest[4:5]]), (rest[3] if len(rest) > 3 else None)
    verb = {"GET": "get" if name else "list", "PATCH": "patch", "PUT": "update", "POST": "create", "DELETE": "delete"}[
        method
    ]
    return namespace, verb, group, resource, name


class AuthorizingApiServer(ApiServerStandIn):
    """The API-server stand-in with RBAC in front: every request is authorized against one Role's rules (in its
    namespace) and answered 403 like the API server when no rule allows it; each decision is recorded."""

    def __init__(self, spec: FleetSpec, role: Mapping[str, Any]) -> None:
        super().__init__(spec)
        self.role = role
        self.decisions: list[tuple[str, str, str, str | None, bool]] = []  # (verb, group, resource, name, allowed)

    def _forbidden(self, request: web.Request) -> web.Response | None:
        namespace, verb, group, resource, name = request_attributes(request.method, request.path)
        ok = namespace == self.role["metadata"]["namespace"] and allowed(
            self.role["rules"], verb, group, resource, name
        )
        self.decisions.append((verb, group, resource, name, ok))
        if ok:
            return None
        return _status(403, "Forbidden", "forbidden by the Role")

    async def _get(self, request: web.Request) -> web.Response:
        return self._forbidden(request) or await super()._get(request)

    async def _patch(self, request: web.Request) -> web.Response:
        return self._forbidden(request) or await super()._patch(request)

    async def _delete(self, request: web.Request) -> web.Response:
        return self._forbidden(request) or await super()._delete(request)

    async def _evict(self, request: web.Request) -> web.Response:
        return self._forbidden(request) or await super()._evict(request)

    async def _create_lease(self, request: web.Request) -> web.Response:
        return self._forbidden(request) or await super()._create_lease(request)

    async def _put(self, request: web.Request) -> web.Response:
        return self._forbidden(request) or await super()._put(request)
