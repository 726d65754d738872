"""The decode-step roofline `exaserve fit` ranks by (serving/plan/latency.py): each term against its own arithmetic."""

from __future__ import annotations

import json
import math
import random

import pytest

from serving.plan.calibration import GPU_PRODUCTS, GpuProduct, free_at_start_bytes
from serving.plan.latency import Assumptions, DecodeStep, decode_step, ep_imbalance, experts_touched
from serving.plan.memory import ReplicaPool, replica_pool
from serving.spec.schema import GIB, Architecture, architecture_from_hf_config
from tests.support.paths import REPO

H100 = GPU_PRODUCTS["NVIDIA-H100-80GB-HBM3"]
L40S = GPU_PRODUCTS["NVIDIA-L40S"]


def _arch(name: str) -> Architecture:
    path = REPO / "models" / name / "config.json"
    return Architecture.model_validate(architecture_from_hf_config(json.loads(path.read_text()), str(path)))


def _step(
    arch: Architecture,
    tp: int,
    pp: int,
    seqs: int,
    gpu: GpuProduct = H100,
    bpp: float = 1.0,
    attn_dp: int = 1,
    ctx: int = 4096,
) -> tuple[ReplicaPool, DecodeStep]:
    pool = replica_pool(arch, bpp, 2, tp, pp, free_at_start_bytes(gpu, tp, pp), 0.85, attn_dp=attn_dp)
    assert gpu.speed is not None
    return pool, decode_step(
        arch, gpu, gpu.speed, pool, precision="fp8" if bpp == 1.0 else "bf16", tp=tp, pp=pp, attn_dp=attn_dp,
        sequences=seqs, context_length=ctx, gpus_per_node=8, fabric_gb_s=50.0,
    )  # fmt: skip


def test_every_gpu_product_carries_its_datasheet_figures() -> None:
    """fit ranks every product of the table; each has the figures a decode step needs, with their source."""
    for gpu in GPU_PRODUCTS.values():
        assert gpu.speed is not None, gpu.label
        s = gpu.speed
        assert s.hbm_gb_s > 100 and s.tflops_16bit > 50 and s.link_gb_s >= 32 and s.source.startswith("NVIDIA")
        assert (s.tflops_fp8 is None or s.tflops_fp8 >= s.tflops_16bit) and s.tflops_int8 >= s.tflops_16bit
        assert (s.link_gb_s >= 300) == gpu.nvlink, gpu.label  # NVLink, or PCIe Gen4 x16
    # Ampere has no FP8 tensor cores: SGLang runs FP8 weights as W8A16 (Marlin) there, at the 16-bit peak
    ampere = [GPU_PRODUCTS[g].speed for g in ("NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-SXM4-80GB")]
    assert all(s is not None and s.tflops_fp8 is None for s in ampere)


def test_a_dense_step_reads_its_weights_and_kv_over_the_hbm_bandwidth() -> None:
    """Llama-3.1-405B FP8 at TP 8, 8 sequences: weights (without the load overhead) + 8 × 2,048 mean context × the
    cell on one GPU, over 3,350 GB/s, plus 2 × 126 all-reduces of 8 × 16,384 × 2 B over NVLink."""
    arch = _arch("llama-3.1-405b")
    pool, step = _step(arch, 8, 1, 8)
    share, cell, _ = pool.stages[0]
    memory = (share.total - share.load_overhead_bytes + 8 * 2048 * cell) / 3_350e9
    a = Assumptions()
    allreduce = a.nvlink_latency_s + 2 * 7 / 8 * 8 * arch.hidden_size * 2 / 450e9
    assert step.bound == "weights" and step.sequences == 8
    assert step.seconds == pytest.approx(memory + 2 * arch.num_layers * allreduce)
    assert step.tokens_per_s == pytest.approx(8 / step.seconds)
    # a larger batch reads more KV cache: slower a step, more tokens a second
    _, big = _step(arch, 8, 1, 64)
    assert big.seconds > step.seconds and big.tokens_per_s > step.tokens_per_s


def test_pipeline_stages_read_their_weights_once_a_micro_batch() -> None:
    """TP 1 × PP 8 against TP 8 on the same 8 GPUs: each stage holds an eighth of the weights like TP 8's shards,
    but runs 8 micro-batches a step (SGLang's pp_loop_size), reading its weights each time: about 8 × the step."""
    arch = _arch("llama-3.1-405b")
    _, tp8 = _step(arch, 8, 1, 64)
    _, pp8 = _step(arch, 1, 8, 64)
    assert 5 < pp8.seconds / tp8.seconds < 9, (tp8.formula, pp8.formula)
    assert "× 8 micro-batches of 8.0" in pp8.formula and "hand-offs" in pp8.formula


def test_a_moe_step_reads_only_the_experts_its_tokens_touch() -> None:
    """Qwen3-235B (128 experts, 8 a token): 1 token touches 1/16 of a layer's experts; 1,024 tokens all of them. A
    small batch reads far less than the resident weights, and the step says what share it read."""
    arch = _arch("qwen3-235b-a22b-fp8")
    assert experts_touched(arch, 1) == pytest.approx(8 / 128)
    assert experts_touched(arch, 1024) == pytest.approx(1.0)
    assert experts_touched(_arch("llama-3.1-405b"), 1) == 1.0
    _, one = _step(arch, 8, 1, 1)
    _, many = _step(arch, 8, 1, 1024)
    assert many.seconds > 3 * one.seconds
    assert "(6% of the experts touched by 1.0 tokens)" in one.formula and "(100% of the experts" in many.formula


def test_compute_bounds_a_large_batch_on_a_small_gpu() -> None:
    """On an L40S (864 GB/s, 362 dense BF16 TFLOPS) Llama-3-70B in 16 bit, 1,024 sequences of 128 tokens, is FLOP-bound:
    2 × 1,024 × params / TP over the 16-bit peak exceeds the bytes over the bandwidth."""
    arch = _arch("llama-3-70b")
    _, step = _step(arch, 8, 1, 1024, gpu=L40S, bpp=2.0, ctx=128)
    flops = 2 * 1024 * (arch.parameter_count - arch.vocab_size * arch.hidden_size * 2) / 8
    assert step.bound == "compute"
    assert step.seconds >= flops / 362e12


def test_tp_across_nodes_pays_the_fabric() -> None:
    """TP 16 over two nodes all-reduces over the fabric (50 GB/s a GPU, 30 µs) instead of NVLink: slower a step
    than TP 8 × PP 2, whose only cross-node traffic is the hand-off."""
    arch = _arch("llama-3.1-405b")
    _, tp16 = _step(arch, 16, 1, 64)
    assert "over fabric" in tp16.formula
    a = Assumptions()
    assert tp16.seconds > 2 * arch.num_layers * a.fabric_latency_s
    assert math.isfinite(tp16.seconds) and tp16.seconds > 0


def test_attention_dp_reads_each_groups_own_kv() -> None:
    """DeepSeek-V3 at TP 8 with attention DP 8: every GPU holds the whole MLA cell but only its group's sequences,
    so at 256 sequences it reads an eighth of the KV cache plain TP 8 reads (the weights are larger: the attention is
    whole on every GPU)."""
    arch = _arch("deepseek-v3")
    h200 = GPU_PRODUCTS["NVIDIA-H200"]
    plain_pool, plain = _step(arch, 8, 1, 256, gpu=h200)
    dp_pool, dp = _step(arch, 8, 1, 256, gpu=h200, attn_dp=8)
    assert plain_pool.stages[0][1] == dp_pool.stages[0][1]  # MLA: the same cell on every GPU
    kv = 256 * 2048 * plain_pool.stages[0][1]
    assert f"+ {kv / GIB:,.2f} GiB KV" in plain.formula and f"+ {kv / 8 / GIB:,.2f} GiB KV" in dp.formula
    assert dp.seconds < plain.seconds


def test_ep_waits_for_the_gpu_whose_experts_were_touched_most() -> None:
    """Under EP each GPU holds whole experts, so a step waits for the busiest GPU. The closed form (each expert
    touched independently) against a routing simulation (each token picks 8 distinct of 128 experts, seeded): within
    8 % at 1, 4, 8 and 64 tokens, and 1 without EP. A small batch makes EP's step slower than TP's; a large one not."""
    arch = _arch("qwen3-235b-a22b-fp8")
    rng = random.Random(41)
    for tokens in (1, 4, 8, 64):
        trials, worst = 2000, 0.0
        for _ in range(trials):
            touched = set().union(*(rng.sample(range(128), 8) for _ in range(tokens)))
            per_gpu = [sum(1 for e in touched if e // 16 == g) for g in range(8)]
            worst += max(per_gpu) / (len(touched) / 8)
        assert ep_imbalance(arch, tokens, 8) == pytest.approx(worst / trials, rel=0.08), tokens
    assert ep_imbalance(arch, 8, 1) == 1.0 and ep_imbalance(_arch("llama-3.1-405b"), 8, 8) == 1.0
    pool = replica_pool(arch, 1.0, 2, 8, 1, free_at_start_bytes(H100, 8), 0.85)
    assert H100.speed is not None

    def step(seqs: int, ep: int) -> float:
        return decode_step(arch, H100, H100.speed, pool, precision="fp8", tp=8, pp=1, attn_dp=1, ep=ep,
                           sequences=seqs, context_length=4096, gpus_per_node=8, fabric_gb_s=50.0).seconds  # fmt: skip

    assert step(8, 8) > 1.2 * step(8, 1)
    assert step(1024, 8) == pytest.approx(step(1024, 1), rel=0.01)
