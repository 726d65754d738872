"""Probe reader: clock synchronisation state from chronyc tracking (parsers and the reader).

Shared by the single-tool module ``chrony_facts`` and ``preflight_facts``. Runs on the managed node.
"""

from __future__ import annotations

import calendar
import time
from typing import Any

from ansible_collections.exaserve.fleet.plugins.module_utils.probe import Probe, ProbeParseError

# Field order of `chronyc -c tracking` (chrony client.c, process_cmd_tracking).
CSV_FIELDS: tuple[str, ...] = (
    "reference_id",
    "reference_name",
    "stratum",
    "ref_time_epoch_s",
    "system_time_offset_s",
    "last_offset_s",
    "rms_offset_s",
    "frequency_ppm",
    "residual_freq_ppm",
    "skew_ppm",
    "root_delay_s",
    "root_dispersion_s",
    "update_interval_s",
    "leap_status",
)
_TEXT_LABELS: dict[str, str] = {
    "Stratum": "stratum",
    "Ref time (UTC)": "ref_time_epoch_s",
    "System time": "system_time_offset_s",
    "Last offset": "last_offset_s",
    "RMS offset": "rms_offset_s",
    "Frequency": "frequency_ppm",
    "Residual freq": "residual_freq_ppm",
    "Skew": "skew_ppm",
    "Root delay": "root_delay_s",
    "Root dispersion": "root_dispersion_s",
    "Update interval": "update_interval_s",
    "Leap status": "leap_status",
}
NOT_SYNCHRONISED = "Not synchronised"


def _finish(facts: dict[str, Any]) -> dict[str, Any]:
    missing = [field for field in CSV_FIELDS if field not in facts]
    if missing:
        raise ProbeParseError(f"tracking report lacks {', '.join(missing)}")
    facts["synchronised"] = facts["leap_status"] != NOT_SYNCHRONISED
    return {field: facts[field] for field in (*CSV_FIELDS, "synchronised")}


def parse_tracking_csv(text: str) -> dict[str, Any]:
    """Parse `chronyc -c tracking`. chronyc prints the System time field as the correction to
    apply (positive = clock behind); the fact flips it to clock minus NTP time."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) != 1:
        raise ProbeParseError(f"expected one CSV line, got {len(lines)}: {text.strip()!r}")
    cells = lines[0].split(",")
    if len(cells) != len(CSV_FIELDS):
        raise ProbeParseError(f"expected {len(CSV_FIELDS)} CSV fields, got {len(cells)}: {lines[0]!r}")
    facts: dict[str, Any] = dict(zip(CSV_FIELDS, cells, strict=True))
    try:
        facts["stratum"] = int(facts["stratum"])
        for field in CSV_FIELDS[3:13]:
            facts[field] = float(facts[field]) + 0.0  # +0.0: chronyc prints -0.000 for tiny negatives
    except ValueError as exc:
        raise ProbeParseError(f"non-numeric field in {lines[0]!r}: {exc}") from exc
    facts["system_time_offset_s"] = -facts["system_time_offset_s"] + 0.0  # +0.0: never -0.0
    return _finish(facts)


def _signed(value: str, unit: str, field: str) -> float:
    """`0.000006523 seconds slow` -> -6.523e-06 (slow = behind); `3.225 ppm fast` -> 3.225."""
    parts = value.split()
    if len(parts) != 3 or parts[1] != unit or parts[2] not in ("fast", "slow"):
        raise ProbeParseError(f"{field}: unrecognised value {value!r}")
    magnitude = float(parts[0])
    return magnitude if parts[2] == "fast" else -magnitude + 0.0  # +0.0: "0.000 slow" is 0.0, not -0.0


def _number(value: str, unit: str, field: str) -> float:
    parts = value.split()
    if len(parts) != 2 or parts[1] != unit:
        raise ProbeParseError(f"{field}: expected '<number> {unit}', got {value!r}")
    return float(parts[0]) + 0.0  # +0.0: chronyc prints -0.000 for tiny negatives


def parse_tracking_text(text: str) -> dict[str, Any]:
    """Parse the human-readable `chronyc tracking` report."""
    facts: dict[str, Any] = {}
    for line in text.splitlines():
        label, sep, value = line.partition(":")
        label, value = label.strip(), value.strip()
        if not sep or not label:
            continue
        if label == "Reference ID":
            ref_id, _space, name = value.partition(" ")
            facts["reference_id"] = ref_id
            facts["reference_name"] = name.strip().removeprefix("(").removesuffix(")")
            continue
        field = _TEXT_LABELS.get(label)
        try:
            if field is None:
                continue
            if field == "stratum":
                facts[field] = int(value)
            elif field == "ref_time_epoch_s":
                facts[field] = float(calendar.timegm(time.strptime(value, "%a %b %d %H:%M:%S %Y")))
            elif field == "system_time_offset_s":
                facts[field] = _signed(value.removesuffix(" of NTP time"), "seconds", label)
            elif field == "frequency_ppm":
                facts[field] = _signed(value, "ppm", label)
            elif field.endswith("_ppm"):
                facts[field] = _number(value, "ppm", label)
            elif field.endswith("_s"):
                facts[field] = _number(value, "seconds", label)
            else:
                facts[field] = value
        except ValueError as exc:
            raise ProbeParseError(f"{label}: {exc}") from exc
    return _finish(facts)


def read_chrony(probe: Probe, output_format: str = "csv") -> dict[str, Any]:
    """The `chrony` fact, from `chronyc -c tracking` (csv) or `chronyc tracking` (text)."""
    chronyc = probe.find(
        "chronyc", "Install and enable chrony: 'apt-get install chrony && systemctl enable --now chrony', then re-run."
    )
    csv = output_format == "csv"
    args = [chronyc, "-c", "tracking"] if csv else [chronyc, "tracking"]
    _rc, out, _err = probe.run(
        args,
        fix="chronyd is not answering: start it with 'systemctl enable --now chrony' and check 'journalctl -u chrony'.",
    )
    return {"chrony": probe.parse("chronyc tracking", parse_tracking_csv if csv else parse_tracking_text, out)}
