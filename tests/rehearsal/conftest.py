"""The rehearsal tier: real-time judgments against the plan's targets, run by ``scripts/rehearse.sh``, never by
``scripts/test.sh`` (the CI suite's verdicts must not depend on how fast or loaded its machine is).

Every test here is marked ``rehearsal`` (test.sh deselects the marker; tests/test_architecture_tiers.py keeps real-time
judgments out of the rest) and records what it measured through the ``rehearsal`` fixture
(tests/support/rehearsal.py): each figure, its target and its verdict, which rehearse.sh gathers into its report.
A test fails when a figure misses its target; a measurement that slipped (a starved prober, a time over its target
only by what the probes cannot resolve) is recorded ``invalid`` and fails too: never passed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.rehearsal import write_record

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.rehearsal)


@pytest.fixture
def rehearsal(request: pytest.FixtureRequest) -> Callable[..., dict[str, Any]]:
    """``rehearsal(kind, verdict, figures, **detail)``: this test's record (tests/support/rehearsal.py)."""

    def record(kind: str, verdict: Any, figures: Any, **detail: Any) -> dict[str, Any]:
        return write_record(request.node.nodeid, kind, verdict, figures, **detail)

    return record
