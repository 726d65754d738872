"""Doc fragment ``exaserve.fleet.read_only``: what every probe module says about changing nothing."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    support: full
    description: Only reads the node, so it runs the same in check mode (C(--check)).
  diff_mode:
    support: none
    description: Changes nothing, so there is nothing to diff.
notes:
  - Read-only; never changes the node and always returns C(changed=false). Safe in check mode.
"""
