"""The gates themselves, each a finding about named replicas: QPS per replica and latency (P99 and median) against a
reference, the error rate, down — pure.

Small groups make noisy figures: a replica that served 50 requests has a "P99" that is its slowest one,
and the router's own split of traffic is uneven (see :func:`qps_check`). A relative finding (QPS or P99)
therefore needs both the size the source sets *and* significance: for QPS the test of the canary's share
of successes with the variance the peers' own spread shows, for P99 the exact test of how many of its requests
were slower than 1.3 × the baseline's P99 (more than 1 % is a P99 over the limit; beta-binomial, so that the
baseline's own count counts: :mod:`serving.stats`), and the same on the median for a shift of the whole
distribution (more than half over 1.3 × the baseline's median: see :func:`p99_check`; stricter than the source,
which judges the P99 only); all relative
tests of one verdict together have a 0.1 % chance of a false finding (:data:`FAMILY_ALPHA`, Bonferroni). The error gate stays strict, as
the source wrote it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from serving.rollout.gates.window import GroupStats, ReplicaWindow, median_of, merge_histograms, p99_of
from serving.rollout.plan import GateLimits
from serving.router.client import HistogramSnapshot
from serving.stats import MEDIAN, P99, binom_sf, p_slower_than_reference

MIN_REQUESTS = 20  # fewer than this expected: QPS and P99 are not evaluated
FAMILY_ALPHA = 0.001  # chance that any relative finding of one verdict is due to chance alone


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


@dataclass(frozen=True)
class Finding:
    """One piece of evidence: the gate (``qps``, ``p99``, ``errors``, ``down``, ``clients``, ``traffic``), the
    replicas it is about, and the sentence the verdict shows."""

    gate: str
    replicas: tuple[str, ...]
    text: str


# The findings each gate of ``rollout.dry_run_gates`` stands for, on the canary and on the replicas outside the batch.
# Errors, replicas down, client errors no replica explains and traffic too thin to judge anything are never dry run.
DRY_RUN_FINDINGS: dict[str, frozenset[str]] = {"p99": frozenset({"p99"}), "qps": frozenset({"qps"})}


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
    latency = merge_histograms(windows[r].latency for r in members)
    p99 = p99_of(latency)
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
    median = median_of(latency)
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


def error_check(
    name: str, members: Sequence[str], windows: Mapping[str, ReplicaWindow], limits: GateLimits
) -> Finding | None:
    """The error gate on ``members``' upstream attempts together: a finding naming the failing replicas when their
    failure rate is over ``limits.max_error_rate`` (no significance test: the source's gate stays strict)."""
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


REFUSAL_ALPHA = 0.01  # the chance a batch is rolled back for 4xx its clients' own bad requests spread on it


def refusal_check(
    members: Sequence[str], reference: Sequence[str], windows: Mapping[str, ReplicaWindow], limits: GateLimits
) -> Finding | None:
    """The error gate on refusals, the 4xx a release answers (SGLang's 400 for a request it cannot serve). smg passes
    a worker's 4xx through and counts it a success for the worker (``worker/resilience.rs``: only 408 and 5xx fail),
    so the breaker's tally the error rate reads never shows one; each worker's own ``sglang:http_responses_total``
    does. The canary's refusal rate against its ``reference`` peers' over the same window: a breach when it is over
    theirs by more than ``limits.max_error_rate`` and, given the refusals of both, as many of them falling on the
    canary's share of the requests has a chance under :data:`REFUSAL_ALPHA` (a conditional binomial test: clients'
    own bad requests land on every replica alike). None when either side was not measured."""
    canary = [c for r in members if (c := windows[r].refusals) is not None]
    peers = [p for r in reference if r in windows and (p := windows[r].refusals) is not None]
    if not canary or not peers:
        return None
    answered, refused = (sum(c[i] for c in canary) for i in (0, 1))
    peer_answered, peer_refused = (sum(p[i] for p in peers) for i in (0, 1))
    if not answered or not refused or not peer_answered:
        return None
    rate, peer_rate = refused / answered, peer_refused / peer_answered
    if rate - peer_rate <= limits.max_error_rate:
        return None
    chance = binom_sf(refused, refused + peer_refused, answered / (answered + peer_answered))
    if chance >= REFUSAL_ALPHA:
        return None
    refusing = tuple(r for r in members if (w := windows[r].refusals) is not None and w[1] > 0)
    return Finding(
        "errors",
        refusing,
        f"canary refused {refused:.0f} of {answered:.0f} requests with a 4xx ({rate:.2%}) against its baseline's "
        f"{peer_refused:.0f} of {peer_answered:.0f} ({peer_rate:.2%}): {rate - peer_rate:+.2%} > "
        f"{limits.max_error_rate:.2%}, p = {chance:.1g} (smg counts a worker's 4xx as its success: the workers' own "
        "sglang:http_responses_total show them)",
    )


def down_check(windows: Mapping[str, ReplicaWindow], members: Iterable[str]) -> list[Finding]:
    """A finding for each of ``members`` that counts as down (its window's ``problems``)."""
    return [
        Finding("down", (r,), f"{r} down: {'; '.join(windows[r].problems)}") for r in members if windows[r].problems
    ]
