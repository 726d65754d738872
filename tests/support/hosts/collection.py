"""The exaserve.fleet collection (ansible/collections/ansible_collections/exaserve/fleet): where its roles,
playbooks and plugins lie, and its plugins imported as plain Python under their real names, for the parsers
of its probe modules and its plugins' functions."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

from tests.support.paths import REPO

ANSIBLE_DIR = REPO / "ansible"
COLLECTIONS_DIR = ANSIBLE_DIR / "collections"
COLLECTION_DIR = COLLECTIONS_DIR / "ansible_collections" / "exaserve" / "fleet"
ROLES_DIR = COLLECTION_DIR / "roles"
PLAYBOOKS_DIR = COLLECTION_DIR / "playbooks"
MODULES_DIR = COLLECTION_DIR / "plugins" / "modules"
# Every module of the collection, by short name (the FQCN is exaserve.fleet.<name>).
MODULES = tuple(sorted(path.stem for path in MODULES_DIR.glob("*.py")))
# Documentation-only module files: the action plugin of the same name does the work, on the controller.
ACTION_DOCS = ("preflight_record",)
PROBES = tuple(name for name in MODULES if name not in ACTION_DOCS)


def load(name: str, kind: str = "modules") -> ModuleType:
    """``ansible_collections.exaserve.fleet.plugins.<kind>.<name>``, the name Ansible imports it by
    (so its ``module_utils`` imports resolve the same way as on a node)."""
    if str(COLLECTIONS_DIR) not in sys.path:
        sys.path.insert(0, str(COLLECTIONS_DIR))
    return importlib.import_module(f"ansible_collections.exaserve.fleet.plugins.{kind}.{name}")
