"""The sandbox scale_bench.py measures (``bench/scale_bench.py``): ``sandbox up --simulate`` of the prod stack, or of
it cut to the size this machine holds when ``sandbox up`` refuses for CPU; the figures read off its processes; and
open-loop client load through its first router."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from serving.plan.loader import load_fleet
from serving.router.loadgen import LoadGenerator, LoadSpec
from serving.sandbox.processes import ProcessRecord, StateDir, cpu_seconds
from serving.sandbox.worker_host import request_counts
from serving.spec.stack import load_stack_file
from tests.support.cli import exaserve, flat, json_object
from tests.support.controllers import leading_controller
from tests.support.paths import REPO
from tests.support.stacks import stack_doc, write_variant


# ----- process figures -------------------------------------------------------------------------------------------
def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def machine() -> dict[str, Any]:
    load = Path("/proc/loadavg").read_text().split()[:3]
    return {"cores": os.cpu_count(), "loadavg_1_5_15": [float(x) for x in load]}


# ----- the sandbox -------------------------------------------------------------------------------------------------
def source_stack(directory: Path, replicas: int, heartbeat_s: float | None = None) -> Path:
    """The prod stack, or the prod stack cut to ``replicas`` (whole nodes, racks dividing them) and a heartbeat."""
    doc = stack_doc("prod")
    per_node = int(doc["serving"]["replicas_per_node"])
    if replicas == int(doc["serving"]["replicas"]) and heartbeat_s is None:
        return REPO / "Pulumi.prod.yaml"
    nodes = math.ceil(replicas / per_node)
    changes: dict[str, Any] = {
        "cluster.pools.0.count": nodes,
        "cluster.pools.0.racks": math.gcd(nodes, int(doc["cluster"]["pools"][0]["racks"])),
        "serving.replicas": replicas,
        "serving.target_replicas": replicas,
    }
    if heartbeat_s is not None:
        changes["serving.heartbeat_interval_s"] = heartbeat_s
    directory.mkdir(parents=True, exist_ok=True)
    return write_variant(directory, "prod", changes=changes)


class TooSlow(RuntimeError):
    """``sandbox up`` refused the size for CPU, naming the replicas this machine holds."""

    def __init__(self, fits: int, message: str) -> None:
        super().__init__(message)
        self.fits = fits


class Scale:
    """``sandbox up --simulate`` of ``source`` under ``state_dir``; ``sandbox down`` on exit."""

    def __init__(self, source: Path, state_dir: Path, cpu_share: float) -> None:
        self.source, self.env = source, {"EXASERVE_STATE_DIR": str(state_dir)}
        self.state_dir, self.cpu_share = state_dir, cpu_share
        self.up_s = 0.0
        self.cpu: dict[str, Any] = {}  # sandbox up's measured costs and the steady state's cores it predicts

    def __enter__(self) -> Scale:
        t0 = time.monotonic()
        up = exaserve(
            "sandbox", "up", "--stack-file", str(self.source), "--simulate", "--cpu-share", f"{self.cpu_share:g}",
            "--json", env=self.env, timeout_s=1500,
        )  # fmt: skip
        self.up_s = time.monotonic() - t0
        if up.returncode != 0:
            self.__exit__()
            if up.returncode == 2 and (fits := re.search(r"holds about ([\d,]+) replicas", flat(up.stderr))):
                raise TooSlow(int(fits[1].replace(",", "")), flat(up.stderr).split("error: ", 1)[-1])
            raise RuntimeError(f"sandbox up failed ({up.returncode}): {up.stderr[-3000:]}")
        doc = json_object(up)
        stack = load_stack_file(Path(doc["stack_file"]))
        self.stack_file, self.spec, self.name = stack.path, stack.spec, stack.name
        self.plan = load_fleet(stack.name, stack.spec).plan
        self.state = StateDir(state_dir_of(self.state_dir, stack.name))
        self.router_url = doc["router_url"]
        self.cpu = doc["cpu"]
        return self

    def __exit__(self, *_exc: object) -> None:
        down = exaserve(
            "sandbox", "down", "--stack-file", str(self.source), "--simulate", "--json", env=self.env, timeout_s=600
        )
        if down.returncode != 0:
            print(f"sandbox down failed: {down.stderr[-2000:]}", file=sys.stderr)

    def records(self, kind: str) -> list[ProcessRecord]:
        return [r for r in self.state.records() if r.kind == kind]

    def cli(self, *args: str, timeout_s: float = 1800) -> subprocess.CompletedProcess[str]:
        return exaserve(*args, "--stack-file", str(self.stack_file), env=self.env, timeout_s=timeout_s)


def state_dir_of(root: Path, stack: str) -> Path:
    return root / stack / "sandbox"


def leader(sc: Scale) -> dict[str, Any]:
    return leading_controller(sc.spec, timeout_s=30, request_timeout_s=30)


def host_counts(sc: Scale) -> dict[str, int]:
    """Requests every worker host counted, summed (``METHOD PATH CLIENT`` → count)."""
    return asyncio.run(request_counts(sc.records("worker-host")))


def cpu_of(records: list[ProcessRecord]) -> float:
    return sum(cpu_seconds(r.pid) for r in records)


# ----- client load ------------------------------------------------------------------------------------------------
class Load:
    """Open-loop client load through router 0 in a background thread."""

    def __init__(self, url: str, rate: float) -> None:
        self.gen = LoadGenerator(LoadSpec(url=url, rate_per_s=rate, duration_s=3600, timeout_s=30.0))
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._thread = threading.Thread(target=lambda: self._loop.run_until_complete(self.gen.run(self._stop)))

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)


# ----- the size this machine holds ---------------------------------------------------------------------------------
FIT_MARGIN = 0.9  # below the size sandbox up said fits: its next measurement of the costs may come out higher


@contextlib.contextmanager
def largest_that_fits(args: argparse.Namespace, tmp: Path, figures: dict[str, Any]) -> Iterator[Scale]:
    """``sandbox up`` at ``--replicas``, or, when it refuses for CPU, at the whole nodes it says this machine holds
    (less :data:`FIT_MARGIN`); each refusal is kept in ``figures["refused"]``. ``sandbox down`` on exit."""
    per_node = int(stack_doc("prod")["serving"]["replicas_per_node"])
    replicas = args.replicas
    while True:
        sc = Scale(source_stack(tmp / f"stack-{replicas}", replicas), tmp / "state", args.cpu_share)
        try:
            sc.__enter__()
        except TooSlow as exc:
            figures.setdefault("refused", []).append({"replicas": replicas, "reason": str(exc)})
            print(f"scale_bench: {replicas} replicas refused: {exc}", file=sys.stderr)
            smaller = int(exc.fits * FIT_MARGIN) // per_node * per_node
            if not 0 < smaller < replicas:
                raise
            replicas = smaller
            continue
        try:
            yield sc
        finally:
            sc.__exit__()
        return
