#!/usr/bin/python
"""Ansible module: kernel release and cgroup hierarchy, the two kernel facts preflight checks."""

from __future__ import annotations

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
author: ExaServe platform team (@exaserve-platform)
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
        unified_mountpoint: {description: "Where the v2 hierarchy is mounted, if anywhere", type: str, sample: /sys/fs/cgroup}
        controllers:
          description: Controllers available (v2 cgroup.controllers, or the v1 hierarchies)
          type: list
          elements: str
          sample: [cpu, io, memory, pids]
"""

from typing import Any

from ansible_collections.exaserve.fleet.plugins.module_utils.kernel import read_kernel
from ansible_collections.exaserve.fleet.plugins.module_utils.probe import Probe

ARGUMENT_SPEC: dict[str, Any] = {}  # no options (DOCUMENTATION says so too)


def main() -> None:
    probe = Probe("kernel_facts", ARGUMENT_SPEC)
    probe.report(read_kernel)


if __name__ == "__main__":
    main()
