"""The dependency lock (docs/dependencies.md): uv.lock resolves pyproject.toml, requirements.lock and
requirements-dev.lock are exported from it with hashes, and every install path reads them.

Each test here failed before the lock existed: `requirements.txt` was ``-e .`` (no hash, and pip's hash-checking mode
refuses an editable requirement), the venv was whatever pip resolved from the ranges that day, and no check compared
anything with pyproject.toml. ``scripts/lock.sh --check`` runs offline (uv's ``--offline``; the exports come from
uv.lock alone), as scripts/test.sh's lint stage runs it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml

from serving.spec.schema import KubernetesSpec
from tests.support.lockfile import pins
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


@pytest.fixture(scope="module")
def pulumi_installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the checkout (tracked and untracked, not ignored files) after `pulumi install`, run as Pulumi's uv
    toolchain runs it (pulumi ``sdk/python/toolchain/uv.go``, ``InstallDependencies`` and ``uvCommand``): ``uv sync
    --frozen`` in the project directory with ``UV_PROJECT_ENVIRONMENT`` set to Pulumi.yaml's virtualenv, hard links
    and no progress. uv fetches what its cache lacks from the index, as Pulumi's would."""
    root = tmp_path_factory.mktemp("pulumi-install")
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.split(b"\0")  # fmt: skip
    for name in filter(None, files):
        source = REPO / name.decode()
        if source.is_file():
            (root / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name.decode())
    options = yaml.safe_load((root / "Pulumi.yaml").read_text())["runtime"]["options"]
    assert options["toolchain"] == "uv", options
    venv = root / options["virtualenv"]
    env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(venv), "UV_LINK_MODE": "hardlink", "UV_NO_PROGRESS": "1",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1"}  # fmt: skip
    env.pop("VIRTUAL_ENV", None)
    sync = subprocess.run([str(UV), "sync", "--frozen"], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert sync.returncode == 0, sync.stderr[-3000:]
    return root


def _in_pulumi_venv(root: Path, code: str, cwd: Path) -> dict[str, Any]:
    python = (
        root / yaml.safe_load((root / "Pulumi.yaml").read_text())["runtime"]["options"]["virtualenv"] / "bin/python"
    )
    out = subprocess.run([str(python), "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONNOUSERSITE": "1"})  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_pulumi_install_gives_the_program_its_locked_dependencies_and_the_project(pulumi_installed: Path) -> None:
    """Issue 42: with toolchain pip, `pulumi install` upgraded pip, setuptools and wheel unpinned, then installed
    requirements.txt (the dependencies, not the project): the program needed a sys.path shim to find `serving`, and
    the policy pack had none (ModuleNotFoundError). With toolchain uv it installs uv.lock (hashes checked) and the
    project, editable: the program, run as Pulumi runs it (infra/, under this module's mocks), imports `serving`
    from the checkout, at the lock's versions; setuptools is the lock's (the build constraint) and no pip is there."""
    root = pulumi_installed
    result = _in_pulumi_venv(root, f"""
import json, importlib.metadata as md, importlib.util
from serving.pulumi.program import run_program
run = run_program("dev", program_dir={str(root / "infra")!r})
import serving
print(json.dumps({{"serving": serving.__file__, "objects": len(run.registrations),
    "pulumi": md.version("pulumi"), "setuptools": md.version("setuptools"),
    "pip": importlib.util.find_spec("pip") is not None}}))
""", root)  # fmt: skip
    assert result["serving"] == str(root / "serving" / "__init__.py") and result["objects"] > 50, result
    locked = pins(REPO / "requirements.lock")
    assert result["pulumi"] == locked["pulumi"][0] and result["setuptools"] == locked["setuptools"][0], result
    assert result["pip"] is False, "nothing beside the lock: the pip toolchain's unpinned upgrade is gone"
    assert not (root / "requirements.txt").exists()


def test_the_policy_pack_imports_from_the_same_install(pulumi_installed: Path) -> None:
    """The pack's own install (PulumiPolicy.yaml: toolchain uv, the program's virtualenv) finds the project and its
    lock in the parent directory and changes nothing; the pack's module then loads every policy from `serving`."""
    root = pulumi_installed
    options = yaml.safe_load((root / "policies" / "PulumiPolicy.yaml").read_text())["runtime"]["options"]
    assert options == {"toolchain": "uv", "virtualenv": "../.venv-pulumi"}
    env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(root / ".venv-pulumi"), "UV_NO_PROGRESS": "1"}
    env.pop("VIRTUAL_ENV", None)
    again = subprocess.run([str(UV), "sync", "--frozen"], cwd=root / "policies", env=env, capture_output=True,
                           text=True, timeout=300)  # fmt: skip
    assert again.returncode == 0 and "Installed" not in again.stderr and "Uninstalled" not in again.stderr, again.stderr
    result = _in_pulumi_venv(root, """
import json, exaserve_policies, serving
print(json.dumps({"policies": len(exaserve_policies.policies()), "serving": serving.__file__}))
""", root / "policies")  # fmt: skip
    assert result["policies"] >= 20 and result["serving"] == str(root / "serving" / "__init__.py"), result


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
