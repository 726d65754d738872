"""``systemd-analyze verify``, strict, on the rendered units: a throwaway root with systemd's own units and an
executable at each path the units run (the ``systemd_root`` session fixture in conftest.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from serving.render.sglang import SERVER_ENTRY
from serving.render.systemd import CURL


def make_systemd_root(root: Path) -> Path:
    """Fill ``root`` for ``systemd-analyze verify --root``: systemd's own units, and an executable at each path the
    units run. The stubs stand in for SGLang (a GPU install) and curl at their production paths, so verify's "binary
    must exist" check runs against the exact ExecStart lines."""
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    for binary in (SERVER_ENTRY[0], CURL):
        stub = root / binary.lstrip("/")
        stub.parent.mkdir(parents=True, exist_ok=True)
        stub.write_text("#!/bin/sh\nexit 0\n")
        stub.chmod(0o755)
    (root / "etc/systemd/system").mkdir(parents=True)
    return root


def verify_unit(root: Path, name: str, text: str) -> subprocess.CompletedProcess[str]:
    """``systemd-analyze verify`` of unit ``name`` with ``text``, installed under ``root``."""
    (root / "etc/systemd/system" / name).write_text(text)
    return subprocess.run(
        ["systemd-analyze", "verify", f"--root={root}", name], capture_output=True, text=True, timeout=60, check=False
    )
