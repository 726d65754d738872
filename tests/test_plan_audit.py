"""`exaserve audit-source`: the source plan's figures recomputed, with verdicts that follow the math."""

from __future__ import annotations

from serving.plan import audit as sourcecheck
from serving.spec.stack import load_stack_file
from tests.support.cli import exaserve, json_object
from tests.support.stacks import SOURCE_PLAN, spec_from


def verdicts(spec_file: object = None) -> dict[str, sourcecheck.Claim]:
    spec = load_stack_file(SOURCE_PLAN).spec if spec_file is None else spec_file
    return {c.claim: c for c in sourcecheck.audit(spec)}  # type: ignore[arg-type]


def test_verdicts_on_the_source_plan() -> None:
    v = verdicts()
    assert v["3,072 replicas, 12 per node"].verdict == "wrong"
    assert "need 96 GPUs, the node has 8" in v["3,072 replicas, 12 per node"].computed
    assert v["KV cache at batch 8, seq 4096"].verdict == "misleading"
    assert "10.7 GB, 8× less" in v["KV cache at batch 8, seq 4096"].correction
    assert v["memory per replica"].verdict == "right" and "369.03 GB" in v["memory per replica"].computed
    assert v["256 nodes at 150–200 k"].verdict == "wrong" and "38.4–51.2 M" in v["256 nodes at 150–200 k"].correction
    assert v["failure detection / recovery"].correction.endswith("18 s / 28 s")
    assert v["requests per second"].verdict == "right"
    assert v["5 rollout batches"].computed.endswith("[615, 615, 614, 614, 614]")


def test_verdicts_follow_the_inputs() -> None:
    """Change an input and a 'right' verdict turns 'wrong': the verdicts are computed, not stored."""
    v = verdicts(spec_from(str(SOURCE_PLAN), cluster__gpu__usable_memory_fraction=0.9))
    assert v["usable memory per node"].verdict == "wrong" and "576 GB" in v["usable memory per node"].computed
    v = verdicts(spec_from(str(SOURCE_PLAN), serving__replicas=2048))
    assert v["sustained concurrency"].verdict == "wrong"


def test_audit_source_cli_json() -> None:
    r = exaserve("audit-source", "--json")
    assert r.returncode == 0, r.stderr
    doc = json_object(r)
    assert doc["stack"] == "source-plan" and doc["ok"] is True
    claims = doc["claims"]
    assert {c["verdict"] for c in claims} == {"right", "wrong", "misleading"}
    assert all(c["computed"] for c in claims)
