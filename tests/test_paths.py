"""Where ExaServe reads and writes (serving.paths): stacks by name from the Pulumi project directory found as
pulumi finds it, state under --state-dir / $EXASERVE_STATE_DIR / $XDG_STATE_HOME — never the checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.paths import ProjectNotFoundError, find_project_dir, project_dir, state_dir
from serving.rollout.journal import StackState
from tests.support.cli import exaserve as run
from tests.support.paths import REPO


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in ("EXASERVE_PROJECT_DIR", "EXASERVE_STATE_DIR", "XDG_STATE_HOME"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_state_dir_order(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("HOME", str(tmp_path / "home"))
    assert state_dir() == tmp_path / "home" / ".local" / "state" / "exaserve"
    clean_env.setenv("XDG_STATE_HOME", "relative/ignored")  # the XDG spec: relative paths are invalid
    assert state_dir() == tmp_path / "home" / ".local" / "state" / "exaserve"
    clean_env.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert state_dir() == tmp_path / "xdg" / "exaserve"
    assert (
        StackState.for_stack("dev").journal_path == tmp_path / "xdg" / "exaserve" / "dev" / "rollout" / "journal.jsonl"
    )
    clean_env.setenv("EXASERVE_STATE_DIR", str(tmp_path / "env"))
    assert state_dir() == tmp_path / "env"
    assert state_dir(tmp_path / "flag") == tmp_path / "flag"
    assert StackState.for_stack("dev", tmp_path / "flag").lock_path == tmp_path / "flag" / "dev" / "rollout.lock"


def test_project_dir_is_the_nearest_pulumi_yaml_upwards_or_the_env(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert find_project_dir(REPO / "infra") == REPO
    assert find_project_dir(REPO) == REPO
    assert find_project_dir(tmp_path) is None
    with pytest.raises(ProjectNotFoundError) as err:
        project_dir(tmp_path)
    assert str(err.value) == (
        f"no Pulumi project: neither {tmp_path} nor a directory above it holds Pulumi.yaml, and "
        "EXASERVE_PROJECT_DIR is not set; pass --stack-file PATH, run inside the project, or set EXASERVE_PROJECT_DIR=DIR"
    )
    clean_env.setenv("EXASERVE_PROJECT_DIR", str(REPO))
    assert project_dir(tmp_path) == REPO
    clean_env.setenv("EXASERVE_PROJECT_DIR", str(tmp_path))
    with pytest.raises(ProjectNotFoundError, match=f"EXASERVE_PROJECT_DIR={tmp_path} has no Pulumi.yaml; point it at"):
        project_dir(REPO)


def test_stacks_by_name_resolve_in_the_project_directory(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`--stack NAME` works from anywhere inside the project, or anywhere with EXASERVE_PROJECT_DIR; elsewhere it
    exits 2 saying what to do."""
    r = run("plan", "--stack", "dev", cwd=REPO / "infra")
    assert r.returncode == 0, r.stderr
    assert "plan OK" in r.stdout
    r = run("plan", "--stack", "dev", cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    message = " ".join(r.stderr.split())
    assert f"no Pulumi project: neither {tmp_path} nor a directory above it holds Pulumi.yaml" in message
    assert "pass --stack-file PATH, run inside the project" in message and "Traceback" not in r.stderr
    clean_env.setenv("EXASERVE_PROJECT_DIR", str(REPO))
    r = run("plan", "--stack", "dev", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = run("plan", "--stack", "nope", cwd=tmp_path)
    assert r.returncode == 2
    assert "no stack named 'nope'; known stacks: dev, prod, sandbox" in " ".join(r.stderr.split())
