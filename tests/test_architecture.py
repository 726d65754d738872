"""The house rules of `serving/`, checked by walking the real imports (issue 9).

- Production code never imports the simulator: only `serving/sandbox/`, `serving/cli/`, `tests/` and the
  benchmarks (`bench/`, which drive the sandbox on purpose) may import `serving.sandbox`.
- Renderers and rollout backends take the `Plan` value and never call the planner: nothing under
  `serving/render/` or `serving/rollout/` imports `serving.plan.planner`.
- Renderers never import a check (`serving.checks`); the flag manifests and the result record both use sit below both.
- One `Fleet` per stack: the planner (`serving.plan.planner.plan`) is called by the stack loader
  (`serving/plan/loader.py`) alone; everything else, tests included, takes the `Fleet` it builds.
- Importing the rollout package loads no HTTP server (aiohttp.web), tokenizers nor torch (checked in a fresh
  interpreter); aiohttp's client is the fleet-wide HTTP of :mod:`serving.fleet_http`.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.schedule import UNLISTED_S, deal, dealing_order, seconds

ROOT = Path(__file__).resolve().parent.parent
PYTHON_TREES = ("serving", "infra", "policies", "ansible", "bench", "scripts")
PLANNER = "serving.plan.planner"
STACK_LOADER = "serving/plan/loader.py"  # the one caller of the planner


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-level imports included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _python_files(*trees: str) -> list[Path]:
    return sorted(p for tree in trees for p in (ROOT / tree).rglob("*.py") if ".venv" not in p.parts)


def _importers(files: list[Path], module: str) -> list[str]:
    return [
        str(p.relative_to(ROOT)) for p in files if any(m == module or m.startswith(module + ".") for m in _imports(p))
    ]


def _planner_calls(path: Path) -> list[int]:
    """Lines of ``path`` that call ``serving.plan.planner.plan`` under any name: the function imported (aliases
    included), or the module imported (aliased or not) and its ``plan`` attribute called."""
    tree = ast.parse(path.read_text(), str(path))
    functions: set[str] = set()  # local names bound to the planner's `plan`
    modules: set[str] = set()  # dotted local names bound to the planner module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            for alias in node.names:
                if node.module == PLANNER and alias.name == "plan":
                    functions.add(alias.asname or alias.name)
                elif node.module == PLANNER.rpartition(".")[0] and alias.name == PLANNER.rpartition(".")[2]:
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            modules.update(alias.asname or alias.name for alias in node.names if alias.name == PLANNER)
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Name) and node.func.id in functions)
            or (
                isinstance(node.func, ast.Attribute)
                and node.func.attr == "plan"
                and ast.unparse(node.func.value) in modules
            )
        )
    ]


def test_the_walker_sees_imports_at_any_depth(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from serving.sandbox import worker\n    import serving.plan.planner\n")
    assert {"serving.sandbox", "serving.sandbox.worker", "serving.plan.planner"} <= _imports(probe)


def test_only_the_sandbox_cli_tests_and_benchmarks_import_the_simulator() -> None:
    allowed = ("serving/sandbox/", "serving/cli/", "bench/")
    offenders = [f for f in _importers(_python_files(*PYTHON_TREES), "serving.sandbox") if not f.startswith(allowed)]
    assert offenders == [], f"production code imports the simulator: {offenders}"


@pytest.mark.parametrize("package", ["serving/render", "serving/rollout"])
def test_renderers_and_backends_take_the_plan_instead_of_calling_the_planner(package: str) -> None:
    offenders = _importers(_python_files(package), "serving.plan.planner")
    assert offenders == [], f"{offenders} call the planner; take a serving.plan.model.Plan argument instead"


def test_render_and_checks_do_not_depend_on_each_other_both_ways() -> None:
    """Checks read rendered objects (they may import the renderers); renderers never import a check: what both need
    (the flag manifests and their argv check, the one result record) sits below them, importing neither."""
    assert _importers(_python_files("serving/render"), "serving.checks") == []
    floor = [ROOT / "serving" / "flags.py", ROOT / "serving" / "result.py"]
    assert _importers(floor, "serving.checks") == _importers(floor, "serving.render") == []


def test_the_call_walker_sees_the_planner_under_any_name(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from serving.plan.planner import plan as plan_fleet\n"
        "from serving.plan import planner\n"
        "import serving.plan.planner\n"
        "def f(spec):\n"
        "    from serving.plan.planner import plan\n"
        "    return plan_fleet(spec), planner.plan(spec), serving.plan.planner.plan(spec), plan(spec)\n"
    )
    assert _planner_calls(probe) == [6, 6, 6, 6]
    probe.write_text("from serving.plan import planner\nplanner.placement(None)\nplan = 1\n")
    assert _planner_calls(probe) == []


def test_only_the_stack_loader_calls_the_planner() -> None:
    files = _python_files(*PYTHON_TREES, "tests")
    offenders = [
        f"{p.relative_to(ROOT)}:{line}"
        for p in files
        if p.relative_to(ROOT).as_posix() != STACK_LOADER
        for line in _planner_calls(p)
    ]
    assert offenders == [], (
        f"{offenders} call the planner; load the stack's Fleet through {STACK_LOADER} (load_fleet) and pass it on"
    )


def test_importing_the_rollout_package_loads_no_http_server_tokenizer_or_torch() -> None:
    modules = [
        "serving.rollout",
        "serving.rollout.session",
        "serving.rollout.runner",
        "serving.rollout.gates.window",
        "serving.rollout.gates.findings",
        "serving.rollout.gates.verdict",
        "serving.rollout.gates.judge",
        "serving.rollout.journal",
        "serving.rollout.backends.ssh",
        "serving.rollout.backends.kubernetes",
    ]
    code = (
        "import json, sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} | {m for m in sys.modules if m.startswith('aiohttp.web')})))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = set(json.loads(proc.stdout))
    assert "serving" in loaded  # the probe really imported the package
    assert "aiohttp" in loaded  # the client of serving.fleet_http: the probe sees aiohttp's modules
    banned = {m for m in loaded if m.startswith("aiohttp.web")} | (loaded & {"tokenizers", "torch"})
    assert not banned, sorted(banned)


def test_loading_a_stack_and_planning_it_imports_no_http_client() -> None:
    """Every command loads its stack (serving.spec.stack, which checks the rollout windows through
    serving.rollout.plan); aiohttp and httpx cost that 0.27 s of each exaserve process's start, for commands that
    talk to nothing (plan, fit, render)."""
    code = (
        "import json, sys\nimport serving.spec.stack, serving.plan.loader, serving.rollout.plan\n"
        "print(json.dumps(sorted(m for m in ('aiohttp', 'httpx', 'serving.router.client') if m in sys.modules)))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == []


def _test_module_imports(path: Path) -> list[str]:
    """The test modules (``tests.test_*``) that ``path`` imports, absolute or relative, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("tests.test_")]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            names = [module] if module else [a.name for a in node.names]
            if node.level == 0:
                found += [n for n in names if n.startswith("tests.test_")]
            else:
                found += ["." * node.level + n for n in names if n.split(".")[0].startswith("test_")]
    return found


def test_the_test_import_walker_sees_absolute_and_relative_imports(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from tests.test_a import X\nimport tests.test_b\ndef f():\n    from .test_c import Y\n    from . import test_d\n"
    )
    assert sorted(_test_module_imports(probe)) == [".test_c", ".test_d", "tests.test_a", "tests.test_b"]


def test_no_test_module_imports_another_and_shared_stand_ins_live_in_tests_support() -> None:
    """A helper two test modules share (a stand-in, a fixture, a constant) lives in ``tests/support/``; test modules
    import nothing from each other, and nothing but test modules, conftest.py and packages sit in ``tests/``."""
    files = sorted((ROOT / "tests").rglob("*.py"))
    offenders = {str(p.relative_to(ROOT)): found for p in files if (found := _test_module_imports(p))}
    assert offenders == {}, f"move what these import from a test module into tests/support/: {offenders}"
    loose = [
        str(p.relative_to(ROOT))
        for p in files
        if p.parent != ROOT / "tests" / "support"
        and ROOT / "tests" / "support" not in p.parents
        and not (
            p.parent in (ROOT / "tests", ROOT / "tests" / "rehearsal")  # the CI tier and the rehearsal tier
            and (p.name.startswith("test_") or p.name in ("conftest.py", "__init__.py"))
        )
    ]
    assert loose == [], f"helpers outside tests/support/: {loose}"


def test_xdist_keeps_a_group_on_one_worker(tmp_path: Path) -> None:
    """scripts/test.sh's wait-bound phase relies on ``--dist loadgroup``: the tests of one group (a module and its
    sandbox; tests/conftest.py marks them in a collection hook, as here) run on one worker, in file order. pytest 9.2
    broke it silently for pytest-xdist 3.8, which renames ``item._nodeid`` to name the group (pyproject.toml pins pytest
    below it; pytest-dev/pytest-xdist#1386)."""
    (tmp_path / "conftest.py").write_text(
        "import pytest\n\n"
        "@pytest.hookimpl(tryfirst=True)\n"
        "def pytest_collection_modifyitems(config, items):\n"
        "    for item in items:\n"
        "        item.add_marker(pytest.mark.xdist_group(item.module.__name__))\n"
    )
    for name in ("a", "b"):
        (tmp_path / f"test_{name}.py").write_text(
            "import os, time\n"
            + "".join(
                f"def test_{i}():\n    time.sleep(0.2)\n    print('ran', os.environ['PYTEST_XDIST_WORKER'])\n"
                for i in range(4)
            )
        )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "-v", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ran = [line.split() for line in proc.stdout.splitlines() if " PASSED " in line]
    assert len(ran) == 8, proc.stdout[-2000:]
    for module in ("test_a", "test_b"):
        mine = [(r[0], r[-1]) for r in ran if f"{module}.py::" in r[-1]]
        assert len({worker for worker, _ in mine}) == 1, f"{module}'s tests ran on several workers: {mine}"
        assert [test.split("::")[1] for _, test in mine] == [f"test_{i}@{module}" for i in range(4)], mine


def _tests(n: int) -> list[str]:
    return [f"test_{i}" for i in range(n)]


def _started(tmp_path: Path, dist: str, modules: dict[str, tuple[int, float]]) -> list[str]:
    """Run modules ``name → (tests, seconds each weighs in the durations file)`` on two xdist workers under ``--dist
    dist`` with tests/conftest.py's ordering (tests/support/schedule.py), each module an ``xdist_group`` of its name
    under loadgroup: the modules in the order their first tests started, each checked to have run on one worker.
    Each test sleeps a hundredth of its weight."""
    (tmp_path / "conftest.py").write_text(
        "import pytest\n"
        "from tests.support.schedule import keep_collection_order, longest_first, tell_worker\n\n"
        "def pytest_configure(config):\n"
        "    keep_collection_order(config)\n\n"
        "def pytest_configure_node(node):\n"
        "    tell_worker(node)\n\n"
        "@pytest.hookimpl(wrapper=True, tryfirst=True)\n"
        "def pytest_collection_modifyitems(config, items):\n"
        "    yield\n"
        "    longest_first(config, items)\n"
    )
    log = tmp_path / "ran.log"
    for name, (tests, weight) in modules.items():
        (tmp_path / f"test_{name}.py").write_text(
            "import os, time, pytest\n"
            + (f"pytestmark = pytest.mark.xdist_group({name!r})\n" if dist == "loadgroup" else "")
            + "".join(
                f"def test_{i}():\n"
                f"    with open({str(log)!r}, 'a') as f:\n"
                f"        f.write(f'{name} {{time.monotonic()}} {{os.environ[\"PYTEST_XDIST_WORKER\"]}}\\n')\n"
                f"    time.sleep({weight / 100})\n"
                for i in range(tests)
            )
        )
    durations = tmp_path / "durations.json"
    durations.write_text(json.dumps({f"test_{m}.py::{t}": w for m, (n, w) in modules.items() for t in _tests(n)}))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", dist, str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
        env={**os.environ, "EXASERVE_TEST_DURATIONS": str(durations), "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ran = sorted((float(t), m, w) for m, t, w in (line.split() for line in log.read_text().splitlines()))
    assert len(ran) == sum(n for n, _w in modules.values()), ran
    assert all(len({w for _t, m, w in ran if m == module}) == 1 for module in modules), ran
    return list(dict.fromkeys(m for _t, m, _w in ran))


def test_xdist_deals_the_heaviest_module_first_not_the_one_with_most_tests(tmp_path: Path) -> None:
    """The cpu-bound phase (``--dist loadfile``): xdist deals modules in the collection's order, which
    tests/conftest.py sorts heaviest first by the durations file. xdist's own order (most tests first: a, then b)
    would start test_c, the heaviest with the fewest tests, last."""
    started = _started(tmp_path, "loadfile", {"a": (4, 1.0), "b": (3, 10.0), "c": (2, 50.0)})
    assert sorted(started[:2]) == ["b", "c"], started  # the first wave: the two heaviest


def test_xdist_starts_the_sandbox_phases_on_the_lightest_and_the_heaviest_group(tmp_path: Path) -> None:
    """The sandbox phases (``--dist loadgroup``): the first wave alternates the lightest and the heaviest group by the
    durations file (c, d), so the heaviest rollouts do not all start together; xdist's own order (by test count, then
    collection order) would start a and b."""
    started = _started(tmp_path, "loadgroup", {"a": (3, 10.0), "b": (3, 40.0), "c": (3, 1.0), "d": (3, 50.0)})
    assert sorted(started[:2]) == ["c", "d"] and started[2:] == ["b", "a"], started  # then the heaviest left


def test_the_dealing_order_is_heaviest_first_but_for_an_alternating_first_wave() -> None:
    weights = {"a": 10.0, "b": 40.0, "c": 1.0, "d": 50.0, "e": 5.0, "f": 40.0}
    assert dealing_order(weights) == ["d", "b", "f", "a", "e", "c"]  # ties (b, f) in collection order
    assert dealing_order(weights, 3) == ["c", "d", "e", "b", "f", "a"]  # lightest, heaviest, lightest; then heaviest


def test_a_split_module_is_dealt_longest_test_first_to_the_lightest_group() -> None:
    """SANDBOX_GROUPS deals (tests/conftest.py): by the last run's seconds, not round-robin by position, so the two
    longest tests never share a sandbox while a group of short ones waits; a test not listed weighs UNLISTED_S."""
    ids = ["t.py::short", "t.py::long", "t.py::longer", "t.py::new", "t.py::mid"]
    durations = {"t.py::short": 1.0, "t.py::long": 9.0, "t.py::longer": 10.0, "t.py::mid": 2.0}
    assert deal(ids, 2, durations) == [0, 1, 0, 0, 1]  # longer 10 | long 9, mid 2 | short 1 → 11 | new → 11.25 | 11
    assert seconds("t.py::new@t-1", durations) == UNLISTED_S and seconds("t.py::mid@t-0", durations) == 2.0


HTTPX_ONE_SHOT = {"get", "post", "put", "patch", "delete", "head", "options", "request", "stream"}
HTTPX_CLIENTS = {"AsyncClient", "Client", "AsyncHTTPTransport", "HTTPTransport"}


def _httpx_clients_made(path: Path) -> list[int]:
    """Lines of ``path`` that make an httpx client or transport (``AsyncClient``, ``Client``, ``AsyncHTTPTransport``,
    ``HTTPTransport``: each builds a TLS context unless given one) or call one of httpx's one-shot functions (a client
    each) without a ``verify``: through the module under any name (``import httpx as hx``) or the names imported from
    it under any name (``from httpx import get as fetch``)."""
    tree = ast.parse(path.read_text(), str(path))
    modules = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name == "httpx"
    }
    imported = {
        alias.asname or alias.name: alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "httpx"
        for alias in node.names
    }
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id in imported:
            called = imported[f.id]
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in modules:
            called = f.attr
        else:
            continue
        verified = any(k.arg == "verify" for k in node.keywords)
        if called in HTTPX_CLIENTS or (called in HTTPX_ONE_SHOT and not verified):
            lines.append(node.lineno)
    return sorted(lines)


def test_the_package_makes_its_httpx_clients_on_the_one_tls_context() -> None:
    """serving.fleet_http.http_client is the only maker of httpx clients in the package: httpx reads and parses the
    CA bundle for every client it makes (56 ms of CPU), and the controller's clients made at every tick once took
    three quarters of the drill stack's controllers' CPU."""
    made = {
        str(p.relative_to(ROOT)): lines
        for p in _python_files("serving")
        if p.name != "fleet_http.py" and (lines := _httpx_clients_made(p))
    }
    assert made == {}, made


def test_the_client_walker_sees_each_form(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "import httpx\nimport httpx as hx\nfrom httpx import AsyncClient as C, get as fetch\n"
        "httpx.AsyncClient()\nC(timeout=1)\nhttpx.Client()\nhttpx.get('x')\nhx.AsyncHTTPTransport()\nfetch('x')\n"
        "httpx.get('x', verify=v)\nhttpx.Timeout(1)\nfetch('x', verify=v)\nother.get('x')\n"
    )
    assert _httpx_clients_made(src) == [4, 5, 6, 7, 8, 9]
