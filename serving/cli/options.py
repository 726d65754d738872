"""The one contract of the ``exaserve`` CLI: the typer app, consoles, every shared option, stack loading, the
JSON envelope and the exit codes. Commands take their options from here; none declares its own copy.

Exit codes, the same for every command:

====  =============================================================================================
code  meaning
====  =============================================================================================
0     done: the command did what it was asked and found nothing wrong
1     found a problem: plan rule or policy violations, objects failing schema validation, a rendered
      command line the pinned SGLang/router parser rejects, a failed or unreachable node, a rollout
      rolled back or paused, client-facing errors under load
2     bad input: an unknown flag or a missing option (every typer/click usage error), a missing file,
      a stack file that is not UTF-8 or not YAML (tab-indented, unclosed, empty), a spec that fails
      validation, an unknown version or replica, another updater holding the stack's lock
130   interrupted (Ctrl-C)
====  =============================================================================================

Every error names what was wrong, the value and the fix; no traceback reaches a user for a mistake they
made. With ``--json`` stdout carries exactly one JSON object, always with ``stack`` (the stack's name,
null for ``schema``) and ``ok`` (true exactly when the exit code is 0); on an error that object is
``{"stack", "ok": false, "exit_code", "error"}`` and the message also goes to stderr. (A usage error — an
unknown flag, a missing option — is refused by the parser before the command runs: plain text, exit 2.)
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn, TypeVar, get_type_hints

import typer
from rich.console import Console
from rich.table import Table

from serving import paths
from serving.cli.commands import app  # defined with the command table, which --help reads without this module
from serving.spec.stack import DEFAULT_STACK, SpecError, Stack, file_stack_name, load_stack, load_stack_file

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

EXIT_OK, EXIT_PROBLEM, EXIT_BAD_INPUT = 0, 1, 2
EXIT_INVALID = 3  # the measurement cannot be judged (a drill whose probes slipped): neither passed nor failed

PIPE_WIDTH = 1000  # columns of a console that is not a terminal: a table's full width, never cut at 80


def _console(*, stderr: bool = False) -> Console:
    """A console as wide as its terminal; piped or redirected (and without ``COLUMNS``), as wide as its content up
    to :data:`PIPE_WIDTH`, not rich's 80 columns, which cut every replica name of ``status`` to ``sandbox-0-…`` and
    ``fit``'s headers to ``prec…``. Tables are as wide as their content, so a wide console adds no padding."""
    c = Console(stderr=stderr)
    if not c.is_terminal and "COLUMNS" not in os.environ:
        c.width = PIPE_WIDTH
    return c


console = _console()
err_console = _console(stderr=True)

OutputFormat = Literal["table", "wide"]
OutputOpt = Annotated[
    OutputFormat,
    typer.Option(
        "--output",
        "-o",
        help="table: boxed, fitted to a terminal (piped: full width); wide: plain columns at full width on a terminal "
        "too, never cut, as kubectl's -o wide (for awk and grep).",
    ),
]


def print_table(table: Table, output: OutputFormat) -> None:
    """``table`` on stdout: boxed and fitted to the terminal (``table``), or as plain columns as wide as their content
    whatever the terminal (``wide``): no border, no cell cut to ``…`` or folded."""
    if output == "table":
        console.print(table)
        return
    table.box, table.show_edge, table.pad_edge = None, False, False
    for column in table.columns:
        column.no_wrap = True
    Console(width=PIPE_WIDTH).print(table)


DEFAULT_KNOWN_HOSTS = Path("~/.ssh/known_hosts")
_STACK_META = "exaserve.stack"  # context meta key: the loaded stack's name, for the error JSON
# The running command's context, recorded by --json's callback (every command has --json), so that fail() knows
# whether to print the error object and for which stack.
_invocation: ContextVar[typer.Context | None] = ContextVar("exaserve_invocation", default=None)
# The code bad input exits with: 2, except under `diff --detailed-exitcode`, where 2 means "changes" and an error
# exits 1 (terraform plan's convention), so a CI job never reads a mistake as a change.
_bad_input_code: ContextVar[int] = ContextVar("exaserve_bad_input_code", default=EXIT_BAD_INPUT)


def errors_exit(code: int) -> None:
    """From now on in this command, :func:`fail` with the default code exits ``code`` instead of 2."""
    _bad_input_code.set(code)


def _expand_user(value: Path | None) -> Path | None:
    return value.expanduser() if value is not None else None


def _record_invocation(ctx: typer.Context, value: bool) -> bool:
    _invocation.set(ctx)
    return value


STACK_ENV = "EXASERVE_STACK"
StackOpt = Annotated[
    str | None,
    typer.Option(
        "--stack",
        "-s",
        envvar=STACK_ENV,
        show_envvar=True,
        help="Stack name: Pulumi.<stack>.yaml in the Pulumi project (default: $EXASERVE_STACK; the commands that act "
        "on a fleet — rollout, rollback, preflight, status, fleet, drill, controller, agent — have no other default).",
    ),
]
StackFileOpt = Annotated[
    Path | None,
    typer.Option("--stack-file", help="Any stack file, by path; overrides --stack.", dir_okay=False),
]
AllowTagsOpt = Annotated[
    bool,
    typer.Option(
        "--allow-tags",
        help="A production stack's images may still be tags: each is listed as pending (with the digest to set) "
        "instead of failing images-by-digest, for a pull request or scripts/run.sh before the image workflow has "
        "published digests. `pulumi up`'s policy pack has no such switch.",
    ),
]


JsonOpt = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Print one JSON object (always with 'stack' and 'ok') instead of tables.",
        callback=_record_invocation,
    ),
]
KnownHostsOpt = Annotated[
    Path,
    typer.Option(
        "--known-hosts",
        help="known_hosts holding every node's host key; keys are always verified, never added.",
        dir_okay=False,
        callback=_expand_user,
    ),
]
SshConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--ssh-config",
        help="OpenSSH client configuration to reach the nodes through (ProxyJump, ProxyCommand, IdentityFile, "
        "HostName, looked up by each node's address; default ~/.ssh/config when it exists); /dev/null for none.",
        dir_okay=False,
        callback=_expand_user,
    ),
]
IdentityOpt = Annotated[
    Path | None,
    typer.Option(
        "--identity",
        "-i",
        help="SSH private key (default: your SSH agent's and ~/.ssh keys).",
        dir_okay=False,
        callback=_expand_user,
    ),
]
KubeServerOpt = Annotated[
    str | None,
    typer.Option(
        "--kube-server",
        help="kubernetes: API server URL, with --kube-token-file and --kube-ca-file (instead of a kubeconfig).",
    ),
]
KubeTokenOpt = Annotated[
    Path | None,
    typer.Option(
        "--kube-token-file", help="kubernetes: bearer token file (with --kube-server).", callback=_expand_user
    ),
]
KubeCaOpt = Annotated[
    Path | None,
    typer.Option(
        "--kube-ca-file", help="kubernetes: CA bundle of the API server (with --kube-server).", callback=_expand_user
    ),
]
KubeconfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--kubeconfig",
        help="kubernetes: the kubeconfig to reach the API server with (default: $KUBECONFIG, else ~/.kube/config "
        "when it exists, else the pod's service account); exec credential plugins, OIDC and client certificates "
        "work as in kubectl.",
        dir_okay=False,
        callback=_expand_user,
    ),
]
KubeContextOpt = Annotated[
    str | None,
    typer.Option(
        "--kube-context",
        help="kubernetes: the kubeconfig context (default: the stack file's kubernetes:context, the one the Pulumi "
        "provider deploys with, else the kubeconfig's current context).",
    ),
]
CrdDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--crd-dir",
        help="Directory of the upstream CRD YAML files (LeaderWorkerSet, Prometheus operator, Multus, Chaos "
        "Mesh), checked against the pinned sha256s (default: ../shared/crds beside the Pulumi project when present, "
        "else the cache that `python -m serving.pulumi.crds fetch` fills).",
        file_okay=False,
        callback=_expand_user,
    ),
]
StateDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="Root of the per-stack state (journals, locks, sandbox processes, reports) "
        "(default: $EXASERVE_STATE_DIR, else $XDG_STATE_HOME/exaserve, else ~/.local/state/exaserve).",
        file_okay=False,
        callback=_expand_user,
    ),
]


class ProgressLines:
    """What a long command is doing, as plain timestamped lines on a console that is not a terminal (piped, in CI,
    under nohup), where a spinner shows nothing: a line when the step changes (the text before its first ``:``),
    and the same step again at most every ``every_s`` seconds. On a terminal it prints nothing (the spinner
    shows it) unless ``on_terminal`` (a command with no spinner)."""

    def __init__(
        self,
        out: Console,
        every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        *,
        on_terminal: bool = False,
    ) -> None:
        self.out, self.every_s, self.clock, self.on_terminal = out, every_s, clock, on_terminal
        self._step: str | None = None
        self._at = -math.inf

    def __call__(self, text: str) -> None:
        if self.out.is_terminal and not self.on_terminal:
            return
        step, now = text.partition(":")[0], self.clock()
        if step == self._step and now - self._at < self.every_s:
            return
        self._step, self._at = step, now
        self.out.print(f"{time.strftime('%H:%M:%S')} {text}", highlight=False, markup=False, soft_wrap=True)


def resolve_stack(stack: str | None, stack_file: Path | None) -> Stack:
    """Load ``--stack-file`` or else the named ``--stack``; exit 2 naming the file, the problem and the fix. A
    command that acts on a fleet has no default stack (its ``stack`` defaults to None): without ``--stack``,
    ``$EXASERVE_STACK`` or ``--stack-file`` it exits 2, as ``pulumi`` does without a selected stack."""
    try:
        st = _load_stack(stack, stack_file)
    except SpecError as exc:
        fail(str(exc))
    ctx = _invocation.get()
    if ctx is not None:
        ctx.meta[_STACK_META] = st.name
    return st


def _load_stack(stack: str | None, stack_file: Path | None) -> Stack:
    if stack_file is not None:
        return load_stack_file(stack_file)
    if stack is not None:
        return load_stack(stack)
    fail(
        f"no stack named: this command acts on a fleet, so it has no default stack; pass --stack NAME or set "
        f"{STACK_ENV}=NAME (stacks here: {_stack_names()}), or --stack-file PATH"
    )


def _stack_names() -> str:
    """The stacks of the Pulumi project (``Pulumi.<name>.yaml``), for an error message."""
    try:
        names = sorted(
            p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in paths.project_dir().glob("Pulumi.*.yaml")
        )
    except paths.ProjectNotFoundError:
        return "no Pulumi project found from here"
    return ", ".join(names) or "none"


def require_file(path: Path | None, flag: str, why: str) -> None:
    """Exit 2 unless ``path`` (when given) is an existing file; ``why`` says what the file is for."""
    try:
        paths.require_file(path, flag, why)
    except paths.MissingFileError as exc:
        fail(str(exc))


def _stack_label() -> str | None:
    """The stack the running command is about: its loaded name, else what --stack-file or --stack named."""
    ctx = _invocation.get()
    if ctx is None:
        return None
    if _STACK_META in ctx.meta:
        return str(ctx.meta[_STACK_META])
    stack_file, stack = ctx.params.get("stack_file"), ctx.params.get("stack")
    if isinstance(stack_file, Path):
        return file_stack_name(stack_file)
    return stack if isinstance(stack, str) else None


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print an error for the user (no traceback) and exit with ``code``; with ``--json`` also the error object."""
    if code == EXIT_BAD_INPUT:
        code = _bad_input_code.get()
    err_console.print(f"error: {message}", highlight=False, markup=False)
    ctx = _invocation.get()
    if ctx is not None and ctx.params.get("as_json"):
        _write({"stack": _stack_label(), "ok": False, "exit_code": code, "error": message})
    raise typer.Exit(code)


def emit_json(doc: Mapping[str, Any], *, stack: str | None, ok: bool) -> None:
    """Print the command's one JSON object: ``stack`` and ``ok`` first, then ``doc``'s other keys."""
    _write({"stack": stack, "ok": ok, **{k: v for k, v in doc.items() if k not in ("stack", "ok")}})


def _write(obj: object) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


@contextmanager
def render_errors(source: Path) -> Iterator[None]:
    """Rendering problems as exit codes: 2 for a spec the renderers cannot serve, 1 for a rendered command
    line the pinned SGLang/router parser rejects (or a broken flag manifest). ``source`` is the stack file."""
    from serving.flags import FlagValidationError, ManifestError  # noqa: PLC0415 - only rendering commands
    from serving.render.common import RenderError  # noqa: PLC0415

    try:
        yield
    except RenderError as exc:
        fail(f"{source}: {exc}", EXIT_BAD_INPUT)
    except (FlagValidationError, ManifestError) as exc:
        fail(f"{source}: {exc}", EXIT_PROBLEM)


T = TypeVar("T", bound="DataclassInstance")
R = TypeVar("R")


def shared_options(cls: type[T], param: str) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Declare options once for several commands: the command's ``param: cls`` (a dataclass whose fields are
    Annotated typer options with defaults) becomes one option per field, and the command receives the
    dataclass built from them."""
    fields = dataclasses.fields(cls)
    field_hints = get_type_hints(cls, include_extras=True)

    def decorate(command: Callable[..., R]) -> Callable[..., R]:
        hints = get_type_hints(command, include_extras=True)
        own = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints[p.name])
            for p in inspect.signature(command).parameters.values()
            if p.name != param
        ]
        shared = [
            inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=field_hints[f.name])
            for f in fields
        ]

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> R:
            values = {f.name: kwargs.pop(f.name) for f in fields}
            return command(**kwargs, **{param: cls(**values)})

        params = [*own, *shared]
        wrapper.__signature__ = inspect.Signature(params, return_annotation=hints.get("return"))  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper

    return decorate


__all__ = [
    "DEFAULT_KNOWN_HOSTS",
    "DEFAULT_STACK",
    "EXIT_BAD_INPUT",
    "EXIT_INVALID",
    "EXIT_OK",
    "EXIT_PROBLEM",
    "IdentityOpt",
    "JsonOpt",
    "KnownHostsOpt",
    "ProgressLines",
    "SshConfigOpt",
    "StackFileOpt",
    "StackOpt",
    "StateDirOpt",
    "app",
    "console",
    "emit_json",
    "err_console",
    "fail",
    "render_errors",
    "require_file",
    "resolve_stack",
    "shared_options",
]
