"""Probe reader: /etc/os-release, as os-release(5) defines it (parser and reader).

Shared by the single-tool module ``os_release_facts`` and ``preflight_facts``. Runs on the managed node.
"""

from __future__ import annotations

import shlex
from typing import Any

from ansible_collections.exaserve.fleet.plugins.module_utils.probe import Probe, ProbeParseError

PATHS = ("/etc/os-release", "/usr/lib/os-release")


def parse_os_release(text: str) -> dict[str, str]:
    """os-release(5): KEY=VALUE lines, values in shell quoting, comments and blank lines ignored."""
    out: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.replace("_", "").isalnum():
            raise ProbeParseError(f"line {lineno}: {line!r} is not KEY=VALUE")
        try:
            words = shlex.split(value)
        except ValueError as exc:
            raise ProbeParseError(f"line {lineno}: {exc}") from exc
        out[key.lower()] = " ".join(words)
    out.setdefault("id", "linux")  # os-release(5) default
    return out


def read_os_release(probe: Probe) -> dict[str, Any]:
    """The `os_release` fact."""
    for path in PATHS:
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
            break
        except FileNotFoundError:
            continue
    else:
        probe.fail(f"none of {', '.join(PATHS)} exists; the node is not a systemd-era Linux")
    return {"os_release": probe.parse(path, parse_os_release, text)}
