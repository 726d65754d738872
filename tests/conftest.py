"""Shared pytest fixtures."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from serving.sandbox.processes import FIRST_SANDBOX_PORT, PORT_SEARCH_START, ephemeral_port_range
from tests.support.ci import unavailable
from tests.support.gpu import cuda_device_count
from tests.support.hosts.netns import HostPool, unavailable_reason
from tests.support.sandbox import running_sandbox
from tests.support.schedule import deal, keep_collection_order, load_durations, longest_first, tell_worker
from tests.support.systemd import make_systemd_root


@pytest.hookimpl(wrapper=True, tryfirst=True)  # around every other plugin's hook (pytest-xdist's, -m's)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Iterator[None]:
    """Mark what scripts/test.sh schedules by:

    * ``hosts``: the test uses the SSH test hosts (the ``ssh_hosts`` fixture);
    * ``sandbox``: its module brings up a sandbox (it imports ``running_sandbox``): real routers, simulated workers,
      etcd and Prometheus, waited on in real time; a module that starts such processes itself says so with
      ``pytestmark = pytest.mark.sandbox``. Each such module is one ``xdist_group``, so that one worker brings
      its module-scoped sandbox up once; a module that sets ``SANDBOX_GROUPS = N`` is dealt into N groups, longest
      test first to the group with the least so far (tests/support/schedule.py), each with a sandbox of its own on
      its own worker (its tests must not depend on each other's order).

    Then, once every other plugin's hook has run (the tests of the phase are selected), on an xdist worker under
    ``--dist loadfile``/``loadgroup`` the items are ordered longest work unit first, the order in which xdist deals
    the units (tests/support/schedule.py).
    """
    split: dict[str, list[pytest.Item]] = {}
    for item in items:
        if "ssh_hosts" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.hosts)
        module = getattr(item, "module", None)
        if module is None:
            continue
        if getattr(module, "running_sandbox", None) is running_sandbox:
            item.add_marker(pytest.mark.sandbox)
        elif item.get_closest_marker("sandbox") is None:
            continue
        name = module.__name__.rsplit(".", 1)[-1]
        if int(getattr(module, "SANDBOX_GROUPS", 1)) == 1:
            item.add_marker(pytest.mark.xdist_group(name))
        else:
            split.setdefault(name, []).append(item)
    durations = load_durations()
    for name, members in split.items():
        groups = int(members[0].module.SANDBOX_GROUPS)  # type: ignore[attr-defined]
        for item, group in zip(members, deal([i.nodeid for i in members], groups, durations), strict=True):
            item.add_marker(pytest.mark.xdist_group(f"{name}-{group}"))
    yield  # pytest-xdist's worker names each group from the markers; -m selects (pytest-random-order shuffles)
    longest_first(config, items)


def pytest_configure(config: pytest.Config) -> None:
    """A wide terminal for the CLI run in-process (tests/support/cli.py), as the subprocesses get: rich reads
    ``COLUMNS`` when a console is made, at the CLI's import, and would otherwise wrap messages at 80 columns. Under
    ``--dist loadfile``/``loadgroup`` xdist deals the work units in the collection's order, longest first
    (tests/support/schedule.py): a phase lasts as long as its busiest worker."""
    os.environ["COLUMNS"] = "200"
    keep_collection_order(config)
    _own_ports()


@pytest.hookimpl(optionalhook=True)  # xdist's hook: `pytest -p no:xdist` must still load this conftest
def pytest_configure_node(node: Any) -> None:
    """A worker runs under ``--dist no``: it learns the controller's mode from its ``config.workerinput``."""
    tell_worker(node)


def _own_ports() -> None:
    """Under pytest-xdist each worker searches for free ports from its own share of the ports outside the ephemeral
    range (``$EXASERVE_PORT_SEARCH_START``, inherited by the sandboxes it starts): a port found free is bound only
    later, by the process started on it, so two workers searching from nearby starts could pick overlapping blocks."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    low, high = ephemeral_port_range()
    ports = [*range(FIRST_SANDBOX_PORT, min(low, 65536)), *range(max(high + 1, FIRST_SANDBOX_PORT), 65536)]
    os.environ[PORT_SEARCH_START] = str(ports[len(ports) * int(worker.removeprefix("gw")) // max(count, 1)])


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
def regenerated(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """Manifests dumped now from the real parsers; builds the SGLang venv on first use (cached after).
    Its interpreter (tests/support/sglang_parsers.py SGLANG_PYTHON) then holds the pinned SGLang's real parser.
    Dumped once per session: under pytest-xdist the first worker to ask dumps them into the session's shared
    temporary root, under a lock, and the others read them there (the dump imports SGLang: about a minute of CPU)."""
    shared = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    out = shared / "regenerated-manifests"
    with (shared / "regenerated-manifests.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / ".complete").is_file():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            root = Path(__file__).resolve().parent.parent
            proc = subprocess.run(
                ["bash", str(root / "scripts" / "sglang-manifest.sh"), "--out-dir", str(out)],
                capture_output=True,
                text=True,
                timeout=540,
                check=False,
            )
            assert proc.returncode == 0, f"scripts/sglang-manifest.sh failed:\n{proc.stderr[-4000:]}"
            (out / ".complete").touch()
    return out


# --- systemd-analyze verify (tests/support/systemd.py) -------------------------------------------


@pytest.fixture(scope="session")
def systemd_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway root for ``systemd-analyze verify --root`` (:func:`tests.support.systemd.make_systemd_root`)."""
    return make_systemd_root(tmp_path_factory.mktemp("systemd-root"))
