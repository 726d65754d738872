"""Filters for the ExaServe roles; the logic lives in the ``serving`` package, tested there."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ansible.errors import AnsibleFilterError


def exaserve_report(results: Mapping[str, Any], stack: str, aborted: Sequence[str] = ()) -> dict[str, Any]:
    """``{host: preflight_results}`` -> the preflight report (serving.checks.preflight.build_report);
    ``aborted`` are hosts that left the play on an unexpected task error."""
    from serving.checks.preflight import build_report  # noqa: PLC0415

    return dict(build_report(stack, {h: (dict(r) if r else None) for h, r in results.items()}, aborted=aborted))


def exaserve_summary(report: Mapping[str, Any]) -> list[str]:
    """The report's human summary lines."""
    from serving.checks.preflight import summary_lines  # noqa: PLC0415

    return summary_lines(report)  # type: ignore[arg-type]


def exaserve_fabric_groups(nodes: Sequence[Sequence[str]], base_port: int) -> dict[str, Any]:
    """``[[host, rack, address], …]`` (live hosts, inventory order) -> each host's pair and rack group."""
    from serving.node.fabric import fabric_groups  # noqa: PLC0415

    try:
        return dict(fabric_groups([(str(n), str(r), str(a)) for n, r, a in nodes], int(base_port)))
    except (TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"exaserve_fabric_groups: {exc}") from exc


def exaserve_fabric_check(
    run: Mapping[str, Any] | None,
    kind: str,
    group: Mapping[str, Any] | None,
    link_rate_gbps: float,
    min_efficiency: float,
    timeout_s: float,
) -> dict[str, Any]:
    """A registered fabric_allreduce result -> the fabric_pair/fabric_rack record entry."""
    from serving.node.fabric import fabric_check  # noqa: PLC0415

    if kind not in ("pair", "rack"):
        raise AnsibleFilterError(f"exaserve_fabric_check: kind {kind!r} is not pair or rack")
    result = None if not run or run.get("skipped") else run.get("fabric")
    return fabric_check(
        kind,  # type: ignore[arg-type]
        group or None,
        result,
        link_rate_gbps=float(link_rate_gbps),
        min_efficiency=float(min_efficiency),
        timeout_s=float(timeout_s),
    )


def exaserve_mount_unit(path: str) -> str:
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


def exaserve_version_max(versions: Sequence[str]) -> str:
    """The highest of dotted versions, compared numerically (``12.10`` > ``12.6``)."""
    try:
        return max((str(v) for v in versions if v), key=lambda v: tuple(int(x) for x in v.split(".")))
    except ValueError as exc:
        raise AnsibleFilterError(f"exaserve_version_max: {list(versions)!r} are not dotted numbers ({exc})") from exc


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "exaserve_report": exaserve_report,
            "exaserve_summary": exaserve_summary,
            "exaserve_fabric_groups": exaserve_fabric_groups,
            "exaserve_fabric_check": exaserve_fabric_check,
            "exaserve_mount_unit": exaserve_mount_unit,
            "exaserve_version_max": exaserve_version_max,
        }
