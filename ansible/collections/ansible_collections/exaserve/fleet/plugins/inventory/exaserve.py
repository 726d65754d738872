"""Ansible inventory plugin ``exaserve``: hosts, groups and variables from the typed fleet spec.

The one source of truth is the stack (``Pulumi.<stack>.yaml``); this plugin loads it through
:mod:`serving.spec.stack` and exposes what the roles need, so no node list or expected value is
written twice. Configuration file: ``ansible/inventory/<stack>.exaserve.yml``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ansible.errors import AnsibleParserError

from ansible.plugins.inventory import BaseInventoryPlugin

DOCUMENTATION = r"""
---
name: exaserve
short_description: ExaServe fleet nodes, pools, racks and expected hardware from the typed stack
description:
  - Loads an ExaServe stack (C(Pulumi.<stack>.yaml)) with the project's spec loader and adds every
    expanded node as a host (C(ansible_host), C(ansible_port), C(ansible_user) from the pool).
  - "Groups: C(exaserve) (every node), C(pool_<pool>) per pool and one group per rack, named after
    the rack label with non-identifier characters replaced by C(_) (C(rack-00) becomes C(rack_00))."
  - Variables C(exaserve_*) on the C(exaserve) group carry what preflight and the provisioning roles
    check or install (expected GPU count, product and memory, HCAs and link rate, minimum kernel,
    driver and CUDA, NTP offset limit, model paths); see docs/preflight.md for the full list.
  - A stack error is reported with the field, the value and the fix, and no host is added.
options:
  plugin:
    description: Marks the file as this plugin's configuration.
    required: true
    choices: [exaserve]
  stack:
    description: Stack name; the plugin reads C(Pulumi.<stack>.yaml) from the project root.
    type: str
  stack_file:
    description: Path of any stack file (relative to this configuration file); overrides I(stack).
    type: path
  known_hosts_file:
    description:
      - known_hosts file holding the nodes' host keys. Host keys are always verified
        (C(StrictHostKeyChecking=yes)); this only says where they are.
    type: path
  private_key_file:
    description: SSH private key for the nodes (C(ansible_ssh_private_key_file)).
    type: path
"""

EXAMPLES = r"""
# ansible/inventory/prod.exaserve.yml
plugin: exaserve
stack: prod
"""


class InventoryModule(BaseInventoryPlugin):
    NAME = "exaserve"

    def verify_file(self, path: str) -> bool:
        return super().verify_file(path) and path.endswith((".exaserve.yml", ".exaserve.yaml"))

    def parse(self, inventory: Any, loader: Any, path: str, cache: bool = True) -> None:
        super().parse(inventory, loader, path, cache)
        self._read_config_data(path)
        from serving.spec.stack import SpecError, load_stack, load_stack_file  # noqa: PLC0415

        stack_name, stack_file = self.get_option("stack"), self.get_option("stack_file")
        if not stack_name and not stack_file:
            raise AnsibleParserError(f"{path}: set 'stack: <name>' or 'stack_file: <path>' (neither is set)")
        try:
            if stack_file:
                file_path = Path(stack_file)
                stack = load_stack_file(file_path if file_path.is_absolute() else Path(path).parent / file_path)
            else:
                stack = load_stack(stack_name)
        except SpecError as exc:
            raise AnsibleParserError(f"inventory {path}: {exc}") from None
        self._populate(stack)

    def _populate(self, stack: Any) -> None:
        from serving.render.inventory import FLEET_GROUP, fleet_vars, groups, host_vars  # noqa: PLC0415

        inv = self.inventory
        inv.add_group(FLEET_GROUP)
        for key, value in fleet_vars(stack).items():
            inv.set_variable(FLEET_GROUP, key, value)
        known_hosts, key_file = self.get_option("known_hosts_file"), self.get_option("private_key_file")
        if known_hosts:
            inv.set_variable(
                FLEET_GROUP,
                "ansible_ssh_common_args",
                f"-o UserKnownHostsFile={known_hosts} -o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes",
            )
        if key_file:
            inv.set_variable(FLEET_GROUP, "ansible_ssh_private_key_file", key_file)
        for group, members in groups(stack.spec).items():
            if group == FLEET_GROUP:
                continue
            inv.add_group(group)
            inv.add_child(FLEET_GROUP, group)
            for host in members:
                inv.add_host(host, group=group)
        for host, variables in host_vars(stack).items():
            for key, value in variables.items():
                inv.set_variable(host, key, value)
