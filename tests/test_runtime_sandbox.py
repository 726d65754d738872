"""The runtime layer live on loopback: `exaserve sandbox up` with the runtime on starts the REAL router (3 instances),
simulated SGLang workers (2 nodes × 4), one agent per node, 3 controllers and a REAL etcd; faults are real signals
to real processes (SIGKILL, SIGSTOP/SIGCONT).

Stack settings (the sandbox stack with the changes below): heartbeat 1 s, health timeout 0.5 s, 3 failures, health
score −5/+1 (stop routing below 60, migrate below 30, readmit at 75), warm-up 1 s, lease 3 s, eviction cap 25 % (2).
Expected timelines follow from them:

* killed or hung replica: the router's own check marks it unhealthy after 3 failed checks (≈ 3–4 s, interval 1 s,
  timeout 1 s); the controller removes it from every router at its 9th failed probe (≈ 9 s) and migrates it at the
  15th (≈ 15 s): killed, restarted, warmed up, readmitted on every router; 0 client errors: the router makes
  ``scheduler.retries`` (5) attempts per request, more than the circuit breaker's 3 consecutive failures, after
  which it picks only other workers, and ``--request-timeout-secs`` = 3 × 1 s cuts requests stuck on a hung
  replica (with 3 attempts, = the breaker's threshold, one CI run saw 1 request in 560 fail);
* flapping replica (stopped half the time): out once its score falls below 60 (≈ 20 s at −4 per 2 s), never back
  while it flaps, back only after ≥ 15 good probes once it is steady (score 60 → 75) and a warm-up;
* dead agent: its node is suspect after 3 missed reports (3 s); nothing is evicted;
* killed leader: a follower leads within the lease (3 s) plus one campaign period (1 s), with a higher fencing token.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from serving.router.loadgen import LoadReport, LoadSpec, run_load_sync
from serving.runtime.agent import boot_id
from serving.sandbox.processes import StateDir, start_service, stop_process
from serving.sandbox.runtime import controller_urls, router_urls
from tests.support.patience import PATIENCE_S, wait_until
from tests.support.runtime_sandbox import (
    INTERVAL_S,
    depose_the_leader,
    healthy_fleet,
    kill_and_read_the_router_views,
    leader_status,
    on_routers,
    replica,
    runtime_sandbox,
    statuses,
    worker_record,
)
from tests.support.sandbox import Sandbox

PENALTY, REWARD = 5, 1
# brings up the runtime sandbox (tests/support/runtime_sandbox.py): the wait-bound phase (tests/conftest.py)
pytestmark = pytest.mark.sandbox

# each test waits for a whole, led fleet first (healthy_fleet, leader_status): a sandbox each (tests/conftest.py)
SANDBOX_GROUPS = 3


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    with runtime_sandbox(tmp_path_factory.mktemp("runtime")) as sb:
        yield sb


@dataclass
class Timeline:
    """(seconds since the fault, replica state, score, in rotation, per-router registration) at each change."""

    events: list[tuple[float, str, int, bool, tuple[bool | None, ...]]]
    actions: list[dict[str, Any]] = field(default_factory=list)  # the leader's record of its actions on the replica

    def first(self, pred: Callable[[str, int, bool, tuple[bool | None, ...]], bool]) -> float:
        found = [t for t, *rest in self.events if pred(*rest)]
        assert found, f"not observed in {self.events}"
        return found[0]


def watch(
    sb: Sandbox, rid: str, until: Callable[[Timeline], bool], t0: float, patience_s: float = PATIENCE_S
) -> Timeline:
    """The replica's timeline from the leader's status and the routers' lists, sampled until ``until`` holds; fails
    with the timeline when ``patience_s`` passed first (a liveness bound: tests/support/patience.py)."""
    url = replica(leader_status(sb), rid)["url"]
    tl = Timeline([])
    last: tuple[Any, ...] | None = None
    deadline = time.monotonic() + patience_s
    while time.monotonic() < deadline:
        status = leader_status(sb)
        rep = replica(status, rid)
        now = (rep["state"], rep["score"], rep["in_rotation"], tuple(on_routers(sb, url)))
        tl.actions = [a for a in status["actions"] if a["replica"] == rid]
        if now != last:
            tl.events.append((round(time.monotonic() - t0, 2), *now))
            last = now
        if until(tl):
            return tl
        time.sleep(0.15)
    raise AssertionError(f"{rid}: condition not reached in {patience_s:g} s; timeline {tl.events}")


class Load:
    """Bounded client load through router 0 in a thread (40 requests/s: 28 s make 1,120 requests, every one sent
    however late: serving.router.loadgen)."""

    def __init__(self, sb: Sandbox, duration_s: float) -> None:
        self.report: LoadReport | None = None
        self.spec = spec = LoadSpec(url=sb.router_url, rate_per_s=40, duration_s=duration_s, timeout_s=10)
        self.thread = threading.Thread(target=lambda: setattr(self, "report", run_load_sync(spec)))
        self.thread.start()

    def join(self) -> LoadReport:
        self.thread.join()
        assert self.report is not None
        return self.report


def back(tl: Timeline) -> bool:
    """Migrated and readmitted: the leader's last actions on the replica are remove, migrate, readmit, all done, and
    it is serving and healthy on every router again."""
    _t, state, _score, rotation, routers = tl.events[-1]
    kinds = [a["kind"] for a in tl.actions if a["ok"]][-3:]
    return (
        kinds == ["remove", "migrate", "readmit"]
        and state == "serving"
        and rotation
        and all(r is True for r in routers)
    )


@pytest.mark.parametrize("fault", ["kill", "hang"])
def test_dead_or_hung_replica_is_removed_from_every_router_migrated_and_readmitted(
    sandbox: Sandbox, fault: str
) -> None:
    healthy_fleet(sandbox)
    rid = "sandbox-0-s1" if fault == "kill" else "sandbox-1-s2"
    old = worker_record(sandbox, rid)
    load = Load(sandbox, duration_s=28)
    time.sleep(2)
    t0 = time.monotonic()
    os.kill(old.pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    wall0 = time.time()
    tl = watch(sandbox, rid, back, t0=t0)
    report = load.join()
    remove, migrate, readmit = [a for a in tl.actions if a["ok"]][-3:]
    at = {a["kind"]: round(a["at"] - wall0, 2) for a in (remove, migrate, readmit)}
    failed_actions = [a for a in tl.actions if not a["ok"] and a["at"] >= wall0]
    print(f"{fault}: actions at {at}; failed {failed_actions}; timeline {tl.events}\nload: {report.summary()}")
    router_unhealthy = tl.first(lambda _s, _sc, _r, routers: False in routers)
    removed = tl.first(lambda _s, _sc, rotation, routers: not rotation and all(r is None for r in routers))
    # the router's check first (3 failed checks), then the score: ≥ 8 more failed probes below 60, ≥ 14 below 30
    assert router_unhealthy < removed
    assert remove["at"] < migrate["at"] < readmit["at"]

    # On a loaded machine an action may fail and be retried, by design, for two causes only: a readmission's warm-up
    # judged there (one CI run: the restarted replica fell to 59 and climbed to 75 again: the controller earns the
    # hysteresis margin again and retries), and every router instance timing out within the controller's bound on a
    # router call (serving.health_check_timeout_s, 0.5 s here): one CI run found all three loopback instances
    # ConnectTimeout at once, the controller's own loop stalled (it then spent 56 ms building a TLS context for each
    # client it made, several a tick: serving.fleet_http.http_client). The action ran again on a later tick. A refused
    # or reset router, or any other failure, is no such cause; at most two of these, and the bounds below still hold.
    def retried_by_design(a: dict[str, Any]) -> bool:
        why = str(a["detail"])
        if why.startswith("NoRouterAnswered: no router instance answered: "):
            reasons = re.findall(r"\(([^()]*)\)", why)
            return bool(reasons) and all(r in {"ConnectTimeout", "ReadTimeout", "PoolTimeout"} for r in reasons)
        return a["kind"] == "readmit" and ("warm-up failed" in why or "warm-up too slow" in why)

    shown = "; ".join(
        f"{a['kind']} at {a['at'] - wall0:.2f} s after {a['seconds']} s: {a['detail']}" for a in failed_actions
    )
    assert all(retried_by_design(a) for a in failed_actions), shown
    assert sum("no router instance answered" in str(a["detail"]) for a in failed_actions) <= 2, shown
    assert at["remove"] >= 8 * INTERVAL_S and at["migrate"] >= 14 * INTERVAL_S
    assert remove["reason"].startswith("score 5")  # 55: the first score below 60
    new = worker_record(sandbox, rid)
    assert new.pid != old.pid  # restarted through the sandbox backend
    failed = [(round(r.sent_at_s - 2, 2), r.status, r.error) for r in report.results if r.status != 200]
    # every planned request was sent and answered across the fault (a count: the generator sends each one, late or
    # not; how many it sent late is its pace, no judgment here)
    assert report.count == load.spec.planned_requests
    assert report.errors == 0, (report.status_counts, failed)
    assert len(remove["detail"]["seconds_by_router"]) == 3  # the removal was observed on each instance
    assert len(readmit["detail"]["added"]["seconds_by_router"]) == 3
    assert "warm-up requests" in readmit["detail"]["warmup"]


def test_flapping_replica_stays_out_until_it_is_steady(sandbox: Sandbox) -> None:
    healthy_fleet(sandbox)
    rid = "sandbox-0-s3"
    rec = worker_record(sandbox, rid)
    stop = threading.Event()
    ended: list[float] = []  # when the flapping process was found gone (the controller restarted it)

    def flap() -> None:
        """Stopped 1.5 s, running 0.5 s: of the two probes (1 s apart) in each 2 s cycle exactly one starts with more
        than the probe timeout (0.5 s) of the stop left, so one probe in two fails whatever the phase. On a loaded
        machine both may fail, the score fall below the migrate line while it flaps and the controller restart it
        (one CI run): the flapping ends with the process."""
        try:
            while not stop.is_set():
                os.kill(rec.pid, signal.SIGSTOP)
                time.sleep(1.5)
                os.kill(rec.pid, signal.SIGCONT)
                time.sleep(0.5)
        except ProcessLookupError:
            ended.append(time.monotonic() - t0)

    t0 = time.monotonic()
    flapper = threading.Thread(target=flap)
    flapper.start()
    try:
        # out of rotation, and the removal recorded as done (its action record is written when it completes)
        tl = watch(sandbox, rid, lambda t: any(a["kind"] == "remove" and a["ok"] for a in t.actions), t0)
        removed_at = tl.events[-1][0]
        removal = next(a for a in reversed(tl.actions) if a["kind"] == "remove")
        during = watch(sandbox, rid, lambda _t: bool(ended) or time.monotonic() - t0 > removed_at + 6, t0=t0)
    finally:
        stop.set()
        flapper.join()
        with contextlib.suppress(ProcessLookupError):
            os.kill(rec.pid, signal.SIGCONT)
    steady_at = ended[0] if ended else time.monotonic() - t0
    after = watch(sandbox, rid, lambda t: t.events[-1][1] == "serving" and t.events[-1][3], t0=t0)
    print(f"flap: removed at {removed_at} s ({removal['reason']}); ended {ended}; {during.events}; {after.events}")
    assert removal["reason"].startswith("score 5") and removed_at >= 8 * INTERVAL_S
    assert not any(e[3] for e in during.events if removed_at < e[0] < steady_at)  # never back while flapping
    readmitted_at = after.events[-1][0]
    score_when_steady = during.events[-1][2]
    # back only through a warm-up, by one of the plan's two paths: a score that was still above the migrate line when
    # the flapping stopped climbs to 75 at +1 per good probe (2 probes' slack for the sampling); one that fell below
    # it with the last failed probes is restarted (a fresh process at 100), then warmed up (CI: 33 at the last
    # sample, restarted 0.8 s after the flapping stopped). Read from the leader's action records, not the sampled
    # states: a warm-up lasts about a second and one CI run's samples, 1-3 s apart on a loaded machine, missed it.
    readmits = [a for a in after.actions if a["kind"] == "readmit" and a["ok"]]
    assert readmits, f"serving again without a readmission the leader recorded: {after.actions}"
    readmit = readmits[-1]
    assert readmit["at"] > removal["at"] and "warm-up requests" in readmit["detail"]["warmup"], readmit
    if any(a["kind"] == "migrate" and a["ok"] and a["at"] > removal["at"] for a in after.actions):  # restarted
        assert worker_record(sandbox, rid).pid != rec.pid
    else:  # the climb: never below 30, not migrated
        assert not ended and score_when_steady < 75
        assert readmitted_at - steady_at >= (75 - score_when_steady - 2) * INTERVAL_S
        assert worker_record(sandbox, rid).pid == rec.pid
    assert all(on_routers(sandbox, replica(leader_status(sandbox), rid)["url"]))


def test_dead_agent_makes_its_node_suspect_and_evicts_nothing(sandbox: Sandbox) -> None:
    """The node is suspect, its replicas stay in rotation and on every router while the leader counts it silent, and
    no controller acts on them from the kill until the agent is back: read from their action records afterwards."""
    healthy_fleet(sandbox)
    agent = sandbox.processes.read("agent-sandbox-1")
    assert agent is not None
    on_node = {r["id"] for r in leader_status(sandbox)["replicas"] if r["node"] == "sandbox-1"}
    killed_at = time.time()  # wall clock, as the controllers' action records are
    os.kill(agent.pid, signal.SIGKILL)
    t0 = time.monotonic()

    def node() -> dict[str, Any]:
        return next(n for n in leader_status(sandbox)["nodes"] if n["name"] == "sandbox-1")

    def node_state() -> str:
        return node()["state"]

    wait_until(lambda: node_state() == "suspect", what="sandbox-1 suspect", every_s=0.2, seen=node_state)
    suspect_after = time.monotonic() - t0
    # the window: the leader itself counts the node silent for 3 heartbeats past its suspicion (3 missed reports), on
    # its own clock; a slower machine waits longer for that, and the absence of actions is read from the records
    silent_for = (sandbox.spec.serving.failure_threshold + 3) * INTERVAL_S
    wait_until(
        lambda: (node()["last_report_s"] or 0) >= silent_for,
        what=f"the leader to count sandbox-1 silent for {silent_for:g} s",
        every_s=0.2,
        seen=node,
    )
    status = leader_status(sandbox)
    print(f"dead agent: suspect after {suspect_after:.1f} s")
    assert suspect_after >= 2 * INTERVAL_S  # 3 missed reports, the last one sent up to an interval before the kill
    assert all(r["in_rotation"] for r in status["replicas"])
    assert all(r["state"].startswith("suspect/") for r in status["replicas"] if r["node"] == "sandbox-1")
    assert all(all(on_routers(sandbox, url)) for url in sandbox.worker_urls)
    cli = sandbox.cli("status", "--json")
    doc = json.loads(cli.stdout)
    assert cli.returncode == 1 and doc["ok"] is False
    assert {n["name"]: n["state"] for n in doc["nodes"]}["sandbox-1"] == "suspect"
    # bring it back as sandbox up started it
    state = StateDir(sandbox.paths.sandbox_dir)
    stop_process(state, "agent-sandbox-1", timeout_s=1)
    start_service(state, "agent-sandbox-1", "agent", list(agent.argv), "", lambda: True, 10)
    wait_until(lambda: node_state() == "ok", what="sandbox-1 ok again", every_s=0.2, seen=node_state)
    # nothing was evicted while it was suspect: no controller acted on its replicas from the kill until it was back
    acted = [
        a for s in statuses(sandbox) if s for a in s["actions"] if a["replica"] in on_node and a["at"] >= killed_at
    ]
    assert not acted, acted


def test_status_json_and_bad_reports_over_http(sandbox: Sandbox) -> None:
    healthy_fleet(sandbox)
    cli = sandbox.cli("status", "--json")
    doc = json.loads(cli.stdout)
    assert cli.returncode == 0 and doc["ok"] is True, cli.stdout + cli.stderr
    assert doc["stack"] == "sandbox" and doc["leader"] in {"controller-0", "controller-1", "controller-2"}
    assert {n["name"] for n in doc["nodes"]} == {"sandbox-0", "sandbox-1"}
    assert all(set(n) >= {"name", "score", "state", "last_report_s"} for n in doc["nodes"])
    assert all(set(r) >= {"id", "node", "url", "state", "in_rotation", "load"} for r in doc["replicas"])
    assert len(doc["replicas"]) == 8
    # issue 28, item 8: each replica's version as the rollout's backend reads it (the worker's own weight_version)
    assert doc["versions_unread"] is None, doc["versions_unread"]
    assert {r["version"] for r in doc["replicas"]} == {sandbox.spec.serving.version}
    table = sandbox.cli("status")
    assert table.returncode == 0 and "version" in table.stdout and sandbox.spec.serving.version in table.stdout
    # issue 28, item 8: `--output wide` prints plain columns, a replica a line, for awk and grep
    wide = sandbox.cli("status", "--output", "wide")
    assert wide.returncode == 0 and not set("│┃━─") & set(wide.stdout), wide.stdout
    rows = {line.split()[0]: line.split() for line in wide.stdout.splitlines() if line.split()}
    header = next(line.split() for line in wide.stdout.splitlines() if line.split()[:1] == ["replica"])
    for r in doc["replicas"]:
        # one field per column: the per-router cell (3 routers here) is comma-joined, the header has no spaces
        assert len(rows[r["id"]]) == len(header), (header, rows[r["id"]])
        assert rows[r["id"]][:5] == [r["id"], r["node"], r["url"], r["version"], ",".join(r["routers"].values())]
    url = controller_urls(sandbox.spec)[0]
    good = {
        "schema_version": 2,
        "node": "sandbox-0",
        "boot_id": boot_id(),
        "seq": 1,
        "sent_at": time.time(),
        "replicas": [],
    }
    before = leader_status(sandbox)
    cases = [
        (b"{", 400, "malformed"),
        (json.dumps({**good, "schema_version": 7}).encode(), 400, "malformed"),
        (json.dumps({**good, "node": "elsewhere"}).encode(), 404, "unknown_node"),
        (json.dumps(good).encode(), 409, "replayed"),  # this boot's monotonic clock is far past 1 ns
    ]
    for body, code, reason in cases:
        response = httpx.post(url + "/v1/reports", content=body, headers={"content-type": "application/json"})
        assert (response.status_code, response.json()["rejected"]) == (code, reason)
    metrics = httpx.get(url + "/metrics").text
    counted = {
        line.split('"')[1]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("exaserve_runtime_reports_rejected_total{")
    }
    assert counted["malformed"] >= 2 and counted["unknown_node"] >= 1 and counted["replayed"] >= 1
    after = leader_status(sandbox)
    assert [n["score"] for n in after["nodes"]] >= [min(n["score"], 99) for n in before["nodes"]]


def test_killed_leader_is_replaced_by_a_follower_with_a_higher_token(sandbox: Sandbox) -> None:
    """A follower leads, with a higher fencing token; how soon (the lease plus a campaign period) is the takeover the
    controller-killed drill judges on the plan's target (tests/rehearsal/test_drills.py)."""
    healthy_fleet(sandbox)
    first = leader_status(sandbox)
    name = first["identity"]
    record = sandbox.processes.read(name)
    assert record is not None
    os.kill(record.pid, signal.SIGKILL)
    t0 = time.monotonic()
    second = leader_status(sandbox)
    failover = time.monotonic() - t0
    print(
        f"leader {name} (term {first['term']}) killed; {second['identity']} leads (term {second['term']}) after {failover:.2f} s"
    )
    assert second["identity"] != name and second["term"] > first["term"]
    # the new leader adopted the routers' membership and keeps the fleet: all in rotation
    assert all(r["in_rotation"] for r in second["replicas"])
    state = StateDir(sandbox.paths.sandbox_dir)
    stop_process(state, name, timeout_s=1)
    url = record.url
    start_service(state, name, "controller", list(record.argv), url, lambda: _ok(url + "/v1/status"), 20)
    assert not next(s for s in statuses(sandbox) if s and s["identity"] == name)["is_leader"]  # back as a follower


def test_a_deposed_leader_stops_acting_at_once(sandbox: Sandbox) -> None:
    """The leader key disappears from etcd (an operator, a compaction, a partition healed): the leader's next renewal
    fails its fencing check and it stops claiming the lead; whoever wins next holds a higher fencing token.

    Until that renewal (one period, lease / 3) the deposed instance still *believes* it leads — its status says so —
    but it cannot act: every batch of actions re-checks the token against etcd first. So the claims may overlap for
    at most one renewal period, and no action of the old term succeeds after the key is gone."""
    healthy_fleet(sandbox)
    deposed = depose_the_leader(sandbox)
    first, new = deposed.first, deposed.new
    print(
        f"deposed {first['identity']} (term {first['term']}); {new['identity']} leads (term {new['term']}); the old "
        f"leader stopped claiming after {deposed.stepped_down_s:.2f} s"
    )
    assert new["term"] > first["term"]
    # that the claims overlapped for at most one renewal period (lease / 3) is the rehearsal's:
    # tests/rehearsal/test_runtime_timing.py
    assert deposed.leaders_after == 1
    former = deposed.former
    assert not [a for a in former["actions"] if a["term"] == first["term"] and a["ok"] and a["at"] > deposed.deleted_at]


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_sandbox_up_started_the_runtime(sandbox: Sandbox) -> None:
    """One agent per node, scheduler.instances controllers and routers, one etcd, all recorded for sandbox down."""
    kinds: dict[str, list[str]] = {}
    for rec in sandbox.processes.records():
        kinds.setdefault(rec.kind, []).append(rec.name)
    assert sorted(kinds["agent"]) == ["agent-sandbox-0", "agent-sandbox-1"]
    assert sorted(kinds["controller"]) == ["controller-0", "controller-1", "controller-2"]
    assert sorted(kinds["router"]) == ["router", "router-1", "router-2"] and kinds["etcd"] == ["etcd"]
    assert len(kinds["worker"]) == 8


def test_one_router_instance_down_does_not_stall_the_runtime(sandbox: Sandbox) -> None:
    """Finding 2: RouterSet failed every operation when one instance did not answer, so with router 2 stopped a killed
    replica was never removed, migrated nor readmitted (each removal failed on router 2's timeout). Now the leader
    acts on the routers that answer, names router 2 unsynced (status, metric, alert), and when router 2 answers
    again removes the replica the controller holds out from its worker list."""
    healthy_fleet(sandbox)
    routers = router_urls(sandbox.spec)
    silent = sandbox.processes.read("router-2")
    assert silent is not None
    rid = "sandbox-1-s1"
    url = replica(leader_status(sandbox), rid)["url"]
    old = worker_record(sandbox, rid)
    os.kill(silent.pid, signal.SIGSTOP)
    stopped = True
    seen: dict[str, Any] = {}

    def leads() -> dict[str, Any]:
        seen["status"] = leader_status(sandbox)
        return seen["status"]

    def on_rid() -> list[dict[str, Any]]:
        return [a for a in seen["status"]["actions"] if a["replica"] == rid]

    try:
        os.kill(old.pid, signal.SIGKILL)
        removal = wait_until(
            lambda: [a for a in leads()["actions"] if a["replica"] == rid and a["kind"] == "remove" and a["ok"]],
            what=f"the leader to remove {rid} with router 2 stopped",
            every_s=0.2,
            seen=on_rid,
        )
        status = seen["status"]
        os.kill(silent.pid, signal.SIGCONT)  # router 2 answers again while the replica is out
        stopped = False
        assert set(removal[-1]["detail"]["seconds_by_router"]) == set(routers[:2])
        assert list(removal[-1]["detail"]["silent"]) == [routers[2]]
        assert routers[2] in status["unsynced_routers"]
        for router in routers[:2]:
            assert url not in {w["url"] for w in httpx.get(router + "/workers", timeout=2).json()["workers"]}
    finally:
        if stopped:
            os.kill(silent.pid, signal.SIGCONT)
    status = wait_until(
        lambda: routers[2] not in leads()["unsynced_routers"] and seen["status"],
        what="router 2 reconciled: no longer unsynced",
        every_s=0.2,
        seen=lambda: seen["status"]["unsynced_routers"],
    )
    [reconciled] = [r for r in status["reconciled_routers"] if r["router"] == routers[2]][-1:]
    print(f"router down: removal {removal[-1]['detail']}; reconciled {reconciled}")
    assert reconciled["removed"] == [url] and reconciled["added"] == []
    tl = watch(sandbox, rid, back, t0=time.monotonic())
    assert tl.events[-1][4] == (True, True, True)  # readmitted on every instance, router 2 included


def test_status_shows_what_each_router_does_beside_the_controllers_view(sandbox: Sandbox) -> None:
    """Finding 5: a SIGKILLed replica leaves every router within their health checks (2 failed checks 1 s apart here),
    while `status --json` said in_rotation: true until the controller's score crossed 60 (9 failed probes). Now each
    replica carries what every router instance does with it, beside the controller's view, and status is not ok."""
    healthy_fleet(sandbox)
    rid = "sandbox-0-s2"
    killed_at = time.time()  # wall clock, as the controllers' action records are; the kill follows
    views = kill_and_read_the_router_views(sandbox, rid)
    rep, doc = views.replica, views.doc
    print(f"status: every router stopped routing to {rid} {views.seen_s:.1f} s after the kill; controller view {rep}")
    assert set(rep["routers"]) == set(router_urls(sandbox.spec)) and set(doc["routers"].values()) == {"answering"}
    # the controller's view beside the routers', its own: in rotation until the leader recorded its removal. That the
    # routers' checks (2 failures) come before the controller's score falls below 60 (9), so the two views disagree,
    # is the rehearsal's (tests/rehearsal/test_runtime_timing.py): on a loaded machine a status read may come late
    actions = [a for a in leader_status(sandbox)["actions"] if a["replica"] == rid and a["at"] >= killed_at]
    removed = [a for a in actions if a["kind"] == "remove"]
    assert rep["in_rotation"] is True or removed, (rep, actions)
    # its worker answers nothing: down, as a rollout would read it; but a status read that came late may find it
    # restarted already (CI under load at 08ee375: 'v1', the routers not yet readmitting it), after a migration the
    # leader recorded
    migrated = [a for a in actions if a["kind"] == "migrate"]
    assert rep["version"] == "down" or (rep["version"] == "v1" and migrated), (rep, actions)
    assert views.returncode == 1 and doc["ok"] is False
    others = [r for r in doc["replicas"] if r["id"] != rid]
    assert all(set(r["routers"].values()) == {"routes"} for r in others)
