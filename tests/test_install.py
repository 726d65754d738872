"""The wheel, installed outside the checkout: `plan`, `render` and `check` on a stack file given by path, from an
empty directory, reading nothing of the source tree and writing nothing into the package or the checkout.

How the install is made, offline:

* the wheel is built with ``pip wheel --no-deps --no-build-isolation -w DIR SRC`` from a copy of the working tree
  (tracked and untracked, not ignored files), so the build's own ``build/`` and ``*.egg-info`` stay out of the
  checkout; without build isolation the current environment's setuptools builds it (no index needed);
* a fresh venv (``python -m venv``, no system site-packages) gets the wheel with ``pip install --no-deps --no-index``;
* the project's dependencies are not downloaded again: a ``.pth`` file in the fresh venv appends the current
  environment's site-packages to ``sys.path``. That directory's own ``.pth`` files are not processed (only site
  directories' are), so the editable install of the checkout there stays inert: ``serving`` is imported from the
  wheel, and the test asserts it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.support.k8s import crd_dir, render_file
from tests.support.paths import REPO

pytestmark = pytest.mark.slow

CACHES = {
    ".git",
    ".venv",
    ".venv-sglang",
    ".venv-pulumi",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
    "__pycache__",
}


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """``relative path → (size, mtime)`` of every file under ``root``, caches and bytecode aside."""
    out: dict[str, tuple[int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in CACHES]
        for name in filenames:
            path = Path(dirpath, name)
            st = path.lstat()
            out[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src") / "exaserve"
    listed = _run(["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z"], REPO)
    assert listed.returncode == 0, listed.stderr
    for rel in filter(None, listed.stdout.split("\0")):
        if (REPO / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    dist = tmp_path_factory.mktemp("dist")
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(src)],
        dist,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (path,) = dist.glob("exaserve_deploy-*.whl")
    return path


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("venv") / "venv"
    made = _run([sys.executable, "-m", "venv", str(root)], root.parent)
    assert made.returncode == 0, made.stderr
    python = root / "bin" / "python"
    site = Path(
        _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], root).stdout.strip()
    )
    (site / "exaserve-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = _run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], root)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return root


def test_the_wheel_ships_the_package_data_and_nothing_of_the_checkout(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "serving/templates/sglang-replica.service.j2",
        "serving/templates/chrony.conf.j2",
        "serving/templates/exaserve-runtime.service.j2",
        "serving/data/crds.lock.json",
        "serving/data/source-plan.yaml",
        "serving/data/sglang-0.5.23-server-flags.json",
        "serving/data/smg-1.13.0-flags.json",
        "serving/data/sglang-0.5.23-multimodal-archs.json",
        "serving/pulumi/components/stack.py",
        "serving/py.typed",
    ):
        assert required in names, f"{required} is not in {wheel.name}"
    assert not [n for n in names if n.split("/")[0] in ("tests", "infra", "policies", "ansible", "models", "templates")]
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    requires = [
        line
        for line in zipfile.ZipFile(wheel).read(metadata).decode().splitlines()
        if line.startswith("Requires-Dist:") and "torch" in line
    ]
    assert requires == ['Requires-Dist: torch==2.13.0; extra == "node"'], "torch only in the node extra"
    # issue 42: `license = "Apache-2.0"` (PEP 639, setuptools >= 77) and the license text the wheel carries
    meta = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "License-Expression: Apache-2.0" in meta and "License-File: LICENSE" in meta, meta[:2000]
    assert [n for n in names if n.endswith(".dist-info/licenses/LICENSE")], sorted(names)[-10:]


def test_every_third_party_import_is_a_declared_dependency() -> None:
    """Issue 42: serving/pulumi/validate.py imported packaging and referencing, which the project never declared (they
    came through other packages' dependencies, and leave with them). Every top-level import of the package, the
    Pulumi program and the policy pack is the standard library, the project's own, or a distribution that
    pyproject.toml declares: the dependencies, or the node extra for serving/node/ (torch). Imports under
    TYPE_CHECKING are left out (they never run)."""
    import ast
    import re
    import tomllib
    from importlib.metadata import packages_distributions

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]

    def names(reqs: list[str]) -> set[str]:
        return {re.split(r"[<>=!~ \[;]", r, maxsplit=1)[0].lower().replace("_", "-") for r in reqs}

    declared, node = names(project["dependencies"]), names(project["optional-dependencies"]["node"])
    dists = packages_distributions()
    own = {"serving", "infra", "policies", "exaserve_policies", "__future__"}
    missing = []
    for root in ("serving", "infra", "policies"):
        for path in sorted((REPO / root).rglob("*.py")):
            tree = ast.parse(path.read_text())
            typing_only = {
                id(n) for b in ast.walk(tree) if isinstance(b, ast.If) and "TYPE_CHECKING" in ast.unparse(b.test)
                for n in ast.walk(b)
            }  # fmt: skip
            for node_ in ast.walk(tree):
                if id(node_) in typing_only:
                    continue
                if isinstance(node_, ast.Import):
                    mods = [a.name for a in node_.names]
                elif isinstance(node_, ast.ImportFrom) and node_.level == 0 and node_.module:
                    mods = [node_.module]
                else:
                    continue
                for top in {m.split(".")[0] for m in mods} - own - set(sys.stdlib_module_names):
                    allowed = declared | (node if path.is_relative_to(REPO / "serving" / "node") else set())
                    providers = {d.lower().replace("_", "-") for d in dists.get(top, [])}
                    if not providers & allowed:
                        missing.append(f"{path.relative_to(REPO)}: {top} (distribution {sorted(providers)})")
    assert not missing, "imported but not declared in pyproject.toml: " + "; ".join(missing)


def test_plan_render_and_check_from_an_empty_directory(venv: Path, tmp_path: Path) -> None:
    stacks = tmp_path / "stacks"  # the user's stack file and the HF config it names, nothing else
    stacks.mkdir()
    shutil.copy(REPO / "Pulumi.prod.yaml", stacks / "Pulumi.prod.yaml")
    shutil.copytree(REPO / "models", stacks / "models")
    stack = stacks / "Pulumi.prod.yaml"
    work = tmp_path / "empty"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EXASERVE_", "XDG_", "PYTHON", "VIRTUAL_ENV"))}
    home = tmp_path / "home"
    env.update(HOME=str(home), PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", COLUMNS="200",
               PYTHONDONTWRITEBYTECODE="1")  # fmt: skip
    exaserve = str(venv / "bin" / "exaserve")
    python = str(venv / "bin" / "python")

    where = _run([python, "-c", "import serving, sys; print(serving.__file__); print(*sys.path, sep='\\n')"], work, env)
    assert where.returncode == 0, where.stderr
    module, *path = where.stdout.splitlines()
    assert Path(module).is_relative_to(venv), f"serving imported from {module}, not the wheel"
    assert str(REPO) not in [p.rstrip("/") for p in path], "the checkout is not on sys.path"

    before_checkout, before_venv = snapshot(REPO), snapshot(venv)

    r = _run([exaserve, "plan", "--stack-file", str(stack)], work, env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "plan OK" in r.stdout and "Capacity chain" in r.stdout

    out = tmp_path / "render"
    r = _run([exaserve, "render", "--stack-file", str(stack), "--out", str(out), "--crd-dir", str(crd_dir()), "--json"],
             work, env)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    index = json.loads((out / "index.json").read_text())
    assert doc["problems"] == [] and doc["unvalidated"] == [] and doc["crd_dir"] == str(crd_dir())
    expected = len(render_file(stack))  # the same program run from the checkout, in this process
    assert doc["objects"] == len(index) == expected
    assert {"StatefulSet", "PrometheusRule", "Node"} <= {e["kind"] for e in index}
    units = sorted((out / "units").glob("*.service"))  # the systemd template, read as package data
    assert len(units) == doc["replica_units"] == 2048
    assert units[0].read_text().startswith("# generated from")
    # No --crd-dir and no project here: built-in kinds are validated, custom resources listed, the fix named.
    r = _run([exaserve, "render", "--stack-file", str(stack), "--out", str(tmp_path / "bare")], work, env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "custom resource(s) not validated" in r.stdout and "python -m serving.pulumi.crds fetch" in r.stdout

    r = _run([exaserve, "check", "--stack-file", str(stack), "--allow-tags"], work, env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"prod: {expected} resources" in r.stdout and "no violations, 15 pending under --allow-tags" in r.stdout

    r = _run([exaserve, "audit-source", "--json"], work, env)  # its default input is package data
    assert r.returncode == 0, r.stderr
    assert '"verdict": "wrong"' in r.stdout

    r = _run([exaserve, "plan", "--stack", "prod"], work, env)  # a name needs a project: none here
    assert r.returncode == 2 and "pass --stack-file PATH" in " ".join(r.stderr.split())

    assert list(work.iterdir()) == [], "nothing written into the working directory"
    assert snapshot(venv) == before_venv, "nothing written into the installed package"
    # New files are what a tool writing state, reports or renders leaves (edits to sources are not its doing).
    new = sorted(snapshot(REPO).keys() - before_checkout.keys())
    assert new == [], f"written into the checkout: {new}"
    assert not home.exists() or not any(home.rglob("*")), "no state without a command that keeps state"
