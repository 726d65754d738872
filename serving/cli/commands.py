"""Command modules of the ``exaserve`` CLI.

Each module does ``from serving.cli.options import app`` and decorates its commands. ``COMMAND_MODULES``
maps each top-level command to its module so that ``exaserve plan`` does not pay for importing Pulumi,
torch or aiohttp: :func:`register` imports only the module a command needs, or all of them for
``--help`` and unknown commands. Add a line per new command.
"""

from __future__ import annotations

import importlib

COMMAND_MODULES: dict[str, str] = {
    "render": "infra",
    "check": "infra",
    "diff": "infra",
    "units": "unitscmd",
    "preflight": "preflight",
    "fleet": "fleet",
    "sandbox": "sandbox",
    "rollout": "rollout",
    "rollback": "rollout",
    "fit": "fit",
    "controller": "runtime",
    "agent": "runtime",
    "status": "runtime",
    "drill": "drill",
}
BUILTIN = frozenset({"plan", "schema", "audit-source"})


def register(command: str | None) -> None:
    """Import the module that defines ``command`` (all modules when unknown or absent)."""
    if command in BUILTIN:
        return
    wanted = [COMMAND_MODULES[command]] if command in COMMAND_MODULES else sorted(set(COMMAND_MODULES.values()))
    for name in wanted:
        importlib.import_module(f"serving.cli.{name}")
