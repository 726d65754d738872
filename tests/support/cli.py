"""The two ways tests run the CLI.

* :func:`exaserve`: the installed ``exaserve`` console script in a subprocess, as a user runs it: what ships is what
  is tested (the console-script entry point, the lazy command registration of :mod:`serving.cli.commands`, stdout and
  stderr kept apart, real exit codes). Every command has at least one such test.
* :func:`exaserve_in_process`: the same app through typer's ``CliRunner``, for the contract matrices (every command ×
  every bad input), where a new interpreter per case would cost 0.85 s of start-up each. Same result type, stdout and
  stderr kept apart; an exception that escapes the app shows up in stderr as a traceback, as a user would see it.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import pty
import select
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from serving.cli.commands import app
from tests.support.paths import REPO
from tests.support.patience import PATIENCE_S

EXASERVE = Path(sys.executable).parent / "exaserve"


def exaserve(
    *args: str, cwd: Path = REPO, env: Mapping[str, str] | None = None, timeout_s: float = 5 * PATIENCE_S
) -> subprocess.CompletedProcess[str]:
    """Run ``exaserve ARGS`` in ``cwd`` (the checkout: its ``Pulumi.<stack>.yaml`` files are the named stacks), with
    the environment plus ``env`` and a wide terminal so that messages are not wrapped. The timeout only catches a
    hang: beside stress-ng and other test runs, rendering prod's 2,048 replicas took more than 120 s."""
    return subprocess.run(
        [str(EXASERVE), *args], capture_output=True, text=True, cwd=cwd, env=_env(env), timeout=timeout_s, check=False
    )


def exaserve_in_process(
    *args: str, cwd: Path = REPO, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``exaserve ARGS`` in this interpreter (typer's ``CliRunner`` on the console script's app), in ``cwd`` with the
    environment plus ``env``: :func:`exaserve`'s result without a new process. The terminal is as wide as the
    subprocess's: conftest.py sets ``COLUMNS`` before the CLI's consoles are made."""
    with contextlib.chdir(cwd):
        # in a context of its own, as a new process starts: the CLI's context variables (the running command's, which
        # fail() reads for --json) do not carry over from the previous invocation
        result = contextvars.Context().run(CliRunner().invoke, app, list(args), env={"COLUMNS": "200", **(env or {})})
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
    return subprocess.CompletedProcess(["exaserve", *args], result.exit_code, result.stdout, stderr)


def exaserve_started(
    *args: str, cwd: Path = REPO, env: Mapping[str, str] | None = None, to: Path | None = None
) -> subprocess.Popen[str]:
    """``exaserve ARGS`` as :func:`exaserve` runs it, but started in the background with stdout and stderr piped,
    for tests that signal it mid-run; collect it with ``communicate(timeout=...)``. A long run that prints more than a
    pipe holds (64 KiB) blocks on its next write until someone reads: pass ``to``, a path whose ``.out`` and ``.err``
    files take stdout and stderr instead (read them once it ended)."""
    if to is None:
        out, err = subprocess.PIPE, subprocess.PIPE
    else:
        out, err = to.with_suffix(".out").open("w"), to.with_suffix(".err").open("w")
    try:
        return subprocess.Popen([str(EXASERVE), *args], stdout=out, stderr=err, text=True, cwd=cwd, env=_env(env))
    finally:
        if to is not None:  # the child holds its own copies
            out.close()
            err.close()


def exaserve_on_terminal(
    *args: str, answer: str, cwd: Path = REPO, env: Mapping[str, str] | None = None, timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    """``exaserve ARGS`` as :func:`exaserve` runs it, but with stdin, stdout and stderr on a pseudo-terminal, as an
    operator at a shell: ``answer`` (and a newline) is typed once the first prompt (``… [y/N]: ``) shows.
    The result's stdout is everything the terminal showed, stderr is empty."""
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.Popen(
            [str(EXASERVE), *args], stdin=terminal, stdout=terminal, stderr=terminal, cwd=cwd, env=_env(env)
        )
    finally:
        os.close(terminal)
    shown, answered, deadline = b"", False, time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(controller, 4096)
                except OSError:  # the terminal closed: the command ended
                    break
                if not chunk:
                    break
                shown += chunk
                if not answered and b"]: " in shown:
                    os.write(controller, answer.encode() + b"\n")
                    answered = True
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        os.close(controller)
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess([str(EXASERVE), *args], code, shown.decode(errors="replace"), "")


def _env(env: Mapping[str, str] | None) -> dict[str, str]:
    return {**os.environ, "COLUMNS": "200", **(env or {})}


def json_object(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The one JSON object a ``--json`` run printed on stdout (the assertion names the command and its output)."""
    try:
        doc = json.loads(result.stdout)
    except ValueError as exc:
        message = f"{result.args}: stdout is not one JSON object ({exc}):\n{result.stdout}\n{result.stderr}"
        raise AssertionError(message) from None
    assert isinstance(doc, dict), f"{result.args}: stdout is JSON but not an object: {result.stdout[:200]}"
    return doc


def flat(text: str) -> str:
    """``text`` with every run of whitespace as one space (error messages may wrap)."""
    return " ".join(text.split())
