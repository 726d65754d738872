"""Helpers for tests that derive spec variants from a real stack file (no 50-field objects by hand)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from serving.plan import audit
from serving.spec.schema import FleetSpec
from serving.spec.stack import parse_spec, spec_document
from tests.support.paths import REPO


def stack_doc(name: str) -> dict[str, Any]:
    """The ``exaserve:`` document of a stack file, as plain data."""
    path = REPO / f"Pulumi.{name}.yaml" if not name.endswith(".yaml") else REPO / name
    raw = yaml.safe_load(path.read_text())
    return spec_document(raw["config"], str(path))


def with_changes(doc: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """Copy ``doc`` with dotted-path changes applied, e.g. ``{"serving.replicas_per_node": 12}``.

    A path segment that is an integer indexes a list (``cluster.pools.0.count``).
    """
    out = copy.deepcopy(doc)
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        cur: Any = out
        for part in parents:
            cur = cur[int(part)] if isinstance(cur, list) else cur.setdefault(part, {})
        if isinstance(cur, list):
            cur[int(last)] = value
        else:
            cur[last] = value
    return out


def spec_from(name: str, **changes: Any) -> FleetSpec:
    """Parse a stack with changes given as keyword arguments using ``__`` for dots."""
    doc = with_changes(stack_doc(name), {k.replace("__", "."): v for k, v in changes.items()})
    return parse_spec(doc, f"{name}+changes", REPO)


# The source document's config: package data (a plain file in a checkout or an installed wheel).
SOURCE_PLAN = Path(str(audit.SOURCE_PLAN))
