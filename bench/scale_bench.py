"""Benchmark: the rehearsal at the reference size — the prod stack's 2,048 replicas (256 nodes) as SIMULATED SGLang
workers (256 per process) behind 3 REAL smg 1.13 gateway instances, 3 REAL controllers on a REAL etcd and 256 node agents
(``exaserve sandbox up --stack prod --simulate``), on one machine, all four sections on one sandbox.

    PYTHONPATH=. .venv/bin/python bench/scale_bench.py [--replicas 2048] [--rate 100] [--sections S,…] [--json]

``--sections`` picks of ``reference,rollout,node-loss,scheduling`` (default all; each runs after ``sandbox up``).
``sandbox up`` measures this machine's CPU costs first and refuses a size whose steady state needs more than
``--cpu-share`` of the cores (default 0.5), naming the replicas the machine holds: the bench then runs at that size,
less 10 %, and prints the refusal first (docs/scale.md, *The CPU bound*).

1. ``sandbox up``'s wall time and each router's CPU time to register the workers; then over four heartbeats: each
   router's memory, open files, CPU share and health checks by result, the healthy workers each router lists; the
   requests the workers served (counted inside the worker processes by path and client: the routers' and the agents'
   health checks against their intervals); controller-0's messages per second against the planner's
   ``aggregated_per_s``/``direct_per_s`` and the replicas probed per message (the aggregation ratio); every kind of
   process's CPU and memory, CPU per worker request and per agent probe.
2. The 5-batch rollout of every replica (``exaserve rollout --to rehearsal``, the stack's waits ÷ 60) under ``--rate``
   client requests per second, paused (SIGINT) after ``--rollout-batches`` batches (default 1: at 2,048 a batch takes
   ~7 min here, the routers' ring rebuilds, docs/scale.md; 0 runs all five) and the rest extrapolated from them: wall
   time, overhead ratio, each batch's removal from and readmission to every router, router API calls per batch and
   their latency in the router, client errors.
3. Node loss: one node's 8 workers stopped (in-flight requests cut, as by a kill) under ``--rate``: when the routers
   mark them unhealthy, when the controller takes them out of every router and migrates them, client errors.
4. The controller's scheduling period: a controller instance (the same ``ControllerService`` ``exaserve controller
   run`` runs, a follower on the sandbox's etcd) in its own process, fed by real agents in two others — one per node
   (aggregated) or one per replica (direct), for half and all of the replicas, at ``scheduler.period_ms`` and at
   10 ms: how late each period of its ``_load_loop`` runs (p50/p99/max), the work per period, its CPU share, the
   messages it receives. The sandbox's own agents are stopped first.

Prints figures; asserts nothing. A section that fails prints the figures measured before it.

The sandbox, the figures read off its processes and the client load: ``bench/scale_sandbox.py``; sections 1-3:
``bench/scale_sections.py``; section 4 and its child processes: ``bench/scale_scheduling.py``; the table:
``bench/scale_report.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.scale_report import print_table
from bench.scale_sandbox import largest_that_fits, machine
from bench.scale_scheduling import scheduling
from bench.scale_sections import node_loss, reference, rollout
from serving.sandbox.processes import cpu_seconds
from tests.support.stacks import stack_doc

SECTIONS = ("reference", "rollout", "node-loss", "scheduling")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, default=int(stack_doc("prod")["serving"]["replicas"]))
    ap.add_argument(
        "--rate", type=float, default=100.0, help="client requests per second during the node loss and the rollout"
    )
    ap.add_argument(
        "--sections",
        type=lambda v: v.split(","),
        default=list(SECTIONS),
        help=f"comma-separated, of {','.join(SECTIONS)} (default: all, in that order, on one sandbox)",
    )
    ap.add_argument(
        "--rollout-batches",
        type=int,
        default=1,
        help="batches the rollout runs before it is paused (SIGINT), the rest extrapolated from them; 0: all "
        "(at 2,048 replicas on 2 cores each batch takes 1.5-2.5 min on smg 1.13, with --cpu-share 1.0: docs/scale.md)",
    )
    ap.add_argument(
        "--cpu-share",
        type=float,
        default=0.5,
        help="passed to sandbox up: the most of the CPUs the sandbox's steady state may need (1.0: let it saturate)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if unknown := sorted(set(args.sections) - set(SECTIONS)):
        ap.error(f"--sections: unknown {unknown}; choose from {','.join(SECTIONS)}")
    figures: dict[str, Any] = {"machine": machine(), "rate": args.rate}
    started = time.monotonic()
    try:
        measure(args, figures)
    except BaseException:  # a section that fails must not lose the sections measured before it
        print("scale_bench: stopped early; the figures measured so far:", file=sys.stderr)
        print(json.dumps(figures, indent=2), file=sys.stderr)
        raise
    figures["bench_wall_s"] = round(time.monotonic() - started, 1)
    figures["machine"]["end_loadavg"] = machine()["loadavg_1_5_15"]
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print_table(figures)
        print(f"bench wall time {figures['bench_wall_s']:.0f} s")
    return 0


def measure(args: argparse.Namespace, figures: dict[str, Any]) -> None:
    """Sections 1-4 into ``figures``, each added as soon as it is measured, on one sandbox."""
    with tempfile.TemporaryDirectory(prefix="scale-bench-") as tmp_name:
        tmp = Path(tmp_name)
        with largest_that_fits(args, tmp, figures) as sc:
            routers = sc.records("router")
            registration = {r.name: round(cpu_seconds(r.pid), 1) for r in routers}
            figures["bring_up"] = {
                "replicas": len(sc.plan.replicas),
                "nodes": len({r.node.name for r in sc.plan.replicas}),
                "routers": len(routers),
                "controllers": len(sc.records("controller")),
                "worker_processes": len(sc.records("worker-host")),
                "agent_processes": len(sc.records("agent")),
                "up_s": round(sc.up_s, 1),
                "cpu": sc.cpu,
            }
            time.sleep(2 * sc.spec.serving.heartbeat_interval_s)  # every agent's first reports in
            if "reference" in args.sections:
                figures["reference"] = reference(sc, 4 * sc.spec.serving.heartbeat_interval_s)
                for row in figures["reference"]["routers"]:
                    row["registration_cpu_s"] = registration[row["name"]]
            if "rollout" in args.sections:
                figures["rollout"] = rollout(sc, args.rate, args.rollout_batches or None)
            if "node-loss" in args.sections:
                figures["node_loss"] = node_loss(sc, args.rate)
            if "scheduling" in args.sections:
                figures["scheduling"] = scheduling(sc, sc.stack_file, tmp)


if __name__ == "__main__":
    sys.exit(main())
