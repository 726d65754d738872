"""Filters of the ExaServe roles, used as ``exaserve.fleet.<name>``.

``preflight_report``, ``preflight_summary``, ``fabric_groups`` and ``fabric_check`` are thin shells over
the controller package ``serving`` (reached through plugin_utils/controller.py, which says why), tested
there; ``mount_unit``, ``version_max`` and ``kubelet_reserved_cpu`` stand alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.exaserve.fleet.plugins.plugin_utils.controller import controller


def preflight_report(results: Mapping[str, Any], stack: str, aborted: Sequence[str] = ()) -> dict[str, Any]:
    """``{host: preflight_results}`` -> the preflight report (serving.checks.preflight.build_report);
    ``aborted`` are hosts that left the play early. Those that left at a failed ``ssh`` check (stopped on
    purpose: unreachable, or cannot run modules) are reported by that check; the others left on an
    unexpected task error."""
    preflight = controller("serving.checks.preflight", "filter exaserve.fleet.preflight_report")
    recorded = {h: (dict(r) if r else None) for h, r in results.items()}
    unexpected = [h for h in aborted if ((recorded.get(h) or {}).get("ssh") or {}).get("status") != "fail"]
    return dict(preflight.build_report(stack, recorded, aborted=unexpected))


def preflight_summary(report: Mapping[str, Any]) -> list[str]:
    """The report's human summary lines."""
    preflight = controller("serving.checks.preflight", "filter exaserve.fleet.preflight_summary")
    return list(preflight.summary_lines(report))


def fabric_groups(nodes: Sequence[Sequence[str]], base_port: int) -> dict[str, Any]:
    """``[[host, rack, address], …]`` (live hosts, inventory order) -> each host's pair and rack group."""
    fabric = controller("serving.node.fabric", "filter exaserve.fleet.fabric_groups")
    try:
        return dict(fabric.fabric_groups([(str(n), str(r), str(a)) for n, r, a in nodes], int(base_port)))
    except (TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"exaserve.fleet.fabric_groups: {exc}") from exc


def fabric_check(
    run: Mapping[str, Any] | None,
    kind: str,
    group: Mapping[str, Any] | None,
    link_rate_gbps: float,
    min_efficiency: float,
    timeout_s: float,
) -> dict[str, Any]:
    """A registered fabric_allreduce result -> the fabric_pair/fabric_rack record entry."""
    fabric = controller("serving.node.fabric", "filter exaserve.fleet.fabric_check")
    if kind not in ("pair", "rack"):
        raise AnsibleFilterError(f"exaserve.fleet.fabric_check: kind {kind!r} is not pair or rack")
    result = None if not run or run.get("skipped") else run.get("fabric")
    return dict(
        fabric.fabric_check(
            kind,
            group or None,
            result,
            link_rate_gbps=float(link_rate_gbps),
            min_efficiency=float(min_efficiency),
            timeout_s=float(timeout_s),
        )
    )


def mount_unit(path: str) -> str:
    """systemd's mount unit name for a path (``systemd-escape --path --suffix=mount``)."""
    parts = [p for p in path.split("/") if p]
    if not parts:
        return "-.mount"
    out = []
    for i, part in enumerate(parts):
        chars = []
        for j, ch in enumerate(part):
            if (ch.isalnum() and ch.isascii()) or ch in ":_" or (ch == "." and (i or j)):
                chars.append(ch)
            else:
                chars.append("".join(f"\\x{b:02x}" for b in ch.encode()))
        out.append("".join(chars))
    return "-".join(out) + ".mount"


def version_max(versions: Sequence[str]) -> str:
    """The highest of dotted versions, compared numerically (``12.10`` > ``12.6``)."""
    try:
        return max((str(v) for v in versions if v), key=lambda v: tuple(int(x) for x in v.split(".")))
    except ValueError as exc:
        raise AnsibleFilterError(
            f"exaserve.fleet.version_max: {list(versions)!r} are not dotted numbers ({exc})"
        ) from exc


_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m?)$")


def _cpu_milli(quantity: str, where: str) -> int:
    """A CPU quantity (``2``, ``1.5``, ``500m``) in millicores."""
    m = _QUANTITY.match(quantity.strip())
    if not m:
        raise AnsibleFilterError(f"exaserve.fleet.kubelet_reserved_cpu: {where} cpu={quantity!r} is not a CPU quantity")
    value = float(m.group(1))
    return round(value if m.group(2) else value * 1000)


def _cpuset_size(cpus: str) -> int:
    """The CPUs of a cpuset list (``0-1,4``: 3)."""
    size = 0
    for part in filter(None, (p.strip() for p in cpus.split(","))):
        bounds = part.split("-", 1)  # "4" or "0-3"
        if not all(b.isdigit() for b in bounds):
            raise AnsibleFilterError(f"exaserve.fleet.kubelet_reserved_cpu: reserved CPUs {cpus!r} are not a cpuset")
        size += int(bounds[-1]) - int(bounds[0]) + 1
    return size


def _reserved_map(value: str) -> dict[str, str]:
    """``--kube-reserved=cpu=1,memory=2Gi`` -> ``{"cpu": "1", "memory": "2Gi"}``."""
    return dict(kv.split("=", 1) for kv in value.split(",") if "=" in kv)


def kubelet_reserved_cpu(args: Sequence[str], config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The CPU the kubelet reserves with these flags over this KubeletConfiguration (``config.yaml``), as it works
    it out: a flag replaces the config file's field (flags take precedence over the file), ``--reserved-cpus`` /
    ``reservedSystemCPUs`` overwrites the CPU of both reservations with its count (kubernetes
    ``cmd/kubelet/app/server.go``, ``run``), else ``kubeReserved.cpu + systemReserved.cpu``. The static CPU manager
    refuses to start when that is zero (``pkg/kubelet/cm/cpumanager/cpu_manager.go``, ``NewManager``: "the static
    policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero"), so ``--kube-reserved=memory=2Gi``
    reserves no CPU. Returns ``{"milli": int, "source": str}``."""
    cfg = dict(config or {})
    flags = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in args if a.startswith("--") and "=" in a}
    cpus = flags.get("--reserved-cpus", cfg.get("reservedSystemCPUs") or "")
    if str(cpus).strip():
        n = _cpuset_size(str(cpus))
        where = "--reserved-cpus" if "--reserved-cpus" in flags else "config reservedSystemCPUs"
        return {"milli": n * 1000, "source": f"{where} {cpus} ({n} CPUs)"}
    total, parts = 0, []
    for flag, field in (("--kube-reserved", "kubeReserved"), ("--system-reserved", "systemReserved")):
        reserved = _reserved_map(flags[flag]) if flag in flags else dict(cfg.get(field) or {})
        if "cpu" in reserved:
            where = flag if flag in flags else f"config {field}"
            total += _cpu_milli(str(reserved["cpu"]), where)
            parts.append(f"{where} cpu={reserved['cpu']}")
    return {"milli": total, "source": " + ".join(parts) or "no CPU reservation"}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "preflight_report": preflight_report,
            "preflight_summary": preflight_summary,
            "fabric_groups": fabric_groups,
            "fabric_check": fabric_check,
            "mount_unit": mount_unit,
            "version_max": version_max,
            "kubelet_reserved_cpu": kubelet_reserved_cpu,
        }
