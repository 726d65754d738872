"""Stacks: ``Pulumi.<stack>.yaml`` files are the source of truth.

Pulumi reads them natively (structured config under the ``exaserve:`` namespace, one key per spec
section); our tools read the same files as plain YAML, without the Pulumi CLI. Errors are turned
into :class:`SpecError` messages that name the file, the field path, the value and the fix.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from serving.paths import ProjectNotFoundError, project_dir
from serving.rollout.plan import soak_problem
from serving.spec.checkpoint import CheckpointError, read_checkpoint
from serving.spec.schema import MODEL_PATH_FIELDS, FleetSpec, json_schema, load_hf_config

NAMESPACE = "exaserve"
PRODUCTION_STACK = "prod"  # rollout and rollback confirm before they change it
DEFAULT_STACK = PRODUCTION_STACK  # the read-only commands' stack when none is named; the fleet commands have none


def stack_file_schema() -> dict[str, Any]:
    """JSON Schema of a whole ``Pulumi.<stack>.yaml``: the ``config:`` mapping with one ``exaserve:<section>`` key
    per spec section (the sections :func:`serving.spec.schema.json_schema` describes; an unknown ``exaserve:`` key is
    an error), other namespaces' keys and Pulumi's own top-level keys (``secretsprovider``, ``encryptedkey``) left
    free. What an editor's yaml-language-server validates a stack file against."""
    spec = json_schema()
    sections = {f"{NAMESPACE}:{name}": sub for name, sub in spec["properties"].items()}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Pulumi stack file of the exaserve project",
        "description": f"Pulumi.<stack>.yaml: structured config under the {NAMESPACE}: namespace, one key per section.",
        "type": "object",
        "properties": {
            "config": {
                "type": "object",
                "properties": sections,
                "required": [f"{NAMESPACE}:{name}" for name in spec.get("required", [])],
                "patternProperties": {f"^(?!{NAMESPACE}:)": {}},
                "additionalProperties": False,
            }
        },
        "required": ["config"],
        "$defs": spec.get("$defs", {}),
    }


class SpecError(Exception):
    """A stack that cannot be loaded; ``problems`` are ``(path, message)`` pairs."""

    def __init__(self, source: str, problems: list[tuple[str, str]]) -> None:
        self.source = source
        self.problems = problems
        lines = [f"{source}: {len(problems)} problem(s) in the fleet spec:"]
        lines += [f"  - {path}: {msg}" if path else f"  - {msg}" for path, msg in problems]
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class Stack:
    name: str
    path: Path
    spec: FleetSpec


def stack_path(name: str, root: Path) -> Path:
    """``Pulumi.<name>.yaml`` in the Pulumi project directory ``root``."""
    return root / f"Pulumi.{name}.yaml"


def available_stacks(root: Path) -> list[str]:
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in root.glob("Pulumi.*.yaml"))


def _value_at(doc: Any, loc: tuple[int | str, ...]) -> tuple[bool, Any]:
    cur = doc
    for part in loc:
        try:
            cur = cur[part]
        except (KeyError, IndexError, TypeError):
            return False, None
    return True, cur


def _fmt_loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def validation_problems(exc: ValidationError, doc: dict[str, Any]) -> list[tuple[str, str]]:
    """Turn pydantic's errors into ``(field path, 'got VALUE: message')`` pairs."""
    problems = []
    for err in exc.errors(include_url=False):
        loc = tuple(p for p in err["loc"] if p not in ("function-after", "function-before"))
        found, value = _value_at(doc, loc)
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            msg = "required field is missing; add it to the stack"
        elif err["type"] == "extra_forbidden":
            msg = "unknown field; check the spelling against `exaserve schema`"
        if found and err["type"] not in ("missing", "extra_forbidden"):
            shown = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
            msg = f"got {shown}: {msg}"
        problems.append((_fmt_loc(loc), msg))
    return problems


def spec_document(config: dict[str, Any], source: str) -> dict[str, Any]:
    """Extract the ``exaserve:<section>`` keys of a Pulumi stack ``config:`` map."""
    doc: dict[str, Any] = {}
    for key, value in config.items():
        ns, sep, section = str(key).partition(":")
        if sep and ns == NAMESPACE:
            doc[section] = value
    if not doc:
        raise SpecError(source, [("config", f"no '{NAMESPACE}:' keys; add e.g. '{NAMESPACE}:cluster:'")])
    return doc


def parse_spec(doc: dict[str, Any], source: str, base_dir: Path) -> FleetSpec:
    """Validate a spec document; resolve ``model.hf_config`` and ``model.checkpoint`` relative to ``base_dir`` and
    read them (the architecture; the checkpoint's weights into ``model.checkpoint_weights``)."""
    model = doc.get("model")
    if isinstance(model, dict) and model.get("hf_config"):
        try:
            from_hf = load_hf_config(base_dir / str(model["hf_config"]))
        except ValueError as exc:
            raise SpecError(source, [("model.hf_config", str(exc))]) from None
        arch = model.get("architecture") or {}
        if not isinstance(arch, dict):
            raise SpecError(
                source, [("model.architecture", f"got {arch!r}: expected a mapping of architecture fields")]
            )
        # Explicit architecture fields in the stack win over config.json.
        model = {**model, "architecture": {**from_hf, **arch}}
        doc = {**doc, "model": model}
    spec_dec = model.get("speculative") if isinstance(model, dict) else None
    if isinstance(model, dict) and isinstance(spec_dec, dict) and spec_dec.get("draft_hf_config"):
        try:
            draft = load_hf_config(base_dir / str(spec_dec["draft_hf_config"]))
        except ValueError as exc:
            raise SpecError(
                source, [("model.speculative.draft_hf_config", str(exc).replace("model.hf_config", "it"))]
            ) from None
        given = spec_dec.get("draft_architecture") or {}
        model = {**model, "speculative": {**spec_dec, "draft_architecture": {**draft, **given}}}
        doc = {**doc, "model": model}
    if isinstance(model, dict) and model.get("checkpoint"):
        try:
            weights = read_checkpoint(base_dir / str(model["checkpoint"]))
        except CheckpointError as exc:
            raise SpecError(source, [("model.checkpoint", str(exc))]) from None
        doc = {**doc, "model": {**model, "checkpoint_weights": weights.model_dump()}}
    try:
        spec = FleetSpec.model_validate(doc)
    except ValidationError as exc:
        raise SpecError(source, validation_problems(exc, doc)) from None
    if (short := soak_problem(spec)) is not None:  # across sections: the soak against the router's load polls
        raise SpecError(source, [("rollout.interval_s", f"got {spec.rollout.interval_s:g}: {short}")])
    return spec


def file_stack_name(path: Path) -> str:
    """The stack name a file stands for: ``Pulumi.<name>.yaml`` -> ``<name>``, any other file by its name."""
    return path.name.removeprefix("Pulumi.").removesuffix(".yaml")


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """Where the YAML breaks, what broke and how to fix it."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    if "'\\t'" in problem:
        return f"not valid YAML: {where}a tab indents this line; YAML indents with spaces only, replace the tab"
    context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    opened = f" ({context} at line {start.line + 1}, column {start.column + 1})" if context and start else ""
    return f"not valid YAML: {where}{problem}{opened}; close every bracket and quote"


def read_stack_document(path: Path) -> dict[str, Any]:
    """The ``exaserve:`` document of one stack file (not yet validated); every way the file can be unreadable is a
    :class:`SpecError` naming it."""
    source = str(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SpecError(source, [("", "file not found; pass an existing stack file")]) from None
    except OSError as exc:
        raise SpecError(source, [("", f"cannot read the file ({exc.strerror}); pass a readable stack file")]) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise SpecError(
            source,
            [
                (
                    "",
                    f"not UTF-8 text: byte 0x{data[exc.start]:02x} at line {line} (offset {exc.start}); save it as UTF-8",
                )
            ],
        ) from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(source, [("", _yaml_problem(exc))]) from None
    if raw is None:
        raise SpecError(
            source, [("", "the file is empty; a stack file needs a top-level 'config:' mapping of exaserve: keys")]
        )
    if not isinstance(raw, dict) or not isinstance(raw.get("config"), dict):
        raise SpecError(source, [("config", "a Pulumi stack file needs a top-level 'config:' mapping")])
    return spec_document(raw["config"], source)


def kubernetes_context(path: Path) -> str | None:
    """The stack file's ``kubernetes:context``: the kubeconfig context the Pulumi Kubernetes provider deploys with (its
    provider configuration), so that exaserve reaches the cluster ``pulumi up`` changed; None when unset. The stack was
    loaded first (:func:`load_stack_file` reported any problem with the file)."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    config = raw.get("config") if isinstance(raw, dict) else None
    value = config.get("kubernetes:context") if isinstance(config, dict) else None
    return value if isinstance(value, str) and value else None


def load_stack_file(path: Path, name: str | None = None) -> Stack:
    """Read and validate one stack file; every way it can be unreadable is a :class:`SpecError` naming the file."""
    doc = read_stack_document(path)
    return Stack(name=name or file_stack_name(path), path=path, spec=parse_spec(doc, str(path), path.parent))


def absolute_model_paths(model: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """``model`` with its relative file fields (:data:`MODEL_PATH_FIELDS`) made absolute against ``base_dir``."""
    out = dict(model)
    for key in MODEL_PATH_FIELDS:
        if out.get(key) and not Path(str(out[key])).is_absolute():
            out[key] = str((base_dir / str(out[key])).resolve())
    spec_dec = out.get("speculative")
    if isinstance(spec_dec, dict) and spec_dec.get("draft_hf_config"):
        out["speculative"] = {
            **spec_dec,
            "draft_hf_config": str((base_dir / str(spec_dec["draft_hf_config"])).resolve()),
        }
    return out


def pulumi_config(path: Path) -> dict[str, str]:
    """The stack file's ``exaserve:`` keys as the Pulumi engine hands config to a program: one JSON string per key
    (structured config), a relative ``model.hf_config`` or ``model.checkpoint`` made absolute against the file's directory. The offline
    runner feeds these to ``pulumi.runtime.set_all_config``, so the program reads config one way in both paths."""
    doc = read_stack_document(path)
    model = doc.get("model")
    if isinstance(model, dict):
        doc = {**doc, "model": absolute_model_paths(model, path.parent)}
    return {f"{NAMESPACE}:{section}": json.dumps(value) for section, value in doc.items()}


def spec_from_config(get_object: Callable[[str], Any], source: str, base_dir: Path) -> FleetSpec:
    """The spec from Pulumi's config, section by section (``pulumi.Config("exaserve").get_object``): what
    ``pulumi config set --path``, secrets and ESC environments put there, as ``pulumi up`` resolves it."""
    doc = {section: value for section in FleetSpec.model_fields if (value := get_object(section)) is not None}
    if not doc:
        raise SpecError(source, [("config", f"no '{NAMESPACE}:' keys; add e.g. '{NAMESPACE}:cluster:'")])
    return parse_spec(doc, source, base_dir)


def load_stack(name: str, root: Path | None = None) -> Stack:
    """The stack ``name``: ``Pulumi.<name>.yaml`` in ``root``, by default the Pulumi project directory
    (:func:`serving.paths.project_dir`: ``$EXASERVE_PROJECT_DIR``, else the nearest ``Pulumi.yaml`` upwards)."""
    try:
        root = root or project_dir()
    except ProjectNotFoundError as exc:
        raise SpecError(f"--stack {name}", [("", str(exc))]) from None
    path = stack_path(name, root)
    if not path.exists():
        known = ", ".join(available_stacks(root)) or "none"
        raise SpecError(str(path), [("", f"no stack named {name!r}; known stacks: {known}")])
    return load_stack_file(path, name)
