"""The hardware the fleet runs on: the GPU node pools (expanded into the node inventory), the system pool, GPUs,
fabric, host requirements, clock sync and cost, and the model storage."""

from __future__ import annotations

import ipaddress
import string
from collections import Counter
from collections.abc import Sequence
from enum import StrEnum
from functools import cached_property
from itertools import pairwise
from typing import Literal, Self

from pydantic import Field, field_validator, model_validator

from serving.spec.schema.base import SpecModel

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


class Pool(SpecModel):
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


class Node(SpecModel):
    """One expanded node of the inventory."""

    name: str
    address: ipaddress.IPv4Address
    pool: str
    rack: str
    leaf: str
    index: int
    ssh_user: str
    ssh_port: int


class GpuSpec(SpecModel):
    product: str = Field(default="NVIDIA-A100-SXM4-80GB", description="GPU product label (nvidia.com/gpu.product).")
    memory_gb: float = Field(
        default=80.0, gt=0, description="Memory per GPU in GB (10^9 bytes), as nvidia-smi sells it."
    )
    count_per_node: int = Field(default=8, gt=0, le=64, description="GPUs per node.")
    usable_memory_fraction: float = Field(
        default=0.85, gt=0, le=1, description="Share of GPU memory the plan may budget (source: 85 %)."
    )
    power_kw_per_node: float = Field(default=3.0, gt=0, description="Node power draw in kW (source: 3 kW).")


class FabricSpec(SpecModel):
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


class HostRequirements(SpecModel):
    os_id: str = Field(default="ubuntu", description="/etc/os-release ID.")
    os_version: str = Field(default="22.04", description="/etc/os-release VERSION_ID.")
    min_kernel: str = Field(default="5.15", pattern=r"^\d+\.\d+(\.\d+)?$", description="Minimum kernel.")
    min_driver: str = Field(default="535.54", pattern=r"^\d+\.\d+(\.\d+)?$", description="Minimum NVIDIA driver.")
    min_cuda: str = Field(default="12.1", pattern=r"^\d+\.\d+$", description="Minimum CUDA version.")
    cgroup_v2: bool = Field(default=True, description="Require the unified cgroup v2 hierarchy.")
    container_runtime: Literal["containerd", "docker"] = Field(default="containerd")
    min_free_disk_gb: float = Field(default=500.0, gt=0, description="Free disk for the local model cache.")


class NtpSpec(SpecModel):
    servers: list[str] = Field(
        default_factory=lambda: ["ntp-0.exaserve.internal", "ntp-1.exaserve.internal"],
        min_length=1,
        description="NTP servers every node syncs with.",
    )
    max_offset_ms: float = Field(default=100.0, gt=0, description="Largest tolerated clock offset (source: 100 ms).")


class CostSpec(SpecModel):
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


class ClusterSpec(SpecModel):
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


class ModelStore(SpecModel):
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


class LocalCache(SpecModel):
    path: str = Field(default="/var/cache/exaserve/models", pattern=r"^/", description="Node-local cache dir.")
    size_gb: int = Field(default=1024, gt=0, description="Space reserved for the cache.")
    load_bandwidth_gbps: float = Field(
        default=16.0, gt=0, description="Local NVMe read rate in GB/s, for the restart-time estimate."
    )


class StorageSpec(SpecModel):
    model_store: ModelStore = Field(default_factory=ModelStore)
    local_cache: LocalCache = Field(default_factory=LocalCache)
