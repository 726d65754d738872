"""Fleet-level diff of two renders of a stack: objects added, removed and changed (with the changed fields), and
the planner's capacity figures that moved — what a reviewer of an infrastructure pull request reads.

SGLang and router command lines are compared flag by flag (``--context-length: 4096 → 8192``, not ``args[19]``);
the Markdown report groups objects that changed identically (the update groups' StatefulSets) and prints capacity
figures in their units (GiB, req/s, s).

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

import yaml

from serving.pulumi.program import STACK_FILE_ENV, RenderedObject

ObjectKey = tuple[str, str, str]  # kind, namespace, name
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_POD_SPEC = re.compile(r"^.*?\bspec\.(?=(?:initC|c)ontainers\[)")  # up to a pod template's containers
SUBPROCESS_TIMEOUT_S = 600
# The fields whose change makes pulumi-kubernetes replace the object (delete it, then create it) rather than update
# it, by (API group, kind): its provider's ``forceNew`` table (provider/pkg/provider, ``forceNewProperties``), for the
# groups and kinds a stack renders; for a StatefulSet they are the fields the API server refuses to update
# (apps validation, ``ValidateStatefulSetUpdate``: only replicas, ordinals, template, updateStrategy,
# revisionHistoryLimit, persistentVolumeClaimRetentionPolicy and minReadySeconds may change). A serving group
# replaced is every one of its pods deleted at once, outside any rollout (docs/k8s-semantics.md row 50).
REPLACED_ON: Mapping[tuple[str, str], tuple[str, ...]] = {
    ("apps", "StatefulSet"): (
        "spec.podManagementPolicy",
        "spec.revisionHistoryLimit",
        "spec.selector",
        "spec.serviceName",
        "spec.volumeClaimTemplates",
    ),
    ("apps", "Deployment"): ("spec.selector",),
    ("apps", "DaemonSet"): ("spec.selector",),
    ("", "Service"): ("spec.clusterIP",),
    ("", "Secret"): ("type",),
    ("", "PersistentVolumeClaim"): ("spec.accessModes", "spec.selector", "spec.storageClassName", "spec.volumeName"),
    ("rbac.authorization.k8s.io", "RoleBinding"): ("roleRef",),
    ("rbac.authorization.k8s.io", "ClusterRoleBinding"): ("roleRef",),
    ("storage.k8s.io", "StorageClass"): ("parameters", "provisioner"),
}


class BaseRenderError(Exception):
    """The base revision cannot be rendered; the message names the revision, the step and its output."""


@dataclass(frozen=True)
class FieldChange:
    """One leaf that differs. For a command-line flag, ``path`` is ``<argv list>[<flag>]`` and ``flag`` names it; a
    flag's value is its argument (several joined by spaces), True for a bare switch, None when absent."""

    path: str
    before: Any
    after: Any
    flag: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "flag": self.flag, "base": self.before, "head": self.after}

    @property
    def where(self) -> str:
        """A flag's command line, shortened to the container (``containers[sglang].args``)."""
        argv = self.path.removesuffix(f"[{self.flag}]")
        return _POD_SPEC.sub("", argv, count=1)


@dataclass(frozen=True)
class ObjectChange:
    kind: str
    namespace: str | None
    name: str
    component: str
    fields: list[FieldChange]
    replaced_by: tuple[str, ...] = ()  # the changed fields that make `pulumi up` replace the object (REPLACED_ON)

    def describe(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}" if self.namespace else f"{self.kind} {self.name}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "component": self.component,
            "fields": [f.as_dict() for f in self.fields],
            "replaced_by": list(self.replaced_by),
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

    @property
    def changes(self) -> bool:
        """Whether anything differs: an object added, removed or changed, or a capacity figure."""
        return bool(self.added or self.removed or self.changed or self.capacity)

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


def _is_argv(items: Sequence[Any]) -> bool:
    return bool(items) and all(isinstance(i, str) for i in items) and any(i.startswith("--") for i in items)


def argv_flags(argv: Sequence[str]) -> tuple[list[str], dict[str, str | bool]]:
    """A command line as (the words before its first flag, {flag: value}) in flag order: ``--f=v`` and ``--f v``
    give ``"v"``, several values are joined by spaces, a bare switch is True."""
    entry: list[str] = []
    values: dict[str, list[str]] = {}
    current: str | None = None
    for word in argv:
        if word.startswith("--"):
            current, sep, value = word.partition("=")
            values.setdefault(current, []).extend([value] if sep else [])
        elif current is None:
            entry.append(word)
        else:
            values[current].append(word)
    return entry, {flag: " ".join(v) if v else True for flag, v in values.items()}


def _argv_changes(before: Sequence[str], after: Sequence[str], path: str) -> list[FieldChange]:
    """Flags added, removed or changed between two command lines (in the new line's order); the entry words as
    one change when they differ; the whole list when only the order moved."""
    entry_b, flags_b = argv_flags(before)
    entry_a, flags_a = argv_flags(after)
    out = [] if entry_b == entry_a else [FieldChange(f"{path}[entry]", " ".join(entry_b), " ".join(entry_a))]
    for flag in [*flags_a, *(f for f in flags_b if f not in flags_a)]:
        if flags_b.get(flag) != flags_a.get(flag):
            out.append(FieldChange(f"{path}[{flag}]", flags_b.get(flag), flags_a.get(flag), flag))
    return out or [FieldChange(path, list(before), list(after))]


def field_changes(before: Any, after: Any, path: str = "") -> list[FieldChange]:
    """The leaves that differ; named lists compare by name, command lines by flag, other lists by position when
    lengths agree."""
    if before == after:
        return []
    if isinstance(before, dict) and isinstance(after, dict):
        out: list[FieldChange] = []
        for key in sorted(set(before) | set(after)):
            out += field_changes(before.get(key), after.get(key), path + _key_part(str(key)))
        return out
    if (inner := _documents(before, after)) is not None:  # a ConfigMap's file: the keys that changed inside it
        return field_changes(*inner, path)
    if isinstance(before, list) and isinstance(after, list):
        if _is_argv(before) and _is_argv(after):
            return _argv_changes(before, after, path.lstrip("."))
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


def _documents(before: Any, after: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Two multi-line strings that are both YAML (or JSON) mappings — a ConfigMap's stack file or rule file —
    parsed, so that a change shows as the keys that changed rather than two copies of the same long prefix."""
    if not (isinstance(before, str) and isinstance(after, str) and "\n" in before and "\n" in after):
        return None
    try:
        parsed = yaml.safe_load(before), yaml.safe_load(after)
    except yaml.YAMLError:
        return None
    return parsed if isinstance(parsed[0], dict) and isinstance(parsed[1], dict) else None


def _index(objects: Iterable[RenderedObject]) -> dict[ObjectKey, RenderedObject]:
    return {(o.kind, o.namespace or "", o.name): o for o in objects}


def replaced_by(api_version: str, kind: str, fields: Sequence[FieldChange]) -> tuple[str, ...]:
    """The changed fields (paths) that make pulumi-kubernetes replace an object of ``kind`` (:data:`REPLACED_ON`)."""
    group = api_version.rpartition("/")[0]
    prefixes = REPLACED_ON.get((group, kind), ())
    return tuple(f.path for f in fields if any(f.path == p or f.path.startswith((p + ".", p + "[")) for p in prefixes))


def _change(o: RenderedObject, fields: list[FieldChange]) -> ObjectChange:
    return ObjectChange(o.kind, o.namespace, o.name, o.component, fields, replaced_by(o.api_version, o.kind, fields))


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


def file_at_revision(tree: Path, relative: Path, ref: str) -> Path:
    """The exported tree's copy of the stack file at ``relative``; an error when the revision has none."""
    path = tree / relative
    if not path.is_file():
        raise BaseRenderError(
            f"--stack-file {relative}: the file does not exist at --base {ref!r}; add it there first, or diff a "
            "stack both revisions have"
        )
    return path


def render_revision(tree: Path, stack_args: Sequence[str], out: Path) -> dict[str, Any]:
    """Render the stack (``--stack NAME`` or ``--stack-file PATH``) with the exported tree's own code into ``out``;
    returns its plan's capacity figures."""
    which = " ".join(stack_args)
    _run_cli(tree, ["render", *stack_args, "--out", str(out), "--no-validate"], (0,), f"exaserve render {which}")
    plan = _run_cli(tree, ["plan", *stack_args, "--json"], (0, 1), f"exaserve plan {which}")
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


_BINARY = (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))


def _bytes(n: float) -> str:
    for name, size in _BINARY:
        if abs(n) >= size:
            return f"{n / size:,.2f} {name}"
    return f"{n:,.0f} B"


def _number(n: float) -> str:
    return f"{n:,}" if isinstance(n, int) else f"{n:,.6g}"


def human(key: str, value: Any) -> str:
    """A capacity figure in its unit, read from its ``exaserve plan --json`` key: bytes in KiB … TiB, requests
    and messages per second, seconds; other numbers with thousands separators; anything else as JSON."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return _short(value)
    if "bytes_per_token" in key:
        return _bytes(value) + "/token"
    if "bytes" in key:
        return _bytes(value)
    if "requests_per_second" in key:
        return f"{_number(value)} req/s"
    if "messages_per_second" in key:
        return f"{_number(value)} msg/s"
    if key.partition(".")[0].endswith("_s"):
        return f"{_number(value)} s"
    return _number(value)


def _delta(change: FieldChange) -> str:
    b, a = change.before, change.after
    if isinstance(b, int | float) and isinstance(a, int | float) and not isinstance(b, bool):
        d = a - b
        pct = f" ({d / b:+.1%})" if b else ""
        magnitude = human(change.path, abs(d))
        return f"{'-' if d < 0 else '+'}{magnitude}{pct}"
    return ""


def _label(f: FieldChange) -> str:
    return f"{f.flag} ({f.where})" if f.flag else f.path


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
        if c.replaced_by:
            lines.append(f"      REPLACED by pulumi up (deleted, then created): {', '.join(c.replaced_by)}")
        lines += [f"      {_label(f)}: {_short(f.before)} → {_short(f.after)}" for f in c.fields]
    if d.capacity:
        lines.append("capacity (exaserve plan):")
        lines += [
            f"  {c.path}: {human(c.path, c.before)} → {human(c.path, c.after)} {_delta(c)}".rstrip() for c in d.capacity
        ]
    else:
        lines.append("capacity (exaserve plan): unchanged")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    return "—" if value is None else "`" + _code(_short(value, 80)) + "`"


def _code(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'")


def _field(f: FieldChange) -> str:
    return f"`{_code(f.flag)}` in `{_code(f.where)}`" if f.flag else f"`{_code(f.path)}`"


def identical_changes(changes: Sequence[ObjectChange]) -> list[list[ObjectChange]]:
    """Changed objects grouped when their kind, namespace, component and every field change are the same (one
    edit applied to each update group), in first-seen order."""
    groups: dict[str, list[ObjectChange]] = {}
    for c in changes:
        fields = [(f.path, f.before, f.after) for f in c.fields]
        key = json.dumps([c.kind, c.namespace, c.component, fields], sort_keys=True, default=str)
        groups.setdefault(key, []).append(c)
    return list(groups.values())


def _group_title(group: Sequence[ObjectChange]) -> str:
    first = group[0]
    names = ", ".join(c.name for c in group)
    return f"{first.kind} {first.namespace}/{names}" if first.namespace else f"{first.kind} {names}"


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
    replaced = [f"`{c.describe()}` ({_code(', '.join(c.replaced_by))})" for c in d.changed if c.replaced_by]
    if replaced:
        lines += [
            "> **Replaced, not updated, by `pulumi up`** (deleted, then created; a serving group loses every pod at "
            f"once, outside any rollout): {', '.join(replaced)}",
            "",
        ]
    for group in identical_changes(d.changed):
        fields = group[0].fields
        same = f", the same in {len(group)} objects" if len(group) > 1 else ""
        lines += [
            f"<details><summary><code>{_group_title(group)}</code> ({group[0].component}): "
            f"{len(fields)} field(s){same}</summary>",
            "",
            "| field | base | this change |",
            "|---|---|---|",
        ]
        lines += [f"| {_field(f)} | {_cell(f.before)} | {_cell(f.after)} |" for f in fields]
        lines += ["", "</details>", ""]
    lines += ["#### Capacity (`exaserve plan`)", ""]
    if d.capacity:
        lines += ["| figure | base | this change | Δ |", "|---|---|---|---|"]
        lines += [
            f"| `{c.path}` | {_cell(None if c.before is None else human(c.path, c.before))} | "
            f"{_cell(None if c.after is None else human(c.path, c.after))} | {_delta(c)} |"
            for c in d.capacity
        ]
    else:
        lines.append("No capacity figure changed.")
    return "\n".join(lines) + "\n"
