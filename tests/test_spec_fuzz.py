"""Property: a stack document produces either a plan (planner and rules run) or a clear SpecError, never a crash.

Most generated documents are valid stacks with one field moved, so the planner and the rules are exercised; a
smaller share are arbitrary documents, for the error path."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving.checks import rules
from serving.result import CheckResult, Status
from serving.spec.stack import SpecError, parse_spec
from tests.support.paths import REPO
from tests.support.stacks import fleet_of, stack_doc, with_changes

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


def _leaves(doc: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted path → scalar value of every leaf of a stack document."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    out: dict[str, Any] = {}
    for k, v in items:
        out.update(_leaves(v, f"{prefix}{k}.") if isinstance(v, dict | list) else {f"{prefix}{k}": v})
    return out


LEAVES = {name: _leaves(doc) for name, doc in BASES.items()}
# What any base stack holds at a path: a string field is perturbed to another stack's value (fp8 → int4, ...).
SEEN: dict[str, set[Any]] = {}
for leaves in LEAVES.values():
    for path, value in leaves.items():
        SEEN.setdefault(path, set()).add(value)


def nearby(path: str, value: Any) -> list[Any]:
    """In-domain neighbours of one field's value: mostly still a valid stack, sometimes just past a bound."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return sorted({value * 2, value // 2, value + 1, value - 1, value * 3, 1, 0} - {value})
    if isinstance(value, float):
        return [value * 2, value / 2, value * 1.1, value * 0.9, 0.0, 1.0]
    others = sorted((v for v in SEEN[path] if v != value and v is not None), key=repr)
    return others or [value]


@st.composite
def one_field_changed(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A base stack with one field moved to a neighbouring value (9 in 10), or one arbitrary change (1 in 10)."""
    base = draw(st.sampled_from(sorted(BASES)))
    if draw(st.integers(0, 9)) == 0:
        return base, {draw(st.sampled_from(PATHS)): draw(values)}
    path = draw(st.sampled_from(sorted(LEAVES[base])))
    return base, {path: draw(st.sampled_from(nearby(path, LEAVES[base][path])))}


def plan_or_fail_cleanly(base: str, changes: dict[str, Any]) -> str:
    """The document's outcome: 'planned' (planner and rules ran and held their contract), 'rejected' (a SpecError
    naming each problem) or 'inapplicable' (the change does not fit the document's shape)."""
    try:
        doc = with_changes(BASES[base], changes)
    except (TypeError, KeyError, IndexError, ValueError, AttributeError):
        return "inapplicable"  # e.g. indexing a scalar
    try:
        spec = parse_spec(doc, "fuzz", REPO)
    except SpecError as exc:
        assert exc.problems and all(isinstance(m, str) and m for _, m in exc.problems)
        return "rejected"
    fleet = fleet_of(spec)
    pl = fleet.plan
    for v in rules.check(fleet):
        assert isinstance(v, CheckResult) and v.check in rules.RULES and v.status in (Status.FAIL, Status.WARN)
        assert v.subject and v.observed and v.expected and v.fix
    assert pl.placement.gpus_per_replica >= 1 and pl.memory.per_gpu["total"].value >= 0
    return "planned"


def test_stacks_with_one_field_changed_plan_or_fail_cleanly_and_mostly_plan() -> None:
    """400 stacks, each a repository stack with one field changed: every one plans (rules hold their contract) or
    fails with a clear SpecError, and most reach the planner and the rules, where the arithmetic is."""
    outcomes: Counter[str] = Counter()

    @settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(case=one_field_changed())
    def check(case: tuple[str, dict[str, Any]]) -> None:
        outcomes[plan_or_fail_cleanly(*case)] += 1

    check()
    assert outcomes["planned"] >= 0.6 * sum(outcomes.values()), outcomes


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from(sorted(BASES)), changes=st.dictionaries(st.sampled_from(PATHS), values, max_size=4))
def test_arbitrary_documents_plan_or_fail_cleanly(base: str, changes: dict[str, Any]) -> None:
    """Up to four arbitrary values anywhere (mostly rejected): never a crash, never a bare exception."""
    plan_or_fail_cleanly(base, changes)
