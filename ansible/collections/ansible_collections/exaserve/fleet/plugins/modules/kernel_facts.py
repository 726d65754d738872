#!/usr/bin/python
"""Ansible module: kernel release and cgroup hierarchy, the two kernel facts preflight checks."""

from __future__ import annotations

import os
import re
from typing import Any

from ansible_collections.exaserve.fleet.plugins.module_utils.probe import Probe, ProbeParseError

DOCUMENTATION = r"""
---
module: kernel_facts
short_description: Read the kernel release and the cgroup hierarchy (v1, hybrid or v2) as facts
description:
  - Returns C(host_kernel) (the release as uname reports it and its numeric version) and
    C(cgroup) (which cgroup hierarchy is mounted at /sys/fs/cgroup and its controllers),
    without running gather_facts.
  - The cgroup version comes from the filesystem type mounted at /sys/fs/cgroup in
    /proc/self/mountinfo, the same thing C(stat -fc %T /sys/fs/cgroup) prints
    (C(cgroup2fs) on a unified v2 host, C(tmpfs) on a v1 or hybrid host).
version_added: "0.1.0"
author: ExaServe platform team
extends_documentation_fragment: [exaserve.fleet.read_only]
options: {}
"""

EXAMPLES = r"""
- name: Read kernel and cgroup facts
  exaserve.fleet.kernel_facts:

- name: Kernel 5.15 or newer with the unified cgroup v2 hierarchy
  ansible.builtin.assert:
    that:
      - host_kernel.version is version('5.15', '>=')
      - cgroup.version == 2
    fail_msg: >-
      {{ inventory_hostname }}: kernel {{ host_kernel.release }}, cgroup {{ cgroup.mode }};
      need kernel >= 5.15 and cgroup v2. Upgrade the kernel (Ubuntu 22.04 ships 5.15) and boot
      with systemd.unified_cgroup_hierarchy=1.
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: success
  type: dict
  contains:
    host_kernel:
      description: The running kernel as uname reports it to this process.
      type: dict
      contains:
        release: {description: uname -r, type: str, sample: 5.15.0-91-generic}
        version: {description: Numeric major.minor.patch from the release, type: str, sample: 5.15.0}
    cgroup:
      description: The cgroup hierarchy mounted at /sys/fs/cgroup.
      type: dict
      contains:
        version: {description: "2 (unified), 1 (legacy or hybrid) or 0 (nothing mounted)", type: int, sample: 2}
        mode: {description: "unified, hybrid, legacy or none", type: str, sample: unified}
        fstype: {description: Filesystem type at /sys/fs/cgroup, type: str, sample: cgroup2}
        unified_mountpoint: {description: Where the v2 hierarchy is mounted, if anywhere, type: str, sample: /sys/fs/cgroup}
        controllers: {description: Controllers available (v2 cgroup.controllers, or the v1 hierarchies), type: list, elements: str, sample: [cpu, io, memory, pids]}
"""

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


ARGUMENT_SPEC: dict[str, Any] = {}  # no options (DOCUMENTATION says so too)


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


def main() -> None:
    probe = Probe("kernel_facts", ARGUMENT_SPEC)
    release = os.uname().release
    try:
        cgroup = probe.parse("/proc/self/mountinfo", read_cgroup_facts)
    except OSError as exc:
        probe.fail(f"could not read kernel facts: {exc}. Check that /proc and /sys/fs/cgroup are mounted on the node.")
    probe.facts(
        host_kernel={"release": release, "version": probe.parse("uname -r", kernel_version, release)}, cgroup=cgroup
    )


if __name__ == "__main__":
    main()
