"""Run the pinned SGLang's REAL KV cell-size code over cases; prints one JSON result per case.

Runs inside the SGLang venv (standard library + the pinned SGLang and its torch): reads a JSON list of cases on
stdin, each ``{"layers", "kv_heads", "head_dim", "attn_tp", "mla": null or [kv_lora_rank, qk_rope_head_dim],
"dtype_bytes": 1 or 2, "draft_layers": 0 or more}``, and prints them back with ``"cell"``: the bytes per token
``DefaultPoolConfigurator`` sizes the pool with on one GPU holding ``layers`` layers, the EAGLE-family draft's KV
included when ``draft_layers`` > 0. A case ``{"max_running_requests", "attn_dp", "token_capacity"}`` is answered
with ``"max_num_reqs"``: what ``KVCacheConfigurator.resolve_max_num_reqs`` (run from the installed source; a plain
model: no Mamba state) gives each attention-DP worker.

What is SGLang's own code, taken from the installed source with ``ast`` and executed (the modules are not imported:
they import the model configs, which need ``transformers``, not in the SGLang venv):
``model_executor/pool_configurator.py: DefaultPoolConfigurator.__init__, _compute_cell_size,
_compute_qsa_cell_size``; ``configs/model_config.py: ModelConfig.get_num_kv_heads``;
``mem_cache/kv_cache_configurator.py: calculate_mla_kv_cache_dim``; ``layers/cp/utils.py:
get_glm_dsa_layer_split_effective_num_layers``. Stand-ins, each the answer SGLang gives for a plain (not DSA, not
MiniMax-sparse, not QSA, not Mamba, no HiSparse, no page-sharding, no DCP) model on CUDA: ``get_parallel()`` carries
the case's attention-TP size and DCP 1; ``mambaish_config``, ``parse_qsa_profile`` answer None; ``is_deepseek_dsa``,
``is_minimax_sparse``, ``is_float4_e2m1fn_x2``, ``is_glm_dsa_cache_layer_split_enabled`` and the NPU offload flag
answer False; ``compute_page_shard_scratch_bytes`` answers 0; the configurator's ``kvc`` and the model config are
namespaces carrying the fields the code reads (the dtype a real ``torch`` dtype).
"""

from __future__ import annotations

import ast
import json
import sys
import types
from pathlib import Path
from typing import Any

import sglang
import torch

SRT = Path(sglang.__file__).parent / "srt"


def _definitions(path: str, names: set[str], cls: str | None = None) -> list[ast.stmt]:
    tree = ast.parse((SRT / path).read_text())
    body = tree.body
    if cls is not None:
        body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    out: list[ast.stmt] = []
    for n in body:
        if isinstance(n, ast.FunctionDef) and n.name in names:
            n.decorator_list = [d for d in n.decorator_list if isinstance(d, ast.Name) and d.id == "staticmethod"]
            n.returns = None
            for a in (*n.args.args, *n.args.kwonlyargs):
                a.annotation = None
            out.append(n)
    if {n.name for n in out if isinstance(n, ast.FunctionDef)} != names:
        raise SystemExit(f"{path}: not every one of {sorted(names)} found")
    return out


def _run(stmts: list[ast.stmt], namespace: dict[str, Any], filename: str) -> dict[str, Any]:
    module = ast.fix_missing_locations(ast.Module(body=stmts, type_ignores=[]))
    exec(compile(module, filename, "exec"), namespace)
    return namespace


_parallel = types.SimpleNamespace(attn_tp_size=1, attn_dcp_size=1, attn_cp_size=1)
_false = types.SimpleNamespace(get=lambda: False)
_common: dict[str, Any] = {
    "torch": torch,
    "get_parallel": lambda: _parallel,
    "is_deepseek_dsa": lambda hf_config: False,
    "is_minimax_sparse": lambda hf_config: False,
    "is_float4_e2m1fn_x2": lambda dtype: False,
    "envs": types.SimpleNamespace(SGLANG_NPU_ENABLE_SPARSE_KV_OFFLOAD=_false),
}

# The modules the configurator imports inside its methods, as modules holding SGLang's own functions.
_kvc_module = types.ModuleType("sglang.srt.mem_cache.kv_cache_configurator")
_kvc_ns = _run(_definitions("mem_cache/kv_cache_configurator.py", {"calculate_mla_kv_cache_dim"}), dict(_common), "kvc")
_kvc_module.calculate_mla_kv_cache_dim = _kvc_ns["calculate_mla_kv_cache_dim"]  # type: ignore[attr-defined]
_cp_ns = _run(
    _definitions("layers/cp/utils.py", {"get_glm_dsa_layer_split_effective_num_layers"}),
    {**_common, "is_glm_dsa_cache_layer_split_enabled": lambda model_runner: False},
    "cp_utils",
)
_cp_module = types.ModuleType("sglang.srt.layers.cp.utils")
_cp_module.get_glm_dsa_layer_split_effective_num_layers = _cp_ns["get_glm_dsa_layer_split_effective_num_layers"]  # type: ignore[attr-defined]
_qsa_config = types.ModuleType("sglang.srt.layers.attention.qsa.config")
_qsa_config.parse_qsa_profile = lambda hf_config: None  # type: ignore[attr-defined]
_qsa_pool = types.ModuleType("sglang.srt.mem_cache.qsa_kv_pool")
_qsa_pool.QSATokenToKVPool = _qsa_pool.resolve_qsa_indexer_dtype = None  # type: ignore[attr-defined]
sys.modules.update(
    {
        "sglang.srt.mem_cache.kv_cache_configurator": _kvc_module,
        "sglang.srt.layers.cp.utils": _cp_module,
        "sglang.srt.layers.attention.qsa.config": _qsa_config,
        "sglang.srt.mem_cache.qsa_kv_pool": _qsa_pool,
    }
)

_get_num_kv_heads = _run(
    _definitions("configs/model_config.py", {"get_num_kv_heads"}, "ModelConfig"), {}, "model_config.py"
)["get_num_kv_heads"]
_configurator = ast.ClassDef(
    name="DefaultPoolConfigurator",
    bases=[],
    keywords=[],
    body=_definitions(
        "model_executor/pool_configurator.py",
        {"__init__", "_compute_cell_size", "_compute_qsa_cell_size"},
        "DefaultPoolConfigurator",
    ),
    decorator_list=[],
    type_params=[],
)
DefaultPoolConfigurator = _run(
    [_configurator],
    {
        **_common,
        "mambaish_config": lambda model_config: None,
        "get_schedule": lambda: types.SimpleNamespace(max_total_tokens=None),
        "get_memory": lambda: types.SimpleNamespace(enable_hisparse=False),
        "compute_page_shard_scratch_bytes": lambda kvc, include_mtp: 0,
    },
    "pool_configurator.py",
)["DefaultPoolConfigurator"]


def cell(case: dict[str, Any]) -> int:
    _parallel.attn_tp_size = case["attn_tp"]
    mla = case["mla"]
    model_config = types.SimpleNamespace(
        hf_config=types.SimpleNamespace(),
        context_len=4096,
        head_dim=case["head_dim"],
        v_head_dim=case["head_dim"],
        kv_lora_rank=mla[0] if mla else None,
        qk_rope_head_dim=mla[1] if mla else None,
        is_draft_model=False,
        get_total_num_kv_heads=lambda: case["kv_heads"],
    )
    model_config.get_num_kv_heads = lambda tp, dcp=1: _get_num_kv_heads(model_config, tp, dcp)
    eagle = case["draft_layers"] > 0
    kvc = types.SimpleNamespace(
        kv_cache_dtype_str="auto",
        kv_cache_dtype=torch.bfloat16 if case["dtype_bytes"] == 2 else torch.float8_e4m3fn,
        model_config=model_config,
        layer_info=types.SimpleNamespace(num_effective_layers=case["layers"]),
        server_args=types.SimpleNamespace(enable_hisparse=False),
        use_mla_backend=bool(mla),
        is_draft_worker=False,
        spec_algorithm=types.SimpleNamespace(
            is_eagle=lambda: eagle, is_standalone=lambda: False, is_dflash_family=lambda: False
        ),
        spec_aux_config=types.SimpleNamespace(eagle_draft_num_layers=case["draft_layers"] or None),
        fused_entry_bytes=lambda kind: None,
        pp_size=1,
    )
    return int(DefaultPoolConfigurator(kvc)._cell_size)


_resolve_max_num_reqs = _run(
    _definitions("mem_cache/kv_cache_configurator.py", {"resolve_max_num_reqs"}, "KVCacheConfigurator"),
    {"logger": types.SimpleNamespace(warning=lambda *a: None)},
    "kv_cache_configurator.py",
)


def max_num_reqs(case: dict[str, Any]) -> int:
    _resolve_max_num_reqs["get_schedule"] = lambda: types.SimpleNamespace(
        max_running_requests=case["max_running_requests"]
    )
    configurator = types.SimpleNamespace(
        model_config=types.SimpleNamespace(context_len=4096), attn_dp_size=case["attn_dp"], mambaish_config=None
    )
    return int(_resolve_max_num_reqs["resolve_max_num_reqs"](configurator, case["token_capacity"]))


def answer(case: dict[str, Any]) -> dict[str, Any]:
    if "max_running_requests" in case:
        return {**case, "max_num_reqs": max_num_reqs(case)}
    return {**case, "cell": cell(case)}


if __name__ == "__main__":
    json.dump([answer(c) for c in json.load(sys.stdin)], sys.stdout)
