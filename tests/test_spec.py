"""Validators of the typed spec: parametrised bad input, each error naming the field, value and fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from serving.spec.schema import Architecture, FleetSpec, LogLevel, Precision, architecture_from_hf_config
from serving.spec.schema.model import MULTIMODAL_ARCHS
from serving.spec.stack import SpecError, load_stack, load_stack_file, parse_spec
from tests.support.paths import REPO
from tests.support.sglang_multimodal import multimodal_archs
from tests.support.sglang_parsers import SGLANG_VENV
from tests.support.stacks import SOURCE_PLAN, spec_from, stack_doc, with_changes


def parse(changes: dict[str, Any], base: str = "prod") -> FleetSpec:
    return parse_spec(with_changes(stack_doc(base), changes), "test", REPO)


@pytest.mark.parametrize(
    ("changes", "path", "match"),
    [
        ({"serving.replicas": 0}, "serving.replicas", "got 0: Input should be greater than 0"),
        ({"serving.releases": {"v1": "lmsysorg/sglang:latest"}}, "serving.releases", "release 'v1'.*not pinned"),
        ({"serving.releases": {"v1": "lmsysorg/sglang"}}, "serving.releases", "not pinned"),
        # issue 25: anything after '@' passed as a digest, even `@latest` or a digest of no repository
        ({"serving.releases": {"v1": "lmsysorg/sglang@latest"}}, "serving.releases", "'latest' after '@' is not a"),
        ({"serving.releases": {"v1": "lmsysorg/sglang@sha256:abc"}}, "serving.releases", "not a sha256:<64 hex"),
        ({"kubernetes.router_image": "@sha256:" + "0" * 64}, "kubernetes.router_image", "of a named repository"),
        ({"serving.version": "v2"}, "serving", "version 'v2' is not in releases"),
        ({"rollout.group_versions": {0: "v3"}}, "", "not in serving.releases"),
        (
            {"scheduler.weights": {"gpu_utilization": 0.5, "memory_usage": 0.3, "network_bandwidth": 0.3}},
            "scheduler.weights",
            "sum to 1.1",
        ),
        ({"model.architecture.num_kv_heads": 6}, "model.architecture", "num_kv_heads=6 must divide"),
        ({"cluster.pools.0.first_address": "10.99.0.1"}, "cluster.pools[0]", "outside subnet 10.40.0.0/22"),
        ({"cluster.pools.0.count": 5000}, "cluster.pools[0]", "widen the subnet or lower count"),
        ({"cluster.pools.0.name_pattern": "gpu-{host}"}, "cluster.pools[0].name_pattern", "unknown placeholder"),
        ({"cluster.pools.0.name_pattern": "gpu"}, "cluster", "generated more than once"),
        ({"serving.replicas_per_nod": 8}, "serving.replicas_per_nod", "unknown field"),
        ({"health.stop_routing_below": 20}, "health", "migrate_below \\(30\\) < stop_routing_below \\(20\\)"),
        ({"rollout.group_versions": {7: "v2"}}, "rollout", "outside 0..4"),
        ({"model.quantization": None}, "model", "needs model.quantization"),
        ({"model.precision": "fp32"}, "model.precision", "got 'fp32'"),
        ({"cluster.cost.node_price_low": 300000}, "cluster.cost", "swap them"),
        ({"storage.model_store.server": None}, "storage.model_store", "set server"),
        ({"cluster.fabric.kind": "roce", "cluster.fabric.hcas": []}, "cluster.fabric", "needs at least one HCA"),
        ({"serving.heartbeat_interval_s": -5}, "serving.heartbeat_interval_s", "got -5"),
        ({"runtime.restart_backoff_s": 600}, "runtime", r"restart_backoff_s \(600\) is above .*max_s \(300\)"),
        # issue 38: the stall signal counts tokens over one of SGLang's inter-token latency bucket bounds
        ({"runtime.stall_gap_s": 3}, "runtime.stall_gap_s", "3 s is not a bound of .*use one of 1, 2, 4, 6, 8"),
    ],
)
def test_bad_input_names_field_value_and_fix(changes: dict[str, Any], path: str, match: str) -> None:
    with pytest.raises(SpecError) as info:
        parse(changes)
    paths = [p for p, _ in info.value.problems]
    assert path in paths, f"expected a problem at {path}, got {info.value.problems}"
    assert any(__import__("re").search(match, m) for p, m in info.value.problems if p == path), str(info.value)


@pytest.mark.parametrize("image", ["lmsysorg/sglang@sha256:" + "0f" * 32, "lmsysorg/sglang:v0.5.23@sha256:" + "a" * 64])
def test_an_image_by_digest_is_pinned(image: str) -> None:
    """What the image workflow publishes (repo@sha256:<digest>, optionally with its tag) is accepted as pinned."""
    assert parse({"serving.releases": {"v1": image}}).serving.releases["v1"] == image


def test_model_validate_raises_validation_error_for_programmatic_use() -> None:
    with pytest.raises(ValidationError, match="experts_per_token=9 exceeds num_experts=8"):
        FleetSpec.model_validate(
            with_changes(stack_doc("prod"), {"model.architecture.moe": {"num_experts": 8, "experts_per_token": 9}})
        )


def test_sandbox_versions_must_define_every_version_the_fleet_runs() -> None:
    with pytest.raises(SpecError, match=r"version\(s\) \['v9'\] are not defined in sandbox.versions"):
        parse({"serving.version": "v9", "serving.releases.v9": "lmsysorg/sglang:v0.5.23-cu126"}, base="sandbox")


@pytest.mark.parametrize(
    ("changes", "least", "fixes"),
    [
        # issue 28: the sandbox's 2 s soak against 5 s load polls; no batch's QPS gate was judged
        ({"rollout.interval_s": 2, "serving.warmup_duration_s": 1}, 10, "Set rollout.interval_s to at least 10, set "
         "serving.heartbeat_interval_s to at most 1 (polls every 1 s; it also sets the health-check cadence and the "
         "request timeout, docs/units.md), or choose a scheduler.strategy"),
        # a 2.5 s heartbeat is rendered as a 3 s poll (smg's --load-monitor-interval takes whole seconds)
        ({"rollout.interval_s": 5.5, "serving.warmup_duration_s": 1, "serving.heartbeat_interval_s": 2.5}, 6,
         "at most 2 (polls every 2 s;"),
        ({"rollout.interval_s": 1.5, "serving.warmup_duration_s": 1}, 10, "at least 10, or choose"),
    ],
)  # fmt: skip
def test_a_soak_shorter_than_two_load_polls_is_refused_at_load_time(
    changes: dict[str, Any], least: float, fixes: str
) -> None:
    with pytest.raises(SpecError) as info:
        parse(changes)
    [(path, message)] = info.value.problems
    assert path == "rollout.interval_s" and message.startswith(f"got {changes['rollout.interval_s']:g}: "), message
    assert f"shorter than {least:g} s, 2 of the router's load polls" in message and fixes in message, message
    assert "Traceback" not in str(info.value)


@pytest.mark.parametrize(
    "changes",
    [
        {"rollout.interval_s": 10, "serving.warmup_duration_s": 1},  # exactly two polls
        {"rollout.interval_s": 2, "serving.warmup_duration_s": 1, "serving.heartbeat_interval_s": 1},
        {"rollout.interval_s": 2, "serving.warmup_duration_s": 1, "scheduler.strategy": "round_robin"},
        {"rollout.interval_s": 0},  # no soak at all: nothing to judge
    ],
)
def test_a_soak_of_two_load_polls_or_without_polls_loads(changes: dict[str, Any]) -> None:
    assert parse(changes).rollout.interval_s == changes["rollout.interval_s"]


def test_defaults_are_the_source_values() -> None:
    spec = load_stack_file(SOURCE_PLAN).spec
    s, sch, h, r = spec.serving, spec.scheduler, spec.health, spec.rollout
    assert (s.heartbeat_interval_s, s.failure_threshold, s.migration_timeout_s) == (5, 3, 10)
    assert (s.health_check_timeout_s, s.warmup_share, s.warmup_duration_s, s.log_level) == (
        3,
        0.1,
        30,
        LogLevel.WARNING,
    )
    assert sch.weights == {"gpu_utilization": 0.5, "memory_usage": 0.3, "network_bandwidth": 0.2}
    assert (sch.period_ms, sch.migration_load_ratio, sch.instances) == (100, 1.5, 3)
    assert (h.start, h.timeout_penalty, h.success_reward, h.cap, h.stop_routing_below, h.migrate_below) == (
        100,
        5,
        1,
        100,
        60,
        30,
    )
    assert (r.batches, r.interval_s, r.max_qps_drop, r.max_p99_rise, r.max_error_rate) == (5, 300, 0.2, 0.3, 0.001)
    assert spec.cluster.gpu.usable_memory_fraction == 0.85 and spec.cluster.ntp.max_offset_ms == 100
    assert spec.model.precision is Precision.FP16 and spec.parallelism.gpus_per_replica == 8


def test_prod_inventory_expands_to_256_named_nodes_in_16_racks() -> None:
    spec = load_stack("prod").spec
    nodes = spec.cluster.nodes
    assert len(nodes) == 256 and len({n.name for n in nodes}) == 256
    assert spec.cluster.rack_count == 16
    per_rack = {r: sum(n.rack == r for n in nodes) for r in {n.rack for n in nodes}}
    assert set(per_rack.values()) == {16}
    assert nodes[0].name == "gpu-r00-n00" and str(nodes[0].address) == "10.40.0.11"
    assert nodes[17].name == "gpu-r01-n01" and nodes[17].leaf == "leaf-01" and str(nodes[17].address) == "10.40.0.28"
    assert str(nodes[-1].address) == "10.40.1.10"


def test_uneven_racks_fill_in_order() -> None:
    spec = spec_from("dev", cluster__pools__0__count=10, cluster__pools__0__racks=3)
    racks = [n.rack for n in spec.cluster.nodes]
    assert racks == ["rack-00"] * 4 + ["rack-01"] * 4 + ["rack-02"] * 2


def test_hf_config_supplies_architecture_and_stack_overrides_win() -> None:
    spec = spec_from(
        "dev",
        model__hf_config="models/deepseek-v3/config.json",
        model__architecture={"parameter_count": 671_000_000_000, "num_kv_heads": 128},
    )
    a = spec.model.architecture
    assert a.mla is not None and (a.mla.kv_lora_rank, a.mla.qk_rope_head_dim) == (512, 64)
    assert a.moe is not None and (a.moe.num_experts, a.moe.experts_per_token) == (256, 8)
    assert (a.num_layers, a.hidden_size, a.vocab_size) == (61, 7168, 129280)
    llama = load_stack("prod").spec.model.architecture
    assert (llama.num_kv_heads, llama.num_attention_heads, llama.head_dim) == (8, 64, 128)


def test_missing_hf_config_is_a_spec_error_with_the_path() -> None:
    with pytest.raises(SpecError, match=r"model.hf_config.*does not exist"):
        spec_from("dev", model__hf_config="models/nope/config.json")


def test_log_level_accepts_warn_alias() -> None:
    assert spec_from("dev", serving__log_level="WARN").serving.log_level is LogLevel.WARNING


def test_stack_file_errors(tmp_path: Path) -> None:
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text("config: [unclosed")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_stack_file(bad)
    bad.write_text("config:\n  aws:region: us-east-1\n")
    with pytest.raises(SpecError, match="no 'exaserve:' keys"):
        load_stack_file(bad)
    with pytest.raises(SpecError, match="no stack named 'staging'; known stacks: dev, prod, sandbox"):
        load_stack("staging")


def test_non_mapping_architecture_with_hf_config_is_a_spec_error() -> None:
    """Found by the hypothesis fuzz: a scalar architecture beside hf_config crashed the merge."""
    with pytest.raises(SpecError, match=r"model\.architecture: got 5: expected a mapping"):
        spec_from("prod", model__architecture=5)


def test_the_model_configs_are_whole_published_files() -> None:
    """Issue 41: models/ carried subsets of the published config.json files (Qwen3-235B-A22B-FP8's lacked its
    activation_scheme and modules_to_not_convert). Each is now a whole published file (models/README.md names the
    copy); every one loads, and an FP8 checkpoint's carries what SGLang's Fp8Config requires."""
    readme = (REPO / "models" / "README.md").read_text()
    configs = sorted((REPO / "models").glob("*/config.json"))
    assert len(configs) >= 7
    for path in configs:
        cfg = json.loads(path.read_text())
        assert {"architectures", "model_type", "torch_dtype", "transformers_version"} <= cfg.keys(), path
        assert f"`{path.parent.name}`" in readme, path
        arch = Architecture.model_validate(architecture_from_hf_config(cfg, str(path)))
        if arch.quant_method == "fp8":
            assert cfg["quantization_config"]["activation_scheme"] == "dynamic", path


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        ({"vision_config": {"hidden_size": 1280}}, "a multimodal config.json (it has vision_config)"),
        ({"text_config": {"hidden_size": 8192}}, "a multimodal config.json (it has text_config)"),
        (
            {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}},
            "quantization_config names quant_method fp8 but activation_scheme None",
        ),
        (
            {
                "quantization_config": {
                    "quant_method": "fp8",
                    "activation_scheme": "static",
                    "weight_block_size": [128, 128],
                }
            },
            "block FP8 (weight_block_size) with activation_scheme static",
        ),
    ],
)
def test_a_config_sglang_would_size_or_refuse_otherwise_is_refused_naming_why(
    change: dict[str, Any], refusal: str, tmp_path: Path
) -> None:
    """A multimodal config (SGLang lowers the fraction for its vision tower and reserves multimodal memory out of the
    KV budget, neither planned) and an FP8 quantization_config without activation_scheme (SGLang refuses to start)
    are spec errors naming the file, the cause and the SGLang line."""
    cfg = {**json.loads((REPO / "models/llama-3-70b/config.json").read_text()), **change}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(SpecError) as info:
        parse({"model.hf_config": str(path), "model.architecture": {}})
    text = str(info.value)
    assert refusal in text and str(path) in text, text
    assert "memory_hook.py:331" in text or "fp8.py:350" in text or "fp8.py:311" in text, text


def test_a_quantization_flag_other_than_the_checkpoints_method_is_refused(tmp_path: Path) -> None:
    """SGLang refuses --quantization awq for a GPTQ checkpoint (configs/model_config.py:2143: the flag and the
    checkpoint's quant_method differ); so does the spec, naming the method to set."""
    cfg = {
        **json.loads((REPO / "models/llama-3-70b/config.json").read_text()),
        "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128},
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(SpecError) as info:
        parse({"model.hf_config": str(path), "model.architecture": {}})
    assert "model.quantization='awq' with a checkpoint whose quantization_config.quant_method is 'gptq'" in str(
        info.value
    ) and "set model.quantization to 'gptq'" in str(info.value)
    assert (
        parse({"model.hf_config": str(path), "model.architecture": {}, "model.quantization": "gptq"}).model.quantization
        == "gptq"
    )


def test_the_pinned_multimodal_architectures_are_sglangs_and_refused() -> None:
    """serving/data/sglang-0.5.23-multimodal-archs.json is SGLang's own multimodal_model_archs (read from the installed
    source); a config whose architecture is on it is refused though it carries no vision_config (LLaVA's)."""
    srt = next(SGLANG_VENV.glob("lib/python*/site-packages/sglang/srt"))
    assert sorted(MULTIMODAL_ARCHS) == sorted(multimodal_archs(srt / "configs" / "model_config.py"))
    assert "LlavaLlamaForCausalLM" in MULTIMODAL_ARCHS
    cfg = {
        **json.loads((REPO / "models/llama-3-70b/config.json").read_text()),
        "architectures": ["LlavaLlamaForCausalLM"],
    }
    with pytest.raises(ValueError, match=r"multimodal config.json \(it has architecture LlavaLlamaForCausalLM\)"):
        architecture_from_hf_config(cfg, "llava/config.json")
