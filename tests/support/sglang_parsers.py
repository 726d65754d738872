"""The pinned SGLang's and the router's REAL argument parsers, run over many argvs in one process.

The server parser lives in the SGLang venv (:data:`SGLANG_VENV`, built by the `regenerated` session fixture in conftest.py);
the router's in this venv.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.paths import REPO

ROOT = REPO
SGLANG_VENV = Path(
    os.environ.get("EXASERVE_SGLANG_VENV")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "exaserve" / "venv-sglang"
)
"""Where scripts/sglang-manifest.sh builds the SGLang venv (the same default)."""
SGLANG_PYTHON = SGLANG_VENV / "bin" / "python"


def run_json_script_args(python: Path, argv: list[str], payload: list[Any], timeout_s: float = 300) -> list[Any]:
    """Run ``python ARGV`` with ``payload`` as JSON on stdin; one JSON result per input item back.
    SGLANG_* variables are dropped, so the caller's environment cannot change SGLang's defaults."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG")}
    proc = subprocess.run(
        [str(python), *argv],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results: list[Any] = json.loads(proc.stdout)
    assert len(results) == len(payload)
    return results


def real_parse(kind: str, argvs: list[list[str]]) -> list[dict[str, object]]:
    """Run the real parser (server: in the SGLang venv; router: here) over each argv, in one process."""
    python = SGLANG_PYTHON if kind == "server" else Path(sys.executable)
    return run_json_script_args(python, [str(ROOT / "scripts" / "argparse_flags.py"), "parse", kind], argvs)
