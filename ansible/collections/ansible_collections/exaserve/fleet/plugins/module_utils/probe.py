"""The probe skeleton every ``exaserve.fleet`` module shares: find the tool, run it, parse, fail with the fix.

Modelled on community.general's ``CmdRunner`` (``plugins/module_utils/cmd_runner.py``): one object owns
the ``AnsibleModule`` (check mode always supported: probes only read), finds binaries, runs them under
the C locale and turns each way of failing into one message that names the tool, what it printed and
the fix. A probe module keeps only its parsers and its fixes. Runs on the managed node, so it imports
nothing but Python's standard library and ``ansible.module_utils``.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

# `basic.AnsibleModule` is looked up at call time (not imported by name) so that ansible-lint's args
# rule, which patches it, sees the module's argument_spec.
from ansible.module_utils import basic

MODULE_DIR = "ansible/collections/ansible_collections/exaserve/fleet/plugins/modules"
SEARCHED = "not found on PATH or in /sbin, /usr/sbin, /usr/local/sbin"


class ProbeParseError(ValueError):
    """A tool printed something the module's parser does not recognise (the message says what)."""


def condense(output: str) -> str:
    """A tool's output on one line, without a trailing full stop (it is followed by ``. <fix>``)."""
    return " ".join(output.split()).rstrip(".")


def missing_message(tool: str, fix: str) -> str:
    """The failure when ``tool`` is not on the node."""
    return f"{tool} is not installed on this node ({SEARCHED}). {fix}"


def exit_message(args: list[str], rc: int, output: str, fix: str) -> str:
    """The failure when a tool exits non-zero: the command as typed, its exit code, what it said, the fix."""
    command = shlex.join([args[0].rsplit("/", 1)[-1], *args[1:]])
    return f"{command} exited {rc}: {condense(output)}. {fix}"


def parse_message(module: str, tool: str, error: Exception) -> str:
    """The failure when a tool's output does not parse."""
    return (
        f"could not parse {tool} output: {error}. This tool version prints a format the module does not know; "
        f"update {MODULE_DIR}/{module}.py for it."
    )


class Probe:
    """One probe module run: ``Probe(name, ARGUMENT_SPEC)``, then ``find``/``run``/``parse``, then ``facts``."""

    def __init__(self, name: str, argument_spec: Mapping[str, Any]) -> None:
        self.name = name
        self.module = basic.AnsibleModule(argument_spec=dict(argument_spec), supports_check_mode=True)
        self.params: dict[str, Any] = self.module.params

    def which(self, tool: str) -> str | None:
        """Path of ``tool``, or None (for probes that report a missing tool instead of failing)."""
        path: str | None = self.module.get_bin_path(tool)
        return path

    def find(self, tool: str, fix: str) -> str:
        """Path of ``tool``; a missing tool fails the module with ``fix`` (how to install it)."""
        path = self.which(tool)
        if path is None:
            self.fail(missing_message(tool, fix))
        return path

    def run(self, args: list[str], fix: str | Callable[[int], str] | None = None) -> tuple[int, str, str]:
        """Run ``args`` under ``LC_ALL=C``. With ``fix`` (text, or a function of the exit code when the
        fix depends on it) a non-zero exit fails the module; without, the caller gets ``rc`` and records it."""
        rc, out, err = self.module.run_command(args, environ_update={"LC_ALL": "C"})
        if rc != 0 and fix is not None:
            text = fix(rc) if callable(fix) else fix
            self.fail(exit_message(args, rc, out + err, text), rc=rc, stdout=out, stderr=err)
        return rc, out, err

    def parse(self, tool: str, parser: Callable[..., Any], *outputs: str) -> Any:
        """``parser(*outputs)``; a :class:`ProbeParseError` (or any ValueError) fails the module."""
        try:
            return parser(*outputs)
        except ValueError as exc:
            self.fail(parse_message(self.name, tool, exc), stdout=outputs[0] if outputs else "")

    def fail(self, msg: str, **details: Any) -> NoReturn:
        self.module.fail_json(msg=msg, **details)

    def facts(self, **facts: Any) -> NoReturn:
        """Exit with ``facts`` as host facts; a probe never changes the node."""
        self.done(ansible_facts=facts)

    def done(self, **result: Any) -> NoReturn:
        self.module.exit_json(changed=False, **result)
