"""SGLang 0.5.23's inter-token latency histogram, as the node agents read it and the simulated worker writes it.

The tokenizer observes ``sglang:inter_token_latency_seconds`` each time a request's output reaches it after its first
(``tokenizer_manager.py``, ``collect_metrics``: the interval since the request's last output over the tokens it
brought, once per token; ``metrics_collector.py`` ``observe_inter_token_latency``), under the tokenizer's labels
(no ``is_streaming``). A streamed request gets an output every scheduler step (``--stream-interval`` 1), so a stalled
scheduler shows as one observation of the stall's length per request in flight; a non-streamed one gets an output
every ``SGLANG_FORCE_STREAM_INTERVAL`` (50) tokens (``output_streamer.py``), so a stall there is spread over 50 tokens
and hides. tests/test_sandbox_worker_fidelity.py holds the name, the buckets and the interval against the pinned source.
"""

from __future__ import annotations

from typing import Final

INTER_TOKEN_LATENCY: Final = "sglang:inter_token_latency_seconds"  # noqa: S105 - a metric name, not a secret
# SGLang 0.5.23's default --bucket-inter-token-latency (metrics_collector.py), the buckets of its per-request TPOT
# histogram too; no stack renders the flag
ITL_BUCKETS_S: Final = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100, 0.200, 0.400,
    0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
)  # fmt: skip
# The bounds a stall can be judged at (runtime.stall_gap_s): a token gap of a second or more is no decode step
STALL_BOUNDS_S: Final = tuple(b for b in ITL_BUCKETS_S if b >= 1.0)
FORCE_STREAM_INTERVAL: Final = (
    50  # SGLANG_FORCE_STREAM_INTERVAL's default (environ.py): a non-streamed request's outputs
)


def gaps_over(buckets: tuple[tuple[float, float], ...], count: float) -> dict[float, float]:
    """Observations over each of :data:`STALL_BOUNDS_S`, from a histogram's cumulative ``(le, count)`` buckets and its
    total count; a bound the histogram lacks is left out."""
    cumulative = dict(buckets)
    return {bound: max(0.0, count - cumulative[bound]) for bound in STALL_BOUNDS_S if bound in cumulative}
