"""Probe reader: the GPU inventory from nvidia-smi (parsers and the reader).

Shared by the single-tool module ``nvidia_smi_facts`` and ``preflight_facts``. Runs on the managed node.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ansible_collections.exaserve.fleet.plugins.module_utils.probe import Probe, ProbeParseError

QUERY_FIELDS: tuple[str, ...] = ("index", "name", "memory.total", "memory.used", "driver_version")
QUERY_ARGS: tuple[str, ...] = (
    "--query-gpu=" + ",".join(QUERY_FIELDS),
    "--format=csv,noheader,nounits",
)
# Units nvidia-smi prints in a CSV header ("memory.total [MiB]") and after values ("81559 MiB").
_UNITS: dict[str, str] = {
    "memory.total": "MiB",
    "memory.used": "MiB",
    "memory.free": "MiB",
    "utilization.gpu": "%",
    "utilization.memory": "%",
    "power.draw": "W",
    "power.limit": "W",
    "clocks.sm": "MHz",
    "clocks.mem": "MHz",
}
_UNIT_SUFFIX: dict[str, str] = {"MiB": "mib", "%": "pct", "W": "w", "MHz": "mhz"}
_HEADER_FIELD = re.compile(r"^(?P<field>[a-z0-9_.]+)(?: \[(?P<unit>[^\]]+)\])?$")
_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?$")
_NOT_AVAILABLE = {"[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]"}
_CUDA_VERSION = re.compile(r"CUDA Version:\s*(?P<version>\d+\.\d+)")
_DRIVER_VERSION = re.compile(r"Driver Version:\s*(?P<version>[0-9.]+)")


def fact_key(field: str, unit: str | None) -> str:
    """`memory.total` + `MiB` -> `memory_total_mib`; `name` -> `name`."""
    key = field.replace(".", "_")
    return f"{key}_{_UNIT_SUFFIX.get(unit, unit.lower())}" if unit else key


def _value(cell: str, unit: str | None) -> str | int | float | None:
    if cell in _NOT_AVAILABLE:
        return None
    if unit and cell.endswith(" " + unit):
        cell = cell[: -len(unit) - 1]
    if _NUMBER.match(cell):
        number = float(cell)
        return int(number) if "." not in cell else number
    return cell


def parse_query_csv(text: str, fields: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Parse `nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]` output.

    With `fields` None the first line must be the CSV header nvidia-smi prints (units in
    brackets); otherwise `fields` names the queried columns of a `noheader` output. Numbers become
    int/float, `[N/A]`-style cells become None, unit suffixes ("81559 MiB") are stripped.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if fields is None:
        if not lines:
            raise ProbeParseError("empty output: expected a CSV header line")
        columns: list[tuple[str, str | None]] = []
        for name in (part.strip() for part in lines[0].split(",")):
            match = _HEADER_FIELD.match(name)
            if match is None:
                raise ProbeParseError(f"unrecognised CSV header column {name!r}")
            columns.append((match.group("field"), match.group("unit")))
        lines = lines[1:]
    else:
        columns = [(field, _UNITS.get(field)) for field in fields]
    gpus = []
    for line in lines:
        # `name` is the only free-text column and nvidia-smi does not quote it; GPU names do not
        # contain ", " so a plain split is exact.
        cells = [cell.strip() for cell in line.split(", ")]
        if len(cells) != len(columns):
            raise ProbeParseError(f"row {line!r} has {len(cells)} columns, the query has {len(columns)}")
        gpus.append({fact_key(f, u): _value(c, u) for (f, u), c in zip(columns, cells, strict=True)})
    return gpus


def parse_summary_versions(text: str) -> dict[str, str | None]:
    """Driver and CUDA version from the header of the plain `nvidia-smi` summary."""
    cuda = _CUDA_VERSION.search(text)
    driver = _DRIVER_VERSION.search(text)
    return {
        "driver_version": driver.group("version") if driver else None,
        "cuda_version": cuda.group("version") if cuda else None,
    }


def build_facts(query_output: str, summary_output: str) -> dict[str, Any]:
    """The `nvidia_smi` fact from the module's query output and the plain summary."""
    gpus = parse_query_csv(query_output, QUERY_FIELDS)
    versions = parse_summary_versions(summary_output)
    drivers = sorted({str(gpu["driver_version"]) for gpu in gpus})
    if len(drivers) > 1:
        raise ProbeParseError(f"GPUs report different driver versions {drivers}")
    return {
        "gpu_count": len(gpus),
        "driver_version": drivers[0] if drivers else versions["driver_version"],
        "cuda_version": versions["cuda_version"],
        "gpus": gpus,
    }


NVML_ERROR_NOT_FOUND = 6  # nvidia-smi exits with the NVML return code


def failure_fix(rc: int) -> str:
    """The fix for a failed nvidia-smi run, by its exit code (the NVML return code)."""
    if rc == NVML_ERROR_NOT_FOUND:
        return (
            "The driver sees no GPU: check 'lspci | grep -i nvidia' and the PCIe/BIOS settings, "
            "reseat or replace the GPUs."
        )
    return (
        "The driver is installed but not working: check 'dmesg | grep -i nvrm' and that the "
        "kernel module matches the running kernel (reinstall the driver or its DKMS module), "
        "then reboot."
    )


def read_nvidia_smi(probe: Probe) -> dict[str, Any]:
    """The `nvidia_smi` fact (two nvidia-smi runs: the query and the summary)."""
    nvidia_smi = probe.find(
        "nvidia-smi",
        "The NVIDIA driver is missing. Install the NVIDIA datacenter driver (it ships nvidia-smi), reboot, then re-run.",
    )
    _rc, query, _err = probe.run([nvidia_smi, *QUERY_ARGS], fix=failure_fix)
    _rc, summary, _err = probe.run([nvidia_smi], fix=failure_fix)
    return {"nvidia_smi": probe.parse("nvidia-smi", build_facts, query, summary)}
