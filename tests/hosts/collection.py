"""Import the custom Ansible modules in ansible/library as plain Python (for their parsers)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

LIBRARY_DIR = Path(__file__).resolve().parents[2] / "ansible" / "library"
MODULES = ("nvidia_smi_facts", "ibstat_facts", "chrony_facts", "kernel_facts")


def load(name: str) -> ModuleType:
    """The module ansible/library/<name>.py, imported once as `exaserve_library_<name>`."""
    qualified = f"exaserve_library_{name}"
    if qualified in sys.modules:
        return sys.modules[qualified]
    spec = importlib.util.spec_from_file_location(qualified, LIBRARY_DIR / f"{name}.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"no Ansible module {name!r} in {LIBRARY_DIR}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[qualified] = module
    spec.loader.exec_module(module)
    return module
