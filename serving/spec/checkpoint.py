"""What a checkpoint's files say about its weights: the safetensors index and the shard headers, never the data.

A sharded Hugging Face checkpoint ships ``model.safetensors.index.json`` (``metadata.total_size``: the bytes of
every tensor; ``weight_map``: tensor name → shard file). Each ``*.safetensors`` file starts with an 8-byte
little-endian header length and a JSON header giving every tensor's ``dtype``, ``shape`` and ``data_offsets``.
Reading those headers gives the bytes of each decoder layer, the embedding and the LM head exactly, whatever the
checkpoint keeps in 16 bit (:func:`read_checkpoint`). With the index alone, only the total and the tensor names are
known (:class:`CheckpointWeights` says which).

The stack loader reads the checkpoint once (``model.checkpoint``) into ``model.checkpoint_weights``; the planner
splits those bytes over TP and PP (:func:`serving.plan.weights.stage_weights`).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.spec.schema import CheckpointWeights

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

MAX_HEADER_BYTES = 100_000_000
"""The largest header the safetensors library itself accepts (its ``MAX_HEADER_SIZE``)."""

DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "F64": 64,
    "I64": 64,
    "U64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}
"""Bits per element of each safetensors dtype."""

_LAYER = re.compile(r"^(?:model\.)?layers\.(\d+)\.")


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read as a safetensors index or header; the message names the file."""


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BITS[self.dtype] // 8


def read_header(path: Path) -> dict[str, Tensor]:
    """The tensors a safetensors file declares: the 8-byte length and the JSON header after it, nothing more."""
    try:
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: {len(head)} bytes; a safetensors file starts with an 8-byte length")
            n = int.from_bytes(head, "little")
            if n > MAX_HEADER_BYTES:
                raise CheckpointError(
                    f"{path}: header length {n:,} exceeds {MAX_HEADER_BYTES:,} bytes; not a safetensors file"
                )
            raw = f.read(n)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot be read ({exc.strerror})") from None
    if len(raw) < n:
        raise CheckpointError(f"{path}: header declares {n:,} bytes, the file holds {len(raw):,} after the length")
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: header is not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise CheckpointError(f"{path}: header is not a JSON object")
    return {name: _tensor(path, name, entry) for name, entry in doc.items() if name != "__metadata__"}


def _tensor(path: Path, name: str, entry: Any) -> Tensor:
    if not isinstance(entry, dict):
        raise CheckpointError(f"{path}: tensor {name!r} is {entry!r}, not a {{dtype, shape, data_offsets}} object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_BITS:
        raise CheckpointError(f"{path}: tensor {name!r} has dtype {dtype!r}; known: {', '.join(DTYPE_BITS)}")
    if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise CheckpointError(f"{path}: tensor {name!r} has shape {shape!r}, not a list of sizes")
    t = Tensor(name, dtype, tuple(shape))
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
        raise CheckpointError(f"{path}: tensor {name!r} has data_offsets {offsets!r}, not [begin, end]")
    if offsets[1] - offsets[0] != t.nbytes:
        raise CheckpointError(
            f"{path}: tensor {name!r} spans {offsets[1] - offsets[0]:,} bytes, its {dtype} shape {list(shape)} "
            f"needs {t.nbytes:,}"
        )
    return t


def _is_table(name: str) -> bool:
    return name.endswith(("embed_tokens.weight", "lm_head.weight", "head.weight"))


def _classify(names: list[str]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    layers = sorted({int(m.group(1)) for n in names if (m := _LAYER.match(n))})
    return tuple(layers), tuple(sorted(n for n in names if _is_table(n)))


def _load_index(path: Path) -> tuple[int, dict[str, str]]:
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot be read ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not JSON ({exc})") from None
    total = doc.get("metadata", {}).get("total_size") if isinstance(doc, dict) else None
    wmap = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(total, int) or total <= 0:
        raise CheckpointError(f"{path}: metadata.total_size is {total!r}; a safetensors index gives the bytes there")
    if not (isinstance(wmap, dict) and wmap and all(isinstance(v, str) for v in wmap.values())):
        raise CheckpointError(f"{path}: weight_map must map tensor names to shard files")
    return total, wmap


def read_checkpoint(path: Path) -> CheckpointWeights:
    """The weights of the checkpoint at ``path``: an index file, a single ``.safetensors`` file, or a directory
    holding either. Every shard the index names that is present beside it has its header read; the per-layer
    split is kept only when all of them are (a partial set would under-count)."""
    if path.is_dir():
        for candidate in (INDEX_FILE, SINGLE_FILE):
            if (path / candidate).is_file():
                return read_checkpoint(path / candidate)
        raise CheckpointError(f"{path}: holds neither {INDEX_FILE} nor {SINGLE_FILE}")
    if not path.is_file():
        raise CheckpointError(f"{path}: does not exist; point model.checkpoint at {INDEX_FILE} or its directory")
    if path.suffix == ".safetensors":
        single = read_header(path)
        return _from_tensors(str(path), sum(t.nbytes for t in single.values()), 1, 1, single)
    total, wmap = _load_index(path)
    shards = sorted(set(wmap.values()))
    present = [path.parent / s for s in shards if (path.parent / s).is_file()]
    if len(present) == len(shards):
        tensors: dict[str, Tensor] = {}
        for shard in present:
            tensors.update(read_header(shard))
        missing = sorted(set(wmap) - set(tensors))
        if missing:
            raise CheckpointError(
                f"{path}: weight_map names {len(missing)} tensor(s) no shard header declares, e.g. {missing[0]!r}"
            )
        return _from_tensors(str(path), total, len(shards), len(present), tensors)
    layer_indices, tables = _classify(list(wmap))
    return CheckpointWeights(
        source=str(path),
        total_size=total,
        shards=len(shards),
        headers_read=0,
        layer_indices=layer_indices,
        table_tensors=tables,
    )


def _from_tensors(source: str, total: int, shards: int, read: int, tensors: dict[str, Tensor]) -> CheckpointWeights:
    layers: dict[int, int] = {}
    embedding = lm_head = other = 0
    for name, t in tensors.items():
        if m := _LAYER.match(name):
            i = int(m.group(1))
            layers[i] = layers.get(i, 0) + t.nbytes
        elif name.endswith("embed_tokens.weight"):
            embedding += t.nbytes
        elif name.endswith("lm_head.weight"):
            lm_head += t.nbytes
        else:
            other += t.nbytes
    layer_indices, tables = _classify(list(tensors))
    return CheckpointWeights(
        source=source,
        total_size=total,
        shards=shards,
        headers_read=read,
        layer_indices=layer_indices,
        table_tensors=tables,
        layers=layers,
        embedding=embedding,
        lm_head=lm_head,
        other=other,
    )
