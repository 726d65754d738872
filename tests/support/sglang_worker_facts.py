"""What the pinned SGLang 0.5.23 does on ``/health`` and which metrics it exports with which labels, read with
``ast`` from its installed source (the SGLang venv), as :mod:`tests.support.sglang_routes` reads its routes.

- ``/health``: the handler ``health_generate`` of ``sglang/srt/entrypoints/http_server.py`` — the paths it serves,
  the status codes it answers, the generation it sends (``sampling_params`` and the ``generate_request`` call), the
  poll (``await asyncio.sleep(N)``) and ``HEALTH_CHECK_TIMEOUT``'s default (``os.getenv(..., N)``).
- Metrics: every ``Gauge``/``Counter``/``Histogram`` named ``sglang:…`` in ``SchedulerMetricsCollector`` and
  ``TokenizerMetricsCollector`` (``sglang/srt/observability/metrics_collector.py``) with the labels its
  ``labelnames`` adds to the collector's own, and each collector's own labels: the ``labels = {…}`` literal and the
  ``labels["…"] = …`` added under a condition (``priority``, ``dp_rank``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from tests.support.sglang_routes import sglang_source

SCHEDULER, TOKENIZER, HTTP = "SchedulerMetricsCollector", "TokenizerMetricsCollector", "_HttpRequestMetrics"


@dataclass(frozen=True)
class HealthFacts:
    paths: frozenset[str]
    status_codes: frozenset[int]
    poll_s: tuple[float, ...]  # every `await asyncio.sleep(N)` in the handler
    max_new_tokens: int
    generates: bool  # the handler sends its request through tokenizer_manager.generate_request
    timeout_default_s: float
    # (variable, path): the `if` that answers 200 at once on that path, without a generation, when the envs variable
    # is false; None when the handler has no such switch
    generation_switch: tuple[str, str] | None


@dataclass(frozen=True)
class MetricFamily:
    name: str  # as declared (a counter's with its _total)
    kind: str  # Gauge | Counter | Histogram
    collector: str
    extra_labels: frozenset[str]


@dataclass(frozen=True)
class CollectorLabels:
    always: frozenset[str]
    optional: frozenset[str]  # added by `labels["x"] = ...` under a condition


def _http_server() -> Path:
    return sglang_source() / "srt" / "entrypoints" / "http_server.py"


def health_facts(path: Path | None = None) -> HealthFacts:
    tree = ast.parse((path or _http_server()).read_text())
    [handler] = [n for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef) and n.name == "health_generate"]
    paths = {
        d.args[0].value
        for d in handler.decorator_list
        if isinstance(d, ast.Call) and d.args and isinstance(d.args[0], ast.Constant)
    }
    codes, polls, tokens, generates = set(), [], None, False
    for node in ast.walk(handler):
        if isinstance(node, ast.Call):
            func = ast.unparse(node.func)
            for kw in node.keywords:
                if kw.arg == "status_code" and isinstance(kw.value, ast.Constant):
                    codes.add(int(kw.value.value))
            if func == "asyncio.sleep" and node.args and isinstance(node.args[0], ast.Constant):
                polls.append(float(node.args[0].value))
            generates |= func.endswith("tokenizer_manager.generate_request")
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "max_new_tokens" and isinstance(value, ast.Constant):
                    tokens = int(value.value)
    [timeout] = [
        float(call.args[1].value)
        for node in tree.body
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "HEALTH_CHECK_TIMEOUT"
        for call in ast.walk(node.value)
        if isinstance(call, ast.Call) and ast.unparse(call.func) == "os.getenv" and len(call.args) == 2
        if isinstance(call.args[1], ast.Constant)
    ]
    switch = None
    for node in ast.walk(handler):
        if not isinstance(node, ast.If) or "not envs." not in (test := ast.unparse(node.test)):
            continue
        returns_200 = any(
            isinstance(kw.value, ast.Constant) and kw.arg == "status_code" and kw.value.value == 200
            for ret in node.body
            if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Call)
            for kw in ret.value.keywords
        )
        compared = [
            c.comparators[0].value
            for c in ast.walk(node.test)
            if isinstance(c, ast.Compare) and "request.url.path" in ast.unparse(c.left)
            and isinstance(c.ops[0], ast.Eq) and isinstance(c.comparators[0], ast.Constant)
        ]  # fmt: skip
        variable = test.split("not envs.", 1)[1].split(".", 1)[0]
        if returns_200 and len(compared) == 1:
            switch = (variable, str(compared[0]))
    assert tokens is not None, "health_generate sends no max_new_tokens"
    return HealthFacts(frozenset(paths), frozenset(codes), tuple(polls), tokens, generates, timeout, switch)


def _metrics_collector() -> ast.Module:
    return ast.parse((sglang_source() / "srt" / "observability" / "metrics_collector.py").read_text())


def metric_families() -> dict[str, MetricFamily]:
    """Every ``sglang:`` metric the scheduler's and the tokenizer's collectors declare, and the HTTP middleware's
    (``observability/http_request_metrics.py``), by name."""
    found: dict[str, MetricFamily] = {}
    http = ast.parse((sglang_source() / "srt" / "observability" / "http_request_metrics.py").read_text())
    for cls in [*_metrics_collector().body, *http.body]:
        if not (isinstance(cls, ast.ClassDef) and cls.name in (SCHEDULER, TOKENIZER, HTTP)):
            continue
        for node in ast.walk(cls):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            if node.func.id not in ("Gauge", "Counter", "Histogram"):
                continue
            kw = {k.arg: k.value for k in node.keywords}
            name = kw.get("name")
            if not (isinstance(name, ast.Constant) and str(name.value).startswith("sglang:")):
                continue
            names = kw.get("labelnames")
            extra = (
                {c.value for c in ast.walk(names) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
                if names is not None
                else set()
            )
            found[name.value] = MetricFamily(name.value, node.func.id, cls.name, frozenset(extra))
    return found


def _labels_of(function: ast.AST, must_have: str) -> CollectorLabels:
    [literal] = [
        n.value
        for n in ast.walk(function)
        if isinstance(n, ast.Assign)
        and ast.unparse(n.targets[0]) == "labels"
        and isinstance(n.value, ast.Dict)
        and any(isinstance(k, ast.Constant) and k.value == must_have for k in n.value.keys)
    ]
    always = {k.value for k in literal.keys if isinstance(k, ast.Constant)}
    optional = {
        n.targets[0].slice.value
        for n in ast.walk(function)
        if isinstance(n, ast.Assign)
        and isinstance(n.targets[0], ast.Subscript)
        and ast.unparse(n.targets[0].value) == "labels"
        and isinstance(n.targets[0].slice, ast.Constant)
    }
    return CollectorLabels(frozenset(always), frozenset(optional - always))


def collector_labels() -> dict[str, CollectorLabels]:
    """Each collector's own labels: the scheduler's from the function that builds its ``labels`` with ``tp_rank``,
    the tokenizer's from ``tokenizer_metric_labels``."""
    tree = _metrics_collector()
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    [scheduler] = [
        f
        for f in functions
        if any(isinstance(c, ast.Constant) and c.value == "tp_rank" for c in ast.walk(f))
        and any(isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "labels" for n in ast.walk(f))
    ]
    [tokenizer] = [f for f in functions if f.name == "tokenizer_metric_labels"]
    return {
        SCHEDULER: _labels_of(scheduler, "tp_rank"),
        TOKENIZER: _labels_of(tokenizer, "engine_type"),
        HTTP: CollectorLabels(frozenset(), frozenset()),  # the middleware's counters carry only their own labels
    }
