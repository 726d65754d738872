"""The plan's health score (source §3.4) and the weighted load (§2.4), as pure functions.

Score: start at ``health.start``, −``timeout_penalty`` per failed heartbeat, +``success_reward`` per good
one, clamped to ``[0, cap]``. Below ``stop_routing_below`` no new requests, below ``migrate_below``
migrate; back in rotation only at ``readmit_at`` or more (hysteresis, see :class:`Rotation`).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from serving.spec.schema import HealthScoreSpec, LoadMetric


def next_score(score: int, ok: bool, spec: HealthScoreSpec) -> int:
    """One heartbeat's effect on a score, clamped to ``[0, spec.cap]``."""
    moved = score + spec.success_reward if ok else score - spec.timeout_penalty
    return max(0, min(spec.cap, moved))


class Band(StrEnum):
    """Where a score lies: serve, no new requests, or migrate."""

    OK = "ok"
    NO_NEW_REQUESTS = "no_new_requests"
    MIGRATE = "migrate"


def band(score: int, spec: HealthScoreSpec) -> Band:
    if score < spec.migrate_below:
        return Band.MIGRATE
    if score < spec.stop_routing_below:
        return Band.NO_NEW_REQUESTS
    return Band.OK


def may_readmit(score: int, spec: HealthScoreSpec) -> bool:
    """Hysteresis: a replica out of rotation comes back only at ``readmit_at`` or more."""
    return score >= spec.readmit_at


def weighted_load(figures: Mapping[LoadMetric, float], weights: Mapping[LoadMetric, float]) -> float:
    """``Σ weight × figure`` (source: 0.5 GPU utilisation + 0.3 memory + 0.2 network), each figure a 0–1 share."""
    return sum(weights.get(name, 0.0) * value for name, value in figures.items())


def above_mean(loads: Mapping[str, float], ratio: float) -> list[str]:
    """Keys whose load exceeds ``ratio`` × the mean load (source §4.3: move load above 1.5 × the mean),
    most loaded first; none while the mean is 0."""
    if not loads:
        return []
    mean = sum(loads.values()) / len(loads)
    if mean <= 0:
        return []
    return sorted((k for k, v in loads.items() if v > ratio * mean), key=lambda k: -loads[k])
