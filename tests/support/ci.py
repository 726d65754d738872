"""CI=true means nothing may be skipped: a missing prerequisite is a failure there, a skip elsewhere."""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str) -> NoReturn:
    """Skip the test locally; fail it under CI=true, where the prerequisite must be installed."""
    if in_ci():
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason)


def require_binaries(*names: str, package: str) -> list[str]:
    """The paths of ``names`` on PATH; unavailable() naming the Debian package when one is missing."""
    found = {n: shutil.which(n) for n in names}
    missing = [n for n, path in found.items() if path is None]
    if missing:
        unavailable(f"{', '.join(missing)} not installed (Debian package {package}, scripts/bootstrap.sh installs it)")
    return [p for p in found.values() if p is not None]


def require_prometheus() -> None:
    """Debian's prometheus: the server the sandbox runs and promtool."""
    require_binaries("prometheus", "promtool", package="prometheus")
