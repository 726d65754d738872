"""Fabric check: all-reduce bus bandwidth between nodes with torch.distributed, reported like nccl-tests.

Three layers, each usable on its own:

* pure arithmetic — :func:`bus_bandwidth` (``busbw = algbw × 2(n−1)/n``, the figure nccl-tests
  prints for all-reduce), :func:`fabric_groups` (which nodes test together: node pairs, then each
  rack) and :func:`assess` (measured busbw against the spec's link rate and the source's
  link-rate → GPU-utilisation table, :func:`serving.plan.model.utilisation_band`);
* the worker — :func:`run_allreduce` runs one rank (``nccl`` on GPU nodes, ``gloo`` elsewhere);
* ``python -m serving.node.fabric --rank R --world-size N --master ADDR:PORT …`` — what the preflight
  role ``preflight_fabric`` runs on every node of a group at once; it prints one JSON object.

One rank per node: the test measures the node-to-node path (one GPU and its NIC under NCCL, the
bootstrap interface under gloo), so the spec figure it is held against is one link's rate.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any, Literal

from serving.plan.model import UTILISATION_BY_LINK_GBPS, utilisation_band

Backend = Literal["nccl", "gloo"]
DEFAULT_SIZE_BYTES = 64 * 2**20
DEFAULT_ITERATIONS = 20
DEFAULT_WARMUP = 5
DEFAULT_MIN_EFFICIENCY = 0.8


def bus_factor(world_size: int) -> float:
    """nccl-tests' all-reduce correction: each rank moves 2(n−1)/n of the buffer over its link."""
    if world_size < 1:
        raise ValueError(f"world_size={world_size}: need at least one rank")
    return 2 * (world_size - 1) / world_size


def bus_bandwidth(size_bytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """``(algbw, busbw)`` in GB/s (10^9 B/s) for one all-reduce of ``size_bytes`` taking ``seconds``."""
    if seconds <= 0:
        raise ValueError(f"seconds={seconds}: an all-reduce takes positive time")
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * bus_factor(world_size)


GroupKind = Literal["pair", "rack"]


@dataclass(frozen=True)
class FabricGroup:
    """Nodes that run one all-reduce together; rank 0 (the first member) hosts the rendezvous."""

    name: str
    kind: GroupKind
    members: tuple[str, ...]
    master: str


def fabric_groups(nodes: Sequence[tuple[str, str, str]], base_port: int) -> dict[str, dict[GroupKind, dict[str, Any]]]:
    """Assign every ``(name, rack, address)`` node its pair group and its rack group.

    Pairs are consecutive nodes in inventory order (so they cross rack boundaries where racks
    meet); an odd node out joins the last pair as a group of three. Rack groups are all nodes of a
    rack. Each group gets its own rendezvous port (a node may lead one group of each kind). A group
    of one has nothing to measure and is left out. Returns ``{node: {"pair"|"rack": {group, rank,
    world_size, master}}}`` where ``master`` is ``ADDRESS:PORT`` of the group's first node.
    """
    address = {name: addr for name, _, addr in nodes}
    names = [name for name, _, _ in nodes]
    pairs = [names[i : i + 2] for i in range(0, len(names) - len(names) % 2, 2)]
    if len(names) % 2 and pairs:
        pairs[-1].append(names[-1])
    racks: dict[str, list[str]] = {}
    for name, rack, _ in nodes:
        racks.setdefault(rack, []).append(name)
    plan: list[tuple[str, GroupKind, list[str]]] = [(f"pair-{i}", "pair", p) for i, p in enumerate(pairs)]
    plan += [(rack, "rack", m) for rack, m in racks.items() if len(m) > 1]
    groups = [
        FabricGroup(name, kind, tuple(m), f"{address[m[0]]}:{base_port + i}") for i, (name, kind, m) in enumerate(plan)
    ]
    out: dict[str, dict[GroupKind, dict[str, Any]]] = {}
    for g in groups:
        for rank, member in enumerate(g.members):
            out.setdefault(member, {})[g.kind] = {
                "group": g.name,
                "rank": rank,
                "world_size": len(g.members),
                "master": g.master,
            }
    return out


@dataclass(frozen=True)
class AllReduceResult:
    backend: str
    world_size: int
    rank: int
    size_bytes: int
    iterations: int
    time_s: float
    algbw_gbs: float
    busbw_gbs: float

    @property
    def busbw_gbps(self) -> float:
        """Bus bandwidth in Gb/s, the unit link rates are sold in."""
        return self.busbw_gbs * 8


@dataclass(frozen=True)
class Assessment:
    passed: bool
    busbw_gbps: float
    expected_gbps: float
    efficiency: float
    observed: str
    expected: str
    fix: str | None


def _band_text(rate_gbps: float) -> str:
    lo, hi, note = utilisation_band(rate_gbps)
    return f"{lo:.0%}–{hi:.0%} GPU utilisation ({note})"


def assess(busbw_gbps: float, link_rate_gbps: float, min_efficiency: float = DEFAULT_MIN_EFFICIENCY) -> Assessment:
    """Hold a measured busbw against one link of the spec's fabric and the source's table (§3.3)."""
    need = link_rate_gbps * min_efficiency
    efficiency = busbw_gbps / link_rate_gbps
    observed = f"busbw {busbw_gbps:,.1f} Gb/s = {efficiency:.0%} of the {link_rate_gbps:g} Gb/s link"
    expected = f"≥ {need:,.1f} Gb/s ({min_efficiency:.0%} of {link_rate_gbps:g} Gb/s → {_band_text(link_rate_gbps)})"
    if busbw_gbps >= need:
        return Assessment(True, busbw_gbps, link_rate_gbps, efficiency, observed, expected, None)
    measured_band, link_band = _band_text(busbw_gbps), _band_text(link_rate_gbps)
    band = (  # said only where the shortfall changes the band (below 25 Gb/s both are "not in the table")
        f"The source's table puts {busbw_gbps:,.0f} Gb/s at {measured_band} instead of {link_band}. "
        if measured_band != link_band
        else ""
    )
    fix = (
        f"{band}Check every port of the group with ibstat (State Active, Rate {link_rate_gbps:g}), cabling and switch "
        "port errors (perfquery), and that NCCL uses the HCAs (NCCL_IB_HCA, NCCL_DEBUG=INFO); rerun with --tags fabric."
    )
    return Assessment(False, busbw_gbps, link_rate_gbps, efficiency, observed, expected, fix)


def utilisation_table() -> list[dict[str, Any]]:
    """The source's link-rate → GPU-utilisation table as plain data (for the inventory and docs)."""
    return [{"rate_gbps": r, "low": lo, "high": hi, "note": n} for r, lo, hi, n in UTILISATION_BY_LINK_GBPS]


def fabric_check(
    kind: GroupKind,
    group: Mapping[str, Any] | None,
    run: Mapping[str, Any] | None,
    *,
    link_rate_gbps: float,
    min_efficiency: float = DEFAULT_MIN_EFFICIENCY,
    timeout_s: float = 60.0,
) -> dict[str, Any]:
    """The preflight record entry (``fabric_pair``/``fabric_rack``) for one node's run of its group.

    ``group`` is the node's entry from :func:`fabric_groups` (None: not in such a group) and
    ``run`` what the ``fabric_allreduce`` module returned for it (its ``fabric`` dict; None when
    the task was skipped).
    """
    check = f"fabric_{kind}"
    if group is None or run is None:
        return {"check": check, "skip": f"no {kind} group with another reachable node"}
    name = f"{group['group']} ({group['world_size']} nodes)"
    if run.get("error"):
        return {
            "check": check,
            "passed": False,
            "observed": f"{name}: {run['error']}",
            "expected": f"the all-reduce completes within {timeout_s:g} s",
            "fix": f"Every node of {group['group']} must reach {group['master']} (TCP, the rendezvous) and run "
            "python -m serving.node.fabric with torch installed; read the error, check the firewall and "
            "preflight_fabric_python, and rerun with --tags fabric.",
        }
    a = assess(float(run["busbw_gbps"]), link_rate_gbps, min_efficiency)
    return {
        "check": check,
        "passed": a.passed,
        "observed": f"{name}, {run.get('backend', '?')}: {a.observed}",
        "expected": a.expected,
        "fix": a.fix,
    }


# ------------------------------------------------------------------------------------------ worker


def run_allreduce(
    *,
    rank: int,
    world_size: int,
    master: str,
    backend: Backend | Literal["auto"] = "auto",
    size_bytes: int = DEFAULT_SIZE_BYTES,
    iterations: int = DEFAULT_ITERATIONS,
    warmup: int = DEFAULT_WARMUP,
    timeout_s: float = 60.0,
) -> AllReduceResult:
    """Run this node's rank of an all-reduce benchmark and return the group's figures.

    ``master`` is ``ADDR:PORT`` of rank 0's TCP rendezvous; every rank must call this within
    ``timeout_s`` (the rendezvous and every collective are bounded by it). Time per iteration is
    the slowest rank's mean, as nccl-tests reports it.
    """
    warnings.filterwarnings("ignore", message=".*NumPy.*")
    try:
        import torch  # noqa: PLC0415 - heavy, only the worker needs it (the `node` extra)
        import torch.distributed as dist  # noqa: PLC0415
    except ImportError as exc:
        raise RuntimeError(
            f"{exc}: the fabric worker needs torch; install the node extra: pip install 'exaserve-deploy[node]'"
        ) from None

    use = backend if backend != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")
    device = torch.device("cuda", 0) if use == "nccl" else torch.device("cpu")
    dist.init_process_group(
        backend=use,
        init_method=f"tcp://{master}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    try:
        buf = torch.ones(size_bytes // 4, dtype=torch.float32, device=device)

        def sync() -> None:
            if use == "nccl":
                torch.cuda.synchronize(device)

        for _ in range(warmup):
            dist.all_reduce(buf)
        sync()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iterations):
            dist.all_reduce(buf)
        sync()
        mean = torch.tensor([(time.perf_counter() - start) / iterations], dtype=torch.float64, device=device)
        dist.all_reduce(mean, op=dist.ReduceOp.MAX)
        seconds = float(mean.item())
    finally:
        dist.destroy_process_group()
    algbw, busbw = bus_bandwidth(size_bytes, seconds, world_size)
    return AllReduceResult(use, world_size, rank, size_bytes, iterations, seconds, algbw, busbw)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m serving.node.fabric``: one rank, one JSON object on stdout."""
    p = argparse.ArgumentParser(prog="python -m serving.node.fabric", description=__doc__.splitlines()[0])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--master", required=True, help="ADDR:PORT of rank 0's rendezvous")
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto")
    p.add_argument("--size-mib", type=int, default=DEFAULT_SIZE_BYTES // 2**20)
    p.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS)
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP)
    p.add_argument("--timeout-s", type=float, default=60.0)
    p.add_argument("--ifname", help="interface for the gloo/NCCL bootstrap (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME)")
    args = p.parse_args(argv)
    if args.ifname:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", args.ifname)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", args.ifname)
    try:
        result = run_allreduce(
            rank=args.rank,
            world_size=args.world_size,
            master=args.master,
            backend=args.backend,
            size_bytes=args.size_mib * 2**20,
            iterations=args.iterations,
            warmup=args.warmup,
            timeout_s=args.timeout_s,
        )
    except (RuntimeError, ValueError, OSError) as exc:
        # torch raises RuntimeError (DistBackendError, DistStoreError) on timeouts and lost peers.
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}".strip()[:2000]}))
        return 1
    doc = asdict(result) | {"busbw_gbps": result.busbw_gbps}
    print(json.dumps({k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in doc.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
