"""Inventory plugin ``exaserve.fleet.exaserve``: hosts, groups and variables from the typed fleet spec.

The one source of truth is the stack (``Pulumi.<stack>.yaml``); this plugin loads it through
``serving.spec.stack`` and exposes what the roles need (``serving.render.inventory``), so no node list
or expected value is written twice. That is controller logic this plugin genuinely needs: it reaches
``serving`` through plugin_utils/controller.py. Configuration file: ``ansible/inventory/<stack>.exaserve.yml``
with ``plugin: exaserve.fleet.exaserve``.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
name: exaserve
author: ExaServe platform team (@exaserve-platform)
version_added: "0.1.0"
short_description: ExaServe fleet nodes, pools, racks and expected hardware from the typed stack
description:
  - Loads an ExaServe stack (C(Pulumi.<stack>.yaml)) with the project's spec loader and adds every
    expanded node as a host (C(ansible_host), C(ansible_port), C(ansible_user) from the pool).
  - "Groups: C(exaserve) (every GPU node), C(pool_<pool>) per pool and one group per rack, named after
    the rack label with non-identifier characters replaced by C(_) (C(rack-00) becomes C(rack_00));
    C(exaserve_system), outside C(exaserve), the nodes of C(cluster.system_pool) (routers, controllers)."
  - Variables C(exaserve_*) on the C(exaserve) group carry what preflight and the provisioning roles
    check or install (expected GPU count, product and memory, HCAs and link rate, minimum kernel,
    driver and CUDA, NTP offset limit, model paths); see docs/preflight.md for the full list.
  - A stack error is reported with the field, the value and the fix, and no host is added.
  - Needs the exaserve-deploy package (C(serving)) in the interpreter that runs Ansible.
options:
  plugin:
    description: Marks the file as this plugin's configuration.
    required: true
    choices: [exaserve.fleet.exaserve]
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
plugin: exaserve.fleet.exaserve
stack: prod
"""

from pathlib import Path
from typing import Any

from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin
from ansible_collections.exaserve.fleet.plugins.plugin_utils.controller import controller


class InventoryModule(BaseInventoryPlugin):
    NAME = "exaserve.fleet.exaserve"

    def verify_file(self, path: str) -> bool:
        return super().verify_file(path) and path.endswith((".exaserve.yml", ".exaserve.yaml"))

    def parse(self, inventory: Any, loader: Any, path: str, cache: bool = True) -> None:
        super().parse(inventory, loader, path, cache)
        self._read_config_data(path)
        stacks = controller("serving.spec.stack", f"inventory plugin {self.NAME}")
        stack_name, stack_file = self.get_option("stack"), self.get_option("stack_file")
        if not stack_name and not stack_file:
            raise AnsibleParserError(
                f"{path}: set 'stack: <name>' or 'stack_file: <path>' (neither is set); to run on a stack's nodes, "
                "pass its inventory: -i inventory/<stack>.exaserve.yml (ansible.cfg's default names no stack)"
            )
        try:
            if stack_file:
                file_path = Path(stack_file)
                stack = stacks.load_stack_file(file_path if file_path.is_absolute() else Path(path).parent / file_path)
            else:
                stack = stacks.load_stack(stack_name)
        except stacks.SpecError as exc:
            raise AnsibleParserError(f"inventory {path}: {exc}") from None
        self._populate(stack)

    def _populate(self, stack: Any) -> None:
        rendered = controller("serving.render.inventory", f"inventory plugin {self.NAME}")
        fleet, system = rendered.FLEET_GROUP, rendered.SYSTEM_GROUP
        inv = self.inventory
        known_hosts, key_file = self.get_option("known_hosts_file"), self.get_option("private_key_file")
        for group in (fleet, system):
            inv.add_group(group)
            for key, value in rendered.fleet_vars(stack).items():
                inv.set_variable(group, key, value)
            if known_hosts:
                inv.set_variable(
                    group,
                    "ansible_ssh_common_args",
                    f"-o UserKnownHostsFile={known_hosts} -o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes",
                )
            if key_file:
                inv.set_variable(group, "ansible_ssh_private_key_file", key_file)
        for host in rendered.system_hosts(stack.spec):
            inv.add_host(host, group=system)
        for group, members in rendered.groups(stack.spec).items():
            if group == fleet:
                continue
            inv.add_group(group)
            inv.add_child(fleet, group)
            for host in members:
                inv.add_host(host, group=group)
        for host, variables in rendered.host_vars(stack).items():
            for key, value in variables.items():
                inv.set_variable(host, key, value)
