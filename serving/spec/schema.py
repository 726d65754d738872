"""The typed fleet spec: one pydantic tree that every other part of ExaServe deploy reads.

Defaults are the source plan's values (see ``docs/source-plan.md`` and MISSION.md); a stack file
(``Pulumi.<stack>.yaml``, ``exaserve:`` namespace) overrides them. Single-field rules live in the
fields' bounds and ``field_validator``s; rules that need arithmetic across sections (placement,
memory, heartbeats, recovery) live in :mod:`serving.checks.rules`, so that a spec which is well-formed but
infeasible still loads and the plan can show *why* it is infeasible.
"""

from __future__ import annotations

import ipaddress
import json
import re
import string
from collections import Counter
from collections.abc import Sequence
from enum import StrEnum
from functools import cached_property
from itertools import pairwise
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

GIB = 1024**3
GB = 10**9


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------------------------- cluster


class FabricKind(StrEnum):
    INFINIBAND = "infiniband"
    ROCE = "roce"
    ETHERNET = "ethernet"


_PATTERN_FIELDS = {"index": 0, "rack": 0, "slot": 0, "pool": "gpu"}


def _check_pattern(value: str, allowed: set[str]) -> str:
    fields = {f for _, f, _, _ in string.Formatter().parse(value) if f}
    unknown = fields - allowed
    if unknown:
        raise ValueError(
            f"unknown placeholder(s) {sorted(unknown)} in {value!r}; allowed: "
            + ", ".join("{" + a + "}" for a in sorted(allowed))
        )
    try:
        value.format(**{k: v for k, v in _PATTERN_FIELDS.items() if k in allowed})
    except (ValueError, IndexError) as exc:
        raise ValueError(f"{value!r} is not a valid format pattern: {exc}") from exc
    return value


class Pool(_Model):
    """A compact group of identical nodes; expanded into :class:`Node` records by the spec."""

    name: str = Field(pattern=r"^[a-z][a-z0-9-]{0,30}$", description="Pool name, used as a node label.")
    count: int = Field(gt=0, le=100_000, description="Number of nodes in the pool.")
    name_pattern: str = Field(
        default="{pool}-r{rack:02d}-n{slot:02d}",
        description="Node hostname pattern; placeholders {pool}, {index} (0-based in pool), "
        "{rack} (0-based rack number) and {slot} (0-based position in the rack).",
    )
    subnet: ipaddress.IPv4Network = Field(description="Management subnet of the pool's nodes.")
    first_address: ipaddress.IPv4Address = Field(
        description="Address of the pool's first node; later nodes take the following addresses."
    )
    racks: int = Field(default=1, gt=0, description="Racks the pool is spread over, filled in order.")
    first_rack: int = Field(default=0, ge=0, description="Number of the pool's first rack.")
    rack_pattern: str = Field(default="rack-{rack:02d}", description="Rack label pattern ({rack}).")
    leaf_pattern: str = Field(
        default="leaf-{rack:02d}", description="Leaf (top-of-rack) switch label pattern ({rack})."
    )
    ssh_user: str = Field(default="root", description="SSH user for Ansible and the fan-out.")
    ssh_port: int = Field(default=22, gt=0, lt=65536, description="SSH port of the pool's nodes.")

    @field_validator("name_pattern")
    @classmethod
    def _name_pattern(cls, v: str) -> str:
        """Hostnames are rendered from the pattern; reject unknown placeholders early."""
        return _check_pattern(v, {"pool", "index", "rack", "slot"})

    @field_validator("rack_pattern", "leaf_pattern")
    @classmethod
    def _rack_pattern(cls, v: str) -> str:
        """Rack and leaf labels may only use the rack number."""
        return _check_pattern(v, {"rack"})

    @model_validator(mode="after")
    def _addresses_fit(self) -> Self:
        """Every node's address must lie inside the pool's subnet (expansion is contiguous)."""
        if self.first_address not in self.subnet:
            raise ValueError(
                f"first_address {self.first_address} is outside subnet {self.subnet}; "
                "choose an address inside the subnet"
            )
        last = ipaddress.IPv4Address(int(self.first_address) + self.count - 1)
        if last not in self.subnet or last == self.subnet.broadcast_address:
            raise ValueError(
                f"{self.count} nodes from {self.first_address} end at {last}, outside usable subnet "
                f"{self.subnet}; widen the subnet or lower count"
            )
        if self.racks > self.count:
            raise ValueError(f"racks={self.racks} exceeds count={self.count}; every rack needs a node")
        return self

    @property
    def nodes_per_rack(self) -> int:
        return -(-self.count // self.racks)


class SystemPool(Pool):
    """The untainted nodes without GPUs that run the routers and the controllers (every GPU node carries the
    GPU taint, which they do not tolerate). Its nodes are labelled ``exaserve.io/pool: <name>`` like the GPU pools'
    and selected by that label; ``exaserve plan`` (rule ``cluster.system-pool``) derives its smallest size."""

    name: str = Field(
        default="system", pattern=r"^[a-z][a-z0-9-]{0,30}$", description="Pool name, the nodes' exaserve.io/pool label."
    )
    cpu: float = Field(
        gt=0,
        description="CPUs per node left for this stack's pods: the node's allocatable CPU less what the cluster's "
        "own DaemonSets (CNI, kube-proxy, log shipper) request there.",
    )
    memory_gb: float = Field(
        gt=0, description="Memory per node left for this stack's pods (allocatable less the DaemonSets'), in GB."
    )


class Node(_Model):
    """One expanded node of the inventory."""

    name: str
    address: ipaddress.IPv4Address
    pool: str
    rack: str
    leaf: str
    index: int
    ssh_user: str
    ssh_port: int


class GpuSpec(_Model):
    product: str = Field(default="NVIDIA-A100-SXM4-80GB", description="GPU product label (nvidia.com/gpu.product).")
    memory_gb: float = Field(
        default=80.0, gt=0, description="Memory per GPU in GB (10^9 bytes), as nvidia-smi sells it."
    )
    count_per_node: int = Field(default=8, gt=0, le=64, description="GPUs per node.")
    usable_memory_fraction: float = Field(
        default=0.85, gt=0, le=1, description="Share of GPU memory the plan may budget (source: 85 %)."
    )
    power_kw_per_node: float = Field(default=3.0, gt=0, description="Node power draw in kW (source: 3 kW).")


class FabricSpec(_Model):
    kind: FabricKind = Field(default=FabricKind.INFINIBAND, description="Inter-node fabric.")
    link_rate_gbps: int = Field(default=400, gt=0, description="Per-port link rate, Gb/s (ibstat 'Rate').")
    hcas: list[str] = Field(
        default_factory=lambda: [f"mlx5_{i}" for i in range(8)],
        description="RDMA devices (HCAs) per node, as ibstat names them.",
    )
    max_allreduce_latency_us: float = Field(
        default=30.0, gt=0, description="All-reduce latency above which inference slows (source: tens of µs)."
    )
    secondary_network: bool = Field(default=False, description="Attach a Multus secondary network for RDMA traffic.")
    nccl_ib_gid_index: int | None = Field(default=None, ge=0, description="NCCL_IB_GID_INDEX (RoCE).")
    socket_ifname: str = Field(default="eth0", description="NCCL/Gloo bootstrap interface.")

    @model_validator(mode="after")
    def _hca_for_rdma(self) -> Self:
        """RDMA fabrics need at least one HCA to check and to expose to pods."""
        if self.kind is not FabricKind.ETHERNET and not self.hcas:
            raise ValueError(f"fabric kind {self.kind.value} needs at least one HCA in cluster.fabric.hcas")
        return self


class HostRequirements(_Model):
    os_id: str = Field(default="ubuntu", description="/etc/os-release ID.")
    os_version: str = Field(default="22.04", description="/etc/os-release VERSION_ID.")
    min_kernel: str = Field(default="5.15", pattern=r"^\d+\.\d+(\.\d+)?$", description="Minimum kernel.")
    min_driver: str = Field(default="535.54", pattern=r"^\d+\.\d+(\.\d+)?$", description="Minimum NVIDIA driver.")
    min_cuda: str = Field(default="12.1", pattern=r"^\d+\.\d+$", description="Minimum CUDA version.")
    cgroup_v2: bool = Field(default=True, description="Require the unified cgroup v2 hierarchy.")
    container_runtime: Literal["containerd", "docker"] = Field(default="containerd")
    min_free_disk_gb: float = Field(default=500.0, gt=0, description="Free disk for the local model cache.")


class NtpSpec(_Model):
    servers: list[str] = Field(
        default_factory=lambda: ["ntp-0.exaserve.internal", "ntp-1.exaserve.internal"],
        min_length=1,
        description="NTP servers every node syncs with.",
    )
    max_offset_ms: float = Field(default=100.0, gt=0, description="Largest tolerated clock offset (source: 100 ms).")


class CostSpec(_Model):
    currency: str = Field(default="CNY", description="Currency of every figure in this section.")
    node_price_low: float = Field(default=150_000, gt=0, description="Price of one GPU node, low estimate.")
    node_price_high: float = Field(default=200_000, gt=0, description="Price of one GPU node, high estimate.")
    network_share_low: float = Field(default=0.15, ge=0, lt=1, description="Network's share of total hardware.")
    network_share_high: float = Field(default=0.20, ge=0, lt=1)
    electricity_per_kwh_low: float = Field(default=0.72, gt=0, description="Industrial tariff per kWh, low.")
    electricity_per_kwh_high: float = Field(default=0.90, gt=0)
    operators_low: int = Field(default=3, ge=0)
    operators_high: int = Field(default=5, ge=0)
    annual_node_failure_rate: float = Field(default=0.05, ge=0, le=1, description="Source: 5 % a year.")

    @model_validator(mode="after")
    def _ranges(self) -> Self:
        """Each low/high pair must be ordered."""
        for name in ("node_price", "network_share", "electricity_per_kwh", "operators"):
            lo, hi = getattr(self, f"{name}_low"), getattr(self, f"{name}_high")
            if lo > hi:
                raise ValueError(f"{name}_low={lo} is above {name}_high={hi}; swap them")
        return self


def _expand(pools: Sequence[Pool]) -> tuple[Node, ...]:
    out: list[Node] = []
    for pool in pools:
        per_rack = pool.nodes_per_rack
        for i in range(pool.count):
            rack_no = pool.first_rack + i // per_rack
            out.append(
                Node(
                    name=pool.name_pattern.format(pool=pool.name, index=i, rack=rack_no, slot=i % per_rack),
                    address=ipaddress.IPv4Address(int(pool.first_address) + i),
                    pool=pool.name,
                    rack=pool.rack_pattern.format(rack=rack_no),
                    leaf=pool.leaf_pattern.format(rack=rack_no),
                    index=i,
                    ssh_user=pool.ssh_user,
                    ssh_port=pool.ssh_port,
                )
            )
    return tuple(out)


class ClusterSpec(_Model):
    name: str = Field(default="exaserve", pattern=r"^[a-z][a-z0-9-]{0,40}$")
    pools: list[Pool] = Field(min_length=1, description="GPU node pools; expanded into the node inventory.")
    system_pool: SystemPool | None = Field(
        default=None,
        description="The non-GPU pool the routers and controllers run on (Kubernetes); required by the policy pack "
        "(guard system-pool-placement).",
    )
    gpu: GpuSpec = Field(default_factory=GpuSpec)
    fabric: FabricSpec = Field(default_factory=FabricSpec)
    host: HostRequirements = Field(default_factory=HostRequirements)
    ntp: NtpSpec = Field(default_factory=NtpSpec)
    cost: CostSpec = Field(default_factory=CostSpec)

    @model_validator(mode="after")
    def _unique_pools(self) -> Self:
        """Pool names and node names are identities: they must be unique, addresses must not overlap."""
        every = [*self.pools, *([self.system_pool] if self.system_pool else [])]
        names = [p.name for p in every]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate pool name(s) {dupes}; give each pool its own name")
        spans = sorted((int(p.first_address), int(p.first_address) + p.count - 1, p.name) for p in every)
        for (_, end_a, a), (start_b, _, b) in pairwise(spans):
            if start_b <= end_a:
                raise ValueError(f"address ranges of pools {a!r} and {b!r} overlap; move one pool's first_address")
        dupes = sorted(n for n, c in Counter(n.name for n in _expand(every)).items() if c > 1)
        if dupes:
            raise ValueError(
                f"node name(s) {dupes[:3]} are generated more than once; make each pool's name_pattern "
                "unique, e.g. include {pool} and {index} or {rack} and {slot}"
            )
        return self

    @cached_property
    def nodes(self) -> tuple[Node, ...]:
        """The expanded inventory, in pool order (validated unique when the spec loads)."""
        return _expand(self.pools)

    @cached_property
    def system_nodes(self) -> tuple[Node, ...]:
        """The system pool's nodes (none when the stack declares no pool)."""
        return _expand([self.system_pool]) if self.system_pool else ()

    @property
    def node_count(self) -> int:
        return sum(p.count for p in self.pools)

    @property
    def rack_count(self) -> int:
        return len({n.rack for n in self.nodes})


# --------------------------------------------------------------------------------------------- storage


class ModelStore(_Model):
    kind: Literal["nfs", "csi"] = Field(default="nfs", description="Shared model store backend.")
    server: str | None = Field(default="nfs.exaserve.internal", description="NFS server (kind nfs).")
    export_path: str = Field(default="/export/models", description="NFS export path (kind nfs).")
    csi_driver: str | None = Field(default=None, description="CSI driver name (kind csi).")
    volume_handle: str | None = Field(default=None, description="CSI volume handle (kind csi).")
    size_gb: int = Field(default=4096, gt=0, description="Capacity of the store.")
    mount_path: str = Field(default="/models", pattern=r"^/", description="Mount path on nodes and in pods.")

    @model_validator(mode="after")
    def _backend_fields(self) -> Self:
        """Each backend needs its own locator."""
        if self.kind == "nfs" and not self.server:
            raise ValueError("storage.model_store.kind is 'nfs' but server is empty; set server")
        if self.kind == "csi" and not (self.csi_driver and self.volume_handle):
            raise ValueError("storage.model_store.kind is 'csi': set csi_driver and volume_handle")
        return self


class LocalCache(_Model):
    path: str = Field(default="/var/cache/exaserve/models", pattern=r"^/", description="Node-local cache dir.")
    size_gb: int = Field(default=1024, gt=0, description="Space reserved for the cache.")
    load_bandwidth_gbps: float = Field(
        default=16.0, gt=0, description="Local NVMe read rate in GB/s, for the restart-time estimate."
    )


class StorageSpec(_Model):
    model_store: ModelStore = Field(default_factory=ModelStore)
    local_cache: LocalCache = Field(default_factory=LocalCache)


# --------------------------------------------------------------------------------------------- model


class Precision(StrEnum):
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    INT8 = "int8"
    INT4 = "int4"


BYTES_PER_PARAM: dict[Precision, float] = {
    Precision.FP16: 2.0,
    Precision.BF16: 2.0,
    Precision.FP8: 1.0,
    Precision.INT8: 1.0,
    Precision.INT4: 0.5,
}


class MlaSpec(_Model):
    """Multi-head latent attention (DeepSeek-V2/V3): the KV cache stores one compressed latent."""

    kv_lora_rank: int = Field(gt=0, description="Latent dimension cached per token per layer.")
    qk_rope_head_dim: int = Field(gt=0, description="Decoupled RoPE key dimension cached alongside.")


class MoeSpec(_Model):
    num_experts: int = Field(gt=1, description="Routed experts per MoE layer.")
    experts_per_token: int = Field(gt=0, description="Experts activated per token.")
    active_parameter_count: int | None = Field(default=None, gt=0, description="Parameters active per token.")
    intermediate_size: int | None = Field(
        default=None,
        gt=0,
        description="One expert's MLP width (config.json moe_intermediate_size; intermediate_size where the experts "
        "have no own field, as Mixtral's).",
    )
    shared_experts: int = Field(default=0, ge=0, description="Shared experts per MoE layer (n_shared_experts).")
    dense_layers: int = Field(
        default=0, ge=0, description="Leading layers with a dense MLP instead of experts (first_k_dense_replace)."
    )

    @model_validator(mode="after")
    def _topk(self) -> Self:
        """A token cannot activate more experts than exist."""
        if self.experts_per_token > self.num_experts:
            raise ValueError(f"experts_per_token={self.experts_per_token} exceeds num_experts={self.num_experts}")
        return self


ATTN_TP_ATTENTION: dict[str, str] = {
    "DeepseekV2ForCausalLM": "models/deepseek_v2.py:2051",
    "DeepseekV3ForCausalLM": "models/deepseek_v2.py:2051",
    "Qwen2MoeForCausalLM": "models/qwen2_moe.py:911",
    "Qwen3MoeForCausalLM": "models/qwen3_moe.py:502",
}
"""SGLang 0.5.23 model classes (config.json ``architectures``) whose attention splits its heads over the
attention-TP group (``attn_tp_size = get_parallel().attn_tp_size`` at the cited line, under ``sglang/srt/``), so
attention DP replicates it per group as the planner models. Others (Llama ``models/llama.py:181``, Mixtral
``models/mixtral.py:137``, Qwen2 ``models/qwen2.py:165``) split it over the whole TP group; ``tests/test_memory_model.py``
reads each model file's attention classes to check this table."""


class Architecture(_Model):
    model_class: str | None = Field(
        default=None,
        description="SGLang's model class, config.json's architectures[0] (e.g. DeepseekV3ForCausalLM): it decides "
        "how attention DP splits the attention.",
    )
    num_layers: int = Field(default=80, gt=0)
    hidden_size: int = Field(default=8192, gt=0)
    num_attention_heads: int = Field(default=64, gt=0)
    num_kv_heads: int = Field(
        default=8, gt=0, description="KV heads (GQA); equal to attention heads for MHA. Llama-3-70B: 8."
    )
    head_dim: int = Field(default=128, gt=0)
    vocab_size: int = Field(default=128_256, gt=0)
    parameter_count: int = Field(
        default=70_553_706_496,
        gt=0,
        description="Total parameters (counted from config.json when the stack gives none and it can be).",
    )
    tie_word_embeddings: bool = Field(
        default=False, description="The LM head shares the input embedding's weights (config.json)."
    )
    intermediate_size: int | None = Field(
        default=None, gt=0, description="The dense MLP's width (config.json intermediate_size); None when unknown."
    )
    weight_block_size: tuple[int, int] | None = Field(
        default=None,
        description="The checkpoint's block-FP8 block [n, k] (config.json quantization_config.weight_block_size).",
    )
    quant_group_size: int | None = Field(
        default=None,
        gt=0,
        description="The 4-bit checkpoint's group size (config.json quantization_config.group_size / q_group_size).",
    )
    unquantized_modules: tuple[str, ...] = Field(
        default=(),
        description="Modules a quantised checkpoint keeps in 16 bit (config.json quantization_config.ignored_layers "
        "or modules_to_not_convert, with and without the 'model.' prefix, as SGLang's Fp8Config reads them).",
    )
    nextn_layers: int = Field(
        default=0,
        ge=0,
        description="Multi-token-prediction layers the checkpoint carries past num_layers (config.json "
        "num_nextn_predict_layers): the draft of SGLang's NEXTN (MTP) speculative decoding.",
    )
    attention_parameters: int | None = Field(
        default=None,
        gt=0,
        description="One decoder layer's attention parameters (counted from config.json): what DP attention splits "
        "over the attention-TP group instead of TP. Without it GQA's q, k, v, o are counted from the heads.",
    )
    mla: MlaSpec | None = Field(default=None)
    moe: MoeSpec | None = Field(default=None)

    @property
    def attention_over_attn_tp(self) -> bool:
        """Whether SGLang splits this model's attention over the attention-TP group (:data:`ATTN_TP_ATTENTION`):
        the models attention DP is planned (and ``fit`` tries it) for."""
        return self.model_class in ATTN_TP_ATTENTION

    @model_validator(mode="after")
    def _heads(self) -> Self:
        """KV heads must divide the attention heads (grouped-query attention)."""
        if self.num_kv_heads > self.num_attention_heads or self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads={self.num_kv_heads} must divide num_attention_heads="
                f"{self.num_attention_heads} (GQA groups); check the model's config.json"
            )
        return self


def architecture_from_hf_config(cfg: dict[str, Any], source: str) -> dict[str, Any]:
    """Map a Hugging Face ``config.json`` to :class:`Architecture` fields.

    ``parameter_count`` is not in config.json: it is counted from the layer shapes when they are all there
    (:func:`count_parameters`); otherwise it must come from the stack (or the model card).
    """

    def need(*keys: str) -> Any:
        for k in keys:
            if k in cfg:
                return cfg[k]
        raise ValueError(f"{source}: none of {list(keys)} present; is this a transformer config.json?")

    heads = int(need("num_attention_heads", "n_head"))
    hidden = int(need("hidden_size", "n_embd", "d_model"))
    out: dict[str, Any] = {
        "num_layers": int(need("num_hidden_layers", "n_layer", "num_layers")),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": int(cfg.get("num_key_value_heads") or heads),
        "head_dim": int(cfg.get("head_dim") or hidden // heads),
        "vocab_size": int(need("vocab_size")),
    }
    classes = cfg.get("architectures")
    if isinstance(classes, list) and classes and isinstance(classes[0], str):
        out["model_class"] = classes[0]
    if cfg.get("kv_lora_rank"):
        out["mla"] = {"kv_lora_rank": int(cfg["kv_lora_rank"]), "qk_rope_head_dim": int(need("qk_rope_head_dim"))}
    experts = cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts")
    if cfg.get("intermediate_size"):
        out["intermediate_size"] = int(cfg["intermediate_size"])
    if experts:
        moe_i = cfg.get("moe_intermediate_size") or cfg.get("intermediate_size")
        out["moe"] = {
            "num_experts": int(experts),
            "experts_per_token": int(need("num_experts_per_tok")),
            "shared_experts": int(cfg.get("n_shared_experts") or 0),
            "dense_layers": int(cfg.get("first_k_dense_replace") or 0),
            **({"intermediate_size": int(moe_i)} if moe_i else {}),
        }
    quant = cfg.get("quantization_config")
    if isinstance(quant, dict) and quant.get("weight_block_size"):
        block = quant["weight_block_size"]
        if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
            raise ValueError(
                f"{source}: quantization_config.weight_block_size = {block!r} is not two positive integers [n, k]"
            )
        out["weight_block_size"] = (block[0], block[1])
    group = quant.get("group_size", quant.get("q_group_size")) if isinstance(quant, dict) else None
    if group is not None and group != -1:
        if not (isinstance(group, int) and group > 0):
            raise ValueError(f"{source}: quantization_config.group_size = {group!r} is not a positive integer")
        out["quant_group_size"] = group
    skip = (
        # The first key present, as Fp8Config's get_from_keys_or takes it (an empty ignored_layers wins).
        next((quant[k] for k in ("ignored_layers", "modules_to_not_convert") if k in quant), None)
        if isinstance(quant, dict)
        else None
    )
    if skip:
        if not (isinstance(skip, list) and all(isinstance(m, str) for m in skip)):
            raise ValueError(f"{source}: quantization_config's ignored modules {skip!r} are not a list of names")
        # layers/quantization/fp8.py Fp8Config.from_config: each name with and without the "model." prefix.
        names = (v for m in skip for v in (m.removeprefix("model."), f"model.{m.removeprefix('model.')}"))
        out["unquantized_modules"] = tuple(dict.fromkeys(names))
    out["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings", False))
    counted = count_parameters(cfg)
    if counted is not None:
        out["parameter_count"] = counted
    attn = attention_parameters(cfg)
    if attn is not None:
        out["attention_parameters"] = attn
    if cfg.get("num_nextn_predict_layers"):
        out["nextn_layers"] = int(cfg["num_nextn_predict_layers"])
    return out


def count_parameters(cfg: dict[str, Any]) -> int | None:
    """Parameters of a decoder-only transformer from its config.json, or None when a shape is missing.

    Embedding (+ LM head unless tied), per layer attention (GQA: q, k, v, o; MLA: the q/kv low-rank
    projections of DeepSeek-V2/V3), MLP (dense: gate, up, down; MoE: every routed and shared expert plus
    the router; the first ``first_k_dense_replace`` layers dense) and RMSNorm weights. Biases and
    multi-token-prediction layers are not counted (well under 0.1 % of any model here).
    """
    try:
        h, layers, vocab = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["vocab_size"])
        dense_i = int(cfg["intermediate_size"])
    except (KeyError, TypeError, ValueError):
        return None
    attn = attention_parameters(cfg)
    if attn is None:
        return None
    experts = int(cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts") or 0)
    dense_layers = layers
    moe = 0
    if experts:
        moe_i = int(cfg.get("moe_intermediate_size") or dense_i)
        shared = int(cfg.get("n_shared_experts") or 0)
        moe = (experts + shared) * 3 * h * moe_i + h * experts
        dense_layers = int(cfg.get("first_k_dense_replace") or 0)
    per_layer_norms = 2 * h
    body = layers * (attn + per_layer_norms) + dense_layers * 3 * h * dense_i + (layers - dense_layers) * moe
    embed = vocab * h * (1 if cfg.get("tie_word_embeddings") else 2)
    return body + embed + h


def attention_parameters(cfg: dict[str, Any]) -> int | None:
    """One decoder layer's attention parameters from config.json (GQA: q, k, v, o; MLA: DeepSeek's low-rank q and
    kv projections, their norms and o), or None when a shape is missing."""
    try:
        h, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        if cfg.get("kv_lora_rank"):
            nope, rope = int(cfg["qk_nope_head_dim"]), int(cfg["qk_rope_head_dim"])
            v, lora, q_lora = int(cfg["v_head_dim"]), int(cfg["kv_lora_rank"]), int(cfg.get("q_lora_rank") or 0)
            q = h * q_lora + q_lora + q_lora * heads * (nope + rope) if q_lora else h * heads * (nope + rope)
            return q + h * (lora + rope) + lora + lora * heads * (nope + v) + heads * v * h
        kv = int(cfg.get("num_key_value_heads") or heads)
        hd = int(cfg.get("head_dim") or h // heads)
    except (KeyError, TypeError, ValueError):
        return None
    return h * heads * hd + 2 * h * kv * hd + heads * hd * h


class CheckpointWeights(_Model):
    """A checkpoint's weights as its safetensors files declare them (``serving/spec/checkpoint.py`` reads them from
    ``model.checkpoint``): ``layers`` maps each decoder layer index to its bytes when every shard header was read;
    with the index alone it is None and only ``total_size`` and the tensor names are known."""

    source: str = Field(description="The index (or single .safetensors file) read.")
    total_size: int = Field(gt=0, description="Bytes of every tensor (index metadata.total_size).")
    shards: int = Field(gt=0, description="Shard files the index names.")
    headers_read: int = Field(ge=0, description="Shard headers read (all of them, or none).")
    layer_indices: tuple[int, ...] = Field(
        description="Every model.layers.N the checkpoint holds, past num_hidden_layers too (MTP/draft layers)."
    )
    table_tensors: tuple[str, ...] = Field(description="The vocabulary tables (embeddings and heads), wherever held.")
    layers: dict[int, int] | None = Field(default=None, description="Bytes of each decoder layer (shard headers).")
    embedding: int | None = Field(default=None, ge=0, description="Bytes of the input embedding (shard headers).")
    lm_head: int | None = Field(default=None, ge=0, description="Bytes of the LM head; 0 when tied (shard headers).")
    other: int | None = Field(default=None, ge=0, description="Bytes outside layers and tables: the final norm.")

    @property
    def method(self) -> str:
        return "shard headers" if self.layers is not None else "index total_size"


class SpeculativeSpec(_Model):
    """Speculative decoding (SGLang 0.5.23's EAGLE family): a draft proposes ``num_draft_tokens`` tokens a step,
    the target verifies them. The draft's weights and KV cache share each GPU with the target's."""

    algorithm: Literal["NEXTN", "EAGLE", "EAGLE3"] = Field(
        description="--speculative-algorithm: NEXTN (multi-token prediction, the MTP layers the target checkpoint "
        "carries: DeepSeek-V3's layer 61; SGLang runs it as EAGLE), EAGLE or EAGLE3 (a separate draft model)."
    )
    draft_path: str | None = Field(
        default=None,
        description="EAGLE/EAGLE3: the draft's directory under the model store (and the local cache); NEXTN: none, "
        "the draft is read from the target's checkpoint.",
    )
    draft_hf_config: str | None = Field(
        default=None,
        description="EAGLE/EAGLE3: path (relative to the stack file) of the draft's config.json, read into "
        "draft_architecture.",
    )
    draft_architecture: Architecture | None = Field(
        default=None, description="The draft's shapes (from draft_hf_config, or given); EAGLE/EAGLE3 only."
    )
    draft_vocab_size: int | None = Field(
        default=None, gt=0, description="EAGLE3: the draft's own LM head rows (config.json draft_vocab_size)."
    )
    num_steps: int = Field(default=3, gt=0, description="--speculative-num-steps: draft steps per verification.")
    eagle_topk: int = Field(default=1, gt=0, description="--speculative-eagle-topk: branches a draft step keeps.")
    num_draft_tokens: int | None = Field(
        default=None,
        gt=0,
        description="--speculative-num-draft-tokens; with eagle_topk 1 SGLang sets it to num_steps + 1 "
        "(arg_groups/speculative_hook.py:1265), so it is rendered as that; with eagle_topk > 1 it must be given.",
    )

    @model_validator(mode="after")
    def _draft(self) -> Self:
        separate = self.algorithm in ("EAGLE", "EAGLE3")
        if separate and (self.draft_path is None or self.draft_architecture is None):
            raise ValueError(
                f"speculative.algorithm {self.algorithm} loads a separate draft model: give speculative.draft_path "
                "(its directory in the model store) and speculative.draft_hf_config (its config.json)"
            )
        if not separate and (self.draft_path is not None or self.draft_architecture is not None):
            raise ValueError(
                "speculative.algorithm NEXTN reads its draft (the MTP layers) from the target's checkpoint; drop "
                "speculative.draft_path and speculative.draft_hf_config, or use EAGLE"
            )
        if self.eagle_topk == 1 and self.num_draft_tokens not in (None, self.num_steps + 1):
            raise ValueError(
                f"speculative.num_draft_tokens = {self.num_draft_tokens} with eagle_topk 1: SGLang resets it to "
                f"num_steps + 1 = {self.num_steps + 1} (arg_groups/speculative_hook.py:1265); drop it or set that"
            )
        if self.eagle_topk > 1 and self.num_draft_tokens is None:
            raise ValueError(
                f"speculative.eagle_topk = {self.eagle_topk} needs speculative.num_draft_tokens (the verified tree's "
                "size); give it"
            )
        return self

    @property
    def draft_tokens(self) -> int:
        """The tokens each step verifies: ``num_draft_tokens``, num_steps + 1 with eagle_topk 1."""
        return self.num_draft_tokens or self.num_steps + 1


MODEL_PATH_FIELDS = ("hf_config", "checkpoint")
"""The ``model:`` fields that name files (relative to the stack file), read when the stack loads."""


class ModelSpec(_Model):
    name: str = Field(default="llama-3-70b", description="Model name (served model name).")
    path: str = Field(
        default="meta-llama/Meta-Llama-3-70B-Instruct",
        description="Directory under the model store (and the local cache) holding the weights.",
    )
    precision: Precision = Field(default=Precision.FP16, description="Weight precision.")
    quantization: Literal["fp8", "awq", "gptq", "w8a8_int8"] | None = Field(
        default=None, description="SGLang --quantization method for quantised precisions."
    )
    kv_cache_dtype: Literal["auto", "fp8_e5m2", "fp8_e4m3"] = Field(
        default="auto", description="KV cache dtype; auto = 16-bit activations dtype."
    )
    hf_config: str | None = Field(
        default=None, description="Path (relative to the stack file) of a HF config.json to read the architecture from."
    )
    checkpoint: str | None = Field(
        default=None,
        description="Path (relative to the stack file) of the checkpoint's model.safetensors.index.json, a single "
        ".safetensors file or their directory: the weights are counted from it (shard headers where present).",
    )
    checkpoint_weights: CheckpointWeights | None = Field(
        default=None, description="What the stack loader read from model.checkpoint (not written by hand)."
    )
    architecture: Architecture = Field(default_factory=Architecture)
    speculative: SpeculativeSpec | None = Field(default=None, description="Speculative decoding; none by default.")
    activation_fraction: float = Field(
        default=0.15, ge=0, le=1, description="Activations as a share of weights (source: 10–20 %, 30 GB of 200)."
    )
    framework_overhead_gb: float = Field(
        default=5.0, ge=0, description="Framework overhead per GPU process (CUDA context, NCCL, allocator)."
    )
    safety_margin: float = Field(default=0.15, ge=0, lt=1, description="Margin on the summed budget (source: 15 %).")

    @model_validator(mode="after")
    def _quant(self) -> Self:
        """Quantised precisions need a quantisation method SGLang understands."""
        if self.precision in (Precision.INT4, Precision.INT8) and self.quantization is None:
            raise ValueError(
                f"precision {self.precision.value} needs model.quantization (awq/gptq for int4, w8a8_int8 for int8)"
            )
        if self.precision in (Precision.FP16, Precision.BF16) and self.quantization is not None:
            raise ValueError(
                f"model.quantization={self.quantization!r} contradicts precision {self.precision.value}; "
                "drop quantization or pick a quantised precision"
            )
        return self

    @model_validator(mode="after")
    def _checkpoint_layers(self) -> Self:
        """The checkpoint holds every decoder layer config.json declares."""
        ckpt = self.checkpoint_weights
        if ckpt is None:
            return self
        missing = sorted(set(range(self.architecture.num_layers)) - set(ckpt.layer_indices))
        if missing:
            raise ValueError(
                f"model.checkpoint {ckpt.source} holds no tensors of layers {missing[0]}…{missing[-1]} "
                f"({len(missing)} of the architecture's num_layers={self.architecture.num_layers}); point "
                "model.checkpoint and model.hf_config at the same checkpoint"
            )
        return self

    @property
    def bytes_per_param(self) -> float:
        return BYTES_PER_PARAM[self.precision]

    @property
    def kv_bytes_per_element(self) -> int:
        return 1 if self.kv_cache_dtype.startswith("fp8") else 2


# --------------------------------------------------------------------------------------------- serving


class ParallelismSpec(_Model):
    tp: int = Field(default=2, gt=0, le=64, description="Tensor parallel size (source: 2).")
    pp: int = Field(default=4, gt=0, le=64, description="Pipeline parallel size (source: 4).")
    dp: int = Field(default=1, gt=0, le=64, description="Data parallel ranks inside one replica.")
    attn_dp: int = Field(
        default=1,
        gt=0,
        le=64,
        description="Attention data parallelism inside the TP group (SGLang --attn-dp-size): attn_dp groups of "
        "tp / attn_dp GPUs, each with its own scheduler and KV pool; adds no GPUs.",
    )

    @model_validator(mode="after")
    def _attn_dp(self) -> Self:
        """SGLang 0.5.23's own checks (``arg_groups/parallel_hook.py: handle_data_parallelism``)."""
        if self.attn_dp > 1 and self.dp > 1:
            raise ValueError(
                f"parallelism.dp = {self.dp} with parallelism.attn_dp = {self.attn_dp}: SGLang refuses data-parallel "
                "replicas combined with attention DP (arg_groups/parallel_hook.py:287); set one of them to 1"
            )
        if self.tp % self.attn_dp:
            raise ValueError(
                f"parallelism.attn_dp = {self.attn_dp} does not divide parallelism.tp = {self.tp} (SGLang asserts "
                "tp_size % attn_dp_size == 0, arg_groups/parallel_hook.py:326); pick a divisor of tp"
            )
        return self

    @property
    def attn_tp(self) -> int:
        """The attention-TP width: each attention-DP group's GPUs (``runtime_context.py: derive_attn_tp_size``)."""
        return self.tp // self.attn_dp

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp * self.dp


class LimitsSpec(_Model):
    max_running_requests: int = Field(default=8, gt=0, description="Batch size per replica (source max_batch_size 8).")
    context_length: int = Field(default=4096, gt=0, description="Max sequence length (source max_seq_len 4096).")
    chunked_prefill_size: int = Field(default=4096, gt=0, description="Prefill chunk in tokens.")
    p99_concurrency_per_replica: int = Field(
        default=4, gt=0, description="Concurrent requests per replica that keep P99 under target (source: 4)."
    )
    p99_target_s: float = Field(default=2.0, gt=0, description="P99 latency target (source: < 2 s).")
    mean_request_s: float = Field(default=1.5, gt=0, description="Mean request time (source: 1.5 s).")
    balance_efficiency: float = Field(default=0.80, gt=0, le=1, description="Load-balance efficiency (80 %).")
    failure_reserve: float = Field(default=0.10, ge=0, lt=1, description="Reserved for failures/rollouts (10 %).")
    burst_buffer: float = Field(default=0.10, ge=0, lt=1, description="Headroom for bursts (≈ 8,847 → 8,000).")


class LogLevel(StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"

    @classmethod
    def _missing_(cls, value: object) -> LogLevel | None:
        if isinstance(value, str):
            v = value.lower()
            return cls.WARNING if v == "warn" else cls.__members__.get(v.upper())
        return None


ReleaseName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]


IMAGE_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")  # an OCI content digest, as a registry returns it on a push


def pinned_image(v: str) -> str:
    """Images are pinned: an explicit tag other than 'latest', or a digest: ``repo[:tag]@sha256:<64 hex digits>``,
    as the image workflow publishes it (.github/workflows/image.yml)."""
    if "@" in v:
        name, _, digest = v.partition("@")
        if name and IMAGE_DIGEST.fullmatch(digest):
            return v
        raise ValueError(
            f"image {v!r} is not pinned: {digest!r} after '@' is not a sha256:<64 hex digits> digest of a named "
            "repository; use repo@sha256:<digest> as the image workflow prints it, or an explicit tag"
        )
    name, _, tag = v.rpartition(":")
    if not name or not tag or tag == "latest" or "/" in tag:
        raise ValueError(f"image {v!r} is not pinned; use an explicit tag or @sha256 digest, never 'latest'")
    return v


class ServingSpec(_Model):
    replicas: int = Field(default=3072, gt=0, description="Serving replicas (SGLang servers).")
    target_replicas: int | None = Field(
        default=None, gt=0, description="The source's replica target, reported next to what the hardware allows."
    )
    replicas_per_node: int | None = Field(
        default=12, gt=0, description="Replicas per node; None when a replica spans nodes."
    )
    releases: dict[ReleaseName, str] = Field(
        default_factory=lambda: {"v1": "lmsysorg/sglang:v0.5.23-cu126"},
        min_length=1,
        description="Release label → serving container image, pinned (no 'latest'). Rollouts move between these.",
    )
    version: ReleaseName = Field(default="v1", description="The stable release the fleet runs.")
    port: int = Field(default=30000, gt=0, lt=65536, description="SGLang HTTP port.")
    heartbeat_interval_s: float = Field(default=5.0, gt=0, description="Heartbeat period (source: 5 s).")
    failure_threshold: int = Field(default=3, gt=0, description="Missed heartbeats before unhealthy (source: 3).")
    success_threshold: int = Field(default=2, gt=0, description="Good checks before a node is healthy again.")
    health_check_timeout_s: float = Field(
        default=3.0, gt=0, description="Health HTTP timeout (1 s flapped; 3 s fixed it)."
    )
    migration_timeout_s: float = Field(default=10.0, gt=0, description="Replica migration budget (source: 10 s).")
    recovery_target_s: float = Field(
        default=30.0, gt=0, description="Detect + migrate within this (source: ≈ 25 s, ≤ 30 s)."
    )
    startup_budget_s: float = Field(
        default=600.0, gt=0, description="Time a replica may take to load before it is killed."
    )
    warmup_share: float = Field(default=0.10, gt=0, le=1, description="Traffic share of a warming replica (10 %).")
    warmup_duration_s: float = Field(default=30.0, ge=0, description="Stable time before full traffic (30 s).")
    heartbeat_mode: Literal["aggregated", "direct"] = Field(
        default="aggregated", description="Node agents aggregate replica heartbeats (source node_aggregation)."
    )
    log_level: LogLevel = Field(default=LogLevel.WARNING, description="Serving log level (source: WARN).")
    watchdog_timeout_s: float = Field(default=300.0, gt=0, description="SGLang --watchdog-timeout.")
    mem_fraction_static: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="SGLang --mem-fraction-static; None = SGLang's own default for the GPU, TP and PP "
        "(the planner reproduces handle_gpu_memory_settings).",
    )
    shm_gb_per_gpu: float = Field(
        default=2.0,
        gt=0,
        description="Shared memory (the /dev/shm mount) per GPU of a serving pod, in GB: NCCL's shared-memory transport between the pod's "
        "GPUs and the tokenizer/scheduler IPC. Counted in the pod's memory request (memory-backed).",
    )
    cpus_per_gpu: int = Field(
        default=8,
        gt=0,
        le=64,
        description="Whole CPUs per GPU of a serving pod (request = limit: Guaranteed QoS, so the kubelet's static "
        "CPU manager pins them) for SGLang's scheduler, tokenizer and detokenizer processes.",
    )

    @field_validator("releases")
    @classmethod
    def _pinned_releases(cls, v: dict[str, str]) -> dict[str, str]:
        """Every release's image is pinned."""
        for name, image in v.items():
            try:
                pinned_image(image)
            except ValueError as exc:
                raise ValueError(f"release {name!r}: {exc}") from None
        return v

    @model_validator(mode="after")
    def _version_released(self) -> Self:
        """The stable version must be one of the releases, so its image is known."""
        if self.version not in self.releases:
            raise ValueError(
                f"version {self.version!r} is not in releases ({sorted(self.releases)}); add its image under "
                "serving.releases"
            )
        return self

    @property
    def image(self) -> str:
        """The stable release's image."""
        return self.releases[self.version]


LoadMetric = Literal["gpu_utilization", "memory_usage", "network_bandwidth"]


def _default_weights() -> dict[LoadMetric, float]:
    return {"gpu_utilization": 0.5, "memory_usage": 0.3, "network_bandwidth": 0.2}


class SchedulerSpec(_Model):
    strategy: Literal["weighted_round_robin", "round_robin", "cache_aware", "power_of_two", "random"] = Field(
        default="weighted_round_robin", description="Node-selection strategy (source: weighted_round_robin)."
    )
    node_aggregation: bool = Field(default=True, description="Two-level scheduling: node, then replica.")
    weights: dict[LoadMetric, float] = Field(
        default_factory=_default_weights,
        description="Load-metric weights; must sum to 1.",
    )
    period_ms: int = Field(default=100, gt=0, description="Scheduling period (10 ms saturated the CPU).")
    migration_load_ratio: float = Field(default=1.5, gt=1, description="Migrate above this × mean node load.")
    shed_min_load: float = Field(
        default=0.25,
        gt=0,
        le=1,
        description="The controller sheds a replica's load (out of every router, no restart) when its weighted load "
        "is above migration_load_ratio × the fleet's mean and at least this (a replica at half its batch, or a KV pool "
        "83 % full: below it, 1.5 × an idle fleet's mean is noise); it returns, after a warm-up, once its load is "
        "under half of it (the hysteresis).",
    )
    instances: int = Field(default=3, gt=0, description="Scheduler/router instances with leader election.")
    max_direct_heartbeat_replicas: int = Field(
        default=1500, gt=0, description="Replicas a central scheduler handled before jitter (source: ≈ 1,500)."
    )
    retries: int = Field(
        default=5,
        ge=0,
        description="Attempts the router makes per request, the first included (its --retry-max-retries: 1 means no "
        "retry; 0 renders --disable-retries). Above serving.failure_threshold, one dead replica cannot fail a "
        "request: its circuit breaker opens after failure_threshold consecutive failures and the router picks only "
        "among workers whose breaker is closed, so the next attempt lands elsewhere. At 3 (= the threshold) a request "
        "whose three picks all hit the dead replica fails (seen once in 560 requests on a killed replica).",
    )

    @field_validator("weights")
    @classmethod
    def _weights_sum(cls, v: dict[str, float]) -> dict[str, float]:
        """Load weights are a convex combination."""
        if any(w < 0 for w in v.values()):
            raise ValueError(f"weights {v} contain a negative weight")
        total = sum(v.values())
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"weights {v} sum to {total:g}; they must sum to 1 (source: 0.5/0.3/0.2)")
        return v


class HealthScoreSpec(_Model):
    start: int = Field(default=100, gt=0)
    timeout_penalty: int = Field(default=5, gt=0, description="Points lost per heartbeat timeout.")
    success_reward: int = Field(default=1, gt=0, description="Points gained per success.")
    cap: int = Field(default=100, gt=0)
    stop_routing_below: int = Field(default=60, ge=0, description="No new requests below this score.")
    migrate_below: int = Field(default=30, ge=0, description="Migrate replicas below this score.")
    readmit_at: int = Field(
        default=75,
        gt=0,
        description="Hysteresis: a replica taken out below stop_routing_below returns (after warm-up) only at this "
        "score or more: 15 straight successes above the 60 line, so one failure in six (net drift 0) cannot flap it.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        """0 ≤ migrate < stop-routing ≤ start ≤ cap, or the score cannot move through its states."""
        if not (self.migrate_below < self.stop_routing_below <= self.start <= self.cap):
            raise ValueError(
                f"need migrate_below ({self.migrate_below}) < stop_routing_below ({self.stop_routing_below}) "
                f"<= start ({self.start}) <= cap ({self.cap})"
            )
        if not self.stop_routing_below < self.readmit_at <= self.cap:
            raise ValueError(
                f"readmit_at ({self.readmit_at}) must lie above stop_routing_below ({self.stop_routing_below}) and "
                f"at most cap ({self.cap}), or a replica flaps in and out of rotation"
            )
        return self


class RuntimeSpec(_Model):
    """Node agents and the fleet controller (docs/runtime.md)."""

    max_eviction_share: float = Field(
        default=0.10,
        gt=0,
        le=1,
        description="Eviction cap: at most this share of the replicas out of rotation at once (Envoy's max "
        "ejection percent, 10 %); at least one.",
    )
    lease_ttl_s: float = Field(
        default=10.0, gt=0, description="Leader lease time; a follower takes over at most this long after a crash."
    )
    lease_name: str = Field(
        default="exaserve-controller",
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="etcd key suffix / Kubernetes Lease name of the controllers' election.",
    )
    etcd_endpoints: list[str] = Field(
        default_factory=lambda: ["http://127.0.0.1:2379"],
        min_length=1,
        description="etcd v3 JSON gateway URLs (bare metal).",
    )
    controller_port: int = Field(
        default=9410, gt=0, lt=65536, description="Controller HTTP port (reports, status, metrics)."
    )
    report_max_age_s: float | None = Field(
        default=None, gt=0, description="Reject reports older than this; default 3 × serving.heartbeat_interval_s."
    )
    restart_backoff_s: float = Field(
        default=10.0,
        gt=0,
        description="Wait before restarting a replica again after its first restart, doubled after each further "
        "one (kubelet's crash-loop back-off starts at 10 s).",
    )
    restart_backoff_max_s: float = Field(
        default=300.0,
        gt=0,
        description="Longest wait between two restarts of one replica (kubelet's MaxContainerBackOff, 300 s); a "
        "replica serving for twice this long starts its back-off again.",
    )
    quarantine_after: int = Field(
        default=3,
        gt=0,
        description="Restarts that did not bring the replica back (no passed warm-up since) before it is "
        "quarantined: out of rotation, no further restart, alert ExaServeReplicaQuarantined names it.",
    )
    image: str = Field(
        default="exaserve/exaserve-deploy:0.1.0",
        description="Container image with this package (the exaserve command) for the controller and the agents.",
    )

    @field_validator("image")
    @classmethod
    def _pinned(cls, v: str) -> str:
        """The runtime image is pinned like the serving image."""
        return pinned_image(v)

    @model_validator(mode="after")
    def _backoff_ordered(self) -> Self:
        if self.restart_backoff_s > self.restart_backoff_max_s:
            raise ValueError(
                f"runtime.restart_backoff_s ({self.restart_backoff_s:g}) is above runtime.restart_backoff_max_s "
                f"({self.restart_backoff_max_s:g}); set the first back-off at most the longest"
            )
        return self


DrillName = Literal[
    "replica-crash",
    "replica-hang",
    "scheduler-wedged",
    "replica-flapping",
    "replica-slow",
    "error-burst",
    "generation-errors",
    "memory-pressure",
    "network-jitter",
    "node-loss",
    "node-stall",
    "router-loss",
    "leader-loss",
    "double-fault",
    "router-and-replica-loss",
]
"""The fault drills' scenarios (what each does: ``serving.drill.scenarios.SCENARIOS``, docs/drills.md)."""

_CRON_FIELD = r"[0-9A-Za-z*?/,-]+"
_CRON = rf"^(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|@every [0-9]+[smh]|{_CRON_FIELD}( {_CRON_FIELD}){{4}})$"


def _regular_drills() -> list[DrillName]:
    return ["replica-crash", "network-jitter", "memory-pressure"]


class DrillSpec(_Model):
    """Fault drills (docs/drills.md): the regular ones a cluster runs as a Chaos Mesh Schedule."""

    schedule: str = Field(
        default="0 10 * * 2",
        pattern=_CRON,
        description="When the regular drills run: a cron expression (minute hour day-of-month month day-of-week, in "
        "the Chaos Mesh controller's time zone) or a descriptor (@weekly, @every 168h). Default Tuesdays 10:00: a "
        "working day, with people at hand.",
    )
    scheduled: list[DrillName] = Field(
        default_factory=_regular_drills,
        min_length=1,
        description="Scenarios of the regular drills, run one after another, each followed by the plan's restoration "
        "time (the source's drills: kill replicas, inject network jitter, create memory pressure).",
    )

    @field_validator("scheduled")
    @classmethod
    def _once_each(cls, v: list[str]) -> list[str]:
        """A scenario runs once per drill window."""
        twice = sorted(name for name, n in Counter(v).items() if n > 1)
        if twice:
            raise ValueError(f"scheduled names {twice} more than once; list each scenario once")
        return v


class RolloutSpec(_Model):
    batches: int = Field(default=5, gt=0, le=100, description="Update batches (source: 5).")
    interval_s: float = Field(default=300.0, ge=0, description="Soak between batches (source: 5 min).")
    max_qps_drop: float = Field(default=0.20, gt=0, lt=1, description="Gate: QPS drop vs baseline (20 %).")
    max_p99_rise: float = Field(default=0.30, gt=0, description="Gate: P99 rise vs baseline (30 %).")
    max_error_rate: float = Field(default=0.001, ge=0, lt=1, description="Gate: error rate (0.1 %).")
    drain_timeout_s: float = Field(default=120.0, gt=0, description="Wait for in-flight requests at most this.")
    health_timeout_s: float = Field(default=900.0, gt=0, description="Wait for an updated batch's health.")
    baseline_window_s: float = Field(default=60.0, gt=0, description="Window the baseline is measured over.")
    max_kv_pool_miss: float = Field(
        default=0.15,
        gt=0,
        lt=1,
        description="Gate: a canary's KV pool (SGLang's sglang:max_total_num_tokens) off the plan's "
        "kv_pool_tokens_per_replica by more than this share holds the rollout, naming the planner input likely wrong "
        "(beyond 5 % it warns).",
    )
    group_versions: dict[int, str] = Field(
        default_factory=dict, description="Per update group version overrides (group index → version)."
    )

    @model_validator(mode="after")
    def _groups(self) -> Self:
        """Group indices must name existing update groups."""
        bad = sorted(i for i in self.group_versions if not 0 <= i < self.batches)
        if bad:
            raise ValueError(f"group_versions keys {bad} are outside 0..{self.batches - 1}")
        return self


class KubernetesSpec(_Model):
    version: str = Field(default="1.33", pattern=r"^1\.\d+$", description="Target Kubernetes minor version.")
    namespace: str = Field(default="exaserve", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    context: str | None = Field(default=None, description="kubeconfig context for the explicit provider.")
    rdma_resource: str = Field(default="rdma/hca_shared_devices_a", description="RDMA extended resource.")
    router_image: str = Field(
        # smg's release image (docker/Dockerfile: ENTRYPOINT python3 -m smg.launch_router, user smg, uid 65532 =
        # the router pod's runAsUser), at the version pyproject.toml pins and the flag manifest was dumped from
        default="lightseekorg/smg:1.13.0",
        description="The gateway's image (smg).",
    )
    monitoring_namespace: str = Field(default="monitoring")
    prometheus_selector_labels: dict[str, str] = Field(
        default_factory=lambda: {"release": "kube-prometheus-stack"},
        description="Labels put on the PrometheusRule and ServiceMonitors so the cluster's Prometheus selects them "
        "(kube-prometheus-stack selects its Helm release name under 'release').",
    )
    production: bool = Field(
        default=False,
        description="A production stack: every image is pulled through image_registry and by digest "
        "(repo[:tag]@sha256:…), never by a mutable tag (guards images-through-mirror and images-by-digest).",
    )
    image_registry: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)*$",
        description="Registry mirror every image is pulled through ('mirror.example:5000/proxy'); "
        "None pulls each image by its own name.",
    )
    image_pull_secret: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="Name of an existing docker-registry Secret in the namespace for pulling images (a name "
        "only: the secret itself is created outside this program and never rendered).",
    )
    prerequisites: Literal["check", "skip"] = Field(
        default="check",
        description="'check': `pulumi up` reads the CRDs the stack needs (LeaderWorkerSet, prometheus-operator, "
        "NetworkAttachmentDefinition when used) before creating anything that uses them and fails naming the "
        "missing one; 'skip': trust the cluster (docs/infra.md lists every prerequisite with its version).",
    )

    @field_validator("router_image")
    @classmethod
    def _pinned(cls, v: str) -> str:
        """Router image is pinned like the serving image."""
        return pinned_image(v)


class SandboxVersion(_Model):
    latency_ms: float = Field(default=20.0, ge=0)
    error_rate: float = Field(default=0.0, ge=0, le=1)
    startup_s: float = Field(default=0.5, ge=0)
    never_ready: bool = False
    kv_skew: float = Field(
        default=0.0,
        gt=-1,
        le=1,
        description="The simulated worker's KV pool is the plan's × (1 + kv_skew), as if the planner's start-up "
        "overhead were wrong by that much (-0.2: a pool 20 % smaller than planned).",
    )


class SandboxSpec(_Model):
    """Local rehearsal: the real router in front of simulated SGLang workers on loopback.

    The default ports lie in 20000-20199, below Linux's ephemeral port range (32768-60999 by default), from which
    every outgoing connection of the machine takes its source port: a sandbox port inside it can be taken by a
    connection before the sandbox binds it. The range is the machine's (``/proc/sys/net/ipv4/ip_local_port_range``),
    so ``sandbox up`` checks the ports against it on the machine that binds them
    (:func:`serving.sandbox.scale.check_machine`), not this model."""

    router_port: int = Field(default=20000, gt=1024, lt=65536, description="Router 0's HTTP API port.")
    prometheus_port: int = Field(
        default=20001, gt=1024, lt=65536, description="Router 0's Prometheus metrics port (--prometheus-port)."
    )
    worker_base_port: int = Field(
        default=20100, gt=1024, lt=65000, description="Replica i's simulated worker listens on this + i."
    )
    versions: dict[str, SandboxVersion] = Field(
        default_factory=lambda: {"v1": SandboxVersion()}, description="Simulated releases."
    )
    runtime: bool = Field(
        default=False, description="`sandbox up` also starts etcd, one agent per node and the controllers."
    )
    runtime_base_port: int = Field(
        default=20050,
        gt=1024,
        lt=65000,
        description="etcd client/peer on base, base+1; controller i on base+2+i; Prometheus on base+19; extra router "
        "i on base+20+2i.",
    )
    prometheus: bool = Field(
        default=False,
        description="`sandbox up` also starts a real Prometheus server (on runtime_base_port+19) that scrapes what the "
        "rendered ServiceMonitors describe and evaluates the rendered alert rules every serving.heartbeat_interval_s.",
    )
    nodes_per_process: int | None = Field(
        default=None,
        gt=0,
        description="None: one process per simulated worker and per node agent. N (the scale layout of `sandbox up "
        "--simulate`): the workers of N nodes share one process (one event loop, a loopback control endpoint on "
        "control_base_port + its index) and the agents of the same N nodes another.",
    )
    control_base_port: int = Field(
        default=20040,
        gt=1024,
        lt=65000,
        description="The scale layout's worker processes: process i's control endpoint (restart or stop one port, "
        "request counts) on this + i.",
    )


class FleetSpec(_Model):
    """The whole fleet: the one source of truth."""

    cluster: ClusterSpec
    storage: StorageSpec = Field(default_factory=StorageSpec)
    model: ModelSpec = Field(default_factory=ModelSpec)
    parallelism: ParallelismSpec = Field(default_factory=ParallelismSpec)
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    serving: ServingSpec = Field(default_factory=ServingSpec)
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec)
    health: HealthScoreSpec = Field(default_factory=HealthScoreSpec)
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    drills: DrillSpec = Field(default_factory=DrillSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    kubernetes: KubernetesSpec = Field(default_factory=KubernetesSpec)
    sandbox: SandboxSpec | None = Field(default=None)

    @model_validator(mode="after")
    def _versions_known(self) -> Self:
        """Every version a group runs is a release; in a sandbox, also a simulated release."""
        unknown = sorted(set(self.rollout.group_versions.values()) - set(self.serving.releases))
        if unknown:
            raise ValueError(
                f"rollout.group_versions uses {unknown}, not in serving.releases ({sorted(self.serving.releases)}); "
                "add their images there"
            )
        if self.sandbox is not None:
            used = {self.serving.version, *self.rollout.group_versions.values()}
            missing = sorted(used - set(self.sandbox.versions))
            if missing:
                raise ValueError(
                    f"version(s) {missing} are not defined in sandbox.versions "
                    f"({sorted(self.sandbox.versions)}); add them there"
                )
        return self

    @model_validator(mode="after")
    def _speculative_modelled(self) -> Self:
        """NEXTN's draft is the checkpoint's multi-token-prediction layers: config.json must declare them; the draft
        is planned without pipeline parallelism."""
        spec = self.model.speculative
        if spec is not None and self.parallelism.pp > 1:
            raise ValueError(
                f"model.speculative with parallelism.pp = {self.parallelism.pp}: the planner models a draft beside "
                "the target on one pipeline stage only; set parallelism.pp to 1 or drop model.speculative"
            )
        if spec is not None and spec.algorithm == "NEXTN" and self.model.architecture.nextn_layers == 0:
            raise ValueError(
                f"model.speculative.algorithm NEXTN: {self.model.name}'s config.json declares no "
                "num_nextn_predict_layers (MTP layers) to draft with; use EAGLE/EAGLE3 with a draft model"
            )
        return self

    @model_validator(mode="after")
    def _attn_dp_modelled(self) -> Self:
        """Attention DP is planned for the models whose attention SGLang splits over the attention-TP group
        (:data:`ATTN_TP_ATTENTION`: DeepSeek, Qwen2/3-MoE); Llama or Mixtral build theirs over the whole TP group
        (``models/llama.py:181``, ``models/mixtral.py:137``), which the planner does not model."""
        n, arch = self.parallelism.attn_dp, self.model.architecture
        if n == 1:
            return self
        if not arch.attention_over_attn_tp:
            known = ", ".join(f"{c} ({w})" for c, w in ATTN_TP_ATTENTION.items())
            got = (
                f"model class {arch.model_class}, whose attention SGLang splits over the whole TP group"
                if arch.model_class
                else "no model class (give model.hf_config: config.json's architectures names it)"
            )
            raise ValueError(
                f"parallelism.attn_dp = {n} on {self.model.name} ({got}): the planner models attention DP only for "
                f"models whose attention SGLang splits over the attention-TP group: {known}; "
                "set parallelism.attn_dp to 1"
            )
        if arch.mla is not None and arch.attention_parameters is None:
            raise ValueError(
                f"parallelism.attn_dp = {n}: model.architecture.attention_parameters is unknown for this MLA model "
                "(its low-rank shapes); give model.hf_config (config.json) so it is counted"
            )
        return self

    def group_version(self, group: int) -> str:
        return self.rollout.group_versions.get(group, self.serving.version)

    def group_image(self, group: int) -> str:
        return self.serving.releases[self.group_version(group)]


def json_schema() -> dict[str, Any]:
    """JSON Schema of a stack's ``exaserve:`` config, for editors."""
    return FleetSpec.model_json_schema(mode="validation")


def load_hf_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ValueError(f"model.hf_config: {path} does not exist; fix the path (relative to the stack file)") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"model.hf_config: {path} is not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"model.hf_config: {path} must hold a JSON object")
    return architecture_from_hf_config(data, str(path))
