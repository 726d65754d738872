"""SGLang 0.5.23's multimodal architectures, read from its source without importing it (no torch): the list
``configs/model_config.py`` names ``multimodal_model_archs``, its ``*NAME`` entries resolved to their module-level
tuples. ``serving/data/sglang-0.5.23-multimodal-archs.json`` pins it; ``tests/test_spec.py`` compares the two."""

from __future__ import annotations

import ast
from pathlib import Path


def multimodal_archs(model_config: Path) -> list[str]:
    tree = ast.parse(model_config.read_text())
    constants: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            constants[node.targets[0].id] = node.value

    def names(expr: ast.expr) -> list[str]:
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return [expr.value]
        if isinstance(expr, ast.Starred) and isinstance(expr.value, ast.Name):
            return names(constants[expr.value.id])
        if isinstance(expr, (ast.List, ast.Tuple)):
            return [n for e in expr.elts for n in names(e)]
        raise ValueError(f"unexpected entry {ast.dump(expr)} in multimodal_model_archs")

    return names(constants["multimodal_model_archs"])
