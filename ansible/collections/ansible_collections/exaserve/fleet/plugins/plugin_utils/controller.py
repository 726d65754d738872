"""The one door from this collection's controller-side plugins to the controller package ``serving``.

The modules and ``module_utils`` run on the nodes and import nothing from ``serving``. Three
controller-side plugins genuinely need its logic, and reach it only through :func:`controller`:

- ``inventory/exaserve``: loads the typed stack (``serving.spec.stack``) and turns it into hosts,
  groups and variables (``serving.render.inventory``) -- the one source of truth;
- ``filter/fleet``: ``preflight_report``/``preflight_summary`` (``serving.checks.preflight``, the
  report ``exaserve preflight`` reads back) and ``fabric_groups``/``fabric_check``
  (``serving.node.fabric``, the same arithmetic the all-reduce worker uses);
- ``action/preflight_record``: the check catalogue and the record format
  (``serving.checks.preflight.check_result``); a copy here would be a second catalogue to keep in step.

``serving`` comes from the exaserve-deploy package installed in the interpreter that runs
ansible-playbook (the project's virtualenv). tests/test_ansible_plugins.py keeps this list honest.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

from ansible.errors import AnsibleError


def controller(module: str, plugin: str) -> ModuleType:
    """``serving.<...>`` for ``plugin``; a missing package is an error that says how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise AnsibleError(
            f"{plugin} needs {module} from the exaserve-deploy package, but the Python running Ansible "
            f"({sys.executable}) cannot import it ({exc}). Run ansible-playbook from the project's virtualenv "
            "(pip install -e . there), or install exaserve-deploy into that interpreter."
        ) from None
