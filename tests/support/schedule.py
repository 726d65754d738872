"""Longest work first under pytest-xdist's own ``--dist loadfile`` and ``loadgroup`` (scripts/test.sh's phases).

xdist deals work units (a module under loadfile; an ``xdist_group`` under loadgroup) one to each worker, then a second
at once to a worker whose first has two tests or fewer, then the next to a worker as soon as it has two tests or fewer
left (``xdist/scheduler/loadscope.py``, which both modes subclass). Which unit comes next is the queue's order: by
default the units with the most tests first (``--loadscope-reorder``), so a long unit of one or two tests came last and
set a phase's end (the wait-bound phase lasted 330 s for 1,318 s of tests on six workers; its longest group, 130 s,
had two tests). Here the queue is the collection's order, set through xdist's public option and hook only:

* :func:`keep_collection_order` turns xdist's reordering off (``--no-loadscope-reorder``) under loadfile and
  loadgroup: the units are dealt in the order their first tests were collected;
* :func:`longest_first` orders each worker's collection once its tests are selected (tests/conftest.py's last
  ``pytest_collection_modifyitems``; every worker collects, and xdist checks they agree) unit by unit, the heaviest
  first, each unit's tests in the order they came. When the units are groups (the sandbox phases) the first wave
  alternates the lightest and the heaviest left, starting with the lightest (:func:`dealing_order`): dealt strictly
  longest first, the wait-bound phase started its heaviest rollouts together and two clean-clone CI runs failed two
  timing judgments each (2026-12-04). A worker runs under ``--dist no``: the controller's mode reaches it through
  xdist's ``pytest_configure_node`` hook (:func:`tell_worker`).

A module split into ``SANDBOX_GROUPS`` is dealt into them by the same rule (:func:`deal`, tests/conftest.py). The
weights are the seconds each test took in the last measured run, ``tests/durations.json`` (tests of :data:`LISTED_S`
or more; the rest weigh :data:`UNLISTED_S`), refreshed with ``python -m tests.support.schedule
test-output/pytest-*.xml``. They are a schedule's guess, never a result: a stale file makes a phase slower, not wrong
(a split module's tests must not depend on which of them share a sandbox).
"""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

# the suite's own file; EXASERVE_TEST_DURATIONS names another (tests/test_architecture.py's scheduler test)
DURATIONS = Path(os.environ.get("EXASERVE_TEST_DURATIONS") or Path(__file__).resolve().parent.parent / "durations.json")
LISTED_S = 0.5  # tests that took this long or more are listed
UNLISTED_S = 0.25  # what a test not listed weighs


def load_durations(path: Path = DURATIONS) -> dict[str, float]:
    """Test node id (without xdist's ``@group``) → seconds; empty when the file is missing or unreadable."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in doc.items()} if isinstance(doc, dict) else {}


def seconds(nodeid: str, durations: dict[str, float]) -> float:
    base = nodeid.rsplit("@", 1)[0] if nodeid.rfind("@") > nodeid.rfind("]") else nodeid
    return durations.get(base, UNLISTED_S)


def deal(ids: Sequence[str], groups: int, durations: dict[str, float]) -> list[int]:
    """The group (0 … groups − 1) of each test: longest first, each to the group with the least so far."""
    load = [0.0] * groups
    out = [0] * len(ids)
    for i in sorted(range(len(ids)), key=lambda i: -seconds(ids[i], durations)):
        g = min(range(groups), key=lambda g: (load[g], g))
        out[i] = g
        load[g] += seconds(ids[i], durations)
    return out


DEALT_IN_ORDER = ("loadfile", "loadgroup")  # the --dist modes whose units follow the collection's order here
DIST = "exaserve_dist"  # the controller's --dist, in each worker's ``config.workerinput`` (a worker runs --dist no)


def dealing_order(weights: dict[str, float], alternate: int = 0) -> list[str]:
    """The units of ``weights`` (unit → seconds, in collection order) in the order to deal them: the heaviest first,
    ties in collection order; the first ``alternate`` of them alternate the lightest and the heaviest left, starting
    with the lightest (the first wave of ``alternate`` workers mixes light and heavy units)."""
    left = sorted(weights, key=lambda unit: -weights[unit])
    out: list[str] = []
    while left:
        out.append(left.pop(-1 if len(out) < alternate and len(out) % 2 == 0 else 0))
    return out


def keep_collection_order(config: pytest.Config) -> None:
    """On the controller, under ``--dist loadfile``/``loadgroup``: xdist deals the units in the collection's order
    (its own ``--no-loadscope-reorder``), which :func:`longest_first` sets. A no-op without xdist or under another
    mode."""
    if config.getoption("dist", default=None) in DEALT_IN_ORDER:
        config.option.loadscopereorder = False


def tell_worker(node: Any) -> None:
    """xdist's ``pytest_configure_node`` (on the controller, before a worker starts): the worker's
    ``config.workerinput`` carries the ``--dist`` it works under."""
    node.workerinput[DIST] = node.config.getoption("dist")


def _unit(item: pytest.Item) -> tuple[str, bool]:
    """The work unit of ``item`` under scripts/test.sh's phases, and whether it is a group: its ``xdist_group``
    names joined as xdist joins them (loadgroup: the sandbox phases, where every test has one), else its file
    (loadfile: the cpu-bound phase, where none has)."""
    marks = item.iter_markers("xdist_group")
    names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in marks})
    return ("_".join(names), True) if names else (item.nodeid.split("::", 1)[0], False)


def longest_first(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker under ``--dist loadfile``/``loadgroup``, once the tests are selected (and shuffled, if
    pytest-random-order was asked to): reorder ``items`` unit by unit in :func:`dealing_order`, each unit's tests in
    the order they came. When the units are groups (the sandbox phases), the first wave alternates over the phase's
    workers. Elsewhere (no xdist, another mode) nothing changes."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or workerinput.get(DIST) not in DEALT_IN_ORDER:
        return
    durations = load_durations()
    units = [_unit(item) for item in items]
    weights: dict[str, float] = {}
    for item, (unit, _group) in zip(items, units, strict=True):
        weights[unit] = weights.get(unit, 0.0) + seconds(item.nodeid, durations)
    alternate = int(workerinput["workercount"]) if any(group for _unit, group in units) else 0
    rank = {unit: i for i, unit in enumerate(dealing_order(weights, alternate))}
    order = sorted(range(len(items)), key=lambda i: rank[units[i][0]])  # stable: a unit's tests keep their order
    items[:] = [items[i] for i in order]


def junit_seconds(junit: Path) -> Iterable[tuple[str, float]]:
    """(node id, seconds: setup, call and teardown) of each test in one JUnit XML."""
    for case in ET.parse(junit).iter("testcase"):
        name, parts = case.get("name", ""), case.get("classname", "").split(".")
        if name.rfind("@") > name.rfind("]"):
            name = name.rsplit("@", 1)[0]
        module = next((i for i, part in enumerate(parts) if part.startswith("test_")), len(parts) - 1)
        path = "/".join(parts[: module + 1]) + ".py"
        yield "::".join([path, *parts[module + 1 :], name]), float(case.get("time", 0.0))


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m tests.support.schedule test-output/pytest-*.xml", file=sys.stderr)
        return 2
    measured = {nodeid: s for path in argv for nodeid, s in junit_seconds(Path(path))}
    listed = {k: round(v, 1) for k, v in sorted(measured.items()) if v >= LISTED_S}
    DURATIONS.write_text(json.dumps(listed, indent=0) + "\n")
    print(f"{DURATIONS}: {len(listed)} of {len(measured)} tests took {LISTED_S:g} s or more")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
