"""Kubernetes: move the batch's update group to the new release on its StatefulSet / LeaderWorkerSet.

A batch is update group ``g`` — the LeaderWorkerSet ``sglang-g<g>`` that the Pulumi program creates
(:mod:`serving.render.k8s.fleet`). The update renders that workload from the stack with group ``g`` at the
new version (image from ``serving.releases``, ``EXASERVE_RELEASE``, the version label) and sends its
labels and pod template as a JSON merge patch — the same object ``pulumi up`` would apply once the
stack records the new version. Then it waits for the rollout status the way ``kubectl rollout status``
judges it, bounded by the updater's health timeout.

Replicas are addressed by their pods' stable DNS names through the headless service, so the router
must know the workers by those URLs (static ``--worker-urls``): with Kubernetes service discovery the
router readmits a pod as soon as it is Ready and the updater's warm-up hold cannot be enforced.

The API client is deliberately small: a bearer token and a CA bundle (the in-cluster service account
by default), JSON over HTTPS; plain HTTP only to a loopback address (a local proxy or test stand-in).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from serving.plan.model import Plan
from serving.render.k8s.common import LABEL_VERSION, K8sObject
from serving.render.k8s.fleet import LWS_API, group_name, render
from serving.rollout.backends import BackendError, ReplicaIndex
from serving.rollout.plan import with_group_version
from serving.spec.schema import FleetSpec

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
POLL_S = 0.5


@dataclass(frozen=True)
class KubeApi:
    """Where the API server is and how to authenticate to it."""

    server: str
    token: str | None = None
    ca_file: Path | None = None

    @classmethod
    def in_cluster(cls) -> KubeApi:
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise BackendError(
                "not running in a pod (KUBERNETES_SERVICE_HOST unset); pass the API server URL, a token file "
                "and its CA bundle explicitly (exaserve: --kube-server, --kube-token-file, --kube-ca-file)"
            )
        token = (SERVICE_ACCOUNT / "token").read_text().strip()
        return cls(f"https://{host}:{port}", token, SERVICE_ACCOUNT / "ca.crt")

    def client(self) -> httpx.AsyncClient:
        url = urlsplit(self.server)
        if url.scheme == "http" and not _loopback(url.hostname or ""):
            raise BackendError(f"{self.server}: plain HTTP is allowed only to a loopback proxy; use https://")
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        verify: bool | str = str(self.ca_file) if self.ca_file else True
        return httpx.AsyncClient(base_url=self.server, headers=headers, verify=verify, timeout=10.0)


def _loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def workload_path(spec: FleetSpec, fleet_plan: Plan, group: int) -> str:
    """Every update group is a LeaderWorkerSet (a group of one-pod replicas too: serving.render.k8s.fleet)."""
    del fleet_plan  # the workload kind no longer depends on the placement
    return f"/apis/{LWS_API}/namespaces/{spec.kubernetes.namespace}/leaderworkersets/{group_name(group)}"


def workload(spec: FleetSpec, fleet_plan: Plan, group: int) -> K8sObject:
    """Group ``group``'s StatefulSet / LeaderWorkerSet as the Pulumi program renders it."""
    name = group_name(group)
    for obj in render(spec, fleet_plan):
        if obj["kind"] in ("StatefulSet", "LeaderWorkerSet") and obj["metadata"]["name"] == name:
            return obj
    raise BackendError(f"the fleet has no workload {name}; rollout.batches={spec.rollout.batches}")


def version_patch(spec: FleetSpec, fleet_plan: Plan, group: int, version: str) -> dict[str, Any]:
    """JSON merge patch moving group ``group`` to ``version``: its labels and pod template(s)."""
    target = workload(with_group_version(spec, group, version), fleet_plan, group)
    templates = (
        {"leaderWorkerTemplate": target["spec"]["leaderWorkerTemplate"]}
        if target["kind"] == "LeaderWorkerSet"
        else {"template": target["spec"]["template"]}
    )
    return {"metadata": {"labels": target["metadata"]["labels"]}, "spec": templates}


def rollout_status(obj: K8sObject) -> tuple[bool, str]:
    """(done, what is left) for a StatefulSet or LeaderWorkerSet, as ``kubectl rollout status`` reads it."""
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
    if obj.get("kind") == "StatefulSet" and status.get("updateRevision") != status.get("currentRevision"):
        return False, f"revision {status.get('updateRevision')} not yet current"
    if obj.get("kind") == "LeaderWorkerSet":
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions", [])}
        if conditions.get("UpdateInProgress") == "True" or conditions.get("Available") != "True":
            return False, f"conditions {conditions}"
    return True, f"{ready} of {want} replicas updated and ready"


class KubernetesBackend(ReplicaIndex):
    """Patch update groups' workloads through the Kubernetes API and wait for their rollout."""

    def __init__(self, spec: FleetSpec, fleet_plan: Plan, api: KubeApi) -> None:
        self.spec = spec
        self.fleet_plan = fleet_plan
        self.api = api
        replicas = list(fleet_plan.replicas)
        super().__init__(replicas)
        # A group's replicas, in index order, are its workload's ordinals 0..size-1.
        self._ordinal = {r.id: sorted(x.index for x in replicas if x.group == r.group).index(r.index) for r in replicas}
        self._http = api.client()

    @property
    def name(self) -> str:
        return f"kubernetes ({self.api.server}, namespace {self.spec.kubernetes.namespace})"

    def worker_url(self, replica_id: str) -> str:
        """The replica's pod (the leader pod of a multi-node replica) by its stable DNS name."""
        replica = self._replica(replica_id)
        pod = f"{group_name(replica.group)}-{self._ordinal[replica_id]}"
        service = group_name(replica.group)  # LeaderWorkerSet pods' subdomain: the group's own headless Service
        return f"http://{pod}.{service}.{self.spec.kubernetes.namespace}.svc:{self.spec.serving.port}"

    def known_versions(self) -> None:
        return None  # any release of serving.releases

    async def _get(self, group: int) -> K8sObject:
        path = workload_path(self.spec, self.fleet_plan, group)
        try:
            response = await self._http.get(path)
        except httpx.HTTPError as exc:
            raise BackendError(f"GET {path}: {exc!r}; is the API server reachable?") from None
        if response.status_code != 200:
            raise BackendError(f"GET {path} answered {response.status_code}: {response.text[:300]}")
        obj: K8sObject = response.json()
        return obj

    async def versions(self, replica_ids: Sequence[str]) -> dict[str, str | None]:
        """Each replica's group version from its workload's version label — once its rollout is done;
        while pods are still being replaced the version is unknown (None)."""
        groups = sorted({self._replica(r).group for r in replica_ids})
        objects = await asyncio.gather(*(self._get(g) for g in groups))
        found: dict[int, str | None] = {}
        for g, obj in zip(groups, objects, strict=True):
            done, _ = rollout_status(obj)
            found[g] = obj["metadata"].get("labels", {}).get(LABEL_VERSION) if done else None
        return {r: found[self._replica(r).group] for r in replica_ids}

    async def update(self, replica_ids: Sequence[str], version: str, timeout_s: float) -> None:
        groups = sorted({self._replica(r).group for r in replica_ids})
        for g in groups:
            members = {r.id for r in self.replicas.values() if r.group == g}
            if not members <= set(replica_ids):
                raise BackendError(
                    f"batch does not cover update group {g}: on Kubernetes a batch is a whole workload "
                    f"({group_name(g)}); plan batches from the plan's update groups (Plan.rollout_groups)"
                )
        deadline = time.monotonic() + timeout_s
        for g in groups:
            await self._patch(g, version_patch(self.spec, self.fleet_plan, g, version))
        for g in groups:
            await self._wait(g, deadline, timeout_s)

    async def _patch(self, group: int, patch: dict[str, Any]) -> None:
        path = workload_path(self.spec, self.fleet_plan, group)
        try:
            response = await self._http.patch(
                path, json=patch, headers={"Content-Type": "application/merge-patch+json"}
            )
        except httpx.HTTPError as exc:
            raise BackendError(f"PATCH {path}: {exc!r}") from None
        if response.status_code != 200:
            raise BackendError(f"PATCH {path} answered {response.status_code}: {response.text[:500]}")

    async def _wait(self, group: int, deadline: float, timeout_s: float) -> None:
        while True:
            done, left = rollout_status(await self._get(group))
            if done:
                return
            if time.monotonic() >= deadline:
                raise BackendError(
                    f"rollout of {group_name(group)} not complete after {timeout_s:g} s: {left}; "
                    f"see `kubectl -n {self.spec.kubernetes.namespace} describe pods -l exaserve.io/group={group}`"
                )
            await asyncio.sleep(POLL_S)

    async def aclose(self) -> None:
        await self._http.aclose()
