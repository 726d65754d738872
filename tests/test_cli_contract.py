"""One CLI contract, every command: the cases are enumerated from the typer app, so a new command is covered the
day it is added (and :data:`JSON_CASES` must say how to run it offline, or the test that lists them fails).

* an unknown flag exits 2, ``--help`` exits 0;
* for every command that reads a stack: a stack file that is missing, not UTF-8, tab-indented, unclosed or empty
  exits 2 with a message naming the file and the problem, and no traceback; with ``--json`` stdout is the error
  object carrying ``stack`` and ``ok: false``;
* ``--json`` output carries ``stack`` and ``ok`` (true exactly when the exit code is 0), on success for every
  command that can run offline, and on the error path for those that need live hosts.

The ``--json`` cases run the installed console script (one subprocess per command: what ships); the matrices of
bad input run the same app in-process (:func:`tests.support.cli.exaserve_in_process`).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import typer
from rich.console import Console

from serving.cli.commands import register
from serving.cli.options import ProgressLines, app
from tests.support.cli import EXASERVE, exaserve, exaserve_in_process, exaserve_on_terminal, flat, json_object
from tests.support.paths import REPO
from tests.support.repo import working_tree_repo
from tests.support.stacks import write_variant

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # a terminal's colour and cursor codes

Command = tuple[str, ...]


def _walk(cmd: Any, path: Command) -> Iterator[tuple[Command, Any]]:
    subcommands = getattr(cmd, "commands", None)
    if subcommands is None:
        yield path, cmd
        return
    for name, sub in sorted(subcommands.items()):
        yield from _walk(sub, (*path, name))


def _commands() -> dict[Command, set[str]]:
    """Every command and subcommand of the app -> the names of its parameters."""
    register(None)
    return {path: {p.name for p in cmd.params} for path, cmd in _walk(typer.main.get_command(app), ())}


COMMANDS = _commands()
GROUPS = sorted({path[:i] for path in COMMANDS for i in range(len(path))})
STACK_COMMANDS = [c for c, params in COMMANDS.items() if {"stack", "stack_file"} <= params]


def _id(cmd: Command) -> str:
    return " ".join(cmd) or "exaserve"


# What each command needs besides the stack to get as far as reading it (required options, a probe after --).
EXTRA: dict[Command, list[str]] = {
    ("render",): ["--out", "{tmp}/out"],
    ("diff",): ["--base", "HEAD"],
    ("units",): ["--router"],
    ("fleet", "exec"): ["--", "uptime"],
    ("agent", "run"): ["--node", "gpu-r00-n00"],
    ("fit",): ["--hf-config", "models/llama-3-70b/config.json"],
    ("drill",): ["--list"],
}
# How each command runs with --json offline: its arguments and its exit code. Commands that need live hosts run
# into a bad-input error before any connection (a missing known_hosts, a stack without a sandbox) and print the
# error object; the rest succeed.
JSON_CASES: dict[Command, tuple[list[str], int]] = {
    ("plan",): (["--stack", "dev"], 0),
    ("audit-source",): ([], 0),
    ("schema",): ([], 0),
    ("render",): (["--stack", "dev", "--out", "{tmp}/out"], 0),
    ("check",): (["--stack", "dev"], 0),
    ("diff",): (["--stack", "dev", "--base", "main"], 0),
    ("image",): (["--stack", "prod", "--tag", "0.1.0"], 0),
    ("units",): (["--stack", "dev", "--router"], 0),
    ("preflight",): (["--stack", "dev", "--known-hosts", "{tmp}/no-known-hosts"], 2),
    ("fleet", "exec"): (["--stack", "dev", "--known-hosts", "{tmp}/no-known-hosts", "--", "uptime"], 2),
    ("sandbox", "up"): (["--stack", "dev"], 2),
    ("sandbox", "down"): (["--stack", "sandbox"], 0),
    ("sandbox", "load"): (["--stack", "dev"], 2),
    # Offline, every replica of the sandbox is down: the plan from the fleet refuses without --allow-degraded.
    ("rollout",): (["--stack", "sandbox", "--to", "v2", "--dry-run"], 2),
    ("rollback",): (["--stack", "sandbox"], 0),
    ("controller", "run"): (["--stack", "dev"], 2),  # no --router: refused before anything starts
    ("agent", "run"): (["--stack", "dev", "--node", "nowhere", "--controller", "http://127.0.0.1:9"], 2),
    ("status",): (["--stack", "dev"], 2),  # no --controller
    ("fit",): (["--stack", "dev", "--hf-config", "models/llama-3-70b/config.json"], 0),
    ("history",): (["--stack", "dev"], 0),
    ("drill",): (["--stack", "dev", "--list"], 0),
}

BAD_STACKS: dict[str, tuple[bytes | None, str]] = {
    "missing": (None, "file not found"),
    "not-utf8": (b"config:\n  exaserve:cluster:\n    name: caf\xe9\n", "not UTF-8 text: byte 0xe9 at line 3"),
    "tab-indented": (b"config:\n\texaserve:cluster: {}\n", "line 2, column 1: a tab indents this line"),
    "unclosed": (b"config:\n  exaserve:cluster: {name: dev\n", "not valid YAML: line 3, column 1"),
    "empty": (b"", "the file is empty"),
}


def _args(args: list[str], tmp: Path) -> list[str]:
    return [a.replace("{tmp}", str(tmp)) for a in args]


def _with_json(cmd: Command, args: list[str]) -> list[str]:
    """``cmd --json ARGS``, keeping a probe after ``--`` last."""
    return [*cmd, "--json", *args]


@pytest.fixture
def state_env(tmp_path: Path) -> dict[str, str]:
    """A private state directory: no test reads or writes the user's."""
    return {"EXASERVE_STATE_DIR": str(tmp_path / "state")}


def test_the_app_has_the_commands_the_docs_list() -> None:
    assert set(COMMANDS) == {
        ("plan",), ("audit-source",), ("schema",), ("render",), ("check",), ("diff",), ("image",), ("units",),
        ("preflight",),
        ("fleet", "exec"), ("sandbox", "up"), ("sandbox", "down"), ("sandbox", "load"), ("rollout",), ("rollback",),
        ("controller", "run"), ("agent", "run"), ("status",), ("fit",), ("drill",), ("history",),
    }  # fmt: skip
    assert set(COMMANDS) - set(STACK_COMMANDS) == {("schema",)}


def test_every_command_has_json_and_an_offline_json_case() -> None:
    assert [c for c, params in COMMANDS.items() if "as_json" not in params] == []
    assert set(JSON_CASES) == set(COMMANDS), "add the new command to JSON_CASES"


@pytest.mark.parametrize("cmd", list(COMMANDS), ids=_id)
def test_an_unknown_flag_exits_2(cmd: Command) -> None:
    r = exaserve_in_process(*cmd, "--no-such-flag")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "No such option: --no-such-flag" in flat(r.stderr)
    assert "Traceback" not in r.stdout + r.stderr


@pytest.mark.parametrize("cmd", [*GROUPS, *COMMANDS], ids=_id)
def test_help_exits_0(cmd: Command) -> None:
    r = exaserve_in_process(*cmd, "--help")
    assert r.returncode == 0, r.stderr
    assert "Usage:" in r.stdout and "Traceback" not in r.stdout + r.stderr


@pytest.mark.parametrize("kind", list(BAD_STACKS))
@pytest.mark.parametrize("cmd", STACK_COMMANDS, ids=_id)
def test_a_bad_stack_file_exits_2_naming_the_file_and_the_problem(
    cmd: Command, kind: str, tmp_path: Path, state_env: dict[str, str]
) -> None:
    content, problem = BAD_STACKS[kind]
    path = tmp_path / f"Pulumi.{kind}.yaml"
    if content is not None:
        path.write_bytes(content)
    r = exaserve_in_process(*cmd, "--stack-file", str(path), *_args(EXTRA.get(cmd, []), tmp_path), env=state_env)
    assert r.returncode == 2, r.stdout + r.stderr
    message = flat(r.stderr)
    assert f"error: {path}:" in message and problem in message, message
    assert "Traceback" not in r.stdout + r.stderr


@pytest.mark.parametrize("cmd", STACK_COMMANDS, ids=_id)
def test_a_bad_stack_file_with_json_prints_the_error_object(
    cmd: Command, tmp_path: Path, state_env: dict[str, str]
) -> None:
    path = tmp_path / "Pulumi.broken.yaml"
    path.write_bytes(BAD_STACKS["tab-indented"][0] or b"")
    args = _with_json(cmd, ["--stack-file", str(path), *_args(EXTRA.get(cmd, []), tmp_path)])
    r = exaserve_in_process(*args, env=state_env)
    assert r.returncode == 2, r.stdout + r.stderr
    doc = json_object(r)
    assert doc["stack"] == "broken" and doc["ok"] is False and doc["exit_code"] == 2
    assert str(path) in doc["error"] and "a tab indents this line" in doc["error"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`diff` compares with a git revision: a repository whose main is this working tree."""
    return working_tree_repo(tmp_path_factory.mktemp("repo") / "exaserve")


@pytest.mark.parametrize("cmd", list(JSON_CASES), ids=_id)
def test_json_carries_stack_and_ok(cmd: Command, repo: Path, tmp_path: Path, state_env: dict[str, str]) -> None:
    args, code = JSON_CASES[cmd]
    r = exaserve(*_with_json(cmd, _args(args, tmp_path)), cwd=repo, env=state_env, timeout_s=300)
    assert r.returncode == code, r.stdout + r.stderr
    doc = json_object(r)
    assert "stack" in doc and doc["ok"] is (code == 0), doc
    special: dict[Command, str | None] = {("schema",): None, ("audit-source",): "source-plan"}
    expected_stack = special[cmd] if cmd in special else args[1]
    assert doc["stack"] == expected_stack
    if code:
        assert doc["exit_code"] == code and doc["error"] and flat(doc["error"]) in flat(r.stderr)


def _stack_default(cmd: Command) -> object:
    group: Any = typer.main.get_command(app)
    for name in cmd:
        group = group.commands[name]
    return next(p.default for p in group.params if p.name == "stack")


# The commands that act on a fleet (issue 28): none of them picks a stack by default, as pulumi needs a selected one.
FLEET_COMMANDS = [
    ("rollout",), ("rollback",), ("preflight",), ("status",), ("fleet", "exec"), ("drill",), ("controller", "run"),
    ("agent", "run"), ("history",),
]  # fmt: skip


def test_only_the_fleet_commands_have_no_default_stack() -> None:
    no_default = {c for c in STACK_COMMANDS if _stack_default(c) is None}
    # audit-source's None is a choice of its own: without a stack it audits the source plan's config
    assert no_default - {("audit-source",)} == set(FLEET_COMMANDS)


@pytest.mark.parametrize("cmd", FLEET_COMMANDS, ids=_id)
def test_a_fleet_command_without_a_named_stack_exits_2(cmd: Command, tmp_path: Path) -> None:
    args = [*cmd, *_args(EXTRA.get(cmd, []), tmp_path)]
    if cmd == ("rollout",):
        args += ["--to", "v2"]
    r = exaserve_in_process(*args, env={"EXASERVE_STACK": ""})
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    message = flat(r.stderr)
    assert "no stack named" in message and "--stack NAME" in message and "EXASERVE_STACK=NAME" in message
    assert "dev, prod, sandbox" in message  # the stacks of the checkout, to choose from
    # The same command with the stack in the environment reads it (and goes on to its own next error or result).
    named = exaserve_in_process(*args, env={"EXASERVE_STACK": "dev", "EXASERVE_STATE_DIR": str(tmp_path / "s")})
    assert "no stack named" not in flat(named.stderr), named.stderr


def test_exaserve_stack_selects_the_stack_of_every_command() -> None:
    r = exaserve_in_process("plan", "--json", env={"EXASERVE_STACK": "dev"})
    assert r.returncode == 0, r.stderr
    assert json_object(r)["stack"] == "dev"


@pytest.mark.parametrize("args", [["rollout", "--to", "v2"], ["rollout", "--resume"], ["rollback"]], ids=" ".join)
def test_changing_prod_without_a_terminal_needs_yes(args: list[str], tmp_path: Path) -> None:
    env = {"EXASERVE_STATE_DIR": str(tmp_path)}
    r = exaserve_in_process(*args, "--stack", "prod", env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "production stack 'prod'" in flat(r.stderr) and "pass --yes" in flat(r.stderr)
    assert not (tmp_path / "prod").exists()  # refused before the state (journal, lock) was touched
    # --yes confirms: the command goes on (here to the kubernetes backend, which has no cluster to reach)
    confirmed = exaserve_in_process(*args, "--stack", "prod", "--yes", env=env)
    assert "production stack" not in flat(confirmed.stderr), confirmed.stderr
    # a dry run changes nothing and asks nothing; another stack is not asked about
    if args[1:2] == ["--to"]:
        dry = exaserve_in_process(*args, "--stack", "prod", "--dry-run", env=env)
        assert "production stack" not in flat(dry.stderr), dry.stderr
    other = exaserve_in_process(*args, "--stack", "dev", env=env)
    assert "production stack" not in flat(other.stderr), other.stderr


def test_changing_prod_on_a_terminal_asks_and_a_no_changes_nothing(tmp_path: Path) -> None:
    r = exaserve_on_terminal(
        "rollout", "--stack", "prod", "--to", "v2", answer="n", env={"EXASERVE_STATE_DIR": str(tmp_path)}
    )
    assert "rollout --to v2 changes the production stack 'prod'. Continue? [y/N]" in r.stdout, r.stdout
    assert r.returncode == 1, r.stdout
    assert "not confirmed: nothing was changed" in r.stdout
    assert not (tmp_path / "prod").exists()


@contextmanager
def banner_breakers(addresses: list[str]) -> Iterator[int]:
    """A TCP listener on the same port of each loopback address that accepts a connection and closes it at once:
    an SSH client fails reading the protocol banner, as on a node whose sshd is overloaded or behind a broken proxy."""
    sockets: list[socket.socket] = []
    port = 0
    for address in addresses:
        s = socket.socket()
        s.bind((address, port))
        s.listen(64)
        s.settimeout(0.2)
        port = s.getsockname()[1]
        sockets.append(s)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            for s in sockets:
                with contextlib.suppress(OSError):
                    s.accept()[0].close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        stop.set()
        thread.join(5)
        for s in sockets:
            s.close()


def test_unreachable_ssh_nodes_give_one_line_each_and_no_traceback(tmp_path: Path) -> None:
    """Issue 28: `rollout --backend ssh --dry-run` against nodes that fail the SSH handshake wrote 5,383 lines to
    stderr, paramiko's traceback of each failed banner read, before its one-line error, which named no node's cause
    and did not say that --dry-run reads every node too."""
    nodes = 4
    addresses = [f"127.0.0.{11 + i}" for i in range(nodes)]
    with banner_breakers(addresses) as port:
        changes = {"cluster.pools.0.count": nodes, "cluster.pools.0.racks": 1, "cluster.pools.0.subnet": "127.0.0.0/24",
                   "cluster.pools.0.first_address": addresses[0], "cluster.pools.0.ssh_port": port,
                   "serving.replicas": nodes * 8, "serving.target_replicas": nodes * 8}  # fmt: skip
        stack = write_variant(tmp_path, "ssh", "dev", changes)
        known_hosts = tmp_path / "known_hosts"
        known_hosts.write_text("")
        r = exaserve("rollout", "--stack-file", str(stack), "--to", "v1", "--dry-run", "--backend", "ssh",
                     "--known-hosts", str(known_hosts), env={"EXASERVE_STATE_DIR": str(tmp_path / "state")})  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr[:2000]
    # each node's SSH cause, summarised (nodes failing alike share a line), and what --dry-run needs
    causes = [line for line in r.stderr.splitlines() if "not reached: " in line]
    assert 1 <= len(causes) <= nodes and all("Error reading SSH protocol banner" in line for line in causes), r.stderr
    named = [a for line in causes for a in addresses if f"({a})" in line]
    assert sorted(named) == addresses, r.stderr  # every node, in exactly one line
    assert "--dry-run included, first reads what each replica runs over SSH" in r.stderr, r.stderr
    assert "--known-hosts holds their host keys" in " ".join(r.stderr.split()), "the SSH fixes are named"
    assert len(r.stderr.splitlines()) <= nodes + 4, r.stderr  # the wrapped error, ≤ a line per node, the --dry-run note


def test_piped_output_is_not_cut_at_80_columns() -> None:
    """Issue 28: piped, `fit`'s headers read `prec… repl… weig…` and `status` cut every replica name: rich gives a
    console that is not a terminal 80 columns. Piped (and without COLUMNS) the tables are as wide as they need."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    args = ["fit", "--stack", "dev", "--hf-config", "models/llama-3-70b/config.json"]
    r = subprocess.run(
        [str(EXASERVE), *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=120, check=False
    )
    assert r.returncode in (0, 1), r.stderr
    header = next(line for line in r.stdout.splitlines() if "TP×PP" in line)
    assert "precision" in header and "replicas" in header and "weights/GPU" in header, header
    assert "…" not in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) > 80  # the full table, wider than a default terminal


def test_output_wide_prints_plain_full_width_columns_on_a_narrow_terminal() -> None:
    """Issue 28: `--output wide`, as kubectl's: on an 80-column terminal the boxed table cuts `fit`'s columns to
    `pre… rep…`; wide prints every column whole, unboxed, a layout a line (the terminal wraps, the table does not)."""
    args = ["fit", "--stack", "dev", "--hf-config", "models/llama-3-70b/config.json"]
    boxed = exaserve_on_terminal(*args, answer="", env={"COLUMNS": "80"})
    wide = exaserve_on_terminal(*args, "--output", "wide", answer="", env={"COLUMNS": "80"})
    assert boxed.returncode in (0, 1) and wide.returncode == boxed.returncode, wide.stdout
    assert "…" in flat(boxed.stdout) and "┃" in boxed.stdout  # what an operator at a narrow terminal reads by default
    text = ANSI.sub("", wide.stdout)
    assert "…" not in text and not set("│┃━─") & set(text), text
    header = next(line for line in text.splitlines() if "TP×PP" in line)
    assert header.split()[:4] == ["precision", "kv", "TP×PP", "replicas"] and "weights/GPU" in header, header
    rows = [line.split() for line in text.splitlines() if line.split()[:1] in (["bf16"], ["fp8"])]
    assert rows and all(len(row[2].split("×")) == 2 and row[6] == "GiB" for row in rows), text
    assert max(len(line) for line in text.splitlines()) > 80


def test_shell_completion_completes_commands_and_a_lazy_commands_options() -> None:
    """Issue 28: no shell completion. The script installs with `--install-completion`; the commands complete from
    the lazy table, and a command's options once its module is imported to resolve it."""
    # typer detects the user's shell from the parent process; its test switch takes the shell as the value instead
    script = exaserve("--show-completion", "bash", env={"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"})
    assert script.returncode == 0 and "_EXASERVE_COMPLETE=complete_bash" in script.stdout, script.stdout + script.stderr

    def complete(words: str) -> list[str]:
        env = {"_EXASERVE_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - 1)}
        r = exaserve(env=env)
        assert r.returncode == 0, r.stderr
        return r.stdout.split()

    assert complete("exaserve roll") == ["rollout", "rollback"]
    assert complete("exaserve rollout --acc") == ["--accept-inconclusive"]


def test_progress_lines_off_a_terminal_one_per_step_and_a_repeat_at_most_every_interval() -> None:
    """Issue 28: piped, `drill` printed nothing for 1 m 46 s (its spinner shows nothing off a terminal). Off a
    terminal each step is a line; a step that reports often (the drill's watch, several times a second) repeats at
    most every interval. On a terminal nothing: the spinner shows it."""
    now = [0.0]
    piped = Console(file=io.StringIO(), force_terminal=False, width=200)
    lines = ProgressLines(piped, every_s=10.0, clock=lambda: now[0])
    for t, text in [(0, "baseline: 10 s of load"), (1, "fault injected: kill"), (1.5, "watching: 0.5 s after"),
                    (2, "watching: 1.0 s after"), (11.6, "watching: 10.6 s after"), (12, "healed at 12 s: x")]:  # fmt: skip
        now[0] = t
        lines(text)
    shown = [line.split(" ", 1)[1] for line in piped.file.getvalue().splitlines()]  # type: ignore[attr-defined]
    assert shown == ["baseline: 10 s of load", "fault injected: kill", "watching: 0.5 s after",
                     "watching: 10.6 s after", "healed at 12 s: x"]  # fmt: skip
    terminal = Console(file=io.StringIO(), force_terminal=True)
    ProgressLines(terminal)("baseline: 10 s")
    assert terminal.file.getvalue() == ""  # type: ignore[attr-defined]
    ProgressLines(terminal, on_terminal=True)("starting 8 simulated workers")  # `sandbox up`: no spinner to show it
    assert terminal.file.getvalue().endswith("starting 8 simulated workers\n")  # type: ignore[attr-defined]


def test_the_main_job_says_the_pending_digests_in_one_line_naming_the_command_that_lists_them() -> None:
    """Issue 37: scripts/run.sh (the README's main job, on prod) printed a four-line block for each of prod's 15
    tag-pinned images, some 60 lines after the plan. Its check (read from the script, run on its default stack) says
    it in one line, how many and the command that lists each; that command still lists every one with its fix."""
    script = (REPO / "scripts" / "run.sh").read_text().splitlines()
    line = next(words for words in map(shlex.split, (s for s in script if not s.lstrip().startswith("#")))
                if words[:2] == ["$exaserve", "check"])  # fmt: skip
    result = exaserve(*[{"$STACK": "prod"}.get(w, w) for w in line[1:]])
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(result.stdout.splitlines()) == 1 and "15 container images pending a digest" in result.stdout, (
        result.stdout[-3000:]
    )
    named = re.findall(r"`(exaserve check [^`]*)`", result.stdout)
    assert named == ["exaserve check --stack prod"], result.stdout
    detail = exaserve_in_process(*shlex.split(named[0])[1:])
    assert detail.returncode == 1 and detail.stdout.count("[images-by-digest]") == 15, detail.stdout[-3000:]
    assert detail.stdout.count("fix:") == 15, detail.stdout[-3000:]
