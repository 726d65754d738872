"""The canary gate's sandbox helpers, for the CI suite's canary tests (tests/test_rollout_gates_canary.py) and the
rehearsal's (tests/rehearsal/test_rollout_gates.py): the plan's batches, the journal's steps, and a replica's worker
replaced for the length of a block (a slow node, a crash)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

from serving.sandbox.backend import worker_name
from serving.sandbox.processes import restart_worker
from serving.sandbox.worker_config import WorkerConfig
from tests.support.cli import json_object
from tests.support.sandbox import Sandbox
from tests.support.stacks import fleet_of

REPLICAS = 8


def at_v1(sandbox: Sandbox) -> Sandbox:
    """Every worker on v1, with its configured latency, and in the router (one-command rollback if not)."""
    r = sandbox.cli("rollback", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert set(sandbox.versions().values()) == {"v1"} and len(sandbox.workers()) == REPLICAS
    return sandbox


def replica_config(box: Sandbox, replica_id: str) -> WorkerConfig:
    """The worker of ``replica_id`` as the sandbox started it."""
    index = next(r.index for r in fleet_of(box.spec).plan.replicas if r.id == replica_id)
    return box.configs[index]


def batches(box: Sandbox) -> list[list[str]]:
    doc = json_object(box.cli("rollout", "--to", "v2", "--dry-run", "--json"))
    return [b["replicas"] for b in doc["batches"]]


def journal_kinds(box: Sandbox) -> list[tuple[str, dict[str, Any]]]:
    lines = box.paths.journal_path.read_text().splitlines()[1:]
    return [(e["kind"], e.get("step") or {}) for e in (json.loads(line)["event"] for line in lines)]


@contextlib.contextmanager
def replaced_worker(box: Sandbox, replica_id: str, config: WorkerConfig | None) -> Iterator[WorkerConfig]:
    """Restart ``replica_id``'s worker with ``config`` (None: leave it as it is); afterwards, whatever happened to
    it, it runs its original configuration again."""
    original = replica_config(box, replica_id)
    if config is not None:
        restart_worker(box.processes, worker_name(original.port), config)
    try:
        yield original
    finally:
        restart_worker(box.processes, worker_name(original.port), original)
        deadline = time.monotonic() + 30
        while len([ok for ok in box.workers().values() if ok]) < REPLICAS and time.monotonic() < deadline:
            time.sleep(0.2)
