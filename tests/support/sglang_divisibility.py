"""Run the pinned SGLang's REAL shape checks and pipeline partition over cases; prints one JSON result per case.

Runs inside the SGLang venv (standard library + the pinned SGLang and its torch): reads a JSON list of cases on
stdin and prints them back as one JSON list, each with ``{"error": message or None}`` (``{"stages": [[start, end], ...]}`` for ``pp``).

What is SGLang's own code:
- ``distributed/utils.py: get_pp_indices``, imported and called as it is;
- ``model_executor/model_runner_components/moe_ep_setup.py: check_quantized_moe_compatibility`` and
  ``layers/quantization/fp8.py: Fp8LinearMethod.validate_block_quant_shapes``: their function bodies, taken from
  the installed source files with ``ast`` and executed. They are not imported because their modules import
  ``transformers`` (model configs), which the SGLang venv does not hold. Stand-ins in the namespace they run in:
  ``envs.SGLANG_SHARED_EXPERT_TP1`` reads False and ``_use_aiter`` is False (their CUDA defaults),
  ``print_warning_once`` is ``print``; the model config and the linear layer are plain namespaces carrying the
  fields the functions read (``hf_config.quantization_config``, ``hf_text_config.moe_intermediate_size``,
  ``tp_group.world_size``).

Cases: ``{"kind": "pp", "layers", "pp"}``; ``{"kind": "moe", "tp", "ep", "moe_intermediate_size", "block"}``;
``{"kind": "linear", "tp", "hidden", "intermediate", "block"}`` (gate/up column parallel, then down row parallel,
as a Llama MLP builds them).
"""

from __future__ import annotations

import ast
import json
import sys
import types
from pathlib import Path
from typing import Any

_st = types.ModuleType("safetensors")
_stt = types.ModuleType("safetensors.torch")
_stt.load = _stt.save = None  # type: ignore[attr-defined]
_st.torch = _stt  # type: ignore[attr-defined]
sys.modules.update({"safetensors": _st, "safetensors.torch": _stt})

import sglang  # noqa: E402
from sglang.srt.distributed.utils import get_pp_indices  # noqa: E402

SRT = Path(sglang.__file__).parent / "srt"


def _function(path: str, name: str, cls: str | None = None) -> Any:
    """The function ``name`` (a method of ``cls`` when given) from an installed SGLang source file, executed."""
    tree = ast.parse((SRT / path).read_text())
    body = tree.body
    if cls is not None:
        body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    fn = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
    fn.decorator_list = []
    module = ast.Module(body=[fn], type_ignores=[])
    flag = types.SimpleNamespace(get=lambda: False)
    namespace: dict[str, Any] = {
        "envs": types.SimpleNamespace(SGLANG_SHARED_EXPERT_TP1=flag),
        "_use_aiter": False,
        "print_warning_once": print,
        "List": list,
        "LinearBase": object,
        "ModelConfig": object,
    }
    exec(compile(module, str(SRT / path), "exec"), namespace)  # SGLang's own function body
    return namespace[name]


check_moe = _function("model_executor/model_runner_components/moe_ep_setup.py", "check_quantized_moe_compatibility")
validate_linear = _function("layers/quantization/fp8.py", "validate_block_quant_shapes", cls="Fp8LinearMethod")


def _linear(tp: int, hidden: int, intermediate: int, block: list[int]) -> None:
    layer = types.SimpleNamespace(tp_group=types.SimpleNamespace(world_size=tp))
    quant = types.SimpleNamespace(weight_block_size=block)
    part = intermediate // tp
    # gate_up_proj: MergedColumnParallelLinear(hidden, [intermediate] * 2)
    validate_linear(layer, quant, hidden, hidden, 2 * intermediate, 2 * part, [part, part])
    # down_proj: RowParallelLinear(intermediate, hidden)
    validate_linear(layer, quant, intermediate, part, hidden, hidden, [hidden])


def answer(case: dict[str, Any]) -> dict[str, Any]:
    if case["kind"] == "pp":
        return {"stages": [list(get_pp_indices(case["layers"], r, case["pp"])) for r in range(case["pp"])]}
    try:
        if case["kind"] == "moe":
            config = types.SimpleNamespace(
                hf_config=types.SimpleNamespace(quantization_config={"weight_block_size": case["block"]}),
                hf_text_config=types.SimpleNamespace(moe_intermediate_size=case["moe_intermediate_size"]),
            )
            check_moe(model_config=config, tp_size=case["tp"], moe_ep_size=case["ep"], moe_dp_size=1)
        else:
            _linear(case["tp"], case["hidden"], case["intermediate"], case["block"])
    except ValueError as exc:
        return {"error": str(exc)}
    return {"error": None}


if __name__ == "__main__":
    print(json.dumps([{**c, **answer(c)} for c in json.load(sys.stdin)]))
