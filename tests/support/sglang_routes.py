"""The pinned SGLang's HTTP routes and ``/v1/loads`` fields, read from its installed source (the SGLang venv).

Parsed with ``ast``, not imported (importing the server module starts far more than a parser): every
``@app.get/post/put/delete/api_route(PATH, methods=[...])`` and ``@router.get(PATH)`` whose path is a string literal in
``sglang/srt/entrypoints/http_server.py`` and ``sglang/srt/entrypoints/v1_loads.py``, and the ``Mount("/metrics", …)``
of ``sglang/srt/utils/common.py`` (Prometheus' ASGI app answers GET). Decorators inside functions count too (some
routes are added when a flag is on); paths given by an expression (environment-configured Ollama routes) are skipped.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.sglang_parsers import SGLANG_VENV

_METHODS = {"get": "GET", "post": "POST", "put": "PUT", "delete": "DELETE"}


def sglang_source() -> Path:
    """The installed ``sglang`` package of the SGLang venv."""
    [package] = sorted(SGLANG_VENV.glob("lib/python3*/site-packages/sglang"))
    return package


def _literal_methods(call: ast.Call) -> set[str]:
    for keyword in call.keywords:
        if keyword.arg == "methods" and isinstance(keyword.value, ast.List | ast.Tuple):
            return {str(e.value).upper() for e in keyword.value.elts if isinstance(e, ast.Constant)}
    return {"GET"}  # FastAPI's api_route default


def routes_in(path: Path) -> set[tuple[str, str]]:
    """(method, path) for every route decorator with a literal path in one module."""
    found: set[tuple[str, str]] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for decorator in node.decorator_list:
            if not (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)):
                continue
            owner, verb = decorator.func.value, decorator.func.attr
            if not (isinstance(owner, ast.Name) and owner.id in {"app", "router"}) or not decorator.args:
                continue
            first = decorator.args[0]
            if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                continue
            if verb in _METHODS:
                found.add((_METHODS[verb], first.value))
            elif verb == "api_route":
                found |= {(m, first.value) for m in _literal_methods(decorator)}
    return found


def sglang_routes() -> set[tuple[str, str]]:
    """Every (method, path) the pinned SGLang server serves with a literal path."""
    src = sglang_source() / "srt"
    routes = routes_in(src / "entrypoints" / "http_server.py") | routes_in(src / "entrypoints" / "v1_loads.py")
    common = (src / "utils" / "common.py").read_text()
    if 'Mount("/metrics"' in common:
        routes.add(("GET", "/metrics"))
    return routes


def load_snapshot_fields() -> tuple[set[str], dict[str, set[str]]]:
    """``LoadSnapshot``'s core keys and each section's fields (``sglang/srt/managers/load_snapshot.py``): what one
    entry of ``/v1/loads``' ``loads`` carries (``LoadSnapshot.to_dict``)."""
    tree = ast.parse((sglang_source() / "srt" / "managers" / "load_snapshot.py").read_text())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}

    def fields(name: str) -> list[tuple[str, str]]:
        return [
            (s.target.id, ast.unparse(s.annotation))
            for s in classes[name].body
            if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.target.id.islower()
        ]

    snapshot = fields("LoadSnapshot")
    section_types = {"memory": "MemoryMetrics", "speculative": "SpeculativeMetrics", "lora": "LoRAMetrics",
                     "disaggregation": "DisaggregationMetrics", "queues": "QueueMetrics"}  # fmt: skip
    core = {name for name, _ in snapshot if name not in section_types}
    sections = {name: {f for f, _ in fields(kind)} for name, kind in section_types.items()}
    return core, sections
