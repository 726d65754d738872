"""The dependency lock (docs/dependencies.md): uv.lock resolves pyproject.toml, requirements.lock and
requirements-dev.lock are exported from it with hashes, and every install path reads them.

Each test here failed before the lock existed: `requirements.txt` was ``-e .`` (no hash, and pip's hash-checking mode
refuses an editable requirement), the venv was whatever pip resolved from the ranges that day, and no check compared
anything with pyproject.toml. ``scripts/lock.sh --check`` runs offline (uv's ``--offline``; the exports come from
uv.lock alone), as scripts/test.sh's lint stage runs it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.utils import canonicalize_name

from serving.spec.schema import KubernetesSpec
from tests.support.paths import REPO

UV = Path(sys.executable).parent / "uv"
LOCK_FILES = (
    "pyproject.toml",
    "setup.py",
    "README.md",
    "uv.lock",
    "requirements.lock",
    "requirements-dev.lock",
    "requirements-image.lock",
    "requirements-sbom.lock",
)
PIN = re.compile(r"^(?P<name>[A-Za-z0-9._-]+)==(?P<version>\S+)(?: ; (?P<marker>.+?))? \\$")


def pins(path: Path) -> dict[str, tuple[str, list[str]]]:
    """``name → (version, hashes)`` of the requirements that apply to this interpreter."""
    out: dict[str, tuple[str, list[str]]] = {}
    name = ""
    for line in path.read_text().splitlines():
        if m := PIN.match(line):
            name = ""
            if m["marker"] is None or Marker(m["marker"]).evaluate():
                name = canonicalize_name(m["name"])
                out[name] = (m["version"], [])
        elif name and (h := re.match(r"^\s+--hash=(sha256:[0-9a-f]{64})", line)):
            out[name][1].append(h[1])
        elif line and not line.startswith(("#", " ")):
            raise AssertionError(f"{path.name}: a line that is no pinned requirement: {line!r}")
    return out


def lock_check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "scripts/lock.sh", "--check"], cwd=root, env={"PATH": "/usr/local/bin:/usr/bin:/bin",
        "UV": str(UV), "HOME": str(root)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The files the lock is made of, in a scratch checkout that a test may break."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts/lock.sh", tmp_path / "scripts/lock.sh")
    for name in LOCK_FILES:
        shutil.copy(REPO / name, tmp_path / name)
    return tmp_path


def test_every_requirement_is_pinned_with_a_hash_and_the_runtime_set_is_the_dev_sets_subset() -> None:
    runtime, dev = pins(REPO / "requirements.lock"), pins(REPO / "requirements-dev.lock")
    assert len(runtime) > 50, "requirements.lock holds the package's dependencies"
    for name, (_, hashes) in {**runtime, **dev}.items():
        assert hashes, f"{name} has no --hash"
    assert {n: v for n, (v, _) in runtime.items()} == {n: dev[n][0] for n in runtime}, "one resolution for both"
    locked = {p["name"]: p["version"] for p in tomllib.loads((REPO / "uv.lock").read_text())["package"]}
    assert locked["pulumi"] == runtime["pulumi"][0]
    assert "torch" not in dev, "torch's wheel differs per machine: bootstrap installs it at uv.lock's version"


def test_the_venv_holds_exactly_the_locked_versions() -> None:
    """bootstrap.sh installs requirements-dev.lock; a range resolved anew (the old `pip install -e .[dev]`) drifts."""
    wrong = {}
    for name, (version, _) in pins(REPO / "requirements-dev.lock").items():
        installed = metadata.version(name)
        if installed != version:
            wrong[name] = (version, installed)
    assert not wrong, f"locked vs installed: {wrong}; run scripts/bootstrap.sh"
    torch = next(p for p in tomllib.loads((REPO / "uv.lock").read_text())["package"] if p["name"] == "torch")
    assert metadata.version("torch").split("+")[0] == torch["version"]


def test_the_router_image_is_smg_at_the_locked_version() -> None:
    """The gateway's image (``kubernetes.router_image``) is smg's release image at the version the lock pins, the
    one the flag manifest was dumped from and the sandbox runs (it was sgl-model-gateway v0.3.2, the replaced router's)."""
    version, _ = pins(REPO / "requirements.lock")["smg"]
    assert KubernetesSpec().router_image == f"lightseekorg/smg:{version}"
    assert (REPO / "serving" / "data" / f"smg-{version}-flags.json").is_file()


def test_pulumi_install_reads_the_hashed_lock() -> None:
    """What `pulumi install` runs (toolchain pip): `pip install -r requirements.txt`, here in hash-checking mode and
    offline against the venv bootstrap made (everything already there, so nothing is fetched)."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--require-hashes", "-r",
         "requirements.txt"], cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Would install" not in result.stdout, result.stdout


def test_the_pulumi_program_runs_from_the_checkout_without_the_package_installed(tmp_path: Path) -> None:
    """After `pulumi install` the venv holds the dependencies, not `serving`: infra/__main__.py must import it from
    the checkout (Pulumi's language host runs it with runpy.run_path, which puts only infra/ on sys.path)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    # the dependencies; that directory's own .pth files (the editable install of the checkout) stay inert
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = tmp_path / "probe.py"
    probe.write_text(f"""
import importlib.util, json, runpy, sys
before = importlib.util.find_spec("serving") is not None
try:
    runpy.run_path({str(REPO / "infra")!r}, run_name="__main__")
    error = None
except BaseException as exc:
    error = f"{{type(exc).__name__}}: {{exc}}"
mod = sys.modules.get("serving")
print(json.dumps({{"before": before, "serving": getattr(mod, "__file__", None), "error": error}}))
""")
    out = subprocess.run([python, str(probe)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["before"] is False, "serving was importable before the program ran: the test proves nothing"
    assert result["serving"] == str(REPO / "serving" / "__init__.py"), result
    assert "ModuleNotFoundError" not in (result["error"] or ""), result["error"]


def test_lock_check_passes_on_the_committed_lock(copy: Path) -> None:
    result = lock_check(copy)
    assert result.returncode == 0, result.stdout + result.stderr


def test_lock_check_fails_when_pyproject_moves_a_range(copy: Path) -> None:
    pyproject = copy / "pyproject.toml"
    text = pyproject.read_text()
    assert '"pyyaml>=6.0.1,<7"' in text
    pyproject.write_text(text.replace('"pyyaml>=6.0.1,<7"', '"pyyaml>=6.0.1,<6.0.2"'))
    result = lock_check(copy)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "uv.lock does not satisfy pyproject.toml" in result.stderr
    assert "run scripts/lock.sh" in result.stderr


def test_lock_check_fails_when_an_export_is_edited_by_hand(copy: Path) -> None:
    lock = copy / "requirements.lock"
    text = lock.read_text()
    pulumi = re.search(r"^pulumi==(\S+)", text, re.M)
    assert pulumi is not None
    lock.write_text(text.replace(f"pulumi=={pulumi[1]}", "pulumi==3.140.0", 1))
    result = lock_check(copy)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "requirements.lock differs from what uv.lock exports" in result.stderr
    assert "requirements-dev.lock differs" not in result.stderr


def _renovate_files(pattern: str) -> list[Path]:
    """The repository's files a Renovate managerFilePatterns entry (``/regex/``) matches, by their relative path."""
    assert pattern.startswith("/") and pattern.endswith("/"), pattern
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    return [REPO / f for f in tracked if re.search(pattern[1:-1], f)]


def test_renovate_finds_every_image_and_pin_it_is_told_to_track() -> None:
    """Issue 42: Renovate tracked pyproject.toml and the Actions only, so the Dockerfile's base digest, the smg image
    and the SGLang image and pin never moved. Each custom manager's pattern (JavaScript named groups, read here with
    Python's) must match in the file that holds the default, and what it captures is what the project runs: the smg image at the
    smg package's pin, the SGLang image at the SGLang venv's pin; the workflows' actions are pinned by commit."""
    config = json.loads((REPO / "renovate.json").read_text())
    assert {"pep621", "github-actions", "pip_requirements", "custom.regex"} <= set(config["enabledManagers"])
    found: dict[str, set[str]] = {}
    for manager in config["customManagers"]:
        files = [f for p in manager["managerFilePatterns"] for f in _renovate_files(p)]
        assert files, manager["description"]
        patterns = [re.compile(s.replace("(?<", "(?P<")) for s in manager["matchStrings"]]
        hits = {f.relative_to(REPO).as_posix(): [m for p in patterns for m in p.finditer(f.read_text())] for f in files}
        # the file its first pattern names holds the default (a stack file may leave it out)
        first = manager["managerFilePatterns"][0][1:-1]
        assert [f for f, h in hits.items() if h and re.search(first, f)], f"{manager['description']}: no match"
        for m in (m for h in hits.values() for m in h):
            found.setdefault(m["depName"], set()).add(m["currentValue"])
    smg = re.search(r'"smg==([^"]+)"', (REPO / "pyproject.toml").read_text())
    sglang = re.search(r"^sglang==(\S+)$", (REPO / "scripts/sglang-manifest-requirements.txt").read_text(), re.M)
    assert smg and sglang
    assert found["lightseekorg/smg"] == {smg[1]}
    assert {v.removeprefix("v").rsplit("-", 1)[0] for v in found["lmsysorg/sglang"]} == {sglang[1]}
    assert found["debian"] == {"bookworm-slim"}
    uses = re.findall(
        r"uses: (\S+)(.*)$", "".join(p.read_text() for p in (REPO / ".github/workflows").glob("*.yml")), re.M
    )
    assert (
        uses
        and [
            u
            for u, comment in uses
            if not re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", u) or not re.fullmatch(r" # v[\d.]+", comment)
        ]
        == []
    )
