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
* no deadline in a CI-tier module (outside tests/support/patience.py) is a judged figure: a clock reading plus X
  (``time.monotonic() + X``, or a name assigned from a reading plus X) is a liveness bound only when X is a constant
  of at least LIVENESS_MIN_S seconds or names the caller's patience (a name with ``patience`` or ``timeout`` in it);
  one derived from the spec or the plan (a heartbeat, a start-up budget) or under LIVENESS_MIN_S seconds is a target
  the suite would judge by waiting that long and failing (use patience.py's ``wait_until``/``PATIENCE_S``, or move
  the claim to the rehearsal);
* no ``pytest.approx`` in a test that waits on real processes, hosts or sleeps compares a value named as a measured
  time or rate (``…_s``, ``pace``, ``qps``, ``rate``, …): a pace read in real time within a tolerance is a judgment
  of the machine's speed;
* a clock read bare (``from time import monotonic``; ``import time as t``) is a clock reading all the same;
* no CI-tier module imports the rehearsal tier, and no CI-tier drill is judged on the plan's targets;
* every rehearsal test records its figures (the ``rehearsal`` fixture), so scripts/rehearse.sh's report holds them.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.paths import REPO

TESTS = REPO / "tests"
REHEARSAL = TESTS / "rehearsal"
CLOCKS = {"monotonic", "time", "perf_counter", "monotonic_ns", "perf_counter_ns", "time_ns"}
TIMED = re.compile(r"(_s|_ms|seconds|^took|^elapsed|^wall|latency)$")
RATE = re.compile(r"(^|_)(rate|pace|qps|rps|throughput)$")  # a measured rate by its name (error_rate: a share)
SHARE = re.compile(r"error|fail|hit|miss|share|ratio")
CONFIGURED = re.compile(r"(configured|planned|expected|target|budget)_")  # a value set or derived, not measured
CONFIG = {"spec", "config", "plan"}  # an attribute read through one of these is configured
PATIENT = re.compile(r"patience|timeout", re.IGNORECASE)  # a caller's patience: a liveness bound it was given
LIVENESS_MIN_S = 30.0  # a constant deadline shorter than this is a judged figure, not a liveness bound
PATIENCE_MODULE = TESTS / "support" / "patience.py"  # the one place that turns patience into a deadline
# a test with no fixture but these (and no wait of the module's in its own source) computes on values it made
PURE_FIXTURES = {"tmp_path", "monkeypatch", "capsys", "capfd", "caplog", "recwarn", "request"}
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
        return f"{self.path.relative_to(REPO)}:{self.line}: {self.why}: {self.source}"


@dataclass(frozen=True)
class Clocks:
    """How a module reads the clock: the modules it calls ``time`` (and asyncio's ``loop``), and the clock functions it
    imported bare (``from time import monotonic``)."""

    modules: frozenset[str] = frozenset({"time", "loop"})
    bare: frozenset[str] = frozenset()

    @classmethod
    def of(cls, tree: ast.AST) -> Clocks:
        modules, bare = {"time", "loop"}, set()
        for n in ast.walk(tree):
            if isinstance(n, ast.Import):
                modules |= {a.asname for a in n.names if a.name == "time" and a.asname}
            elif isinstance(n, ast.ImportFrom) and n.module == "time":
                bare |= {a.asname or a.name for a in n.names if a.name in CLOCKS}
        return cls(frozenset(modules), frozenset(bare))


def _clock_call(node: ast.AST, clocks: Clocks = Clocks()) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Name):
        return f.id in clocks.bare
    return (
        isinstance(f, ast.Attribute)
        and f.attr in CLOCKS
        and isinstance(f.value, ast.Name)
        and f.value.id in clocks.modules
    )


def _reads_clock(expr: ast.AST, clocked: set[str], clocks: Clocks = Clocks()) -> bool:
    return any(_clock_call(n, clocks) or (isinstance(n, ast.Name) and n.id in clocked) for n in ast.walk(expr))


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value
    return None


def _duration(
    expr: ast.AST, clocked: set[str], durations: set[str], real_time: bool, clocks: Clocks = Clocks()
) -> str | None:
    """Why ``expr`` is a real-time duration, or None."""
    for n in ast.walk(expr):
        if (
            isinstance(n, ast.BinOp)
            and isinstance(n.op, ast.Sub)
            and (_reads_clock(n.left, clocked, clocks) or _reads_clock(n.right, clocked, clocks))
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


def _leaves(x: ast.AST) -> list[str] | None:
    """The names an offset is made of (an attribute by its last part; a call by its arguments), or None when it holds
    something else."""
    if isinstance(x, ast.Constant) and isinstance(x.value, int | float) and not isinstance(x.value, bool):
        return []
    if name := _name(x):
        return [name]
    parts: list[ast.AST]
    if isinstance(x, ast.BinOp):
        parts = [x.left, x.right]
    elif isinstance(x, ast.UnaryOp):
        parts = [x.operand]
    elif isinstance(x, ast.Call):
        parts = [*x.args, *(k.value for k in x.keywords)]
    else:
        return None
    found: list[str] = []
    for part in parts:
        if (leaves := _leaves(part)) is None:
            return None
        found += leaves
    return found


def _seconds(x: ast.AST) -> float | None:
    """The value of an offset made of numbers and arithmetic only, or None."""
    if isinstance(x, ast.Constant) and isinstance(x.value, int | float) and not isinstance(x.value, bool):
        return float(x.value)
    if isinstance(x, ast.UnaryOp) and isinstance(x.op, ast.USub) and (v := _seconds(x.operand)) is not None:
        return -v
    if isinstance(x, ast.BinOp) and (a := _seconds(x.left)) is not None and (b := _seconds(x.right)) is not None:
        ops = {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}
        return ops.get(type(x.op), a / b if isinstance(x.op, ast.Div) and b else None)
    return None


def _addends(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _addends(node.left) + _addends(node.right)
    return [node]


def _judged_deadline(add: ast.BinOp, stamps: set[str], clocks: Clocks) -> str | None:
    """Why ``add`` (a sum holding a clock reading) is a judged deadline, or None (no reading, or a liveness bound: a
    constant of LIVENESS_MIN_S s or more, or the caller's patience)."""
    parts = _addends(add)
    now = [p for p in parts if _clock_call(p, clocks) or (isinstance(p, ast.Name) and p.id in stamps)]
    rest = [p for p in parts if p not in now]
    if not now or not rest:
        return None
    offset = " + ".join(ast.unparse(p) for p in rest)
    found = [_leaves(p) for p in rest]
    leaves = [leaf for f in found for leaf in (f if f is not None else ["?"])]
    if not leaves:
        if sum(_seconds(p) or 0.0 for p in rest) >= LIVENESS_MIN_S:
            return None
        why = f"under {LIVENESS_MIN_S:g} s, a bound that judges the machine's speed"
    elif all(PATIENT.search(leaf) for leaf in leaves):
        return None
    else:
        why = "not a caller's patience (derived from the spec, the plan or the test's own figure)"
    return f"a deadline {offset} s after a clock reading, {why}: a judged deadline, not a liveness bound"


def _deadline_sums(tree: ast.AST) -> Iterator[ast.BinOp]:
    """The sums a module assigns (``deadline = …``) or compares (``while now < t0 + …``): where a deadline is."""
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign | ast.AnnAssign) and n.value is not None:
            candidates = n.value.elts if isinstance(n.value, ast.Tuple) else [n.value]
        elif isinstance(n, ast.Compare):
            candidates = [n.left, *n.comparators]
        else:
            continue
        yield from (c for c in candidates if isinstance(c, ast.BinOp) and isinstance(c.op, ast.Add))


def _parametrized(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The argument names ``@pytest.mark.parametrize`` gives ``fn``: values, not fixtures."""
    names: set[str] = set()
    for d in fn.decorator_list:
        if isinstance(d, ast.Call) and _name(d.func) == "parametrize" and d.args:
            first = d.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                names |= {a.strip() for a in first.value.split(",")}
            elif isinstance(first, ast.Tuple | ast.List):
                names |= {e.value for e in first.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return names


def _pure(fn: ast.FunctionDef | ast.AsyncFunctionDef, source: str) -> bool:
    """A function that takes no fixture but the pure ones (or parametrized values) and waits on nothing itself: what
    it compares, it made."""
    args = {a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)}
    return args <= PURE_FIXTURES | _parametrized(fn) and not any(k in source for k in REAL_TIME)


def _approx_call(node: ast.AST, approx: set[str]) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Name) and f.id in approx) or (
        isinstance(f, ast.Attribute) and f.attr == "approx" and isinstance(f.value, ast.Name) and f.value.id == "pytest"
    )


def _chain(node: ast.AST) -> list[str]:
    """``a.b.c`` → ``["a", "b", "c"]``; anything else → []."""
    if isinstance(node, ast.Attribute):
        return [*_chain(node.value), node.attr]
    return [node.id] if isinstance(node, ast.Name) else []


def _measured_name(expr: ast.AST) -> str | None:
    """The first name in ``expr`` that says a measured time or rate (not a constant, not a configured value: one
    named so, or read from a spec, a config or a plan)."""
    read = {id(x) for n in ast.walk(expr) if isinstance(n, ast.Attribute) and CONFIG & set(_chain(n))
            for x in ast.walk(n)}  # fmt: skip
    for n in ast.walk(expr):
        if id(n) in read:
            continue
        name = _name(n)
        configured = not name or name.isupper() or CONFIGURED.match(name)
        if not configured and (TIMED.search(name) or (RATE.search(name) and not SHARE.search(name))):
            return name
    return None


def timing_judgments(path: Path) -> list[Violation]:
    """Every judgment of real time in ``path``: an assert that bounds a real-time duration from above (its lower bounds
    are not judged: a slower machine cannot fail them), a deadline that is a judged figure (outside
    tests/support/patience.py), a ``pytest.approx`` on a measured time or rate in a test that waits on real things."""
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text)
    clocks = Clocks.of(tree)
    real_time = any(k in text for k in REAL_TIME) or bool(clocks.bare)
    approx = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "pytest"
              for a in n.names if a.name == "approx"}  # fmt: skip

    def exempt(n: ast.AST) -> bool:
        return any(EXEMPT in lines[i - 1] for i in range(n.lineno, (n.end_lineno or n.lineno) + 1))

    found = []
    stamps: set[str] = set()  # names assigned a clock reading itself (t0 = time.monotonic())
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign | ast.AnnAssign) and n.value is not None:
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            for t in targets:
                pairs = zip(t.elts, n.value.elts, strict=False) if isinstance(t, ast.Tuple) and isinstance(
                    n.value, ast.Tuple) else [(t, n.value)]  # fmt: skip
                stamps |= {x.id for x, v in pairs if isinstance(x, ast.Name) and _clock_call(v, clocks)}
    if path.resolve() != PATIENCE_MODULE.resolve():
        for add in _deadline_sums(tree):
            if not exempt(add) and (why := _judged_deadline(add, stamps, clocks)):
                found.append(Violation(path, add.lineno, why, ast.unparse(add)[:160]))
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        clocked: set[str] = set()  # names assigned from a clock reading
        durations: set[str] = set()  # names assigned from a difference of them
        for n in ast.walk(fn):
            if isinstance(n, ast.Assign | ast.AnnAssign | ast.AugAssign) and n.value is not None:
                if not _reads_clock(n.value, clocked, clocks):
                    continue
                names = {x.id for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                         for x in ast.walk(t) if isinstance(x, ast.Name)}  # fmt: skip
                clocked |= names
                if any(isinstance(b, ast.BinOp) and isinstance(b.op, ast.Sub) for b in ast.walk(n.value)):
                    durations |= names
        for n in ast.walk(fn):
            if not isinstance(n, ast.Assert) or exempt(n):
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
                    if why := _duration(bounded, clocked, durations, real_time, clocks):
                        found.append(Violation(path, n.lineno, why, "assert " + ast.unparse(n.test)[:160]))
        if not real_time or _pure(fn, ast.get_source_segment(text, fn) or ""):
            continue
        for c in (c for c in ast.walk(fn) if isinstance(c, ast.Compare) and not exempt(c)):
            operands = [c.left, *c.comparators]
            if any(_approx_call(o, approx) for o in operands) and (name := _measured_name(c)):
                why = f"pytest.approx on {name}, a measured time or rate by its name: the machine's speed within a tolerance"
                found.append(Violation(path, c.lineno, why, ast.unparse(c)[:160]))
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
    configured `…_s`. It catches a deadline that is a judged figure (a spec's or a test's own figure, a constant under
    LIVENESS_MIN_S s; after a reading named first too) and passes a caller's patience, a long constant, a skewed
    clock and tests/support/patience.py's own; it catches ``pytest.approx`` on a measured time or rate in a test that
    waits on real things, not on a configured one nor in a pure test; and it reads a clock imported bare, or under
    another name, as a clock."""
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

    deadlines = tmp_path / "test_deadlines.py"
    deadlines.write_text(
        "import time\n"
        "from tests.support.patience import PATIENCE_S\n"
        "def test_c(spec, interval, patience_s, sb):\n"
        "    by = time.monotonic() + 20 * interval + 60\n"  # 4: the plan's figure
        "    by = time.monotonic() + spec.serving.startup_budget_s\n"  # 5: a product budget
        "    by = time.monotonic() + 10\n"  # 6: a constant under 30 s
        "    t0 = time.monotonic()\n"
        "    while time.monotonic() < t0 + 5:\n"  # 8: after a reading named first
        "        pass\n"
        "    by = time.monotonic() + 60\n"  # 10: a long constant: a liveness bound
        "    by = time.monotonic() + patience_s\n"  # 11: the caller's patience
        "    by = time.monotonic() + 2 * PATIENCE_S + sb.timeout_s\n"  # 12: patience and a timeout
        "    clock = lambda: time.time() + 5\n"  # 13: a skewed clock, no deadline
        "    window = time.monotonic() + 3  # not a timing judgment: how long to sample\n"  # 14: exempt
    )
    assert [v.line for v in timing_judgments(deadlines)] == [4, 5, 6, 8]
    assert "under 30 s" in timing_judgments(deadlines)[2].why
    assert "derived from the spec" in timing_judgments(deadlines)[1].why
    assert timing_judgments(PATIENCE_MODULE) == []  # where the patience becomes a deadline

    approx = tmp_path / "test_approx.py"
    approx.write_text(
        "import pytest, subprocess\n"
        "from pytest import approx as near\n"
        "def test_d(sandbox, report, spec, doc):\n"
        "    pace = report.count / report.wall_s\n"
        "    assert pace == pytest.approx(300, rel=0.1)\n"  # 5: a measured rate
        "    assert near(0.02) == report.p50_s\n"  # 6: a measured time, approx imported bare
        "    assert report.error_rate == pytest.approx(0.0)\n"  # 7: a share, not a rate: fine
        "    assert doc['configured_wait_s'] == pytest.approx(spec.rollout.interval_s * 3)\n"  # 8: configured: fine
        "    assert report.carried == pytest.approx(8 * report.accepted)\n"  # 9: counts: fine
        "def test_e():\n"
        "    assert LoadReport((), wall_s=10.0).qps == pytest.approx(0.0)\n"  # 11: a pure test: fine
        "@pytest.mark.parametrize('offset', [1.0])\n"
        "def test_f(offset, tmp_path):\n"
        "    assert parse(tmp_path)['offset_s'] == pytest.approx(offset)\n"  # 14: a parametrized value: pure
    )
    assert [v.line for v in timing_judgments(approx)] == [5, 6]

    bare = tmp_path / "test_bare.py"
    bare.write_text(
        "import time as clock\n"
        "from time import monotonic, perf_counter as pc\n"
        "def test_g():\n"
        "    t0 = monotonic()\n"
        "    assert monotonic() - t0 < 5\n"  # 5: a difference of bare readings
        "    took = pc() - t0\n"
        "    assert took <= 2\n"  # 7: a name assigned from one
        "    by = monotonic() + 5\n"  # 8: a deadline after a bare reading
        "    assert clock.monotonic() - t0 < 1\n"  # 9: the time module under another name
    )
    assert [v.line for v in timing_judgments(bare)] == [5, 7, 8, 9]


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
