"""Benchmark: the rolling updater on the sandbox (the real router, simulated workers, real client load).

    .venv/bin/python bench/rollout_bench.py [--rate 100] [--latency-scale 1] [--json]

Figures:

* overhead ratio — wall time of a healthy 5-batch rollout (``exaserve rollout``, journal span) over
  the sum of its configured waits (baseline window + per batch warm-up + soak interval): what drains,
  restarts, health checks and router calls add on top of the waits the plan asks for; and the same with the
  release's own configured start-up (``sandbox.versions.v2.startup_s`` per batch, the simulated model load the
  health phase waits for) counted as a wait;
* where the wall time goes, per phase (journal: the time from one committed event to the next, summed over
  the batches), against the wait the plan configures for that phase (baseline window, warm-up, soak interval;
  0 for remove, drain, update, health and readmit), plus the CLI's own start and finish outside the journal;
* client P99 during the rollout against the P99 of the same load just before it (measured by the
  load generator, i.e. what clients saw);
* reaction time — from a bad batch's readmission (journal: ``readmit`` done) to the start of its
  rollback (journal: the failed soak event): ``v2-broken`` with the warm-up switched off (so the
  error gate in the soak has to catch it) and ``v2-slow`` (the P99 gate, decided at the end of the
  soak interval).

The sandbox is the tests' (``tests/support/sandbox.py``): ``Pulumi.sandbox.yaml`` (100 ms simulated latency, 150 ms
for ``v2-slow``) on free ports, the latencies optionally scaled by ``--latency-scale``, brought up with
``exaserve sandbox up``; all timings come from the stack.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from serving.router.loadgen import LoadGenerator, LoadReport, LoadSpec
from tests.support.cli import json_object
from tests.support.sandbox import Sandbox, running_sandbox
from tests.support.stacks import stack_doc

REPLICAS = 8


def scaled_latencies(scale: float) -> dict[str, Any]:
    """Dotted changes multiplying each simulated release's latency in the sandbox stack by ``scale``."""
    versions = stack_doc("sandbox")["sandbox"]["versions"]
    return {f"sandbox.versions.{name}.latency_ms": r["latency_ms"] * scale for name, r in versions.items()}


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


def timed(box: Sandbox, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    r = box.cli(*args, timeout_s=600)
    return r, time.monotonic() - t0


def journal(box: Sandbox) -> list[dict[str, Any]]:
    return [json.loads(line) for line in box.paths.journal_path.read_text().splitlines()]


def phase_seconds(records: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds per phase of a forward rollout, summed over its batches: each event's time since the previous
    record (the plan record for the first), i.e. the step's own work plus the runner's bookkeeping before it."""
    out: dict[str, float] = {}
    previous = records[0]["written_at"]
    for rec in records[1:]:
        ev = rec["event"]
        phase = (ev.get("step") or {}).get("phase", ev["kind"])
        out[phase] = out.get(phase, 0.0) + ev["at"] - previous
        previous = ev["at"]
    return out


def configured_by_phase(plan: dict[str, Any]) -> dict[str, float]:
    """The waits the plan asks for, per phase (the parts of ``configured_wait_s``)."""
    t, n = plan["timings"], len(plan["batches"])
    return {"baseline": t["baseline_window_s"], "warmup": n * t["warmup_s"], "soak": n * t["interval_s"]}


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
    ap.add_argument(
        "--hosted",
        action="store_true",
        help="the scale layout's workers (serving.sandbox.worker_host: a restart reopens a port in a running process) "
        "instead of one process per worker (a restart spawns a Python interpreter: ≈ 0.7 s the updater does not cause)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    figures: dict[str, Any] = {}
    changes = scaled_latencies(args.latency_scale)
    if args.hosted:
        changes["sandbox.nodes_per_process"] = stack_doc("sandbox")["cluster"]["pools"][0]["count"]
    with (
        tempfile.TemporaryDirectory(prefix="rollout-bench-") as tmp,
        running_sandbox(Path(tmp), replicas=REPLICAS, changes=changes) as gated,
    ):
        no_warmup = gated.variant("no-warmup", {"serving.warmup_duration_s": 0})
        with Load(gated.router_url, args.rate) as load:
            time.sleep(10)
            plan = json_object(timed(gated, "rollout", "--to", "v2", "--dry-run", "--json")[0])
            before_start = load.now()
            r, wall = timed(gated, "rollout", "--to", "v2", "--json")
            during_end = load.now()
            before = load.window(before_start - 8, before_start)
            during = load.window(before_start, during_end)
            outcome = json_object(r)["outcome"]
            recs = journal(gated)
            span = recs[-1]["written_at"] - recs[0]["written_at"]
            configured = configured_by_phase(plan)
            # The release's own start-up (simulated model loading, sandbox.versions.v2.startup_s), once per batch:
            # configured by the stack, waited for inside "health", not counted in the plan's waits.
            startup = len(plan["batches"]) * gated.spec.sandbox.versions["v2"].startup_s if gated.spec.sandbox else 0.0
            phases = {
                name: {"wall_s": round(seconds, 2), "configured_s": configured.get(name, 0.0),
                       "overhead_s": round(seconds - configured.get(name, 0.0), 2)}
                for name, seconds in phase_seconds(recs).items()
            }  # fmt: skip
            figures["healthy"] = {
                "outcome": outcome,
                "configured_wait_s": plan["configured_wait_s"],
                "journal_span_s": round(span, 2),
                "cli_wall_s": round(wall, 2),
                "overhead_ratio": round(span / plan["configured_wait_s"], 3),
                "cli_outside_journal_s": round(wall - span, 2),
                "release_startup_s": startup,
                "overhead_ratio_with_startup": round(span / (plan["configured_wait_s"] + startup), 3),
                "phases": phases,
                "client_p99_before_ms": round(before.p99_s * 1000, 1),
                "client_p99_during_ms": round(during.p99_s * 1000, 1),
                "client_errors_during": during.errors,
                "requests_during": during.count,
            }
            gated.cli("rollback")
            for name, box, version in (("broken_no_warmup", no_warmup, "v2-broken"), ("slow", gated, "v2-slow")):
                r, wall = timed(box, "rollout", "--to", version, "--json")
                seconds, detail = reaction_s(journal(box))
                figures[name] = {
                    "outcome": json_object(r)["outcome"],
                    "readmission_to_rollback_s": None if seconds is None else round(seconds, 2),
                    "interval_s": box.spec.rollout.interval_s,
                    "breach": detail,
                    "cli_wall_s": round(wall, 2),
                }
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    h = figures["healthy"]
    layout = "hosted workers" if args.hosted else "one process per worker"
    print(f"healthy rollout to v2 ({h['outcome']}), {args.rate:g} req/s, latency × {args.latency_scale:g}, {layout}")
    print(f"  configured waits   {h['configured_wait_s']:7.2f} s")
    print(f"  journal span       {h['journal_span_s']:7.2f} s   (CLI wall {h['cli_wall_s']:.2f} s)")
    print(f"  overhead ratio     {h['overhead_ratio']:7.3f}")
    print(f"  with the release's start-up ({h['release_startup_s']:g} s, inside health) counted as a wait: "
          f"{h['overhead_ratio_with_startup']:.3f}")  # fmt: skip
    print("  per phase (5 batches summed)   wall    configured  overhead")
    for name, f in h["phases"].items():
        print(f"    {name:<26} {f['wall_s']:7.2f} s  {f['configured_s']:7.2f} s  {f['overhead_s']:+7.2f} s")
    print(f"    {'CLI outside the journal':<26} {h['cli_outside_journal_s']:7.2f} s  (start-up, fleet check, report)")
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
