"""Fleet-level diff of two renders of a stack: objects added, removed and changed (with the changed fields), and
the planner's capacity figures that moved — what a reviewer of an infrastructure pull request reads.

The base side is rendered from a git revision: the revision's tree is exported to a temporary directory
(``git archive``: the checkout, its index and HEAD are never touched) and that tree's own code renders it
in a subprocess, so the base is rendered exactly as it would have been deployed.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serving.pulumi.program import STACK_FILE_ENV, RenderedObject

ObjectKey = tuple[str, str, str]  # kind, namespace, name
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SUBPROCESS_TIMEOUT_S = 600


class BaseRenderError(Exception):
    """The base revision cannot be rendered; the message names the revision, the step and its output."""


@dataclass(frozen=True)
class FieldChange:
    path: str
    before: Any
    after: Any

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "base": self.before, "head": self.after}


@dataclass(frozen=True)
class ObjectChange:
    kind: str
    namespace: str | None
    name: str
    component: str
    fields: list[FieldChange]

    def describe(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}" if self.namespace else f"{self.kind} {self.name}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "component": self.component,
            "fields": [f.as_dict() for f in self.fields],
        }


@dataclass
class FleetDiff:
    stack: str
    base_ref: str
    base_commit: str
    base_objects: int
    head_objects: int
    added: list[ObjectChange] = field(default_factory=list)
    removed: list[ObjectChange] = field(default_factory=list)
    changed: list[ObjectChange] = field(default_factory=list)
    capacity: list[FieldChange] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "base": {"ref": self.base_ref, "commit": self.base_commit, "objects": self.base_objects},
            "head": {"objects": self.head_objects},
            "added": [c.as_dict() for c in self.added],
            "removed": [c.as_dict() for c in self.removed],
            "changed": [c.as_dict() for c in self.changed],
            "capacity": [c.as_dict() for c in self.capacity],
        }


# ------------------------------------------------------------------------------------------ pure diff


def _key_part(key: str) -> str:
    return f".{key}" if _IDENT.match(key) else f'["{key}"]'


def _named(items: Sequence[Any]) -> dict[str, Any] | None:
    """A list of mappings with unique ``name``s (containers, env, ports, volumes) keyed by name."""
    if not items or not all(isinstance(i, dict) and isinstance(i.get("name"), str) for i in items):
        return None
    names = [i["name"] for i in items]
    return dict(zip(names, items, strict=True)) if len(set(names)) == len(names) else None


def field_changes(before: Any, after: Any, path: str = "") -> list[FieldChange]:
    """The leaves that differ; named lists compare by name, other lists by position when lengths agree."""
    if before == after:
        return []
    if isinstance(before, dict) and isinstance(after, dict):
        out: list[FieldChange] = []
        for key in sorted(set(before) | set(after)):
            out += field_changes(before.get(key), after.get(key), path + _key_part(str(key)))
        return out
    if isinstance(before, list) and isinstance(after, list):
        named_b, named_a = _named(before), _named(after)
        if named_b is not None and named_a is not None:
            out = []
            for name in sorted(set(named_b) | set(named_a)):
                out += field_changes(named_b.get(name), named_a.get(name), f"{path}[{name}]")
            return out
        if len(before) == len(after):
            return [
                c
                for i, (b, a) in enumerate(zip(before, after, strict=True))
                for c in field_changes(b, a, f"{path}[{i}]")
            ]
    return [FieldChange(path.lstrip("."), before, after)]


def _index(objects: Iterable[RenderedObject]) -> dict[ObjectKey, RenderedObject]:
    return {(o.kind, o.namespace or "", o.name): o for o in objects}


def _change(o: RenderedObject, fields: list[FieldChange]) -> ObjectChange:
    return ObjectChange(o.kind, o.namespace, o.name, o.component, fields)


def diff_objects(base: Iterable[RenderedObject], head: Iterable[RenderedObject]) -> tuple[list[ObjectChange], ...]:
    """(added, removed, changed), each sorted by component, kind, namespace, name."""
    b, h = _index(base), _index(head)
    added = [_change(h[k], []) for k in sorted(set(h) - set(b))]
    removed = [_change(b[k], []) for k in sorted(set(b) - set(h))]
    changed = [_change(h[k], f) for k in sorted(set(b) & set(h)) if (f := field_changes(b[k].obj, h[k].obj))]
    order = lambda c: (c.component, c.kind, c.namespace or "", c.name)  # noqa: E731
    return sorted(added, key=order), sorted(removed, key=order), sorted(changed, key=order)


def _flatten(value: Any, path: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{path}.{k}" if path else str(k)))
        return out
    return {path: value}


def capacity_changes(base: Mapping[str, Any], head: Mapping[str, Any]) -> list[FieldChange]:
    """Planner figures (``exaserve plan --json``'s ``capacity``) that differ, by dotted key."""
    b, h = _flatten(dict(base)), _flatten(dict(head))
    return [FieldChange(k, b.get(k), h.get(k)) for k in sorted(set(b) | set(h)) if b.get(k) != h.get(k)]


# ------------------------------------------------------------------------------------------ base revision


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=False)


def export_revision(root: Path, ref: str, dest: Path) -> str:
    """Extract ``ref``'s tree into ``dest``; returns the commit id."""
    rev = _git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if rev.returncode != 0:
        raise BaseRenderError(
            f"--base {ref!r} is not a commit of the repository at {root}; pass a branch, tag or commit "
            "(e.g. origin/main; in CI fetch it first)"
        )
    commit = rev.stdout.decode().strip()
    archive = _git(root, "archive", "--format=tar", commit)
    if archive.returncode != 0:
        raise BaseRenderError(f"git archive {commit} failed: {archive.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return commit


def _run_cli(tree: Path, args: Sequence[str], ok_codes: Sequence[int], what: str) -> str:
    """Run ``exaserve ARGS`` with the code of ``tree`` (not the installed package)."""
    env = {k: v for k, v in os.environ.items() if k != STACK_FILE_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, "-c", "from serving.cli.main import main; main()", *args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=False,
    )
    if proc.returncode not in ok_codes:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise BaseRenderError(f"{what} at the base revision failed (exit {proc.returncode}):\n{tail}")
    return proc.stdout


def render_revision(tree: Path, stack: str, out: Path) -> dict[str, Any]:
    """Render ``stack`` with the exported tree's own code into ``out``; returns its plan's capacity figures."""
    _run_cli(
        tree, ["render", "--stack", stack, "--out", str(out), "--no-validate"], (0,), f"exaserve render --stack {stack}"
    )
    plan = _run_cli(tree, ["plan", "--stack", stack, "--json"], (0, 1), f"exaserve plan --stack {stack}")
    try:
        capacity: dict[str, Any] = json.loads(plan)["capacity"]
    except (ValueError, KeyError) as exc:
        raise BaseRenderError(f"exaserve plan --json at the base revision printed no capacity ({exc})") from None
    return capacity


# ------------------------------------------------------------------------------------------ reports


def _short(value: Any, limit: int = 100) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    text = text.replace("\n", "⏎")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _delta(change: FieldChange) -> str:
    b, a = change.before, change.after
    if isinstance(b, int | float) and isinstance(a, int | float) and not isinstance(b, bool):
        d = a - b
        pct = f" ({d / b:+.1%})" if b else ""
        return f"{d:+,.6g}{pct}"
    return ""


def text_report(d: FleetDiff) -> str:
    lines = [
        f"stack {d.stack}: working tree vs {d.base_ref} ({d.base_commit[:12]})",
        f"objects: {len(d.changed)} changed, {len(d.added)} added, {len(d.removed)} removed "
        f"({d.base_objects} at base, {d.head_objects} now)",
    ]
    for sign, changes in (("+", d.added), ("-", d.removed)):
        lines += [f"  {sign} {c.describe()}  [{c.component}]" for c in changes]
    for c in d.changed:
        lines.append(f"  ~ {c.describe()}  [{c.component}]")
        lines += [f"      {f.path}: {_short(f.before)} → {_short(f.after)}" for f in c.fields]
    if d.capacity:
        lines.append("capacity (exaserve plan):")
        lines += [f"  {c.path}: {_short(c.before)} → {_short(c.after)} {_delta(c)}".rstrip() for c in d.capacity]
    else:
        lines.append("capacity (exaserve plan): unchanged")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    return "—" if value is None else "`" + _short(value, 80).replace("|", "\\|").replace("`", "'") + "`"


def markdown_report(d: FleetDiff) -> str:
    lines = [
        f"### Fleet diff: stack `{d.stack}` against `{d.base_ref}` (`{d.base_commit[:12]}`)",
        "",
        f"**{len(d.changed)} changed, {len(d.added)} added, {len(d.removed)} removed** "
        f"({d.base_objects} objects at base, {d.head_objects} with this change)",
        "",
    ]
    if d.added or d.removed:
        lines += ["| | object | component |", "|---|---|---|"]
        lines += [f"| added | `{c.describe()}` | {c.component} |" for c in d.added]
        lines += [f"| removed | `{c.describe()}` | {c.component} |" for c in d.removed]
        lines.append("")
    for c in d.changed:
        lines += [
            f"<details><summary><code>{c.describe()}</code> ({c.component}): {len(c.fields)} field(s)</summary>",
            "",
            "| field | base | this change |",
            "|---|---|---|",
        ]
        lines += [f"| `{f.path}` | {_cell(f.before)} | {_cell(f.after)} |" for f in c.fields]
        lines += ["", "</details>", ""]
    lines += ["#### Capacity (`exaserve plan`)", ""]
    if d.capacity:
        lines += ["| figure | base | this change | Δ |", "|---|---|---|---|"]
        lines += [f"| `{c.path}` | {_cell(c.before)} | {_cell(c.after)} | {_delta(c)} |" for c in d.capacity]
    else:
        lines.append("No capacity figure changed.")
    return "\n".join(lines) + "\n"
