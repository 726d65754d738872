"""Shared pytest fixtures."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.ci import unavailable
from tests.support.gpu import cuda_device_count
from tests.support.hosts.netns import HostPool, unavailable_reason
from tests.support.systemd import make_systemd_root

# --- GPU tests (marked gpu) ----------------------------------------------------------------------


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A ``gpu`` test runs wherever torch sees a CUDA device, never skipped there. Without one it is skipped
    locally (the reason says so); under CI=true reaching one is an error: CI's scripts/test.sh deselects the
    ``gpu`` marker on a machine without a device and prints that it did, so nothing is skipped silently."""
    if item.get_closest_marker("gpu") is None or cuda_device_count() > 0:
        return
    unavailable(
        "gpu: no CUDA device on this machine (torch.cuda.is_available() is False); "
        "scripts/test.sh deselects gpu tests there (-m 'not gpu')"
    )


# --- SSH test hosts (tests/support/hosts) --------------------------------------------------------------


@pytest.fixture(scope="session")
def ssh_hosts() -> Iterator[HostPool]:
    """Factory for real SSH test hosts, one network namespace and sshd each.

    `ssh_hosts(count=4, faults={"node02": HostFaults(ib_down=("mlx5_0",))})` returns a running
    `HostFleet` (node01..nodeNN); the same request returns the same fleet for the whole session,
    and everything is torn down when the session ends, failed or not. Needs root: skipped
    locally without it, a failure under CI=true.
    """
    reason = unavailable_reason()
    if reason is not None:
        unavailable(reason)
    pool = HostPool.acquire()
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def ssh_control_dir() -> Iterator[Path]:
    """A per-test ANSIBLE_SSH_CONTROL_PATH_DIR, short enough for unix socket paths (108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="cp", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# --- the pinned SGLang's real parsers (scripts/sglang-manifest.sh) -------------------------------


@pytest.fixture(scope="session")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Manifests dumped now from the real parsers; builds .venv-sglang on first use (cached after).
    Its interpreter, `.venv-sglang/bin/python`, then holds the pinned SGLang's real parser."""
    out = tmp_path_factory.mktemp("manifests")
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        ["bash", str(root / "scripts" / "sglang-manifest.sh"), "--out-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert proc.returncode == 0, f"scripts/sglang-manifest.sh failed:\n{proc.stderr[-4000:]}"
    return out


# --- systemd-analyze verify (tests/support/systemd.py) -------------------------------------------


@pytest.fixture(scope="session")
def systemd_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway root for ``systemd-analyze verify --root`` (:func:`tests.support.systemd.make_systemd_root`)."""
    return make_systemd_root(tmp_path_factory.mktemp("systemd-root"))
