"""Gate arithmetic: router metrics over a window, compared with the pre-update baseline — pure.

What is measured (names checked against the real ``sglang-router`` 0.3.2, see FIELD-NOTES.md):

* **QPS**: inference requests the router answered without a server error, per second —
  ``smg_router_requests_total`` (inference endpoints only; the updater's own ``/workers`` calls are
  not in it) minus client-facing server errors.
* **P99**: ``histogram_quantile(0.99)`` of ``smg_router_request_duration_seconds`` (inference only)
  over the window: the latency clients see, retries included.
* **Error rate**: the larger of two shares. *Client-facing*: ``smg_http_responses_total`` with a 5xx
  or 429 status over inference requests. *Upstream*: ``smg_router_upstream_responses_total`` with a
  5xx status over all upstream responses. The router retries a failed worker (5 times by default),
  so a release that fails 5 % of its requests shows almost no client-facing errors — it shows as
  upstream errors and ``smg_worker_retries_total``. Gating on client errors alone would promote it.

A window whose counters went *down* spans a router restart (counters start again at 0); it is not
a measurement and :func:`window_stats` returns None so the caller measures again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from serving.rollout.plan import GateLimits
from serving.router.client import (
    ROUTER_RESPONSES,
    ROUTER_UPSTREAM_RESPONSES,
    ROUTER_WORKER_RETRIES,
    HistogramSnapshot,
    MetricsSnapshot,
)

ROUTER_INFERENCE_REQUESTS = "smg_router_requests_total"
ROUTER_INFERENCE_DURATION = "smg_router_request_duration_seconds"
MIN_BASELINE_REQUESTS = 20  # fewer than this in the baseline window: QPS and P99 gates are not evaluated


def _is_error(status: str) -> bool:
    return status.startswith("5") or status == "429"


@dataclass(frozen=True)
class Counters:
    """The cumulative router counters the gates need, read from one scrape."""

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


@dataclass(frozen=True)
class WindowStats:
    """Router traffic between two scrapes."""

    seconds: float
    requests: float
    client_errors: float
    upstream_responses: float
    upstream_errors: float
    retries: float
    p99_s: float | None

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
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WindowStats:
        return cls(**data)


def window_stats(before: Counters, after: Counters, seconds: float) -> WindowStats | None:
    """Traffic between two reads; None if any counter went down (the router restarted)."""
    pairs = [
        (before.requests, after.requests),
        (before.client_errors, after.client_errors),
        (before.upstream_responses, after.upstream_responses),
        (before.retries, after.retries),
    ]
    duration = after.duration - before.duration
    if any(b > a for b, a in pairs) or any(n < 0 for _, n in duration.buckets):
        return None
    p99 = duration.quantile(0.99)
    return WindowStats(
        seconds=seconds,
        requests=after.requests - before.requests,
        client_errors=after.client_errors - before.client_errors,
        upstream_responses=after.upstream_responses - before.upstream_responses,
        upstream_errors=after.upstream_errors - before.upstream_errors,
        retries=after.retries - before.retries,
        p99_s=None if math.isnan(p99) else p99,
    )


@dataclass(frozen=True)
class Gates:
    """One evaluation: the three gate values (None = not evaluable) and the breaches, worded."""

    qps_drop: float | None
    p99_rise: float | None
    error_rate: float
    client_error_rate: float
    upstream_error_rate: float
    retries: float
    breaches: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.breaches

    def summary(self) -> str:
        def pct(v: float | None, digits: int = 1) -> str:
            return "n/a" if v is None else f"{v:+.{digits}%}"

        return (
            f"QPS drop {pct(self.qps_drop)}, P99 rise {pct(self.p99_rise)}, error rate {self.error_rate:.3%} "
            f"(upstream {self.upstream_error_rate:.3%}, {self.retries:.0f} retries)"
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
        }

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
        )


def evaluate(baseline: WindowStats, window: WindowStats, limits: GateLimits) -> Gates:
    """Compare a window with the baseline. Drops and rises are signed (negative = better)."""
    breaches: list[str] = []
    qps_drop: float | None = None
    p99_rise: float | None = None
    if baseline.requests >= MIN_BASELINE_REQUESTS and baseline.qps > 0:
        qps_drop = (baseline.qps - window.qps) / baseline.qps
        if qps_drop > limits.max_qps_drop:
            breaches.append(
                f"QPS drop {qps_drop:.1%} > {limits.max_qps_drop:.0%} "
                f"(baseline {baseline.qps:.1f}/s, now {window.qps:.1f}/s)"
            )
        if baseline.p99_s and window.p99_s is not None:
            p99_rise = (window.p99_s - baseline.p99_s) / baseline.p99_s
            if p99_rise > limits.max_p99_rise:
                breaches.append(
                    f"P99 rise {p99_rise:.1%} > {limits.max_p99_rise:.0%} "
                    f"(baseline {baseline.p99_s * 1000:.1f} ms, now {window.p99_s * 1000:.1f} ms)"
                )
    if window.error_rate > limits.max_error_rate:
        breaches.append(error_breach(window, limits))
    return Gates(
        qps_drop=qps_drop,
        p99_rise=p99_rise,
        error_rate=window.error_rate,
        client_error_rate=window.client_error_rate,
        upstream_error_rate=window.upstream_error_rate,
        retries=window.retries,
        breaches=tuple(breaches),
    )


def error_breach(window: WindowStats, limits: GateLimits) -> str:
    return (
        f"error rate {window.error_rate:.2%} > {limits.max_error_rate:.2%} "
        f"(client-facing {window.client_errors:.0f}/{window.requests:.0f}, upstream "
        f"{window.upstream_errors:.0f}/{window.upstream_responses:.0f}, {window.retries:.0f} retries)"
    )


def error_budget_exhausted(baseline: WindowStats, window: WindowStats, limits: GateLimits, interval_s: float) -> bool:
    """True once a soak window already holds more errors than the whole interval may, at baseline
    traffic: the end-of-window error gate can no longer pass, so the updater need not wait for it.
    (A single early error in a large window does not end the soak: the budget is for the interval.)"""
    expected_requests = max(baseline.qps * interval_s, window.requests)
    expected_upstream = max(baseline.upstream_responses / baseline.seconds * interval_s, window.upstream_responses)
    allowed = limits.max_error_rate
    return window.client_errors > allowed * expected_requests or window.upstream_errors > allowed * expected_upstream
