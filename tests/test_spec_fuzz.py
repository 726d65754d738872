"""Property: arbitrary stack documents produce either a plan or a clear SpecError, never a crash."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving.checks import rules
from serving.checks.result import CheckResult, Status
from serving.plan import planner
from serving.spec.stack import SpecError, parse_spec
from tests.support.paths import REPO
from tests.support.stacks import stack_doc, with_changes

BASES = {name: stack_doc(name) for name in ("prod", "dev", "sandbox")}


def _paths(doc: Any, prefix: str = "") -> list[str]:
    out: list[str] = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            p = f"{prefix}{k}"
            out.append(p)
            out.extend(_paths(v, p + "."))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            p = f"{prefix}{i}"
            out.append(p)
            out.extend(_paths(v, p + "."))
    return out


PATHS = sorted(
    {p for d in BASES.values() for p in _paths(d)}
    | {
        "parallelism.tp",
        "parallelism.pp",
        "parallelism.dp",
        "limits.context_length",
        "serving.replicas_per_node",
        "model.architecture.num_kv_heads",
        "model.architecture.mla",
        "model.architecture.moe",
        "health.start",
    }
)

values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-10, 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.integers(0, 3), max_size=3),
    st.dictionaries(st.sampled_from(["kv_lora_rank", "qk_rope_head_dim", "num_experts", "x"]), st.integers(-2, 600)),
    st.sampled_from(["10.40.0.11", "10.40.0.0/22", "fp8", "int4", "awq", "direct", "v1", "1.33", "{index}"]),
)


@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from(sorted(BASES)), changes=st.dictionaries(st.sampled_from(PATHS), values, max_size=4))
def test_any_document_plans_or_fails_cleanly(base: str, changes: dict[str, Any]) -> None:
    try:
        doc = with_changes(BASES[base], changes)
    except (TypeError, KeyError, IndexError, ValueError, AttributeError):
        return  # the mutation itself does not apply to this shape (e.g. indexing a scalar)
    try:
        spec = parse_spec(doc, "fuzz", REPO)
    except SpecError as exc:
        assert exc.problems and all(isinstance(m, str) and m for _, m in exc.problems)
        return
    pl = planner.plan(spec)
    for v in rules.check(spec, pl):
        assert isinstance(v, CheckResult) and v.check in rules.RULES and v.status in (Status.FAIL, Status.WARN)
        assert v.subject and v.observed and v.expected and v.fix
    assert pl.placement.gpus_per_replica >= 1 and pl.memory.per_gpu["total"].value >= 0
