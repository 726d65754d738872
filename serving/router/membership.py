"""Router membership on EVERY router instance, each change observed on each instance before it counts.

The router's ``/workers`` API is asynchronous (202, then a job): a removal is done only when ``GET /workers`` on that
instance no longer lists the URL, an addition only when it lists it healthy. The instances are given by URL, or
(Kubernetes) as a headless Service resolved before each operation: one address per router pod. Every operation
asks every instance at once; one instance that does not answer fails the operation (``httpx.HTTPError``), one that
does not show the change in time raises :class:`MembershipTimeout` naming it.

With ``answering_only`` (the fleet controller's set: one router instance down must not stall every removal) an
instance that does not answer at all (refused, reset, timed out: ``httpx.TransportError``) is left out and named in
:attr:`Observed.silent`; the operation fails only when no instance answers. The caller reconciles a silent instance
when it answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx

from serving.router.client import RouterClient, WorkerInfo

POLL_S = 0.05  # between two GET /workers on one instance while waiting for a change, at least
# ... and at least this many times as long as the last list took: a router with 2,048 workers spends ~25 ms of CPU on
# one list (sglang-router 0.3.2), so three of them polled every 50 ms while they work through a batch's 410 changes
# would spend a core answering the polls instead of making the changes (docs/scale.md).
POLL_COST_RATIO = 4.0
PerRouter = Callable[[RouterClient], Awaitable[float]]  # one instance's part of an operation → its seconds
Missing = Callable[[dict[str, WorkerInfo]], set[str]]  # what an instance's worker list still lacks (or holds)
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
    silent: Silent = field(default_factory=dict)  # instances that did not answer (``answering_only``)

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
        """Router URL → (worker URL → worker) as each instance lists its workers now, and the silent instances."""
        async with self.clients() as clients:
            lists, silent = await self._gather(clients, lambda c: c.list_workers())
        return {c.base_url: {w.url: w for w in workers} for c, workers in lists}, silent

    async def listed(self) -> dict[str, dict[str, WorkerInfo]]:
        """Router URL → (worker URL → worker) as each instance lists its workers now."""
        return (await self.membership())[0]

    async def registered(self) -> set[str]:
        """Worker URLs registered on every instance (that answered)."""
        sets = [set(workers) for workers in (await self.listed()).values()]
        return set.intersection(*sets) if sets else set()

    async def remove(self, *urls: str, timeout_s: float) -> Observed:
        """Remove ``urls`` from every instance that lists them; done when no instance lists any of them."""
        wanted = {u.rstrip("/") for u in urls}

        async def one(client: RouterClient) -> float:
            started = time.monotonic()
            for worker in await client.list_workers():
                if worker.url in wanted:
                    await client.remove_worker(worker.id)
            await _until(client, started, timeout_s, lambda listed: wanted & set(listed), "still lists")
            return time.monotonic() - started

        return await self._each("removed", wanted, one)

    async def add(self, *urls: str, timeout_s: float) -> Observed:
        """Add ``urls`` on every instance that does not list them; done when each instance lists each one healthy."""
        wanted = {u.rstrip("/") for u in urls}

        async def one(client: RouterClient) -> float:
            started = time.monotonic()
            listed = {w.url for w in await client.list_workers()}
            for url in sorted(wanted - listed):
                await client.add_worker(url)
            await _until(
                client,
                started,
                timeout_s,
                lambda listed: {u for u in wanted if u not in listed or not listed[u].is_healthy},
                "does not list healthy",
            )
            return time.monotonic() - started

        return await self._each("added", wanted, one)

    async def _each(self, change: str, urls: set[str], one: PerRouter) -> Observed:
        async with self.clients() as clients:
            seconds, silent = await self._gather(clients, one)
        return Observed(change, tuple(sorted(urls)), {c.base_url: s for c, s in seconds}, silent)

    async def _gather(
        self, clients: list[RouterClient], op: Callable[[RouterClient], Awaitable[T]]
    ) -> tuple[list[tuple[RouterClient, T]], Silent]:
        """``op`` on every instance at once. Strict: the first failure raises. ``answering_only``: an instance that
        does not answer is left out and named; any other failure raises, and so does no instance answering."""
        results = await asyncio.gather(*(op(c) for c in clients), return_exceptions=self.answering_only)
        done: list[tuple[RouterClient, T]] = []
        silent: Silent = {}
        for client, result in zip(clients, results, strict=True):
            if isinstance(result, httpx.TransportError):
                silent[client.base_url] = f"{type(result).__name__}: {result}".rstrip(": ")
            elif isinstance(result, BaseException):
                raise result
            else:
                done.append((client, result))
        if silent and not done:
            shown = ", ".join(f"{router} ({why})" for router, why in sorted(silent.items()))
            raise httpx.ConnectError(f"no router instance answered: {shown}")
        return done, silent


def _host(url: str) -> str:
    """The host part of ``url`` as a netloc writes it (an IPv6 address in brackets)."""
    host = urlsplit(url).hostname or ""
    return f"[{host}]" if ":" in host else host


async def _until(client: RouterClient, started: float, timeout_s: float, missing: Missing, what: str) -> None:
    """Poll the instance's worker list until ``missing(list)`` is empty; past ``timeout_s`` raise, naming it. Polls
    are :data:`POLL_S` apart, or :data:`POLL_COST_RATIO` times the last list's duration when that is longer."""
    while True:
        asked = time.monotonic()
        left = missing({w.url: w for w in await client.list_workers()})
        if not left:
            return
        now = time.monotonic()
        if now - started >= timeout_s:
            shown = sorted(left)
            more = f" and {len(shown) - 8} more" if len(shown) > 8 else ""
            raise MembershipTimeout(
                f"router {client.base_url} {what} {len(shown)}: {shown[:8]}{more} after {timeout_s:g} s"
            )
        await asyncio.sleep(max(POLL_S, POLL_COST_RATIO * (now - asked)))
