"""FleetSim against the service (issue 38): one scripted fault, run through FleetSim's model of what the service does
(tests/support/fleet_sim.py) and through ``serving/runtime/service.py``'s :class:`ControllerService` itself, on the
same simulated clock; the two decision sequences must agree. The scenarios of tests/test_runtime_correlated.py stand
on FleetSim's model (its warm-up, its restart, its removal); ``test_the_sims_service_model_*`` there check one aspect
each, this checks them together, through time.

The script, on prod's settings cut to 16 nodes (128 replicas), from :data:`fs.FAULT_AT` (10 s):

* ``dead-hung`` / ``dead-killed``: one replica stops answering (hung: every HTTP call to it times out; killed: every
  connection is refused) and stays so until restarted; a restarted process loads for :data:`LOAD_S` (its HTTP server
  refuses connections meanwhile, as SGLang's, which starts it once the model is loaded), then serves;
* ``generation-errors``: one replica's generations fail (HTTP 500) while its ``/health_generate`` and the agent's
  probe pass, until it is restarted.

The service runs on an event loop whose clock is simulated (:class:`_SimLoop`: when nothing is ready, the clock jumps
to the next timer; no real sleeping), with fakes at its edges only:

* the agents: every ``serving.heartbeat_interval_s`` each node's report, built as FleetSim builds it, validated and
  posted as JSON through the service's own HTTP handler (``_on_report``);
* the tick loop: the service's own ``_tick_loop`` (it reads the routers' breakers, ticks, runs each action through
  ``_execute`` as a task), started 1 ms after the agents so each tick sees that interval's reports, as FleetSim's do;
* the election (:class:`_Leader`): always leader, the fencing check always confirms, a term that never ends;
* the routers (:class:`_Routers`): one instance that applies each removal and addition at once (what FleetSim models)
  and records them; its breakers (``smg_worker_cb_state``) read from its metrics listener as smg exposes them: open
  for a replica it lists whose requests fail;
* the restarter (:class:`_Restarter`): ``systemctl restart --no-block``: returns at once, the process then loads;
* HTTP to the replicas: ``http_client`` in service.py and router/client.py (the warm-up's ``/health_generate``, the
  drain's ``/metrics``) gets an httpx client on :class:`_FleetTransport`, which answers as the replica would (a hung
  one after the call's own timeout, on the simulated clock); the warm-up's load is loadgen.py's own LoadGenerator
  with aiohttp's session replaced by :class:`_Session` (the same answers);
* ``time.monotonic`` in service.py, router/client.py and router/loadgen.py reads the simulated clock (their module's
  ``time``), so the warm-up's start-up budget, the drain's bound and the load's schedule run on it.

Compared: every action each side started (kind, replica, in order; times within one tick, half a heartbeat), and
every completion (kind, replica, ok, answered, restart made, refused, fenced, in order; the tick of each side that
first saw it within one tick too: what follows a completion is decided there). A disagreement prints both sequences
side by side.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import selectors
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import httpx
import pytest

import serving.router.client as router_client
from serving.router import loadgen
from serving.router.client import ROUTER_WORKER_CB_STATE, WORKER_QUEUED, WORKER_RUNNING
from serving.router.membership import Observed
from serving.runtime import service
from serving.runtime.controller import Action, Kind, replica_urls
from serving.runtime.leader import Term
from serving.runtime.reports import NodeReport, ReplicaProbe
from serving.runtime.service import ControllerService
from serving.sglang_health import SCHEDULER_HEALTH_PATH
from tests.support import fleet_scenarios as fs
from tests.support.fleet_sim import BOOT_ID, FIRST_BOOT_AT, PROBE_LATENCY_S, FleetSim

FLEET = fs.prod_fleet(16)
SPEC = FLEET.spec
INTERVAL = SPEC.serving.heartbeat_interval_s
TICK = INTERVAL / 2  # the service ticks every half heartbeat (service.py's _tick_loop), as FleetSim steps
T0 = 1_800_000_000.0  # FleetSim's t0: the controllers' clock at the start
LOAD_S = 120.0  # a (re)started replica's model load: the shortest of fleet_scenarios.load_time's 2–10 min
TICK_LAG = 0.001  # the service's ticks follow the agents' reports by this (FleetSim: reports first, then the tick)
GENERATE_LATENCY = 0.05  # one warm-up request's answer from a serving replica (s on the simulated clock)
ROUTER = "http://router-0:30080"
ROUTER_METRICS = "http://router-0:29000/metrics"
URLS = replica_urls(FLEET.plan)
BY_URL = {url: rid for rid, url in URLS.items()}
NODES: dict[str, list[str]] = {}
for _r in FLEET.plan.replicas:
    NODES.setdefault(_r.node.name, []).append(_r.id)

Restarted = Callable[[str], bool]  # replica id → a restart of it was made (on the side asking)
Fault = Callable[[str, float, Restarted], bool]  # (replica id, t, restarted) → true for it then


# ----- the script ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Script:
    name: str
    until: float  # seconds on the simulated clock
    up: Fault  # it answers /health (a process that is not loading)
    expect: tuple[Kind, ...]  # the actions the fault calls for (both sides): the script tests what it says
    failing: Fault | None = None  # its generations fail (it answers /health or not)
    hung: bool = True  # a replica that does not answer hangs (calls time out); else it refuses connections


DEAD = FLEET.plan.replicas[0].id
FAILING = FLEET.plan.replicas[4].id


def _dead_until_restarted(r: str, t: float, restarted: Restarted) -> bool:
    return r != DEAD or t < fs.FAULT_AT or restarted(r)


def _failing_until_restarted(r: str, t: float, restarted: Restarted) -> bool:
    return r == FAILING and t >= fs.FAULT_AT and not restarted(r)


DEAD_ACTIONS = (Kind.REMOVE, Kind.MIGRATE, Kind.READMIT)  # out at 60, restarted under 30, back after its warm-up
SCRIPTS = [
    Script("dead-hung", 300.0, _dead_until_restarted, DEAD_ACTIONS, hung=True),
    Script("dead-killed", 300.0, _dead_until_restarted, DEAD_ACTIONS, hung=False),
    # out after the breaker's dwell, its warm-up fails (answered): restarted, then back
    Script(
        "generation-errors",
        300.0,
        lambda _r, _t, _restarted: True,
        (Kind.REMOVE, Kind.READMIT, Kind.MIGRATE, Kind.READMIT),
        failing=_failing_until_restarted,
    ),
]

# Where FleetSim's model and service.py disagree today, each line as disagreements() words it: the test fails when
# another disagreement appears and when one of these goes (then delete it here).
#
# dead-hung: a migration drains before it restarts (service.py ControllerService._perform → _drain →
# RouterClient.wait_until_idle, serving/router/client.py): the drain's first call, the replica's /metrics, is bounded
# by serving.health_check_timeout_s (3 s at prod) and a hung process (or a dead host) answers nothing, so the restart
# is made 3 s after the decision and the migration completes then. FleetSim (tests/support/fleet_sim.py, FleetSim._start,
# the Kind.MIGRATE branches) restarts and completes at the decision: every replica that does not answer is refused at
# once there. The readmission is decided one tick later in the service (inside the tolerance); the migration's
# completion is first seen two ticks later.
KNOWN: dict[str, tuple[str, ...]] = {
    "dead-hung": (f"completion 1 (migrate {DEAD}): FleetSim's tick sees it at 80 s, the service's at 85 s",),
}


# ----- what each side decided --------------------------------------------------------------------------------------
def _grid(t: float, lag: float) -> float:
    """The time on FleetSim's tick grid of the side's first tick at or after ``t``, its ticks ``lag`` after the grid's
    (FleetSim's completions come at a step, before its tick: that tick sees them)."""
    return math.ceil(round((t - lag) / TICK, 6)) * TICK


@dataclass(frozen=True)
class Decision:
    t: float  # the side's clock
    tick: float  # its tick on FleetSim's grid
    kind: Kind
    replica: str

    def __str__(self) -> str:
        return f"{self.t:8.3f} {self.kind.value:<8} {self.replica}"


@dataclass(frozen=True)
class Outcome:
    t: float  # when the outcome came
    seen: float  # the side's first tick at or after it: where what follows it is decided
    kind: Kind
    replica: str
    ok: bool
    answered: bool
    restart_made: bool | None  # a migration's: whether its restart reached the deployment (others: None)
    refused: bool
    fenced: bool

    def key(self) -> tuple[object, ...]:
        return (self.kind, self.replica, self.ok, self.answered, self.restart_made, self.refused, self.fenced)

    def __str__(self) -> str:
        made = "" if self.restart_made is None else f" made={self.restart_made}"
        flags = "".join(f" {k}" for k in ("answered", "refused", "fenced") if getattr(self, k))
        return f"{self.t:8.3f}→{self.seen:7.2f} {self.kind.value:<8} {self.replica} ok={self.ok}{made}{flags}"


def _outcome(t: float, action: Action, ok: bool, kw: dict[str, Any], *, lag: float = 0.0) -> Outcome:
    return Outcome(
        t,
        _grid(t, lag),
        action.kind,
        action.replica,
        ok,
        bool(kw.get("answered", False)),
        bool(kw.get("restart_made", True)) if action.kind is Kind.MIGRATE else None,
        bool(kw.get("refused", False)),
        bool(kw.get("fenced", False)),
    )


@dataclass
class Run:
    decisions: list[Decision]
    outcomes: list[Outcome]


# ----- FleetSim ----------------------------------------------------------------------------------------------------
def run_sim(script: Script) -> Run:
    def restarted(r: str) -> bool:
        return sim.restarts[r] > 0

    failing = script.failing
    sim = FleetSim(
        FLEET,
        lambda r, t: script.up(r, t, restarted),
        load_s=LOAD_S,
        t0=T0,
        breaker=None if failing is None else (lambda r, t: failing(r, t, restarted)),
    )
    outcomes: list[Outcome] = []
    complete = sim.ctl.complete

    def recorded(action: Action, ok: bool, **kw: Any) -> None:
        outcomes.append(_outcome(sim.now, action, ok, kw))
        complete(action, ok, **kw)

    sim.ctl.complete = recorded  # type: ignore[method-assign]
    sim.run(script.until)
    return Run([Decision(t, _grid(t, 0.0), kind, rid) for t, kind, rid in sim.log], outcomes)


# ----- the service, on a simulated clock ---------------------------------------------------------------------------
class _JumpSelector(selectors.DefaultSelector):
    """The loop's selector: what is ready now (the loop's own self-pipe: nothing else is real here), else the loop's
    clock jumps by the time the loop would have waited."""

    def __init__(self, loop: _SimLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready: list[tuple[selectors.SelectorKey, int]] = super().select(0)
        if ready:
            return ready
        if timeout is None:
            raise RuntimeError("the simulated loop waits for nothing scheduled: a deadlock")
        self._loop.now += timeout
        return []


class _SimLoop(asyncio.SelectorEventLoop):
    """asyncio on a simulated clock: ``time()`` is seconds since the start; sleeps, timeouts and ``wait_for`` jump."""

    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(_JumpSelector(self))

    def time(self) -> float:
        return self.now


class _World:
    """The replicas and the router as the service's edges see them, on the loop's clock."""

    def __init__(self, script: Script, loop: _SimLoop) -> None:
        self.script = script
        self.loop = loop
        self.restarts: Counter[str] = Counter()
        self.ready_at: dict[str, float] = {}
        self.routed = set(URLS)  # what the router lists
        self.changes: list[tuple[float, str, str]] = []

    def now(self) -> float:
        return self.loop.now

    def _restarted(self, r: str) -> bool:
        return self.restarts[r] > 0

    def loading(self, rid: str) -> bool:
        return self.now() < self.ready_at.get(rid, 0.0)

    def answers(self, rid: str) -> bool:
        """FleetSim.answers: loaded, and up."""
        return not self.loading(rid) and self.script.up(rid, self.now(), self._restarted)

    def failing(self, rid: str) -> bool:
        failing = self.script.failing
        return failing is not None and failing(rid, self.now(), self._restarted)

    def silent(self, rid: str) -> str | None:
        """How a call to the replica goes unanswered: "refused" (loading, or killed), "hung" (it times out), or None
        (it answers)."""
        if self.loading(rid):
            return "refused"
        if self.answers(rid):
            return None
        return "hung" if self.script.hung else "refused"

    def probe(self, rid: str) -> ReplicaProbe:
        ok = self.answers(rid)
        return ReplicaProbe(
            id=rid, ok=ok, latency_s=PROBE_LATENCY_S if ok else None, error=None if ok else "health check failed"
        )

    def report(self, node: str) -> bytes:
        """The node's report as FleetSim builds it (seq: the node's uptime in ns), validated, as the agent posts it."""
        t = self.now()
        return (
            NodeReport(
                schema_version=2,
                node=node,
                seq=int((t - FIRST_BOOT_AT) * 1e9),
                boot_id=BOOT_ID,
                sent_at=T0 + t,
                replicas=tuple(self.probe(rid) for rid in NODES[node]),
            )
            .model_dump_json()
            .encode()
        )

    def breakers(self) -> str:
        """The router's ``smg_worker_cb_state``: each listed worker, open (1) while its requests fail (FleetSim's
        ``breakers``)."""
        lines = [f"# TYPE {ROUTER_WORKER_CB_STATE} gauge"]
        for rid in sorted(self.routed):
            lines.append(f'{ROUTER_WORKER_CB_STATE}{{worker="{URLS[rid]}"}} {int(self.failing(rid))}')
        return "\n".join(lines) + "\n"


class _FleetTransport(httpx.AsyncBaseTransport):
    """HTTP to the replicas and the router's metrics listener as they answer, on the simulated clock."""

    def __init__(self, world: _World) -> None:
        self.world = world

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = str(request.url)
        if url == ROUTER_METRICS:
            return httpx.Response(200, text=self.world.breakers(), request=request)
        parts = urlsplit(url)
        rid = BY_URL[f"{parts.scheme}://{parts.netloc}"]
        how = self.world.silent(rid)
        if how == "refused":
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        if how == "hung":  # connected (the kernel accepts), no answer within the call's own timeout
            await asyncio.sleep(request.extensions["timeout"]["read"])
            raise httpx.ReadTimeout("timed out", request=request)
        if parts.path == SCHEDULER_HEALTH_PATH:
            return httpx.Response(200, request=request)
        if parts.path == "/metrics":
            return httpx.Response(200, text=f"{WORKER_RUNNING} 0\n{WORKER_QUEUED} 0\n", request=request)
        return httpx.Response(404, request=request)


class _Answer:
    def __init__(self, status: int) -> None:
        self.status = status

    async def read(self) -> bytes:
        return b"{}"


class _Post:
    """``session.post(...)``: a warm-up request to the replica's /generate."""

    def __init__(self, world: _World, url: str, timeout: float) -> None:
        self.world, self.rid, self.timeout = world, BY_URL[url.removesuffix("/generate")], timeout

    async def __aenter__(self) -> _Answer:
        how = self.world.silent(self.rid)
        if how == "refused":
            raise aiohttp.ClientOSError(111, "Connect call failed: Connection refused")
        if how == "hung":
            await asyncio.sleep(self.timeout)
            raise TimeoutError
        await asyncio.sleep(GENERATE_LATENCY)
        return _Answer(500 if self.world.failing(self.rid) else 200)

    async def __aexit__(self, *_exc: object) -> None:
        return None


class _Session:
    """aiohttp.ClientSession as loadgen.py's LoadGenerator uses it."""

    world: _World

    def __init__(self, *, connector: object = None, timeout: aiohttp.ClientTimeout) -> None:
        self.timeout = timeout.total or 0.0

    async def __aenter__(self) -> _Session:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        return None

    def post(self, url: str, *, json: object) -> _Post:
        return _Post(self.world, url, self.timeout)


class _Leader:
    """An election this instance always leads: the fencing check always confirms its token."""

    async def verify(self, term: Term) -> bool:
        return True


class _Routers:
    """One router instance (RouterSet's part the service uses): a removal and an addition applied at once (FleetSim's
    model), recorded; its metrics listener answers through :class:`_FleetTransport`."""

    timeout_s = 2.0

    def __init__(self, world: _World) -> None:
        self.world = world

    async def urls(self) -> list[str]:
        return [ROUTER]

    def metrics_url(self, router: str) -> str:
        return ROUTER_METRICS

    async def remove(self, *urls: str, timeout_s: float) -> Observed:
        for url in urls:
            self.world.routed.discard(BY_URL[url])
            self.world.changes.append((self.world.now(), "remove", BY_URL[url]))
        return Observed("remove", urls, {ROUTER: 0.0})

    async def add(self, *urls: str, timeout_s: float) -> Observed:
        for url in urls:
            self.world.routed.add(BY_URL[url])
            self.world.changes.append((self.world.now(), "add", BY_URL[url]))
        return Observed("add", urls, {ROUTER: 0.0})


class _Restarter:
    """``systemctl restart --no-block``: returns at once; the new process loads for :data:`LOAD_S`."""

    def __init__(self, world: _World) -> None:
        self.world = world

    async def restart(self, replica_id: str, timeout_s: float) -> None:
        self.world.restarts[replica_id] += 1
        self.world.ready_at[replica_id] = self.world.now() + LOAD_S


class _Body:
    """The agent's POST as the service's handler reads it."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    async def read(self) -> bytes:
        return self.body


async def _service_run(script: Script, monkeypatch: pytest.MonkeyPatch) -> Run:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, _SimLoop)
    world = _World(script, loop)
    clock = SimpleNamespace(monotonic=lambda: loop.now, time=lambda: T0 + loop.now)
    for module in (service, router_client, loadgen):
        monkeypatch.setattr(module, "time", clock)

    def client(**kw: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=_FleetTransport(world), timeout=kw.get("timeout"), trust_env=False)

    monkeypatch.setattr(service, "http_client", client)
    monkeypatch.setattr(router_client, "http_client", client)
    session = type("Session", (_Session,), {"world": world})
    monkeypatch.setattr(aiohttp, "ClientSession", session)
    monkeypatch.setattr(aiohttp, "TCPConnector", lambda **_kw: None)

    svc = ControllerService(
        FLEET,
        identity="c0",
        election=_Leader(),  # type: ignore[arg-type]  # only verify() is reached: no lease loop runs
        routers=_Routers(world),  # type: ignore[arg-type]  # urls, metrics_url, timeout_s, remove, add
        restarter=_Restarter(world),
        clock=lambda: T0 + loop.now,
        wall_clock=lambda: T0 + loop.now,
    )
    svc.term = Term("c0", 7, math.inf)  # leader for good: acting() and every fencing check hold
    decisions: list[Decision] = []
    outcomes: list[Outcome] = []
    recording = True
    tick, complete = svc.controller.tick, svc.controller.complete

    def ticked(now: float, *, acting: bool) -> list[Action]:
        actions = tick(now, acting=acting)
        if recording:
            decisions.extend(Decision(now - T0, _grid(now - T0, TICK_LAG), a.kind, a.replica) for a in actions)
        return actions

    def recorded(action: Action, ok: bool, **kw: Any) -> None:
        if recording:  # the service ticks TICK_LAG after FleetSim's grid
            outcomes.append(_outcome(loop.now, action, ok, kw, lag=TICK_LAG))
        complete(action, ok, **kw)

    svc.controller.tick = ticked  # type: ignore[method-assign]
    svc.controller.complete = recorded  # type: ignore[method-assign]

    stop = asyncio.Event()
    rejected: list[str] = []

    async def agents() -> None:
        while not stop.is_set():
            await asyncio.sleep(INTERVAL)
            for node in NODES:
                answer = await svc._on_report(_Body(world.report(node)))  # type: ignore[arg-type]
                if answer.status != 202:
                    rejected.append(f"{node} at {loop.now}: {answer.status} {answer.text}")

    reporting = asyncio.create_task(agents())
    await asyncio.sleep(TICK_LAG)
    ticking = asyncio.create_task(svc._tick_loop(stop))
    await asyncio.sleep(script.until)
    recording = False
    stop.set()
    svc._cancel_actions()
    await asyncio.gather(reporting, ticking, *svc._tasks, return_exceptions=True)
    assert not rejected, rejected
    return Run(decisions, outcomes)


def run_service(script: Script, monkeypatch: pytest.MonkeyPatch) -> Run:
    with asyncio.Runner(loop_factory=_SimLoop) as runner:
        return runner.run(_service_run(script, monkeypatch))


# ----- the comparison ----------------------------------------------------------------------------------------------
def _side_by_side(title: str, left: list[Any], right: list[Any]) -> str:
    rows = [f"{title}: {'FleetSim':<58} | service.py"]
    for a, b in itertools.zip_longest(left, right):
        rows.append(f"  {'' if a is None else str(a):<66} | {'' if b is None else str(b)}")
    return "\n".join(rows)


def disagreements(sim: Run, svc: Run) -> Iterator[str]:
    """Each way the two runs disagree: an action of another kind or replica, or more than a tick apart; a completion
    with another outcome, or first seen more than a tick apart."""
    if len(sim.decisions) != len(svc.decisions):
        yield f"{len(sim.decisions)} actions in FleetSim, {len(svc.decisions)} in the service"
    for i, (a, b) in enumerate(zip(sim.decisions, svc.decisions, strict=False)):
        if (a.kind, a.replica) != (b.kind, b.replica):
            yield f"action {i}: FleetSim {a.kind.value} {a.replica}, the service {b.kind.value} {b.replica}"
        elif abs(a.tick - b.tick) > TICK:  # simulated seconds on both sides
            yield f"action {i} ({a.kind.value} {a.replica}): FleetSim's tick at {a.tick:g} s, the service's at {b.tick:g} s"
    if len(sim.outcomes) != len(svc.outcomes):
        yield f"{len(sim.outcomes)} completions in FleetSim, {len(svc.outcomes)} in the service"
    for i, (x, y) in enumerate(zip(sim.outcomes, svc.outcomes, strict=False)):
        if x.key() != y.key():
            yield f"completion {i}: FleetSim {x}, the service {y}"
        elif abs(x.seen - y.seen) > TICK:  # simulated seconds on both sides
            yield f"completion {i} ({x.kind.value} {x.replica}): FleetSim's tick sees it at {x.seen:g} s, the service's at {y.seen:g} s"


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_fleetsim_decides_what_the_service_decides(script: Script, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same fault through FleetSim's model and through service.py's ControllerService (its tick loop, _execute,
    warm-up, drain and handlers; fakes at the edges): the same actions in the same order within a tick, the same
    outcomes."""
    sim = run_sim(script)
    svc = run_service(script, monkeypatch)
    found = list(disagreements(sim, svc))
    known = list(KNOWN.get(script.name, ()))
    assert found == known, "\n".join(
        [
            f"{script.name}: FleetSim and service.py disagree:",
            *(f"  {line}" for line in found if line not in known),
            *(f"  (known, and gone now: delete it from KNOWN) {line}" for line in known if line not in found),
            *(f"  (known) {line}" for line in known if line in found),
            _side_by_side("actions", sim.decisions, svc.decisions),
            _side_by_side("completions (at → the first tick seeing it)", sim.outcomes, svc.outcomes),
        ]
    )
    kinds = tuple(d.kind for d in svc.decisions)
    assert kinds == script.expect, f"{script.name}: the service did {kinds}, the script calls for {script.expect}"
