"""``exaserve --help`` and ``--version`` start without importing a command module (serving/cli/commands.py): the
help lists the command table, which must say what the real commands say, and a command loads its own module."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from importlib.metadata import version

import typer

from serving.cli.commands import COMMANDS, app, register
from tests.support.cli import exaserve, flat
from tests.support.paths import REPO

# The project's modules (and pydantic) the console script has imported after ``exaserve ARGS``: stdout's last line.
LOADED = (
    "import json, sys\n"
    "from serving.cli.main import main\n"
    "sys.argv = ['exaserve', *sys.argv[1:]]\n"
    "try:\n"
    "    main()\n"
    "except SystemExit:\n"
    "    pass\n"
    "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('serving', 'pydantic')))))\n"
)


def _loaded(*args: str) -> list[str]:
    run = subprocess.run(
        [sys.executable, "-c", LOADED, *args], capture_output=True, text=True, cwd=REPO, check=True, timeout=60
    )
    loaded: list[str] = json.loads(run.stdout.splitlines()[-1])
    return loaded


def test_help_and_version_import_no_command_module_nor_the_spec() -> None:
    for args in (["--help"], ["--version"], []):
        loaded = _loaded(*args)
        assert loaded == ["serving", "serving.cli", "serving.cli.commands", "serving.cli.main"], (args, loaded)


def test_a_command_loads_its_own_module_only() -> None:
    loaded = _loaded("schema", "--help")
    commands = {m for m in loaded if m.startswith("serving.cli.")} - {"serving.cli.commands", "serving.cli.main"}
    assert commands == {"serving.cli.plancmd", "serving.cli.options", "serving.cli.report"}, commands


def test_the_table_names_every_command_its_module_and_its_help() -> None:
    register()
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    assert list(group.commands) == list(COMMANDS), "a command registered outside serving.cli.commands.COMMANDS"
    for name, entry in COMMANDS.items():
        command = group.commands[name]
        callbacks = [c.callback for c in getattr(command, "commands", {}).values()] or [command.callback]
        assert {f.__module__ for f in callbacks if f is not None} == {f"serving.cli.{entry.module}"}, name
        first_paragraph = inspect.cleandoc(command.help or "").split("\n\n")[0]
        assert entry.help == " ".join(first_paragraph.split()), f"{name}: the table's help is not the command's"


def test_help_lists_every_command_with_its_help() -> None:
    result = exaserve("--help")
    assert result.returncode == 0, result.stderr
    listed = flat(result.stdout.replace("│", " "))
    for name, entry in COMMANDS.items():
        assert f" {name} {entry.help}" in listed, name
    assert "--version" in listed


def test_version_is_the_installed_distributions() -> None:
    result = exaserve("--version")
    assert (result.returncode, result.stdout) == (0, f"exaserve {version('exaserve-deploy')}\n"), result.stderr
