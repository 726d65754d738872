#!/usr/bin/python
"""Ansible module: InfiniBand/RoCE port facts from `ibstat`, parsed into JSON."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: ibstat_facts
short_description: Read InfiniBand HCA and port state from ibstat as facts
description:
  - Runs C(ibstat) (rdma-core / infiniband-diags) on the node and parses every channel adapter
    and every port it prints into the C(ibstat) fact.
  - Fails with the fix when C(ibstat) is not installed or exits non-zero.
version_added: "0.1.0"
author: ExaServe platform team (@exaserve-platform)
extends_documentation_fragment: [exaserve.fleet.read_only]
options: {}
requirements:
  - infiniband-diags (Debian/Ubuntu), rdma-core, or MLNX_OFED/DOCA-OFED on the managed node
notes:
  - The fact names the link layer of every port, so a check can ignore RoCE/Ethernet ports
    and look only at the InfiniBand fabric.
"""

EXAMPLES = r"""
- name: Read InfiniBand port state
  exaserve.fleet.ibstat_facts:

- name: Every InfiniBand port is Active at the planned rate
  ansible.builtin.assert:
    that:
      - ibstat.ports | selectattr('link_layer', 'eq', 'InfiniBand') | rejectattr('state', 'eq', 'Active') | list | length == 0
      - ibstat.ports | selectattr('link_layer', 'eq', 'InfiniBand') | rejectattr('rate_gbps', 'eq', 400) | list | length == 0
    fail_msg: "ibstat on {{ inventory_hostname }}: ports not Active at 400 Gb/s: {{ ibstat.ports }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: success
  type: dict
  contains:
    ibstat:
      description: Parsed ibstat output.
      type: dict
      contains:
        ca_count:
          description: Number of channel adapters ibstat printed.
          type: int
          sample: 8
        cas:
          description: One entry per adapter, without its ports.
          type: list
          elements: dict
          sample:
            - name: mlx5_0
              node_type: CA
              ca_type: MT4129
              number_of_ports: 1
              firmware_version: 28.39.1002
              hardware_version: "0"
              node_guid: "0xa088c203005e1000"
              system_image_guid: "0xa088c203005e1000"
        ports:
          description: Every port of every adapter, flattened, with the adapter name in C(ca).
          type: list
          elements: dict
          sample:
            - ca: mlx5_0
              port: 1
              state: Active
              physical_state: LinkUp
              rate_gbps: 400
              fdr10: false
              base_lid: 101
              lmc: 0
              sm_lid: 1
              capability_mask: "0xa751e848"
              port_guid: "0xa088c203005e1000"
              link_layer: InfiniBand
"""

from typing import Any

from ansible_collections.exaserve.fleet.plugins.module_utils.ibstat import read_ibstat
from ansible_collections.exaserve.fleet.plugins.module_utils.probe import Probe

ARGUMENT_SPEC: dict[str, Any] = {}  # no options (DOCUMENTATION says so too)


def main() -> None:
    probe = Probe("ibstat_facts", ARGUMENT_SPEC)
    probe.report(read_ibstat)


if __name__ == "__main__":
    main()
