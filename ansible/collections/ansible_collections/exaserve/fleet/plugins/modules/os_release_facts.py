#!/usr/bin/python
"""Ansible module: /etc/os-release as JSON facts (the reach probe of preflight: one light round trip)."""

from __future__ import annotations

import shlex

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
---
module: os_release_facts
short_description: Read /etc/os-release (ID, VERSION_ID, PRETTY_NAME) as facts
description:
  - Parses C(/etc/os-release) (or C(/usr/lib/os-release), as os-release(5) says) into the
    C(os_release) fact. Much lighter than C(setup), so preflight also uses it as its
    reachability probe.
  - Read-only; never changes the node. Safe in check mode.
version_added: "0.1.0"
author: ExaServe platform team
options: {}
"""

EXAMPLES = r"""
- name: Read the OS release
  os_release_facts:

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

PATHS = ("/etc/os-release", "/usr/lib/os-release")


class OsReleaseParseError(ValueError):
    """A line of os-release that is not KEY=VALUE."""


def parse_os_release(text: str) -> dict[str, str]:
    """os-release(5): KEY=VALUE lines, values in shell quoting, comments and blank lines ignored."""
    out: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.replace("_", "").isalnum():
            raise OsReleaseParseError(f"line {lineno}: {line!r} is not KEY=VALUE")
        try:
            words = shlex.split(value)
        except ValueError as exc:
            raise OsReleaseParseError(f"line {lineno}: {exc}") from exc
        out[key.lower()] = " ".join(words)
    out.setdefault("id", "linux")  # os-release(5) default
    return out


def main() -> None:
    module = AnsibleModule(argument_spec={}, supports_check_mode=True)
    for path in PATHS:
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
            break
        except FileNotFoundError:
            continue
    else:
        module.fail_json(msg=f"none of {', '.join(PATHS)} exists; the node is not a systemd-era Linux")
    try:
        facts = parse_os_release(text)
    except OsReleaseParseError as exc:
        module.fail_json(msg=f"could not parse {path}: {exc}")
    module.exit_json(changed=False, ansible_facts={"os_release": facts})


if __name__ == "__main__":
    main()
