"""Leader election for the controllers on an existing coordination service.

* :class:`EtcdElection` — bare metal: etcd's v3 lease API through its JSON gateway (plain HTTP, keys and
  values base64). The leader key is written in a transaction that succeeds only while the key does not
  exist (``create_revision == 0``), attached to a lease of ``runtime.lease_ttl_s``: when the leader dies
  its lease expires and the key goes with it. The fencing token is the key's ``create_revision``.
* :class:`KubernetesLeaseElection` — in a cluster: a ``coordination.k8s.io/v1`` Lease, taken over once this
  instance has seen the same record for ``leaseDurationSeconds`` on its own monotonic clock (client-go's rule),
  every write guarded by ``resourceVersion``. The fencing token is ``leaseTransitions``.

The service keeps the lease in whole seconds, rounded up (rounded to nearest, a 2.5 s lease was 2 s there and a
leader acted past it). A :class:`Term` is valid until its local deadline (the time the last renewal was *sent* plus
the lease time), so a leader cut off from the coordination service stops acting before any follower can win the next
term; :meth:`Election.verify` checks the token against the service before each batch of actions (a deposed leader
stops at once, even when its clock lies). Only an answer ends a term early: a renewal or a check the service did not
answer raises :class:`ElectionError` and the term stands to its deadline.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx

from serving.fleet_http import http_client
from serving.kubeapi import KubeApi
from serving.render.common import whole_seconds


class ElectionError(RuntimeError):
    """The coordination service answered something unexpected or could not be reached."""


@dataclass(frozen=True)
class Term:
    """This instance's leadership: the fencing token and until when it may act without renewing."""

    identity: str
    token: int
    deadline: float  # time.monotonic()
    lease_id: str = ""

    def valid(self, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) < self.deadline


class Election(Protocol):
    async def campaign(self) -> Term | None:
        """Try once to become leader; the term if won, None if another instance holds it."""
        ...

    async def renew(self, term: Term) -> Term | None:
        """Extend the term; None when the service answered that it is lost (the caller stops acting at once).
        Raises :class:`ElectionError` when the service could not be asked: the term stands until its deadline and
        the caller asks again (client-go's renew deadline), so one slow answer costs no leadership."""
        ...

    async def verify(self, term: Term) -> bool:
        """The service still names this term's token as the leader's; raises :class:`ElectionError` when it could
        not be asked (no answer is no verdict: the caller must not act, but it has not been deposed)."""
        ...

    async def leader(self) -> str | None:
        """The current leader's identity, if any."""
        ...

    async def resign(self, term: Term) -> None: ...

    async def aclose(self) -> None: ...


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _unb64(text: str) -> str:
    return base64.b64decode(text).decode()


class EtcdElection:
    """Election on etcd's v3 JSON gateway (``/v3/lease/*``, ``/v3/kv/*``)."""

    def __init__(self, endpoints: list[str], key: str, identity: str, ttl_s: float, *, timeout_s: float = 2.0) -> None:
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.key = key
        self.identity = identity
        self.ttl_s = ttl_s
        self._http = http_client(timeout=timeout_s)

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        problems = []
        for endpoint in self.endpoints:
            try:
                response = await self._http.post(endpoint + path, json=body)
            except httpx.HTTPError as exc:
                problems.append(f"{endpoint}: {exc!r}")
                continue
            if response.status_code != 200:
                raise ElectionError(f"etcd {path} answered {response.status_code}: {response.text[:300]}")
            data = response.json()
            if "error" in data:
                raise ElectionError(f"etcd {path}: {data['error']}")
            return dict(data.get("result", data))
        raise ElectionError(f"no etcd endpoint answered {path}: {'; '.join(problems)}")

    async def campaign(self) -> Term | None:
        """A read first: while a leader holds the key a follower's campaign writes nothing (a lease granted and revoked
        at every try was two raft proposals, each an fsync on etcd's disk, per follower per third of the lease)."""
        sent = time.monotonic()
        if await self.leader() is not None:
            return None
        lease = await self._post("/v3/lease/grant", {"TTL": whole_seconds(self.ttl_s)})
        lease_id = str(lease["ID"])
        key = _b64(self.key)
        txn = await self._post(
            "/v3/kv/txn",
            {
                "compare": [{"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
                "success": [{"request_put": {"key": key, "value": _b64(self.identity), "lease": lease_id}}],
                "failure": [{"request_range": {"key": key}}],
            },
        )
        if not txn.get("succeeded"):
            await self._post("/v3/lease/revoke", {"ID": lease_id})
            return None
        return Term(self.identity, int(txn["header"]["revision"]), sent + self.ttl_s, lease_id)

    async def renew(self, term: Term) -> Term | None:
        """A lease etcd no longer has answers TTL 0 (etcd's ``LeaseKeepAlive`` turns ``ErrLeaseNotFound`` into a
        response with TTL 0: server/etcdserver/api/v3rpc/lease.go)."""
        sent = time.monotonic()
        result = await self._post("/v3/lease/keepalive", {"ID": term.lease_id})
        if int(result.get("TTL", 0)) <= 0 or not await self.verify(term):
            return None
        return Term(term.identity, term.token, sent + self.ttl_s, term.lease_id)

    async def verify(self, term: Term) -> bool:
        key = _b64(self.key)
        txn = await self._post(
            "/v3/kv/txn",
            {"compare": [{"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": str(term.token)}]},
        )
        return bool(txn.get("succeeded"))

    async def leader(self) -> str | None:
        found = await self._post("/v3/kv/range", {"key": _b64(self.key)})
        kvs = found.get("kvs") or []
        return _unb64(kvs[0]["value"]) if kvs else None

    async def resign(self, term: Term) -> None:
        await self._post("/v3/lease/revoke", {"ID": term.lease_id})

    async def aclose(self) -> None:
        await self._http.aclose()


def _micro_time(t: float) -> str:
    """Kubernetes MicroTime: RFC 3339 with microseconds, UTC."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class KubernetesLeaseElection:
    """Election on one ``coordination.k8s.io/v1`` Lease (the controller's Role may touch only that one)."""

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        name: str,
        identity: str,
        ttl_s: float,
        *,
        timeout_s: float = 2.0,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """``wall_clock`` writes the Lease's times (for people reading it); expiry never reads it (see campaign)."""
        self.url = f"{api.server.rstrip('/')}/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.wall_clock = wall_clock
        self._observed: tuple[str, float] | None = None  # the Lease's spec as last read, and since when (monotonic)
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.ttl_s = ttl_s
        self._http = api.client(timeout_s)

    async def _send(self, method: str, url: str, body: dict[str, Any] | None = None) -> httpx.Response:
        """One request to the API server; no answer is an :class:`ElectionError` (the service could not be asked)."""
        try:
            return await self._http.request(method, url, json=body)
        except httpx.HTTPError as exc:
            raise ElectionError(f"{method} {url}: {exc!r}") from exc

    async def _get(self) -> dict[str, Any] | None:
        response = await self._send("GET", f"{self.url}/{self.name}")
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise ElectionError(f"GET lease {self.name} answered {response.status_code}: {response.text[:300]}")
        return dict(response.json())

    def _spec(self, transitions: int, acquired: float, now: float) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": whole_seconds(self.ttl_s),
            "acquireTime": _micro_time(acquired),
            "renewTime": _micro_time(now),
            "leaseTransitions": transitions,
        }

    async def campaign(self) -> Term | None:
        """Take the Lease if it is free or expired. Expired is timed as client-go's leader election does it
        (tools/leaderelection/leaderelection.go, tryAcquireOrRenew: observedTime is set when the record changes): from
        when THIS instance first saw the holder's current record, on its own monotonic clock, for the Lease's
        duration; never the holder's renewTime against this instance's wall clock, which a skewed clock would turn
        into a takeover from a live leader (split brain) or a lease that never expires."""
        sent, now = time.monotonic(), self.wall_clock()
        lease = await self._get()
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(0, now, now),
            }
            response = await self._send("POST", self.url, body)
            if response.status_code == 409:
                return None
            if response.status_code not in (200, 201):
                raise ElectionError(f"POST lease answered {response.status_code}: {response.text[:300]}")
            return Term(self.identity, 0, sent + self.ttl_s)
        spec = lease.get("spec", {})
        holder = spec.get("holderIdentity")
        record, seen = json.dumps(spec, sort_keys=True), time.monotonic()
        if self._observed is None or self._observed[0] != record:
            self._observed = (record, seen)
        expired = seen - self._observed[1] > float(spec.get("leaseDurationSeconds", self.ttl_s))
        if holder not in (None, "", self.identity) and not expired:
            return None
        transitions = int(spec.get("leaseTransitions", 0)) + (holder != self.identity)
        if await self._put(lease, self._spec(transitions, now, now)):
            return Term(self.identity, transitions, sent + self.ttl_s)
        return None

    async def _put(self, lease: dict[str, Any], spec: dict[str, Any]) -> bool:
        body = {**lease, "spec": spec}
        response = await self._send("PUT", f"{self.url}/{self.name}", body)
        if response.status_code == 409:  # someone wrote since our read (resourceVersion)
            return False
        if response.status_code != 200:
            raise ElectionError(f"PUT lease {self.name} answered {response.status_code}: {response.text[:300]}")
        return True

    async def renew(self, term: Term) -> Term | None:
        """A write that lost a race (409: the Lease changed since it was read) is asked again, as client-go's renew
        loop retries ``tryAcquireOrRenew`` until its renew deadline; the read then says who holds it."""
        sent, now = time.monotonic(), self.wall_clock()
        lease = await self._get()
        if lease is None or not self._holds(lease, term):
            return None
        spec = dict(lease["spec"])
        if not await self._put(lease, {**spec, "renewTime": _micro_time(now)}):
            raise ElectionError(f"PUT lease {self.name}: it changed since it was read (409); asked again")
        return Term(term.identity, term.token, sent + self.ttl_s)

    def _holds(self, lease: dict[str, Any], term: Term) -> bool:
        spec = lease.get("spec", {})
        return spec.get("holderIdentity") == term.identity and int(spec.get("leaseTransitions", 0)) == term.token

    async def verify(self, term: Term) -> bool:
        lease = await self._get()
        return lease is not None and self._holds(lease, term)

    async def leader(self) -> str | None:
        lease = await self._get()
        return None if lease is None else lease.get("spec", {}).get("holderIdentity") or None

    async def resign(self, term: Term) -> None:
        lease = await self._get()
        if lease is not None and self._holds(lease, term):
            await self._put(lease, {**lease["spec"], "holderIdentity": "", "renewTime": _micro_time(0)})

    async def aclose(self) -> None:
        await self._http.aclose()
