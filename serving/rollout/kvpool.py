"""The canary checks the plan: the KV pool each canary replica really allocated against the planner's figure — pure.

SGLang sizes its KV pool at start-up and exports it once, with what went into it (``emit_constants`` in the pinned
``sglang/srt/observability/metrics_collector.py``, called from ``Scheduler.emit_metrics_constants`` in
``sglang/srt/managers/scheduler.py``; every gauge carries the collector's labels, one series per scheduler):

* ``sglang:max_total_num_tokens`` — the pool in tokens, the figure the plan calls ``kv_pool_tokens_per_replica``
  (SGLang keeps the minimum over TP and PP ranks, so each rank's series shows the replica's count);
* ``sglang:weight_memory_usage_gb`` — ``ModelRunner.weight_load_mem_usage``: free memory before the weights
  loaded minus after (GiB: ``get_available_gpu_memory`` divides by 1 << 30), the weights *and* the load overhead;
* ``sglang:kv_cache_memory_usage_gb`` — the pool's own bytes (``KVCache.mem_usage``, GiB).

A miss over :data:`WARN_MISS` warns; over ``rollout.max_kv_pool_miss`` the soak holds the rollout (a pause, never a
rollback: the release may be fine and the plan wrong) and names the planner input likely wrong. The pool is
``free at start × mem_fraction_static − weights`` (per GPU) divided by the KV bytes per token; the miss in tokens
splits exactly into the three inputs the canary lets us tell apart (:func:`attribute`):

* **KV bytes per token** (architecture, KV dtype): the canary's pool bytes over its tokens against the plan's;
* **weights bytes** (checkpoint dtypes, quantisation scales): its measured weight load against the planned one;
* **start-up overhead** (free memory at start: CUDA context, NCCL communicators): the rest. ``mem_fraction_static``
  is no suspect: the fleet renders it as ``--mem-fraction-static`` and SGLang uses the value as given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # a type only: loading a stack (serving.spec.stack → serving.rollout.plan → here) must not import
    # the HTTP clients (aiohttp and httpx: 0.27 s of every exaserve command's start)
    from serving.router.client import MetricsSnapshot

KV_POOL_TOKENS = "sglang:max_total_num_tokens"
WEIGHT_MEMORY_GB = "sglang:weight_memory_usage_gb"
KV_CACHE_MEMORY_GB = "sglang:kv_cache_memory_usage_gb"
KV_POOL_METRICS = (KV_POOL_TOKENS, WEIGHT_MEMORY_GB, KV_CACHE_MEMORY_GB)
GIB = 1 << 30  # SGLang's "GB" (get_available_gpu_memory: bytes / (1 << 30))
WARN_MISS = 0.05  # the planner's own accuracy bar (docs/planner.md): beyond it the rollout warns

Level = Literal["ok", "warn", "hold", "unread"]
Input = Literal["kv_bytes_per_token", "weights", "startup_overhead"]
INPUT_WORDS: Mapping[Input, str] = {
    "kv_bytes_per_token": "KV bytes per token (model.architecture, model.kv_cache_dtype)",
    "weights": "weights bytes per GPU (the checkpoint's dtypes and quantisation scales)",
    "startup_overhead": "start-up overhead (free memory at start: CUDA context, NCCL communicators)",
}


@dataclass(frozen=True)
class KvPlan:
    """The planner's pool of one replica and the inputs it came from (per GPU of the stage SGLang counts), and the
    bound beyond which a canary's miss holds the rollout (``rollout.max_kv_pool_miss``)."""

    tokens: int
    kv_bytes_per_token: float
    weights_bytes: float  # weights and load overhead: what SGLang's weight_load_mem_usage measures
    free_at_start_bytes: float
    mem_fraction_static: float
    max_miss: float

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KvPlan:
        return cls(
            tokens=int(data["tokens"]),
            kv_bytes_per_token=float(data["kv_bytes_per_token"]),
            weights_bytes=float(data["weights_bytes"]),
            free_at_start_bytes=float(data["free_at_start_bytes"]),
            mem_fraction_static=float(data["mem_fraction_static"]),
            max_miss=float(data["max_miss"]),
        )


@dataclass(frozen=True)
class KvReading:
    """What one replica exported: its pool in tokens and, when it exports them, its weight load and pool in bytes."""

    tokens: int
    weights_bytes: float | None = None
    pool_bytes: float | None = None

    @classmethod
    def read(cls, snap: MetricsSnapshot) -> KvReading | None:
        """The replica's figures from its ``/metrics``; None when it exports no ``sglang:max_total_num_tokens``. Of
        several series (one per scheduler) the smallest pool counts, as SGLang's own minimum over ranks does."""
        tokens = [s.value for s in snap.select(KV_POOL_TOKENS)]
        if not tokens:
            return None

        def gib(name: str) -> float | None:
            values = [s.value for s in snap.select(name)]
            return max(values) * GIB if values else None

        return cls(int(min(tokens)), gib(WEIGHT_MEMORY_GB), gib(KV_CACHE_MEMORY_GB))


def attribute(plan: KvPlan, got: KvReading) -> dict[Input, float] | None:
    """The miss in tokens (``got.tokens − plan.tokens``) split over the inputs, exactly (the three terms sum to it);
    None when the replica exports no weight load, so weights and start-up overhead cannot be told apart."""
    if got.weights_bytes is None:
        return None
    cell = got.pool_bytes / got.tokens if got.pool_bytes and got.tokens else plan.kv_bytes_per_token
    planned_pool = plan.tokens * plan.kv_bytes_per_token
    pool = got.tokens * cell
    weights = got.weights_bytes - plan.weights_bytes  # more weight, less pool
    return {
        "kv_bytes_per_token": planned_pool / cell - plan.tokens,
        "weights": -weights / cell,
        "startup_overhead": (pool - planned_pool + weights) / cell,
    }


@dataclass(frozen=True)
class KvCheck:
    """The canary's pool against the plan: both figures, the miss (``(canary − planned) / planned`` of the canary
    replica furthest off), the level, the input likely wrong (None: within :data:`WARN_MISS`, or not attributable)
    and the sentence the verdict shows."""

    planned_tokens: int
    canary_tokens: Mapping[str, int]
    miss: float | None
    level: Level
    suspect: Input | None
    text: str

    def to_json(self) -> dict[str, Any]:
        return {
            "planned_tokens": self.planned_tokens,
            "canary_tokens": dict(self.canary_tokens),
            "miss": self.miss,
            "level": self.level,
            "suspect": self.suspect,
            "text": self.text,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KvCheck:
        return cls(
            planned_tokens=int(data["planned_tokens"]),
            canary_tokens={str(k): int(v) for k, v in data["canary_tokens"].items()},
            miss=None if data["miss"] is None else float(data["miss"]),
            level=data["level"],
            suspect=data["suspect"],
            text=str(data["text"]),
        )


def check(plan: KvPlan, readings: Mapping[str, KvReading | None]) -> KvCheck:
    """Judge the canary replicas' pools (``readings``: None for one that exports no pool) against the plan."""
    got = {r: k for r, k in readings.items() if k is not None}
    tokens = {r: k.tokens for r, k in got.items()}
    if not got or plan.tokens <= 0:
        missing = ", ".join(sorted(r for r, k in readings.items() if k is None)) or "none"
        why = "the plan has no pool" if plan.tokens <= 0 else f"no canary replica exports {KV_POOL_TOKENS} ({missing})"
        return KvCheck(plan.tokens, tokens, None, "unread", None, f"KV pool not checked against the plan: {why}")
    worst = max(got, key=lambda r: abs(got[r].tokens - plan.tokens))
    miss = (got[worst].tokens - plan.tokens) / plan.tokens
    figures = (
        f"canary {worst}'s KV pool {got[worst].tokens:,} tokens against the plan's {plan.tokens:,} "
        f"(kv_pool_tokens_per_replica), {miss:+.1%}"
    )
    if abs(miss) <= WARN_MISS:
        return KvCheck(plan.tokens, tokens, miss, "ok", None, f"{figures}: within {WARN_MISS:.0%}")
    level: Level = "hold" if abs(miss) > plan.max_miss else "warn"
    split = attribute(plan, got[worst])
    if split is None:
        suspect = None
        blame = (
            f"the {INPUT_WORDS['weights']} or the {INPUT_WORDS['startup_overhead']} is likely wrong; the canary exports "
            f"no {WEIGHT_MEMORY_GB} to tell them apart"
        )
    else:
        suspect = max(split, key=lambda i: abs(split[i]))
        others = ", ".join(f"{i} {split[i]:+,.0f}" for i in split if i != suspect)
        blame = (
            f"the planner input likely wrong: {INPUT_WORDS[suspect]}, {split[suspect]:+,.0f} tokens of the miss "
            f"(the others: {others}){_detail(plan, got[worst], suspect)}"
        )
    if level == "hold":
        head = (
            f"KV pool off the plan beyond rollout.max_kv_pool_miss {plan.max_miss:.0%}, the rollout is held: {figures}; "
            f"{blame}. Correct that input in the stack (`exaserve plan` shows each), then `exaserve rollback` and roll out "
            "again: a resume checks the journal's plan and holds again"
        )
    else:
        head = f"KV pool off the plan by more than {WARN_MISS:.0%}: {figures}; {blame}"
    return KvCheck(plan.tokens, tokens, miss, level, suspect, head)


def _detail(plan: KvPlan, got: KvReading, suspect: Input) -> str:
    """The suspect input's planned value against what the canary implies."""
    if suspect == "weights" and got.weights_bytes is not None:
        return f"; weights {got.weights_bytes / GIB:.2f} GiB per GPU loaded, {plan.weights_bytes / GIB:.2f} GiB planned"
    if suspect == "kv_bytes_per_token" and got.pool_bytes and got.tokens:
        return f"; {got.pool_bytes / got.tokens:,.0f} B per token per GPU, {plan.kv_bytes_per_token:,.0f} B planned"
    if suspect == "startup_overhead" and got.weights_bytes is not None:
        pool = got.pool_bytes if got.pool_bytes else got.tokens * plan.kv_bytes_per_token
        free = (pool + got.weights_bytes) / plan.mem_fraction_static
        return (
            f"; the canary implies {free / GIB:.2f} GiB free at start per GPU, "
            f"{plan.free_at_start_bytes / GIB:.2f} GiB planned"
        )
    return ""
