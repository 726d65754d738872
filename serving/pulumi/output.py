"""A rendered stack on disk: one YAML file per object under ``DIR/<component>/`` and ``DIR/index.json``.

``index.json`` is a list of ``{apiVersion, kind, name, namespace, component}``, sorted like the files. YAML
keys are ordered for reading (apiVersion, kind, metadata first; the rest sorted) and multi-line strings
are written as literal blocks, so a rendered ConfigMap reads like the file it carries.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from serving.plan.model import Fleet
from serving.pulumi.program import RenderedObject
from serving.render.chrony import chrony_conf
from serving.render.k8s.common import K8sObject
from serving.render.router import router_args, router_env
from serving.render.systemd import systemd_unit

INDEX = "index.json"
UNITS = "units"
HEAD_KEYS = ("apiVersion", "kind", "metadata")


class OutputError(Exception):
    """The output directory cannot be used; the message says why and what to do."""


class _Dumper(yaml.CSafeDumper):
    pass


def _str(dumper: _Dumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def canonical(obj: K8sObject) -> K8sObject:
    """The object with apiVersion, kind, metadata first and every mapping's keys sorted."""
    head = {k: _sorted(obj[k]) for k in HEAD_KEYS if k in obj}
    return {**head, **{k: _sorted(obj[k]) for k in sorted(obj) if k not in HEAD_KEYS}}


def to_yaml(obj: K8sObject) -> str:
    return yaml.dump(canonical(obj), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=120)


def ordered(objects: Iterable[RenderedObject]) -> list[RenderedObject]:
    return sorted(objects, key=lambda o: (o.component, o.kind, o.namespace or "", o.name))


def object_path(obj: RenderedObject) -> Path:
    stem = f"{obj.kind.lower()}_{obj.namespace}_{obj.name}" if obj.namespace else f"{obj.kind.lower()}_{obj.name}"
    return Path(obj.component or "_") / f"{stem}.yaml"


def _prepare(out: Path) -> None:
    """An empty or missing directory, or a previous render (whose files are replaced)."""
    if out.exists() and not out.is_dir():
        raise OutputError(f"--out {out} is a file; pass a directory")
    if not out.exists() or not any(out.iterdir()):
        out.mkdir(parents=True, exist_ok=True)
        return
    index = out / INDEX
    if not index.is_file():
        raise OutputError(f"--out {out} is not empty and holds no previous render ({INDEX}); pass an empty directory")
    try:
        previous = json.loads(index.read_text())
        components = {str(e["component"]) or "_" for e in previous}
    except (ValueError, TypeError, KeyError) as exc:
        raise OutputError(f"{index} is not a render index ({exc}); pass an empty directory") from None
    for component in components | {UNITS}:
        path = (out / component).resolve()
        if path.parent == out.resolve() and path.is_dir():
            shutil.rmtree(path)
    index.unlink()


def write(out: Path, objects: Iterable[RenderedObject]) -> list[dict[str, Any]]:
    """Write every object and the index; returns the index."""
    _prepare(out)
    entries = []
    for obj in ordered(objects):
        path = out / object_path(obj)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(to_yaml(obj.obj))
        entries.append(obj.index_entry())
    (out / INDEX).write_text(json.dumps(entries, indent=2) + "\n")
    return entries


def write_units(out: Path, fleet: Fleet) -> int:
    """Bare-metal units beside the objects: ``units/<replica>.service`` (the systemd unit that runs the
    same command as the pod), ``units/router.json`` (the gateway's argv and env) and
    ``units/chrony.conf``. Returns the number of replica units."""
    folder = out / UNITS
    folder.mkdir(parents=True, exist_ok=True)
    for replica in fleet.plan.replicas:
        (folder / f"{replica.id}.service").write_text(systemd_unit(fleet, replica))
    router = {"argv": router_args(fleet).to_argv(), "env": router_env(fleet.spec)}
    (folder / "router.json").write_text(json.dumps(router, indent=2) + "\n")
    (folder / "chrony.conf").write_text(chrony_conf(fleet.spec))
    return len(fleet.plan.replicas)


def read(out: Path) -> list[RenderedObject]:
    """Every object of a render directory (component from its folder); no dependence on file names."""
    objects = []
    for path in sorted(out.rglob("*.yaml")):
        doc = yaml.load(path.read_text(), Loader=yaml.CSafeLoader)
        if isinstance(doc, dict) and "kind" in doc:
            component = path.relative_to(out).parts[0] if path.parent != out else ""
            objects.append(RenderedObject(obj=doc, component=component, resource_type=""))
    return objects
