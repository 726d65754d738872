"""What every renderer shares: the render error, flag tables, whole seconds and the Jinja2 templates.

Renderers are pure: ``fleet → text or objects``. They take the :class:`~serving.plan.model.Fleet` (the spec and
the plan the stack loader computed once) or the one part they need, and never call the planner themselves.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Generic, TypeVar

import jinja2

from serving.flags import FlagManifest, check_argv
from serving.plan.model import Fleet, MemoryPlan
from serving.spec.schema import FabricKind, FleetSpec


class RenderError(ValueError):
    """The spec is well-formed but cannot be rendered into a working unit; names the field and the fix."""


Ctx = TypeVar("Ctx")


FlagValue = str | bool | Sequence[str] | None  # None/False: omitted; True: a switch; a list: nargs values


@dataclass(frozen=True)
class FlagRule(Generic[Ctx]):
    """One flag: where its value comes from (for docs) and how it is computed."""

    flag: str
    source: str
    value: Callable[[Ctx], FlagValue]


def duration_buckets(spec: FleetSpec) -> list[float]:
    """Latency buckets fine enough to resolve the P99 gate, for the router and for every SGLang server.

    The router's default buckets jump 25 ms → 50 ms → 100 ms … 1 s → 2.5 s and SGLang's e2e buckets
    0.1 → 0.2 → 0.4 … 1 → 2 → 4 s: a 30 % P99 rise inside one bucket is invisible to
    ``histogram_quantile``. Geometric buckets with ratio ``1 + max_p99_rise / 3`` put at least three
    buckets inside the gate, from 1 ms to 10 × the P99 target. Rendered as the router's
    ``--prometheus-duration-buckets`` and the server's ``--bucket-e2e-request-latency``: the rollout's
    canary gate reads each replica's own histogram.
    """
    ratio = 1 + spec.rollout.max_p99_rise / 3
    top = 10 * spec.limits.p99_target_s
    out, b = [], 0.001
    while b < top:
        out.append(float(f"{b:.4g}"))
        b *= ratio
    return [*dict.fromkeys(out), top]


def whole_seconds(seconds: float) -> int:
    """Seconds for tools that take whole seconds: rounded up, never below 1 (a timeout of 0 disables)."""
    return max(1, math.ceil(seconds))


def render_flags(rules: Sequence[FlagRule[Ctx]], ctx: Ctx) -> list[str]:
    argv: list[str] = []
    for rule in rules:
        value = rule.value(ctx)
        if value is None or value is False:
            continue
        if value is True:
            argv.append(rule.flag)
        elif isinstance(value, str):
            argv += [rule.flag, value]
        elif value:  # a non-empty list of values (nargs '*' or '+')
            argv += [rule.flag, *value]
    return argv


def template_dir() -> Path:
    """The Jinja2 templates of this ``serving`` package: ``serving/templates`` in an installed wheel
    (package data), else ``templates/`` beside ``serving/`` in a source tree (the repository's layout: an editable
    install, or a revision exported by ``exaserve diff``, whose code renders with its own templates)."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "templates", package.parent / "templates"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"no templates/ in {package} nor beside it in {package.parent}: the installation is incomplete; reinstall "
        "the package (its wheel carries serving/templates)"
    )


@cache
def _templates() -> jinja2.Environment:
    return jinja2.Environment(  # noqa: S701  (unit files and configs, not HTML)
        loader=jinja2.FileSystemLoader(template_dir()),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render_template(template: str, renderer: str, **context: object) -> str:
    """Render ``templates/<template>`` (:func:`template_dir`) with the do-not-edit header naming ``renderer``."""
    header = f"generated from templates/{template} by {renderer} — do not edit"
    return _templates().get_template(template).render(header=header, **context)


def checked_memory(fleet: Fleet) -> MemoryPlan:
    """The plan's memory budget, refused when the KV pool cannot hold one full-length sequence."""
    mp = fleet.plan.memory
    ctx = fleet.spec.limits.context_length
    if mp.max_total_tokens.value < ctx:
        raise RenderError(
            f"model.precision={fleet.spec.model.precision.value} with parallelism.tp={fleet.spec.parallelism.tp} × "
            f"pp={fleet.spec.parallelism.pp} leaves a KV-cache pool of {int(mp.max_total_tokens.value):,} tokens per "
            f"GPU ({mp.kv_pool_per_gpu.formula}), less than one limits.context_length={ctx:,} sequence; "
            "raise parallelism.tp or pp, pick a quantised model.precision, or lower limits.context_length "
            "(see `exaserve plan`)"
        )
    return mp


def rdma(spec: FleetSpec) -> bool:
    """The fabric is InfiniBand or RoCE (NCCL over verbs), not plain Ethernet."""
    return spec.cluster.fabric.kind is not FabricKind.ETHERNET


def check_entry(argv: Sequence[str], entry: Sequence[str], manifest: FlagManifest) -> None:
    """Raise when ``argv`` does not start with ``entry`` or the pinned parser (``manifest``) would not take the rest."""
    if tuple(argv[: len(entry)]) != tuple(entry):
        raise ValueError(f"command line must start with {' '.join(entry)!r}, got {' '.join(argv[:3])!r}")
    check_argv(list(argv[len(entry) :]), manifest)
