"""The planner against worked examples computed by hand here, and the source plan's arithmetic:
reproduced where it is right, corrected where it is wrong."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from serving.plan import planner
from serving.plan.model import utilisation_band
from serving.spec.schema import GB
from serving.spec.stack import load_stack, load_stack_file
from tests.support.stacks import SOURCE_PLAN, fleet_of, spec_from

LLAMA70_PARAMS = 70_553_706_496


def test_gqa_kv_per_token_uses_kv_heads_not_attention_heads() -> None:
    spec = load_stack("prod").spec
    # Llama-3-70B: 80 layers, 8 KV heads (of 64 attention heads), head_dim 128, 16-bit cache.
    by_hand = 2 * 80 * 8 * 128 * 2
    assert by_hand == 327_680
    assert planner.kv_bytes_per_token(spec.model.architecture, 2).value == by_hand


def test_source_kv_figure_is_right_arithmetic_on_the_wrong_heads() -> None:
    """§4.2: 2 × 80 × 64 × 128 × 4096 × 8 × 2 B ≈ 86 GB — correct for 64 KV heads (MHA), 8× too big for GQA."""
    mha = load_stack_file(SOURCE_PLAN).spec.model.architecture.model_copy(update={"num_kv_heads": 64})
    per_token = planner.kv_bytes_per_token(mha, 2).value
    assert per_token * 4096 * 8 == 2 * 80 * 64 * 128 * 4096 * 8 * 2
    assert round(per_token * 4096 * 8 / GB) == 86
    gqa = load_stack("prod").spec.model.architecture
    assert per_token / planner.kv_bytes_per_token(gqa, 2).value == 8


def test_mla_kv_per_token_is_the_compressed_latent() -> None:
    spec = spec_from(
        "dev",
        model__hf_config="models/deepseek-v3/config.json",
        model__architecture={"parameter_count": 671_000_000_000},
    )
    a = spec.model.architecture
    by_hand = 61 * (512 + 64) * 2  # layers × (kv_lora_rank + qk_rope_head_dim) × 2 B
    assert planner.kv_bytes_per_token(a, 2).value == by_hand == 70_272
    # MLA's latent is not split by TP: each of 8 ranks holds all of it.
    assert planner.kv_bytes_per_token_per_gpu(a, 2, tp=8, pp=1).value == by_hand
    # An MHA model of the same shape (128 KV heads of 128) would store 2 × 61 × 128 × 128 × 2 B = 3,997,696 B: 57× more.
    mha = a.model_copy(update={"mla": None, "num_kv_heads": 128, "head_dim": 128})
    assert planner.kv_bytes_per_token(mha, 2).value == 3_997_696
    assert round(3_997_696 / by_hand) == 57


def test_uneven_pp_split_sizes_the_fullest_stage() -> None:
    """DeepSeek-V3's 61 layers at PP 2 split 31 + 30: a GPU of the first stage holds 31 layers of KV, so the
    per-GPU figure is ⌈61/2⌉ = 31 layers × (512 + 64) × 2 B = 35,712 B per token (the floor, 30, gives 34,560 B
    and under-sizes the fullest stage). GQA: Llama-3-70B's 80 layers at PP 3 split 27 + 27 + 26, TP 8 leaves one of
    8 KV heads per rank: 2 × 27 × 1 × 128 × 2 B = 13,824 B."""
    a = spec_from(
        "dev",
        model__hf_config="models/deepseek-v3/config.json",
        model__architecture={"parameter_count": 671_000_000_000},
    ).model.architecture
    assert a.num_layers == 61
    assert planner.kv_bytes_per_token_per_gpu(a, 2, tp=8, pp=2).value == 35_712
    llama = load_stack("prod").spec.model.architecture
    assert planner.kv_bytes_per_token_per_gpu(llama, 2, tp=8, pp=3).value == 13_824


def test_moe_model_weights_count_every_expert_and_kv_uses_gqa() -> None:
    spec = spec_from(
        "dev",
        model__hf_config="models/mixtral-8x7b/config.json",
        model__precision="bf16",
        model__quantization=None,
        model__architecture={"parameter_count": 46_702_792_704},
        parallelism__tp=2,
    )
    m = planner.memory_plan(spec, "source")
    assert spec.model.architecture.moe is not None
    assert m.weights.value == 46_702_792_704 * 2  # all experts are resident, not just the 2 active
    assert m.kv_per_token.value == 2 * 32 * 8 * 128 * 2
    assert m.per_gpu["weights"].value == pytest.approx(46_702_792_704)  # 93.4 GB over TP 2
    # 46.7 GB weights + 7 GB act + 5 GB overhead + KV, × 1.15 > 68 GB usable: infeasible at TP 2.
    assert m.per_gpu["total"].value > m.usable_per_gpu.value


def test_tp_beyond_kv_heads_replicates_heads() -> None:
    a = load_stack("prod").spec.model.architecture
    assert planner.kv_bytes_per_token_per_gpu(a, 2, tp=16, pp=1).value == 2 * 80 * 1 * 128 * 2
    assert planner.kv_bytes_per_token_per_gpu(a, 2, tp=4, pp=2).value == 2 * 40 * 2 * 128 * 2


def test_source_replica_budget_369_gb_is_reproduced() -> None:
    """§4.2: 200 + 86 + 30 (15 %) + 5 = 321 GB, + 15 % margin (48 GB) = 369 GB."""
    b = planner.replica_memory_budget(200 * GB, 85.9 * GB, 0.15, 5 * GB, 0.15)
    assert round(b["activations"].value / GB) == 30
    assert round(b["safety_margin"].value / GB) == 48
    assert round(b["total"].value / GB) == 369
    assert (b["weights"].value, b["kv_cache"].value, b["framework_overhead"].value) == (200 * GB, 85.9 * GB, 5 * GB)
    # Each figure shows its derivation: 15 % of 200 GB; 15 % of 200 + 85.9 + 30 + 5 = 320.9 GB.
    assert {k: (f.formula, f.unit) for k, f in b.items()} == {
        "weights": ("200.00 GB", "B"),
        "kv_cache": ("85.90 GB", "B"),
        "activations": ("15% × 200.00 GB = 30.00 GB", "B"),
        "framework_overhead": ("5.00 GB", "B"),
        "safety_margin": ("15% × 320.90 GB = 48.13 GB", "B"),
        "total": ("320.90 GB + 48.13 GB = 369.04 GB", "B"),
    }


def test_prod_per_gpu_budget_by_hand() -> None:
    """The source heuristic, still available as ``--memory-model source``."""
    m = planner.memory_plan(load_stack("prod").spec, "source")
    assert m.model == "source"
    weights = LLAMA70_PARAMS * 0.5  # int4
    kv = 327_680 * 4096 * 8
    act = 0.15 * weights
    total = (weights + kv + act + 5 * GB) * 1.15
    assert m.per_gpu["total"].value == pytest.approx(total)
    assert m.usable_per_gpu.value == pytest.approx(80 * GB * 0.85)
    pool = 80 * GB * 0.85 / 1.15 - (weights + act + 5 * GB)
    assert m.max_concurrent_sequences.value == math.floor(pool / (327_680 * 4096)) == 10
    assert m.mem_fraction_static.value == pytest.approx((weights + pool) / (80 * GB))
    assert m.max_total_tokens.value == math.floor(pool / 327_680)


def test_source_capacity_chain() -> None:
    """§3.2: 3072 × 4 = 12,288 → × 80 % = 9,830 → − 10 % = 8,847 → burst buffer → ≈ 8,000; / 1.5 s ≈ 5,300."""
    c = planner.capacity_chain(4, 3072, 0.8, 0.10, 0.10, 1.5)
    assert c.raw.value == 12_288
    assert round(c.balanced.value) == 9_830
    assert round(c.after_reserve.value) == 8_847
    assert round(c.sustained.value, -2) == 8_000
    assert round(c.requests_per_second.value, -2) == 5_300


def test_source_heartbeat_counts_are_per_interval_not_per_second() -> None:
    spec = load_stack_file(SOURCE_PLAN).spec
    hb = planner.heartbeat_plan(spec, replicas=3072, nodes=256)
    assert (hb.direct_per_interval.value, hb.aggregated_per_interval.value) == (3072, 256)
    assert hb.direct_per_s.value == pytest.approx(614.4)
    assert hb.aggregated_per_s.value == pytest.approx(51.2)
    fast = planner.heartbeat_plan(spec_from("prod", serving__heartbeat_interval_s=2), replicas=3072, nodes=256)
    assert fast.direct_per_s.value / hb.direct_per_s.value == pytest.approx(2.5)


def test_detection_includes_the_last_probe_timeout() -> None:
    """Source: 3 × 5 s = 15 s detection, ≈ 25 s recovery; worst case adds the last probe's 3 s timeout."""
    hb = planner.heartbeat_plan(load_stack_file(SOURCE_PLAN).spec, replicas=3072, nodes=256)
    assert hb.failure_detection_s.value == 3 * 5 + 3
    assert hb.recovery_s.value == 3 * 5 + 3 + 10


def test_health_score_steps() -> None:
    hb = planner.heartbeat_plan(load_stack("prod").spec, replicas=2048, nodes=256)
    # 100 − 5k < 60 ⇒ k = 9 ; 100 − 5k < 30 ⇒ k = 15 ; from 55 back to 60 at +1 ⇒ 5.
    assert (hb.timeouts_to_stop_routing.value, hb.timeouts_to_migrate.value, hb.successes_to_readmit.value) == (
        9,
        15,
        5,
    )


def test_source_allreduce_volume_and_the_megatron_correction() -> None:
    spec = spec_from(
        "prod",
        parallelism__tp=2,
        parallelism__pp=4,
        model__precision="fp16",
        model__quantization=None,
        serving__replicas=256,
        serving__replicas_per_node=1,
    )
    n = planner.network_plan(spec)
    assert n.source_allreduce_per_layer.value == 8192 * 8 * 4096 * 2 == 512 * 2**20
    assert n.source_allreduce_per_forward.value == 40 * 2**30
    assert n.tp_allreduce_per_forward.value == 80 * 2**30  # two all-reduces per layer
    assert n.fabric_bytes_per_forward.value == 0  # TP 2 × PP 4 = 8 GPUs stays inside one node
    cross = planner.network_plan(
        spec_from("prod", parallelism__tp=16, serving__replicas_per_node=None, serving__replicas=128)
    )
    assert cross.fabric_bytes_per_forward.value == pytest.approx(80 * 2**30 * 2 * 15 / 16)


@pytest.mark.parametrize(
    ("rate", "band"),
    [
        (10, (0.0, 0.15)),
        (25, (0.15, 0.25)),
        (100, (0.45, 0.60)),
        (200, (0.65, 0.80)),
        (400, (0.80, 0.92)),
        (800, (0.80, 0.92)),
    ],
)
def test_utilisation_band_table(rate: int, band: tuple[float, float]) -> None:
    assert utilisation_band(rate)[:2] == band


def test_source_cost_range_and_power() -> None:
    c = planner.cost_plan(load_stack("prod").spec)
    assert (c.nodes_low.value, c.nodes_high.value) == (256 * 150_000, 256 * 200_000) == (38_400_000, 51_200_000)
    assert c.power_kw.value == 768
    assert c.hardware_low.value == pytest.approx(38_400_000 / 0.85)
    assert c.network_high.value == pytest.approx(51_200_000 * 0.2 / 0.8)
    assert c.electricity_month_low.value == pytest.approx(768 * 730 * 0.72)
    assert 400_000 <= c.electricity_month_low.value < c.electricity_month_high.value <= 510_000
    assert c.node_failures_per_month.value == pytest.approx(256 * 0.05 / 12)  # ≈ one a month


def test_source_placement_is_infeasible_by_12x() -> None:
    p = planner.placement(load_stack_file(SOURCE_PLAN).spec)
    assert p.gpus_per_replica == 8 and p.max_replicas_per_node == 1 and p.max_replicas == 256
    # The source asks for 12 replicas per node; one fits.
    assert load_stack_file(SOURCE_PLAN).spec.serving.replicas_per_node / p.max_replicas_per_node == 12


def test_spanning_replicas_place_on_whole_nodes() -> None:
    spec = spec_from(
        "prod", parallelism__tp=8, parallelism__pp=2, serving__replicas=128, serving__replicas_per_node=None
    )
    p = planner.placement(spec)
    assert (p.nodes_per_replica, p.max_replicas, p.pp_crosses_nodes, p.tp_crosses_nodes) == (2, 128, True, False)
    reps = planner.fleet_replicas(spec)
    assert len(reps) == 128 and all(len(r.nodes) == 2 for r in reps)
    assert len({n.name for r in reps for n in r.nodes}) == 256


def test_rollout_groups_cover_every_replica_once_and_span_all_racks() -> None:
    spec = load_stack("prod").spec
    reps = planner.fleet_replicas(spec)
    groups = planner.rollout_groups(len(reps), 5)
    assert sorted(i for g in groups for i in g) == list(range(2048))
    assert [len(g) for g in groups] == [410, 410, 410, 409, 409]
    for g in groups:
        racks = {reps[i].node.rack for i in g}
        assert len(racks) == 16
        per_node = Counter(reps[i].node.name for i in g)
        assert max(per_node.values()) <= math.ceil(8 / 5)
    assert all(reps[i].group == k for k, g in enumerate(groups) for i in g)


def test_fleet_replicas_have_unique_ids_and_disjoint_gpus() -> None:
    reps = planner.fleet_replicas(load_stack("dev").spec)
    assert len(reps) == 128 and len({r.id for r in reps}) == 128
    by_node: dict[str, list[int]] = {}
    for r in reps:
        by_node.setdefault(r.node.name, []).extend(r.gpu_ids)
    assert all(sorted(g) == list(range(8)) for g in by_node.values())
    assert {r.port for r in reps} == set(range(30000, 30008))


def test_plan_reports_the_source_target_against_what_fits() -> None:
    p = fleet_of(load_stack("prod").spec).plan
    assert p.notes and "3,072" in p.notes[0] and "2,048" in p.notes[0] and "66.7%" in p.notes[0]


def test_source_heuristic_on_the_source_config_by_hand() -> None:
    """§4.2's heuristic on the source's own config (Llama-3-70B fp16, TP 2 × PP 4, 8 sequences × 4,096 tokens), each
    figure derived here: 141.1 GB of weights over 8 GPUs; KV 2 × ⌈80/4⌉ × ⌈8/2⌉ × 128 × 2 B = 40,960 B per token."""
    spec = load_stack_file(SOURCE_PLAN).spec
    m = planner.memory_plan(spec, "source")
    weights = LLAMA70_PARAMS * 2 / 8  # 17,638,426,624 B
    kv = 40_960 * 4096 * 8  # 1,342,177,280 B
    subtotal = weights + kv + 0.15 * weights + 5 * GB
    total = subtotal * 1.15  # 30.62 GB per GPU
    usable = 80 * GB * 0.85
    pool = usable / 1.15 - (weights + 0.15 * weights + 5 * GB)  # 33.85 GB
    assert m.per_gpu["weights"].value == weights and m.per_gpu["kv_cache"].value == kv
    assert m.per_gpu["total"].value == pytest.approx(total)
    assert m.per_replica_total.value == pytest.approx(total * 8)
    assert m.usable_per_node.value == pytest.approx(544 * GB)  # the source's 544 GB per node
    assert m.kv_per_token_per_gpu.value == 40_960
    assert m.kv_pool_per_gpu.value == pytest.approx(pool)
    assert m.max_concurrent_sequences.value == 201 == math.floor(pool / (40_960 * 4096))
    assert m.max_total_tokens.value == 826_324 == math.floor(pool / 40_960)
    assert m.mem_fraction_static.value == pytest.approx((weights + pool) / (80 * GB))
    assert m.per_gpu["weights"].formula == "141.11 GB / (TP 2 × PP 4) = 17.64 GB"
    assert set(m.per_gpu) == {"weights", "kv_cache", "activations", "framework_overhead", "safety_margin", "total"}
    figures = [*m.per_gpu.values(), m.per_replica_total, m.usable_per_node, m.usable_per_gpu, m.kv_pool_per_gpu]
    assert {f.unit for f in figures} == {"B"} and all(f.formula for f in figures)
    assert (m.max_concurrent_sequences.unit, m.max_total_tokens.unit) == ("seqs", "tokens")
    # Data parallel 2: each rank serves ⌈8/2⌉ = 4 sequences, and the replica holds twice the sequences.
    dp2 = spec.model_copy(update={"parallelism": spec.parallelism.model_copy(update={"dp": 2})})
    m2 = planner.memory_plan(dp2, "source")
    assert m2.per_gpu["kv_cache"].value == 40_960 * 4096 * 4
    assert m2.max_concurrent_sequences.value == 201 * 2
