"""Dump, or run, the REAL argparse parsers of SGLang's server and of the gateway (smg, the SGLang router's successor).

Standard library only: it runs inside whichever interpreter has the package installed, the
throwaway SGLang venv for the server (see scripts/sglang-manifest.sh) and the project's `.venv`
for the router. `serving/flags.py` loads what `dump` writes and checks rendered command
lines against it.

    python scripts/argparse_flags.py dump server --out-dir serving/data
    python scripts/argparse_flags.py dump router --out-dir serving/data
    python scripts/argparse_flags.py parse server < argvs.json

`dump` writes `<package>-<version>[-server]-flags.json` and removes manifests of other versions of
the same parser from that folder. `parse` reads a JSON list of argv lists on stdin and prints, for
each, whether the real parser accepts it and its error message if not.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import json
import math
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

FORMAT_VERSION = 1


@dataclass(frozen=True)
class ParserSource:
    package: str
    origin: str
    file_pattern: str
    build: Callable[[], argparse.ArgumentParser]

    def filename(self, version: str) -> str:
        return self.file_pattern.replace("*", version)


def _server_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs  # noqa: PLC0415  (only importable in the SGLang venv)

    # Built exactly as sglang.srt.server_args.prepare_server_args builds it for `sglang serve`.
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return parser


def _router_parser() -> argparse.ArgumentParser:
    from smg.router_args import RouterArgs  # noqa: PLC0415

    # Built as smg.launch_router.parse_router_args builds it (less its description and help formatter).
    parser = argparse.ArgumentParser(prog="python -m smg.launch_router")
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    return parser


SOURCES = {
    "server": ParserSource(
        package="sglang",
        origin="sglang.srt.server_args.ServerArgs.add_cli_args",
        file_pattern="sglang-*-server-flags.json",
        build=_server_parser,
    ),
    "router": ParserSource(
        package="smg",
        origin="smg.router_args.RouterArgs.add_cli_args(use_router_prefix=False)",
        file_pattern="smg-*-flags.json",
        build=_router_parser,
    ),
}


def _jsonable(value: object) -> object:
    """A JSON value for a default or a choice; anything else becomes {"repr": ...}."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"repr": repr(value)}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, set | frozenset):
        return _stable_order(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return {"repr": repr(value)}


def _stable_order(values: Iterable[object]) -> list[object]:
    """Sorted, so that choices a parser builds from a set (order changes run to run) dump the same."""
    return sorted(
        (_jsonable(v) for v in values),
        key=lambda v: (type(v).__name__, v if isinstance(v, int | float | str) else repr(v)),
    )


def _type_name(value_type: object) -> str | None:
    if value_type is None:
        return None
    if value_type in (int, float, str, bool):
        return getattr(value_type, "__name__", None)
    # a method used as a type (smg's --mm-processing: type=str.lower) has no module of its own but its class's
    module = getattr(value_type, "__module__", None) or getattr(
        getattr(value_type, "__objclass__", None), "__module__", None
    )
    qualname = getattr(value_type, "__qualname__", None)
    return f"{module}.{qualname}" if module and qualname else repr(value_type)


def _action_kind(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The argparse action name of the nearest standard class the action derives from."""
    registry: dict[object, object] = parser._registries["action"]
    kinds = {cls: name for name, cls in registry.items() if isinstance(name, str)}
    kinds[argparse.BooleanOptionalAction] = "boolean_optional"
    for cls in type(action).__mro__:
        if cls in kinds:
            return str(kinds[cls])
    return "custom"


def _flag_record(parser: argparse.ArgumentParser, action: argparse.Action) -> dict[str, object]:
    cls = type(action)
    return {
        "option_strings": list(action.option_strings),
        "dest": action.dest,
        "action": _action_kind(parser, action),
        "action_class": f"{cls.__module__}.{cls.__qualname__}",
        "nargs": action.nargs,
        "type": _type_name(action.type),
        "choices": None if action.choices is None else _stable_order(action.choices),
        "default": _jsonable(action.default),
        "required": action.required,
        "deprecated": bool(getattr(action, "deprecated", False)) or cls.__name__.startswith("Deprecated"),
        "replacement": getattr(action, "new_flag", None),
    }


def manifest(source: ParserSource) -> dict[str, object]:
    parser = source.build()
    positionals = [a.dest for a in parser._actions if not a.option_strings]
    if positionals:
        raise SystemExit(
            f"{source.origin} now has positional arguments {positionals}; "
            "serving/flags.py validates options only and must learn them first"
        )
    flags = {option: _flag_record(parser, action) for action in parser._actions for option in action.option_strings}
    return {
        "format_version": FORMAT_VERSION,
        "package": source.package,
        "version": importlib.metadata.version(source.package),
        "parser": source.origin,
        "allow_abbrev": parser.allow_abbrev,
        "flags": dict(sorted(flags.items())),
    }


def dump(source: ParserSource, out_dir: Path) -> Path:
    data = manifest(source)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / source.filename(str(data["version"]))
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    for stale in out_dir.glob(source.file_pattern):
        if stale != path:
            stale.unlink()
    return path


def parse(source: ParserSource, argvs: list[list[str]]) -> list[dict[str, object]]:
    """Run the real parser's parse_args over each argv; argparse reports errors by exiting."""
    parser = source.build()
    results: list[dict[str, object]] = []
    for argv in argvs:
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
                parser.parse_args(argv)
        except SystemExit as exc:
            results.append({"ok": exc.code == 0, "error": stderr.getvalue().strip()})
        else:
            results.append({"ok": True, "error": ""})
    return results


def main(argv: list[str]) -> int:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = cli.add_subparsers(dest="command", required=True)
    dump_cli = sub.add_parser("dump", help="write the flag manifest of a parser")
    dump_cli.add_argument("parser", choices=sorted(SOURCES))
    dump_cli.add_argument("--out-dir", type=Path, required=True)
    parse_cli = sub.add_parser("parse", help="run the real parser over argv lists read from stdin")
    parse_cli.add_argument("parser", choices=sorted(SOURCES))
    args = cli.parse_args(argv)
    source = SOURCES[args.parser]
    if args.command == "dump":
        print(dump(source, args.out_dir))
    else:
        print(json.dumps(parse(source, json.load(sys.stdin))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
