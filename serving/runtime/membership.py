"""Router membership on EVERY router instance, each change observed on each instance before it counts.

The router's ``/workers`` API is asynchronous (202, then a job): a removal is done only when
``GET /workers`` on that instance no longer lists the URL, an addition only when it lists it healthy.
The instances are given by URL, or (Kubernetes) as a headless Service resolved before each operation.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from serving.router.client import RouterClient


@dataclass(frozen=True)
class Observed:
    """One membership change as each router instance showed it: seconds from the request to the proof."""

    change: str
    url: str
    seconds_by_router: dict[str, float]


class RouterSet:
    """Every router instance of the fleet, by API URL (the membership API needs no metrics listener)."""

    def __init__(self, routers: Sequence[str], *, service: str | None = None, timeout_s: float = 5.0) -> None:
        if not routers and not service:
            raise ValueError("no router instance given; pass each router's URL or the routers' headless Service")
        self.routers = [r.rstrip("/") for r in routers]
        self.service = service
        self.timeout_s = timeout_s

    async def urls(self) -> list[str]:
        if self.service is None:
            return list(self.routers)
        host, _, port = self.service.rpartition(":")
        infos = await asyncio.get_running_loop().getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        found = sorted({str(i[4][0]) for i in infos})
        return [*self.routers, *(f"http://[{a}]:{port}" if ":" in a else f"http://{a}:{port}" for a in found)]

    @contextlib.asynccontextmanager
    async def _clients(self) -> AsyncIterator[list[RouterClient]]:
        clients = [RouterClient(url, "", timeout_s=self.timeout_s) for url in await self.urls()]
        try:
            yield clients
        finally:
            await asyncio.gather(*(c.aclose() for c in clients))

    async def registered(self) -> set[str]:
        """Worker URLs registered on every instance."""
        async with self._clients() as clients:
            lists = await asyncio.gather(*(c.list_workers() for c in clients))
        sets = [{w.url for w in workers} for workers in lists]
        return set.intersection(*sets) if sets else set()

    async def remove(self, url: str, *, timeout_s: float) -> Observed:
        async def one(client: RouterClient) -> float:
            started = time.monotonic()
            worker = await client.find_worker(url)
            if worker is not None:
                await client.remove_worker(worker.id)
            await client.wait_for_removal(url, timeout_s=timeout_s)
            return time.monotonic() - started

        async with self._clients() as clients:
            seconds = await asyncio.gather(*(one(c) for c in clients))
            return Observed("removed", url, {c.base_url: s for c, s in zip(clients, seconds, strict=True)})

    async def add(self, url: str, *, timeout_s: float) -> Observed:
        async def one(client: RouterClient) -> float:
            started = time.monotonic()
            if await client.find_worker(url) is None:
                await client.add_worker(url)
            await client.wait_for_worker(url, healthy=True, timeout_s=timeout_s)
            return time.monotonic() - started

        async with self._clients() as clients:
            seconds = await asyncio.gather(*(one(c) for c in clients))
            return Observed("added", url, {c.base_url: s for c, s in zip(clients, seconds, strict=True)})
