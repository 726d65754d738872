"""A real etcd (Debian's ``etcd-server``) on loopback for the election tests: skipped where etcd is not installed,
a failure under CI=true."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from serving.sandbox.processes import free_port_block
from tests.support.ci import require_binaries
from tests.support.patience import wait_until


def require_etcd() -> str:
    return require_binaries("etcd", package="etcd-server")[0]


@dataclass(frozen=True)
class Etcd:
    url: str  # the client URL (v3 JSON gateway)
    pid: int

    def stopped(self) -> list[str]:
        """The states of etcd's threads (/proc/PID/task/*/stat) that can still run: empty once SIGSTOP holds (a
        thread stopped, T or t, or exited, Z or X). An etcd that is gone fails here rather than reading as stopped."""
        tasks = Path(f"/proc/{self.pid}/task")
        if not tasks.is_dir():
            raise AssertionError(f"etcd (pid {self.pid}) is not running: nothing to stall")
        states = []
        for stat in tasks.glob("*/stat"):
            try:
                states.append(stat.read_text().rsplit(")", 1)[1].split()[0])  # the name may hold spaces and ')'
            except (FileNotFoundError, ProcessLookupError):
                continue  # the thread exited
        return [s for s in states if s not in ("T", "t", "Z", "X")]

    @contextmanager
    def stalled(self) -> Iterator[None]:
        """etcd stopped (SIGSTOP) for the block: its connections stay open and nothing is answered, as from an etcd
        stalled on a slow disk's fsync or starved of CPU. The block starts once every thread of etcd's is stopped: the
        signal takes hold when each is next scheduled, and a loaded machine's CI run saw a request sent just after the
        kill answered (a renewal inside the block answered, test_etcd_election_an_unanswered_renewal_is_no_verdict)."""
        os.kill(self.pid, signal.SIGSTOP)
        try:
            # polled often: the callers run it inside their event loop, whose timers it holds up meanwhile
            wait_until(
                lambda: not self.stopped(), what=f"etcd (pid {self.pid}) stopped by SIGSTOP", every_s=0.005,
                seen=self.stopped,
            )  # fmt: skip
            yield
        finally:
            os.kill(self.pid, signal.SIGCONT)


@contextmanager
def running_etcd(directory: Path) -> Iterator[Etcd]:
    """A single-member etcd with its data in ``directory``."""
    binary = require_etcd()
    base = free_port_block(2)
    client, peer = f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 1}"
    log = (directory / "etcd.log").open("w")
    proc = subprocess.Popen(
        [
            binary,
            "--name=test",
            f"--data-dir={directory / 'data'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=test={peer}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:

        def answers() -> bool:
            assert proc.poll() is None, (directory / "etcd.log").read_text()  # exited: no patience brings it back
            try:
                return httpx.get(client + "/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(answers, what=f"etcd to answer {client}/health", seen=(directory / "etcd.log").read_text)
        yield Etcd(client, proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
