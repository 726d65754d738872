"""What the tests know of smg 1.13's worker API timing, each figure derived from its source (cited at smg main
73da68c, the mirror having no 1.13.0 tag; docs/rollout.md)."""

from __future__ import annotations

# smg's drain after DELETE /workers/{id}: default_drain_settle_secs() in crates/protocols/src/worker.rs (a per-worker
# setting, WorkerSpec.health.drain_settle_secs, that the Python launcher does not expose: smg/router_args.py lines 3-5).
DRAIN_SETTLE_S = 5


def removal_job_noticed_s(drain_settle_s: float = DRAIN_SETTLE_S) -> float:
    """Seconds after a DELETE when smg's job queue notices that the removal job ended, and then erases the job status
    it keeps under the worker's URL (``record_job_completion``, model_gateway/src/workflow/job_queue.rs). The job
    ends once the drain slept ``drain_settle_s``; the queue polls the workflow 0.1 s after starting it, each gap
    0.2 s longer than the last, at most 2 s (``wait_for_completion``, crates/workflow/src/engine.rs)."""
    at, gap = 0.0, 0.1
    while True:
        at += gap
        if at >= drain_settle_s:
            return at
        gap = min(gap + 0.2, 2.0)
