"""Benchmark: wall time and peak RSS of `exaserve plan --stack prod` (256 nodes expanded) and of the planner alone.

Run: .venv/bin/python bench/plan_bench.py [--runs N] [--fit-only]
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
    ap.add_argument("--runs", type=int, default=5, help="CLI runs per figure (median and min are printed)")
    ap.add_argument("--fit-only", action="store_true", help="only the `exaserve fit` benchmark (671 B MoE, 256 nodes)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.fit_only:
        fit_bench(args.runs)
        return
    from serving.checks import rules
    from serving.plan.loader import load_fleet
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
        fleet = load_fleet(stack.name, stack.spec)
        rules.check(fleet)
    plan_s = (time.perf_counter() - t0) / n
    print(f"  load + validate prod stack (256 nodes)   {load_s * 1e3:.1f} ms")
    print(f"  planner + rules, in process              {plan_s * 1e3:.2f} ms per plan")
    self_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"  in-process peak RSS                      {self_rss:.0f} MB")
    fit_bench(args.runs)


def fit_bench(runs: int) -> None:
    """`exaserve fit` for a 671 B MoE (models/deepseek-v3) on 256 nodes × 8 H200: every layout (target < 1 s)."""
    import json

    from serving.plan.calibration import gpu_product
    from serving.plan.fit import enumerate_layouts
    from serving.spec.schema import Architecture, architecture_from_hf_config

    cfg = json.loads((ROOT / "models" / "deepseek-v3" / "config.json").read_text())
    arch = Architecture.model_validate(architecture_from_hf_config(cfg, "deepseek-v3"))
    gpu = gpu_product("NVIDIA-H200")
    assert gpu.speed is not None
    n = 200
    t0 = time.perf_counter()
    for _ in range(n):
        result = enumerate_layouts(arch, gpu, gpu.speed, 8, 256, 4096, 1024, 4096, ("bf16", "fp8", "int4"), 50.0)
    per = (time.perf_counter() - t0) / n
    layouts = result.layouts
    best = layouts[0]
    print(
        f"fit: {arch.parameter_count / 1e9:,.1f} B MoE on 256 nodes × 8 H200, bf16/fp8/int4 × KV auto/fp8, "
        "1,024 running requests a replica"
    )
    print(
        f"  enumerate every layout ({len(layouts)} that fit)   {per * 1e3:.2f} ms  ({1.0 / per:,.0f}× under the 1 s target)"
    )
    print(
        f"  best: {best.precision} TP {best.tp} × PP {best.pp}, {best.replicas} replicas × "
        f"{best.sequences_per_replica} seqs = {best.served_sequences:,} served sequences, "
        f"{best.step.seconds * 1e3:,.1f} ms a step, {best.tokens_per_s:,.0f} tok/s"
    )
    walls = []
    for _ in range(runs):
        args = [str(EXASERVE), "fit", "--hf-config", "models/deepseek-v3/config.json", "--gpu", "NVIDIA-H200",
                "--precision", "bf16", "--precision", "fp8", "--precision", "int4", "--max-running-requests", "1024",
                "--json"]  # fmt: skip
        t0 = time.perf_counter()
        subprocess.run(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        walls.append(time.perf_counter() - t0)
    print(f"  exaserve fit --json (CLI, whole process)  wall {statistics.median(walls):.3f} s (min {min(walls):.3f})")


if __name__ == "__main__":
    main()
