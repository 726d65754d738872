"""Helpers for the Pulumi program, policy and render tests: stack-file variants, the program under mocks,
the CrossGuard pack's module (loaded without starting a PolicyPack), the pinned CRDs."""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from serving.pulumi.crds import resolve_crd_dir
from serving.pulumi.program import RenderedObject, kubernetes_objects, run_program
from serving.spec.stack import load_stack_file
from tests.specdoc import stack_doc, with_changes
from tests.support.paths import REPO

# A replica of TP 16 spans two 8-GPU nodes: the LeaderWorkerSet path of the fleet.
MULTI_NODE: dict[str, Any] = {
    "parallelism": {"tp": 16, "pp": 1, "dp": 1},
    "serving.replicas": 128,
    "serving.replicas_per_node": None,
}


def write_variant(directory: Path, name: str, base: str = "prod", changes: dict[str, Any] | None = None) -> Path:
    """``Pulumi.<name>.yaml`` in ``directory``: stack ``base`` with dotted-path ``changes``."""
    doc = with_changes(stack_doc(base), changes or {})
    model = doc.get("model") or {}
    if model.get("hf_config"):  # relative to the original stack file
        model["hf_config"] = str(REPO / model["hf_config"])
    path = directory / f"Pulumi.{name}.yaml"
    path.write_text(yaml.safe_dump({"config": {f"exaserve:{k}": v for k, v in doc.items()}}, sort_keys=False))
    return path


def render_file(path: Path) -> list[RenderedObject]:
    """The Pulumi program's Kubernetes objects for a stack file (under mocks)."""
    stack = load_stack_file(path)
    return kubernetes_objects(run_program(stack.name, stack_file=path))


def of_kind(objects: list[RenderedObject], kind: str) -> list[dict[str, Any]]:
    return [o.obj for o in objects if o.kind == kind]


def one(objects: list[RenderedObject], kind: str, name: str) -> dict[str, Any]:
    found = [o.obj for o in objects if o.kind == kind and o.name == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


@cache
def policy_pack() -> ModuleType:
    """``policies/exaserve_policies.py`` (its policies, not the pack: a PolicyPack would serve and block)."""
    path = REPO / "policies" / "exaserve_policies.py"
    spec = importlib.util.spec_from_file_location("exaserve_policies", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@cache
def crd_dir() -> Path:
    """The pinned CRDs, resolved as the CLI does (../shared/crds beside this checkout, else the cache bootstrap
    fills), verified against the lock."""
    return resolve_crd_dir(project=REPO)
