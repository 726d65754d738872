"""`serving.prometheus_api.alerts_fired` against Prometheus's HTTP API answers (`/api/v1/query_range`, the shape of
Prometheus 2.x's `promql.Matrix` JSON: `resultType: matrix`, values as `[unix_seconds, "string"]`), served from a
canned table: the parsing and the pairing of `ALERTS` with `ALERTS_FOR_STATE` are under test, not Prometheus (the
sandbox tests run the real one, tests/test_sandbox_prometheus.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from serving.prometheus_api import alerts_fired
from tests.support.json_server import json_server

ROUTER_DOWN = {"alertname": "ExaServeRouterInstanceDown", "severity": "warning"}
EARLIER = {"alertname": "ExaServeReplicaOutOfRotation", "severity": "warning"}  # same labels but the name


def _matrix(series: list[tuple[dict[str, str], list[tuple[float, str]]]]) -> dict[str, Any]:
    result = [{"metric": m, "values": [[t, v] for t, v in values]} for m, values in series]
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


ANSWERS = {
    'ALERTS{alertstate="firing"}': _matrix(
        [
            ({"__name__": "ALERTS", "alertstate": "firing", **EARLIER}, [(50.0, "1"), (51.0, "1")]),
            ({"__name__": "ALERTS", "alertstate": "firing", **ROUTER_DOWN}, [(104.0, "1"), (105.0, "1")]),
        ]
    ),
    # ALERTS_FOR_STATE's value is the time the alert became active (Prometheus rules/alerting.go, forStateSample)
    "ALERTS_FOR_STATE": _matrix(
        [
            ({"__name__": "ALERTS_FOR_STATE", **ROUTER_DOWN}, [(t, "90") for t in (90.0, 104.0, 105.0)]),
            ({"__name__": "ALERTS_FOR_STATE", **EARLIER}, [(t, "40") for t in (40.0, 50.0, 51.0)]),
        ]
    ),
}


def _answer(path: str) -> dict[str, Any]:
    url = urlsplit(path)
    assert url.path == "/api/v1/query_range", path
    return ANSWERS[parse_qs(url.query)["query"][0]]


@pytest.fixture
def prometheus() -> Iterator[str]:
    with json_server(_answer) as url:
        yield url


def test_each_alert_is_paired_with_its_own_active_time_when_two_share_their_labels(prometheus: str) -> None:
    """CI's router-loss drill: ExaServeRouterInstanceDown fired (Prometheus showed it) and the drill said it did not.
    Its ALERTS_FOR_STATE series was matched by its labels without the alert's name, so another warning alert active
    earlier lent it an active time before the fault, and the drill dropped it as not its own."""
    fired = {a.alertname: a for a in alerts_fired(prometheus, 0.0, until=200.0)}
    assert fired["ExaServeRouterInstanceDown"].active_at == 90.0
    assert fired["ExaServeRouterInstanceDown"].fired_at == 104.0
    assert fired["ExaServeReplicaOutOfRotation"].active_at == 40.0
    assert fired["ExaServeRouterInstanceDown"].labels == {"severity": "warning"}
