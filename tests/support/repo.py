"""A throwaway git repository holding this working tree, for commands that compare with a git revision
(``exaserve diff``): the checkout's own index and HEAD are never touched."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.support.paths import REPO

_IDENTITY = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@localhost",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@localhost",
}


def git(repo: Path, *args: str) -> str:
    """``git -C repo ARGS``'s stdout; a failure raises naming the command and its stderr."""
    proc = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env={**os.environ, **_IDENTITY}, check=False
    )
    assert proc.returncode == 0, f"git {' '.join(args)} in {repo} failed: {proc.stderr}"
    return proc.stdout


def working_tree_repo(dest: Path) -> Path:
    """Copy the working tree's tracked and untracked, not ignored files to ``dest`` and commit them on ``main``."""
    for rel in filter(None, git(REPO, "ls-files", "-co", "--exclude-standard", "-z").split("\0")):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    git(dest, "init", "-q", "-b", "main")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "base")
    return dest
