"""The rollout's QPS and P99 gates enforced, in real time: the sandbox of the CI suite's canary tests (8 simulated
SGLang workers behind the REAL smg gateway, real client load, `exaserve rollout` as users run it) with every gate
enforced (the CI suite runs these rollouts with the QPS and P99 gates in dry run: tests/support/sandbox.py
CI_TIER). A healthy release must pass every gate of every batch; a release 50 % slower on every request must
roll back on its canary's P99 (or median) against its peers; a slow peer outside the batch must pause the rollout
naming it, and the rollout must complete once the peer is fixed. Each records its gate figures against the limits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support import canary
from tests.support.canary import REPLICAS
from tests.support.cli import json_object
from tests.support.rehearsal import figure
from tests.support.sandbox import GATED, Load, Sandbox, p99_gate_breach, running_sandbox

Record = Callable[..., dict[str, Any]]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    with running_sandbox(tmp_path_factory.mktemp("gates"), replicas=REPLICAS, changes=GATED) as box:
        yield box


@pytest.fixture
def at_v1(sandbox: Sandbox) -> Sandbox:
    return canary.at_v1(sandbox)


def gate_figures(doc: dict[str, Any], limits: dict[str, float]) -> list[dict[str, Any]]:
    """Each judged batch's QPS drop, P99 rise and error rate against the stack's limits (ok: within them)."""
    out = []
    for b in doc["batches"]:
        g = b.get("gates") or {}
        for key, limit in limits.items():
            value = g.get(key)
            out.append(figure(f"batch {b['index']} {key}", value, limit, "share", value is not None and value <= limit))
    return out


def test_a_healthy_release_passes_every_gate_of_every_batch(at_v1: Sandbox, rehearsal: Record) -> None:
    r = at_v1.spec.rollout
    limits = {"qps_drop": r.max_qps_drop, "p99_rise": r.max_p99_rise, "error_rate": r.max_error_rate}
    with Load(at_v1.router_url) as load:
        run = at_v1.cli("rollout", "--to", "v2", "--json")
    doc = json_object(run)
    figures = gate_figures(doc, limits)
    figures.append(figure("client errors", load.report.errors if load.report else None, 0, "requests",
                          load.report is not None and load.report.errors == 0))  # fmt: skip
    passed = run.returncode == 0 and doc["outcome"] == "completed" and all(f["ok"] for f in figures)
    rehearsal("rollout", "passed" if passed else "failed", figures, outcome=doc["outcome"], reason=doc.get("reason"))
    assert run.returncode == 0 and doc["outcome"] == "completed", doc.get("reason")
    assert [b["verdict"]["decision"] for b in doc["batches"]] == ["pass"] * 5, [b["verdict"] for b in doc["batches"]]
    assert all(f["ok"] for f in figures), [f for f in figures if not f["ok"]]


def test_a_release_fifty_percent_slower_rolls_back_on_its_canarys_latency(at_v1: Sandbox, rehearsal: Record) -> None:
    with Load(at_v1.router_url):
        run = at_v1.cli("rollout", "--to", "v2-slow", "--json")
    doc = json_object(run)
    first = doc["batches"][0]
    rise = (first.get("gates") or {}).get("p99_rise")
    caught = run.returncode == 1 and doc["outcome"] == "rolled_back" and first["verdict"]["decision"] == "rollback"
    rehearsal(
        "rollout",
        "passed" if caught else "failed",
        [figure("batch 0 canary p99_rise (must breach)", rise, at_v1.spec.rollout.max_p99_rise, "share", caught)],
        outcome=doc["outcome"],
        evidence=first["verdict"]["evidence"],
    )
    assert caught, doc.get("reason")
    # against its peers' P99, or its median when a loaded moment inflated theirs (CI: peers 400.6 ms, canary 171.5 ms)
    breach = p99_gate_breach(first)
    assert "canary P99" in breach or "canary median" in breach, breach
    assert set(at_v1.versions().values()) == {"v1"} and len(at_v1.workers()) == REPLICAS


def test_a_slow_peer_pauses_naming_it_and_resuming_once_it_is_fixed_completes(
    at_v1: Sandbox, rehearsal: Record
) -> None:
    """One not-yet-updated replica on the same release at half speed (a slow node: twice the latency) from before
    the rollout: batch 0's verdict names it and pauses; fixed, `--resume` soaks batch 0 again and the rollout
    completes. Twice, not 1.5 times: the simulated latency is 100 ms, and on a busy machine scheduling adds some
    45 ms to everyone's tail (canary P99 155 ms seen), which can squeeze a 1.5 x slowdown below the gate's +30 % at
    the P99: the gate cannot call what it cannot see."""
    plan_batches = canary.batches(at_v1)
    victim = plan_batches[3][0]
    original = canary.replica_config(at_v1, victim)
    slow = dataclasses.replace(original, latency_ms=original.latency_ms * 2, jitter_ms=original.jitter_ms * 2)
    with canary.replaced_worker(at_v1, victim, slow), Load(at_v1.router_url):
        run = at_v1.cli("rollout", "--to", "v2", "--json")
    doc = json_object(run)
    verdict = doc["batches"][0]["verdict"]
    named = run.returncode == 1 and verdict["decision"] == "pause" and verdict["replicas"] == [victim]
    with Load(at_v1.router_url):  # the node is fixed (the worker runs its configured latency again)
        resumed = at_v1.cli("rollout", "--resume", "--json")
    done = json_object(resumed)
    completed = resumed.returncode == 0 and done["outcome"] == "completed"
    rehearsal(
        "rollout",
        "passed" if named and completed else "failed",
        [
            figure("slow peer named, rollout paused", None, None, "", named, evidence=verdict["evidence"]),
            figure("completed once the peer was fixed", None, None, "", completed, reason=done.get("reason")),
        ],
    )
    assert named, doc["batches"][0]
    assert f"{victim} P99" in verdict["evidence"][0]
    assert not any(step.get("rollback") for _kind, step in canary.journal_kinds(at_v1))
    assert completed, resumed.stderr
    assert [b["verdict"]["decision"] for b in done["batches"]] == ["pass"] * 5
    assert done["batches"][-1]["verdict"]["basis"] == "updated"
    assert set(at_v1.versions().values()) == {"v2"}
