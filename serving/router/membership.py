"""Router membership on EVERY router instance, each change observed on each instance before it counts.

The gateway's (smg 1.13) ``/workers`` API is asynchronous (202, then a job), and each change is confirmed through the
changed worker's own ``GET /workers/{id}``, never by polling the full list (1.5 MB at 2,048 workers):

* an addition is done when the worker answers ``status: ready``, healthy and with no job left. A 404 proves
  nothing before then: smg keeps job statuses by worker URL, and the removal job of the same URL, whose end smg
  notices only on a backed-off poll up to 2 s later, erases the status of a registration submitted meanwhile
  (``record_job_completion`` in ``model_gateway/src/workflow/job_queue.rs``, ``wait_for_completion`` in
  ``crates/workflow/src/engine.rs``), so a registration still waiting for its worker answers 404. A registration smg
  gave up (``--worker-startup-timeout-secs``) answers 404 too; the addition then times out naming it;
* a removal (``DELETE /workers/{id}``) is done when the worker answers ``status: draining`` (routed to no more, its
  in-flight requests finishing: the updater's own drain waits for those on the worker) or 404 (already gone). smg
  keeps the draining entry for the worker's ``drain_settle_secs`` (5 s) and refuses the same URL meanwhile (409), so
  an addition first waits out a draining entry of its URL until it answers 404.

Under smg's Kubernetes discovery the routers make the changes themselves, from the pods their selector holds
(``model_gateway/src/service_discovery.rs``; docs/rollout.md, "Kubernetes membership"): :meth:`RouterSet.drained` and
:meth:`RouterSet.discovered` ask nothing and wait for the same proofs, a worker draining or gone, a worker ready and
healthy (found in one ``GET /workers`` per round: a worker discovery registers has no id before it is listed).

One ``GET /workers`` per instance and operation maps the URLs to the instance's worker ids (the API has no lookup by
URL). The instances are given by URL, or (Kubernetes) as a headless Service resolved before each operation: one
address per router pod. Every operation asks every instance at once; one instance that does not answer fails the
operation (``httpx.HTTPError``), one that does not show the change in time raises :class:`MembershipTimeout` naming
it and the URLs it holds no entry for.

With ``answering_only`` (the fleet controller's set: one router instance down must not stall every removal) an
instance that cannot do the change now is left out and named in :attr:`Observed.silent` with why; the operation fails
only when no instance answers (:class:`NoRouterAnswered`). The caller reconciles a silent instance when it answers
again. Silent is (:func:`_silent`):

* no answer at all: refused, reset, timed out (``httpx.TransportError``);
* an answer that says "not now": a 5xx, 408 or 429 (:attr:`RouterApiError.transient`; smg 1.13.0 answers 500 when
  its job queue takes no job, ``QueueSubmitFailed`` in ``model_gateway/src/worker/service.rs:250-251``, and a proxy
  or load balancer in front of it 502-504). An instance answering errors is as useless to the change as one that is
  down, and the others applied it;
* an instance that answered but did not show the change in time (:class:`MembershipTimeout`) while another instance
  did: that instance lags (its job queue, its path to the worker), not the change. When no instance showed it, the
  change itself failed (a worker that never becomes ready) and the timeout raises;
* for a listing (:meth:`RouterSet.membership`: nothing is changed, the caller only learns what each instance holds)
  any error answer: an instance whose list cannot be read holds nothing to act on, and a new leader must take office
  on the instances that answer.

A 4xx that means "already in that state" is no error at all: ``DELETE`` of an id smg no longer holds answers 404
``WORKER_NOT_FOUND`` (``delete_worker``, service.rs:681-686: the worker is out, which a removal wants), ``POST`` of a
URL registered meanwhile 409 ``WORKER_ALREADY_EXISTS`` (service.rs:485-491: the addition then proves that worker ready,
:meth:`RouterClient.add_worker` ``existing_ok``) or ``WORKER_CREATE_IN_PROGRESS`` (service.rs:507-511: the pending
registration is polled). Any other 4xx says our request is wrong (smg: 400 ``BAD_REQUEST`` for an id that is no UUID,
a URL or label it refuses, service.rs:245-249; 401/403 for a missing admin key): it raises, an instance that refuses
the request is a fault to fix, not one to wait out.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx

from serving.router.client import RouterApiError, RouterClient, WorkerInfo

POLL_S = 0.05  # between two rounds of GET /workers/{id} on one instance while waiting for a change, at least
# ... and at least this many times as long as the last round took: a batch's 410 workers are 410 small reads per round
# on each instance, which must not take the CPU the instances need to make the changes (docs/scale.md).
POLL_COST_RATIO = 4.0
# ... but a round of job statuses (not of full lists) never waits longer than this: its length is mostly the waits of
# the machine and of this client, not the router's work (smg answers a job status in ~0.4 ms: 0.16 s of its CPU for a
# round of 410). At 2,048 replicas on two cores a round took 12 s and the next came 48 s later: most of a batch's
# readmission (docs/scale.md).
POLL_MAX_S = 1.0
PerRouter = Callable[[RouterClient], Awaitable[float]]  # one instance's part of an operation → its seconds
Silent = dict[str, str]  # router instance → why it did not answer
T = TypeVar("T")


class MembershipTimeout(TimeoutError):
    """A router instance did not show a membership change in time; the message names the instance and the URLs."""


@dataclass(frozen=True)
class Observed:
    """One membership change as each router instance showed it: seconds from the request to the proof."""

    change: str
    urls: tuple[str, ...]
    seconds_by_router: dict[str, float]
    silent: Silent = field(default_factory=dict)  # instances left out, each with why (``answering_only``)

    def summary(self) -> str:
        """``removed on every router (3): http://r1 0.05 s, …`` — the evidence a journal event carries."""
        each = ", ".join(f"{router} {s:.2f} s" for router, s in sorted(self.seconds_by_router.items()))
        if not self.silent:
            return f"{self.change} on every router ({len(self.seconds_by_router)}): {each}"
        quiet = ", ".join(f"{router} ({why})" for router, why in sorted(self.silent.items()))
        return f"{self.change} on the {len(self.seconds_by_router)} routers that answered: {each}; silent: {quiet}"


class RouterSet:
    """Every router instance of the fleet, by API URL, and where each one's Prometheus listener is: ``metrics`` (one
    URL per entry of ``routers``, same order), else ``metrics_port`` on the instance's own host (the only form a
    headless Service's addresses can take). The membership API needs no metrics; the gates need every instance's."""

    def __init__(
        self,
        routers: Sequence[str],
        *,
        service: str | None = None,
        metrics: Sequence[str] = (),
        metrics_port: int | None = None,
        timeout_s: float = 5.0,
        answering_only: bool = False,
    ) -> None:
        if not routers and not service:
            raise ValueError("no router instance given; pass each router's URL or the routers' headless Service")
        if metrics and len(metrics) != len(routers):
            raise ValueError(f"{len(metrics)} metrics URLs for {len(routers)} routers: give one per router, in order")
        self.routers = [r.rstrip("/") for r in routers]
        self.service = service
        self.metrics = dict(zip(self.routers, metrics, strict=True)) if metrics else {}
        self.metrics_port = metrics_port
        self.timeout_s = timeout_s
        self.answering_only = answering_only

    def __str__(self) -> str:
        return ", ".join([*self.routers, *([f"every address of {self.service}"] if self.service else [])])

    async def urls(self) -> list[str]:
        if self.service is None:
            return list(self.routers)
        host, _, port = self.service.rpartition(":")
        infos = await asyncio.get_running_loop().getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        found = sorted({str(i[4][0]) for i in infos})
        return [*self.routers, *(f"http://[{a}]:{port}" if ":" in a else f"http://{a}:{port}" for a in found)]

    def metrics_url(self, router: str) -> str:
        """The Prometheus URL of the instance at API URL ``router``."""
        if router in self.metrics:
            return self.metrics[router]
        if self.metrics_port is None:
            raise ValueError(f"router {router}: no metrics listener known; give the routers' metrics port")
        return urlunsplit(urlsplit(router)._replace(netloc=f"{_host(router)}:{self.metrics_port}", path="/metrics"))

    @contextlib.asynccontextmanager
    async def clients(self) -> AsyncIterator[list[RouterClient]]:
        """One client per instance (the Service resolved now), closed on exit."""
        clients = [RouterClient(url, "", timeout_s=self.timeout_s) for url in await self.urls()]
        try:
            yield clients
        finally:
            await asyncio.gather(*(c.aclose() for c in clients))

    async def membership(self) -> tuple[dict[str, dict[str, WorkerInfo]], Silent]:
        """Router URL → (worker URL → worker) as each instance lists its workers now (ready and draining ones), and
        the silent instances."""
        async with self.clients() as clients:
            lists, silent = await self._gather(clients, lambda c: c.list_workers(), read=True)
        return {c.base_url: {w.url: w for w in workers} for c, workers in lists}, silent

    async def listed(self) -> dict[str, dict[str, WorkerInfo]]:
        """Router URL → (worker URL → worker) as each instance lists its workers now (ready and draining ones)."""
        return (await self.membership())[0]

    async def registered(self) -> set[str]:
        """Worker URLs in rotation on every instance (that answered): listed and not draining."""
        sets = [routed(workers) for workers in (await self.listed()).values()]
        return set.intersection(*sets) if sets else set()

    async def remove(self, *urls: str, timeout_s: float) -> Observed:
        """Take ``urls`` out of routing on every instance that lists them; done when each one's ``GET /workers/{id}``
        answers draining or 404 on every instance."""
        wanted = {u.rstrip("/") for u in urls}

        async def one(client: RouterClient) -> float:
            started = time.monotonic()
            held = [w for w in await client.list_workers() if w.url in wanted]
            while True:
                # a draining worker is out already; a second DELETE would start a second removal job that takes it
                # out of the registry at once, and the first job, still in its drain, would then remove the URL's
                # next registration when its drain ends (remove_by_url, workflow/steps/local/remove_from_worker_registry.rs)
                queued = await asyncio.gather(*(client.remove_worker(w.id) for w in held if w.status != DRAINING))
                await _until_each(client, started, timeout_s, {w.id: w.url for w in held}, _out, "still routes to")
                if all(queued):
                    return time.monotonic() - started
                # a DELETE answered 404: that id left the registry since the list, and its URL may be back under a
                # new id (smg mints one per registration); the proof by id says nothing of it, a new list does
                held = [w for w in await client.list_workers() if w.url in wanted]
                if not (still := routed({w.url: w for w in held})):
                    return time.monotonic() - started
                if time.monotonic() - started >= timeout_s:
                    raise MembershipTimeout(
                        f"router {client.base_url} still routes to {_some(still)} after "
                        f"{timeout_s:g} s: registered again under new ids while they were being removed"
                    )

        return await self._each("removed", wanted, one)

    async def drained(self, *urls: str, timeout_s: float) -> Observed:
        """Wait, asking nothing, until no instance routes to ``urls``: each answers draining or 404, or is not
        listed. What smg's discovery does with a worker whose pod left its selector or is terminating."""
        wanted = {u.rstrip("/") for u in urls}

        async def one(client: RouterClient) -> float:
            started = time.monotonic()
            ids = {w.id: w.url for w in await client.list_workers() if w.url in wanted}
            await _until_each(client, started, timeout_s, ids, _out, "still routes to")
            return time.monotonic() - started

        return await self._each("removed", wanted, one)

    async def drains_ended(self, *urls: str, timeout_s: float) -> Observed:
        """Wait until no instance holds a draining entry of ``urls`` (each answers 404 for it). smg adds no URL whose
        removal job still runs: by hand it answers 409, and discovery skips it and retries only at its next pass,
        the next pod event or its 60 s tick (``in_flight`` in ``reconcile_workers``, smg's service_discovery.rs at
        73da68c)."""
        wanted = {u.rstrip("/") for u in urls}

        async def one(client: RouterClient) -> float:
            started = time.monotonic()
            await _until_drains_end(
                client, started, timeout_s, [w for w in await client.list_workers() if w.url in wanted]
            )
            return time.monotonic() - started

        return await self._each("drains ended", wanted, one)

    async def discovered(self, *urls: str, timeout_s: float) -> Observed:
        """Wait, asking nothing, until every instance lists each of ``urls`` ready and healthy: smg's discovery
        registers a selected pod once the pod is Ready and Running."""
        wanted = {u.rstrip("/") for u in urls}

        async def one(client: RouterClient) -> float:
            started = time.monotonic()
            while True:
                asked = time.monotonic()
                listed = {w.url: w for w in await client.list_workers() if w.url in wanted and w.status != DRAINING}
                if not (missing := wanted - set(listed)):
                    break
                now = time.monotonic()
                if now - started >= timeout_s:
                    raise MembershipTimeout(
                        f"router {client.base_url} has not registered {_some(missing)} after {timeout_s:g} s: its "
                        "discovery registers a pod once the pod is selected, Ready and Running (its log says "
                        "'Registering worker URL … for pod NAME')"
                    )
                await asyncio.sleep(max(POLL_S, POLL_COST_RATIO * (now - asked)))  # a list costs smg ~0.2 s
            ids = {w.id: url for url, w in listed.items()}
            await _until_each(client, started, timeout_s, ids, _ready, "does not answer ready and healthy")
            return time.monotonic() - started

        return await self._each("added", wanted, one)

    async def add(self, *urls: str, timeout_s: float) -> Observed:
        """Add ``urls`` on every instance that does not hold them; done when each one answers ready and healthy on
        every instance. A URL still draining from an earlier removal is waited out first (smg refuses it with 409
        until it is gone)."""
        wanted = {u.rstrip("/") for u in urls}

        async def one(client: RouterClient) -> float:
            started = time.monotonic()
            held = {w.url: w for w in await client.list_workers() if w.url in wanted}
            await _until_drains_end(client, started, timeout_s, held.values())
            ids = {w.id: w.url for w in held.values() if w.status != DRAINING}
            new = sorted(wanted - set(ids.values()))
            added = await asyncio.gather(*(client.add_worker(u, existing_ok=True) for u in new))
            ids.update(zip(added, new, strict=True))
            await _until_each(client, started, timeout_s, ids, _ready, "does not answer ready and healthy")
            return time.monotonic() - started

        return await self._each("added", wanted, one)

    async def _each(self, change: str, urls: set[str], one: PerRouter) -> Observed:
        async with self.clients() as clients:
            seconds, silent = await self._gather(clients, one)
        return Observed(change, tuple(sorted(urls)), {c.base_url: s for c, s in seconds}, silent)

    async def _gather(
        self, clients: list[RouterClient], op: Callable[[RouterClient], Awaitable[T]], *, read: bool = False
    ) -> tuple[list[tuple[RouterClient, T]], Silent]:
        """``op`` on every instance at once. Strict: the first failure raises. ``answering_only``: an instance that is
        silent (:func:`_silent`; ``read``: ``op`` changes nothing, any error answer) is left out and named with why;
        any other failure raises, and so does no instance answering."""
        results = await asyncio.gather(*(op(c) for c in clients), return_exceptions=self.answering_only)
        done: list[tuple[RouterClient, T]] = []
        silent: Silent = {}
        late: dict[str, MembershipTimeout] = {}
        for client, result in zip(clients, results, strict=True):
            if isinstance(result, MembershipTimeout):
                late[client.base_url] = result
            elif isinstance(result, Exception) and _silent(result, read=read):
                silent[client.base_url] = _why(result)
            elif isinstance(result, BaseException):
                raise result
            else:
                done.append((client, result))
        if late and not done:  # no instance showed the change: the change failed, not one instance
            raise next(iter(late.values()))
        silent.update({router: _why(exc) for router, exc in late.items()})
        if silent and not done:
            raise NoRouterAnswered(silent)
        return done, silent


def _silent(exc: Exception, *, read: bool) -> bool:
    """Whether an instance that failed ``exc`` counts as silent (module docstring): no answer, or an answer that says
    "not now"; for a read, any error answer."""
    if isinstance(exc, httpx.TransportError):
        return True
    if isinstance(exc, RouterApiError):
        return read or exc.transient
    return read and isinstance(exc, httpx.HTTPError)


def _why(exc: Exception) -> str:
    """A silent instance's reason as ``status`` and the journal show it: the error's type and message (an error answer's
    status and the start of its body), at most 200 characters."""
    why = f"{type(exc).__name__}: {exc}".rstrip(": ")
    return why if len(why) <= 200 else why[:199] + "…"


def _host(url: str) -> str:
    """The host part of ``url`` as a netloc writes it (an IPv6 address in brackets)."""
    host = urlsplit(url).hostname or ""
    return f"[{host}]" if ":" in host else host


class NoRouterAnswered(httpx.ConnectError):
    """No router instance answered (``answering_only``); ``silent`` names each and why, so the caller can keep every
    one to bring in line once it answers again."""

    def __init__(self, silent: Silent) -> None:
        shown = ", ".join(f"{router} ({why})" for router, why in sorted(silent.items()))
        super().__init__(f"no router instance answered: {shown}")
        self.silent = dict(silent)


DRAINING = "draining"  # smg's status of a removed worker whose in-flight requests are finishing


def routed(workers: dict[str, WorkerInfo]) -> set[str]:
    """The URLs of one instance's list (worker URL → worker) that it routes to: every one not draining."""
    return {u for u, w in workers.items() if w.status != DRAINING}


def _gone(worker: WorkerInfo | None) -> bool:
    return worker is None


def _out(worker: WorkerInfo | None) -> bool:
    return worker is None or worker.status == DRAINING


def _ready(worker: WorkerInfo | None) -> bool:
    # ready, healthy and its registration job over (no job_status): the job's last steps put it into the policies.
    # None (404) is not done and not failed: the job may still run with its status erased (module docstring).
    return worker is not None and worker.status == "ready" and worker.is_healthy and worker.job_status is None


async def _until_each(
    client: RouterClient,
    started: float,
    timeout_s: float,
    ids: dict[str, str],
    done: Callable[[WorkerInfo | None], bool],
    what: str,
) -> None:
    """Poll each worker's ``GET /workers/{id}`` (id → URL in ``ids``) until ``done`` holds for every one; past
    ``timeout_s`` raise, naming the instance, the URLs left and those it answered 404 for. Rounds are :data:`POLL_S`
    apart, or :data:`POLL_COST_RATIO` times the last round's duration when that is longer, up to :data:`POLL_MAX_S`."""
    left = dict(ids)
    while left:
        asked = time.monotonic()
        workers = dict(zip(left, await asyncio.gather(*(client.get_worker(i) for i in left)), strict=True))
        left = {i: u for i, u in left.items() if not done(workers[i])}
        if not left:
            return
        now = time.monotonic()
        if now - started >= timeout_s:
            raise MembershipTimeout(
                f"router {client.base_url} {what} {_some(left.values())} after {timeout_s:g} s"
                + _unknown(sorted(u for i, u in left.items() if workers[i] is None))
            )
        await asyncio.sleep(min(POLL_MAX_S, max(POLL_S, POLL_COST_RATIO * (now - asked))))


async def _until_drains_end(
    client: RouterClient, started: float, timeout_s: float, workers: Iterable[WorkerInfo]
) -> None:
    """Poll each draining one of ``workers`` until it answers 404 (smg keeps it for its ``drain_settle_secs``)."""
    draining = {w.id: w.url for w in workers if w.status == DRAINING}
    await _until_each(client, started, timeout_s, draining, _gone, "still holds (draining)")


def _some(urls: Iterable[str]) -> str:
    """``3: [url, …]``, the first eight URLs in order and how many more."""
    shown = sorted(urls)
    more = f" and {len(shown) - 8} more" if len(shown) > 8 else ""
    return f"{len(shown)}: {shown[:8]}{more}"


def _unknown(urls: list[str]) -> str:
    if not urls:
        return ""
    return (
        f"; it holds no entry (404) for {_some(urls)}: a registration it gave up after --worker-startup-timeout-secs "
        "(its log names the failed health check) or a removal (the URL is not registered)"
    )
