"""Run the pinned SGLang's REAL ``handle_gpu_memory_settings`` over a grid; prints one JSON result per case.

Runs inside the SGLang venv (standard library + the pinned SGLang only): reads a JSON list of cases on stdin,
each ``{"gpu_mib", "tp", "pp", "chunked_prefill_size", "max_running_requests", "mla"}`` and optionally
``"attn_dp"`` (``--attn-dp-size``), ``"dp"`` (``--dp-size``) and ``"speculative"`` (``--speculative-algorithm``,
with 3 steps), and prints the ``mem_fraction_static``, chunked
prefill size and decode CUDA-graph max batch size SGLang resolves. With ``attn_dp`` or ``dp`` the case also runs
SGLang's own ``parallel_hook.handle_data_parallelism`` afterwards, as ``ServerArgs`` resolution orders them: its
refusal (``"refused"``: the exception's type and message) or the per-worker chunked prefill size it resolves
(``"worker_chunked_prefill_size"``).

What is SGLang's own code: the argparse parser and ``ServerArgs.from_cli_args`` (the record), the resolution
stash, ``cuda_graph_hook.handle_cuda_graph_config`` (CUDA-graph defaults, PP disabling prefill graphs), and
``memory_hook.handle_gpu_memory_settings`` with its helpers (``reserve_for_graph_mb``, the batch-size
generators). Stand-ins, because this machine has no GPU and the SGLang venv holds no transformers:
- ``memory_hook.get_device_memory_capacity`` returns the case's MiB (SGLang reads nvidia-smi's memory.total);
- ``sglang.srt.utils.is_cuda`` returns True, so the prefill CUDA-graph default is the CUDA one (breakable);
- ``use_mla_backend`` / ``model_config_of`` answer from the case (they would build a transformers
  ModelConfig): MLA or not, not multimodal;
- ``disable_breakable_cudagraph_if_incompatible`` is skipped: its rules concern KDA, DeepSeek-V4,
  context/decode-context parallelism, two-batch overlap, DeepEP and multimodal models, none of which the
  grid (or the planner) covers, and they need the same ModelConfig;
- ``safetensors`` (imported by a storage connector at import time) is an empty module.
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import logging
import sys
import types
from pathlib import Path
from typing import Any

_st = types.ModuleType("safetensors")
_stt = types.ModuleType("safetensors.torch")
_stt.load = _stt.save = None  # type: ignore[attr-defined]
_st.torch = _stt  # type: ignore[attr-defined]
sys.modules.update({"safetensors": _st, "safetensors.torch": _stt})

import sglang.srt.utils as sglang_utils  # noqa: E402

sglang_utils.is_cuda = lambda: True
from sglang.srt.arg_groups import cuda_graph_hook, memory_hook, overrides  # noqa: E402
from sglang.srt.arg_groups.overrides import resolution_result  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

_case: dict[str, object] = {}


@functools.cache
def _handle_data_parallelism() -> Any:
    """``arg_groups/parallel_hook.py: handle_data_parallelism``, its definition taken from the installed source with
    ``ast`` and executed over ``overrides``' namespace (where its helpers live): the module itself is not imported,
    because it imports the model configs, which need ``transformers`` (not in the SGLang venv). One stand-in:
    ``_graph_may_capture_collectives`` answers False (it only turns off NCCL buffer registration, no size)."""
    from sglang.srt.model_executor.cuda_graph_config import Phase, with_phase
    from sglang.srt.runtime_context import attn_dp_enabled_of

    path = Path(overrides.__file__).with_name("parallel_hook.py")
    tree = ast.parse(path.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "handle_data_parallelism")
    namespace: dict[str, Any] = {
        **vars(overrides),
        "Phase": Phase,
        "with_phase": with_phase,
        "attn_dp_enabled_of": attn_dp_enabled_of,
        "logger": logging.getLogger("parallel_hook"),
        "_graph_may_capture_collectives": lambda server_args: False,
    }
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), namespace)
    return namespace["handle_data_parallelism"]


def _mla(server_args: object) -> bool:
    return bool(_case["mla"])


for _module in (memory_hook, overrides, cuda_graph_hook):
    _module.use_mla_backend = _mla  # type: ignore[attr-defined]
memory_hook.model_config_of = lambda server_args: types.SimpleNamespace(is_multimodal=False)
cuda_graph_hook.disable_breakable_cudagraph_if_incompatible = lambda server_args: None
memory_hook.get_device_memory_capacity = lambda device=None: _case["gpu_mib"]


@functools.cache
def _parser() -> argparse.ArgumentParser:
    """SGLang's own parser, built once: parse_args leaves it as it was, so every case parses on the same one."""
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return parser


def resolve(case: dict[str, object]) -> dict[str, object]:
    _case.clear()
    _case.update(case)
    parser = _parser()
    argv = ["--model-path", "/models/m", "--device", "cuda", "--tp-size", str(case["tp"]), "--pp-size", str(case["pp"])]
    if case["chunked_prefill_size"] is not None:
        argv += ["--chunked-prefill-size", str(case["chunked_prefill_size"])]
    if case["max_running_requests"] is not None:
        argv += ["--max-running-requests", str(case["max_running_requests"])]
    if case.get("speculative"):  # --speculative-algorithm: SGLang's handle_gpu_memory_settings reads it
        argv += ["--speculative-algorithm", str(case["speculative"]), "--speculative-num-steps", "3"]
    data_parallel = "attn_dp" in case or "dp" in case
    if data_parallel:
        argv += ["--attn-dp-size", str(case.get("attn_dp", 1)), "--dp-size", str(case.get("dp", 1))]
    server_args = ServerArgs.from_cli_args(parser.parse_args(argv))
    server_args._resolved_overrides = []  # type: ignore[attr-defined]
    cuda_graph_hook.handle_cuda_graph_config(server_args)
    memory_hook.handle_gpu_memory_settings(server_args)
    graphs = resolution_result(server_args, "cuda_graph_config")
    out = {
        **case,
        "mem_fraction_static": resolution_result(server_args, "mem_fraction_static"),
        "resolved_chunked_prefill_size": resolution_result(server_args, "chunked_prefill_size"),
        "decode_graph_max_bs": graphs.decode.max_bs,
    }
    if data_parallel:
        try:
            _handle_data_parallelism()(server_args)
        except (AssertionError, ValueError) as exc:
            out["refused"] = f"{type(exc).__name__}: {exc}"
        else:
            out["worker_chunked_prefill_size"] = resolution_result(server_args, "chunked_prefill_size")
    return out


if __name__ == "__main__":
    json.dump([resolve(c) for c in json.load(sys.stdin)], sys.stdout)
