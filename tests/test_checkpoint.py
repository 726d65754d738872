"""Weights counted from the checkpoint's own files: the safetensors index and the shard headers (never the data)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import yaml

from serving.plan import planner
from serving.plan.weights import SKIPPED_LAYER, stage_weights
from serving.render.k8s.runtime import stack_document
from serving.spec.checkpoint import CheckpointError, read_checkpoint, read_header
from serving.spec.schema import GIB, Architecture, architecture_from_hf_config
from serving.spec.stack import SpecError, parse_spec
from tests.support.paths import REPO
from tests.support.safetensors_files import llama_layer, meta_fp8_checkpoint, write_checkpoint, write_safetensors
from tests.support.stacks import spec_from, stack_doc

LLAMA_405B = REPO / "models" / "llama-3.1-405b" / "config.json"


def test_header_reader_declares_each_tensor_without_reading_the_data(tmp_path: Path) -> None:
    """A real safetensors file, written by hand, read back; a header-only file declaring 2 GiB of absent data reads
    the same way (the reader stops after the header)."""
    tensors = {"a": ("BF16", [3, 5]), "b.weight": ("F8_E4M3", [7, 2]), "s": ("F32", [7, 1]), "f4": ("F4", [8, 2])}
    full = tmp_path / "full.safetensors"
    nbytes = write_safetensors(full, tensors)
    got = read_header(full)
    assert {n: (t.dtype, list(t.shape)) for n, t in got.items()} == {n: (d, list(s)) for n, (d, s) in tensors.items()}
    assert [got[n].nbytes for n in tensors] == [30, 14, 28, 8]
    assert full.stat().st_size == 8 + struct.unpack("<Q", full.read_bytes()[:8])[0] + nbytes
    header_only = tmp_path / "header-only.safetensors"
    write_safetensors(header_only, {"big": ("BF16", [2**15, 2**15])}, data=False)
    assert header_only.stat().st_size < 200
    assert read_header(header_only)["big"].nbytes == 2 * GIB


def _raw(path: Path, header: bytes, length: int | None = None) -> Path:
    path.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header)
    return path


@pytest.mark.parametrize(
    ("content", "fault"),
    [
        (b"\x01\x02", "starts with an 8-byte length"),
        (struct.pack("<Q", 2**40), "exceeds 100,000,000 bytes"),
        (struct.pack("<Q", 64) + b"{}", "header declares 64 bytes"),
        (struct.pack("<Q", 3) + b"{x}", "header is not JSON"),
        (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
    ],
)
def test_an_unreadable_header_names_the_file_and_the_fault(tmp_path: Path, content: bytes, fault: str) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=fault) as exc:
        read_header(path)
    assert str(path) in str(exc.value)


@pytest.mark.parametrize(
    ("entry", "fault"),
    [
        ({"dtype": "Q4", "shape": [2], "data_offsets": [0, 1]}, "dtype 'Q4'"),
        ({"dtype": "BF16", "shape": [2, -1], "data_offsets": [0, 4]}, "not a list of sizes"),
        ({"dtype": "BF16", "shape": [4], "data_offsets": [0, 4]}, "spans 4 bytes, its BF16 shape \\[4\\] needs 8"),
        ({"dtype": "BF16", "shape": [4]}, "data_offsets None"),
    ],
)
def test_an_inconsistent_tensor_entry_is_refused(tmp_path: Path, entry: dict[str, Any], fault: str) -> None:
    path = _raw(tmp_path / "bad.safetensors", json.dumps({"t": entry}).encode())
    with pytest.raises(CheckpointError, match=fault):
        read_header(path)


def _tiny_shards() -> list[dict[str, tuple[str, list[int]]]]:
    """Three layers of a tiny Llama, layer 0's MLP in BF16, layers 1–2 in FP8, plus an MTP-style layer 3."""
    dims = {"hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "inter": 128}
    first = {"model.embed_tokens.weight": ("BF16", [256, 64]), **llama_layer(0, **dims, mlp_dtype="BF16")}
    second = {**llama_layer(1, **dims, mlp_dtype="F8_E4M3"), **llama_layer(2, **dims, mlp_dtype="F8_E4M3")}
    last = {
        **llama_layer(3, **dims, mlp_dtype="F8_E4M3"),
        "model.norm.weight": ("BF16", [64]),
        "lm_head.weight": ("BF16", [256, 64]),
    }
    return [first, second, last]  # type: ignore[list-item]


def test_every_shard_header_gives_each_layers_bytes(tmp_path: Path) -> None:
    index = write_checkpoint(tmp_path / "ckpt", _tiny_shards())
    w = read_checkpoint(index.parent)  # the directory resolves to its index
    assert w.method == "shard headers" and w.headers_read == w.shards == 3
    assert w.layers is not None and sorted(w.layers) == [0, 1, 2, 3]
    attn_norms = 2 * (64 * 64 + 2 * 32 * 64 + 64 * 64) + 2 * 2 * 64
    assert w.layers[0] == attn_norms + 3 * 128 * 64 * 2
    assert w.layers[1] == attn_norms + 3 * 128 * 64 + 4 * (128 + 128 + 64)
    assert (w.embedding, w.lm_head, w.other) == (256 * 64 * 2, 256 * 64 * 2, 128)
    assert sum(w.layers.values()) + w.embedding + w.lm_head + w.other == w.total_size
    assert w.table_tensors == ("lm_head.weight", "model.embed_tokens.weight")


def test_missing_shards_leave_the_index_alone(tmp_path: Path) -> None:
    """With a shard absent the per-layer split would under-count: only the index's total and names are kept."""
    index = write_checkpoint(tmp_path / "ckpt", _tiny_shards())
    (index.parent / "model-00002-of-00003.safetensors").unlink()
    w = read_checkpoint(index)
    assert w.method == "index total_size" and w.layers is None and w.headers_read == 0
    assert w.layer_indices == (0, 1, 2, 3) and len(w.table_tensors) == 2


def test_an_index_naming_tensors_no_header_declares_is_refused(tmp_path: Path) -> None:
    index = write_checkpoint(tmp_path / "ckpt", _tiny_shards())
    doc = json.loads(index.read_text())
    doc["weight_map"]["model.layers.9.mlp.up_proj.weight"] = "model-00001-of-00003.safetensors"
    index.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match=r"1 tensor\(s\) no shard header declares.*layers\.9"):
        read_checkpoint(index)


# ----------------------------------------------------------------------------------------- the planner


def _arch(cfg: dict[str, Any]) -> Architecture:
    return Architecture(**architecture_from_hf_config(cfg, "config.json"))


def _plan_405b(
    tmp_path: Path, checkpoint: Path | None, tp: int = 8, pp: int = 1, hf_config: Path | None = None
) -> tuple[float, str]:
    """Meta's FP8 checkpoint (its config.json names its quantisation, so SGLang loads it as FP8, not online), from
    ``hf_config`` or else models/llama-3.1-405b with a quantization_config naming FP8 and nothing kept in 16 bit."""
    if hf_config is None:
        hf_config = tmp_path / "fp8-config.json"
        hf_config.write_text(
            json.dumps(
                {
                    **json.loads(LLAMA_405B.read_text()),
                    "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"},
                }
            )
        )
    spec = spec_from(
        "dev",
        cluster__gpu={"product": "NVIDIA-H100-80GB-HBM3", "memory_gb": 80},
        model__hf_config=str(hf_config),
        model__checkpoint=str(checkpoint) if checkpoint else None,
        model__architecture={},
        model__precision="fp8",
        model__quantization="fp8",
        parallelism__tp=tp,
        parallelism__pp=pp,
        serving__replicas_per_node=None,
    )
    m = planner.memory_plan(spec)
    return (m.per_gpu["weights"].value + m.per_gpu["load_overhead"].value) / GIB, m.per_gpu["weights"].formula


ISSUE_26_LOGGED_GIB = 57.75
"""Llama-3.1-405B-Instruct-FP8 at TP 8: weights per GPU in a public SGLang start-up log, as issue 26 reports it
(the issue quotes no address; the figure is the issue's)."""


def test_llama_405b_fp8_weights_per_gpu_come_from_the_shard_headers(tmp_path: Path) -> None:
    """Before, every linear layer counted 1 byte a parameter: 48.4 GiB a GPU at TP 8, 16 % under the 57.75 GiB
    the issue's log shows (and the KV pool about twice the real one). From the checkpoint's headers the BF16
    attention and end layers count at 2 bytes: within 5 % of the log."""
    before, _ = _plan_405b(tmp_path, None)
    after, formula = _plan_405b(tmp_path, meta_fp8_checkpoint(tmp_path / "405b", LLAMA_405B))
    print(f"405B FP8 TP 8: config estimate {before:.2f} GiB, headers {after:.2f} GiB, log {ISSUE_26_LOGGED_GIB}")
    assert abs(before / ISSUE_26_LOGGED_GIB - 1) > 0.15
    assert after == pytest.approx(ISSUE_26_LOGGED_GIB, rel=0.05)
    assert "shard headers" in formula and "/ TP 8" in formula


def test_llama_405b_fp8_without_the_checkpoint_counts_the_modules_its_config_keeps_in_bf16(tmp_path: Path) -> None:
    """Without index or shards, config.json's ``quantization_config.modules_to_not_convert`` (here: Meta's layout
    as its cited rule produces it: every attention projection, the MLPs of layers 0 and n−1, the LM head) gives
    the same weights as the shard headers, to the row scales (under 0.1 %)."""
    cfg = json.loads(LLAMA_405B.read_text())
    n = cfg["num_hidden_layers"]
    keep = [f"model.layers.{i}.self_attn.{p}" for i in range(n) for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
    keep += [f"model.layers.{i}.mlp.{p}" for i in (0, n - 1) for p in ("gate_proj", "up_proj", "down_proj")]
    quantized = {
        **cfg,
        "quantization_config": {
            "quant_method": "fp8",
            "activation_scheme": "dynamic",
            "modules_to_not_convert": [*keep, "lm_head"],
        },
    }
    (tmp_path / "config.json").write_text(json.dumps(quantized))
    from_config, formula = _plan_405b(tmp_path, None, hf_config=tmp_path / "config.json")
    from_headers, _ = _plan_405b(tmp_path, meta_fp8_checkpoint(tmp_path / "405b", LLAMA_405B))
    assert from_config == pytest.approx(from_headers, rel=1e-3)
    assert from_config == pytest.approx(ISSUE_26_LOGGED_GIB, rel=0.05)
    assert f"projections the checkpoint keeps in 16 bit (quantization_config, {SKIPPED_LAYER.where})" in formula


def test_index_alone_splits_total_size_over_the_layers(tmp_path: Path) -> None:
    """Without the shards the index's total_size still counts: at PP 1 it gives the headers' figure (the same
    bytes); at PP 4 it spreads them by parameters, where the headers know layer 0 is heavier (BF16 MLP), so the
    first stage's figure moves between the two methods (the stages' sum does not)."""
    full = meta_fp8_checkpoint(tmp_path / "full", LLAMA_405B)
    bare = meta_fp8_checkpoint(tmp_path / "bare", LLAMA_405B, write=False)
    assert read_checkpoint(bare).method == "index total_size"
    (h1, _), (i1, formula) = _plan_405b(tmp_path, full), _plan_405b(tmp_path, bare)
    assert i1 == pytest.approx(h1, rel=1e-6) and "index total_size" in formula
    arch = _arch(json.loads(LLAMA_405B.read_text()))
    by = {
        m: stage_weights(arch, 1.0, 8, 4, checkpoint=read_checkpoint(p))
        for m, p in (("headers", full), ("index", bare))
    }
    assert by["headers"][0].total != pytest.approx(by["index"][0].total, rel=1e-3)
    assert sum(s.total for s in by["headers"]) == pytest.approx(sum(s.total for s in by["index"]), rel=1e-9)


def test_layers_past_the_model_are_not_loaded(tmp_path: Path) -> None:
    """A checkpoint's layer past ``num_hidden_layers`` (DeepSeek's MTP layer 61) is not part of the served model:
    its bytes stay out of the weights per GPU, by headers and by the index alone."""
    index = write_checkpoint(tmp_path / "ckpt", _tiny_shards())
    arch = _arch({**_TINY, "num_hidden_layers": 3})
    w = read_checkpoint(index)
    assert w.layers is not None
    (share,) = stage_weights(arch, 2.0, 1, 1, checkpoint=w)
    assert share.layer_bytes + share.embedding_bytes == w.total_size - w.layers[3]
    assert "layers 3–3" in share.formula and "not loaded" in share.formula
    (index.parent / "model-00001-of-00003.safetensors").unlink()
    (bare,) = stage_weights(arch, 2.0, 1, 1, checkpoint=read_checkpoint(index))
    assert bare.layer_bytes + bare.embedding_bytes == pytest.approx(
        w.total_size - (w.total_size - 2 * 256 * 64 * 2) / 4
    )


# ------------------------------------------------------------------------------------------ the stack


def test_a_checkpoint_path_resolves_against_the_stack_file_and_inlines_for_the_pod(tmp_path: Path) -> None:
    """``model.checkpoint`` relative to the stack file; the runtime's stack document carries the weights read, not
    the path (the pod has no copy of the workstation's checkpoint)."""
    index = write_checkpoint(tmp_path / "ckpt", _tiny_shards())
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**_TINY, "num_hidden_layers": 4}))
    doc = {**_doc(), "model": {**_doc()["model"], "hf_config": "config.json", "checkpoint": "ckpt", "architecture": {}}}
    spec = parse_spec(doc, "test", tmp_path)
    assert spec.model.checkpoint_weights is not None
    assert spec.model.checkpoint_weights.source == str(index)
    pod = yaml.safe_load(stack_document(spec))["config"]["exaserve:model"]
    assert "checkpoint" not in pod and "hf_config" not in pod
    assert pod["checkpoint_weights"]["total_size"] == spec.model.checkpoint_weights.total_size
    again = parse_spec({**doc, "model": pod}, "pod", Path("/nonexistent"))
    assert planner.memory_plan(again).per_gpu["weights"].value == planner.memory_plan(spec).per_gpu["weights"].value


_TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
}


def _doc() -> dict[str, Any]:
    return stack_doc("dev")


@pytest.mark.parametrize(
    ("layers", "checkpoint", "fault"),
    [
        (4, "nowhere", "does not exist; point model.checkpoint at model.safetensors.index.json"),
        (6, "ckpt", "holds no tensors of layers 4…5 \\(2 of the architecture's num_layers=6\\)"),
    ],
)
def test_a_checkpoint_the_stack_cannot_use_is_a_spec_error(
    tmp_path: Path, layers: int, checkpoint: str, fault: str
) -> None:
    write_checkpoint(tmp_path / "ckpt", _tiny_shards())
    (tmp_path / "config.json").write_text(json.dumps({**_TINY, "num_hidden_layers": layers}))
    doc = {**_doc(), "model": {**_doc()["model"], "hf_config": "config.json", "checkpoint": checkpoint}}
    doc["model"]["architecture"] = {}
    with pytest.raises(SpecError, match=fault):
        parse_spec(doc, "test", tmp_path)
