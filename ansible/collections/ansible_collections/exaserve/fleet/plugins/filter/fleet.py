"""Filters of the ExaServe roles, used as ``exaserve.fleet.<name>``.

``preflight_report``, ``preflight_summary``, ``fabric_groups`` and ``fabric_check`` are thin shells over
the controller package ``serving`` (reached through plugin_utils/controller.py, which says why), tested
there; ``mount_unit`` and ``version_max`` stand alone.
"""

from __future__ import annotations

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


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "preflight_report": preflight_report,
            "preflight_summary": preflight_summary,
            "fabric_groups": fabric_groups,
            "fabric_check": fabric_check,
            "mount_unit": mount_unit,
            "version_max": version_max,
        }
