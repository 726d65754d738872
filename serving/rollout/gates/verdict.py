"""What a soak's judgement leaves: the verdict and the gate values, as the journal keeps them, and the canary's KV
pool check added to them — pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from serving.rollout.gates.window import GroupStats
from serving.rollout.kvpool import KvCheck

Basis = Literal["not-updated", "updated", "pre-rollout"]
Decision = Literal["pass", "rollback", "pause"]
BASIS_WORDS: Mapping[Basis, str] = {
    "not-updated": "the replicas not yet updated, same window",
    "updated": "the replicas updated in earlier batches, which passed, same window (none is left on the old version)",
    "pre-rollout": "the fleet's per-replica figures before the rollout (no other replica runs now)",
}


@dataclass(frozen=True)
class Verdict:
    """What the soak decided, on what basis, with every piece of evidence and the replicas it names."""

    decision: Decision
    basis: Basis
    evidence: tuple[str, ...]
    replicas: tuple[str, ...]

    def summary(self) -> str:
        return "; ".join(self.evidence)

    def to_json(self) -> dict[str, Any]:
        return {
            "decision": self.decision,
            "basis": self.basis,
            "evidence": list(self.evidence),
            "replicas": list(self.replicas),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Verdict:
        return cls(data["decision"], data["basis"], tuple(data["evidence"]), tuple(data["replicas"]))


@dataclass(frozen=True)
class Gates:
    """One evaluation: the canary's three gate values (None = not evaluable), the router-wide context, the
    decisive findings (``breaches``), and — for a soak — both groups' figures and the verdict."""

    qps_drop: float | None
    p99_rise: float | None
    error_rate: float
    client_error_rate: float
    upstream_error_rate: float
    retries: float
    breaches: tuple[str, ...]
    canary: GroupStats | None = None
    baseline: GroupStats | None = None
    verdict: Verdict | None = None
    inconclusive: Mapping[str, str] = field(default_factory=dict)  # gate (a key of contract()) → why not judged
    kv_pool: KvCheck | None = None  # the canary's KV pool against the plan (serving.rollout.kvpool)

    @property
    def passed(self) -> bool:
        return not self.breaches

    def summary(self) -> str:
        def pct(v: float | None, digits: int = 1) -> str:
            return "n/a" if v is None else f"{v:+.{digits}%}"

        return (
            f"QPS drop {pct(self.qps_drop)}, P99 rise {pct(self.p99_rise)}, error rate {self.error_rate:.3%} "
            f"(clients {self.client_error_rate:.3%}, {self.retries:.0f} retries)"
        )

    def contract(self) -> dict[str, float | None]:
        """The three values of the ``--json`` contract."""
        return {"qps_drop": self.qps_drop, "p99_rise": self.p99_rise, "error_rate": self.error_rate}

    def to_json(self) -> dict[str, Any]:
        return {
            **self.contract(),
            "client_error_rate": self.client_error_rate,
            "upstream_error_rate": self.upstream_error_rate,
            "retries": self.retries,
            "breaches": list(self.breaches),
            "canary": self.canary.to_json() if self.canary else None,
            "baseline": self.baseline.to_json() if self.baseline else None,
            "verdict": self.verdict.to_json() if self.verdict else None,
            "inconclusive": dict(self.inconclusive),
            "kv_pool": self.kv_pool.to_json() if self.kv_pool is not None else None,
        }

    def inconclusive_json(self) -> dict[str, str | None]:
        """Per gate of :meth:`contract`: why it was not judged, or None when it was."""
        return {gate: self.inconclusive.get(gate) for gate in self.contract()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Gates:
        return cls(
            qps_drop=data["qps_drop"],
            p99_rise=data["p99_rise"],
            error_rate=float(data["error_rate"]),
            client_error_rate=float(data["client_error_rate"]),
            upstream_error_rate=float(data["upstream_error_rate"]),
            retries=float(data["retries"]),
            breaches=tuple(data["breaches"]),
            canary=GroupStats.from_json(data["canary"]) if data.get("canary") else None,
            baseline=GroupStats.from_json(data["baseline"]) if data.get("baseline") else None,
            verdict=Verdict.from_json(data["verdict"]) if data.get("verdict") else None,
            inconclusive=dict(data.get("inconclusive") or {}),
            kv_pool=KvCheck.from_json(data["kv_pool"]) if data.get("kv_pool") else None,
        )


def with_kv_pool(gates: Gates, kv: KvCheck) -> Gates:
    """The soak's verdict with the canary's KV pool checked against the plan. A miss beyond the bound holds the rollout
    (a pass becomes a pause, the check's sentence first; a rollback stays one, the check added); a miss beyond 5 %
    is a warning in the evidence; within it, or not read, the check is a line of context."""
    verdict = gates.verdict
    assert verdict is not None, "the KV pool check follows a soak's verdict"
    if kv.level != "hold":
        return replace(gates, kv_pool=kv, verdict=replace(verdict, evidence=(*verdict.evidence, kv.text)))
    decision: Decision = "rollback" if verdict.decision == "rollback" else "pause"
    evidence = (*verdict.evidence, kv.text) if decision == "rollback" else (kv.text, *verdict.evidence)
    if verdict.decision == "pass":
        evidence = (kv.text, *verdict.evidence[1:])  # not "canary within every gate": this one it is not within
    return replace(
        gates,
        kv_pool=kv,
        breaches=(*gates.breaches, kv.text),
        verdict=replace(verdict, decision=decision, evidence=evidence),
    )
