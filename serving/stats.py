"""Exact binomial tail, and the P99 and median tests built on it, shared by the rollout gates
(:mod:`serving.rollout.gates`) and the drill judge (:mod:`serving.drill.measure`): how likely so many requests slower
than a bound are by chance."""

from __future__ import annotations

import math

P99 = 0.99
MEDIAN = 0.5


def _log_pmf(i: int, n: int, p: float) -> float:  # p strictly between 0 and 1
    return math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p) + (n - i) * math.log1p(-p)


def _tail(start: int, stop: int, step: int, n: int, p: float) -> float:
    """Sum of the binomial pmf from ``start`` towards ``stop`` (exclusive), away from the mean: the terms shrink
    geometrically, so the sum stops once they no longer count."""
    total = 0.0
    for i in range(start, stop, step):
        term = math.exp(_log_pmf(i, n, p))
        total += term
        if term < 1e-18 * total:
            break
    return min(1.0, total)


def binom_sf(k: float, n: float, p: float) -> float:
    """P(X ≥ k) for X ~ Binomial(n, p), counts rounded; exact (the tail is summed from its far side inwards)."""
    k_i, n_i = round(k), round(n)
    if k_i <= 0 or p >= 1.0:
        return 1.0
    if k_i > n_i or p <= 0.0:
        return 0.0
    if k_i > n_i * p:
        return _tail(k_i, n_i + 1, 1, n_i, p)
    return max(0.0, 1.0 - _tail(k_i - 1, -1, -1, n_i, p))


def p_slower_than_p99(slow: float, count: float) -> float:
    """The chance that ``slow`` or more of ``count`` requests are slower than a bound at or above their P99 when the
    latency has not moved: at most 1 % of them may be (exact binomial). ``slow`` may be a histogram's interpolated
    count; its whole part is what was seen."""
    return binom_sf(math.floor(slow + 1e-9), count, 1 - P99)


def p_slower_than_median(slow: float, count: float) -> float:
    """The chance that ``slow`` or more of ``count`` requests are slower than a bound at or above their median when
    the latency has not moved that far: at most half of them may be (exact binomial); ``slow`` as for
    :func:`p_slower_than_p99`."""
    return binom_sf(math.floor(slow + 1e-9), count, 1 - MEDIAN)
