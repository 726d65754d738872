"""Safetensors checkpoints written by hand, as the format defines them: an 8-byte little-endian header length, the
JSON header (``dtype``, ``shape``, ``data_offsets`` per tensor, in file order), then the tensors' bytes.

``data=False`` writes the header alone (a file whose tensors are declared but absent): the reader must never need
the data, so a 405B-parameter checkpoint's headers cost a few kilobytes here."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path

from serving.spec.checkpoint import DTYPE_BITS, INDEX_FILE

Spec = Mapping[str, tuple[str, Sequence[int]]]


def write_safetensors(path: Path, tensors: Spec, *, data: bool = True) -> int:
    """Write ``tensors`` (name → (dtype, shape)) to ``path``; returns the bytes the tensors take."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = math.prod(shape) * DTYPE_BITS[dtype] // 8
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        if data:
            f.write(bytes(offset))
    return offset


def write_checkpoint(directory: Path, shards: Sequence[Spec], *, data: bool = True, write: bool = True) -> Path:
    """A sharded checkpoint in ``directory``: ``model-0000i-of-0000n.safetensors`` per shard (written only when
    ``write``) and ``model.safetensors.index.json`` (``metadata.total_size``, ``weight_map``); returns the index."""
    directory.mkdir(parents=True, exist_ok=True)
    total, weight_map = 0, {}
    for i, tensors in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        if write:
            write_safetensors(directory / name, tensors, data=data)
        total += sum(math.prod(shape) * DTYPE_BITS[dtype] // 8 for dtype, shape in tensors.values())
        weight_map.update(dict.fromkeys(tensors, name))
    index = directory / INDEX_FILE
    index.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return index


def llama_layer(i: int, hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int, mlp_dtype: str) -> Spec:
    """One Llama decoder layer's tensors as a Hugging Face checkpoint names them: BF16 attention and norms, the MLP
    in ``mlp_dtype`` (``F8_E4M3`` with one F32 scale per output row, as a row-wise FP8 checkpoint stores it)."""
    p = f"model.layers.{i}."
    out: dict[str, tuple[str, Sequence[int]]] = {
        p + "input_layernorm.weight": ("BF16", [hidden]),
        p + "post_attention_layernorm.weight": ("BF16", [hidden]),
        p + "self_attn.q_proj.weight": ("BF16", [heads * head_dim, hidden]),
        p + "self_attn.k_proj.weight": ("BF16", [kv_heads * head_dim, hidden]),
        p + "self_attn.v_proj.weight": ("BF16", [kv_heads * head_dim, hidden]),
        p + "self_attn.o_proj.weight": ("BF16", [hidden, heads * head_dim]),
    }
    for proj, shape in (("gate_proj", [inter, hidden]), ("up_proj", [inter, hidden]), ("down_proj", [hidden, inter])):
        out[f"{p}mlp.{proj}.weight"] = (mlp_dtype, shape)
        if mlp_dtype == "F8_E4M3":
            out[f"{p}mlp.{proj}.weight_scale"] = ("F32", [shape[0], 1])
    return out


def meta_fp8_checkpoint(directory: Path, config: Path, *, write: bool = True) -> Path:
    """A Llama (``config``: its config.json) in Meta's FP8 layout, headers only: Meta's quantizer converts the MLP
    (w1, w3, w2) of layers 1 … n−2 and keeps every attention projection, layers 0 and n−1, the embedding and the LM
    head in BF16 (meta-llama/llama-models ``models/llama3/quantization/loader.py: convert_to_fp8_quantized_model``,
    at 7798f83ab724dcafe86567cb995e353de2a564d0: ``if block.layer_id == 0 or block.layer_id == (model.n_layers -
    1): continue``). Shapes from ``config``; one F32 scale per FP8 output row. Not Meta's published index (none
    could be found to cite): the layout its cited rule produces."""
    cfg = json.loads(config.read_text())
    n, h, inter = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"]
    heads = cfg["num_attention_heads"]
    dims = {
        "hidden": h,
        "heads": heads,
        "kv_heads": cfg["num_key_value_heads"],
        "head_dim": cfg.get("head_dim", h // heads),
    }
    table = ("BF16", [cfg["vocab_size"], h])
    shards: list[Spec] = [{"model.embed_tokens.weight": table}]
    for i in range(n):
        fp8 = 0 < i < n - 1
        shards.append(llama_layer(i, **dims, inter=inter, mlp_dtype="F8_E4M3" if fp8 else "BF16"))
    shards.append({"model.norm.weight": ("BF16", [h]), "lm_head.weight": table})
    return write_checkpoint(directory, shards, data=False, write=write)
