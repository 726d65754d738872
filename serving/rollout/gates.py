"""Gate arithmetic: each batch (the canary) judged against replicas that were not updated, over the same window — pure.

Why the same window. Comparing the fleet after a batch with the fleet before the rollout blames the new
version for everything that happens meanwhile: a replica outside the batch failing, a traffic dip, a slow
hour. Kayenta and Argo Rollouts' analysis compare a canary with a baseline *running at the same time*; so
does :func:`judge`. The thresholds stay the source's (§ 4.4): QPS −20 %, P99 +30 %, errors 0.1 %.

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

The groups (the runner picks them from the rollout's state): the **canary** is the batch being soaked. Its
**baseline** is, in order of preference: the replicas *not yet updated* (the old version, same window);
for the last batch, where none remain, the replicas *updated earlier* whose batches already passed (same
window; they were themselves judged against the old version, so a regression of the release was caught
then and what is left to catch is one confined to this batch); for a single-batch rollout, where nobody
else runs at all, the *pre-rollout* per-replica figures of the baseline window.

The verdict (:class:`Verdict`):

* **rollback** — a breach confined to the canary: its QPS per replica more than 20 % under the baseline's,
  its P99 (or its median: the whole distribution) more than 30 % over the baseline's, its error rate over 0.1 %,
  or a canary replica down.
* **pause** — evidence outside the batch, naming the replicas: a replica outside the canary down, failing
  more than 0.1 % of its requests, or slower than its peers beyond the P99 limit; clients getting errors that no replica's failures explain; or traffic so thin that the batch
  cannot be judged although the baseline window saw enough. A pause never rolls the new version back;
  the operator fixes the fleet and resumes (the soak runs again), or rolls back.
* **pass** — otherwise. Weather that hits canary and baseline alike (a traffic dip, a fleet-wide slowdown
  since the rollout began) does not change a same-window comparison; the verdict names it as context.

Small groups make noisy figures: a replica that served 50 requests has a "P99" that is its slowest one,
and the router's own split of traffic is uneven (see :func:`qps_check`). A relative finding (QPS or P99)
therefore needs both the size the source sets *and* significance: for QPS the test of the canary's share
of successes with the variance the peers' own spread shows, for P99 the exact test of how many of its requests
were slower than 1.3 × the baseline's P99 (more than 1 % is a P99 over the limit; beta-binomial, so that the
baseline's own count counts: :mod:`serving.stats`), and the same on the median for a shift of the whole
distribution (more than half over 1.3 × the baseline's median: see :func:`p99_check`; stricter than the source,
which judges the P99 only); all relative
tests of one verdict together have a 0.1 % chance of a false finding (:data:`FAMILY_ALPHA`, Bonferroni). The error gate stays strict, as
the source wrote it. A window in which a router instance's counters went *down* spans its restart: it is not a
measurement and :func:`window_stats` returns None so the caller measures again.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from serving.rollout.kvpool import KV_POOL_METRICS, KvCheck, KvReading
from serving.rollout.plan import GateLimits
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
from serving.stats import MEDIAN, P99, p_slower_than_reference

ROUTER_INFERENCE_REQUESTS = "smg_router_requests_total"
ROUTER_INFERENCE_DURATION = "smg_router_request_duration_seconds"
ROUTER_WORKER_OUTCOMES = "smg_worker_cb_outcomes_total"  # {worker, outcome="success"|"failure"}, per upstream attempt
MIN_REQUESTS = 20  # fewer than this expected: QPS and P99 are not evaluated
FAMILY_ALPHA = 0.001  # chance that any relative finding of one verdict is due to chance alone

Basis = Literal["not-updated", "updated", "pre-rollout"]
Decision = Literal["pass", "rollback", "pause"]
BASIS_WORDS: Mapping[Basis, str] = {
    "not-updated": "the replicas not yet updated, same window",
    "updated": "the replicas updated in earlier batches, which passed, same window (none is left on the old version)",
    "pre-rollout": "the fleet's per-replica figures before the rollout (no other replica runs now)",
}


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
WORKER_GATE_METRICS = (WORKER_E2E_LATENCY, *KV_POOL_METRICS)


def _is_error(status: str) -> bool:
    return status.startswith("5") or status == "429"


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
        responses = snap.by_label(ROUTER_RESPONSES, "status_code")
        upstream = snap.by_label(ROUTER_UPSTREAM_RESPONSES, "status_code")
        return cls(
            requests=snap.value(ROUTER_INFERENCE_REQUESTS),
            client_errors=sum(n for code, n in responses.items() if _is_error(code)),
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
        )


@dataclass(frozen=True)
class ReplicaWindow:
    """One replica between two readings: upstream attempts the router made to it, its latency histogram over the
    window (None: not measured), and why it counts as down (empty: it does not)."""

    successes: float
    failures: float
    latency: HistogramSnapshot | None
    problems: tuple[str, ...] = ()

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
    if not after.healthy:
        problems.append("the router marks it unhealthy")
    if after.circuit_open:
        problems.append("the router's circuit breaker for it is open")
    return ReplicaWindow(
        successes=max(0.0, after.successes - before.successes),
        failures=max(0.0, after.failures - before.failures),
        latency=latency,
        problems=tuple(problems),
    )


def replica_windows(
    before: Mapping[str, ReplicaReading], after: Mapping[str, ReplicaReading]
) -> dict[str, ReplicaWindow]:
    return {r: replica_window(before[r], after[r]) for r in after if r in before}


def _merge(histograms: Iterable[HistogramSnapshot | None]) -> HistogramSnapshot | None:
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


def _p99(h: HistogramSnapshot | None) -> float | None:
    return _quantile(h, P99)


def _median(h: HistogramSnapshot | None) -> float | None:
    return _quantile(h, MEDIAN)


def _rank(q: float, count: float) -> int:
    """The order statistic a histogram's ``q``-quantile of ``count`` observations stands for: it is read at rank q·n,
    between the ⌊q·n⌋-th and the next, and the lower one makes the latency test err towards no finding. Within a
    bucket (10 % wide in the rendered layout) the value is interpolated, as if its observations were spread evenly:
    for a latency tighter than a bucket that reading, not the sample, is the error (the +30 % limit moves by a few
    per cent either way)."""
    return math.floor(q * count + 1e-9)


def _slower_than(h: HistogramSnapshot, bound_s: float) -> float:
    """Observations above ``bound_s`` (linear inside the bucket holding it, as ``histogram_quantile`` reads it)."""
    lower, below = 0.0, 0.0
    for le, n in h.buckets:
        if bound_s <= le:
            if math.isinf(le) or n == below:
                return max(0.0, h.buckets[-1][1] - below)
            under = below + (n - below) * (bound_s - lower) / (le - lower)
            return max(0.0, h.buckets[-1][1] - under)
        lower, below = le, n
    return 0.0


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
    latency = _merge(w.latency for w in members.values())
    return GroupStats(
        replicas=tuple(sorted(members)),
        seconds=seconds,
        requests=sum(w.requests for w in members.values()),
        errors=sum(w.failures for w in members.values()),
        p99_s=_p99(latency),
        excluded=excluded,
        median_s=_median(latency),
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
        return cls(
            **{k: v for k, v in data.items() if k != "replicas"},
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
        p99_s=_p99(_merge(d.duration for d in deltas)),
    )


# ----------------------------------------------------------------------------------------- comparisons


@dataclass(frozen=True)
class Finding:
    """One piece of evidence: the gate (``qps``, ``p99``, ``errors``, ``down``, ``clients``, ``traffic``), the
    replicas it is about, and the sentence the verdict shows."""

    gate: str
    replicas: tuple[str, ...]
    text: str


def qps_check(
    name: str,
    members: Sequence[str],
    windows: Mapping[str, ReplicaWindow],
    seconds: float,
    reference: GroupStats,
    limits: GateLimits,
    alpha: float,
    dispersion: float,
) -> tuple[float | None, Finding | None]:
    """QPS per replica of ``members`` against ``reference``: the drop (None: too little traffic to evaluate) and a
    finding when it is past the limit *and* p < ``alpha``. Every member counts: a replica that serves nothing is
    the point.

    The test is the conditional test of two Poisson rates, in its normal form with the variance times
    ``dispersion`` — how much more the other replicas' counts vary than chance (quasi-Poisson): the router splits
    traffic unevenly by itself (``power_of_two`` compares loads it polls once per heartbeat — 5 s in the sandbox,
    longer than its soak — so a replica that looked busy at the poll gets little until the next one; seen live:
    healthy replicas at a third to half of their peers' rate for a whole 4 s window). For the same reason one
    replica outside the batch is never judged on its share: that is the router's choice, not evidence about the
    replica (a replica that is down, failing or slow says so in its own figures)."""
    successes = sum(windows[r].successes for r in members)
    exposure = len(members) * seconds
    ref_rate = reference.qps_per_replica
    if reference.successes < MIN_REQUESTS or ref_rate * exposure < MIN_REQUESTS:
        return None, None
    rate = successes / exposure
    drop = (ref_rate - rate) / ref_rate
    share = exposure / (exposure + reference.replica_seconds)
    total = successes + reference.successes
    p = 0.5 * math.erfc((total * share - successes) / math.sqrt(2 * total * share * (1 - share) * dispersion))
    if drop <= limits.max_qps_drop or p >= alpha:
        return drop, None
    text = (
        f"{name} QPS per replica {rate:.2f}/s vs {ref_rate:.2f}/s: {drop:.1%} lower > {limits.max_qps_drop:.0%} "
        f"(p = {p:.1g})"
    )
    return drop, Finding("qps", tuple(members), text)


def p99_check(
    name: str,
    members: Sequence[str],
    windows: Mapping[str, ReplicaWindow],
    reference_p99_s: float | None,
    limits: GateLimits,
    alpha: float,
    reference_median_s: float | None,
    reference_count: float,
) -> tuple[float | None, Finding | None]:
    """The latency gate on ``members``' merged latency: the P99's rise against ``reference_p99_s`` (None: not
    evaluated) and a finding when either of two rises is past the limit *and* significant by its exact test at
    ``alpha`` / 2, which counts the noise of a reference of ``reference_count`` timed requests (those of the
    histogram its quantiles are read from: :func:`serving.stats.p_slower_than_reference`). Neither side is judged
    below :data:`MIN_REQUESTS` timed requests: a reference of 3 makes a median test that a release twice as slow
    passes, so it is inconclusive, not a pass. Above that the test's power grows with the reference (docs/rollout.md
    measures it: against 20, a release 2.2 × slower at σ = 0.3 lognormal is found, 1.5 × almost never).

    * the tail, the source's gate: the P99 more than the limit over the reference's, with more than 1 % of the
      requests slower than (1 + limit) × the reference's P99;
    * the bulk: the median more than the limit over the reference's (``reference_median_s``), with more than half
      of the requests slower than (1 + limit) × it — the whole distribution moved. The tail test alone missed a
      release 50 % slower on every request: load had inflated the reference's P99 (169 ms against 117 ms before the
      rollout), its bound (220 ms) lay over the release's bulk (~175 ms), and the canary passed; with no slow
      outliers of its own the canary's P99 was not even 30 % over the reference's. Every request counts here.
    """
    latency = _merge(windows[r].latency for r in members)
    p99 = _p99(latency)
    if latency is None or p99 is None or not reference_p99_s or min(latency.count, reference_count) < MIN_REQUESTS:
        return None, None
    rise = (p99 - reference_p99_s) / reference_p99_s
    head = f"{name} P99 {p99 * 1000:.1f} ms vs {reference_p99_s * 1000:.1f} ms: {rise:+.1%}"
    if rise > limits.max_p99_rise:
        bound = (1 + limits.max_p99_rise) * reference_p99_s
        slow = _slower_than(latency, bound)
        p = p_slower_than_reference(slow, latency.count, _rank(P99, reference_count), reference_count)
        if p < alpha / 2:
            text = (
                f"{head} > +{limits.max_p99_rise:.0%} ({slow:.0f} of {latency.count:.0f} requests over "
                f"{bound * 1000:.1f} ms, p = {p:.1g})"
            )
            return rise, Finding("p99", tuple(members), text)
    median = _median(latency)
    if not reference_median_s or median is None:
        return rise, None
    bulk_bound = (1 + limits.max_p99_rise) * reference_median_s
    if median <= bulk_bound:
        return rise, None
    bulk = _slower_than(latency, bulk_bound)
    p_bulk = p_slower_than_reference(bulk, latency.count, _rank(MEDIAN, reference_count), reference_count)
    if p_bulk >= alpha / 2:
        return rise, None
    text = (
        f"{name} median {median * 1000:.1f} ms vs {reference_median_s * 1000:.1f} ms: "
        f"{median / reference_median_s - 1:+.1%} > +{limits.max_p99_rise:.0%}, the whole distribution moved "
        f"({bulk:.0f} of {latency.count:.0f} requests over {bulk_bound * 1000:.1f} ms, p = {p_bulk:.1g}); {head}"
    )
    return rise, Finding("p99", tuple(members), text)


def _errors(
    name: str, members: Sequence[str], windows: Mapping[str, ReplicaWindow], limits: GateLimits
) -> Finding | None:
    failures = sum(windows[r].failures for r in members)
    requests = sum(windows[r].requests for r in members)
    if not requests or failures / requests <= limits.max_error_rate:
        return None
    failing = tuple(r for r in members if windows[r].failures)
    per = ", ".join(f"{r} {windows[r].failures:.0f}/{windows[r].requests:.0f}" for r in failing)
    return Finding(
        "errors",
        failing,
        f"{name} error rate {failures / requests:.2%} > {limits.max_error_rate:.2%} "
        f"({failures:.0f} of {requests:.0f} upstream attempts failed: {per})",
    )


def _down(windows: Mapping[str, ReplicaWindow], members: Iterable[str]) -> list[Finding]:
    return [
        Finding("down", (r,), f"{r} down: {'; '.join(windows[r].problems)}") for r in members if windows[r].problems
    ]


# ----------------------------------------------------------------------------------------- verdict


@dataclass(frozen=True)
class Verdict:
    """What the soak decided, on what basis, with every piece of evidence and the replicas it names."""

    decision: Decision
    basis: Basis
    evidence: tuple[str, ...]
    replicas: tuple[str, ...]

    def summary(self) -> str:
        return "; ".join(self.evidence)

    def to_json(self) -> dict[str, Any]:
        return {
            "decision": self.decision,
            "basis": self.basis,
            "evidence": list(self.evidence),
            "replicas": list(self.replicas),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Verdict:
        return cls(data["decision"], data["basis"], tuple(data["evidence"]), tuple(data["replicas"]))


@dataclass(frozen=True)
class Gates:
    """One evaluation: the canary's three gate values (None = not evaluable), the router-wide context, the
    decisive findings (``breaches``), and — for a soak — both groups' figures and the verdict."""

    qps_drop: float | None
    p99_rise: float | None
    error_rate: float
    client_error_rate: float
    upstream_error_rate: float
    retries: float
    breaches: tuple[str, ...]
    canary: GroupStats | None = None
    baseline: GroupStats | None = None
    verdict: Verdict | None = None
    inconclusive: Mapping[str, str] = field(default_factory=dict)  # gate (a key of contract()) → why not judged
    kv_pool: KvCheck | None = None  # the canary's KV pool against the plan (serving.rollout.kvpool)

    @property
    def passed(self) -> bool:
        return not self.breaches

    def summary(self) -> str:
        def pct(v: float | None, digits: int = 1) -> str:
            return "n/a" if v is None else f"{v:+.{digits}%}"

        return (
            f"QPS drop {pct(self.qps_drop)}, P99 rise {pct(self.p99_rise)}, error rate {self.error_rate:.3%} "
            f"(clients {self.client_error_rate:.3%}, {self.retries:.0f} retries)"
        )

    def contract(self) -> dict[str, float | None]:
        """The three values of the ``--json`` contract."""
        return {"qps_drop": self.qps_drop, "p99_rise": self.p99_rise, "error_rate": self.error_rate}

    def to_json(self) -> dict[str, Any]:
        return {
            **self.contract(),
            "client_error_rate": self.client_error_rate,
            "upstream_error_rate": self.upstream_error_rate,
            "retries": self.retries,
            "breaches": list(self.breaches),
            "canary": self.canary.to_json() if self.canary else None,
            "baseline": self.baseline.to_json() if self.baseline else None,
            "verdict": self.verdict.to_json() if self.verdict else None,
            "inconclusive": dict(self.inconclusive),
            "kv_pool": self.kv_pool.to_json() if self.kv_pool is not None else None,
        }

    def inconclusive_json(self) -> dict[str, str | None]:
        """Per gate of :meth:`contract`: why it was not judged, or None when it was."""
        return {gate: self.inconclusive.get(gate) for gate in self.contract()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Gates:
        return cls(
            qps_drop=data["qps_drop"],
            p99_rise=data["p99_rise"],
            error_rate=float(data["error_rate"]),
            client_error_rate=float(data["client_error_rate"]),
            upstream_error_rate=float(data["upstream_error_rate"]),
            retries=float(data["retries"]),
            breaches=tuple(data["breaches"]),
            canary=GroupStats.from_json(data["canary"]) if data.get("canary") else None,
            baseline=GroupStats.from_json(data["baseline"]) if data.get("baseline") else None,
            verdict=Verdict.from_json(data["verdict"]) if data.get("verdict") else None,
            inconclusive=dict(data.get("inconclusive") or {}),
            kv_pool=KvCheck.from_json(data["kv_pool"]) if data.get("kv_pool") else None,
        )


def judge(
    canary: Sequence[str],
    peers: Sequence[str],
    windows: Mapping[str, ReplicaWindow],
    *,
    basis: Basis,
    seconds: float,
    fleet: WindowStats,
    before: WindowStats | None,
    limits: GateLimits,
    accept_inconclusive: bool = False,
) -> Gates:
    """The verdict on one soak window.

    ``windows`` holds every replica measured (the canary, its ``peers`` — the baseline of ``basis`` — and any
    other replica in the router, e.g. those updated earlier while old-version peers remain). ``fleet`` is the
    router-wide window, ``before`` the pre-rollout baseline (its ``replicas`` is the reference of
    ``pre-rollout`` and the fallback reference of a replica without peers). A window shorter than
    ``limits.qps_window_min_s`` shows the canary's QPS but does not judge it: the router decided that split.

    A gate that too little traffic leaves unjudged is *inconclusive* (as Argo Rollouts calls such an analysis): with
    no breach and no evidence outside the batch the verdict is a pause that says how much traffic the soak needs,
    never a pass; ``accept_inconclusive`` (the operator's ``--accept-inconclusive``) passes it, saying so. Every
    unjudged gate is named in :attr:`Gates.inconclusive` with the reason."""
    outside_ids = [r for r in windows if r not in canary]
    pre = before.replicas if before is not None else None
    alpha = FAMILY_ALPHA / (2 + len(outside_ids))

    # Evidence outside the batch: each replica that is not the canary, against its peers without it.
    outside: list[Finding] = _down(windows, outside_ids)
    outside += [f for r in outside_ids if (f := _errors(r, [r], windows, limits)) is not None]
    broken = {r: "down" if windows[r].problems else "failing" for f in outside for r in f.replicas}
    peer_windows = {r: windows[r] for r in peers if r in windows}
    clean = {r: w for r, w in peer_windows.items() if r not in broken}
    clean_latency = _merge(w.latency for w in clean.values())
    for r in outside_ids:  # each against the clean peers without it: the peers' histogram minus its own
        if r in broken:
            continue
        own = windows[r].latency
        rest = clean_latency - own if r in clean and clean_latency is not None and own is not None else clean_latency
        peers_left = len(clean) > (r in clean)
        if peers_left:
            rest_p99, rest_median, rest_count = _p99(rest), _median(rest), rest.count if rest is not None else 0.0
        elif pre is not None:
            rest_p99, rest_median, rest_count = pre.p99_s, pre.median_s, pre.timed_requests
        else:
            rest_p99, rest_median, rest_count = None, None, 0.0
        if (f := p99_check(r, [r], windows, rest_p99, limits, alpha, rest_median, rest_count)[1]) is not None:
            outside.append(f)
    flagged = {r for f in outside for r in f.replicas}

    # The canary against the clean peers (or the pre-rollout figures).
    reasons = {r: broken.get(r, "slower than its peers") for r in peer_windows if r in flagged}
    reference = group_stats(peer_windows, seconds, reasons)
    if basis == "pre-rollout" and pre is not None:
        reference = pre
    members = [r for r in canary if r in windows]
    breaches: list[Finding] = _down(windows, members)
    if (e := _errors("canary", members, windows, limits)) is not None:
        breaches.append(e)
    qps_drop = p99_rise = None
    thin = True  # too little traffic for the QPS comparison (or nothing to compare)
    short = seconds < limits.qps_window_min_s
    context: list[str] = []
    if members and reference.replicas:
        drop, qps = qps_check("canary", members, windows, seconds, reference, limits, alpha,
                              _dispersion([windows[r] for r in outside_ids if r not in flagged]))  # fmt: skip
        thin = drop is None
        if not short:
            qps_drop = drop
            breaches += [qps] if qps is not None else []
        elif drop is not None:  # the router's split, not the replicas': shown, not judged
            context.append(
                f"canary QPS per replica {-drop:+.0%} against its baseline, not judged: the {seconds:.1f} s window is "
                f"shorter than {limits.qps_window_min_s:g} s, what the router's load polls need to average out "
                "(power_of_two ranks workers by the loads it polled last)"
            )
        p99_rise, p99 = p99_check(
            "canary", members, windows, reference.p99_s, limits, alpha, reference.median_s, reference.timed_requests
        )
        breaches += [p99] if p99 is not None else []
    canary_stats = group_stats({r: windows[r] for r in members}, seconds)

    # Router-wide: client errors no replica's failures explain; traffic too thin to judge; weather alike.
    failures = sum(w.failures for w in windows.values())
    if fleet.client_error_rate > limits.max_error_rate and failures == 0:
        outside.append(
            Finding(
                "clients",
                (),
                f"clients got {fleet.client_errors:.0f} errors of {fleet.requests:.0f} requests "
                f"({fleet.client_error_rate:.2%}) while no replica failed an upstream attempt: the router, not a replica",
            )
        )
    everyone = group_stats({r: windows[r] for r in outside_ids if r not in flagged}, seconds)  # the weather
    # The traffic: every replica up, the canary with them, as the pre-rollout baseline measured every replica. The
    # replicas outside the batch alone are not the fleet's traffic: when the router sends the canary more than its
    # share (power_of_two favours a replica readmitted with no load until its next poll) they see less, and read as
    # a "dip" (issue 28: 4.33 requests/s per replica vs 6.25/s, while clients sent a steady 50/s).
    traffic = group_stats({r: w for r, w in windows.items() if r not in flagged}, seconds)
    thin_traffic = traffic.qps_per_replica * len(members) * seconds < MIN_REQUESTS  # too little for the canary
    if pre is not None and pre.qps_per_replica > 0 and traffic.replicas:
        dip = (pre.qps_per_replica - traffic.qps_per_replica) / pre.qps_per_replica
        expected_then = pre.qps_per_replica * len(members) * seconds
        if thin_traffic and members and expected_then >= MIN_REQUESTS and dip > limits.max_qps_drop:
            outside.append(
                Finding(
                    "traffic",
                    (),
                    f"traffic dip: {traffic.qps_per_replica:.2f} requests/s per replica vs {pre.qps_per_replica:.2f}/s "
                    f"before the rollout ({dip:.0%} less), too few for the canary to be judged",
                )
            )
        elif dip > limits.max_qps_drop:
            context.append(f"traffic per replica {dip:.0%} below the pre-rollout baseline: weather, not the batch")
        if (
            everyone.replicas
            and pre.p99_s
            and everyone.p99_s
            and everyone.p99_s > (1 + limits.max_p99_rise) * pre.p99_s
        ):
            rise = everyone.p99_s / pre.p99_s - 1
            context.append(
                f"the replicas outside the batch are {rise:+.0%} slower (P99) than before the rollout: weather, not the batch"
            )

    inconclusive = _unjudged(members, windows, reference, seconds, limits, thin=thin, p99_judged=p99_rise is not None)
    # Too little traffic is judged on what the canary should get at the fleet's rate in this window, not on what the
    # router happened to send it or its peers: power_of_two can starve a healthy replica for a whole poll. A short
    # soak, or a canary the router starved while traffic was ample, leaves the gates named inconclusive, not paused.
    blind = list(inconclusive) if thin_traffic else []
    undecided: list[Finding] = []
    # The latency gate left unjudged by its baseline while the traffic was ample: the baseline's replicas served
    # enough but their latency was not measured (no histogram series on their /metrics), so nothing bounds the
    # canary's latency and a release twice as slow would pass. Not the traffic's doing: a pause that says so. A
    # baseline that served too little is the thin-traffic case (named, judged on the fleet's traffic, above).
    unmeasured = (
        not thin_traffic
        and "p99_rise" in inconclusive
        and reference.successes >= MIN_REQUESTS > reference.timed_requests
        and canary_stats.timed_requests >= MIN_REQUESTS
    )
    if unmeasured and accept_inconclusive:
        context.append(f"latency not judged, passed by --accept-inconclusive: {inconclusive['p99_rise']}")
    elif unmeasured:
        undecided.append(
            Finding(
                "inconclusive",
                (),
                f"inconclusive, the baseline's latency was not measured: {inconclusive['p99_rise']}. Check that the "
                "baseline's replicas expose their latency histogram on /metrics and resume (the batch is soaked "
                "again), or resume with --accept-inconclusive to pass it unjudged, or roll back",
            )
        )
    if blind and accept_inconclusive:
        context.append(
            "not judged, too little traffic, passed by --accept-inconclusive: "
            + "; ".join(f"{GATE_WORDS[g]}: {inconclusive[g]}" for g in blind)
        )
    elif blind:
        need = _traffic_needed(len(members), len(reference.replicas), len(windows), seconds)
        undecided.append(
            Finding(
                "inconclusive",
                (),
                "inconclusive, too little traffic to judge the canary: "
                + "; ".join(f"{GATE_WORDS[g]}: {inconclusive[g]}" for g in blind)
                + f". The soak needs {need}: send traffic and resume (the batch is soaked again), or resume with "
                "--accept-inconclusive to pass it unjudged, or roll back",
            )
        )

    decision: Decision = "pause" if outside or (undecided and not breaches) else "rollback" if breaches else "pass"
    base_words = f"baseline: {BASIS_WORDS[basis]} — {_describe(reference)}"
    canary_words = f"canary {_describe(canary_stats)}"
    if decision == "pause" and not outside:
        head = [f.text for f in undecided]
        named = []
    elif decision == "pause":
        head = ["evidence outside the batch, the new version is not blamed: " + "; ".join(f.text for f in outside)]
        if breaches:
            head.append("the canary also breached, not attributable while the fleet is like this: "
                        + "; ".join(f.text for f in breaches))  # fmt: skip
        head += [f.text for f in undecided]
        named = outside
    elif decision == "rollback":
        head = ["breach confined to the canary: " + "; ".join(f.text for f in breaches)]
        named = breaches
    else:
        head = ["canary within every gate"]
        named = []
    evidence = (*head, canary_words, base_words, *context)
    replicas = tuple(dict.fromkeys(r for f in named for r in f.replicas))
    return Gates(
        qps_drop=qps_drop,
        p99_rise=p99_rise,
        error_rate=canary_stats.error_rate,
        client_error_rate=fleet.client_error_rate,
        upstream_error_rate=fleet.upstream_error_rate,
        retries=fleet.retries,
        breaches=tuple(f.text for f in (*outside, *breaches, *undecided)),
        canary=canary_stats,
        baseline=reference,
        verdict=Verdict(decision, basis, evidence, replicas),
        inconclusive=inconclusive,
    )


def with_kv_pool(gates: Gates, kv: KvCheck) -> Gates:
    """The soak's verdict with the canary's KV pool checked against the plan. A miss beyond the bound holds the rollout
    (a pass becomes a pause, the check's sentence first; a rollback stays one, the check added); a miss beyond 5 %
    is a warning in the evidence; within it, or not read, the check is a line of context."""
    verdict = gates.verdict
    assert verdict is not None, "the KV pool check follows a soak's verdict"
    if kv.level != "hold":
        return replace(gates, kv_pool=kv, verdict=replace(verdict, evidence=(*verdict.evidence, kv.text)))
    decision: Decision = "rollback" if verdict.decision == "rollback" else "pause"
    evidence = (*verdict.evidence, kv.text) if decision == "rollback" else (kv.text, *verdict.evidence)
    if verdict.decision == "pass":
        evidence = (kv.text, *verdict.evidence[1:])  # not "canary within every gate": this one it is not within
    return replace(
        gates,
        kv_pool=kv,
        breaches=(*gates.breaches, kv.text),
        verdict=replace(verdict, decision=decision, evidence=evidence),
    )


GATE_WORDS: Mapping[str, str] = {"qps_drop": "QPS", "p99_rise": "P99", "error_rate": "error rate"}


def _unjudged(
    members: Sequence[str],
    windows: Mapping[str, ReplicaWindow],
    reference: GroupStats,
    seconds: float,
    limits: GateLimits,
    *,
    thin: bool,
    p99_judged: bool,
) -> dict[str, str]:
    """Why each of the canary's gates (the keys of :meth:`Gates.contract`) was not judged; empty when all were.
    QPS and P99 need :data:`MIN_REQUESTS` (see :func:`qps_check`, :func:`p99_check`); so does the error rate: no
    failure among a handful of attempts says little of a 0.1 % limit."""
    if not members:
        return {}
    out: dict[str, str] = {}
    if thin:
        expected = reference.qps_per_replica * len(members) * seconds
        out["qps_drop"] = (
            "no replica beside the canary to compare with"
            if not reference.replicas
            else f"{expected:.0f} successes expected of the canary at its baseline's "
            f"{reference.qps_per_replica:.2f} req/s per replica, {reference.successes:.0f} served by the baseline; "
            f"the test needs {MIN_REQUESTS} of each"
        )
    elif seconds < limits.qps_window_min_s:
        out["qps_drop"] = (
            f"the {seconds:.1f} s soak is shorter than {limits.qps_window_min_s:g} s, the router load polls the QPS "
            "split needs to average out (rollout.interval_s)"
        )
    if not p99_judged:
        latency = _merge(windows[r].latency for r in members)
        timed = latency.count if latency is not None else 0.0
        if timed < MIN_REQUESTS:
            out["p99_rise"] = f"{timed:.0f} of the canary's requests timed; the test needs {MIN_REQUESTS}"
        elif reference.p99_s is None:
            out["p99_rise"] = "the baseline timed no request: no P99 to compare with"
        else:
            out["p99_rise"] = (
                f"{reference.timed_requests:.0f} of the baseline's requests timed; the test needs {MIN_REQUESTS} "
                "(a quantile of fewer is no reference)"
            )
    attempts = sum(windows[r].requests for r in members)
    if attempts < MIN_REQUESTS:
        out["error_rate"] = f"{attempts:.0f} upstream attempts reached the canary; its error rate needs {MIN_REQUESTS}"
    return out


def traffic_needed(canary: int, replicas: int, seconds: float) -> tuple[float, float]:
    """Requests per second per replica, and through the routers for ``replicas`` replicas, that give a canary of
    ``canary`` replicas :data:`MIN_REQUESTS` over ``seconds`` — what its gates need to be judged."""
    per = MIN_REQUESTS / (max(1, canary) * seconds) if seconds > 0 else math.inf
    return per, per * replicas


def _traffic_needed(canary: int, baseline: int, replicas: int, seconds: float) -> str:
    per, total = traffic_needed(min(canary, baseline or canary), replicas, seconds)
    return f"at least {per:.2f} req/s per replica ({total:.1f} req/s through the routers) over its {seconds:.1f} s"


def _dispersion(windows: Sequence[ReplicaWindow]) -> float:
    """Variance over mean of the per-replica success counts of every replica outside the canary that is up (the
    same router split them in the same window), at least 1 (Poisson); 1 with fewer than 3 replicas."""
    counts = [w.successes for w in windows]
    if len(counts) < 3:
        return 1.0
    mean = sum(counts) / len(counts)
    variance = sum((c - mean) ** 2 for c in counts) / (len(counts) - 1)
    return max(1.0, variance / mean) if mean > 0 else 1.0


def _describe(g: GroupStats) -> str:
    p99 = "n/a" if g.p99_s is None else f"{g.p99_s * 1000:.1f} ms"
    left = f", left out: {', '.join(f'{r} ({why})' for r, why in g.excluded.items())}" if g.excluded else ""
    return (
        f"{len(g.replicas)} replicas ({', '.join(g.replicas[:4])}{', …' if len(g.replicas) > 4 else ''}): "
        f"{g.qps_per_replica:.2f} req/s per replica, P99 {p99}, errors {g.errors:.0f}/{g.requests:.0f}{left}"
    )


def canary_budget_spent(
    canary: Sequence[str],
    peers: Sequence[str],
    windows: Mapping[str, ReplicaWindow],
    expected_attempts: float,
    limits: GateLimits,
) -> bool:
    """True once the canary's upstream failures exceed what the whole soak may hold (0.1 % of the attempts it
    should get over the interval at pre-rollout traffic, or of those it already got) while its peers stay
    within the limit: the interval's error gate is decided, so the soak judges the window so far and ends on a
    rollback verdict (it soaks on when that window holds evidence outside the batch, such as a traffic dip that
    leaves it too thin to judge).
    (A single early error in a large window does not end the soak: the budget is for the interval.)"""
    failures = sum(windows[r].failures for r in canary if r in windows)
    attempts = sum(windows[r].requests for r in canary if r in windows)
    peer_failures = sum(windows[r].failures for r in peers if r in windows)
    peer_attempts = sum(windows[r].requests for r in peers if r in windows)
    confined = peer_failures <= limits.max_error_rate * peer_attempts
    return confined and failures > limits.max_error_rate * max(expected_attempts, attempts)
