"""The runtime layer live on loopback (tests/test_runtime_sandbox.py's module docstring says what runs: the REAL
router ×3, simulated workers 2 × 4, an agent per node, 3 controllers, a REAL etcd) and the scenarios both tiers run
on it: the CI tests judge what the controllers and routers did and in what order, the rehearsal
(tests/rehearsal/test_runtime_timing.py) how soon. Every wait is on an event, bounded by the patience
(tests/support/patience.py)."""

from __future__ import annotations

import base64
import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from serving.sandbox.processes import ProcessRecord, free_port_block
from serving.sandbox.runtime import controller_urls, etcd_url, router_urls
from serving.spec.stack import file_stack_name
from tests.support.etcd import require_etcd
from tests.support.patience import PATIENCE_S, wait_until
from tests.support.sandbox import Sandbox, running_sandbox
from tests.support.stacks import request_timeout_of

INTERVAL_S = 1.0  # the heartbeat


def changes(base: int) -> dict[str, Any]:
    """The runtime sandbox's stack changes on the ports from ``base`` (40 of them): heartbeat 1 s, health timeout
    0.5 s, 3 controllers, lease 3 s, eviction cap 25 %."""
    return {
        "sandbox.worker_base_port": base,
        "sandbox.router_port": base + 8,
        "sandbox.prometheus_port": base + 9,
        "sandbox.runtime": True,
        "sandbox.runtime_base_port": base + 10,
        "cluster.pools.0.count": 2,
        "serving.replicas_per_node": 4,
        "serving.heartbeat_interval_s": INTERVAL_S,
        **request_timeout_of(3),  # its detection window (3 × 1 s), as before the timeout fit a generation
        "serving.health_check_timeout_s": 0.5,
        "scheduler.instances": 3,
        "runtime.lease_ttl_s": 3,
        "runtime.max_eviction_share": 0.25,
    }


@contextmanager
def runtime_sandbox(directory: Path) -> Iterator[Sandbox]:
    require_etcd()
    with running_sandbox(directory, replicas=8, changes=changes(free_port_block(40))) as sb:
        yield sb


def statuses(sb: Sandbox) -> list[dict[str, Any] | None]:
    out: list[dict[str, Any] | None] = []
    for url in controller_urls(sb.spec):
        try:
            out.append(httpx.get(url + "/v1/status", timeout=2).json())
        except httpx.HTTPError:
            out.append(None)
    return out


def leader_status(sb: Sandbox, patience_s: float = PATIENCE_S) -> dict[str, Any]:
    """The leading controller's status, once one leads."""
    found = wait_until(
        lambda: [s for s in statuses(sb) if s and s["is_leader"]],
        what="a controller leading",
        patience_s=patience_s,
        every_s=0.2,
        seen=lambda: statuses(sb),
    )
    return found[0]


def replica(status: dict[str, Any], rid: str) -> dict[str, Any]:
    return next(r for r in status["replicas"] if r["id"] == rid)


def on_routers(sb: Sandbox, url: str, routers: slice = slice(None)) -> list[bool | None]:
    """Per router instance (those ``routers`` picks, in order): None when the URL is not registered, else its
    health."""
    out = []
    for router in router_urls(sb.spec)[routers]:
        workers = httpx.get(router + "/workers", timeout=2).json()["workers"]
        out.append(next((w["is_healthy"] for w in workers if w["url"] == url), None))
    return out


def worker_record(sb: Sandbox, rid: str) -> ProcessRecord:
    url = replica(leader_status(sb), rid)["url"]
    rec = sb.processes.read(f"worker-{url.rsplit(':', 1)[1]}")
    assert rec is not None
    return rec


def healthy_fleet(sb: Sandbox) -> None:
    """Every replica serving and registered healthy on every router (the previous test left it so)."""

    def whole() -> bool:
        status = leader_status(sb)
        return all(r["in_rotation"] and r["state"] == "serving" for r in status["replicas"]) and all(
            all(on_routers(sb, url)) for url in sb.worker_urls
        )

    wait_until(whole, what="the fleet to settle", every_s=0.5, seen=lambda: leader_status(sb)["replicas"])


@dataclass(frozen=True)
class Deposed:
    first: dict[str, Any]  # the leader's status before its key was deleted
    new: dict[str, Any]  # the next leader's, once the old one stopped claiming
    stepped_down_s: float  # from the deletion until the old leader stopped claiming and another led
    deleted_at: float  # wall clock, as the controllers' action records are
    leaders_after: int  # instances claiming the lead then
    former: dict[str, Any]  # the old leader's status then


def depose_the_leader(sb: Sandbox) -> Deposed:
    """Delete the leader key from etcd; wait until the old leader no longer claims the lead and another instance,
    with another term, does."""
    first = leader_status(sb)
    key = base64.b64encode(f"/exaserve/{file_stack_name(sb.stack_file)}/{sb.spec.runtime.lease_name}".encode()).decode()
    deleted_at = time.time()
    assert (
        httpx.post(etcd_url(sb.spec) + "/v3/kv/deleterange", json={"key": key}, timeout=5).json().get("deleted") == "1"
    )
    t0 = time.monotonic()

    def handed_over() -> list[dict[str, Any]]:
        claims = [s for s in statuses(sb) if s and s["is_leader"]]
        new = [s for s in claims if s["term"] != first["term"]]
        old = [s for s in claims if s["identity"] == first["identity"] and s["term"] == first["term"]]
        return new if new and not old else []

    def claims() -> list[tuple[str, int]]:
        return [(s["identity"], s["term"]) for s in statuses(sb) if s and s["is_leader"]]

    new = wait_until(handed_over, what="the deposed leader to stop claiming, another to lead", seen=claims)
    stepped_down = time.monotonic() - t0
    now = statuses(sb)
    former = next(s for s in now if s and s["identity"] == first["identity"])
    return Deposed(first, new[0], stepped_down, deleted_at, sum(1 for s in now if s and s["is_leader"]), former)


@dataclass(frozen=True)
class RouterViews:
    seen_s: float  # from the kill until every router stopped routing to the replica
    replica: dict[str, Any]  # `status --json`'s replica then
    doc: dict[str, Any]  # `status --json` then
    returncode: int  # its exit code


def kill_and_read_the_router_views(sb: Sandbox, rid: str) -> RouterViews:
    """SIGKILL the replica's worker; read `status --json` until every router says it is unhealthy or absent."""
    os.kill(worker_record(sb, rid).pid, signal.SIGKILL)
    t0 = time.monotonic()
    last: dict[str, Any] = {}

    def out_everywhere() -> bool:
        cli = sb.cli("status", "--json")
        doc = json.loads(cli.stdout)
        rep = next(r for r in doc["replicas"] if r["id"] == rid)
        last.update(doc=doc, replica=rep, returncode=cli.returncode)
        return set(rep["routers"].values()) <= {"unhealthy", "absent"}

    wait_until(
        out_everywhere, what=f"every router to stop routing to {rid}", every_s=0.3, seen=lambda: last.get("replica")
    )
    return RouterViews(time.monotonic() - t0, last["replica"], last["doc"], last["returncode"])
