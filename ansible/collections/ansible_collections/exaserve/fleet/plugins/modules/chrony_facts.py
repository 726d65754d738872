#!/usr/bin/python
"""Ansible module: clock synchronisation state from `chronyc tracking`, parsed into JSON facts."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: chrony_facts
short_description: Read the clock offset and sync state from chronyc tracking as facts
description:
  - Runs C(chronyc -c tracking) (or C(chronyc tracking) with I(output_format=text)) on the node
    and returns the C(chrony) fact.
  - C(system_time_offset_s) is signed the way people read it, positive when the system clock is
    ahead of NTP time (chronyc says "fast"), negative when it is behind ("slow").
  - Fails with the fix when chronyc is missing or chronyd does not answer.
version_added: "0.1.0"
author: ExaServe platform team (@exaserve-platform)
extends_documentation_fragment: [exaserve.fleet.read_only]
options:
  output_format:
    description:
      - C(csv) runs C(chronyc -c tracking), the machine-readable form (chrony 2.2 and later).
      - C(text) runs C(chronyc tracking) and parses the human-readable report, for older chrony.
    type: str
    choices: [csv, text]
    default: csv
requirements:
  - chrony (chronyd running, chronyc installed) on the managed node
"""

EXAMPLES = r"""
- name: Read the clock state
  exaserve.fleet.chrony_facts:

- name: Clock synchronised and within 100 ms of NTP time
  ansible.builtin.assert:
    that:
      - chrony.synchronised
      - chrony.system_time_offset_s | abs <= 0.1
    fail_msg: >-
      {{ inventory_hostname }}: clock offset {{ chrony.system_time_offset_s }} s (limit 0.1 s),
      leap status {{ chrony.leap_status }}. Check 'chronyc sources -v' and the NTP servers.
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: success
  type: dict
  contains:
    chrony:
      description: Parsed chronyc tracking report.
      type: dict
      contains:
        reference_id: {description: Reference ID in hex, type: str, sample: CB00710F}
        reference_name: {description: Name or address of the reference, type: str, sample: foo.example.net}
        stratum: {description: NTP stratum, type: int, sample: 3}
        ref_time_epoch_s: {description: "Last measurement, seconds since the epoch (UTC)", type: float, sample: 1485510557.0}
        system_time_offset_s: {description: "System clock minus NTP time, positive = ahead", type: float, sample: -6.523e-06}
        last_offset_s: {description: Offset at the last clock update, type: float, sample: -6.747e-06}
        rms_offset_s: {description: Long-term average offset, type: float, sample: 3.5822e-05}
        frequency_ppm: {description: "Clock frequency error, positive = fast", type: float, sample: -3.225}
        residual_freq_ppm: {description: Residual frequency, type: float, sample: -0.0}
        skew_ppm: {description: Estimated error bound on the frequency, type: float, sample: 0.129}
        root_delay_s: {description: Total network delay to the stratum-1 source, type: float, sample: 0.013639022}
        root_dispersion_s: {description: Total dispersion to the stratum-1 source, type: float, sample: 0.001100737}
        update_interval_s: {description: Interval between the last two clock updates, type: float, sample: 64.2}
        leap_status: {description: "Normal, Insert second, Delete second or Not synchronised", type: str, sample: Normal}
        synchronised: {description: True unless chronyd reports Not synchronised, type: bool, sample: true}
"""

from typing import Any

from ansible_collections.exaserve.fleet.plugins.module_utils.chrony import read_chrony
from ansible_collections.exaserve.fleet.plugins.module_utils.probe import Probe

ARGUMENT_SPEC: dict[str, Any] = {
    "output_format": {"type": "str", "choices": ["csv", "text"], "default": "csv"},
}


def main() -> None:
    probe = Probe("chrony_facts", ARGUMENT_SPEC)
    probe.report(lambda p: read_chrony(p, p.params["output_format"]))


if __name__ == "__main__":
    main()
