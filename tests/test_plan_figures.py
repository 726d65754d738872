"""Every figure of the plan — value, unit and the formula text a reviewer reads in `exaserve plan` — for the
shipped stacks, the source plan and the variants that take the planner's other branches (TP across nodes, PP
across nodes, direct heartbeats, the source's memory heuristic), checked against golden files.

The arithmetic itself is checked by hand in ``tests/test_planner.py``; these files pin what the reviewer of an
infrastructure PR sees, so a change to any number or formula shows up as a reviewed diff. Golden files live in
``tests/golden/plan/``; after an intended change refresh them with
``EXASERVE_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_plan_figures.py`` and review the diff (refused under CI=true).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import pytest

from serving.plan.model import Figure, MemoryModel, Plan
from serving.spec.schema import FleetSpec
from serving.spec.stack import load_stack, load_stack_file
from tests.support.ci import in_ci
from tests.support.stacks import SOURCE_PLAN, fleet_of, spec_from

GOLDEN = Path(__file__).parent / "golden" / "plan"
UPDATE_GOLDEN = os.environ.get("EXASERVE_UPDATE_GOLDEN") == "1"

CASES: dict[str, tuple[Callable[[], FleetSpec], MemoryModel]] = {
    "prod": (lambda: load_stack("prod").spec, "sglang"),
    "prod-source-memory": (lambda: load_stack("prod").spec, "source"),
    "dev": (lambda: load_stack("dev").spec, "sglang"),
    "sandbox": (lambda: load_stack("sandbox").spec, "sglang"),
    "source-plan": (lambda: load_stack_file(SOURCE_PLAN).spec, "source"),
    # PP 2 × TP 8 on 8-GPU nodes: each replica spans two nodes, the stage hop crosses the fabric
    "prod-pp-across-nodes": (
        lambda: spec_from(
            "prod", parallelism__tp=8, parallelism__pp=2, serving__replicas=128, serving__replicas_per_node=None
        ),
        "sglang",
    ),
    # TP 16 on 8-GPU nodes: the tensor-parallel all-reduce itself crosses the fabric
    "prod-tp-across-nodes": (
        lambda: spec_from("prod", parallelism__tp=16, serving__replicas=128, serving__replicas_per_node=None),
        "sglang",
    ),
    "prod-direct-heartbeats": (lambda: spec_from("prod", serving__heartbeat_mode="direct"), "sglang"),
}


def figures(obj: Any) -> Any:
    """The plan as plain data: a figure as ``[value, unit, formula]``; the replica inventory as its size and ends
    (its ids and GPUs are checked in ``test_planner.py``)."""
    if isinstance(obj, Figure):
        return [obj.value, obj.unit, obj.formula]
    if isinstance(obj, Plan):
        out = {
            f.name: figures(getattr(obj, f.name)) for f in fields(obj) if f.name not in ("replicas", "rollout_groups")
        }
        out["replicas"] = {"count": len(obj.replicas), "first": obj.replicas[0].id, "last": obj.replicas[-1].id}
        out["rollout_groups"] = [[g[0], g[-1], len(g)] for g in obj.rollout_groups]
        return out
    if is_dataclass(obj):
        return {f.name: figures(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, dict):
        return {k: figures(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [figures(v) for v in obj]
    return obj


@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_figures_match_the_golden_files(case: str) -> None:
    make_spec, memory_model = CASES[case]
    got = (
        json.dumps(
            figures(fleet_of(make_spec(), memory_model=memory_model).plan), indent=1, ensure_ascii=False, sort_keys=True
        )
        + "\n"
    )
    path = GOLDEN / f"{case}.json"
    if UPDATE_GOLDEN:
        assert not in_ci(), "EXASERVE_UPDATE_GOLDEN=1 under CI=true: golden files are refreshed by a person, not CI"
        GOLDEN.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
    assert path.is_file(), f"no golden file {path}; create it with EXASERVE_UPDATE_GOLDEN=1 and review it"
    assert got == path.read_text(), f"the plan of {case} changed; if intended, refresh with EXASERVE_UPDATE_GOLDEN=1"


def test_the_variants_take_the_branches_they_are_named_after() -> None:
    """Guards the golden cases themselves: each variant exercises the path its name claims."""
    pp = fleet_of(CASES["prod-pp-across-nodes"][0]()).plan
    tp = fleet_of(CASES["prod-tp-across-nodes"][0]()).plan
    direct = fleet_of(CASES["prod-direct-heartbeats"][0]()).plan
    prod = fleet_of(CASES["prod"][0]()).plan
    assert pp.network.fabric_bytes_per_forward.formula.startswith("PP crosses nodes")
    assert tp.network.fabric_bytes_per_forward.formula.startswith("TP 16 crosses nodes")
    assert prod.network.fabric_bytes_per_forward.value == 0
    assert prod.heartbeats.active_per_s.formula.startswith("aggregated")
    assert direct.heartbeats.active_per_s.formula.startswith("direct")
    assert direct.heartbeats.active_per_s.value == 2048 / 5 > prod.heartbeats.active_per_s.value
