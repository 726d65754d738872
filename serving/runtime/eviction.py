"""Kubernetes: a migrated replica is restarted by evicting its pod (``policy/v1`` Eviction), not deleting it.

An eviction is a delete the API server allows only within the pod's PodDisruptionBudget
(kubernetes ``pkg/registry/core/pod/storage/eviction.go``, ``EvictionREST.Create``):

* a Ready pod needs ``status.disruptionsAllowed > 0`` on its budget, else ``429 TooManyRequests`` ("Cannot evict pod
  as it would violate the pod's disruption budget.", ``checkAndDecrement``);
* a pod that is not Ready is evicted at once when the budget says ``unhealthyPodEvictionPolicy: AlwaysAllow`` (the
  fleet's budgets do: :func:`serving.render.k8s.fleet.render`), since it serves nobody; under the default
  ``IfHealthyBudget`` it is evicted only while the budget has all its healthy pods, so a hung replica in a group
  already short of pods would pin itself;
* a pending, finished or terminating pod skips the budget (``canIgnorePDB``).

The pod's StatefulSet (or LeaderWorkerSet, which recreates the whole group: ``RecreateGroupOnPodRestart``) creates
it again under the same name; the restart is done when a pod of that name with another UID exists. Readiness is
not awaited here: the controller's warm-up judges the new process. The eviction carries the observed UID as a
precondition, so a pod already replaced is never evicted by mistake (409 Conflict: the restart already happened).

An API server that does not answer before the eviction is sent (the pod's read, or the eviction's connection never
opened) restarted nothing: :class:`~serving.rollout.backends.RestartUnreached`, which the controller counts as a failed
action, not a failed restart. One that stops answering once the eviction may have been received is a failed restart.

The controller's service account needs ``get`` on pods and ``create`` on ``pods/eviction`` in the fleet's namespace,
nothing more (:func:`serving.render.k8s.runtime.render`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from serving.kubeapi import KubeApi
from serving.rollout.backends import BackendError, RestartUnreached
from serving.rollout.backends.kubernetes import POLL_S


class RestartRefused(BackendError):
    """The restart was not performed: the pod's disruption budget allows no disruption now. Not a failed restart of
    the replica (the controller backs off and asks again; it does not count towards quarantine)."""


class PodEvictionRestarter:
    """Restart a replica (its id is its pod's name: the controller discovers replicas as pods) through the Eviction
    API, then wait for its controller to recreate the pod."""

    def __init__(self, api: KubeApi, namespace: str, *, poll_s: float = POLL_S) -> None:
        self.namespace = namespace
        self.poll_s = poll_s
        self._http = api.client()

    def _path(self, pod: str) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods/{pod}"

    async def _uid(self, pod: str, *, asked: bool = True) -> str | None:
        """The UID of the pod named ``pod``, or None while none exists. ``asked`` False: no eviction was sent yet."""
        response = await self._call("GET", self._path(pod), asked=asked)
        if response.status_code == 404:
            return None
        _ok(response, f"reading pod {self.namespace}/{pod}")
        return str(response.json()["metadata"]["uid"])

    async def _call(
        self, method: str, path: str, body: dict[str, Any] | None = None, *, asked: bool = True
    ) -> httpx.Response:
        """One request; an API server that does not answer raises :class:`BackendError`, or
        :class:`~serving.rollout.backends.RestartUnreached` where that proves the restart was never asked for:
        ``asked`` False (nothing sent yet but reads) and the request is a read or its connection never opened
        (``httpx.ConnectError``/``ConnectTimeout`` come before any byte of the request is written)."""
        try:
            return await self._http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            message = f"the API server did not answer {method} {path}: {exc!r}"
            if not asked and (method == "GET" or isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)):
                raise RestartUnreached(f"{message}; no eviction was sent, nothing was restarted") from exc
            raise BackendError(message) from exc

    async def restart(self, replica_id: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        old = await self._uid(replica_id, asked=False)
        if old is not None:
            eviction = {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": replica_id, "namespace": self.namespace},
                "deleteOptions": {"preconditions": {"uid": old}},
            }
            response = await self._call("POST", self._path(replica_id) + "/eviction", eviction, asked=False)
            # The budget is judged before the UID precondition (eviction.go): a pod replaced since it was read can
            # still be answered 429. Only a refusal of the pod that was read is one.
            if response.status_code == 429 and await self._uid(replica_id) == old:
                raise RestartRefused(_refusal(f"{self.namespace}/{replica_id}", response))
            if response.status_code not in (200, 201, 404, 409, 429):  # 404: gone; 409, 429: already replaced
                _ok(response, f"evicting pod {self.namespace}/{replica_id}")
        while (uid := await self._uid(replica_id)) in (None, old):
            if time.monotonic() >= deadline:
                state = "not recreated" if uid is None else "still the old one (terminating)"
                what = "was evicted but" if old is not None else "was gone before the restart and"
                raise BackendError(
                    f"pod {self.namespace}/{replica_id} {what} after {timeout_s:g} s is {state}: check its "
                    "StatefulSet or LeaderWorkerSet (kubectl describe) and the namespace's events"
                )
            await asyncio.sleep(self.poll_s)

    async def aclose(self) -> None:
        await self._http.aclose()


def _refusal(pod: str, response: httpx.Response) -> str:
    """Why the eviction of ``pod`` was refused (429), and what to do: the disruption budget (a ``DisruptionBudget``
    cause), or the API server asking to retry (priority and fairness, a budget status not yet processed)."""
    text = _status_message(response)
    if "disruption budget" in text.lower():
        return (
            f"evicting pod {pod} was refused: {text}; the controller asks again after its back-off. If it persists, "
            "find the group's pods that are not Ready (kubectl get pods, kubectl get pdb): a rollout, a node drain "
            "or pods still loading hold the budget"
        )
    return f"evicting pod {pod}: the API server asked to retry later ({text}); the controller asks again after its back-off"


def _status_message(response: httpx.Response) -> str:
    """A Status answer's message and causes (the budget's name and its healthy count), or its body."""
    try:
        status = response.json()
    except ValueError:
        return f"HTTP {response.status_code}: {response.text[:300]}"
    causes = "; ".join(str(c.get("message", "")) for c in (status.get("details") or {}).get("causes", []))
    return f"HTTP {response.status_code} {status.get('message', '')}" + (f" ({causes})" if causes else "")


def _ok(response: httpx.Response, what: str) -> None:
    if response.status_code >= 300:
        raise BackendError(f"{what}: {_status_message(response)}")
