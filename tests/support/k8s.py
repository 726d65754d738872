"""Helpers for the Pulumi program, policy and render tests: stack-file variants, the program under mocks,
the CrossGuard pack's module (loaded without starting a PolicyPack), the pinned CRDs."""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from serving.pulumi.crds import resolve_crd_dir
from serving.pulumi.program import RenderedObject, kubernetes_objects, run_program
from serving.spec.stack import load_stack_file
from tests.support.paths import REPO


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
