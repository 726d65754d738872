"""Benchmark: wall time and peak RSS of `exaserve render --stack prod`, next to the program shape it avoids.

The avoided shape (bench/avoided_program) is the real program with one LeaderWorkerSet per replica — 2,048 in
prod — instead of one per update group. Both run the full command (the Pulumi program under mocks, schema
validation of every object, YAML output) in a fresh process; peak RSS is that process's own (wait4).
Goal: the prod render under 3 s and 300 MB on this machine.

    .venv/bin/python bench/render_bench.py [--stack prod] [--runs 3] [--enforce]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXASERVE = Path(sys.executable).parent / "exaserve"
AVOIDED = Path(__file__).resolve().parent / "avoided_program"
GOAL_S, GOAL_MB = 3.0, 300.0


def run(args: list[str]) -> tuple[float, float, int]:
    """(wall seconds, peak RSS in MB, objects rendered) of one `exaserve render` process."""
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        proc = subprocess.Popen(
            [str(EXASERVE), "render", *args, "--out", out, "--json"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None and proc.stderr is not None
        stdout, stderr = proc.stdout.read(), proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"exaserve render {' '.join(args)} failed ({proc.returncode}):\n{stderr.decode()}")
        return wall, usage.ru_maxrss / 1024, int(json.loads(stdout)["objects"])


def series(args: list[str], runs: int) -> dict[str, float]:
    samples = [run(args) for _ in range(runs)]
    return {
        "wall_s": statistics.median(s[0] for s in samples),
        "peak_rss_mb": max(s[1] for s in samples),
        "objects": samples[0][2],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stack", default="prod")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--enforce", action="store_true", help="exit 1 when the goal is missed")
    args = parser.parse_args()
    grouped = series(["--stack", args.stack], args.runs)
    avoided = series(["--stack", args.stack, "--program-dir", str(AVOIDED)], args.runs)
    rows = [("per update group (shipped)", grouped), ("per replica (avoided)", avoided)]
    print(f"exaserve render --stack {args.stack}: median of {args.runs} runs, fresh process each")
    print(f"{'program shape':<28}{'objects':>9}{'wall s':>9}{'peak RSS MB':>13}")
    for label, r in rows:
        print(f"{label:<28}{r['objects']:>9,.0f}{r['wall_s']:>9.2f}{r['peak_rss_mb']:>13.0f}")
    print(
        f"avoided / shipped: {avoided['wall_s'] / grouped['wall_s']:.1f}× the time, "
        f"{avoided['peak_rss_mb'] / grouped['peak_rss_mb']:.1f}× the memory, "
        f"{avoided['objects'] / grouped['objects']:.1f}× the objects"
    )
    ok = grouped["wall_s"] < GOAL_S and grouped["peak_rss_mb"] < GOAL_MB
    print(f"goal (< {GOAL_S:g} s and < {GOAL_MB:g} MB): {'met' if ok else 'MISSED'}")
    return 0 if ok or not args.enforce else 1


if __name__ == "__main__":
    sys.exit(main())
