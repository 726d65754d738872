"""Reading the hashed requirement files scripts/lock.sh exports (requirements*.lock): each pin with its hashes."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.markers import Marker
from packaging.utils import canonicalize_name

PIN = re.compile(r"^(?P<name>[A-Za-z0-9._-]+)==(?P<version>\S+)(?: ; (?P<marker>.+?))? \\$")


def pins(path: Path) -> dict[str, tuple[str, list[str]]]:
    """``name → (version, hashes)`` of the requirements that apply to this interpreter."""
    out: dict[str, tuple[str, list[str]]] = {}
    name = ""
    for line in path.read_text().splitlines():
        if m := PIN.match(line):
            name = ""
            if m["marker"] is None or Marker(m["marker"]).evaluate():
                name = canonicalize_name(m["name"])
                out[name] = (m["version"], [])
        elif name and (h := re.match(r"^\s+--hash=(sha256:[0-9a-f]{64})", line)):
            out[name][1].append(h[1])
        elif line and not line.startswith(("#", " ")):
            raise AssertionError(f"{path.name}: a line that is no pinned requirement: {line!r}")
    return out
