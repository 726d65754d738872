"""Kubernetes: move the batch's update group to the new release on its StatefulSet or LeaderWorkerSet.

A batch is update group ``g`` — the workload ``sglang-g<g>`` that the Pulumi program creates
(:mod:`serving.render.k8s.fleet`). The update renders that workload from the stack with group ``g`` at the
new version (image from ``serving.releases``, ``EXASERVE_RELEASE``, the version label) and sends its
labels and pod template as a JSON merge patch — the same object ``pulumi up`` would apply once the
stack records the new version. A StatefulSet group (``updateStrategy: OnDelete``) replaces no pod by itself: once
its controller has observed the patch (``status.observedGeneration``), the updater deletes every pod of the group not
at ``status.updateRevision`` (its ``controller-revision-hash`` label), all at once — the whole group is out of the
routers — and the controller (``podManagementPolicy: Parallel``) recreates them at the new revision together; it
deletes again any pod that comes back at the old revision. A LeaderWorkerSet group (multi-node replicas) would be
replaced by its own controller one replica at a time (without the MaxUnavailableStatefulSet gate): the updater
instead sends the new template with ``spec.replicas: 0`` in one patch, waits until every pod of the group is gone,
and scales it back to its rendered count, so the LWS controller creates every group at once at the new revision
(:meth:`KubernetesBackend._through_zero`; docs/infra.md, "How a batch is rolled"; docs/k8s-semantics.md rows
47-48). Then it waits until every pod of the group is updated and Ready, bounded by the updater's health timeout.

Membership (:class:`DiscoveryMembership`): the routers run smg's Kubernetes service discovery and know a worker as
``http://POD_IP:serving.port``; discovery selects the serving pods labelled ``exaserve.io/admitted=true`` (every pod
starts so: its template says it). That label is the one record of who is in: the updater takes a batch out by setting
it to ``false`` on the batch's pods and brings it back with ``true``, and every router instance, running or
restarted, makes the change itself. smg 1.13's discovery (``model_gateway/src/service_discovery/``; checked live in
tests/test_rollout_k8s_membership.py) is level-triggered: on every watch event (after 1 s, coalescing a burst) and
every 60 s it compares the pods its selector publishes with the workers it registered and submits the difference as
jobs — a pod that left the selector or turned unready is removed (drained: ``status: draining`` for
``drain_settle_secs``, then gone); a selected Ready pod that is not registered is registered; a worker added by hand
(``POST /workers``, no pod-uid label) is never touched. So the updater only sets
labels, and proves each change on every instance without asking (:meth:`RouterSet.drained`,
:meth:`RouterSet.discovered`). An update keeps the group's new pods out of the selection as they appear
(``admitted=false``): through health and warm-up no router takes them. That relies on the label being set before
the new server is Ready (a real SGLang server loads for minutes; the updater polls every ``POLL_S``); a pod that wins
the race is deselected at the runner's next reconcile and drained by discovery, and comes back at readmission.

A failed node (docs/runbooks.md, "A node fails during a rollout"): a pod the update deleted on a node whose kubelet
is gone stays ``Terminating`` (only the kubelet, or the pod garbage collector once the node carries the
``node.kubernetes.io/out-of-service`` taint, removes it), and the StatefulSet controller recreates an ordinal only
once its pod is gone; a replacement for a cordoned node, with no spare GPU elsewhere, stays ``Pending``
(``Unschedulable``). Neither ends without an operator, so the wait names such pods (:func:`stuck_pods`: terminating
past their grace period plus :data:`STUCK_MARGIN_S`, or unschedulable that long) and raises :class:`PodsStuck`; the
runner waits for an operator until the health timeout, then pauses at the step (docs/k8s-semantics.md, rows 43-46).

The updater's own calls (health, ``/metrics`` while draining, warm-up) go to the pod's IP as well, from the latest
pod listing (the runner refreshes it before every step); the NetworkPolicy admits the updater's pod to the serving
port (:mod:`serving.render.k8s.netpol`). Its service account needs ``get``/``patch`` on the groups' workloads and
``list`` on pods, ``patch``/``delete`` on the replicas' serving pods (:mod:`serving.render.k8s.updater`).

Announcing a batch (:meth:`KubernetesBackend.announce`): while a batch is out of the routers, the updater holds the
Lease ``exaserve-rollout-<namespace>`` (:func:`batch_lease_name`), renewed every third of :data:`ANNOUNCE_TTL_S`, and
gives it up (holder cleared, ``renewTime`` the epoch) once the batch is back. kube-state-metrics publishes its
``renewTime`` as ``kube_lease_renew_time{lease=…}`` (a default resource; the metric has no namespace label, hence the
namespace in the name), and alert ExaServeWorkersUnhealthy counts a batch as planned while that renewal is fresh
(:mod:`serving.render.k8s.monitoring`): a planned batch pages nobody, an updater that died with a batch out stops
renewing and the page comes. The Lease is written the way the controller's election writes its own
(:class:`serving.runtime.leader.KubernetesLeaseElection`, reused here).

The API server and its credentials come from :class:`serving.kubeapi.KubeApi` (a kubeconfig context, in-cluster, or an
explicit server): JSON over HTTPS; plain HTTP only to a loopback address (a local proxy or test stand-in).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence, Set
from typing import Any

import httpx

from serving.kubeapi import KubeApi, KubeCredentialError
from serving.plan.model import Fleet
from serving.render.k8s.common import LABEL_ADMITTED, LABEL_GROUP, LABEL_VERSION, K8sObject, image
from serving.render.k8s.fleet import SERVING_CONTAINER, group_name, render
from serving.rollout.backends import BackendError, PodsStuck, ReplicaIndex
from serving.rollout.plan import with_group_version
from serving.router.membership import Observed, RouterSet
from serving.runtime.leader import ElectionError, KubernetesLeaseElection, Term
from serving.spec.schema import FleetSpec

log = logging.getLogger(__name__)
POLL_S = 0.5
# The StatefulSet controller's label naming the revision a pod was created from (apps/v1 ControllerRevisionHashLabelKey).
REVISION_LABEL = "controller-revision-hash"
ANNOUNCE_TTL_S = 60.0  # the batch Lease's duration: renewed every third of it while a batch is out
# The name the API server records in managedFields for every field the updater writes (an Update operation; without
# it the client's user agent, "python-httpx/…"). pulumi-kubernetes applies server-side with its own manager, and an
# apply that sets another value on a field this one owns is a conflict naming it (docs/infra.md, "Pulumi and the
# updater"; docs/k8s-semantics.md row 49).
FIELD_MANAGER = "exaserve-updater"
# How long past its grace period a pod may stay Terminating, or a pod stay unschedulable, before the wait calls it
# stuck: a kubelet's final delete comes within the grace period (plus its sync, seconds), a scheduler's retry of a
# pod whose node is being freed within seconds; neither takes half a minute.
STUCK_MARGIN_S = 30.0
DEFAULT_GRACE_S = 30  # a pod's terminationGracePeriodSeconds when its spec does not say (the API's default)


def batch_lease_name(namespace: str) -> str:
    """The Lease the updater holds while a batch is out (module docstring): one per stack namespace, named with it
    because ``kube_lease_renew_time`` carries the Lease's name only."""
    return f"exaserve-rollout-{namespace}"


def workload_path(obj: K8sObject) -> str:
    """The API path of a rendered workload (a StatefulSet or a LeaderWorkerSet)."""
    meta = obj["metadata"]
    return f"/apis/{obj['apiVersion']}/namespaces/{meta['namespace']}/{obj['kind'].lower()}s/{meta['name']}"


def workload(fleet: Fleet, group: int) -> K8sObject:
    """Group ``group``'s StatefulSet or LeaderWorkerSet as the Pulumi program renders it."""
    name = group_name(group)
    for obj in render(fleet):
        if obj["kind"] in ("StatefulSet", "LeaderWorkerSet") and obj["metadata"]["name"] == name:
            return obj
    raise BackendError(f"the fleet has no workload {name}; rollout.batches={fleet.spec.rollout.batches}")


def version_patch(fleet: Fleet, group: int, version: str) -> dict[str, Any]:
    """JSON merge patch moving group ``group`` to ``version``: its labels and pod template(s)."""
    target = workload(with_group_version(fleet, group, version), group)
    templates = (
        {"leaderWorkerTemplate": target["spec"]["leaderWorkerTemplate"]}
        if target["kind"] == "LeaderWorkerSet"
        else {"template": target["spec"]["template"]}
    )
    return {"metadata": {"labels": target["metadata"]["labels"]}, "spec": templates}


def rollout_status(obj: K8sObject) -> tuple[bool, str]:
    """(done, what is left) for a StatefulSet or LeaderWorkerSet: the controller has seen the latest generation and
    every replica is updated and Ready. An OnDelete StatefulSet never moves ``currentRevision`` (the controller does so
    only for RollingUpdate: kubernetes ``pkg/controller/statefulset/stateful_set_utils.go``, ``completeRollingUpdate``),
    so ``updatedReplicas`` is what counts."""
    meta, spec, status = obj.get("metadata", {}), obj.get("spec", {}), obj.get("status") or {}
    want = int(spec.get("replicas", 1))
    observed, generation = int(status.get("observedGeneration", 0)), int(meta.get("generation", 0))
    if observed < generation:
        return False, f"controller has not seen generation {generation} yet (observed {observed})"
    updated, ready = int(status.get("updatedReplicas", 0)), int(status.get("readyReplicas", 0))
    if updated < want:
        return False, f"{updated} of {want} replicas updated, {ready} ready"
    if ready < want:
        return False, f"{ready} of {want} updated replicas ready"
    if obj.get("kind") == "LeaderWorkerSet":
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions", [])}
        if conditions.get("UpdateInProgress") == "True" or conditions.get("Available") != "True":
            return False, f"conditions {conditions}"
    return True, f"{ready} of {want} replicas updated and ready"


def pod_version(spec: FleetSpec, pod: K8sObject) -> str | None:
    """The release a pod runs: its version label (the pod template's, which the pod keeps from its creation; several
    releases may share an image, so the label names it), checked against the serving container's image. None when
    the pod is not running: terminating, not in phase Running, or its serving container not running (readiness is
    not asked: the updater itself holds it while a batch is out). A label whose release has another image (a pod
    changed by hand) reads ``unknown (image …, version label …)``: no release of the stack, so no rollback target."""
    meta, status = pod.get("metadata", {}), pod.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase") != "Running":
        return None
    states = {c.get("name"): c.get("state") or {} for c in status.get("containerStatuses", [])}
    if "running" not in states.get(SERVING_CONTAINER, {}):
        return None
    label = meta.get("labels", {}).get(LABEL_VERSION)
    containers = pod.get("spec", {}).get("containers", [])
    running = next((c.get("image") for c in containers if c.get("name") == SERVING_CONTAINER), None)
    release = spec.serving.releases.get(label) if label else None
    if release is not None and running == image(spec, release):
        return str(label)
    return f"unknown (image {running}, version label {label})"


def stuck_pods(pods: Sequence[K8sObject], since: dict[str, float], now: float, margin_s: float) -> list[str]:
    """The pods among ``pods`` that wait on an operator, one line each naming the pod, its node and why; ``since``
    (kept by the caller between polls) records when each pod was first seen in that state, by this clock, so no
    server timestamp is compared with it (pure but for ``since``).

    * Terminating longer than its grace period (the larger of ``metadata.deletionGracePeriodSeconds`` and the
      spec's ``terminationGracePeriodSeconds``) plus ``margin_s``: its kubelet never confirmed the deletion (its
      node is down or cut off, or a process cannot be killed), or a finalizer still holds it (named).
    * Pending with ``PodScheduled=False``, reason ``Unschedulable``, for ``margin_s``: the scheduler's own message
      (a cordoned node, no node with a free GPU) is quoted; not while it is nominated to a node (preemption).

    Naming is not giving up: the runner waits on such pods until the health timeout (:meth:`Runner._update`)."""
    current: set[str] = set()
    out = []
    for pod in pods:
        meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status") or {}
        name, node = meta.get("name", "?"), spec.get("nodeName") or "no node"
        terminating = bool(meta.get("deletionTimestamp"))
        unschedulable = [
            c
            for c in status.get("conditions", [])
            if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        ]
        if not terminating and (status.get("phase") != "Pending" or not unschedulable):
            continue
        key = f"{meta.get('uid', name)}/{'terminating' if terminating else 'unschedulable'}"
        current.add(key)
        waited = now - since.setdefault(key, now)
        if terminating:
            # the larger of the two: a kubelet's final delete lowers deletionGracePeriodSeconds to 0 while a
            # finalizer (foreground deletion of a LeaderWorkerSet group's workers) still holds the object
            grace = max(
                int(meta.get("deletionGracePeriodSeconds") or 0),
                int(spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)),
            )
            if waited < grace + margin_s:
                continue
            held = meta.get("finalizers") or []
            out.append(
                f"{name} (Terminating {waited:.0f} s, past its {grace} s grace period: "
                + (
                    f"held by finalizer(s) {', '.join(held)} on node {node} (its dependents, e.g. a group's worker "
                    "pods, are not gone yet)"
                    if held
                    else f"node {node}'s kubelet never confirmed the deletion (the node is down or cut off, or a "
                    "process there cannot be killed: `kubectl get node` tells which)"
                )
                + "; the StatefulSet controller recreates an ordinal only once its pod is gone)"
            )
        elif status.get("nominatedNodeName"):
            since.pop(key, None)  # preemption under way: the scheduler waits for its victims' grace periods
            current.discard(key)
        elif waited >= margin_s:
            out.append(f"{name} (Pending {waited:.0f} s, unschedulable: {unschedulable[0].get('message', '')})")
    for key in set(since) - current:
        del since[key]
    return sorted(out)


def stuck_message(workload_name: str, namespace: str, stuck: Sequence[str]) -> str:
    """What :class:`PodsStuck` says: the pods, then what an operator does (the runbook's two cases)."""
    return (
        f"rollout of {workload_name} is blocked by {len(stuck)} pod(s) that cannot come back on their own: "
        + "; ".join(stuck)
        + ". A node that is down: bring it back, or once it is shut down for good mark it "
        "`kubectl taint nodes NODE node.kubernetes.io/out-of-service=nodeshutdown:NoExecute` (the pod garbage "
        "collector then deletes its pods; with no spare GPU their replacements stay Pending until a node joins). A "
        "cordoned node: `kubectl uncordon NODE` once its maintenance ends. Then `exaserve rollout --resume`; "
        f"`kubectl -n {namespace} get pods -o wide` shows each pod's node (docs/runbooks.md, 'A node fails during a rollout')"
    )


def _unanswered(method: str, path: str, exc: httpx.HTTPError) -> BackendError:
    """A request that got no answer: the credential that could not be renewed, or the API server not reached."""
    if isinstance(exc, KubeCredentialError):
        return BackendError(f"{method} {path}: {exc}")
    return BackendError(f"{method} {path}: {exc!r}; is the API server reachable?")


class KubernetesBackend(ReplicaIndex):
    """Patch update groups' workloads through the Kubernetes API and wait for their rollout."""

    def __init__(self, fleet: Fleet, api: KubeApi) -> None:
        self.fleet = fleet
        self.spec = fleet.spec
        self.api = api
        replicas = list(fleet.plan.replicas)
        super().__init__(replicas)
        # A group's replicas, in index order, are its workload's ordinals 0..size-1.
        self._ordinal = {r.id: sorted(x.index for x in replicas if x.group == r.group).index(r.index) for r in replicas}
        self._http = api.client()
        self._workloads = {g: workload(fleet, g) for g in range(fleet.spec.rollout.batches)}
        self._pod_urls: dict[str, str] = {}  # replica → http://POD_IP:PORT from the latest listing
        namespace = fleet.spec.kubernetes.namespace
        self._lease = KubernetesLeaseElection(
            api,
            namespace,
            batch_lease_name(namespace),
            f"exaserve-updater/{namespace}",  # a resumed rollout takes back what its crashed run held
            ANNOUNCE_TTL_S,
            timeout_s=10.0,
        )
        self._term: Term | None = None
        self._renewing: asyncio.Task[None] | None = None
        self.stuck_margin_s = STUCK_MARGIN_S
        # group → when each pod was first seen stuck (stuck_pods), kept across updates: the runner tries an update
        # blocked on stuck pods again, and a pod stuck for ten minutes must not read as stuck for 30 s each try
        self._stuck_since: dict[int, dict[str, float]] = {}

    @property
    def name(self) -> str:
        return f"kubernetes ({self.api.server}, namespace {self.spec.kubernetes.namespace})"

    def worker_url(self, replica_id: str) -> str:
        """The replica's pod (the leader pod of a multi-node replica) by its IP, as the routers' discovery knows it,
        from the latest pod listing; before the first listing, by its stable DNS name."""
        if url := self._pod_urls.get(replica_id):
            return url
        pod = self._pod_name(replica_id)
        spec = self._workloads[self._replica(replica_id).group]["spec"]
        service = spec.get("serviceName") or group_name(self._replica(replica_id).group)  # an LWS's own Service
        return f"http://{pod}.{service}.{self.spec.kubernetes.namespace}.svc:{self.spec.serving.port}"

    def _pod_name(self, replica_id: str) -> str:
        return f"{group_name(self._replica(replica_id).group)}-{self._ordinal[replica_id]}"

    def membership(self, routers: RouterSet) -> DiscoveryMembership:
        return DiscoveryMembership(self, routers)

    async def leader_pods(self, replica_ids: Sequence[str]) -> dict[str, K8sObject | None]:
        """Each replica's serving pod as the API server has it now (None: no pod, or it is being deleted); the
        pod URLs :meth:`worker_url` returns are refreshed from it."""
        groups = sorted({self._replica(r).group for r in replica_ids})
        listed = dict(zip(groups, await asyncio.gather(*(self._pods(g) for g in groups)), strict=True))
        return self._leaders(replica_ids, listed)

    def _leaders(
        self, replica_ids: Sequence[str], listed: Mapping[int, Mapping[str, K8sObject]]
    ) -> dict[str, K8sObject | None]:
        """:meth:`leader_pods` from pod listings already made (``listed``: each replica's group's pods by name)."""
        out: dict[str, K8sObject | None] = {}
        for rid in replica_ids:
            pod = listed[self._replica(rid).group].get(self._pod_name(rid))
            if pod is None or pod["metadata"].get("deletionTimestamp"):
                out[rid] = None
                continue
            out[rid] = pod
            if ip := (pod.get("status") or {}).get("podIP"):
                self._pod_urls[rid] = f"http://{ip}:{self.spec.serving.port}"  # the URL discovery registers
        return out

    async def admit(self, pod: K8sObject, admitted: bool, *, missing_ok: bool = False) -> None:
        """Set the pod's ``exaserve.io/admitted`` label (a JSON merge patch of the pod's labels). ``missing_ok``: a pod
        deleted since it was listed (its workload is replacing it) is no error."""
        name = pod["metadata"]["name"]
        path = f"/api/v1/namespaces/{self.spec.kubernetes.namespace}/pods/{name}"
        patch = {"metadata": {"labels": {LABEL_ADMITTED: "true" if admitted else "false"}}}
        await self._merge_patch(path, patch, missing_ok=missing_ok)

    def known_versions(self) -> None:
        return None  # any release of serving.releases

    @property
    def updates_whole_groups(self) -> bool:
        return True  # a batch is a whole workload: the update patches its pod template

    def _refused(self, method: str, path: str, response: httpx.Response) -> BackendError:
        """A request the API server did not do: its status and body, and for 401/403 whose credentials they were."""
        text = f"{method} {path} answered {response.status_code}: {response.text[:500]}"
        anonymous = "Authorization" not in response.request.headers or "system:anonymous" in response.text
        if response.status_code in (401, 403) and anonymous:
            text += f"; no credentials were sent ({self.api.source}): give a token or a kubeconfig user"
        elif response.status_code == 401:
            text += (
                f"; the API server did not accept the credentials of {self.api.source}: renew them (log in again, "
                "or check them with `kubectl auth whoami`)"
            )
        elif response.status_code == 403:
            text += f"; the credentials of {self.api.source} lack this permission (the updater's Role: docs/infra.md)"
        return BackendError(text)

    async def _get(self, group: int) -> K8sObject:
        path = workload_path(self._workloads[group])
        try:
            response = await self._http.get(path)
        except httpx.HTTPError as exc:
            raise _unanswered("GET", path, exc) from None
        if response.status_code != 200:
            raise self._refused("GET", path, response)
        obj: K8sObject = response.json()
        status = obj.get("status") or {}
        if obj.get("kind") == "LeaderWorkerSet" and status and "observedGeneration" not in status:
            # without it no wait can tell a status the controller wrote before the patch from one after it
            raise BackendError(
                f"LeaderWorkerSet {group_name(group)} has a status but no status.observedGeneration: its controller is "
                "older than lws v0.9.0, which added it (docs/k8s-semantics.md row 48); upgrade the LeaderWorkerSet "
                "controller (docs/infra.md, prerequisites) before rolling out"
            )
        return obj

    async def _pods(self, group: int) -> dict[str, K8sObject]:
        """Update group ``group``'s pods by name (one list call per group, by its ``exaserve.io/group`` label)."""
        path = f"/api/v1/namespaces/{self.spec.kubernetes.namespace}/pods"
        try:
            response = await self._http.get(path, params={"labelSelector": f"{LABEL_GROUP}={group}"})
        except httpx.HTTPError as exc:
            raise _unanswered("GET", path, exc) from None
        if response.status_code != 200:
            raise self._refused("GET", path, response)
        return {p["metadata"]["name"]: p for p in response.json().get("items", [])}

    async def versions(self, replica_ids: Sequence[str]) -> dict[str, str | None]:
        """What each replica's pods run (:func:`pod_version`): its leader pod ``sglang-g<group>-<ordinal>`` and, for
        a multi-node replica, its worker pods ``…-<ordinal>-<n>``. None (down) when a pod is missing or not running,
        or the replica's pods disagree (half recreated)."""
        groups = sorted({self._replica(r).group for r in replica_ids})
        listed = dict(zip(groups, await asyncio.gather(*(self._pods(g) for g in groups)), strict=True))
        out: dict[str, str | None] = {}
        for rid in replica_ids:
            replica = self._replica(rid)
            leader = f"{group_name(replica.group)}-{self._ordinal[rid]}"
            names = [leader, *(f"{leader}-{n}" for n in range(1, len(replica.nodes)))]
            pods = [listed[replica.group].get(name) for name in names]
            found = {pod_version(self.spec, p) if p is not None else None for p in pods}
            out[rid] = found.pop() if len(found) == 1 else None
        return out

    def unreachable(self) -> dict[str, str]:
        return {}  # a replica that does not answer is down; nothing in between fails on its own

    async def update(self, replica_ids: Sequence[str], version: str, timeout_s: float) -> None:
        """Patch the groups' workloads and wait for their rollout. The updater updates only replicas it took out of
        the routers: every new pod is set ``admitted=false`` as it appears, so none joins the routers before the
        updater's health check, warm-up and readmission."""
        groups = sorted({self._replica(r).group for r in replica_ids})
        for g in groups:
            members = set(self._members(g))
            if not members <= set(replica_ids):
                raise BackendError(
                    f"batch does not cover update group {g}: on Kubernetes a batch is a whole workload "
                    f"({group_name(g)}); plan batches from the plan's update groups (Plan.rollout_groups)"
                )
        deadline = time.monotonic() + timeout_s
        for g in groups:
            patch = version_patch(self.fleet, g, version)
            if self._workloads[g]["kind"] == "LeaderWorkerSet":
                await self._through_zero(g, patch, deadline, timeout_s)
            else:
                await self._merge_patch(workload_path(self._workloads[g]), patch)
        for g in groups:
            await self._wait(g, deadline, timeout_s)

    async def _through_zero(self, group: int, patch: dict[str, Any], deadline: float, timeout_s: float) -> None:
        """A LeaderWorkerSet group at the new template, every replica at once: the template with ``replicas: 0`` in
        one patch (the LWS controller's partition is then 0: lws ``rollingUpdateParameters``, "Case 2"), every pod
        of the group gone (the leader StatefulSet is Parallel; the worker StatefulSets go with their leader pods by
        garbage collection), then the rendered count back: the controller creates every group at the new revision at
        once, each group's workers with its leader (docs/k8s-semantics.md rows 47-48). The batch is out of the routers
        already. Idempotent, judged on the version label only the updater writes (a CRD's defaults make the stored
        templates differ from the rendered ones): a group at the target, scaled back, with no pod of another version
        (none yet while LWS creates them) is left to :meth:`_wait`, so a resumed update does not recreate what its
        crashed run brought up; one at the target and at 0 is only scaled back."""
        path = workload_path(self._workloads[group])
        want = int(self._workloads[group]["spec"]["replicas"])
        target = patch["metadata"]["labels"][LABEL_VERSION]
        obj, pods = await self._get(group), await self._pods(group)
        at_target = obj["metadata"].get("labels", {}).get(LABEL_VERSION) == target
        replicas = int(obj["spec"].get("replicas", 1))
        others = [n for n, p in pods.items() if p["metadata"].get("labels", {}).get(LABEL_VERSION) != target]
        if at_target and replicas == want and not others:
            return
        if not at_target or replicas != 0:
            await self._merge_patch(path, {**patch, "spec": {**patch["spec"], "replicas": 0}})
        since = self._stuck_since.setdefault(group, {})
        while True:
            obj, pods = await self._get(group), await self._pods(group)
            status = obj.get("status") or {}
            seen = int(status.get("observedGeneration", 0)) >= int(obj["metadata"].get("generation", 0))
            if seen and int(status.get("replicas", 0)) == 0 and not pods:
                break
            self._unless_stuck_or_late(
                group,
                list(pods.values()),
                since,
                deadline,
                f"{group_name(group)} not scaled to 0 after {timeout_s:g} s (to recreate every group at the "
                f"new template at once): {len(pods)} pod(s) left ({', '.join(sorted(pods)[:5])}); see "
                f"`kubectl -n {self.spec.kubernetes.namespace} get pods -l exaserve.io/group={group}`",
            )
            await asyncio.sleep(POLL_S)
        await self._merge_patch(path, {"spec": {"replicas": want}})

    async def _merge_patch(self, path: str, patch: dict[str, Any], *, missing_ok: bool = False) -> None:
        """A JSON merge patch of the object at ``path``; BackendError naming the path and the answer (a 404 is none
        with ``missing_ok``)."""
        try:
            response = await self._http.patch(
                path,
                json=patch,
                headers={"Content-Type": "application/merge-patch+json"},
                params={"fieldManager": FIELD_MANAGER},
            )
        except httpx.HTTPError as exc:
            raise _unanswered("PATCH", path, exc) from None
        if response.status_code != 200 and not (missing_ok and response.status_code == 404):
            raise self._refused("PATCH", path, response)

    def _members(self, group: int) -> list[str]:
        return [r.id for r in self.replicas.values() if r.group == group]

    async def _replace_outdated(self, group: int, obj: K8sObject, pods: Mapping[str, K8sObject]) -> None:
        """OnDelete StatefulSet: delete every pod of the group (``pods``, its listing) that is not at
        ``status.updateRevision`` and not already terminating, all at once; the controller recreates them in parallel
        at that revision. Nothing before the controller has observed the patched template (a pod deleted earlier
        would come back at the old revision)."""
        status = obj.get("status") or {}
        revision = status.get("updateRevision")
        if obj["kind"] != "StatefulSet" or not revision:
            return
        if int(status.get("observedGeneration", 0)) < int(obj["metadata"].get("generation", 0)):
            return
        stale = [
            pod["metadata"]["name"]
            for pod in self._leaders(self._members(group), {group: pods}).values()
            if pod is not None and pod["metadata"].get("labels", {}).get(REVISION_LABEL) != revision
        ]
        await asyncio.gather(*(self._delete_pod(name) for name in stale))

    async def _delete_pod(self, name: str) -> None:
        path = f"/api/v1/namespaces/{self.spec.kubernetes.namespace}/pods/{name}"
        try:
            response = await self._http.delete(path)
        except httpx.HTTPError as exc:
            raise _unanswered("DELETE", path, exc) from None
        if response.status_code not in (200, 202, 404):  # 404: gone already
            raise self._refused("DELETE", path, response)

    async def _wait(self, group: int, deadline: float, timeout_s: float) -> None:
        since = self._stuck_since.setdefault(group, {})
        while True:
            obj = await self._get(group)
            done, left = rollout_status(obj)
            pods = await self._pods(group)  # after the status: once it says done, every new pod exists and is held
            await self._hold(group, pods)
            if done:
                return
            await self._replace_outdated(group, obj, pods)
            self._unless_stuck_or_late(
                group,
                list(pods.values()),
                since,
                deadline,
                f"rollout of {group_name(group)} not complete after {timeout_s:g} s: {left}; see "
                f"`kubectl -n {self.spec.kubernetes.namespace} describe pods -l exaserve.io/group={group}`",
            )
            await asyncio.sleep(POLL_S)

    def _unless_stuck_or_late(
        self, group: int, pods: list[K8sObject], since: dict[str, float], deadline: float, late: str
    ) -> None:
        """One poll of a wait: :class:`PodsStuck` when any of the group's ``pods`` waits on an operator
        (:func:`stuck_pods`), BackendError saying ``late`` once ``deadline`` passed, else nothing."""
        stuck = stuck_pods(pods, since, time.monotonic(), self.stuck_margin_s)
        if stuck:
            raise PodsStuck(stuck_message(group_name(group), self.spec.kubernetes.namespace, stuck))
        if time.monotonic() >= deadline:
            raise BackendError(late)

    async def _hold(self, group: int, pods: Mapping[str, K8sObject]) -> None:
        """Keep the group's serving pods (``pods``, its listing) out of the routers' selection (the new ones carry the
        template's ``true``). A pod its workload deleted after the listing (a controller replacing it) is skipped: its
        replacement is held on the next poll."""
        for pod in self._leaders(self._members(group), {group: pods}).values():
            if pod is not None and pod["metadata"].get("labels", {}).get(LABEL_ADMITTED) != "false":
                await self.admit(pod, admitted=False, missing_ok=True)

    async def announce(self, out: bool) -> None:
        """``out``: hold the batch Lease (take it, then renew it in the background) while a batch is out of the
        routers; otherwise give it up (module docstring). Taking it raises BackendError when another identity holds
        it or the API server refuses. Giving it up is best effort: a Lease not resigned lapses unrenewed within the
        alert's window, and the batch it announced is back already."""
        if out and (self._renewing is None or self._renewing.done()):  # not held, or its renewals ended
            try:
                term = await self._lease.campaign()
                holder = None if term is not None else await self._lease.leader()
            except ElectionError as exc:
                raise BackendError(f"announcing the batch on Lease {self._lease.name}: {exc}") from exc
            if term is None:
                raise BackendError(
                    f"Lease {self._lease.name} is held by {holder!r}, not this stack's updater "
                    f"({self._lease.identity}); once its holder stops renewing it for {ANNOUNCE_TTL_S:g} s, run the "
                    "rollout again"
                )
            self._term = term
            self._renewing = asyncio.create_task(self._renew(term))
        elif not out and self._term is not None:
            self._stop_renewing()
            term, self._term = self._term, None
            try:
                await self._lease.resign(term)
            except ElectionError as exc:
                log.warning("Lease %s not resigned (%s): it lapses unrenewed", self._lease.name, exc)

    async def _renew(self, term: Term) -> None:
        """Renew every third of the Lease's duration; a renewal that fails is logged and tried at the next (the
        alert's window is twice the duration); a Lease lost to another holder, or an error no renewal can mend, ends
        the renewals, and the next :meth:`announce` takes the Lease again."""
        while True:
            await asyncio.sleep(ANNOUNCE_TTL_S / 3)
            try:
                renewed = await self._lease.renew(term)
            except ElectionError as exc:
                log.warning(
                    "Lease %s: renewal failed (%s); asked again in %g s", self._lease.name, exc, ANNOUNCE_TTL_S / 3
                )
                continue
            except Exception as exc:  # a background task: said, not lost; the next announce takes the Lease again
                log.warning("Lease %s: renewals stopped: %r", self._lease.name, exc)
                return
            if renewed is None:
                log.warning("Lease %s is no longer this updater's: the batch is no longer announced", self._lease.name)
                return
            term = renewed

    def _stop_renewing(self) -> None:
        if self._renewing is not None:
            self._renewing.cancel()
            self._renewing = None

    async def aclose(self) -> None:
        """Close the connections. A batch still out keeps its Lease unrenewed: it lapses, and the alert pages."""
        self._stop_renewing()
        await self._lease.aclose()
        await self._http.aclose()


class DiscoveryMembership:
    """Kubernetes membership: the routers' service discovery decides, the updater changes what it selects (module
    docstring); every change proved on every router instance (the gateway's headless Service)."""

    def __init__(self, backend: KubernetesBackend, routers: RouterSet) -> None:
        self.backend = backend
        self.routers = routers
        self.out: set[str] = set()  # replicas taken out and not brought back: announced while any are

    async def _pods(self, replica_ids: Sequence[str]) -> dict[str, K8sObject]:
        pods = await self.backend.leader_pods(replica_ids)
        gone = sorted(r for r, p in pods.items() if p is None or not (p.get("status") or {}).get("podIP"))
        if gone:
            raise BackendError(
                f"no running pod for {gone}: their pods are missing, being deleted or not scheduled; see "
                f"`kubectl -n {self.backend.spec.kubernetes.namespace} get pods -o wide`"
            )
        return {r: p for r, p in pods.items() if p is not None}

    async def take_out(self, replica_ids: Sequence[str], timeout_s: float) -> Observed:
        """Out of the selection; done when no instance routes to them (discovery drains them: module docstring)."""
        pods = await self._pods(replica_ids)
        await self.backend.announce(True)  # before any worker leaves: the alert counts the batch as planned
        self.out.update(pods)
        await asyncio.gather(*(self.backend.admit(p, admitted=False) for p in pods.values()))
        return await self.routers.drained(*map(self.backend.worker_url, pods), timeout_s=timeout_s)

    async def bring_back(self, replica_ids: Sequence[str], timeout_s: float) -> Observed:
        """Back in the selection; done when every instance lists each pod ready and healthy (discovery registers a
        selected pod once it is Ready and Running). A pod still draining from its removal (the same pod brought back
        within ``drain_settle_secs``, e.g. a rollback) is waited out first: discovery skips a URL whose removal job
        still runs and takes it back only at its next pass, up to 60 s later (:meth:`RouterSet.drains_ended`)."""
        pods = await self._pods(replica_ids)
        urls = [self.backend.worker_url(r) for r in pods]
        deadline = time.monotonic() + timeout_s
        await self.routers.drains_ended(*urls, timeout_s=timeout_s)
        await asyncio.gather(*(self.backend.admit(p, admitted=True) for p in pods.values()))
        seen = await self.routers.discovered(*urls, timeout_s=max(0.0, deadline - time.monotonic()))
        self.out.difference_update(pods)
        if not self.out:
            await self.backend.announce(False)
        return seen

    async def reconcile(self, replica_ids: Sequence[str], out: Set[str]) -> list[str]:
        """Each pod's label as the state wants it (a pod re-created by its workload comes back ``true``); a pod
        deselected here is proved drained on every instance (discovery drains it), one selected again is left to the
        readmission's proof."""
        notes: list[str] = []
        deselected: list[str] = []
        # what the state holds out is announced (a resumed rollout's batch, taken out by the run that stopped)
        self.out = (self.out - set(replica_ids)) | (set(replica_ids) & set(out))
        await self.backend.announce(bool(self.out))
        for rid, pod in (await self.backend.leader_pods(replica_ids)).items():
            if pod is None:
                continue
            want = "false" if rid in out else "true"
            have = pod["metadata"].get("labels", {}).get(LABEL_ADMITTED)
            if have != want:
                notes.append(f"pod {pod['metadata']['name']} of {rid} had {LABEL_ADMITTED}={have}: setting {want}")
                await self.backend.admit(pod, admitted=want == "true")
                if want == "false":
                    deselected.append(self.backend.worker_url(rid))
        if deselected:
            seen = await self.routers.drained(*deselected, timeout_s=self.routers.timeout_s)
            notes.append(f"discovery drained {sorted(deselected)}: {seen.summary()}")
        return notes
