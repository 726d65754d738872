"""The agent → controller report: one batched message per node per heartbeat interval.

Strict and versioned: unknown fields, wrong types and a schema version other than
:data:`REPORT_SCHEMA_VERSION` are refused. Each report carries the node's name, the node's boot id and a sequence
number read from the node's monotonic clock (it grows within a boot, across agent restarts, whatever the wall clock
does), and the agent's wall-clock send time, so that the controller can refuse a report from a node it does not
know and a replayed or out-of-order one (:class:`Rejection`; every refusal is counted, none is applied). The send
time only measures the node's clock skew: freshness is when the report was sent on the controller's monotonic clock
(the sequence number plus the transit's recent floor, ``Controller._sent``), so a node whose wall clock is off is
shown and alerted on, never refused. Version 2: version 1 ordered reports by the agent's wall-clock start, so an
agent restarted with its clock behind had every report refused. Version 3 adds each replica's time per output token
(the latency-outlier signal); version 4 the token gaps over each stall bound (the stall signal). Versions 2 and 3 are
still taken (an agent not yet upgraded), without the figures they lack.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

REPORT_SCHEMA_VERSION: Literal[4] = 4
MAX_REPLICAS_PER_REPORT = 256


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ReplicaProbe(_Strict):
    """What the agent saw of one replica this interval."""

    id: str = Field(min_length=1, max_length=253, description="Replica id: from the plan, or the pod's name.")
    url: str | None = Field(
        default=None, max_length=300, description="The URL the routers know it by (agents that discover pods)."
    )
    ok: bool = Field(description="The health call answered 200 within serving.health_check_timeout_s.")
    latency_s: float | None = Field(ge=0, description="Health call latency; None when it timed out or failed.")
    error: str | None = Field(default=None, max_length=300, description="Why the probe failed.")
    gpu_utilization: float = Field(default=0.0, ge=0, le=1, description="Share 0–1 (DCGM, or running/max).")
    memory_usage: float = Field(default=0.0, ge=0, le=1, description="Share 0–1 (DCGM FB used, or token usage).")
    network_bandwidth: float = Field(default=0.0, ge=0, le=1, description="Share 0–1 of the link (DCGM), else 0.")
    running: int = Field(default=0, ge=0, description="sglang:num_running_reqs.")
    queued: int = Field(default=0, ge=0, description="sglang:num_queue_reqs.")
    requests_total: float = Field(default=0.0, ge=0, description="sglang:num_requests_total (counter).")
    tpot_seconds_total: float | None = Field(
        default=None,
        ge=0,
        description="sglang:request_time_per_output_token_seconds_sum summed over its series (each finished request's "
        "decode time per output token, cumulative); None before its first such request, or from a version-2 agent.",
    )
    tpot_requests_total: float | None = Field(
        default=None,
        ge=0,
        description="sglang:request_time_per_output_token_seconds_count summed over its series (cumulative).",
    )
    token_gaps_over_s: dict[float, Annotated[float, Field(ge=0)]] | None = Field(
        default=None,
        max_length=16,
        description="Per bound of sglang:inter_token_latency_seconds of a second or more (1, 2, 4, 6, 8 by default): "
        "the tokens that came longer than that after the request's last output, summed over its series "
        "(cumulative; a streamed request's stall shows as one such token per request in flight). None before its "
        "first observation, or from an agent older than version 4.",
    )


class NodeReport(_Strict):
    """One node's heartbeat: every replica of the node, probed once."""

    schema_version: Literal[2, 3, 4] = Field(
        description="Report schema version; the controller takes 2 (no latency figures: an agent not yet upgraded), "
        "3 (a replica's time per output token, the latency-outlier signal) and 4 (its token gaps, the stall signal)."
    )
    node: str = Field(min_length=1, max_length=253, description="Node name from the stack.")
    boot_id: str = Field(
        pattern=r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
        description="The node's boot id (/proc/sys/kernel/random/boot_id): a new one after each reboot.",
    )
    seq: int = Field(ge=0, description="The node's monotonic clock at the report (ns): grows within a boot.")
    sent_at: float = Field(gt=0, description="Agent wall clock at send time (Unix s).")
    replicas: tuple[ReplicaProbe, ...] = Field(max_length=MAX_REPLICAS_PER_REPORT)


class Rejection(StrEnum):
    """Why the controller refused a report (the ``reason`` label of its rejection counter)."""

    MALFORMED = "malformed"
    UNKNOWN_NODE = "unknown_node"
    UNKNOWN_REPLICA = "unknown_replica"
    REPLAYED = "replayed"


class ReportRejected(ValueError):
    def __init__(self, reason: Rejection, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


def parse_report(body: bytes | str) -> NodeReport:
    """Validate a report body; raises :class:`ReportRejected` (``malformed``) naming the first problem."""
    try:
        return NodeReport.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise ReportRejected(Rejection.MALFORMED, f"{where}: {first['msg']}") from None
