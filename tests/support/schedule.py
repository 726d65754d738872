"""Longest work first, for pytest-xdist's ``--dist loadfile`` and ``loadgroup`` (scripts/test.sh's phases).

xdist deals work units (a module, or an ``xdist_group``) in collection order, or by test count with its default
``--loadscope-reorder``, and hands a worker its next unit as soon as it has two tests or fewer left. A phase lasts until
its last worker finishes, and the longest units, dealt last or queued behind another long one, set that end: the
wait-bound phase lasted 330 s for 1,318 s of tests on six workers (220 s a worker) because its longest group (130 s,
two tests) came late and took a second group while both its tests were still to run.

Here the units are dealt longest first (the longest-processing-time rule), and a worker gets its next unit only when
its last test waits for it (xdist runs a test once it knows the next one, or that none comes). A module split into
``SANDBOX_GROUPS`` is dealt into them by the same rule (tests/conftest.py). The weights are the seconds each test took
in the last measured run, ``tests/durations.json`` (tests of :data:`LISTED_S` or more; the rest weigh
:data:`UNLISTED_S`), refreshed with ``python -m tests.support.schedule test-output/pytest-*.xml``. They are a
schedule's guess, never a result: a stale file makes a phase slower, not wrong (a split module's tests must not
depend on which of them share a sandbox).
"""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from xdist.scheduler import LoadFileScheduling, LoadGroupScheduling

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


class _LongestFirst:
    """Deal the heaviest unit left; refill a worker when one test is left on it (it waits for its next item)."""

    workqueue: Any
    nodes: Any
    assigned_work: Any
    alternate_first_wave = False

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)  # type: ignore[call-arg]
        self.durations = load_durations()
        self.dealt = 0

    def _weight(self, scope: str) -> float:
        return sum(seconds(nodeid, self.durations) for nodeid, done in self.workqueue[scope].items() if not done)

    def _assign_work_unit(self, node: Any) -> None:
        # a crashed worker's units come back whole (xdist's remove_node), tests already run included: a unit with
        # nothing left would send this worker nothing while its last test waits for a next item
        for scope in [s for s, unit in self.workqueue.items() if all(unit.values())]:
            del self.workqueue[scope]
        if not self.workqueue:
            node.shutdown()
            return
        lightest = self.alternate_first_wave and self.dealt < len(self.nodes) and self.dealt % 2 == 1
        pick = min if lightest else max
        self.workqueue.move_to_end(pick(self.workqueue, key=self._weight), last=False)
        self.dealt += 1
        super()._assign_work_unit(node)  # type: ignore[misc]

    def _reschedule(self, node: Any) -> None:
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        if self._pending_of(self.assigned_work[node]) > 1:
            return
        self._assign_work_unit(node)


class LongestFileFirst(_LongestFirst, LoadFileScheduling):  # type: ignore[misc]
    """``--dist loadfile`` (the cpu-bound phase), longest module first."""


class LongestGroupFirst(_LongestFirst, LoadGroupScheduling):  # type: ignore[misc]
    """``--dist loadgroup`` (the sandbox phases), longest group first, but for the first wave: every other worker
    starts on the lightest group left. Dealt strictly longest first, the wait-bound phase started its five heaviest
    rollouts together, and two clean-clone CI runs failed two timing judgments each (a drain's requests finished
    before the restart read them; 503s while a never-ready batch timed out; at six and eight workers and a 5 s health
    timeout, 2026-12-04); xdist's own order (by test count, a worker refilled while two tests are left on it) avoided
    that but lasted 359 s for 1,345 s of tests on five workers (2026-12-05), this deal 285-315 s on clean clones
    (simulated over the same groups' times: 271 s). The first wave mixes heavy and light groups; the light groups'
    workers take the heaviest left next."""

    alternate_first_wave = True


def scheduler(config: Any, log: Any) -> Any:
    """The scheduler for ``config``'s ``--dist``: longest file first under loadfile (the cpu-bound phase), longest
    group first under loadgroup (the sandbox phases), None (xdist's own) otherwise."""
    dist = config.getvalue("dist")
    return (
        LongestFileFirst(config, log)
        if dist == "loadfile"
        else LongestGroupFirst(config, log)
        if dist == "loadgroup"
        else None
    )


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
