#!/usr/bin/python
"""Ansible module: /etc/os-release as JSON facts (the reach probe of preflight: one light round trip)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: os_release_facts
short_description: Read /etc/os-release (ID, VERSION_ID, PRETTY_NAME) as facts
description:
  - Parses C(/etc/os-release) (or C(/usr/lib/os-release), as os-release(5) says) into the
    C(os_release) fact. Much lighter than C(setup), so preflight also uses it as its
    reachability probe.
version_added: "0.1.0"
author: ExaServe platform team (@exaserve-platform)
extends_documentation_fragment: [exaserve.fleet.read_only]
options: {}
"""

EXAMPLES = r"""
- name: Read the OS release
  exaserve.fleet.os_release_facts:

- name: Ubuntu 22.04
  ansible.builtin.assert:
    that: ansible_facts.os_release.id == 'ubuntu' and ansible_facts.os_release.version_id == '22.04'
    fail_msg: "{{ inventory_hostname }} runs {{ ansible_facts.os_release.pretty_name }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: success
  type: dict
  contains:
    os_release:
      description: Every os-release field, keys lower-cased (id, version_id, pretty_name, id_like, ...).
      type: dict
      sample: {id: ubuntu, version_id: "22.04", pretty_name: Ubuntu 22.04.4 LTS, id_like: debian}
"""

from typing import Any

from ansible_collections.exaserve.fleet.plugins.module_utils.os_release import read_os_release
from ansible_collections.exaserve.fleet.plugins.module_utils.probe import Probe

ARGUMENT_SPEC: dict[str, Any] = {}  # no options (DOCUMENTATION says so too)


def main() -> None:
    probe = Probe("os_release_facts", ARGUMENT_SPEC)
    probe.report(read_os_release)


if __name__ == "__main__":
    main()
