#!/usr/bin/python
"""Documentation of the controller-side action ``exaserve.fleet.preflight_record`` (the code is
plugins/action/preflight_record.py; Ansible reads action documentation from the module of the same name)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight_record
short_description: Record preflight check results for the host
description:
  - "Merges the given checks into the C(preflight_results) fact of the host
    (check name -> status, observed, expected, fix), for the C(preflight_report) role."
  - Runs on the controller only; no connection to the node.
  - An unknown check name, a failing check without a fix, or a non-boolean C(passed) fails the task.
version_added: "0.1.0"
author: ExaServe platform team (@exaserve-platform)
extends_documentation_fragment: [exaserve.fleet.read_only]
options:
  checks:
    description:
      - One entry per check. C(check) is a name from C(serving.checks.preflight.CHECKS); C(passed) is the
        outcome, or C(skip) gives the reason the check does not apply; C(observed), C(expected)
        and C(fix) are shown to the user (C(fix) is required when the check fails).
      - Give C(checks) or I(probe_error).
    type: list
    elements: dict
  probe_error:
    description:
      - For a probe that failed (in a C(rescue)), records every check in C(checks) as failed with the same
        C(observed), C(expected) and C(fix).
    type: dict
"""

EXAMPLES = r"""
- name: Record the clock checks
  exaserve.fleet.preflight_record:
    checks:
      - check: ntp_sync
        passed: "{{ ansible_facts.chrony.synchronised }}"
        observed: "leap status {{ ansible_facts.chrony.leap_status }}"
        expected: synchronised
        fix: Check chronyc sources -v and the NTP servers, then rerun preflight.

- name: Record the clock checks as failed (chronyc failed)
  exaserve.fleet.preflight_record:
    probe_error:
      checks: [ntp_sync, ntp_offset]
      observed: "{{ ansible_failed_result.msg }}"
      expected: chronyd answers chronyc tracking
      fix: Install and start chrony (role ntp), then rerun preflight.
"""

RETURN = r"""
ansible_facts:
  description: The host's recorded results so far, this task's merged in.
  returned: always
  type: dict
  contains:
    preflight_results:
      description: Check name -> C({status, observed, expected, fix}), C(status) one of pass, fail, skip.
      type: dict
      sample: {ntp_sync: {status: pass, observed: leap status Normal, expected: synchronised, fix: null}}
"""
