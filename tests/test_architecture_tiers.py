"""The two test tiers (issue 37): the CI suite (scripts/test.sh) judges what happened and in what order, never how
long it took; real-time judgments against targets live in the rehearsal tier (tests/rehearsal/, scripts/rehearse.sh).

These tests read the suite's source (the AST) and hold the rule:

* no assert in a CI-tier test or support module puts an upper bound on a real-time duration: a difference of real
  clock readings (``time.monotonic() - t0``, or a name assigned from one), or — in a module that waits on real
  processes, hosts or sleeps — a value named as a measured time (``…_s``, ``…_ms``, ``…seconds``, ``took``,
  ``elapsed``, ``wall``, ``…latency``; constants in capitals are configured, not measured). A bound on the time
  something may take is a liveness limit and goes through tests/support/patience.py (which fails saying what it
  waited for and what it saw), or the claim is a rehearsal. A comparison that is not a judged duration (the order of
  two timestamps, a parsed value) says so on its line: ``# not a timing judgment: WHY``;
* no CI-tier module imports the rehearsal tier, and no CI-tier drill is judged on the plan's targets;
* every rehearsal test records its figures (the ``rehearsal`` fixture), so scripts/rehearse.sh's report holds them.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from tests.support.paths import REPO

TESTS = REPO / "tests"
REHEARSAL = TESTS / "rehearsal"
CLOCKS = {"monotonic", "time", "perf_counter", "monotonic_ns", "perf_counter_ns", "time_ns"}
TIMED = re.compile(r"(_s|_ms|seconds|^took|^elapsed|^wall|latency)$")
# a module whose source says one of these waits on something real: its `…_s` values may be measured
REAL_TIME = ("running_sandbox", "ssh_hosts", "tests.support.drills", "subprocess", "json_server", "time.sleep",
             "asyncio.sleep", "time.monotonic", "Popen")  # fmt: skip
EXEMPT = "# not a timing judgment:"


@dataclass(frozen=True)
class Violation:
    path: Path
    line: int
    why: str
    source: str

    def __str__(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}: {self.why}: assert {self.source}"


def _clock_call(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in CLOCKS
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in {"time", "loop"}
    )


def _reads_clock(expr: ast.AST, clocked: set[str]) -> bool:
    return any(_clock_call(n) or (isinstance(n, ast.Name) and n.id in clocked) for n in ast.walk(expr))


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value
    return None


def _duration(expr: ast.AST, clocked: set[str], durations: set[str], real_time: bool) -> str | None:
    """Why ``expr`` is a real-time duration, or None."""
    for n in ast.walk(expr):
        if (
            isinstance(n, ast.BinOp)
            and isinstance(n.op, ast.Sub)
            and (_reads_clock(n.left, clocked) or _reads_clock(n.right, clocked))
        ):
            return "a difference of real clock readings"
        if isinstance(n, ast.Name) and n.id in durations:
            return f"{n.id}, a difference of real clock readings"
    if real_time:
        for n in ast.walk(expr):
            name = _name(n)
            if name and not name.isupper() and TIMED.search(name):
                return f"{name}, a measured time by its name"
    return None


def timing_judgments(path: Path) -> list[Violation]:
    """Every assert in ``path`` that bounds a real-time duration from above (its lower bounds are not judged: a
    slower machine cannot fail them)."""
    text = path.read_text()
    lines = text.splitlines()
    real_time = any(k in text for k in REAL_TIME)
    found = []
    for fn in ast.walk(ast.parse(text)):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        clocked: set[str] = set()  # names assigned from a clock reading
        durations: set[str] = set()  # names assigned from a difference of them
        for n in ast.walk(fn):
            if isinstance(n, ast.Assign | ast.AnnAssign | ast.AugAssign) and n.value is not None:
                if not _reads_clock(n.value, clocked):
                    continue
                names = {x.id for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                         for x in ast.walk(t) if isinstance(x, ast.Name)}  # fmt: skip
                clocked |= names
                if any(isinstance(b, ast.BinOp) and isinstance(b.op, ast.Sub) for b in ast.walk(n.value)):
                    durations |= names
        for n in ast.walk(fn):
            if not isinstance(n, ast.Assert) or any(EXEMPT in lines[i - 1] for i in range(n.lineno, n.end_lineno + 1)):
                continue
            for c in (c for c in ast.walk(n.test) if isinstance(c, ast.Compare)):
                operands = [c.left, *c.comparators]
                for i, op in enumerate(c.ops):
                    if isinstance(op, ast.Lt | ast.LtE):
                        bounded = operands[i]
                    elif isinstance(op, ast.Gt | ast.GtE):
                        bounded = operands[i + 1]
                    else:
                        continue
                    if why := _duration(bounded, clocked, durations, real_time):
                        found.append(Violation(path, n.lineno, why, ast.unparse(n.test)[:160]))
    return sorted(set(found), key=lambda v: (str(v.path), v.line))


def ci_tier() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if REHEARSAL not in p.parents)


def test_no_ci_tier_test_judges_a_real_time_duration() -> None:
    found = [str(v) for p in ci_tier() for v in timing_judgments(p)]
    assert not found, (
        "real-time judgments in the CI tier (wait with tests/support/patience.py, move the claim to tests/rehearsal/, "
        f"or say `{EXEMPT} WHY` on the line):\n" + "\n".join(found)
    )


def test_the_rule_finds_what_it_is_for(tmp_path: Path) -> None:
    """The rule catches a clock difference, a name assigned from one and a measured time by name (in a module that
    waits on real processes), and passes a deadline check, a lower bound, an exempt line and a pure module's
    configured `…_s`."""
    waits = tmp_path / "test_waits.py"
    waits.write_text(
        "import subprocess, time\n"
        "def test_a(doc, deadline):\n"
        "    t0 = time.monotonic()\n"
        "    took = time.monotonic() - t0\n"
        "    assert time.monotonic() - t0 < 5\n"  # 5: a clock difference
        "    assert took <= 2\n"  # 6: a name assigned from one
        "    assert doc['detection_s'] <= 4\n"  # 7: a measured time by its name
        "    assert 1 < took\n"  # 8: a lower bound: fine
        "    assert time.monotonic() < deadline\n"  # 9: a deadline: fine
        "    assert doc['a_at'] < doc['b_s']  # not a timing judgment: two timestamps in order\n"  # 10: exempt
        "    assert doc['x'] >= 2 * doc['y_s']\n"  # 11: the upper-bounded side is y_s
    )
    pure = tmp_path / "test_pure.py"
    pure.write_text("def test_b(spec):\n    assert spec.heartbeat_interval_s <= 5\n")
    assert [v.line for v in timing_judgments(waits)] == [5, 6, 7, 11]
    assert timing_judgments(pure) == []


def _imports(path: Path) -> set[str]:
    found = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.ImportFrom) and n.module:
            found |= {n.module, *(f"{n.module}.{a.name}" for a in n.names)}
        elif isinstance(n, ast.Import):
            found |= {a.name for a in n.names}
    return found


def test_the_ci_tier_imports_nothing_of_the_rehearsal_and_judges_no_drill_on_targets() -> None:
    bad = []
    for path in ci_tier():
        rel = path.relative_to(REPO)
        if rel.as_posix() == "tests/test_architecture_tiers.py":
            continue
        if {m for m in _imports(path) if m.startswith("tests.rehearsal")}:
            bad.append(f"{rel} imports the rehearsal tier")
        for call in (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)):
            literals = [a.value for a in call.args if isinstance(a, ast.Constant)]
            measured = {"drill", "--scenario", "--json"} <= set(literals) and "--judge" not in literals  # the default
            if measured or ("targets" in literals and _name(call.func) in {"run", "cli", "exaserve"}):
                bad.append(f"{rel}:{call.lineno}: a drill judged on the plan's targets (CI judges by order)")
    assert not bad, bad


def test_every_rehearsal_test_records_its_figures() -> None:
    """scripts/rehearse.sh's report is what the rehearsal tests recorded: a test that records nothing would pass
    without a figure in it."""
    tests = [
        (path, fn)
        for path in sorted(REHEARSAL.glob("test_*.py"))
        for fn in ast.walk(ast.parse(path.read_text()))
        if isinstance(fn, ast.FunctionDef) and fn.name.startswith("test_")
    ]
    assert tests, "no rehearsal test found"
    silent = [f"{p.name}::{fn.name}" for p, fn in tests if "rehearsal" not in {a.arg for a in fn.args.args}]
    assert not silent, f"rehearsal tests that record nothing (take the `rehearsal` fixture): {silent}"
