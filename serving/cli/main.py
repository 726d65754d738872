"""The ``exaserve`` console script. It imports only the command table (:mod:`serving.cli.commands`): ``--help`` and
``--version`` start without the spec, the planner or any command module, and a command imports its own module when
it runs.

See :mod:`serving.cli.options` for the exit codes every command follows.
"""

from __future__ import annotations

import sys

from serving.cli.commands import app


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
