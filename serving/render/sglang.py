"""The SGLang server: its command line and environment, from the spec and the plan.

Every spec → flag decision lives in :data:`SERVER_FLAGS` and :data:`SERVER_ENV`; every command line leaves
this module checked against the pinned parser's flag manifest (:mod:`serving.flags`), so a flag the
pinned SGLang does not know fails at render time, naming the flag and the version. The systemd unit
(:mod:`serving.render.systemd`) and the pod container (:mod:`serving.render.k8s.container`) wrap the same
command. See ``docs/units.md`` for the mapping table.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from serving.flags import FlagManifest, load_server_manifest
from serving.plan.model import Fleet, MemoryPlan, Replica
from serving.render.common import (
    FlagRule,
    RenderError,
    check_entry,
    checked_memory,
    duration_buckets,
    rdma,
    render_flags,
    whole_seconds,
)
from serving.sglang_health import (
    HEALTH_ENDPOINT_GENERATION,
    HEALTH_PATH,
    SCHEDULER_HEALTH_PATH,
    server_health_timeout_s,
)
from serving.spec.schema import FabricKind, FleetSpec, Precision, SpeculativeSpec

# `sglang serve` is the entry point SGLang 0.5.23 documents (`python -m sglang.launch_server` warns
# that it is only "still supported"). The serving image and the bare-metal install both provide the
# console script at this path; systemd needs an absolute path to check that the binary exists.
SERVER_ENTRY: Final = ("/usr/local/bin/sglang", "serve")


# torch.distributed rendezvous port on a multi-node replica's first node (`--dist-init-addr`).
DIST_INIT_PORT: Final = 20000


# Paths shared by the systemd unit and the pod, so the command is the same in both.
SERVICE_USER: Final = "exaserve"


SERVICE_HOME: Final = "/var/lib/exaserve-sglang"  # JIT caches (triton, flashinfer) live under $HOME


@dataclass(frozen=True)
class ServerContext:
    """Everything the server tables read: the spec, its memory plan and the per-process values.

    For a pod, ``node_rank``/``dist_init_host`` are Kubernetes ``$(VAR)`` references to the
    LeaderWorkerSet environment, expanded by the kubelet when the container starts.
    """

    spec: FleetSpec
    memory: MemoryPlan
    host: str
    port: int
    nnodes: int
    node_rank: str
    dist_init_host: str
    gpu_ids: tuple[int, ...]
    replica_id: str
    release: str


@dataclass(frozen=True)
class EnvRule:
    """One environment variable; ``pod_field`` replaces the value in pods with a downward-API field,
    ``host_only`` leaves it out of pods (the GPU device plugin sets the visible devices there)."""

    name: str
    source: str
    value: Callable[[ServerContext], str | None]
    pod_field: str | None = None
    host_only: bool = False


def model_dir(spec: FleetSpec, root: str | None = None, path: str | None = None) -> str:
    """The model's directory (``path``: another model's, as a speculative draft's) under ``root`` (default: the
    node-local cache, the same path inside pods: a read-only hostPath). The one join of a root and ``model.path``:
    slashes at either end are dropped."""
    base = spec.storage.local_cache.path if root is None else root
    return f"{base.rstrip('/')}/{(spec.model.path if path is None else path).strip('/')}"


_DTYPE: Final[Mapping[Precision, str]] = {Precision.FP16: "float16", Precision.BF16: "bfloat16"}
# --quantization awq forces SGLang's slow AWQ kernel (it logs that awq_marlin would run); the checkpoint is the same.
# --quantization gptq is no method on CUDA at all in 0.5.23 ("gptq" is registered for NPU, CPU and XPU only,
# layers/quantization/__init__.py:110, :126, :134; on CUDA ModelConfig refuses it as unknown): gptq_marlin (:79) is
# the kernel a GPTQ checkpoint runs on there.
_KERNEL = {"awq": "awq_marlin", "gptq": "gptq_marlin"}


def _fraction(value: float) -> str:
    """Three decimals, rounded down: the planner's budget is a ceiling, never exceed it."""
    return f"{math.floor(value * 1000) / 1000:.3f}"


def _speculative(c: ServerContext, value: Callable[[SpeculativeSpec], str | None]) -> str | None:
    """A speculative-decoding flag's value; none without ``model.speculative``."""
    spec = c.spec.model.speculative
    return None if spec is None else value(spec)


def _running_requests(c: ServerContext) -> str:
    return str(min(c.spec.limits.max_running_requests, int(c.memory.max_concurrent_sequences.value)))


SERVER_FLAGS: Final[tuple[FlagRule[ServerContext], ...]] = (
    FlagRule("--model-path", "storage.local_cache.path + model.path", lambda c: model_dir(c.spec)),
    FlagRule("--served-model-name", "model.name", lambda c: c.spec.model.name),
    FlagRule(
        "--dtype",
        "model.precision (fp16 → float16, bf16 → bfloat16; quantised: SGLang's auto)",
        lambda c: _DTYPE.get(c.spec.model.precision),
    ),
    FlagRule(
        "--quantization",
        "model.quantization (when set; awq → awq_marlin, the kernel SGLang itself recommends over its slow AWQ one)",
        lambda c: _KERNEL.get(c.spec.model.quantization or "", c.spec.model.quantization),
    ),
    FlagRule("--kv-cache-dtype", "model.kv_cache_dtype", lambda c: c.spec.model.kv_cache_dtype),
    FlagRule("--host", "node address (bare metal); 0.0.0.0 in a pod", lambda c: c.host),
    FlagRule("--port", "serving.port + slot on the node (bare metal); serving.port in a pod", lambda c: str(c.port)),
    FlagRule("--tp-size", "parallelism.tp", lambda c: str(c.spec.parallelism.tp)),
    FlagRule("--pp-size", "parallelism.pp", lambda c: str(c.spec.parallelism.pp)),
    FlagRule("--dp-size", "parallelism.dp", lambda c: str(c.spec.parallelism.dp)),
    FlagRule(
        "--attn-dp-size",
        "parallelism.attn_dp, when > 1 (replaces the deprecated --enable-dp-attention, SGLang server_args.py:419)",
        lambda c: str(c.spec.parallelism.attn_dp) if c.spec.parallelism.attn_dp > 1 else None,
    ),
    FlagRule(
        "--ep-size",
        "parallelism.ep, when > 1 (a MoE model's experts spread whole over the TP group)",
        lambda c: str(c.spec.parallelism.ep) if c.spec.parallelism.ep > 1 else None,
    ),
    FlagRule(
        "--nnodes",
        "planner placement: nodes per replica (only when a replica spans nodes)",
        lambda c: str(c.nnodes) if c.nnodes > 1 else None,
    ),
    FlagRule(
        "--node-rank",
        "the node's position in the replica; $(LWS_WORKER_INDEX) in a pod",
        lambda c: c.node_rank if c.nnodes > 1 else None,
    ),
    FlagRule(
        "--dist-init-addr",
        f"the replica's first node: ADDRESS:{DIST_INIT_PORT}; $(LWS_LEADER_ADDRESS) in a pod",
        lambda c: f"{c.dist_init_host}:{DIST_INIT_PORT}" if c.nnodes > 1 else None,
    ),
    FlagRule(
        "--speculative-algorithm",
        "model.speculative.algorithm (NEXTN: the checkpoint's MTP layers)",
        lambda c: _speculative(c, lambda s: s.algorithm),
    ),
    FlagRule(
        "--speculative-draft-model-path",
        "storage.local_cache.path + model.speculative.draft_path (EAGLE/EAGLE3)",
        lambda c: _speculative(c, lambda s: s.draft_path and model_dir(c.spec, path=s.draft_path)),
    ),
    FlagRule(
        "--speculative-num-steps", "model.speculative.num_steps", lambda c: _speculative(c, lambda s: str(s.num_steps))
    ),
    FlagRule(
        "--speculative-eagle-topk",
        "model.speculative.eagle_topk",
        lambda c: _speculative(c, lambda s: str(s.eagle_topk)),
    ),
    FlagRule(
        "--speculative-num-draft-tokens",
        "model.speculative.num_draft_tokens (num_steps + 1 with eagle_topk 1, as SGLang resets it)",
        lambda c: _speculative(c, lambda s: str(s.draft_tokens)),
    ),
    FlagRule("--context-length", "limits.context_length", lambda c: str(c.spec.limits.context_length)),
    FlagRule(
        "--max-running-requests",
        "min(limits.max_running_requests, planner max_concurrent_sequences)",
        _running_requests,
    ),
    FlagRule(
        "--max-total-tokens",
        "planner memory_plan.max_total_tokens, only under --memory-model source (SGLang sizes its own pool "
        "from --mem-fraction-static under the default model)",
        lambda c: str(int(c.memory.max_total_tokens.value)) if c.memory.model == "source" else None,
    ),
    FlagRule(
        "--mem-fraction-static",
        "serving.mem_fraction_static, else SGLang's default for the GPU, TP and PP (planner; 3 decimals, rounded down)",
        lambda c: _fraction(c.memory.mem_fraction_static.value),
    ),
    FlagRule(
        "--chunked-prefill-size", "limits.chunked_prefill_size", lambda c: str(c.spec.limits.chunked_prefill_size)
    ),
    FlagRule("--enable-metrics", "always (Prometheus /metrics on the server port)", lambda c: True),
    FlagRule(
        "--bucket-e2e-request-latency",
        "the router's latency buckets (ratio 1 + rollout.max_p99_rise / 3): the canary gate's per-replica P99",
        lambda c: tuple(f"{b:g}" for b in duration_buckets(c.spec)),
    ),
    FlagRule("--log-level", "serving.log_level", lambda c: c.spec.serving.log_level.value),
    FlagRule("--watchdog-timeout", "serving.watchdog_timeout_s", lambda c: f"{c.spec.serving.watchdog_timeout_s:g}"),
)


SERVER_ENV: Final[tuple[EnvRule, ...]] = (
    EnvRule(
        "CUDA_VISIBLE_DEVICES",
        "the replica's gpu_ids (bare metal; the device plugin sets them in pods)",
        lambda c: ",".join(str(i) for i in c.gpu_ids),
        host_only=True,
    ),
    EnvRule("NCCL_SOCKET_IFNAME", "cluster.fabric.socket_ifname", lambda c: c.spec.cluster.fabric.socket_ifname),
    EnvRule(
        "GLOO_SOCKET_IFNAME",
        "cluster.fabric.socket_ifname (SGLang's CPU process groups)",
        lambda c: c.spec.cluster.fabric.socket_ifname,
    ),
    EnvRule("NCCL_IB_DISABLE", "cluster.fabric.kind = ethernet → 1", lambda c: None if rdma(c.spec) else "1"),
    EnvRule(
        "NCCL_IB_HCA",
        "cluster.fabric.hcas, exact match ('=' prefix), infiniband/roce only",
        lambda c: "=" + ",".join(c.spec.cluster.fabric.hcas) if rdma(c.spec) else None,
    ),
    EnvRule(
        "NCCL_IB_GID_INDEX",
        "cluster.fabric.nccl_ib_gid_index (roce only, when set)",
        lambda c: (
            str(c.spec.cluster.fabric.nccl_ib_gid_index)
            if c.spec.cluster.fabric.kind is FabricKind.ROCE and c.spec.cluster.fabric.nccl_ib_gid_index is not None
            else None
        ),
    ),
    EnvRule("HF_HUB_OFFLINE", "always 1: weights come from the node-local cache, never a model hub", lambda c: "1"),
    EnvRule(
        "SGLANG_HEALTH_CHECK_TIMEOUT",
        "serving.health_check_timeout_s in whole seconds, less SGLang's 1 s poll (SGLang answers 503 within the callers' timeout)",
        lambda c: str(server_health_timeout_s(whole_seconds(c.spec.serving.health_check_timeout_s))),
    ),
    EnvRule(
        "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION",
        f"always false: {HEALTH_PATH} answers without a generation (the routers' check); {SCHEDULER_HEALTH_PATH} "
        "still generates (the agents' and the probes')",
        lambda c: str(HEALTH_ENDPOINT_GENERATION).lower(),
    ),
    EnvRule("PYTHONUNBUFFERED", "always 1: log lines reach journald / the pod log at once", lambda c: "1"),
    EnvRule("HOME", f"{SERVICE_HOME}: writable JIT caches (StateDirectory / an emptyDir)", lambda c: SERVICE_HOME),
    EnvRule("EXASERVE_REPLICA", "replica id; the pod name in a pod", lambda c: c.replica_id, pod_field="metadata.name"),
    EnvRule(
        "EXASERVE_RELEASE",
        "the replica's update group version (rollout.group_versions or serving.version)",
        lambda c: c.release,
    ),
)


def _replica_context(fleet: Fleet, replica: Replica, node_rank: int) -> ServerContext:
    nnodes = len(replica.nodes)
    if not 0 <= node_rank < nnodes:
        raise RenderError(
            f"node_rank={node_rank} is outside replica {replica.id}, which spans {nnodes} node(s); use 0..{nnodes - 1}"
        )
    return ServerContext(
        spec=fleet.spec,
        memory=checked_memory(fleet),
        host=str(replica.nodes[node_rank].address),
        port=replica.port,
        nnodes=nnodes,
        node_rank=str(node_rank),
        dist_init_host=str(replica.nodes[0].address),
        gpu_ids=replica.gpu_ids,
        replica_id=replica.id if nnodes == 1 else f"{replica.id}-rank{node_rank}",
        release=fleet.spec.group_version(replica.group),
    )


def check_server_argv(argv: Sequence[str], manifest: FlagManifest | None = None) -> None:
    """Raise FlagValidationError when the pinned SGLang parser (or ``manifest``) would not take ``argv``."""
    check_entry(argv, SERVER_ENTRY, manifest or load_server_manifest())


def server_argv(fleet: Fleet, replica: Replica, node_rank: int = 0) -> list[str]:
    """The full command line of one SGLang server process (entry point first), checked against the pin."""
    argv = [*SERVER_ENTRY, *render_flags(SERVER_FLAGS, _replica_context(fleet, replica, node_rank))]
    check_server_argv(argv)
    return argv


def server_env(fleet: Fleet, replica: Replica, node_rank: int = 0) -> dict[str, str]:
    """The environment of one SGLang server process on bare metal."""
    ctx = _replica_context(fleet, replica, node_rank)
    return {rule.name: v for rule in SERVER_ENV if (v := rule.value(ctx)) is not None}
