"""Prometheus's HTTP API, the two reads a fault drill needs: an instant query, and the alerts that fired since a time.

:func:`alerts_fired` reads the series Prometheus itself writes at every rule evaluation, over ``/api/v1/query_range``:
``ALERTS{alertstate="firing"}`` (so an alert that fired and resolved again counts too, unlike ``/api/v1/alerts``,
which lists only those active now) and ``ALERTS_FOR_STATE``, whose value is the time the alert became active (its
``for:`` started). Times are Unix seconds. Any Prometheus works: the sandbox's (:mod:`serving.sandbox.prometheus`)
or a cluster's.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from serving.fleet_http import client_tls

MAX_POINTS = 10_000  # Prometheus refuses a range query of more than 11,000 points per series
_META = ("__name__", "alertname", "alertstate")


class PrometheusError(RuntimeError):
    """Prometheus could not be asked, or refused the query; the message names the URL and the expression."""


@dataclass(frozen=True)
class Sample:
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class FiredAlert:
    """One alert (name and labels) that was firing at some evaluation in the window."""

    alertname: str
    labels: Mapping[str, str]  # the alert's own labels (the rule's and the expression's), without alertname
    active_at: float  # when it became active (pending), the start of its ``for:``
    fired_at: float  # the first evaluation in the window at which it was firing


def _get(prom_url: str, path: str, params: dict[str, str], timeout_s: float) -> Any:
    url = prom_url.rstrip("/") + path
    try:
        response = httpx.get(url, params=params, timeout=timeout_s, verify=client_tls())
    except httpx.HTTPError as exc:
        raise PrometheusError(f"Prometheus at {prom_url} did not answer {path} ({exc}); is it running?") from exc
    try:
        body = response.json()
    except ValueError:
        body = {}
    if response.status_code != 200 or body.get("status") != "success":
        said = body.get("error") or response.text[:200]
        raise PrometheusError(f"Prometheus at {prom_url} refused {params.get('query')!r}: {said}")
    return body["data"]


def query(prom_url: str, expr: str, *, timeout_s: float = 5.0) -> list[Sample]:
    """``expr`` evaluated now (``/api/v1/query``): one sample per series; a scalar comes back as one label-less sample."""
    data = _get(prom_url, "/api/v1/query", {"query": expr}, timeout_s)
    if data["resultType"] in ("scalar", "string"):
        return [Sample({}, float(data["result"][1]))]
    return [Sample(dict(r["metric"]), float(r["value"][1])) for r in data["result"]]


def _range(prom_url: str, expr: str, since: float, until: float, step_s: float, timeout_s: float) -> list[Any]:
    params = {"query": expr, "start": f"{since:.3f}", "end": f"{until:.3f}", "step": f"{step_s:.3f}"}
    result: list[Any] = _get(prom_url, "/api/v1/query_range", params, timeout_s)["result"]
    return result


def _key(metric: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """An alert's identity: its name and labels (``ALERTS`` carries ``alertstate`` too, ``ALERTS_FOR_STATE`` not).
    Without the name, two alerts with the same labels (e.g. only ``severity``) would share one active time."""
    return tuple(sorted((k, v) for k, v in metric.items() if k not in ("__name__", "alertstate")))


def alerts_fired(
    prom_url: str, since: float, *, until: float | None = None, step_s: float = 1.0, timeout_s: float = 10.0
) -> list[FiredAlert]:
    """Every alert that was firing at some rule evaluation between ``since`` and ``until`` (default now), each with
    the time it became active and the first time it was seen firing, in the order they fired. ``step_s`` is the
    resolution (the sandbox evaluates its rules every ``serving.heartbeat_interval_s``); it widens on long windows
    to stay within Prometheus's limit on points per series."""
    end = time.time() if until is None else until
    if end <= since:
        return []
    step = max(step_s, (end - since) / MAX_POINTS)
    firing = _range(prom_url, 'ALERTS{alertstate="firing"}', since, end, step, timeout_s)
    active = {_key(s["metric"]): s["values"] for s in _range(prom_url, "ALERTS_FOR_STATE", since, end, step, timeout_s)}
    out = []
    for series in firing:
        metric, values = series["metric"], series["values"]
        fired_at = float(values[0][0])
        starts = [float(v) for t, v in active.get(_key(metric), []) if float(t) <= fired_at]
        labels = {k: v for k, v in metric.items() if k not in _META}
        out.append(FiredAlert(metric["alertname"], labels, starts[-1] if starts else fired_at, fired_at))
    return sorted(out, key=lambda a: (a.fired_at, a.alertname))
