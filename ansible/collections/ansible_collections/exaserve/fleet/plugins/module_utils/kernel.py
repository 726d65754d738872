"""Probe reader: the kernel release and the cgroup hierarchy at /sys/fs/cgroup (parsers and the reader).

Shared by the single-tool module ``kernel_facts`` and ``preflight_facts``. Runs on the managed node.
"""

from __future__ import annotations

import os
import re
from typing import Any

from ansible_collections.exaserve.fleet.plugins.module_utils.probe import Probe, ProbeParseError

CGROUP_ROOT = "/sys/fs/cgroup"
_KERNEL_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")
_V1_OPTIONS_NOT_CONTROLLERS = {
    "rw",
    "ro",
    "nosuid",
    "nodev",
    "noexec",
    "relatime",
    "noatime",
    "xattr",
    "clone_children",
    "noprefix",
    "cpuset_v2_mode",
}


def kernel_version(release: str) -> str:
    """`5.15.0-91-generic` -> `5.15.0`; `2.6.78-fc-v769` -> `2.6.78`; `6.8` -> `6.8.0`."""
    match = _KERNEL_VERSION.match(release)
    if match is None:
        raise ProbeParseError(f"kernel release {release!r} does not start with <major>.<minor>")
    return f"{match.group(1)}.{match.group(2)}.{match.group(3) or 0}"


def _unescape(path: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\040-style octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def parse_mountinfo(text: str) -> list[dict[str, Any]]:
    """Mount point, filesystem type and super options of every line of /proc/<pid>/mountinfo."""
    mounts = []
    for line in text.splitlines():
        if not line.strip():
            continue
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 6 or len(tail) < 2:
            raise ProbeParseError(f"unrecognised mountinfo line {line!r}")
        options = tail[2].split(",") if len(tail) > 2 else []
        mounts.append({"mountpoint": _unescape(fields[4]), "fstype": tail[0], "super_options": options})
    return mounts


def cgroup_layout(mounts: list[dict[str, Any]], v2_controllers: str | None) -> dict[str, Any]:
    """Classify the hierarchy at /sys/fs/cgroup; `v2_controllers` is the text of
    cgroup.controllers of the v2 mount (None when there is none)."""
    visible: dict[str, dict[str, Any]] = {}
    for mount in mounts:  # later mounts hide earlier ones at the same place
        visible[mount["mountpoint"]] = mount
    root = visible.get(CGROUP_ROOT)
    under_root = [m for p, m in visible.items() if p.startswith(CGROUP_ROOT + "/")]
    unified = next(
        (
            p
            for p, m in visible.items()
            if m["fstype"] == "cgroup2" and (p == CGROUP_ROOT or p.startswith(CGROUP_ROOT + "/"))
        ),
        None,
    )
    v1 = [m for m in under_root if m["fstype"] == "cgroup"]
    if root is not None and root["fstype"] == "cgroup2":
        version, mode = 2, "unified"
    elif v1:
        version, mode = 1, "hybrid" if unified else "legacy"
    else:
        version, mode = 0, "none"
    if version == 2:
        controllers = sorted((v2_controllers or "").split())
    else:
        controllers = sorted(
            {
                opt
                for m in v1
                for opt in m["super_options"]
                if opt not in _V1_OPTIONS_NOT_CONTROLLERS and not opt.startswith(("name=", "release_agent="))
            }
        )
    return {
        "version": version,
        "mode": mode,
        "fstype": root["fstype"] if root is not None else None,
        "unified_mountpoint": unified,
        "controllers": controllers,
    }


def read_cgroup_facts() -> dict[str, Any]:
    """The thin I/O shell around `parse_mountinfo` and `cgroup_layout`."""
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        mounts = parse_mountinfo(handle.read())
    controllers = None
    if cgroup_layout(mounts, None)["version"] == 2:
        with open(os.path.join(CGROUP_ROOT, "cgroup.controllers"), encoding="utf-8") as handle:
            controllers = handle.read()
    return cgroup_layout(mounts, controllers)


def read_kernel(probe: Probe) -> dict[str, Any]:
    """The `host_kernel` and `cgroup` facts."""
    release = os.uname().release
    try:
        cgroup = probe.parse("/proc/self/mountinfo", read_cgroup_facts)
    except OSError as exc:
        probe.fail(f"could not read kernel facts: {exc}. Check that /proc and /sys/fs/cgroup are mounted on the node.")
    return {
        "host_kernel": {"release": release, "version": probe.parse("uname -r", kernel_version, release)},
        "cgroup": cgroup,
    }
