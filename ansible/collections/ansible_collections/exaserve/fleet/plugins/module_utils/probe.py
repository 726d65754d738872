"""The probe skeleton every ``exaserve.fleet`` module shares: find the tool, run it, parse, fail with the fix.

Modelled on community.general's ``CmdRunner`` (``plugins/module_utils/cmd_runner.py``): one object owns
the ``AnsibleModule`` (check mode always supported: probes only read), finds binaries, runs them under
the C locale and turns each way of failing into one message that names the tool, what it printed and
the fix. What a probe reads lives beside this file, one ``module_utils`` file per tool (its parsers and
a ``read_*`` function returning facts), so a single-tool module and the one-round-trip
``preflight_facts`` module share them. A failure inside a reader raises :class:`ProbeFailure`;
``Probe.report`` turns it into the module's failure, ``preflight_facts`` into that section's error.
Runs on the managed node, so it imports nothing but Python's standard library and
``ansible.module_utils``.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

# `basic.AnsibleModule` is looked up at call time (not imported by name) so that ansible-lint's args
# rule, which patches it, sees the module's argument_spec.
from ansible.module_utils import basic

MODULE_DIR = "ansible/collections/ansible_collections/exaserve/fleet/plugins/modules"
SEARCHED = "not found on PATH or in /sbin, /usr/sbin, /usr/local/sbin"


class ProbeParseError(ValueError):
    """A tool printed something the module's parser does not recognise (the message says what)."""


class ProbeFailure(Exception):
    """A reader could not read what it reads; the message names the tool, what it said and the fix."""

    def __init__(self, msg: str, **details: Any) -> None:
        super().__init__(msg)
        self.details = details


# A reader: what one probe reads, as facts (fact name -> value); raises ProbeFailure.
Reader = Callable[["Probe"], dict[str, Any]]


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


def hang_message(args: list[str], timeout_s: float) -> str:
    """The failure when a tool does not answer within the probe's timeout (it was killed)."""
    command = shlex.join([args[0].rsplit("/", 1)[-1], *args[1:]])
    return (
        f"{command} did not answer within {timeout_s:g} s and was killed. A tool that hangs is a wedged "
        "device or daemon: look at dmesg and the tool's service log on the node"
    )


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
        # Seconds after which a tool started by `run` is killed (None: no limit; the task's
        # `timeout` keyword bounds the whole module instead).
        self.timeout_s: float | None = None

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

    # Commands run here rather than through AnsibleModule.run_command, which can neither bound a command's
    # time (a wedged device hangs nvidia-smi or ibstat) nor start several at once.

    def run(self, args: list[str], fix: str | Callable[[int], str] | None = None) -> tuple[int, str, str]:
        """Run ``args`` under ``LC_ALL=C``, killed (with everything it started) after ``timeout_s``.
        With ``fix`` (text, or a function of the exit code when the fix depends on it) a non-zero
        exit fails the reader; without, the caller gets ``rc`` and records it."""
        rc, out, err = _finish(_start(args), self.timeout_s)
        if rc is None:
            self.fail(hang_message(args, self.timeout_s or 0))
        if rc != 0 and fix is not None:
            text = fix(rc) if callable(fix) else fix
            self.fail(exit_message(args, rc, out + err, text), rc=rc, stdout=out, stderr=err)
        return rc, out, err

    def run_all(self, commands: Sequence[list[str]]) -> list[tuple[int | None, str, str]]:
        """Run every command at once, as ``run`` runs one, and return ``(rc, stdout, stderr)`` of each in
        order. A command still running ``timeout_s`` after they all started is killed and gets ``rc``
        None; nothing fails the reader, which records each outcome (for probes that ask many peers)."""
        procs = [_start(args) for args in commands]
        if self.timeout_s is None:
            return [_finish(proc, None) for proc in procs]
        deadline = time.monotonic() + self.timeout_s
        return [_finish(proc, max(0.1, deadline - time.monotonic())) for proc in procs]

    def parse(self, tool: str, parser: Callable[..., Any], *outputs: str) -> Any:
        """``parser(*outputs)``; a :class:`ProbeParseError` (or any ValueError) fails the module."""
        try:
            return parser(*outputs)
        except ValueError as exc:
            self.fail(parse_message(self.name, tool, exc), stdout=outputs[0] if outputs else "")

    def fail(self, msg: str, **details: Any) -> NoReturn:
        raise ProbeFailure(msg, **details)

    def report(self, *readers: Reader) -> NoReturn:
        """Exit with the facts of every reader; the first :class:`ProbeFailure` fails the module with its message."""
        facts: dict[str, Any] = {}
        try:
            for read in readers:
                facts.update(read(self))
        except ProbeFailure as exc:
            self.module.fail_json(msg=str(exc), **exc.details)
        self.facts(**facts)

    def facts(self, **facts: Any) -> NoReturn:
        """Exit with ``facts`` as host facts; a probe never changes the node."""
        self.done(ansible_facts=facts)

    def done(self, **result: Any) -> NoReturn:
        self.module.exit_json(changed=False, **result)


def _start(args: list[str]) -> subprocess.Popen[str]:
    """``args`` started under the C locale, in a process group of its own (so a kill reaches what it started)."""
    return subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        env={**os.environ, "LC_ALL": "C"},
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen[str], timeout_s: float | None) -> tuple[int | None, str, str]:
    """``(rc, stdout, stderr)`` of ``proc``; still running after ``timeout_s``, its group is killed and rc is None."""
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err
    return proc.returncode, out, err
