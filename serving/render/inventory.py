"""The Ansible view of a stack: group names and the ``exaserve_*`` variables, computed from the spec.

The ``exaserve.fleet.exaserve`` inventory plugin is a thin shell over these functions, and the CLI uses
them to check ``--limit`` before it starts a run. The variables are listed in docs/preflight.md.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any

from serving.node.fabric import utilisation_table
from serving.render.chrony import chrony_conf
from serving.render.k8s.common import node_taint
from serving.render.sglang import model_dir
from serving.spec.schema import FleetSpec, Node
from serving.spec.stack import Stack

FLEET_GROUP = "exaserve"
# The system pool's nodes (routers, controllers): their own group, outside FLEET_GROUP, so the GPU node plays and
# roles never run there; preflight checks them in a play of their own.
SYSTEM_GROUP = "exaserve_system"
_IDENT = re.compile(r"[^A-Za-z0-9_]")
_IMAGE_CUDA = re.compile(r"[-_.]cu(?:da)?(?P<major>\d{2})(?P<minor>\d)(?=[-_.])")


def group_name(label: str) -> str:
    """An Ansible group name for a rack label: ``rack-00`` -> ``rack_00`` (identifier characters only)."""
    name = _IDENT.sub("_", label)
    return name if name[:1].isalpha() else f"g_{name}"


def pool_group(pool: str) -> str:
    return f"pool_{group_name(pool)}"


def image_cuda(image: str) -> str | None:
    """CUDA version an image tag declares (``…:v0.5.23-cu126[@sha256:…]`` -> ``12.6``), or None."""
    tag = image.partition("@")[0].rpartition(":")[2]
    match = _IMAGE_CUDA.search(f"-{tag}-")
    return f"{match.group('major')}.{match.group('minor')}" if match else None


def groups(spec: FleetSpec) -> dict[str, list[str]]:
    """Every group the inventory plugin creates, with its nodes in inventory order."""
    out: dict[str, list[str]] = {FLEET_GROUP: []}
    for node in spec.cluster.nodes:
        out[FLEET_GROUP].append(node.name)
        out.setdefault(pool_group(node.pool), []).append(node.name)
        out.setdefault(group_name(node.rack), []).append(node.name)
    return out


def _pattern_nodes(spec: FleetSpec, pattern: str) -> set[str] | None:
    """Nodes one glob pattern selects (by node or group name, the system pool's included); None when it matches
    nothing."""
    grp = {**groups(spec), SYSTEM_GROUP: system_hosts(spec)}
    names = [n.name for n in (*spec.cluster.nodes, *spec.cluster.system_nodes)]
    hit_groups = fnmatch.filter(list(grp), pattern)
    hit_nodes = fnmatch.filter(names, pattern)
    if not hit_groups and not hit_nodes:
        return None
    return set(hit_nodes).union(*(grp[g] for g in hit_groups))


def unmatched_limit_patterns(spec: FleetSpec, limit: str) -> list[str]:
    """Patterns of an Ansible ``--limit`` (comma or colon separated, ``!``/``&`` prefixes, globs)
    that match no node and no group of the stack. Regex patterns (``~…``) are not checked."""
    bad = []
    for raw in re.split(r"[,:]", limit):
        pattern = raw.strip().lstrip("!&")
        if pattern and not pattern.startswith("~") and _pattern_nodes(spec, pattern) is None:
            bad.append(pattern)
    return bad


def limit_nodes(spec: FleetSpec, limit: str | None) -> list[Node]:
    """The nodes an Ansible-style ``--limit`` selects, in inventory order: plain patterns are a union,
    ``&pattern`` intersects and ``!pattern`` excludes (regex ``~`` patterns are not supported here). Without a
    limit, the GPU nodes; the system pool's only when a pattern names them."""
    if limit is None:
        return list(spec.cluster.nodes)
    nodes = [*spec.cluster.nodes, *spec.cluster.system_nodes]
    union: set[str] = set()
    keep: set[str] | None = None
    drop: set[str] = set()
    for raw in re.split(r"[,:]", limit):
        pattern = raw.strip()
        if not pattern:
            continue
        selected = _pattern_nodes(spec, pattern.lstrip("!&")) or set()
        if pattern.startswith("!"):
            drop |= selected
        elif pattern.startswith("&"):
            keep = selected if keep is None else keep & selected
        else:
            union |= selected
    chosen = (union & keep if keep is not None else union) - drop
    return [n for n in nodes if n.name in chosen]


def fleet_vars(stack: Stack) -> dict[str, Any]:
    """The ``exaserve_*`` variables every node gets (group ``exaserve``)."""
    spec = stack.spec
    c = spec.cluster
    store = spec.storage.model_store
    racks = list(dict.fromkeys(n.rack for n in c.nodes))
    return {
        "exaserve_stack": stack.name,
        "exaserve_stack_path": str(stack.path),
        "exaserve_cluster": c.name,
        "exaserve_os_id": c.host.os_id,
        "exaserve_os_version": c.host.os_version,
        "exaserve_min_kernel": c.host.min_kernel,
        "exaserve_cgroup_v2": c.host.cgroup_v2,
        "exaserve_min_driver": c.host.min_driver,
        "exaserve_min_cuda": c.host.min_cuda,
        "exaserve_image": spec.serving.image,
        "exaserve_image_cuda": image_cuda(spec.serving.image),
        "exaserve_container_runtime": c.host.container_runtime,
        "exaserve_min_free_disk_gb": c.host.min_free_disk_gb,
        "exaserve_gpu_count": c.gpu.count_per_node,
        "exaserve_gpu_product": c.gpu.product,
        "exaserve_gpu_memory_gb": c.gpu.memory_gb,
        "exaserve_fabric_kind": c.fabric.kind.value,
        "exaserve_hcas": list(c.fabric.hcas),
        "exaserve_link_rate_gbps": c.fabric.link_rate_gbps,
        "exaserve_fabric_socket_ifname": c.fabric.socket_ifname,
        "exaserve_utilisation_table": utilisation_table(),
        "exaserve_ntp_servers": list(c.ntp.servers),
        "exaserve_ntp_max_offset_ms": c.ntp.max_offset_ms,
        "exaserve_chrony_conf": chrony_conf(spec),
        "exaserve_node_taint": node_taint(),
        "exaserve_model_store": {
            "kind": store.kind,
            "server": store.server,
            "export_path": store.export_path,
            "mount_path": store.mount_path,
        },
        "exaserve_model_store_dir": f"{store.mount_path.rstrip('/')}/{spec.model.path.strip('/')}",
        "exaserve_cache_path": spec.storage.local_cache.path,
        "exaserve_cache_model_dir": model_dir(spec),
        "exaserve_racks": [group_name(r) for r in racks],
        "exaserve_nodes": {n.name: str(n.address) for n in c.nodes},
        "exaserve_system_pool": (
            {"name": c.system_pool.name, "cpu": c.system_pool.cpu, "memory_gb": c.system_pool.memory_gb}
            if c.system_pool
            else None
        ),
    }


def host_vars(stack: Stack) -> dict[str, dict[str, Any]]:
    """Per-node variables, the system pool's nodes included: how to reach it and where it sits."""
    c = stack.spec.cluster
    return {
        n.name: {
            "ansible_host": str(n.address),
            "ansible_port": n.ssh_port,
            "ansible_user": n.ssh_user,
            "exaserve_pool": n.pool,
            "exaserve_rack": n.rack,
            "exaserve_rack_group": group_name(n.rack),
            "exaserve_leaf": n.leaf,
            "exaserve_index": n.index,
        }
        for n in (*c.nodes, *c.system_nodes)
    }


def system_hosts(spec: FleetSpec) -> list[str]:
    """The members of :data:`SYSTEM_GROUP`, in inventory order."""
    return [n.name for n in spec.cluster.system_nodes]
