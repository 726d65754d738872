"""The fleet controller's state machine: pure, driven by agent reports and an injected clock.

Per node and per replica it keeps the plan's health score (:mod:`serving.runtime.score`) and decides, on each
:meth:`Controller.tick`, what the leader must do: take a replica out of rotation, migrate it (drain, restart through the
deployment backend), or readmit it after warm-up. The side effects (router membership, restarts, warm-up traffic) belong
to :mod:`serving.runtime.service`, which reports each action's outcome back with :meth:`Controller.complete`. Nothing
here reads a clock or does I/O.

Decisions (docs/runtime.md):

* A replica's effective score is ``min(replica score, node score)``. The replica score moves with its own probes; the
  node score moves per report: a failed heartbeat when more than half the node's replicas failed their probes (a
  node-wide fault), a good one otherwise.
* The node score is a node decision, carried out once per replica: a replica restarted while its node's score was out of
  the OK band is judged on its own score until the node's score is back in that band, so a node-wide fault cannot
  restart the same fresh replicas again and again (a restart storm).
* A restarted replica is *loading* until its warm-up ends: its probes (a loading SGLang does not answer ``/health``)
  move neither its score nor its node's; the warm-up, which waits up to ``serving.startup_budget_s`` for it, judges it.
  A node that reports a boot younger than the startup budget (its ``seq`` is its monotonic clock) has its replicas
  *booting*: their probes count from their first answer, or once the budget since the boot is spent. Both are read from
  what every instance sees (reports), so a reboot wave restarts nothing on any leader.
* Restarts back off: the n-th restart in a row waits ``runtime.restart_backoff_s`` × 2^(n−2) after the one before (at
  most ``runtime.restart_backoff_max_s``; kubelet's crash-loop back-off); the run of restarts ends after the replica
  served for twice the longest back-off (client-go's back-off reset). A replica restarted ``runtime.quarantine_after``
  times within ``runtime.quarantine_window_s``, whatever warm-ups passed between, is *quarantined* (systemd's start
  limit): not restarted again until it has served a whole window, named by an alert while out of rotation; it returns to
  rotation only through a passed warm-up. A live process whose warm-up requests fail after a restart is quarantined at
  once (a restart did not fix its generations).
* Restarts are a fleet-wide budget (``runtime.restart_rate_per_min``, ``runtime.restart_burst``: a token bucket, the
  node lifecycle controller's eviction rate), and none starts in a *disrupted* rack: more than 2 of its nodes, and at
  least ``runtime.disrupted_share`` of them, unhealthy (a leaf switch, a PDU, a reboot wave; Kubernetes' zone states).
  Replicas there leave rotation within the cap; when every rack is wholly unhealthy nothing is acted on (the
  controller's own view is what failed).
* Request errors alone (a router's circuit breaker open) never restart a replica: a breaker every router holds open for
  ``runtime.breaker_dwell_s`` takes it out of rotation, within the cap, unless more breakers than the cap are open at
  once (an overload, not outliers: Envoy's outlier detection ejects, never restarts). A restart needs the agent's probes
  to agree.
* Latency outliers leave rotation, within the shedding cap, and are never restarted for it (Envoy's outlier detection):
  a replica whose mean time per output token over a report (SGLang's ``sglang:request_time_per_output_token_seconds``,
  report version 3) is over ``runtime.latency_outlier_ratio`` × the fleet's median :data:`LATENCY_HITS` times within
  :data:`LATENCY_WINDOW` heartbeat intervals, is out for ``runtime.latency_ejection_s`` × its ejections in a row, then a
  warm-up readmits it.
* Missed reports do not move any score: after ``serving.failure_threshold`` intervals without a report the node is
  *suspect* and its replicas keep their rotation state. A dead agent is no evidence against replicas the router still
  reaches; the router's own health check (interval × failure threshold) removes those that are really dead.
* Eviction cap: at most ``max_evicted`` replicas out of rotation (out, migrating, warming) at once; a removal past the
  cap is refused and counted.
* A replica returns to rotation only through a passed warm-up (:attr:`Kind.READMIT`), and only once its score is at
  least ``health.readmit_at`` (hysteresis); a restarted replica starts at ``health.start``. A new process warms up for
  ``serving.warmup_duration_s``; one that kept running (out for a breaker, a partition, its score) for one heartbeat
  interval. A failed warm-up backs the next one off as restarts do.
* Every decision reads the controller's own monotonic clock (``now``): a step of its wall clock (NTP, an operator) moves
  no back-off, dwell, budget or missed report. A report's wall-clock send time only measures its node's skew against the
  controller's wall clock (``wall``). Freshness is when a report was *sent*, on the controller's clock: its ``seq`` (the
  node's monotonic clock) plus the least (receive time − ``seq``) among the node's last ``serving.failure_threshold`` +
  1 reports of this boot, the transit's floor. A report held up in transit is applied (its probes count) but is only as
  fresh as when it left the node, and counted late. The floor is a recent minimum, not an all-time one, so it follows
  what moves the two clocks apart for good (a node suspended or paused by its hypervisor: CLOCK_MONOTONIC stops; chrony
  slewing a clock that ran ahead; frequency drift) within that many reports.
* Load moves (source §4.3, "migrate when load exceeds 1.5 × the mean"): a serving replica whose weighted load is above
  ``scheduler.migration_load_ratio`` × the fleet's mean, and at least ``scheduler.shed_min_load`` in
  ``serving.failure_threshold`` reports in a row (a burst is not an overload), is *shed*: taken out of every router like
  a failing one (no restart: nothing is broken, SGLang cannot move its KV), and readmitted through the warm-up once its
  load is under half the floor. The router cannot take a weight per worker, so moving load means moving membership; per
  replica, not per node, because the router picks replicas.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence

from serving.plan.model import Replica
from serving.runtime.records import (
    _RUNNING,
    LATENCY_HITS,
    LATENCY_MAX_EJECTIONS,
    LATENCY_MIN_REPLICAS,
    LATENCY_MIN_REQUESTS,
    LATENCY_WINDOW,
    MIN_WARMUP_RATE_PER_S,
    Action,
    Budget,
    ControllerConfig,
    Counters,
    Kind,
    NodeRecord,
    ReplicaRecord,
    ReplicaState,
    Tally,
    replica_urls,
)
from serving.runtime.reports import NodeReport, Rejection, ReportRejected
from serving.runtime.score import Band, above_mean, band, may_readmit, next_score, weighted_load

__all__ = ["Action", "Controller", "ControllerConfig", "Kind", "ReplicaState", "replica_urls"]


class Controller:
    """One controller instance's view of the fleet; every instance applies every report (warm followers)."""

    def __init__(
        self,
        config: ControllerConfig,
        replicas: Sequence[Replica],
        urls: Mapping[str, str],
        now: float,
        *,
        discovered: bool = False,
    ) -> None:
        """``replicas`` from the plan; with ``discovered`` (Kubernetes: pods are placed by the scheduler, not the
        plan) the controller starts with the plan's nodes and no replica, and takes each node's replicas from its
        agent's reports (pod name and URL)."""
        self.config = config
        self.discovered = discovered
        by_node: dict[str, list[str]] = {}
        racks: dict[str, str] = {}
        for r in replicas:
            by_node.setdefault(r.node.name, []).append(r.id)
            racks[r.node.name] = r.node.rack
        self.replicas: dict[str, ReplicaRecord] = (
            {}
            if discovered
            else {r.id: ReplicaRecord(r.id, r.node.name, urls[r.id], config.health.start) for r in replicas}
        )
        self.nodes = {
            n: NodeRecord(n, config.health.start, now, () if discovered else tuple(ids), racks[n])
            for n, ids in by_node.items()
        }
        self.counters = Counters()
        self.budget = Budget(config.restart_rate_per_s, config.restart_burst, float(config.restart_burst), now)
        self.disrupted: dict[str, tuple[int, int]] = {}  # rack → (unhealthy nodes, nodes), at the last tick
        self.disrupted_at: dict[str, float] = {}  # rack → the last tick that found it disrupted
        self.breakers_held = 0  # replicas in rotation whose breaker every router held open at the last read
        self._tick_warmup_rate = MIN_WARMUP_RATE_PER_S
        self._latency_median: float | None = None  # the fleet's request seconds per token at the last tick

    # ----- reports ---------------------------------------------------------------------------------
    def receive(self, report: NodeReport, now: float, *, wall: float | None = None) -> None:
        """Apply one node's report received at ``now`` (the controller's monotonic clock), or raise
        :class:`ReportRejected` (counted, nothing applied). ``wall`` is the controller's wall clock at receipt, which
        only the node's skew reads (a caller with one clock, a simulation, passes none: ``now`` is both)."""
        try:
            self._check(report, now)
        except ReportRejected as exc:
            self.counters.rejected[exc.reason] += 1
            raise
        node = self.nodes[report.node]
        if self.discovered:
            self._sync(node, report)
        node.skew_s = report.sent_at - (now if wall is None else wall)
        self._boot(node, report, now)
        sent = self._sent(node, report, now)
        # the seconds since the node's last report of this boot, on its own monotonic clock (its requests' rate)
        last = node.last_key
        dt = (report.seq - last[1]) / 1e9 if last is not None and last[0] == report.boot_id else 0.0
        disrupted = node.rack in self.disrupted  # one fault's probes: no score moves, back when it heals (racks)
        failed = judged = 0
        for probe in report.replicas:
            rec = self.replicas[probe.id]
            rec.answered = probe.ok
            if probe.ok and rec.in_rotation and rec.booting_until is None:
                rec.fresh = False  # a booted process serving: a later failure is its own, not its start-up's
            if rec.booting_until is not None and (probe.ok or now >= rec.booting_until):
                rec.booting_until = None  # loaded, or past the startup budget: judged from here on
            if not rec.loading and rec.booting_until is None:
                # failures its frozen score does not show (outside a disrupted rack the score carries them)
                rec.failed_in_row = rec.failed_in_row + 1 if disrupted and not probe.ok else 0
                if not disrupted:
                    rec.score = next_score(rec.score, probe.ok, self.config.health)
                    rec.lowest = rec.score if rec.lowest is None else min(rec.lowest, rec.score)
                judged += 1
                failed += not probe.ok
            rec.figures = {
                "gpu_utilization": probe.gpu_utilization,
                "memory_usage": probe.memory_usage,
                "network_bandwidth": probe.network_bandwidth,
            }
            hot = weighted_load(rec.figures, self.config.weights) >= self.config.shed_min_load
            rec.hot = rec.hot + 1 if hot else 0
            if probe.ok and rec.requests_total is not None and dt > 0 and probe.requests_total >= rec.requests_total:
                rec.rate_per_s = (probe.requests_total - rec.requests_total) / dt
            if probe.ok:
                rec.requests_total = probe.requests_total
                self._per_token(rec, probe.tpot_seconds_total, probe.tpot_requests_total)
                self._stalls(rec, probe.token_gaps_over_s)
        node.failing = judged > 0 and 2 * failed > judged
        if judged and not disrupted:  # replicas the controller restarted are no evidence against their node
            node.score = next_score(node.score, 2 * failed <= judged, self.config.health)
        if band(node.score, self.config.health) is Band.OK:
            for rid in node.replicas:
                self.replicas[rid].node_forgiven = False
        node.last_key = (report.boot_id, report.seq)
        node.boots.add(report.boot_id)
        node.last_report_at = max(node.last_report_at, sent)
        node.missed = 0
        self.counters.accepted += 1
        self.counters.replicas += len(report.replicas)
        self.counters.answered += sum(probe.ok for probe in report.replicas)

    def _boot(self, node: NodeRecord, report: NodeReport, now: float) -> None:
        """A node that booted less than ``serving.startup_budget_s`` ago (its report's ``seq`` is its monotonic clock:
        the time since its boot) on a boot id not seen before: its replicas are loading their model, not failing,
        until each answers or the budget since the boot is spent. Read from the reports alone, so every instance
        agrees, and a leader handed over mid-wave restarts nothing the old one would not have."""
        if node.last_key is not None and report.boot_id == node.last_key[0]:
            return
        up_s = report.seq / 1e9
        if up_s >= self.config.startup_budget_s:
            return
        for rid in node.replicas:
            rec = self.replicas[rid]
            rec.booting_until, rec.fresh = now - up_s + self.config.startup_budget_s, True

    @staticmethod
    def _per_token(rec: ReplicaRecord, seconds: float | None, requests: float | None) -> None:
        """The mean time per output token of the requests the replica finished since its last figure, once it finished
        :data:`LATENCY_MIN_REQUESTS` more (a quiet replica's figure spans several reports); counters that went down (a
        new process) start again."""
        if seconds is None or requests is None:
            return
        if rec.tpot_at is None or requests < rec.tpot_at[1] or seconds < rec.tpot_at[0]:
            rec.tpot_at = (seconds, requests)
            return
        finished = requests - rec.tpot_at[1]
        if finished >= LATENCY_MIN_REQUESTS:
            rec.per_token_s, rec.per_token_new = (seconds - rec.tpot_at[0]) / finished, True
            rec.tpot_at = (seconds, requests)

    def _stalls(self, rec: ReplicaRecord, gaps: dict[float, float] | None) -> None:
        """The tokens the replica produced more than ``runtime.stall_gap_s`` after their request's last output since
        its last report (its figure); counters that went down (a new process) start again."""
        total = None if gaps is None else gaps.get(self.config.stall_gap_s)
        if total is None:
            return
        if rec.gaps_at is not None and total >= rec.gaps_at:
            rec.stalled, rec.stalled_new = total - rec.gaps_at, True
        rec.gaps_at = total

    def _latency_verdicts(self, now: float) -> float | None:
        """Judge what came since the last tick, once, for the replicas in rotation: a time per output token against
        ``runtime.latency_outlier_ratio`` × the median of the figures (none when fewer than
        :data:`LATENCY_MIN_REPLICAS` have one), a report's stalled tokens against the fleet's (an outlier only while
        fewer than half of the replicas with a figure stalled in their last report, and at least
        :data:`LATENCY_MIN_REPLICAS` have one, and not in a rack disrupted within :data:`LATENCY_WINDOW` intervals).
        Returns the median."""
        new = [r for r in self.replicas.values() if r.per_token_new or r.stalled_new]
        figures = [r.per_token_s for r in new if r.per_token_new and r.in_rotation and r.per_token_s is not None]
        median = statistics.median(figures) if len(figures) >= LATENCY_MIN_REPLICAS else None
        stalls = [bool(r.stalled) for r in self.replicas.values() if r.in_rotation and r.stalled is not None]
        rare = len(stalls) >= LATENCY_MIN_REPLICAS and 2 * sum(stalls) < len(stalls)
        bound = None if median is None else self.config.latency_outlier_ratio * median
        # a rack's partition or pause ends in one gap on every stream it held: that fault's, not each replica's
        recent = now - LATENCY_WINDOW * self.config.interval_s
        for rec in new:
            slow = (
                None if not rec.per_token_new or bound is None or rec.per_token_s is None else rec.per_token_s > bound
            )
            settled = self.disrupted_at.get(self.nodes[rec.node].rack, float("-inf")) < recent
            stalled = bool(rec.stalled) if rec.stalled_new and rare and settled else None
            rec.per_token_new = rec.stalled_new = False
            if rec.in_rotation and (slow is not None or stalled is not None):
                rec.slow_verdicts.add(now, bool(slow or stalled))
                self._slow(rec, now)  # and the old ones dropped
        return median

    def _slow(self, rec: ReplicaRecord, now: float) -> int:
        """The replica's outlier verdicts within the last :data:`LATENCY_WINDOW` heartbeat intervals (older ones are
        dropped: two slow figures an hour apart are no outlier)."""
        return rec.slow_verdicts.since(now - LATENCY_WINDOW * self.config.interval_s)

    def _sent(self, node: NodeRecord, report: NodeReport, now: float) -> float:
        """When ``report`` left its node, on this controller's monotonic clock: its ``seq`` (the node's monotonic
        clock) plus the least offset (receive − seq) of the node's last reports of this boot, the offset of a report
        that met no delay; a report more than an interval behind that is counted late."""
        if node.last_key is None or node.last_key[0] != report.boot_id:
            node.offsets.clear()  # a new boot: its monotonic clock started again
        node.offsets.append(now - report.seq / 1e9)
        if len(node.offsets) > self.config.missed_to_suspect + 1:
            node.offsets.popleft()
        sent = min(node.offsets) + report.seq / 1e9
        if now - sent > self.config.interval_s:
            self.counters.late += 1
        return sent

    def _sync(self, node: NodeRecord, report: NodeReport) -> None:
        """Discovered replicas: the node's report lists its pods. A new pod starts serving (the router discovered it
        Ready); a pod that moved here (LeaderWorkerSet pods keep their names) follows, with its new URL; a pod no
        longer listed is forgotten unless an action on it is still running."""
        present = {p.id: p.url for p in report.replicas if p.url}
        kept = []
        for rid in node.replicas:
            rec = self.replicas.get(rid)
            if rec is None or rec.node != node.name:
                continue  # moved away: the node it reported from holds it now
            if rid in present or rec.pending is not None:
                kept.append(rid)
            else:
                del self.replicas[rid]
        for rid, url in present.items():
            rec = self.replicas.get(rid)
            if rec is None:
                self.replicas[rid] = rec = ReplicaRecord(rid, node.name, url, self.config.health.start)
            elif rec.pending is None and (rec.node, rec.url) != (node.name, url):
                if rec.node != node.name:  # moved here: it leaves the node that listed it (O(that node's replicas))
                    old = self.nodes[rec.node]
                    old.replicas = tuple(r for r in old.replicas if r != rid)
                rec.node, rec.url = node.name, url
            if rec.node == node.name and rid not in kept:
                kept.append(rid)
        node.replicas = tuple(kept)

    def reject_malformed(self) -> None:
        """Count a body that did not parse (the service calls this; nothing else to apply)."""
        self.counters.rejected[Rejection.MALFORMED] += 1

    def _check(self, report: NodeReport, now: float) -> None:
        node = self.nodes.get(report.node)
        if node is None:
            raise ReportRejected(Rejection.UNKNOWN_NODE, f"node {report.node!r} is not in the stack's fleet")
        if node.last_key is not None:
            boot, seq = node.last_key
            if report.boot_id == boot and report.seq <= seq:
                raise ReportRejected(
                    Rejection.REPLAYED,
                    f"node {report.node!r} seq {report.seq} is not after the last applied seq {seq} of boot {boot}",
                )
            if report.boot_id != boot and report.boot_id in node.boots:
                raise ReportRejected(
                    Rejection.REPLAYED,
                    f"node {report.node!r} boot {report.boot_id} is over: the node reported since from boot {boot}",
                )
        unknown = sorted({p.id for p in report.replicas} - set(node.replicas))
        if self.discovered:
            unknown = sorted(p.id for p in report.replicas if not p.url and p.id not in node.replicas)
        if unknown:
            raise ReportRejected(Rejection.UNKNOWN_REPLICA, f"replicas {unknown} do not run on node {report.node!r}")

    # ----- decisions -------------------------------------------------------------------------------
    def effective_score(self, replica_id: str) -> int:
        rec = self.replicas[replica_id]
        return rec.score if rec.node_forgiven else min(rec.score, self.nodes[rec.node].score)

    def evicted(self) -> int:
        """Replicas out of rotation now or about to be (the eviction cap counts these)."""
        return sum(not r.in_rotation for r in self.replicas.values())

    def breakers_open(self, urls: Collection[str], now: float) -> list[str]:
        """Read before each tick: the replica URLs whose circuit breaker every router instance tracking them holds open
        (smg's ``smg_worker_cb_state`` 1: ``serving.failure_threshold`` failed requests in a row). Each replica's
        ``breaker_since`` starts at the first read that has it open and ends at the first that does not. Request errors
        alone never restart a replica, since an overload or a partition opens the breakers of healthy ones: a breaker
        held open ``runtime.breaker_dwell_s`` takes the replica out of rotation (:meth:`_breaker_due`), within the
        cap, while few are open (Envoy's outlier detection ejects, never restarts). Returns the ids whose breaker
        opened at this read."""
        opened = []
        held = 0
        for rec in self.replicas.values():
            if rec.url not in urls:
                rec.breaker_since = None
            elif rec.in_rotation:
                held += 1
                if rec.breaker_since is None:
                    rec.breaker_since = now
                    opened.append(rec.id)
        self.breakers_held = held
        return opened

    def _breaker_due(self, rec: ReplicaRecord, now: float) -> bool:
        """A breaker held open for the dwell, while the routers hold no more breakers of replicas in rotation open
        than the eviction cap (a count: replicas already out do not inflate it): when more fail at once the fault is the fleet's load or something they share (Envoy:
        no outlier when all are out), and taking them out would only move the load onto fewer."""
        return (
            rec.breaker_since is not None
            and now - rec.breaker_since >= self.config.breaker_dwell_s
            and self.breakers_held <= self.config.max_evicted
        )

    def _unhealthy(self, node: NodeRecord) -> bool:
        """For its rack's state: its agent is silent, most replicas its last report judged failed their probes, or
        the routers hold most of its replicas' breakers open and its agent has not reported since they opened. Read
        from the latest reports, not the scores, which a disrupted rack's reports do not move: the disruption ends
        with the first good reports. A breaker its agent's later report contradicts is no evidence: in smg an open
        breaker turns half-open at the first read after ``--cb-timeout-duration-secs`` and closes only after
        ``success_threshold`` requests succeed (``circuit_breaker.rs`` ``check_and_update_state_returning``,
        ``record_success``), so a healthy replica that gets little traffic reads open or half-open long after its
        fault ended (a sandbox under load kept two racks disrupted so, and a dead node there unrestarted). What this
        misses: a cut between the routers and a rack whose agents, probing on the node, keep reporting."""
        if node.suspect(self.config.missed_to_suspect) or node.failing:
            return True
        held = sum(
            rec.breaker_since is not None and rec.breaker_since >= node.last_report_at
            for rec in (self.replicas[r] for r in node.replicas)
        )
        return 2 * held > len(node.replicas) > 0

    def racks(self) -> dict[str, tuple[int, int]]:
        """Disrupted racks: rack → (unhealthy nodes, nodes). A rack is disrupted when more than 2 of its nodes are
        unhealthy and they make at least ``runtime.disrupted_share`` of it: Kubernetes' node lifecycle controller
        calls a zone so (``ComputeZoneState``: partial disruption at ``--unhealthy-zone-threshold``, full when no node
        is ready) and slows or stops its evictions there; one leaf switch, PDU or rack of reboots is one fault, and a
        restart reaches none of it or repairs nothing."""
        counts: dict[str, list[int]] = {}
        for node in self.nodes.values():
            seen = counts.setdefault(node.rack, [0, 0])
            seen[0] += self._unhealthy(node)
            seen[1] += 1
        return {
            rack: (bad, n) for rack, (bad, n) in counts.items() if bad > 2 and bad >= self.config.disrupted_share * n
        }

    def tick(self, now: float, *, acting: bool) -> list[Action]:
        """Count missed reports; when ``acting`` (the leader), the actions to take now, in place. One pass over the
        fleet: O(replicas).

        A follower (not ``acting``) decides as the leader would and takes each decision as carried out (it never sees
        the leader's actions, only the same reports): what it restarted is loading, backed off and counted towards
        quarantine as on the leader, so a hand-over changes no decision; at the hand-over the routers' lists say what
        is in rotation (:meth:`adopt`). Its counters count only what it did as the leader."""
        for node in self.nodes.values():
            node.missed = int(max(0.0, now - node.last_report_at) // self.config.interval_s)
        self.disrupted = self.racks()
        for rack in self.disrupted:
            self.disrupted_at[rack] = now
        if acting:
            return self._decisions(now)
        counters, self.counters = self.counters, Counters()
        try:
            for (
                rec
            ) in self.replicas.values():  # the leader's warm-up: passed once it has run with the replica answering
                if rec.pending is Kind.READMIT and rec.answered and now >= (rec.readmit_started or now) + rec.warm_s:
                    self.complete(Action(Kind.READMIT, rec.id, rec.url, "the leader's warm-up"), True, now=now)
            for action in self._decisions(now):
                if action.kind is not Kind.READMIT:
                    self.complete(action, True, now=now)
        finally:
            self.counters = counters
        return []

    def _decisions(self, now: float) -> list[Action]:
        if (
            self.disrupted
            and all(bad == n for bad, n in self.disrupted.values())
            and len(self.disrupted) == len({n.rack for n in self.nodes.values()})
        ):
            # every rack wholly unhealthy: what failed is this controller's view of the fleet (Kubernetes stops all
            # evictions when every zone is in full disruption); nothing is acted on until some node is healthy again
            for rec in self.replicas.values():
                rec.lowest = None
            return []
        actions = []
        loads = self.loads()
        overloaded = set(self.shed_candidates(loads))
        self._latency_median = self._latency_verdicts(now)
        self._tick_warmup_rate = self.warmup_rate()  # once a tick: a mass readmission was O(n²)
        out = Tally(
            sum(not r.in_rotation and not r.shed for r in self.replicas.values()),
            sum(not r.in_rotation and r.shed for r in self.replicas.values()),
        )
        for rec in self.replicas.values():
            self._settle(rec, now)
            # what reports said since the last tick is this tick's to decide on; skipped (its action running, a
            # drain), it is no news for the decision after
            lowest, rec.lowest = rec.lowest, None
            if rec.pending is not None:
                continue
            if self.nodes[rec.node].suspect(self.config.missed_to_suspect):
                # a silent agent is no evidence against its replicas: only the routers' breakers (below) are
                action = self._breaker_removal(rec, now, out)
            else:
                action = self._decide(rec, lowest, loads[rec.id], rec.id in overloaded, now, out)
            if action is None:
                continue
            if rec.in_rotation and action.kind is not Kind.READMIT:
                if rec.shed:
                    out.soft += 1
                else:
                    out.hard += 1
            rec.pending = action.kind
            rec.state = _RUNNING.get(action.kind, rec.state)
            self.counters.actions[action.kind] += 1
            if action.kind is Kind.MIGRATE:
                rec.restarts += 1
                rec.restarted_at = now
            elif action.kind is Kind.READMIT:
                rec.readmit_started, rec.warm_s = now, action.warmup_s
            actions.append(action)
        return actions

    def _settle(self, rec: ReplicaRecord, now: float) -> None:
        """Time in service: after twice the longest back-off serving, a replica's run of restarts is over (its back-off
        starts again); after a whole quarantine window, so are the restarts quarantine counts."""
        if not rec.in_rotation or rec.pending is not None:
            rec.serving_since = None
        elif rec.serving_since is None:
            rec.serving_since = now
        else:
            if now - rec.serving_since >= 2 * self.config.restart_backoff_max_s:
                rec.restarts = rec.ejections = 0
            if now - rec.serving_since >= self.config.quarantine_window_s:
                rec.quarantined = False  # a whole window served: it may be restarted again

    def _may_restart(self, rec: ReplicaRecord, now: float) -> bool:
        """Whether a restart may start now: not quarantined, its back-off over, its rack not disrupted, and the
        fleet-wide restart budget not spent (in that order; only a restart that starts takes from the budget). A
        replica restarted ``runtime.quarantine_after`` times within the last ``runtime.quarantine_window_s`` is put in
        quarantine (systemd's StartLimitBurst in StartLimitIntervalSec), whatever warm-ups passed in between (a
        replica that flaps passes its warm-up each time), and stays there until it has served a whole window: it
        returns to rotation through a passed warm-up, but is not restarted again before."""
        rec.restart_times = [t for t in rec.restart_times if t > now - self.config.quarantine_window_s]
        if len(rec.restart_times) >= self.config.quarantine_after and not rec.quarantined:
            self._quarantine(rec)
        if rec.quarantined:
            return False
        if rec.restarted_at is not None and now < rec.restarted_at + self.config.backoff_s(rec.restarts):
            return False
        if self.nodes[rec.node].rack in self.disrupted:
            self.counters.withheld += 1
            return False
        if not self.budget.take(now):
            self.counters.limited += 1
            return False
        return True

    def _would_stop_routing(self, rec: ReplicaRecord) -> bool:
        """In a disrupted rack, where no score moves: its probes failed in a row there as many times as would have
        taken its score (frozen where the failures before the disruption left it) below
        ``health.stop_routing_below`` outside one (one failed round, a host's hiccup, removes nothing)."""
        health = self.config.health
        return self.effective_score(rec.id) - rec.failed_in_row * health.timeout_penalty < health.stop_routing_below

    @staticmethod
    def _removal_backed_off(rec: ReplicaRecord, now: float) -> bool:
        """Its last removal failed on the routers and the back-off since has not passed."""
        return rec.remove_after is not None and now < rec.remove_after

    def _quarantine(self, rec: ReplicaRecord) -> None:
        rec.quarantined = True
        self.counters.quarantined += 1

    def _breaker_removal(self, rec: ReplicaRecord, now: float, out: Tally) -> Action | None:
        if not (rec.state is ReplicaState.SERVING and self._breaker_due(rec, now)) or self._removal_backed_off(
            rec, now
        ):
            return None
        if out.hard >= self.config.max_evicted:
            self.counters.capped += 1
            return None
        self.counters.breakers += 1
        assert rec.breaker_since is not None
        reason = (
            f"circuit breaker open on every router for {now - rec.breaker_since:.0f} s: out of rotation, not "
            "restarted (request errors alone restart nothing)"
        )
        return Action(Kind.REMOVE, rec.id, rec.url, reason)

    def _decide(
        self,
        rec: ReplicaRecord,
        lowest: int | None,
        load: float,
        overloaded: bool,
        now: float,
        out: Tally,
    ) -> Action | None:
        """On the replica's ``lowest`` score since its last decision (a dip a later report reversed counts), with the
        node's current one; ``out``: the replicas out of rotation so far, this tick's decisions included, for a
        failure (the eviction cap) and for load (a cap of their own: shedding never spends the failures')."""
        score = self.effective_score(rec.id)
        dipped = lowest is not None and lowest < score
        score = min(score, lowest) if lowest is not None else score
        where = band(score, self.config.health)
        reason = f"score {score} (replica {rec.score}, node {self.nodes[rec.node].score})"
        if dipped:
            now_at = f"replica now {rec.score}, node {self.nodes[rec.node].score}"
            reason = f"score {score}, the lowest since the last tick ({now_at})"
        rack = self.nodes[rec.node].rack
        if rack in self.disrupted and rec.state is ReplicaState.SERVING and self._would_stop_routing(rec):
            if self._removal_backed_off(rec, now):
                return None
            if out.hard >= self.config.max_evicted:
                self.counters.capped += 1
                return None
            bad, n = self.disrupted[rack]
            why = f"rack {rack} disrupted ({bad} of its {n} nodes unhealthy): out of rotation, not restarted"
            return Action(Kind.REMOVE, rec.id, rec.url, why)
        slow = self._slow(rec, now) >= LATENCY_HITS
        if (
            rec.state is ReplicaState.SERVING
            and where is Band.OK
            and (self._breaker_due(rec, now) or not (overloaded or slow))
        ):
            return self._breaker_removal(rec, now, out)
        if rec.state is ReplicaState.SERVING:
            if self._removal_backed_off(rec, now):
                return None
            if (out.soft if where is Band.OK else out.hard) >= self.config.max_evicted:
                self.counters.capped += 1
                return None
            if where is Band.OK and slow:  # healthy but slow: out for latency (Envoy's outlier ejection)
                rec.shed = rec.slow = True
                rec.ejections = min(rec.ejections + 1, LATENCY_MAX_EJECTIONS)
                rec.slow_until = now + self.config.latency_ejection_s * rec.ejections
                figure = "none" if rec.per_token_s is None else f"{rec.per_token_s * 1000:.1f} ms"
                median = "none" if self._latency_median is None else f"{self._latency_median * 1000:.1f} ms"
                stalled = "none" if rec.stalled is None else f"{rec.stalled:g}"
                reason = (
                    f"latency outlier in {self._slow(rec, now)} of its {len(rec.slow_verdicts)} verdicts of the last "
                    f"{LATENCY_WINDOW * self.config.interval_s:g} s (its time per output token "
                    f"over {self.config.latency_outlier_ratio:g}× the fleet's median, or a token more than "
                    f"{self.config.stall_gap_s:g} s after its last while most replicas had none; its last figures "
                    f"{figure} a token, the median {median}, {stalled} stalled tokens): out of rotation for "
                    f"{rec.slow_until - now:g} s, not restarted"
                )
                rec.slow_verdicts.clear()
            elif where is Band.OK and overloaded:  # healthy but overloaded: shed its load
                rec.shed = True
                reason = (
                    f"load {load:.3f} above {self.config.move_ratio:g} × the mean and {self.config.shed_min_load:g}: "
                    "shed, not failed"
                )
            kind = Kind.MIGRATE if where is Band.MIGRATE and self._may_restart(rec, now) else Kind.REMOVE
            return Action(kind, rec.id, rec.url, reason)
        if rec.state is ReplicaState.OUT:
            if where is Band.MIGRATE:
                return Action(Kind.MIGRATE, rec.id, rec.url, reason) if self._may_restart(rec, now) else None
            if rec.slow and rec.slow_until is not None and now < rec.slow_until:
                return None  # out for its latency: its ejection time is not over
            if rec.shed and load >= self.config.shed_min_load / 2:
                return None  # still loaded: stays out (hysteresis: back under half the floor)
            if rec.readmit_after is not None and now < rec.readmit_after:
                return None  # its last warm-up failed: backed off
            node = self.nodes[rec.node]
            if node.rack in self.disrupted and (rec.failed_in_row or node.suspect(self.config.missed_to_suspect)):
                return (
                    None  # its probes fail or do not come: a disrupted rack's frozen score says nothing of its return
                )
            if may_readmit(score, self.config.health):
                why = f"load {load:.3f} back under {self.config.shed_min_load / 2:g}" if rec.shed else reason
                if rec.slow:
                    why = f"latency outlier: its {self.config.latency_ejection_s * rec.ejections:g} s out are over"
                # a process restarted since it served warms up for serving.warmup_duration_s; one that kept running
                # (out for a breaker, a partition, its score) was serving moments ago: one interval's check
                warm_s = self.config.warmup_s if rec.fresh else min(self.config.warmup_s, self.config.interval_s)
                return Action(Kind.READMIT, rec.id, rec.url, why, self._tick_warmup_rate, warm_s)
        return None

    def complete(
        self,
        action: Action,
        ok: bool,
        *,
        refused: bool = False,
        restart_made: bool = True,
        answered: bool = False,
        fenced: bool = False,
        now: float | None = None,
    ) -> None:
        """The leader's report of what became of ``action``. ``refused``: a migration whose restart the deployment
        refused to start (Kubernetes: the pod's disruption budget allows none now); it backs off like a failed one
        but is no restart of the replica, so quarantine does not count it. ``restart_made`` False: a migration that
        failed before its restart reached the deployment (the leader's fencing check, the replica's removal from the
        routers or its drain failed, or the restart never reached the node): a failed action, backed off, no restart
        either. ``answered``: a failed readmission whose replica answered ``/health`` while its warm-up requests
        failed (generations fail in a live process): restarted once, quarantined if a restart already did not fix
        it. ``fenced``: the action never reached the routers (the leader's fencing check failed, its term ended): no
        failure of the routers to back off from. A removal the routers failed is asked again only after the restart
        back-off's next step (routers refusing every change were asked on every tick). ``now``: when the outcome came
        (a restart counts from when it was decided, else from then)."""
        rec = self.replicas[action.replica]
        rec.pending = None
        rec.loading = rec.loading and action.kind is not Kind.READMIT
        if refused and action.kind is Kind.MIGRATE:  # nothing failed: the back-off stands, the quarantine count not
            self.counters.refused += 1
        elif not ok:
            self.counters.failed[action.kind] += 1
        at = rec.restarted_at if rec.restarted_at is not None else now
        if action.kind is Kind.MIGRATE and restart_made and not refused and at is not None:
            rec.restart_times.append(at)  # whether it brought the replica back or not
        elif action.kind is Kind.MIGRATE:  # no restart was made: its token goes back to the fleet's budget
            self.budget.tokens = min(float(self.budget.burst), self.budget.tokens + 1.0)
        if action.kind is Kind.REMOVE:
            if ok:
                rec.failed_removals, rec.remove_after = 0, None
            elif not fenced and now is not None:
                rec.failed_removals += 1
                rec.remove_after = now + self.config.backoff_s(rec.failed_removals)
            rec.state = ReplicaState.OUT if ok else rec.state
            # what its probes said while it drained was the removal's; the next decision is on what follows
            rec.lowest = None
            rec.shed = rec.shed and ok
            rec.slow = rec.slow and ok
        elif action.kind is Kind.MIGRATE:
            rec.state = ReplicaState.OUT
            if ok:  # a fresh process: its own history starts again, warm-up still stands between it and clients
                rec.score, rec.lowest = self.config.health.start, None
                rec.requests_total = rec.tpot_at = rec.gaps_at = rec.stalled = None
                rec.shed = rec.slow = False
                rec.slow_verdicts.clear()  # a new process: what the old one did is no evidence against it
                rec.loading = rec.fresh = True
                rec.node_forgiven = band(self.nodes[rec.node].score, self.config.health) is not Band.OK
        elif ok:
            rec.state = ReplicaState.SERVING
            rec.shed = rec.slow = False
            rec.fresh = False
            rec.failed_warmups, rec.readmit_after = 0, None
        else:  # failed warm-up: backed off; earn the hysteresis margin again, or restart a live process that fails
            rec.state = ReplicaState.OUT
            rec.failed_warmups += 1
            started = rec.readmit_started if rec.readmit_started is not None else now
            if started is not None:
                rec.readmit_after = started + self.config.backoff_s(rec.failed_warmups)
            if not answered:
                rec.score = min(rec.score, self.config.health.stop_routing_below - 1)
            elif rec.fresh:  # a restart (or its node's reboot) did not fix its generations: another will not
                if not rec.quarantined:
                    self._quarantine(rec)
            else:  # the controller's own requests failed: agreement enough for one restart
                rec.score = min(rec.score, self.config.health.migrate_below - 1)

    def adopt(self, registered: Iterable[str]) -> None:
        """A new leader's start: what every router lists is in rotation, anything else is out. A follower's score of a
        replica the routers route may be stale: the old leader restarted and readmitted it (resetting its score) and
        followers never see actions, only reports, so the new leader would take a freshly readmitted replica out on
        its first tick. The routers are the truth: a routed replica starts at least at ``health.readmit_at`` (its own
        probes take it out again if it fails)."""
        on_routers = set(registered)
        for rec in self.replicas.values():
            rec.pending = None
            rec.state = ReplicaState.SERVING if rec.url in on_routers else ReplicaState.OUT
            if rec.state is ReplicaState.SERVING:
                rec.score, rec.lowest = max(rec.score, self.config.health.readmit_at), None
                # routed: it serves, whatever this instance took as the old leader's restart of it (a follower's
                # decisions are taken as done: a restart that never happened would leave its probes unjudged)
                rec.loading = False

    # ----- load ------------------------------------------------------------------------------------
    def loads(self) -> dict[str, float]:
        """Weighted load per replica from the latest reports (0.5 GPU + 0.3 memory + 0.2 network)."""
        return {rid: weighted_load(rec.figures, self.config.weights) for rid, rec in self.replicas.items()}

    def node_loads(self) -> dict[str, float]:
        loads = self.loads()
        return {
            n: sum(loads[r] for r in node.replicas) / len(node.replicas)
            for n, node in self.nodes.items()
            if node.replicas
        }

    def shed_candidates(self, loads: Mapping[str, float] | None = None) -> list[str]:
        """Serving replicas whose weighted load is above ``move_ratio`` × the mean of the replicas in rotation, and
        at or above the floor in ``shed_after`` reports in a row, most loaded first. The mean is the serving
        replicas': one out of rotation carries no traffic by design (an idle figure, or a silent node's last one),
        so counting it would lower the mean exactly when capacity is lost: a rack out (16 of 256 nodes) makes 1.5 ×
        the mean 1.41 × the serving replicas' mean, and the load they took over could shed healthy ones in a
        cascade."""
        loads = self.loads() if loads is None else loads
        serving = {rid: load for rid, load in loads.items() if self.replicas[rid].in_rotation}
        return [
            rid
            for rid in above_mean(serving, self.config.move_ratio)
            if self.replicas[rid].hot >= self.config.shed_after
        ]

    def move_candidates(self) -> list[str]:
        """The most loaded serving replica of each node above ``move_ratio`` × the mean node load: what to
        drain first when load must move."""
        loads = self.loads()
        out = []
        for name in above_mean(self.node_loads(), self.config.move_ratio):
            serving = [r for r in self.nodes[name].replicas if self.replicas[r].in_rotation]
            if serving:
                out.append(max(serving, key=lambda r: loads[r]))
        return out

    def warmup_rate(self) -> float:
        """Warm-up traffic: ``serving.warmup_share`` of the mean per-replica request rate (at least 1/s)."""
        rates = [r.rate_per_s for r in self.replicas.values() if r.in_rotation]
        mean = sum(rates) / len(rates) if rates else 0.0
        return max(MIN_WARMUP_RATE_PER_S, self.config.warmup_share * mean)

    # ----- status ----------------------------------------------------------------------------------
    def node_state(self, name: str) -> str:
        node = self.nodes[name]
        return "suspect" if node.suspect(self.config.missed_to_suspect) else band(node.score, self.config.health).value

    def replica_state(self, replica_id: str) -> str:
        rec = self.replicas[replica_id]
        if rec.pending is Kind.REMOVE:
            return "removing"
        if rec.slow and rec.state is ReplicaState.OUT:
            return "slow"
        if rec.shed and rec.state is ReplicaState.OUT:
            return "shed"
        if rec.quarantined and rec.state is ReplicaState.OUT:
            return "quarantined"
        if self.nodes[rec.node].suspect(self.config.missed_to_suspect):
            return f"suspect/{rec.state.value}"
        return rec.state.value

    def snapshot(self, now: float) -> dict[str, object]:
        """``nodes`` and ``replicas`` as ``exaserve status --json`` shows them."""
        loads = self.loads()
        return {
            "nodes": [
                {
                    "name": n.name,
                    "score": n.score,
                    "state": self.node_state(n.name),
                    "last_report_s": round(now - n.last_report_at, 3) if n.last_key is not None else None,
                    "rack": n.rack,
                    "clock_skew_s": None if n.skew_s is None else round(n.skew_s, 3),
                }
                for n in self.nodes.values()
            ],
            "replicas": [
                {
                    "id": r.id,
                    "node": r.node,
                    "url": r.url,
                    "state": self.replica_state(r.id),
                    "score": r.score,
                    "in_rotation": r.in_rotation,
                    "load": round(loads[r.id], 4),
                    "restarts": r.restarts,
                    "restarts_in_window": sum(t > now - self.config.quarantine_window_s for t in r.restart_times),
                    "quarantined": r.quarantined,
                    "booting": r.booting_until is not None,
                    "loading": r.loading,
                }
                for r in self.replicas.values()
            ],
        }
