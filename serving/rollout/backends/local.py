"""``--backend local``: the replicas are local processes, which the sandbox runs.

Production code never imports the sandbox, so the updater does not know how to start its processes or where its
routers listen until the sandbox says so: it registers a :class:`LocalPlatform` here (:func:`register`), and the
commands that can run a sandbox stack call that registration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from serving.plan.model import Fleet
from serving.rollout.backends import Backend, BackendError
from serving.rollout.session import Endpoints
from serving.spec.schema import FleetSpec


@dataclass(frozen=True)
class LocalPlatform:
    """What the updater needs from the platform of local processes: ``open`` a backend over a fleet (with the
    stack's sandbox directory), every router a stack can run (``routers``: API URL, Prometheus URL) and the ones
    it runs by default (``endpoints``)."""

    open: Callable[[Fleet, Path], Backend]
    routers: Callable[[FleetSpec], tuple[tuple[str, str], ...]]
    endpoints: Callable[[FleetSpec], Endpoints]


_REGISTERED: dict[str, LocalPlatform] = {}


def register(platform: LocalPlatform) -> None:
    """Make ``platform`` the one ``--backend local`` runs on."""
    _REGISTERED["local"] = platform


def registered() -> LocalPlatform:
    """The registered platform; :class:`BackendError` when none is."""
    try:
        return _REGISTERED["local"]
    except KeyError:
        raise BackendError("no platform of local processes is registered: only the sandbox runs one") from None
