"""Backends: how one batch's replicas get a new version. The updater's core never knows which one runs.

* :mod:`.local` — local processes (the sandbox's simulated workers), registered by the sandbox;
* :mod:`.ssh` — bare-metal nodes: the replica's systemd unit, over paramiko with host keys verified;
* :mod:`.kubernetes` — the update group's StatefulSet/LeaderWorkerSet, patched through the API server.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from serving.plan.model import Replica
from serving.rollout.membership import Membership
from serving.router.membership import RouterSet


class BackendError(RuntimeError):
    """An update could not be applied; the message says which replica, what failed and what to do."""


class RestartUnreached(BackendError):
    """The update provably never reached the replica: no command ran on any of its nodes (SSH could not connect,
    verify the host key or log in), or the API server never answered before anything was asked to change. Nothing
    was restarted: the fleet controller counts it as a failed action, backed off, never as a failed restart of the
    replica (no step towards its quarantine). An update that reached the replica and then failed stays a plain
    :class:`BackendError`."""


class PodsStuck(BackendError):
    """The update waits on something only an operator can change: a pod left Terminating on a node whose kubelet is
    gone, or a replacement the scheduler cannot place (a cordoned node, no free GPU). The message names each pod, its
    node and the fix. The runner names it and tries again until the health timeout (an operator's fix lets the update
    finish), then pauses at the step (``blocked``): a rollback would wait on the same pods, and the release is not at
    fault; ``exaserve rollout --resume`` runs the step again."""


class ReplicaIndex:
    """The stack's replicas by id, for backends: one lookup with one error message."""

    def __init__(self, replicas: Sequence[Replica]) -> None:
        self.replicas = {r.id: r for r in replicas}

    def _replica(self, replica_id: str) -> Replica:
        try:
            return self.replicas[replica_id]
        except KeyError:
            raise BackendError(f"replica {replica_id!r} is not in the stack's fleet") from None


class Backend(Protocol):
    """What the updater needs from the platform. Every method is idempotent."""

    @property
    def name(self) -> str:
        """Human name for the progress display, e.g. ``ssh (4 nodes)``."""
        ...

    def worker_url(self, replica_id: str) -> str:
        """The URL the router knows the replica by (``http://host:port``); the updater's health, metrics and
        warm-up calls go there too."""
        ...

    def membership(self, routers: RouterSet) -> Membership:
        """How a batch leaves and rejoins ``routers`` on this platform (:mod:`serving.rollout.membership`)."""
        ...

    def known_versions(self) -> frozenset[str] | None:
        """Versions this backend can run on top of ``serving.releases`` (the sandbox's simulated
        releases), or None when every release of the stack can run."""
        ...

    @property
    def updates_whole_groups(self) -> bool:
        """True when an update moves a whole update group at once (a Kubernetes workload): a batch then keeps
        every replica of its group, and a group with a replica down is held as a whole."""
        ...

    async def versions(self, replica_ids: Sequence[str]) -> dict[str, str | None]:
        """The version each replica runs now, read from the replica itself or what runs it (the worker process,
        the loaded systemd unit, the pod) — never from the updater's own records. None: the replica is down
        (not running) or cannot be reached; the updater plans from these and names the down ones."""
        ...

    def unreachable(self) -> dict[str, str]:
        """The nodes the last :meth:`versions` could not read, each with why (``node (address)`` → the SSH error);
        empty where a replica is read from itself or the API server (an error there raises)."""
        ...

    async def update(self, replica_ids: Sequence[str], version: str, timeout_s: float) -> None:
        """Make the replicas run ``version`` (restart them); return once the platform has applied it
        (health is the updater's next step). Raises :class:`BackendError`."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...
