"""Issue 38's correlated faults as sandbox drills against the real processes: the REAL router ×3, simulated workers on
6 nodes in 2 racks (3 nodes × 2 replicas each), an agent per node, 3 controllers and a REAL etcd (the runtime
sandbox's settings, tests/support/runtime_sandbox.py: heartbeat 1 s, eviction cap 25 %, here 3 of 12).

* **A rack stalled together**: every worker of rack-00's three nodes SIGSTOPped at once (a leaf switch or a PDU
  does that to a rack; so does a hypervisor pausing it). The controller calls the rack disrupted, takes its replicas
  out of rotation within the cap, restarts nothing, and once the workers run again readmits them: a partition, not
  twelve replica faults (tests/test_runtime_correlated.py's ``leaf_switch`` row at prod size).
* **One router answering 500**: a fault proxy (tests/support/fault_proxy.py) in front of router 2 answers every call
  on its worker API with smg's 500 while a worker is killed. The leader keeps its term, removes, restarts and
  readmits the replica through the two routers that answer, names router 2 unsynced, asks it each change once (not
  every tick), and makes it match once it answers (the ``router_500`` row).

* **A reboot wave**: every node loses its agent and workers at once, one node after the other, and comes back with a
  new boot id, its workers loading: the controller restarts and removes nothing, and the fleet is whole after the
  loads (the ``reboot_wave`` row). The nodes share one kernel, so the boot is simulated: the agent started after the
  "reboot" reads its boot id and boot time from a file (``exaserve agent run --simulated-boot``, hidden, SIMULATION
  ONLY), which is the only part not real.

Each asserts what happened and in what order, never how soon (issue 37): every wait is on an event, with patience.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from serving.sandbox.backend import worker_name
from serving.sandbox.processes import (
    free_port,
    free_port_block,
    start_router,
    start_service,
    start_worker,
    stop_process,
)
from serving.sandbox.runtime import router_urls
from tests.support.etcd import require_etcd
from tests.support.fault_proxy import FaultProxy, fault_proxy
from tests.support.patience import wait_until
from tests.support.runtime_sandbox import changes, healthy_fleet, leader_status, on_routers, statuses, worker_record
from tests.support.sandbox import Sandbox, running_sandbox

pytestmark = pytest.mark.sandbox  # the wait-bound phase (tests/conftest.py): a sandbox of its own

NODES, RACKS, PER_NODE = 6, 2, 2
STALLED_RACK = "rack-00"


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    require_etcd()
    base = free_port_block(40 + NODES * PER_NODE)
    racked = {
        **changes(base),
        "sandbox.worker_base_port": base + 40,  # past the runtime's block: changes() lays out 8 workers
        "cluster.pools.0.count": NODES,
        "cluster.pools.0.racks": RACKS,
        "serving.replicas_per_node": PER_NODE,
    }
    with running_sandbox(tmp_path_factory.mktemp("correlated"), replicas=NODES * PER_NODE, changes=racked) as sb:
        yield sb


def actions_since(sb: Sandbox, since: float) -> list[dict[str, Any]]:
    """Every controller instance's recent actions taken at or after ``since`` (wall clock), oldest first: a leader
    handed over mid-drill keeps its own."""
    seen = {}
    for status in statuses(sb):
        for a in (status or {}).get("actions", []):
            if a["at"] >= since:
                seen[a["term"], a["kind"], a["replica"], a["at"]] = a
    return sorted(seen.values(), key=lambda a: a["at"])


def test_a_rack_stalled_together_is_taken_out_within_the_cap_restarted_nowhere_and_readmitted(sandbox: Sandbox) -> None:
    sb = sandbox
    healthy_fleet(sb)
    first = leader_status(sb)
    racks = {n["name"]: n["rack"] for n in first["nodes"]}
    rack = [r for r in first["replicas"] if racks[r["node"]] == STALLED_RACK]
    assert len(rack) == NODES // RACKS * PER_NODE and first["eviction_cap"] == 3, (rack, first["eviction_cap"])
    stopped = [worker_record(sb, r["id"]) for r in rack]
    ids = {r["id"] for r in rack}
    since = time.time()
    for rec in stopped:
        os.kill(rec.pid, signal.SIGSTOP)
    try:

        def partitioned() -> dict[str, Any] | None:
            s = leader_status(sb)
            out = [r["id"] for r in s["replicas"] if not r["in_rotation"]]
            return s if STALLED_RACK in s["disrupted_racks"] and len(out) >= s["eviction_cap"] else None

        during = wait_until(
            partitioned,
            what=f"{STALLED_RACK} called disrupted and the cap's worth of its replicas out of rotation",
            every_s=0.5,
            seen=lambda: (leader_status(sb)["disrupted_racks"], actions_since(sb, since)),
        )
    finally:
        for rec in stopped:
            os.kill(rec.pid, signal.SIGCONT)
    out = {r["id"] for r in during["replicas"] if not r["in_rotation"]}
    assert out <= ids and len(out) == during["eviction_cap"], out  # its own replicas, never more than the cap
    assert during["disrupted_racks"] == {STALLED_RACK: {"unhealthy_nodes": NODES // RACKS, "nodes": NODES // RACKS}}
    assert all(r["restarts"] == 0 for r in during["replicas"]), during["replicas"]
    healthy_fleet(sb)  # the workers run again: every replica serving, in rotation, healthy on every router
    assert leader_status(sb)["disrupted_racks"] == {}
    acted = actions_since(sb, since)
    kinds = [(a["kind"], a["replica"]) for a in acted]
    assert not [k for k in kinds if k[0] == "migrate"], f"a partition restarted replicas: {kinds}"
    removed = [r for kind, r in kinds if kind == "remove"]
    assert set(removed) == out and len(removed) == len(out), acted  # each once, and only the cap's
    assert {r for kind, r in kinds if kind == "readmit"} == out and all(a["ok"] for a in acted), acted


LOADS_S = (10.0, 11.0, 12.0)  # each rebooted node's load: past the 9 failed probes (9 s) that would take it out


def test_a_reboot_wave_of_every_node_restarts_nothing_and_the_fleet_is_whole_after_its_loads(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """Every node, one after the other, loses its agent and workers at once (SIGKILL: the power goes), comes back
    with a new boot id and its monotonic clock from 0 (simulated: the nodes share one kernel; the agent reads the boot
    from a file, ``--simulated-boot``), its workers loading their model for 10–12 s (the port closed: a failing replica would be out of rotation at 9 s). The controller
    takes each node's replicas as booting, not failing: no restart, no removal, and the fleet is whole once the
    loads are over (the ``reboot_wave`` row at prod size; the routers' own health checks keep clients off the
    loading workers)."""
    sb = sandbox
    healthy_fleet(sb)
    first = leader_status(sb)
    nodes = sorted({r["node"] for r in first["replicas"]})
    configs = {c.url: c for c in sb.configs}
    since = time.time()
    for i, node in enumerate(nodes):
        agent = sb.processes.read(f"agent-{node}")
        workers = [sb.processes.read(worker_name(int(r["url"].rsplit(":", 1)[1]))) for r in first["replicas"]
                   if r["node"] == node]  # fmt: skip
        assert agent is not None and all(workers), (node, agent, workers)
        down = [agent, *(w for w in workers if w is not None)]
        for rec in down:
            os.kill(rec.pid, signal.SIGKILL)
        for rec in down:
            stop_process(sb.processes, rec.name)  # reaped and forgotten (it is dead: no SIGTERM reaches anything)
        boot = tmp_path / f"boot-{node}.json"
        boot.write_text(json.dumps({"boot_id": str(uuid.uuid4()), "booted_at_ns": time.monotonic_ns()}))
        for rec in workers:
            assert rec is not None
            config = replace(configs[rec.url], startup_delay_s=LOADS_S[i % len(LOADS_S)])
            start_worker(sb.processes, rec.name, config, wait="started")
        start_service(
            sb.processes, agent.name, "agent", [*agent.argv, f"--simulated-boot={boot}"], "", lambda: True, 30
        )
    booting: set[str] = set()

    def whole_again() -> bool:
        s = leader_status(sb)
        booting.update(r["id"] for r in s["replicas"] if r["booting"])
        return all(r["in_rotation"] and r["state"] == "serving" and not r["booting"] for r in s["replicas"]) and all(
            all(on_routers(sb, url)) for url in sb.worker_urls
        )

    wait_until(whole_again, what="every rebooted replica loaded and serving on every router", every_s=0.3,
               seen=lambda: (actions_since(sb, since), leader_status(sb)["replicas"]))  # fmt: skip
    assert booting == {r["id"] for r in first["replicas"]}, sorted(booting)  # each seen as booting: its new boot
    assert actions_since(sb, since) == [], actions_since(sb, since)  # nothing removed, nothing restarted
    assert leader_status(sb)["term"] == first["term"]


def silent(detail: dict[str, Any]) -> dict[str, str]:
    """The router instances an action's record names silent: its own change's, or its removal's or addition's."""
    found = dict(detail.get("silent", {}))
    for part in ("removed", "added"):
        found |= (detail.get(part) or {}).get("silent", {})
    return found


@pytest.fixture
def router_behind_a_proxy(sandbox: Sandbox) -> Iterator[FaultProxy]:
    """Router 2 moved to a free port, the fault proxy on the port the controllers know it by; put back after."""
    sb = sandbox
    record = sb.processes.read("router-2")
    assert record is not None
    url = router_urls(sb.spec)[2]
    port = int(url.rsplit(":", 1)[1])
    flags = list(record.argv[record.argv.index("smg.launch_router") + 1 :])
    moved = flags.copy()
    moved[moved.index("--port") + 1] = str(free_port())
    stop_process(sb.processes, record.name)
    with fault_proxy(port, f"http://127.0.0.1:{moved[moved.index('--port') + 1]}") as proxy:
        behind = start_router(sb.processes, moved, name="router-2", healthy_workers=len(sb.worker_urls), timeout_s=60)
        try:
            yield proxy
        finally:
            stop_process(sb.processes, behind.name)
    start_router(sb.processes, flags, name="router-2", healthy_workers=len(sb.worker_urls), timeout_s=60)


@pytest.mark.parametrize("faulted_methods", [("GET", "POST", "DELETE"), ("POST", "DELETE")], ids=["api", "changes"])
def test_one_router_answering_500_keeps_the_leader_restarts_the_dead_and_reconciles_it_after(
    sandbox: Sandbox, router_behind_a_proxy: FaultProxy, faulted_methods: tuple[str, ...]
) -> None:
    """Router 2 answers 500 to its whole worker API (the leader's listing before a change fails), or to the changes
    only (the listing passes, the DELETE and the POST fail)."""
    sb, proxy = sandbox, router_behind_a_proxy
    faulted = router_urls(sb.spec)[2]
    healthy_fleet(sb)
    first = leader_status(sb)
    victim = first["replicas"][-1]
    proxy.methods = frozenset(faulted_methods)
    proxy.faulted.set()
    since = time.time()
    os.kill(worker_record(sb, victim["id"]).pid, signal.SIGKILL)
    terms: set[tuple[str, int]] = set()
    unsynced: set[str] = set()  # router instances the leader's status named unsynced meanwhile
    resync_tries = 0  # the most failed reconciliations of router 2 it showed

    def back_on_the_answering_routers() -> bool:
        nonlocal resync_tries
        s = leader_status(sb)
        terms.add((s["identity"], s["term"]))
        unsynced.update(s["unsynced_routers"])
        resync_tries = max(resync_tries, s["router_resync"].get(faulted, {}).get("failed_tries", 0))
        acted = [(a["kind"], a["ok"]) for a in actions_since(sb, since) if a["replica"] == victim["id"]]
        rep = next(r for r in s["replicas"] if r["id"] == victim["id"])
        return (
            ("migrate", True) in acted
            and rep["in_rotation"]
            and on_routers(sb, victim["url"], slice(2)) == [True, True]
        )

    wait_until(
        back_on_the_answering_routers,
        what=f"{victim['id']} restarted and readmitted on the routers that answer",
        every_s=0.5,
        seen=lambda: (actions_since(sb, since), proxy.snapshot()),
    )
    during = leader_status(sb)
    resync_tries = max(resync_tries, during["router_resync"].get(faulted, {}).get("failed_tries", 0))
    refused, _passed = proxy.snapshot()
    acted = actions_since(sb, since)
    assert terms == {(first["identity"], first["term"])}, terms  # one leader, one term, throughout
    # the replica removed, restarted and readmitted once each, every change made on the routers that answered
    assert [(a["kind"], a["replica"], a["ok"]) for a in acted] == [
        (kind, victim["id"], True) for kind in ("remove", "migrate", "readmit")
    ], acted
    # the removal could not be made on router 2 and says so (a readmission may find the worker it still lists there)
    assert faulted in silent(acted[0]["detail"]), acted[0]["detail"]
    assert unsynced == {faulted}, unsynced
    if "GET" in faulted_methods:  # its listing fails as long as the fault lasts: listed again each interval
        assert faulted in during["unsynced_routers"] and resync_tries == 0, during
    assert sum(refused.get(m, 0) for m in faulted_methods) > 0 and set(refused) <= set(faulted_methods), refused
    proxy.faulted.clear()

    def reconciled() -> bool:
        s = leader_status(sb)
        return faulted not in s["unsynced_routers"] and any(r["router"] == faulted for r in s["reconciled_routers"])

    wait_until(reconciled, what=f"{faulted} reconciled once it answers", every_s=0.5, seen=lambda: leader_status(sb))
    healthy_fleet(sb)  # router 2 routes to the restarted replica too
    after = leader_status(sb)
    assert after["term"] == first["term"] and after["router_resync"] == {}, after["router_resync"]


def test_the_proxy_passes_what_it_does_not_fault(sandbox: Sandbox, router_behind_a_proxy: FaultProxy) -> None:
    """The drill's own instrument: without the fault, router 2 behind the proxy answers as itself."""
    url = router_urls(sandbox.spec)[2]
    assert httpx.get(url + "/workers", timeout=5).json()["workers"], "no worker listed through the proxy"
    router_behind_a_proxy.faulted.set()
    answer = httpx.get(url + "/workers", timeout=5)
    assert answer.status_code == 500 and answer.json()["code"] == "INTERNAL_SERVER_ERROR", answer.text
    assert httpx.get(url + "/health", timeout=5).status_code == 200  # not the worker API: passed
    router_behind_a_proxy.faulted.clear()
