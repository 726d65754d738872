"""The paramiko fan-out's scenarios against real sshd test hosts, shared by the CI tests (tests/test_remote_fanout.py:
what happened, in what order) and the rehearsal (tests/rehearsal/test_hosts.py: how long it took, against the
timeouts): each returns what it saw and the seconds it took, and each tier judges its part."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from unittest import mock

from serving.remote import fanout
from serving.remote.fanout import HostResult, Target, fan_out
from tests.support.hosts.faults import HostFaults
from tests.support.hosts.netns import HostFleet, HostPool
from tests.support.patience import PATIENCE_S

FAULTS = {"node03": HostFaults(unreachable=True)}
CONNECT_TIMEOUT_S, UNREACHABLE_TIMEOUT_S = 2, 5  # the unreachable host's call: the connect timeout, the per-host one
SLOW_TIMEOUT_S = 1.5  # the slow host's per-host timeout (its command runs 6 s)
PING = ["ping", "-c", "3", "-i", "0.2", "127.0.0.1"]  # ≈ 0.4 s on the node


def fleet(ssh_hosts: HostPool) -> HostFleet:
    """Three hosts: node01 and node02 answer, node03's replies are dropped (:data:`FAULTS`)."""
    return ssh_hosts(3, FAULTS)


def targets(fleet: HostFleet, names: Sequence[str] = ("node01", "node02")) -> list[Target]:
    return [Target(fleet[n].name, fleet[n].address, fleet[n].port, "root") for n in names]


@dataclass(frozen=True)
class Call:
    results: list[HostResult]
    seconds: float  # the whole call's


def _timed(fleet: HostFleet, names: Sequence[str], argv: list[str], **kwargs: Any) -> Call:
    started = time.monotonic()
    results = fan_out(targets(fleet, names), argv, known_hosts=fleet.known_hosts, identity=fleet.client_key, **kwargs)
    return Call(results, time.monotonic() - started)


def unreachable_call(fleet: HostFleet) -> Call:
    """``uptime`` on node01 and the unreachable node03 (connect timeout 2 s, per-host timeout 5 s)."""
    return _timed(
        fleet, ("node01", "node03"), ["uptime"], connect_timeout_s=CONNECT_TIMEOUT_S, timeout_s=UNREACHABLE_TIMEOUT_S
    )


def slow_call(fleet: HostFleet) -> Call:
    """A 6 s ping on node01 with a per-host timeout of 1.5 s."""
    return _timed(fleet, ("node01",), ["ping", "-c", "30", "-i", "0.2", "127.0.0.1"], timeout_s=SLOW_TIMEOUT_S)


@dataclass(frozen=True)
class Waves:
    call: Call
    events: list[tuple[str, int]]  # ("enter" | "exit", index of the run_one call), in the order they happened

    @property
    def most_in_flight(self) -> int:
        most = now = 0
        for kind, _ in self.events:
            now += 1 if kind == "enter" else -1
            most = max(most, now)
        return most


def waves(fleet: HostFleet, names: Sequence[str], max_parallel: int, *, meet: int = 0) -> Waves:
    """:data:`PING` on ``names`` at most ``max_parallel`` at a time, each host's ``run_one`` recorded as it enters
    and leaves. With ``meet`` the first ``meet`` calls wait for each other before they connect (a barrier, bounded by
    the patience): they are in flight together, which a fan-out that runs fewer at once fails (BrokenBarrierError)."""
    events: list[tuple[str, int]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(meet, timeout=PATIENCE_S) if meet else None
    real = fanout.run_one

    def recorded(*args: Any, **kwargs: Any) -> HostResult:
        with lock:
            index = sum(kind == "enter" for kind, _ in events)
            events.append(("enter", index))
        if barrier is not None and index < meet:
            barrier.wait()
        try:
            return real(*args, **kwargs)
        finally:
            with lock:
                events.append(("exit", index))

    with mock.patch.object(fanout, "run_one", recorded):
        call = _timed(fleet, names, PING, max_parallel=max_parallel)
    return Waves(call, events)
