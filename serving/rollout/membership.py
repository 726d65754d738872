"""How a batch leaves and rejoins the routers: one membership model per platform, the same on every router instance.

The backend chooses the model (:meth:`Backend.membership <serving.rollout.backends.Backend.membership>`):

* router API (bare metal, the sandbox): the routers know the workers by their static URLs and the updater removes
  and adds them with ``/workers`` on every router instance (:class:`RouterApiMembership`);
* Kubernetes: the routers' service discovery makes the changes and the updater changes what it selects
  (:class:`serving.rollout.backends.kubernetes.DiscoveryMembership`).

Either way a change counts only once every instance shows it: :class:`~serving.router.membership.Observed` carries the
seconds each instance took, and the journal records them. An instance that does not show it in time raises
:class:`~serving.router.membership.MembershipTimeout` naming it; one that does not answer raises ``httpx.HTTPError``,
which the runner retries for its router grace period.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence, Set
from typing import Protocol

from serving.router.client import RouterApiError, RouterClient
from serving.router.membership import Observed, RouterSet, routed


class Membership(Protocol):
    """Take replicas out of every router instance and bring them back, each change proved on each instance."""

    routers: RouterSet

    async def take_out(self, replica_ids: Sequence[str], timeout_s: float) -> Observed:
        """Done when no instance routes to any of the replicas (each draining or gone: new requests stop reaching
        them)."""
        ...

    async def bring_back(self, replica_ids: Sequence[str], timeout_s: float) -> Observed:
        """Done when every instance lists each replica healthy."""
        ...

    async def reconcile(self, replica_ids: Sequence[str], out: Set[str]) -> list[str]:
        """Put every instance in line with the rollout's state: the replicas in ``out`` listed nowhere, the other
        ``replica_ids`` left in (or put back in) rotation. Returns what was corrected, for the progress display."""
        ...


class RouterApiMembership:
    """Static worker URLs, moved with ``DELETE``/``POST /workers`` on every router instance."""

    def __init__(self, routers: RouterSet, worker_url: Callable[[str], str]) -> None:
        self.routers = routers
        self.worker_url = worker_url

    async def take_out(self, replica_ids: Sequence[str], timeout_s: float) -> Observed:
        return await self.routers.remove(*map(self.worker_url, replica_ids), timeout_s=timeout_s)

    async def bring_back(self, replica_ids: Sequence[str], timeout_s: float) -> Observed:
        return await self.routers.add(*map(self.worker_url, replica_ids), timeout_s=timeout_s)

    async def reconcile(self, replica_ids: Sequence[str], out: Set[str]) -> list[str]:
        """A restarted router comes back with its command-line workers (or none): remove what must be out, add
        back what must be in, on the instance that differs; the next step's proof waits for the result."""
        url_of = {r: self.worker_url(r) for r in replica_ids}

        async def one(client: RouterClient) -> list[str]:
            notes: list[str] = []
            listed = {w.url: w for w in await client.list_workers()}
            # A draining worker is out already: a second DELETE would cut its drain short (smg removes it at once),
            # and its URL cannot be added back until the drain ends (409); the next step's proof waits for it.
            in_rotation = routed(listed)
            for rid, url in url_of.items():
                try:
                    if rid in out and url in in_rotation:
                        notes.append(f"router {client.base_url} lists {rid}, which must be out now: removing it")
                        await client.remove_worker(listed[url].id)
                    elif rid not in out and url not in listed:
                        notes.append(f"router {client.base_url} lacks {rid}: adding it back")
                        await client.add_worker(url)
                except RouterApiError as exc:
                    notes.append(f"router {client.base_url} refused the change for {rid}: {exc}")
            return notes

        async with self.routers.clients() as clients:
            found = await asyncio.gather(*(one(c) for c in clients))
        return [note for notes in found for note in notes]
