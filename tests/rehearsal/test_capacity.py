"""The scale sandbox's calibration (serving/sandbox/capacity.py) on this machine: a simulated worker's request and an
agent's probe cost what a machine fit for the scale sandbox spends on them. The CI test
(tests/test_sandbox_capacity.py) judges that both are measured and the calibration's processes are gone after."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from serving.sandbox import capacity
from tests.support.rehearsal import at_least, verdict, within

REQUEST_MS, PROBE_MS = 50, 200  # CPU a request in the worker host, a probe in the agent, at most


def test_a_request_and_a_probe_cost_what_a_fit_machine_spends(rehearsal: Callable[..., dict[str, Any]]) -> None:
    """An agent's probe is two requests plus parsing /metrics on the agent's side: it costs more than one request
    costs the worker host."""
    costs = capacity.measure_costs(workers=16, probes=400)
    figures = [
        within("request", costs.request_ms, REQUEST_MS, "ms"),
        within("probe", costs.probe_ms, PROBE_MS, "ms"),
        at_least("probe, over a request", costs.probe_ms, costs.request_ms, "ms"),
    ]
    rehearsal("capacity", verdict(figures), figures, speed=costs.speed)
    assert costs.request_ms < REQUEST_MS and costs.probe_ms < PROBE_MS, costs
    assert costs.probe_ms > costs.request_ms, costs
