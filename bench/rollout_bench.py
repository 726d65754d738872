"""Benchmark: the rolling updater on the sandbox (the real router, simulated workers, real client load).

    .venv/bin/python bench/rollout_bench.py [--rate 100] [--latency-scale 1] [--json]

Figures:

* overhead ratio — wall time of a healthy 5-batch rollout (``exaserve rollout``, journal span) over
  the sum of its configured waits (baseline window + per batch warm-up + soak interval): what drains,
  restarts, health checks and router calls add on top of the waits the plan asks for;
* client P99 during the rollout against the P99 of the same load just before it (measured by the
  load generator, i.e. what clients saw);
* reaction time — from a bad batch's readmission (journal: ``readmit`` done) to the start of its
  rollback (journal: the failed soak event): ``v2-broken`` with the warm-up switched off (so the
  error gate in the soak has to catch it) and ``v2-slow`` (the P99 gate, decided at the end of the
  soak interval).

The stack is a copy of ``Pulumi.sandbox.yaml`` (100 ms simulated latency, 150 ms for ``v2-slow``)
with free ports, the latencies optionally scaled by ``--latency-scale``; all timings come from the stack.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from serving.rollout.journal import StackState
from serving.router.loadgen import LoadGenerator, LoadReport, LoadSpec
from serving.sandbox.processes import free_port_block
from tests.support.paths import REPO

EXASERVE = Path(sys.executable).parent / "exaserve"
REPLICAS = 8


def write_stack(directory: Path, latency_scale: float, base: int, *, warmup: bool = True) -> Path:
    doc = yaml.safe_load((REPO / "Pulumi.sandbox.yaml").read_text())
    cfg = doc["config"]
    cfg["exaserve:model"]["hf_config"] = str(REPO / cfg["exaserve:model"]["hf_config"])
    box = cfg["exaserve:sandbox"]
    box.update(router_port=base + REPLICAS, prometheus_port=base + REPLICAS + 1, worker_base_port=base)
    for release in box["versions"].values():
        release["latency_ms"] *= latency_scale
    if not warmup:
        cfg["exaserve:serving"]["warmup_duration_s"] = 0
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "Pulumi.sandbox.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


class Load:
    """Open-loop load in a background thread; ``report()`` may be read while it runs."""

    def __init__(self, url: str, rate: float) -> None:
        self.gen = LoadGenerator(LoadSpec(url=url, rate_per_s=rate, duration_s=3600, timeout_s=10.0))
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._thread = threading.Thread(target=lambda: self._loop.run_until_complete(self.gen.run(self._stop)))
        self.started = 0.0

    def __enter__(self) -> Load:
        self._thread.start()
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def now(self) -> float:
        return time.monotonic() - self.started

    def window(self, start: float, end: float) -> LoadReport:
        return self.gen.report().window(start, end)


def cli(stack: Path, state: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    r = subprocess.run(
        [str(EXASERVE), *args, "--stack-file", str(stack)],
        capture_output=True,
        text=True,
        env={**os.environ, "EXASERVE_STATE_DIR": str(state)},
        timeout=600,
        check=False,
    )
    return r, time.monotonic() - t0


def journal(state: Path) -> list[dict[str, Any]]:
    path = StackState.for_stack("sandbox", state).journal_path
    return [json.loads(line) for line in path.read_text().splitlines()]


def reaction_s(records: list[dict[str, Any]]) -> tuple[float | None, str]:
    """Seconds from the last forward readmission before the first failure to that failure."""
    readmitted: float | None = None
    for rec in records[1:]:
        ev = rec["event"]
        step = ev.get("step") or {}
        if ev["kind"] == "done" and step.get("phase") == "readmit" and not step.get("rollback"):
            readmitted = ev["at"]
        if ev["kind"] == "failed":
            return (ev["at"] - readmitted if readmitted is not None else None), ev["detail"]
    return None, "no failure"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=100.0, help="client requests per second (open loop)")
    ap.add_argument("--latency-scale", type=float, default=1.0, help="multiply the stack's simulated latencies")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rollout-bench-") as tmp:
        root = Path(tmp)
        state = root / "state"
        base = free_port_block(REPLICAS + 2)  # both stack copies drive the same sandbox
        gated = write_stack(root / "gated", args.latency_scale, base)
        no_warmup = write_stack(root / "no-warmup", args.latency_scale, base, warmup=False)
        cfg = yaml.safe_load(gated.read_text())["config"]
        router = f"http://127.0.0.1:{cfg['exaserve:sandbox']['router_port']}"
        up, _ = cli(gated, state, "sandbox", "up")
        if up.returncode != 0:
            print(up.stdout + up.stderr, file=sys.stderr)
            return 1
        try:
            with Load(router, args.rate) as load:
                time.sleep(10)
                plan = json.loads(cli(gated, state, "rollout", "--to", "v2", "--dry-run", "--json")[0].stdout)
                before_start = load.now()
                r, wall = cli(gated, state, "rollout", "--to", "v2", "--json")
                during_end = load.now()
                before = load.window(before_start - 8, before_start)
                during = load.window(before_start, during_end)
                outcome = json.loads(r.stdout)["outcome"]
                recs = journal(state)
                span = recs[-1]["written_at"] - recs[0]["written_at"]
                figures["healthy"] = {
                    "outcome": outcome,
                    "configured_wait_s": plan["configured_wait_s"],
                    "journal_span_s": round(span, 2),
                    "cli_wall_s": round(wall, 2),
                    "overhead_ratio": round(span / plan["configured_wait_s"], 2),
                    "client_p99_before_ms": round(before.p99_s * 1000, 1),
                    "client_p99_during_ms": round(during.p99_s * 1000, 1),
                    "client_errors_during": during.errors,
                    "requests_during": during.count,
                }
                cli(gated, state, "rollback")
                for name, stack, version in (
                    ("broken_no_warmup", no_warmup, "v2-broken"),
                    ("slow", gated, "v2-slow"),
                ):
                    r, wall = cli(stack, state, "rollout", "--to", version, "--json")
                    seconds, detail = reaction_s(journal(state))
                    figures[name] = {
                        "outcome": json.loads(r.stdout)["outcome"],
                        "readmission_to_rollback_s": None if seconds is None else round(seconds, 2),
                        "interval_s": cfg["exaserve:rollout"]["interval_s"],
                        "breach": detail,
                        "cli_wall_s": round(wall, 2),
                    }
        finally:
            cli(gated, state, "sandbox", "down")
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    h = figures["healthy"]
    print(f"healthy rollout to v2 ({h['outcome']}), {args.rate:g} req/s, latency × {args.latency_scale:g}")
    print(f"  configured waits   {h['configured_wait_s']:7.2f} s")
    print(f"  journal span       {h['journal_span_s']:7.2f} s   (CLI wall {h['cli_wall_s']:.2f} s)")
    print(f"  overhead ratio     {h['overhead_ratio']:7.2f}")
    print(f"  client P99 before  {h['client_p99_before_ms']:7.1f} ms")
    print(f"  client P99 during  {h['client_p99_during_ms']:7.1f} ms   ({h['requests_during']} requests, "
          f"{h['client_errors_during']} errors)")  # fmt: skip
    for name in ("broken_no_warmup", "slow"):
        f = figures[name]
        print(f"{name}: {f['outcome']}; readmission → rollback {f['readmission_to_rollback_s']} s "
              f"(soak interval {f['interval_s']} s): {f['breach']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
