"""Probe reader: InfiniBand HCA and port state from ibstat (parsers and the reader).

Shared by the single-tool module ``ibstat_facts`` and ``preflight_facts``. Runs on the managed node.
"""

from __future__ import annotations

import re
from typing import Any

from ansible_collections.exaserve.fleet.plugins.module_utils.probe import Probe, ProbeParseError

_CA_HEADER = re.compile(r"^(?P<node_type>CA|Switch|Router|iWARP RNIC|\?\?\?):? '(?P<name>[^']+)'$")
_PORT_HEADER = re.compile(r"^Port (?P<port>\d+):$")
_RATE = re.compile(r"^(?P<value>\d+(?:\.\d+)?)(?P<fdr10> \(FDR10\))?$")

# ibstat label -> (fact key, converter)
_CA_FIELDS: dict[str, str] = {
    "Number of ports": "number_of_ports",
    "Firmware version": "firmware_version",
    "Hardware version": "hardware_version",
    "Node GUID": "node_guid",
    "System image GUID": "system_image_guid",
}
_PORT_FIELDS: dict[str, str] = {
    "State": "state",
    "Physical state": "physical_state",
    "Rate": "rate_gbps",
    "Base lid": "base_lid",
    "LMC": "lmc",
    "SM lid": "sm_lid",
    "Capability mask": "capability_mask",
    "Port GUID": "port_guid",
    "Link layer": "link_layer",
}
_INT_FIELDS = {"number_of_ports", "base_lid", "lmc", "sm_lid"}


def _parse_rate(text: str) -> tuple[int | float, bool]:
    """`400` -> (400, False); `2.5` -> (2.5, False); `40 (FDR10)` -> (40, True)."""
    match = _RATE.match(text)
    if match is None:
        raise ProbeParseError(f"unrecognised Rate value {text!r}")
    value = float(match.group("value"))
    return (int(value) if value.is_integer() else value), match.group("fdr10") is not None


def parse_ibstat(text: str) -> dict[str, Any]:
    """Parse the full output of `ibstat` (all adapters, all ports) into the `ibstat` fact."""
    cas: list[dict[str, Any]] = []
    ports: list[dict[str, Any]] = []
    ca: dict[str, Any] | None = None
    port: dict[str, Any] | None = None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        header = _CA_HEADER.match(line)
        if header is not None:
            ca = {"name": header.group("name"), "node_type": header.group("node_type")}
            cas.append(ca)
            port = None
            continue
        if ca is None:
            raise ProbeParseError(f"line {lineno}: {line!r} comes before any \"CA '<name>'\" header")
        port_header = _PORT_HEADER.match(line)
        if port_header is not None:
            port = {"ca": ca["name"], "port": int(port_header.group("port"))}
            ports.append(port)
            continue
        label, sep, value = line.partition(":")
        if not sep:
            raise ProbeParseError(f"line {lineno}: {line!r} is not 'Label: value'")
        label, value = label.strip(), value.strip()
        if port is None:
            if label.endswith(" type"):
                ca["ca_type"] = value
                continue
            key = _CA_FIELDS.get(label)
            target = ca
        else:
            key = _PORT_FIELDS.get(label)
            target = port
        if key is None:
            # Newer rdma-core releases may add lines; keep them rather than fail.
            key = re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")
            target[key] = value
        elif key == "rate_gbps":
            target["rate_gbps"], target["fdr10"] = _parse_rate(value)
        elif key in _INT_FIELDS:
            target[key] = int(value)
        else:
            target[key] = value
    return {"ca_count": len(cas), "cas": cas, "ports": ports}


def read_ibstat(probe: Probe) -> dict[str, Any]:
    """The `ibstat` fact."""
    ibstat = probe.find(
        "ibstat",
        "Install the RDMA userspace tools: 'apt-get install infiniband-diags' (or rdma-core / MLNX_OFED), then re-run.",
    )
    _rc, out, _err = probe.run(
        [ibstat],
        fix="Check that the HCA driver is loaded ('lsmod | grep mlx5_ib', 'rdma link') and that /dev/infiniband/umad* exists.",
    )
    return {"ibstat": probe.parse("ibstat", parse_ibstat, out)}
