"""The window statistics the gates judge: every router instance and each replica read twice, and what happened
between the two reads per replica, per group and router-wide — pure.

Per-replica figures, and where each comes from (names from smg 1.13's
``model_gateway/src/observability/metrics.rs``, read live from the real smg in the sandbox tests, and the SGLang
server's ``/metrics``):

* **Every router instance**: the fleet runs ``scheduler.instances`` routers and each sees only its share of the
  clients, so every figure below that comes from a router is read from EVERY instance and summed
  (:class:`RouterReading`, :func:`window_stats`). An instance that cannot be read stops the read (the runner
  retries, then pauses): a window is never judged on part of the routers. One that went, came or restarted
  between a window's two reads makes the window no measurement (:func:`window_break`); it is measured again.
* **Requests and errors per replica**: the router's ``smg_worker_cb_outcomes_total{worker, outcome}``, one
  count per upstream attempt, ``success`` or ``failure`` (HTTP 5xx, refused or cut connections — the
  circuit breaker's own tally; the fleet's router runs with its breaker on, see ``--cb-failure-threshold``).
  It is the one per-worker error signal there is: the router's retries (5 by default) hide a failing worker
  from clients, ``smg_worker_retries_total`` and ``smg_router_upstream_responses_total`` are not per
  worker, and a worker cannot count the connections it refused (a crashed worker counts nothing at all).
  Successes per replica and second, divided by the group's replicas, is the group's **QPS per replica**.
* **Latency per replica**: the worker's own ``sglang:e2e_request_latency_seconds`` histogram (smg
  has no per-worker latency). SGLang's default buckets (0.1, 0.2, 0.4 … s) cannot show a 30 % rise
  inside one bucket; the fleet renders ``--bucket-e2e-request-latency`` with the router's geometric
  buckets (:func:`serving.render.common.duration_buckets`), so the group's **P99** resolves the gate.
* **Down**: the worker's ``/metrics`` does not answer, its counters went back (it restarted), the router
  marks it unhealthy (``smg_worker_health``) or its circuit breaker is open (``smg_worker_cb_state`` 1).

A window in which a router instance's counters went *down* spans its restart: it is not a measurement and
:func:`window_stats` returns None so the caller measures again.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from serving.rollout.kvpool import KV_POOL_METRICS, KvReading
from serving.router import INFERENCE_PATHS
from serving.router.client import (
    CIRCUIT_OPEN,
    ROUTER_RESPONSES,
    ROUTER_UPSTREAM_RESPONSES,
    ROUTER_WORKER_CB_STATE,
    ROUTER_WORKER_HEALTH,
    ROUTER_WORKER_RETRIES,
    WORKER_E2E_LATENCY,
    HistogramSnapshot,
    MetricsSnapshot,
    Sample,
)
from serving.stats import MEDIAN, P99

ROUTER_INFERENCE_REQUESTS = "smg_router_requests_total"
ROUTER_INFERENCE_DURATION = "smg_router_request_duration_seconds"
ROUTER_WORKER_OUTCOMES = "smg_worker_cb_outcomes_total"  # {worker, outcome="success"|"failure"}, per upstream attempt

ROUTER_GATE_METRICS = (
    ROUTER_INFERENCE_REQUESTS,
    ROUTER_RESPONSES,
    ROUTER_UPSTREAM_RESPONSES,
    ROUTER_WORKER_RETRIES,
    ROUTER_INFERENCE_DURATION,
    ROUTER_WORKER_OUTCOMES,
    ROUTER_WORKER_HEALTH,
    ROUTER_WORKER_CB_STATE,
)
WORKER_HTTP_RESPONSES = "sglang:http_responses_total"  # {endpoint, status_code, method}: SGLang's HTTP middleware
WORKER_GATE_METRICS = (WORKER_E2E_LATENCY, WORKER_HTTP_RESPONSES, *KV_POOL_METRICS)


def _is_error(status: str) -> bool:
    """A client got no answer: a 5xx, a 408 or a 429 (smg retries these and charges the breaker a 408's failure,
    worker/resilience.rs; SGLang and smg refuse load with a 429). A stream that broke off mid-body is not here: smg
    ends it with an error event and [DONE], a clean end its metrics count as a 200 with no error code
    (routers/http/router.rs; middleware/metrics.rs ``TrackedBody``); the worker's breaker counts it a failure."""
    return status.startswith("5") or status in ("408", "429")


def _is_refused(status: str) -> bool:
    """A request the worker refused with a 4xx: SGLang's 400 for one it cannot serve (its context, its parser, its
    template). 408 and 429 are load, not refusals."""
    return status.startswith("4") and status not in ("408", "429")


def _refusals(snap: MetricsSnapshot) -> tuple[float, float]:
    """(answered, refused) on the generation routes from the worker's own ``sglang:http_responses_total{endpoint,
    status_code, method}`` (SGLang's HTTP middleware, on with ``--enable-metrics``: the status at the response's
    head); (0, 0) before its first answer (a labelled family has no sample until then). smg counts a worker's 4xx as
    the worker's success and passes it through (worker/resilience.rs), so this is the one per-replica figure of the
    requests a release refuses."""
    samples = [s for s in snap.select(WORKER_HTTP_RESPONSES) if s.labels.get("endpoint") in INFERENCE_PATHS]
    answered = sum(s.value for s in samples)
    return answered, sum(s.value for s in samples if _is_refused(s.labels.get("status_code", "")))


@dataclass(frozen=True)
class Counters:
    """The cumulative router-wide counters, read from one scrape."""

    requests: float
    client_errors: float
    upstream_responses: float
    upstream_errors: float
    retries: float
    duration: HistogramSnapshot

    @classmethod
    def read(cls, snap: MetricsSnapshot) -> Counters:
        answers = [
            (s.labels.get("status_code", ""), s.value)
            for s in snap.select(ROUTER_RESPONSES)
            if s.labels.get("path") in INFERENCE_PATHS
        ]
        upstream = snap.by_label(ROUTER_UPSTREAM_RESPONSES, "status_code")
        return cls(
            requests=snap.value(ROUTER_INFERENCE_REQUESTS),
            client_errors=sum(n for code, n in answers if _is_error(code)),
            upstream_responses=sum(upstream.values()),
            upstream_errors=sum(n for code, n in upstream.items() if code.startswith("5")),
            retries=snap.value(ROUTER_WORKER_RETRIES),
            duration=snap.histogram(ROUTER_INFERENCE_DURATION),
        )


# ----------------------------------------------------------------------------------------- per replica


@dataclass(frozen=True)
class RouterReading:
    """One router instance at one instant: its router-wide counters and, per worker URL, its cumulative upstream
    outcomes and whether it marks the worker unhealthy or holds its circuit breaker open."""

    counters: Counters
    outcomes: Mapping[str, tuple[float, float]] = field(default_factory=dict)  # worker URL → (successes, failures)
    unhealthy: frozenset[str] = frozenset()
    circuit_open: frozenset[str] = frozenset()

    @classmethod
    def read(cls, snap: MetricsSnapshot, workers: Sequence[str]) -> RouterReading:
        outcomes, health, breaker = (
            snap.grouped(name, "worker")
            for name in (ROUTER_WORKER_OUTCOMES, ROUTER_WORKER_HEALTH, ROUTER_WORKER_CB_STATE)
        )

        def outcome(samples: list[Sample], which: str) -> float:
            return sum(s.value for s in samples if s.labels.get("outcome") == which)

        return cls(
            counters=Counters.read(snap),
            outcomes={
                u: (outcome(outcomes[u], "success"), outcome(outcomes[u], "failure")) for u in workers if u in outcomes
            },
            unhealthy=frozenset(u for u in workers if u in health and health[u][0].value < 1),
            circuit_open=frozenset(u for u in workers if sum(s.value for s in breaker.get(u, ())) == CIRCUIT_OPEN),
        )


def window_break(before: Mapping[str, RouterReading], after: Mapping[str, RouterReading]) -> str | None:
    """Why two reads of every router instance do not bound a measurement (None: they do): the instances are not the
    same ones (one went or came: each sees only its share of the traffic), or one's counters — router-wide or per
    worker — went down (it restarted)."""
    if set(before) != set(after):
        gone, new = sorted(set(before) - set(after)), sorted(set(after) - set(before))
        return (
            "router instances changed during the window"
            + (f": gone {', '.join(gone)}" if gone else "")
            + (f"; new {', '.join(new)}" if new else "")
        )
    for router in sorted(after):
        b, a = before[router], after[router]
        if _counters_delta(b.counters, a.counters) is None or any(
            now < then
            for u, pair in b.outcomes.items()
            if u in a.outcomes
            for now, then in zip(a.outcomes[u], pair, strict=True)
        ):  # a worker's series missing now is one the instance dropped with the worker, not a restart
            return f"router {router} restarted during the window (its counters went back)"
    return None


@dataclass(frozen=True)
class ReplicaReading:
    """One replica at one instant: the counts of every router instance for it, summed, and, when scraped, its own
    latency histogram. ``healthy``: no instance marks it unhealthy; ``circuit_open``: one holds its breaker open.

    ``worker`` is ``"scraped"``, ``"not scraped"`` (a router-only reading) or why its ``/metrics`` did not answer.
    """

    successes: float
    failures: float
    healthy: bool
    circuit_open: bool
    latency: HistogramSnapshot | None
    worker: str = "scraped"
    kv: KvReading | None = None  # the KV pool the replica exports (serving.rollout.kvpool), when scraped
    refusals: tuple[float, float] | None = None  # (answered, refused) on the generation routes (:func:`_refusals`)

    @classmethod
    def read(
        cls, routers: Mapping[str, RouterReading], url: str, worker: MetricsSnapshot | str | None
    ) -> ReplicaReading:
        """``routers``: every instance's reading (sums are exact only over a window :func:`window_break` accepts);
        ``worker``: the replica's ``/metrics`` scrape, why it failed, or None when it was not scraped."""
        latency = worker.histogram(WORKER_E2E_LATENCY) if isinstance(worker, MetricsSnapshot) else None
        return cls(
            successes=sum(r.outcomes.get(url, (0.0, 0.0))[0] for r in routers.values()),
            failures=sum(r.outcomes.get(url, (0.0, 0.0))[1] for r in routers.values()),
            healthy=not any(url in r.unhealthy for r in routers.values()),
            circuit_open=any(url in r.circuit_open for r in routers.values()),
            latency=latency if latency is not None and latency.buckets else None,
            worker="not scraped" if worker is None else worker if isinstance(worker, str) else "scraped",
            kv=KvReading.read(worker) if isinstance(worker, MetricsSnapshot) else None,
            refusals=_refusals(worker) if isinstance(worker, MetricsSnapshot) else None,
        )


@dataclass(frozen=True)
class ReplicaWindow:
    """One replica between two readings: upstream attempts the router made to it, its latency histogram over the
    window (None: not measured), and why it counts as down (empty: it does not)."""

    successes: float
    failures: float
    latency: HistogramSnapshot | None
    problems: tuple[str, ...] = ()
    refusals: tuple[float, float] | None = None  # (answered, refused) by the worker itself; None: not measured

    @property
    def requests(self) -> float:
        return self.successes + self.failures

    @property
    def error_rate(self) -> float:
        return self.failures / self.requests if self.requests else 0.0


def replica_window(before: ReplicaReading, after: ReplicaReading) -> ReplicaWindow:
    problems: list[str] = []
    if after.worker not in ("scraped", "not scraped"):
        problems.append(f"its /metrics does not answer ({after.worker})")
    latency: HistogramSnapshot | None = None
    if before.latency is not None and after.latency is not None:
        if after.latency.count < before.latency.count:
            problems.append("it restarted during the window (its counters went back)")
        else:
            latency = after.latency - before.latency
    refusals = None
    if before.refusals is not None and after.refusals is not None:
        answered, refused = (a - b for a, b in zip(after.refusals, before.refusals, strict=True))
        refusals = (answered, refused) if answered >= 0 and refused >= 0 else None  # a restart: not measured
    if not after.healthy:
        problems.append("the router marks it unhealthy")
    if after.circuit_open:
        problems.append("the router's circuit breaker for it is open")
    return ReplicaWindow(
        successes=max(0.0, after.successes - before.successes),
        failures=max(0.0, after.failures - before.failures),
        latency=latency,
        problems=tuple(problems),
        refusals=refusals,
    )


def replica_windows(
    before: Mapping[str, ReplicaReading], after: Mapping[str, ReplicaReading]
) -> dict[str, ReplicaWindow]:
    return {r: replica_window(before[r], after[r]) for r in after if r in before}


def merge_histograms(histograms: Iterable[HistogramSnapshot | None]) -> HistogramSnapshot | None:
    """The histograms summed bucket by bucket; None when none of them was measured."""
    buckets: dict[float, float] = {}
    count = total = 0.0
    seen = False
    for h in histograms:
        if h is None:
            continue
        seen = True
        for le, n in h.buckets:
            buckets[le] = buckets.get(le, 0.0) + n
        count, total = count + h.count, total + h.sum
    return HistogramSnapshot(tuple(sorted(buckets.items())), count, total) if seen else None


def _quantile(h: HistogramSnapshot | None, q: float) -> float | None:
    if h is None or h.count <= 0:
        return None
    value = h.quantile(q)
    return None if math.isnan(value) else value


def p99_of(h: HistogramSnapshot | None) -> float | None:
    """The histogram's P99; None when it has none (no observation)."""
    return _quantile(h, P99)


def median_of(h: HistogramSnapshot | None) -> float | None:
    """The histogram's median; None when it has none (no observation)."""
    return _quantile(h, MEDIAN)


# ----------------------------------------------------------------------------------------- groups


@dataclass(frozen=True)
class GroupStats:
    """One group's figures over a window, as reported: replicas measured, upstream attempts and failures (router,
    per worker), P99 and median of its workers' merged latency histograms; ``excluded`` names members left out and
    why. ``median_s`` is None in journals written before it was kept."""

    replicas: tuple[str, ...]
    seconds: float
    requests: float
    errors: float
    p99_s: float | None
    excluded: Mapping[str, str] = field(default_factory=dict)
    median_s: float | None = None
    timed: float | None = None  # requests in the merged latency histogram (None: journals written before it)

    @property
    def successes(self) -> float:
        return self.requests - self.errors

    @property
    def timed_requests(self) -> float:
        """The requests the P99 and median are of: the merged histogram's count (a member without a histogram
        counts in ``requests`` only); an older journal's successes, none where it has no P99."""
        if self.timed is not None:
            return self.timed
        return self.successes if self.p99_s is not None else 0.0

    @property
    def replica_seconds(self) -> float:
        return len(self.replicas) * self.seconds

    @property
    def qps_per_replica(self) -> float:
        return self.successes / self.replica_seconds if self.replica_seconds > 0 else 0.0

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "replicas": list(self.replicas),
            "qps_per_replica": self.qps_per_replica,
            "p99_s": self.p99_s,
            "median_s": self.median_s,
            "timed": self.timed,
            "error_rate": self.error_rate,
            "requests": self.requests,
            "errors": self.errors,
            "seconds": self.seconds,
            "excluded": dict(self.excluded),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GroupStats:
        return cls(
            replicas=tuple(data["replicas"]),
            seconds=float(data["seconds"]),
            requests=float(data["requests"]),
            errors=float(data["errors"]),
            p99_s=data["p99_s"],
            excluded=dict(data.get("excluded", {})),
            median_s=data.get("median_s"),
            timed=data.get("timed"),
        )


def group_stats(
    windows: Mapping[str, ReplicaWindow], seconds: float, excluded: Mapping[str, str] | None = None
) -> GroupStats:
    """The figures of ``windows``' replicas (those in ``excluded`` left out, named with the reason)."""
    excluded = dict(excluded or {})
    members = {r: w for r, w in windows.items() if r not in excluded}
    latency = merge_histograms(w.latency for w in members.values())
    return GroupStats(
        replicas=tuple(sorted(members)),
        seconds=seconds,
        requests=sum(w.requests for w in members.values()),
        errors=sum(w.failures for w in members.values()),
        p99_s=p99_of(latency),
        excluded=excluded,
        median_s=median_of(latency),
        timed=latency.count if latency is not None else 0.0,
    )


@dataclass(frozen=True)
class WindowStats:
    """Router-wide traffic between two scrapes (what clients got); ``replicas``: the same window per replica (the
    pre-rollout baseline keeps it, the reference of a single-batch rollout)."""

    seconds: float
    requests: float
    client_errors: float
    upstream_responses: float
    upstream_errors: float
    retries: float
    p99_s: float | None
    replicas: GroupStats | None = None

    @property
    def qps(self) -> float:
        return max(0.0, self.requests - self.client_errors) / self.seconds if self.seconds > 0 else 0.0

    @property
    def client_error_rate(self) -> float:
        return self.client_errors / self.requests if self.requests else 0.0

    @property
    def upstream_error_rate(self) -> float:
        return self.upstream_errors / self.upstream_responses if self.upstream_responses else 0.0

    @property
    def error_rate(self) -> float:
        return max(self.client_error_rate, self.upstream_error_rate)

    def to_json(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "requests": self.requests,
            "client_errors": self.client_errors,
            "upstream_responses": self.upstream_responses,
            "upstream_errors": self.upstream_errors,
            "retries": self.retries,
            "p99_s": self.p99_s,
            "replicas": self.replicas.to_json() if self.replicas else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WindowStats:
        replicas = data.get("replicas")
        known = {f.name for f in fields(cls)} - {"replicas"}  # a newer journal's figures this version does not judge
        return cls(
            **{k: v for k, v in data.items() if k in known},
            replicas=GroupStats.from_json(replicas) if replicas else None,
        )


def _counters_delta(before: Counters, after: Counters) -> Counters | None:
    """One instance's counts between two reads; None if any counter went down (the instance restarted)."""
    pairs = [
        (before.requests, after.requests),
        (before.client_errors, after.client_errors),
        (before.upstream_responses, after.upstream_responses),
        (before.retries, after.retries),
    ]
    duration = after.duration - before.duration
    if any(b > a for b, a in pairs) or any(n < 0 for _, n in duration.buckets):
        return None
    return Counters(
        requests=after.requests - before.requests,
        client_errors=after.client_errors - before.client_errors,
        upstream_responses=after.upstream_responses - before.upstream_responses,
        upstream_errors=after.upstream_errors - before.upstream_errors,
        retries=after.retries - before.retries,
        duration=duration,
    )


def window_stats(
    before: Mapping[str, RouterReading], after: Mapping[str, RouterReading], seconds: float
) -> WindowStats | None:
    """Traffic between two reads of every router instance, each instance's counts summed (each instance sees only
    its share of the clients); None when :func:`window_break` finds a reason (an instance went, came or restarted)."""
    if window_break(before, after) is not None:
        return None
    deltas = [d for r in sorted(after) if (d := _counters_delta(before[r].counters, after[r].counters)) is not None]
    return WindowStats(
        seconds=seconds,
        requests=sum(d.requests for d in deltas),
        client_errors=sum(d.client_errors for d in deltas),
        upstream_responses=sum(d.upstream_responses for d in deltas),
        upstream_errors=sum(d.upstream_errors for d in deltas),
        retries=sum(d.retries for d in deltas),
        p99_s=p99_of(merge_histograms(d.duration for d in deltas)),
    )
