"""How likely so many requests slower than a bound are by chance, when the bound is (1 + limit) × a quantile
*estimated* from a reference sample: the test behind the rollout gates' latency findings
(:mod:`serving.rollout.gates.findings`) and the drill judge's slow windows (:mod:`serving.drill.measure`).

Under the hypothesis that the latency has not moved past the limit (at the boundary: the tested requests' latency ÷
(1 + limit) is distributed as the reference's), each tested request is over the bound with probability U, the share
of the latency distribution above the reference's estimate. For the k-th smallest of n reference requests, U ~ Beta(n
− k + 1, k) (the order statistic of a uniform sample); the count over the bound is then beta-binomial. A binomial at
exactly 1 − q ignores the reference's own noise: 20 reference requests put their "P99" near their largest, which
about 1/21 of the distribution exceeds, not 1 %, and 2,000 requests of an unchanged release then "rose" past it in
7 % of trials with σ = 0.3 lognormal latency and 35 % with σ = 0.6 (that case is
``tests/test_rollout_core.py::test_a_small_reference_is_no_evidence_against_an_unchanged_release``), where each of
the gate's two latency tests runs at 0.025 %.
"""

from __future__ import annotations

import math
from collections.abc import Callable

P99 = 0.99
MEDIAN = 0.5


def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def _tail(start: int, stop: int, step: int, log_pmf: Callable[[int], float]) -> float:
    """Sum of the pmf from ``start`` towards ``stop`` (exclusive), away from the mean: the terms shrink, so the sum
    stops once they no longer count."""
    total = 0.0
    for i in range(start, stop, step):
        term = math.exp(log_pmf(i))
        total += term
        if term < 1e-18 * total:
            break
    return min(1.0, total)


def binom_sf(k: float, n: float, p: float) -> float:
    """P(X ≥ k) for X ~ Binomial(n, p), 0 < p < 1; counts rounded; exact (summed from the tail's far side)."""
    k_i, n_i = round(k), round(n)
    if k_i <= 0:
        return 1.0
    if k_i > n_i:
        return 0.0
    log_p, log_q = math.log(p), math.log1p(-p)

    def log_pmf(i: int) -> float:
        return math.lgamma(n_i + 1) - math.lgamma(i + 1) - math.lgamma(n_i - i + 1) + i * log_p + (n_i - i) * log_q

    if k_i > n_i * p:
        return _tail(k_i, n_i + 1, 1, log_pmf)
    return max(0.0, 1.0 - _tail(k_i - 1, -1, -1, log_pmf))


def betabinom_sf(k: float, n: float, a: float, b: float) -> float:
    """P(X ≥ k) for X ~ Binomial(n, U), U ~ Beta(a, b) (a, b > 0); counts rounded; exact (the tail is summed from
    its far side inwards)."""
    k_i, n_i = round(k), round(n)
    if k_i <= 0:
        return 1.0
    if k_i > n_i:
        return 0.0
    norm = math.lgamma(n_i + 1) - _log_beta(a, b)

    def log_pmf(i: int) -> float:
        return norm - math.lgamma(i + 1) - math.lgamma(n_i - i + 1) + _log_beta(i + a, n_i - i + b)

    if k_i > n_i * a / (a + b):
        return _tail(k_i, n_i + 1, 1, log_pmf)
    return max(0.0, 1.0 - _tail(k_i - 1, -1, -1, log_pmf))


def nearest_rank(q: float, n: int) -> int:
    """The nearest-rank ``q``-quantile's rank among ``n`` observations, 1-based: the ⌈q·n⌉-th smallest (at least the
    first)."""
    return min(n, max(1, math.ceil(q * n)))


def p_slower_than_reference(slow: float, count: float, rank: int, reference: float) -> float:
    """The chance that ``slow`` or more of ``count`` requests are over (1 + limit) × the ``rank``-th smallest of
    ``reference`` requests (the reference's quantile: a nearest-rank P99 is :func:`nearest_rank`'s) when their latency has
    not moved past the limit: beta-binomial, each request over it with U ~ Beta(n − rank + 1, rank). ``slow`` may be a
    histogram's interpolated count; its whole part is what was seen."""
    n = max(1, round(reference))
    k = min(n, max(1, rank))
    return betabinom_sf(math.floor(slow + 1e-9), count, n - k + 1, k)
