"""The pinned SGLang server and gateway (smg) command-line flags, and a strict check of rendered command lines.

The manifests in ``serving/data`` are dumped from the REAL argparse parsers by
``scripts/sglang-manifest.sh`` (``sglang.srt.server_args.ServerArgs.add_cli_args`` and the gateway's
``smg.router_args.RouterArgs.add_cli_args``); a test regenerates them and fails on any difference. ``validate_argv``
checks the part of a command line after the entry point (``sglang serve`` or
``python -m smg.launch_router``) the way argparse reads it, but stricter where argparse is
lenient: abbreviations (``--tp 2`` silently becomes ``--tp-size 2``), repeated flags (the last one
silently wins), deprecated flags and ``--help`` are all problems. Every problem is a failing
:class:`~serving.result.CheckResult`: its ``check`` is the :class:`ProblemKind`, its ``subject``
the flag, and it names the value, the pinned version and the fix.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from pathlib import Path
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, model_validator

from serving.result import CheckResult, Status

DATA_DIR: Final = Path(__file__).resolve().parent / "data"  # serving/data (package data)
SERVER_MANIFEST_GLOB: Final = "sglang-*-server-flags.json"
ROUTER_MANIFEST_GLOB: Final = "smg-*-flags.json"
_REGENERATE: Final = "regenerate it with scripts/sglang-manifest.sh (see docs/sglang-version-bump.md)"


class ManifestError(Exception):
    """A flag manifest is missing, duplicated or malformed; the message names the file and the fix."""


# ---------------------------------------------------------------------------------------------------
# Value types: one checker per argparse `type` the pinned parsers use. A manifest naming any other type
# fails to load, so a version bump cannot let values of a new type through unchecked.


def _human_readable_int(raw: str) -> int:
    """Mirrors sglang.srt.utils.common.human_readable_int: 4096, 4k, 25.6k, 4Ki (no decimals with IEC)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", raw.strip())
    if match is None:
        return int(raw)
    number, suffix = match.groups()
    if suffix.endswith("i"):
        if "." in number:
            raise ValueError("decimals are not allowed with IEC suffixes")
        return int(number) << (10 * ("KMGT".index(suffix[0]) + 1))
    return int(Decimal(number) * 1000 ** ("kMGT".index(suffix) + 1))


def _json_object(raw: str) -> JsonValue:
    value: JsonValue = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def _int_csv(raw: str) -> JsonValue:
    """Mirrors smg.router_args._parse_int_csv: comma-separated integers, empty items skipped."""
    return [int(item) for item in raw.split(",") if item]


def _non_negative_int(raw: str) -> int:
    """Mirrors smg.router_args._non_negative_int: an integer, no minus sign."""
    number = int(raw)
    if number < 0:
        raise ValueError(f"expected a non-negative integer, got {raw!r}")
    return number


def _host_csv(raw: str) -> JsonValue:
    """Mirrors the lambda smg.router_args gives --mm-allowed-media-domains: comma-separated, stripped, empties out."""
    return [host.strip() for host in raw.split(",") if host.strip()]


@dataclass(frozen=True)
class _ValueType:
    expects: str
    convert: Callable[[str], JsonValue]


_STRING: Final = _ValueType("a string", str)
_VALUE_TYPES: Final[Mapping[str | None, _ValueType]] = {
    None: _STRING,
    "str": _STRING,
    "int": _ValueType("an integer", int),
    "float": _ValueType("a number", float),
    "json.loads": _ValueType("a JSON value", json.loads),
    "sglang.srt.utils.common.json_list_type": _ValueType("a JSON value", json.loads),
    "sglang.srt.utils.common.nullable_str": _STRING,
    "sglang.srt.utils.common.human_readable_int": _ValueType(
        "an integer, optionally with an SI (4k, 1M) or IEC (4Ki, 1Mi) suffix", _human_readable_int
    ),
    "sglang.srt.model_executor.cuda_graph_config.parse_cuda_graph_backend_arg": _STRING,
    "sglang.srt.model_executor.cuda_graph_config.parse_cuda_graph_config_arg": _ValueType(
        "a JSON object mapping a phase to its settings", _json_object
    ),
    "builtins.str.lower": _ValueType("a string (lower-cased)", str.lower),
    "smg.router_args._parse_int_csv": _ValueType("comma-separated integers", _int_csv),
    "smg.router_args._non_negative_int": _ValueType("a non-negative integer", _non_negative_int),
    "smg.router_args.RouterArgs.add_cli_args.<locals>.<lambda>": _ValueType("comma-separated host names", _host_csv),
}
_REPEATABLE_ACTIONS: Final = frozenset({"append", "append_const", "extend", "count"})
_EXITING_ACTIONS: Final = frozenset({"help", "version"})
# argparse's own rule (ArgumentParser._negative_number_matcher): such an argument is a value, not a flag.
_NEGATIVE_NUMBER: Final = re.compile(r"^-\d+$|^-\d*\.\d+$")


# ---------------------------------------------------------------------------------------------------
# The manifest


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FlagSpec(_Frozen):
    """One option string of the real parser, as scripts/argparse_flags.py dumps it."""

    option_strings: tuple[str, ...] = Field(
        description="All option strings of the argparse action, this one included, the main one first."
    )
    dest: str = Field(description="The setting the flag writes (argparse dest).")
    action: str = Field(
        description="argparse action kind (store, store_true, append, boolean_optional, help, …) of the "
        "nearest standard class, or 'custom'."
    )
    action_class: str = Field(description="Qualified name of the argparse Action class.")
    nargs: int | Literal["?", "*", "+"] | None = Field(description="argparse nargs; None means one value.")
    type: str | None = Field(description="The argparse type callable: int, float, str or module.qualname.")
    choices: tuple[JsonValue, ...] | None = Field(description="Allowed values after type conversion.")
    default: JsonValue = Field(description="The parser's default, JSON-encoded ({'repr': …} otherwise).")
    required: bool = Field(description="argparse required=True.")
    deprecated: bool = Field(description="Deprecated by the package (it warns or fails when used).")
    replacement: str | None = Field(description="What the package says to use instead, when deprecated.")

    @property
    def value_type(self) -> _ValueType:
        return _VALUE_TYPES[self.type]


class FlagManifest(_Frozen):
    """Every flag of one pinned parser."""

    format_version: Literal[1] = Field(description="Manifest layout version.")
    package: str = Field(description="Distribution the parser comes from, e.g. sglang.")
    version: str = Field(description="Pinned version of that distribution.")
    parser: str = Field(description="Where the parser is built.")
    allow_abbrev: bool = Field(description="Whether the real parser accepts unique prefixes of flags.")
    flags: dict[str, FlagSpec] = Field(description="Option string → its spec.")

    @model_validator(mode="after")
    def _checkable(self) -> FlagManifest:
        """Every value type has a checker here, and option strings of one action share its setting."""
        unknown = sorted(
            f"{name} (type {spec.type})" for name, spec in self.flags.items() if spec.type not in _VALUE_TYPES
        )
        if unknown:
            raise ValueError(
                f"{self.label} uses value types serving/flags.py cannot check: {', '.join(unknown)}; "
                "add a checker mirroring the parser's type function to _VALUE_TYPES"
            )
        broken = sorted(
            f"{name} → {other}"
            for name, spec in self.flags.items()
            for other in spec.option_strings
            if other not in self.flags or self.flags[other].dest != spec.dest
        )
        if broken:
            raise ValueError(f"option strings that are not flags of the same setting: {', '.join(broken)}")
        return self

    @property
    def label(self) -> str:
        """e.g. 'sglang 0.5.23', used in every message."""
        return f"{self.package} {self.version}"


def load_manifest(path: Path) -> FlagManifest:
    """Load and check one manifest file."""
    try:
        return FlagManifest.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise ManifestError(f"cannot read flag manifest {path}: {exc.strerror}; {_REGENERATE}") from exc
    except ValidationError as exc:
        raise ManifestError(f"flag manifest {path} is not valid: {exc}; {_REGENERATE}") from exc


def _the_manifest(pattern: str) -> FlagManifest:
    found = sorted(DATA_DIR.glob(pattern))
    if len(found) != 1:
        names = ", ".join(p.name for p in found) or "none"
        raise ManifestError(
            f"expected exactly one {pattern} in {DATA_DIR}, found {names}; keep only the pinned version's "
            f"and {_REGENERATE}"
        )
    return load_manifest(found[0])


@functools.cache
def load_server_manifest() -> FlagManifest:
    """The pinned SGLang server flags (``sglang serve``)."""
    return _the_manifest(SERVER_MANIFEST_GLOB)


@functools.cache
def load_router_manifest() -> FlagManifest:
    """The pinned gateway flags (``python -m smg.launch_router``)."""
    return _the_manifest(ROUTER_MANIFEST_GLOB)


# ---------------------------------------------------------------------------------------------------
# Checking a command line


class ProblemKind(StrEnum):
    """What is wrong with a command line: the ``check`` of each failing result."""

    UNKNOWN_FLAG = "unknown-flag"
    ABBREVIATED_FLAG = "abbreviated-flag"
    AMBIGUOUS_FLAG = "ambiguous-flag"
    MISSING_VALUE = "missing-value"
    UNEXPECTED_VALUE = "unexpected-value"
    STRAY_VALUE = "stray-value"
    BAD_TYPE = "bad-type"
    BAD_CHOICE = "bad-choice"
    REPEATED_FLAG = "repeated-flag"
    DEPRECATED_FLAG = "deprecated-flag"
    EXITS = "exits-immediately"
    MISSING_REQUIRED = "missing-required"


class FlagValidationError(ValueError):
    """A command line does not fit the pinned parser; ``results`` holds every problem, the message lists them."""

    def __init__(self, manifest: FlagManifest, results: Sequence[CheckResult]) -> None:
        self.results = tuple(results)
        lines = [f"{len(self.results)} problem(s) in the command line for {manifest.label}:"]
        lines += [f"  - {r.message}" for r in self.results]
        super().__init__("\n".join(lines))


def _q(text: str, limit: int = 80) -> str:
    return "'" + (text if len(text) <= limit else text[: limit - 1] + "…") + "'"


def _value(given: str | None) -> str:
    return f" (value {_q(given)})" if given is not None else ""


def _did_you_mean(word: str, options: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, options, n=3, cutoff=0.6)
    return "Did you mean " + " or ".join(_q(c) for c in close) + "?" if close else ""


def _abbreviation_of(name: str, manifest: FlagManifest) -> list[str]:
    """Flags argparse would accept ``name`` for as a prefix (ArgumentParser._get_option_tuples)."""
    if not manifest.allow_abbrev or not name.startswith("--") or len(name) < 3:
        return []
    return sorted(flag for flag in manifest.flags if flag.startswith(name))


def _as_option(arg: str, manifest: FlagManifest) -> tuple[str, str | None] | None:
    """(flag, value after '=') when argparse reads ``arg`` as a flag, None when as a value.

    Follows ArgumentParser._parse_optional: exact flags, ``--flag=value``, prefixes, then negative
    numbers and strings with a space count as values.
    """
    if not arg.startswith("-") or arg == "-":
        return None
    if arg in manifest.flags:
        return arg, None
    name, sep, explicit = arg.partition("=")
    if sep and name in manifest.flags:
        return name, explicit
    if not _abbreviation_of(name, manifest) and (_NEGATIVE_NUMBER.match(arg) or " " in arg):
        return None
    return name, explicit if sep else None


def _values_wanted(nargs: int | str | None) -> str:
    match nargs:
        case None:
            return "one value"
        case "+":
            return "one or more values"
        case int(count):
            return f"{count} value{'s' if count != 1 else ''}"
        case _:  # '?' and '*' never miss a value
            return "a value"


class _Checker:
    """One pass over argv, collecting problems."""

    def __init__(self, argv: Sequence[str], manifest: FlagManifest) -> None:
        self.argv = argv
        self.manifest = manifest
        self.problems: list[CheckResult] = []
        self.by_dest: dict[str, list[tuple[str, FlagSpec, list[str]]]] = {}

    def add(self, kind: ProblemKind, flag: str | None, observed: str, expected: str, fix: str) -> None:
        self.problems.append(CheckResult(kind, Status.FAIL, observed, expected, fix, flag))

    def following_values(self, start: int) -> list[str]:
        values: list[str] = []
        for arg in self.argv[start:]:
            if arg == "--" or _as_option(arg, self.manifest) is not None:
                break
            values.append(arg)
        return values

    def run(self) -> list[CheckResult]:
        pos, previous = 0, None
        while pos < len(self.argv):
            arg = self.argv[pos]
            option = None if arg == "--" else _as_option(arg, self.manifest)
            if option is None:
                self.stray(arg, pos, previous)
                pos += 1
                continue
            name, explicit = option
            following = self.following_values(pos + 1)
            spec = self.manifest.flags.get(name)
            if spec is None:
                spec = self.resolve_unknown(name, explicit, following)
                if spec is None:  # unknown or ambiguous: its values go with it
                    pos += 1 + len(following)
                    previous = None
                    continue
            taken = self.take_values(name, spec, explicit, following, pos)
            self.check_flag(name, spec, taken)
            pos += 1 + (len(taken) if explicit is None else 0)
            previous = name
        self.check_repeats()
        self.check_required()
        return self.problems

    def stray(self, arg: str, pos: int, previous: str | None) -> None:
        label = self.manifest.label
        if arg == "--":
            why = "'--' ends flag parsing, and the command takes no positional arguments"
        elif previous is None:
            why = "the command takes no positional arguments; every value must follow its flag"
        else:
            why = f"{_q(previous)} takes no further value and the command takes no positional arguments"
        self.add(
            ProblemKind.STRAY_VALUE,
            previous,
            f"Got stray value {_q(arg)} at position {pos} for {label}: {why}",
            "values only right after the flag that takes them",
            "Remove it.",
        )

    def resolve_unknown(self, name: str, explicit: str | None, following: list[str]) -> FlagSpec | None:
        """Report an abbreviated or unknown flag; return the flag's spec when the abbreviation is unique."""
        label = self.manifest.label
        given = explicit if explicit is not None else (following[0] if following else None)
        candidates = _abbreviation_of(name, self.manifest)
        if len(candidates) == 1:
            full = candidates[0]
            self.add(
                ProblemKind.ABBREVIATED_FLAG,
                name,
                f"Got {_q(name)}{_value(given)} for {label}: it is an abbreviation of "
                f"{_q(full)}, which argparse would silently expand",
                "every flag written in full",
                f"Write the full flag {_q(full)}.",
            )
            return self.manifest.flags[full]
        if candidates:
            shown = ", ".join(_q(c) for c in candidates[:8]) + (", …" if len(candidates) > 8 else "")
            self.add(
                ProblemKind.AMBIGUOUS_FLAG,
                name,
                f"Got {_q(name)}{_value(given)} for {label}: not a flag, only the start of "
                f"{len(candidates)} flags ({shown})",
                "every flag written in full",
                "Write the one you mean in full.",
            )
            return None
        hint = _did_you_mean(name, list(self.manifest.flags)) or (
            "No flag of that version is close; remove it, or bump the pinned version (docs/sglang-version-bump.md)."
        )
        self.add(
            ProblemKind.UNKNOWN_FLAG,
            name,
            f"Got unknown flag {_q(name)}{_value(given)} for {label}: the pinned parser has no such flag",
            f"a flag of {label}",
            hint,
        )
        return None

    def take_values(self, name: str, spec: FlagSpec, explicit: str | None, following: list[str], pos: int) -> list[str]:
        """The values argparse gives the flag (ArgumentParser.consume_optional), reporting a shortfall."""
        label = self.manifest.label
        nargs = spec.nargs
        if nargs == 0:
            if explicit is not None:
                self.add(
                    ProblemKind.UNEXPECTED_VALUE,
                    name,
                    f"Got value {_q(explicit)} for {_q(name)} in {label}: it is a switch and takes no value",
                    f"{_q(name)} alone",
                    self.switch_fix(name, spec),
                )
            return []
        if explicit is not None:
            taken = [explicit]
        elif nargs in ("*", "+"):
            taken = list(following)
        elif nargs in (None, "?"):
            taken = following[:1]
        else:
            taken = following[: int(nargs)]
        wanted = 1 if nargs in (None, "+") else (nargs if isinstance(nargs, int) else 0)
        if len(taken) < wanted or (explicit is not None and isinstance(nargs, int) and nargs > 1):
            after = self.argv[pos + 1] if pos + 1 < len(self.argv) else None
            hint = (
                f" A value starting with '-' must be attached: '{name}=VALUE'."
                if after is not None and after not in self.manifest.flags and after.startswith("-")
                else ""
            )
            self.add(
                ProblemKind.MISSING_VALUE,
                name,
                f"Got {len(taken)} value(s) for {_q(name)} in {label}: it takes {_values_wanted(nargs)}",
                f"{_values_wanted(nargs)} right after the flag",
                f"Put the value(s) right after the flag: '{name} {spec.dest.upper()}'.{hint}",
            )
        return taken

    @staticmethod
    def switch_fix(name: str, spec: FlagSpec) -> str:
        if spec.action == "boolean_optional":
            other = [o for o in spec.option_strings if o != name]
            return f"Write {_q(name)} alone, or {' or '.join(map(_q, other))} for the opposite."
        return f"Write {_q(name)} alone to turn it on, or leave it out."

    def check_flag(self, name: str, spec: FlagSpec, values: list[str]) -> None:
        label = self.manifest.label
        self.by_dest.setdefault(spec.dest, []).append((name, spec, values))
        if spec.action in _EXITING_ACTIONS:
            self.add(
                ProblemKind.EXITS,
                name,
                f"Got {_q(name)} for {label}: it prints and exits, so the service would never start",
                "no flag that prints and exits",
                "Remove it.",
            )
        if spec.deprecated:
            fix = f"Use {_q(spec.replacement)} instead." if spec.replacement else "Remove it."
            self.add(
                ProblemKind.DEPRECATED_FLAG,
                name,
                f"Got {_q(name)} for {label}: deprecated, to be removed in a later release",
                "no deprecated flag",
                fix,
            )
        value_type = spec.value_type
        for value in values:
            try:
                converted = value_type.convert(value)
            except ValueError:
                default = "" if spec.default is None else f", its default is {json.dumps(spec.default)}"
                self.add(
                    ProblemKind.BAD_TYPE,
                    name,
                    f"Got {_q(value)} for {_q(name)} in {label}",
                    f"{value_type.expects}{default}",
                    f"Give {_q(name)} {value_type.expects}.",
                )
                continue
            if spec.choices is not None and converted not in spec.choices:
                allowed = ", ".join(_q(str(c)) for c in spec.choices)
                close = _did_you_mean(value, [str(c) for c in spec.choices])
                self.add(
                    ProblemKind.BAD_CHOICE,
                    name,
                    f"Got {_q(value)} for {_q(name)} in {label}",
                    f"one of {allowed}",
                    close or "Pick one of those.",
                )

    def check_repeats(self) -> None:
        label = self.manifest.label
        for dest, uses in self.by_dest.items():
            if len(uses) < 2 or all(spec.action in _REPEATABLE_ACTIONS for _, spec, _ in uses):
                continue
            written = ", ".join(_q(" ".join([name, *values])) for name, _, values in uses)
            self.add(
                ProblemKind.REPEATED_FLAG,
                uses[0][0],
                f"Got setting {dest} {len(uses)} times in {label} ({written}): argparse keeps only the last",
                "each setting once",
                "Give it once.",
            )

    def check_required(self) -> None:
        label = self.manifest.label
        missing = {
            spec.option_strings: spec
            for spec in self.manifest.flags.values()
            if spec.required and spec.dest not in self.by_dest
        }
        for (name, *others), spec in missing.items():
            also = "".join(f" (or {_q(o)})" for o in others)
            self.add(
                ProblemKind.MISSING_REQUIRED,
                name,
                f"Missing required flag {_q(name)}{also} for {label}",
                f"{_q(name)} on every command line",
                f"Add '{name} {spec.dest.upper()}'.",
            )


def validate_argv(argv: Sequence[str], manifest: FlagManifest) -> list[CheckResult]:
    """Every problem of ``argv`` (the arguments after the entry point) against ``manifest`` as a failing
    result; [] if none."""
    if isinstance(argv, str):
        raise TypeError("validate_argv takes a list of arguments, not one string; split it first")
    return _Checker(argv, manifest).run()


def check_argv(argv: Sequence[str], manifest: FlagManifest) -> None:
    """Raise FlagValidationError listing every problem of ``argv`` against ``manifest``."""
    problems = validate_argv(argv, manifest)
    if problems:
        raise FlagValidationError(manifest, problems)
