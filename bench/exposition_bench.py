"""Benchmark: CPU to parse a Prometheus exposition, serving.exposition against prometheus_client's parser.

Two texts the fleet reads all the time: a simulated SGLang worker's ``/metrics`` after traffic (its histogram,
counters and gauges: what the node agents read every heartbeat and an updater's soak reads on every replica), and a
router exposition with per-worker series for ``--workers`` workers (``smg_worker_health`` and ``smg_worker_cb_state``
per worker, as smg 1.13 writes them: what the fleet controller and the updater read of every router instance). Each
figure is the CPU (``time.process_time``) per parse over ``--rounds`` rounds of ``--parses`` parses: min, median and
max, and how many samples each text holds. The samples are checked equal first.

    .venv/bin/python bench/exposition_bench.py [--workers 2048] [--rounds 7] [--parses 200] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from serving import exposition
from serving.sandbox.worker import SimulatedWorker
from serving.sandbox.worker_config import WorkerConfig
from tests.support.exposition import comparable, reference


def worker_text() -> str:
    async def served() -> str:
        worker = SimulatedWorker(WorkerConfig(port=1, latency_ms=0.0, jitter_ms=0.0, model_path="/m"))
        metrics = worker.metrics
        labels = metrics.request_labels("0")
        for seconds in (0.05, 0.3, 1.2, 7.0):
            metrics._e2e.labels(**labels).observe(seconds)
            metrics._requests.labels(**labels).inc()
        for rank, scheduler in enumerate(metrics.scheduler_labels):
            metrics.export_rank(rank, scheduler, worker.scheduler.load, 0.25)
        return generate_latest(metrics.registry).decode()

    return asyncio.run(served())


def router_text(workers: int) -> str:
    registry = CollectorRegistry()
    health = Gauge("smg_worker_health", "Worker health (1 healthy, 0 unhealthy)", ["worker"], registry=registry)
    breaker = Gauge("smg_worker_cb_state", "Circuit breaker state", ["worker"], registry=registry)
    for i in range(workers):
        url = f"http://10.{i // 256}.{i % 256}.1:30000"
        health.labels(worker=url).set(1)
        breaker.labels(worker=url).set(0)
    return generate_latest(registry).decode()


def cpu_per_parse(parse: Callable[[str], object], text: str, rounds: int, parses: int) -> dict[str, float]:
    per: list[float] = []
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(parses):
            parse(text)
        per.append((time.process_time() - start) / parses * 1000)
    return {"min_ms": min(per), "median_ms": statistics.median(per), "max_ms": max(per)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--parses", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    texts = {"simulated worker /metrics": worker_text(), f"router, {args.workers} workers": router_text(args.workers)}
    figures = {}
    for name, text in texts.items():
        ours = exposition.samples(text)
        assert comparable(ours) == comparable(reference(text)), name
        parses = max(1, args.parses * 37 // len(ours))  # about the same CPU per round for either text
        figures[name] = {
            "samples": len(ours),
            "serving.exposition": cpu_per_parse(exposition.samples, text, args.rounds, parses),
            "prometheus_client": cpu_per_parse(reference, text, args.rounds, parses),
        }
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    for name, f in figures.items():
        ours, theirs = f["serving.exposition"], f["prometheus_client"]
        print(
            f"{name} ({f['samples']} samples): serving.exposition {ours['median_ms']:.3f} ms a parse "
            f"({ours['min_ms']:.3f}–{ours['max_ms']:.3f}), prometheus_client {theirs['median_ms']:.3f} ms "
            f"({theirs['min_ms']:.3f}–{theirs['max_ms']:.3f}): × {theirs['median_ms'] / ours['median_ms']:.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
