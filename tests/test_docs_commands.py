"""Docs that run: every ``exaserve …`` command line of README.md and docs/*.md is parsed by the real CLI, and every
``ansible-playbook …`` line is syntax-checked by the real ansible-playbook in the working directory the docs give
it (``cd ansible && …`` carries over to the lines after it in the same block, as in a shell).

Issue 28: docs/rollout.md showed ``--router-url`` and ``--metrics-url``, which the parser refuses ("No such
option"); the README's ``ansible-playbook ansible/site.yml --check --diff`` from the repository root found no
ansible.cfg (forks 5, no collections, "No inventory was parsed").

What is parsed: the lines of fenced code blocks that start with the command (continuation lines joined), and
inline code spans that hold a command with at least one option (a bare `exaserve render` in prose names a command,
it is not a command line). A synopsis is parsed with every optional part in it: ``[--json]`` as ``--json``,
``up\\|down`` as its first alternative, ``a | b`` as both; ``…`` is dropped. Anything after a shell operator
(``|`` between commands, ``&&``, ``>``, ``&``) or a ``#`` comment is not the command's. An upper-case placeholder
(``S``, ``DIR``, ``R``) may stand where the parser wants a number or an existing file; a code block's command must
also have every required option, a prose span need not.
"""

from __future__ import annotations

import configparser
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest
import typer

from serving.checks.preflight import CHECKS
from serving.cli.commands import register
from serving.cli.options import app
from tests.support.cli import exaserve_in_process
from tests.support.paths import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```")
INLINE = re.compile(r"`((?:exaserve|ansible-playbook) [^`]+)`")
SYNOPSIS = re.compile(r"\[|\]|\\\||…|\.\.\.")
OPERATORS = {"|", "||", "&&", "&", ";", ">", ">>", "2>", "2>&1", "<"}


@dataclass(frozen=True)
class DocCommand:
    source: str  # file:line
    argv: tuple[str, ...]
    cwd: Path
    block: bool  # a code block's line (complete, as run), not a prose span

    def __str__(self) -> str:
        return f"{self.source}: {shlex.join(self.argv)}"


def _words(line: str) -> list[str]:
    """The command's words, up to the first shell operator or comment; a synopsis with its optional parts."""
    synopsis = bool(SYNOPSIS.search(line))
    words = shlex.split(line.replace("\\|", "|").replace("[", " ").replace("]", " "), comments=True)
    out: list[str] = []
    for w in words:
        if w == "|" and synopsis:  # `--concurrency C | --rate R`: both options
            continue
        if w in OPERATORS or w.startswith(("2>", ">")):
            break
        if w in ("…", "..."):
            continue
        out.append(w.split("|")[0] if synopsis and "|" in w else w)
    return out


def _blocks(path: Path) -> list[tuple[int, str]]:
    """(line number, logical line) of every fenced code block, continuation lines (``\\``) joined."""
    out: list[tuple[int, str]] = []
    inside, pending, start = False, "", 0
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(raw.strip()):
            inside, pending = not inside, ""
            continue
        if not inside:
            continue
        line = raw.rstrip()
        if not pending:
            start = n
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    return out


def doc_commands(program: str) -> list[DocCommand]:
    """Every ``program …`` command the docs show, with its working directory."""
    found: list[DocCommand] = []
    for path in DOCS:
        rel = path.relative_to(REPO)
        cwd = REPO
        for n, line in _blocks(path):
            text = line.strip()
            if text.startswith("cd ") and "&&" in text:  # `cd ansible && …`: the rest of the block runs there
                cwd = REPO / text[3 : text.index("&&")].strip()
                text = text[text.index("&&") + 2 :].strip()
            if text.startswith(f"{program} "):
                found.append(DocCommand(f"{rel}:{n}", tuple(_words(text)), cwd, block=True))
        for n, raw in enumerate(path.read_text().splitlines(), 1):
            for span in INLINE.findall(raw):
                argv = tuple(_words(span))
                if argv[0] == program and any(w.startswith("-") for w in argv) and not _placeholder(argv[1]):
                    found.append(DocCommand(f"{rel}:{n}", argv, REPO, block=False))
    return found


def _placeholder(word: str) -> bool:
    """An upper-case placeholder (``S``, ``NAME``, ``DIR``, ``V``, ``$STACK``) where the docs mean "your value"."""
    return bool(re.fullmatch(r"\$?[A-Z][A-Z0-9_]*", word))


EXASERVE = doc_commands("exaserve")
PLAYBOOKS = doc_commands("ansible-playbook")


def _rest(ctx: Any) -> list[str]:
    """A group's arguments left after its own options: the subcommand and what follows it."""
    return [*getattr(ctx, "_protected_args", []), *ctx.args]


def parse(argv: tuple[str, ...]) -> None:
    """Parse ``argv`` (after ``exaserve``) with the real command tree (the click copy typer runs on, hence Any), as
    the console script does, without running the command: unknown options, missing values and bad types raise its
    usage errors (:class:`typer.TyperException`; a bad value :class:`typer.BadParameter`)."""
    register(None)
    command: Any = typer.main.get_command(app)
    if "--install-completion" in argv:  # its callback edits the shell's rc file: the option is looked up instead
        assert argv == ("exaserve", "--install-completion")
        assert any("--install-completion" in p.opts for p in command.params)
        return
    ctx = command.make_context("exaserve", list(argv[1:]))
    args = _rest(ctx)
    while hasattr(command, "commands") and args:
        name, command, args = command.resolve_command(ctx, args)
        ctx = command.make_context(name, list(args), parent=ctx)
        args = _rest(ctx) if hasattr(command, "commands") else []


def test_the_docs_show_commands_of_both_kinds() -> None:
    assert len(EXASERVE) >= 40, [str(c) for c in EXASERVE]
    assert len(PLAYBOOKS) >= 4, [str(c) for c in PLAYBOOKS]


@pytest.mark.parametrize("cmd", EXASERVE, ids=str)
def test_every_documented_exaserve_command_parses(cmd: DocCommand) -> None:
    try:
        parse(cmd.argv)
    except typer.Exit:
        pass  # --version, --help: they print and exit 0
    except typer.TyperException as exc:
        if type(exc).__name__ == "MissingParameter":
            if cmd.block:  # a code block is run as written: every required option is there
                raise AssertionError(f"{cmd}: {exc}") from exc
            return  # prose names the option it is about, not every required one
        # A placeholder where a number or an existing file goes is the docs saying "yours": the option exists.
        if not (isinstance(exc, typer.BadParameter) and any(_placeholder(w) for w in cmd.argv)):
            raise AssertionError(f"{cmd}: {exc}") from exc


def command_path(argv: tuple[str, ...]) -> list[str]:
    """The command ``argv`` names (``exaserve sandbox up`` → ["sandbox", "up"]); raises AssertionError naming the
    first word that is no subcommand where the tree has subcommands."""
    register(None)
    command: Any = typer.main.get_command(app)
    path: list[str] = []
    for word in argv[1:]:
        if word.startswith("-") or _placeholder(word) or word[0].isdigit():
            break
        if not hasattr(command, "commands"):  # a command: a word after its name is one of its arguments, if any
            if not any(isinstance(p, click.Argument) for p in command.params):
                raise AssertionError(
                    f"`exaserve {' '.join([*path, word])}`: {' '.join(path)} takes no argument {word!r}"
                )
            break
        if "/" in word and all(w in command.commands for w in word.split("/")):  # `exaserve plan/render/diff`
            break
        if word not in command.commands:
            raise AssertionError(
                f"`exaserve {' '.join([*path, word])}`: no such command (has {sorted(command.commands)})"
            )
        path.append(word)
        command = command.commands[word]
    return path


INLINE_NAMES = [
    (f"{p.relative_to(REPO)}:{n}", tuple(_words(span)))
    for p in DOCS
    for n, raw in enumerate(p.read_text().splitlines(), 1)
    for span in INLINE.findall(raw)
    if span.startswith("exaserve ")
]


def test_every_command_the_prose_names_exists() -> None:
    """An inline `exaserve …` without an option is not parsed (prose names a command, not every required option),
    but the command it names must exist: `exaserve rollout history` would have passed unchecked."""
    wrong = []
    for where, argv in INLINE_NAMES:
        try:
            command_path(argv)
        except AssertionError as exc:
            wrong.append(f"{where}: {exc}")
    assert len(INLINE_NAMES) >= 40 and wrong == [], wrong
    with pytest.raises(AssertionError, match="rollout takes no argument 'history'"):
        command_path(("exaserve", "rollout", "history"))
    with pytest.raises(AssertionError, match="no such command"):
        command_path(("exaserve", "sandbox", "start"))


def test_a_flag_that_does_not_exist_fails_the_parse() -> None:
    """The check itself: the docs' old --router-url is refused, as the user saw."""
    with pytest.raises(typer.TyperException, match="No such option: --router-url"):
        parse(("exaserve", "rollout", "--stack", "prod", "--to", "v2", "--router-url", "http://gateway:30000"))


@pytest.mark.parametrize("cmd", PLAYBOOKS, ids=str)
def test_every_documented_playbook_passes_the_syntax_check_where_the_docs_run_it(cmd: DocCommand) -> None:
    argv = [
        str(Path(sys.executable).parent / cmd.argv[0]),
        *(w for w in cmd.argv[1:] if w not in ("--check", "--diff")),
    ]
    r = subprocess.run([*argv, "--syntax-check"], cwd=cmd.cwd, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, f"{cmd} (in {cmd.cwd}): {r.stdout}{r.stderr}"
    assert "No inventory was parsed" not in r.stderr, f"{cmd} (in {cmd.cwd}): {r.stderr}"


def _settings(path: Path) -> dict[tuple[str, str], str]:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(path)
    return {(s, k): v for s in parser.sections() for k, v in parser[s].items()}


def test_the_root_ansible_cfg_is_ansible_cfg_with_its_paths_under_ansible() -> None:
    """One configuration, two places: ``ansible/ansible.cfg`` for ``cd ansible && …`` and the root's for the
    README's commands run from the root; every setting the same, the two paths rebased."""
    inner, root = _settings(REPO / "ansible" / "ansible.cfg"), _settings(REPO / "ansible.cfg")
    rebased = {k: f"ansible/{v}" if k[1] in ("inventory", "collections_path") else v for k, v in inner.items()}
    assert root == rebased


def test_from_the_repository_root_ansible_reads_the_projects_configuration() -> None:
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-config"), "dump", "--only-changed"], cwd=REPO, capture_output=True, text=True,
                       timeout=120, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert f"CONFIG_FILE() = {REPO / 'ansible.cfg'}" in r.stdout
    assert "DEFAULT_FORKS(" in r.stdout and ") = 256" in r.stdout


def test_the_preflight_checks_the_runbooks_name_exist() -> None:
    """Issue 28: docs/runbooks.md named a check `ib_port_state`; preflight's check is `ib_ports`."""
    named = {
        word
        for line in (REPO / "docs" / "runbooks.md").read_text().splitlines()
        if "exaserve preflight" in line
        for word in re.findall(r"`([a-z0-9]+_[a-z0-9_]+)`", line)
    }
    assert named, "the runbooks name no preflight check any more: update this test"
    assert named <= set(CHECKS), sorted(named - set(CHECKS))


def test_the_plan_tables_the_runbooks_cite_are_in_the_plan() -> None:
    """Issue 28: docs/runbooks.md cited a "Memory budget per GPU" table; `exaserve plan` prints "Memory per GPU"."""
    cited = re.findall(r"\*([A-Z][^*]+)\* table", (REPO / "docs" / "runbooks.md").read_text())
    assert cited
    r = exaserve_in_process("plan", "--stack", "prod")
    assert r.returncode in (0, 1), r.stderr  # 1: the prod plan's own rule findings; the tables print either way
    missing = [title for title in cited if title not in r.stdout]
    assert not missing, missing


@pytest.mark.parametrize("cwd", [REPO, REPO / "ansible"], ids=["root", "ansible"])
def test_a_playbook_run_without_an_inventory_stops_naming_the_fix(cwd: Path) -> None:
    """Issue 42: both ansible.cfg files named the prod inventory, so `ansible-playbook preflight.yml` without -i ran
    against prod, against the CLI's rule of no prod default. Their default now names no stack and fails the run
    before any play (stock Ansible would warn and run every play on no host, exit 0); with -i the same command parses
    (the syntax check above runs every documented command, each with its -i)."""
    playbook = "ansible/preflight.yml" if cwd == REPO else "preflight.yml"
    exe = str(Path(sys.executable).parent / "ansible-playbook")
    r = subprocess.run([exe, playbook, "--check"], cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "pass its inventory: -i inventory/<stack>.exaserve.yml" in r.stderr, r.stderr
    assert "Completely failed to parse inventory source" in r.stderr and "PLAY [" not in r.stdout, r.stdout
