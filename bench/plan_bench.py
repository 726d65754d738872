"""Benchmark: wall time and peak RSS of `exaserve plan --stack prod` (256 nodes expanded) and of the planner alone.

Run: .venv/bin/python bench/plan_bench.py [--runs N]
Prints figures; asserts nothing about time (these machines are shared and noisy).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXASERVE = Path(sys.executable).parent / "exaserve"


def cli_run(stack: str, as_json: bool) -> tuple[float, float]:
    """One CLI run: wall seconds and the child's peak RSS in MB (from wait4's rusage)."""
    args = [str(EXASERVE), "plan", "--stack", stack] + (["--json"] if as_json else [])
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = __import__("os").wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"exaserve plan --stack {stack} failed with status {status}")
    return wall, usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from serving.checks import rules
    from serving.plan import planner
    from serving.spec.stack import load_stack

    print(f"exaserve plan benchmark, {args.runs} runs each (median; min)")
    for stack, as_json in (("prod", False), ("prod", True), ("dev", False)):
        walls, rss = zip(*(cli_run(stack, as_json) for _ in range(args.runs)), strict=True)
        label = f"exaserve plan --stack {stack}{' --json' if as_json else ''}"
        print(f"  {label:<34} wall {statistics.median(walls):.3f} s (min {min(walls):.3f})  peak RSS {max(rss):.0f} MB")

    t0 = time.perf_counter()
    stack = load_stack("prod")
    load_s = time.perf_counter() - t0
    n = 50
    t0 = time.perf_counter()
    for _ in range(n):
        p = planner.plan(stack.spec)
        rules.check(stack.spec, p)
    plan_s = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    reps = planner.fleet_replicas(stack.spec)
    reps_s = time.perf_counter() - t0
    print(f"  load + validate prod stack (256 nodes)   {load_s * 1e3:.1f} ms")
    print(f"  planner + rules, in process              {plan_s * 1e3:.2f} ms per plan")
    print(f"  replica inventory ({len(reps):,} replicas)      {reps_s * 1e3:.1f} ms")
    self_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"  in-process peak RSS                      {self_rss:.0f} MB")


if __name__ == "__main__":
    main()
