"""Serving units rendered from the spec, checked against golden files and the REAL parsers.

Golden files live in ``tests/golden/units/<stack>/``. After an intended change, refresh them with
``EXASERVE_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_render_units.py`` and review the diff (refused under
CI=true). The real parsers: the router's own ``parse_router_args``, SGLang's ``ServerArgs`` parser in
the throwaway SGLang venv (``scripts/sglang-manifest.sh``), ``systemd-analyze
verify`` (strict: any warning fails) and ``chronyd -p`` (chrony's own config parser).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from smg.launch_router import parse_router_args
from typer.testing import CliRunner

from serving.checks import rules
from serving.cli.commands import register
from serving.cli.options import app
from serving.flags import FlagValidationError, load_router_manifest, load_server_manifest
from serving.plan.model import Replica
from serving.plan.planner import fleet_replicas
from serving.render.chrony import chrony_conf
from serving.render.common import FlagRule, RenderError
from serving.render.k8s import monitoring
from serving.render.k8s.common import image
from serving.render.k8s.container import (
    SERVER_POD_LABELS,
    VOLUME_SHM,
    as_leader_pod,
    pod_container,
    pod_memory_bytes,
    pod_volumes,
)
from serving.render.router import (
    ROUTER_ENTRY,
    ROUTER_FLAGS,
    ROUTER_METRICS_PORT,
    router_args,
    router_env,
    router_policy,
)
from serving.render.sglang import (
    DIST_INIT_PORT,
    SERVER_ENTRY,
    SERVER_ENV,
    SERVER_FLAGS,
    check_server_argv,
    server_argv,
    server_env,
)
from serving.render.systemd import RESTART_SEC, START_LIMIT_BURST, systemd_unit, systemd_word, unit_name
from serving.sglang_health import HEALTH_POLL_S
from serving.spec.schema import FleetSpec
from serving.spec.stack import SpecError, load_stack
from tests.support.ci import in_ci
from tests.support.cli import exaserve
from tests.support.paths import REPO
from tests.support.sglang_parsers import SGLANG_PYTHON, real_parse, run_json_script_args
from tests.support.stacks import deepseek_h200_spec, fleet_of, spec_from
from tests.support.systemd import verify_unit

GOLDEN = Path(__file__).parent / "golden" / "units"
UPDATE_GOLDEN = os.environ.get("EXASERVE_UPDATE_GOLDEN") == "1"


def first(spec: FleetSpec) -> Replica:
    return fleet_replicas(spec)[0]


def multi_node_spec() -> FleetSpec:
    """prod with TP 8 × PP 2: every replica spans two nodes."""
    return spec_from(
        "prod", parallelism__tp=8, parallelism__pp=2, serving__replicas=128, serving__replicas_per_node=None
    )


def flag_values(argv: Sequence[str], entry: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """``--flag`` → its values, for the part of ``argv`` after ``entry``."""
    assert list(argv[: len(entry)]) == list(entry)
    out: dict[str, tuple[str, ...]] = {}
    flag = ""
    for word in argv[len(entry) :]:
        if word.startswith("--"):
            assert word not in out, f"{word} given twice"
            flag, out[word] = word, ()
        else:
            out[flag] += (word,)
    return out


def changed(a: dict[str, Any], b: dict[str, Any]) -> set[str]:
    return {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}


def pod_args_with_lws_values(container: dict[str, Any]) -> list[str]:
    return [*container["command"], *as_leader_pod(container["args"])]


# --- golden files ------------------------------------------------------------------------------------


def rendered_files(stack: str) -> dict[str, str]:
    spec = load_stack(stack).spec
    replicas = fleet_replicas(spec)
    files = {unit_name(r): systemd_unit(fleet_of(spec), r) for r in (replicas[0], replicas[-1])}
    files["router-kubernetes.json"] = (
        json.dumps({"argv": router_args(fleet_of(spec), kubernetes=True).to_argv(), "env": router_env(spec)}, indent=2)
        + "\n"
    )
    if len(replicas) <= 128:  # prod's 2,048 static worker URLs are left to the tests below
        files["router-static.json"] = json.dumps({"argv": router_args(fleet_of(spec)).to_argv()}, indent=2) + "\n"
    files["pod-container-group0.json"] = (
        json.dumps({"container": pod_container(fleet_of(spec), 0), "volumes": pod_volumes(fleet_of(spec))}, indent=2)
        + "\n"
    )
    files["chrony.conf"] = chrony_conf(spec)
    return files


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_rendered_units_match_the_golden_files(stack: str) -> None:
    folder = GOLDEN / stack
    files = rendered_files(stack)
    if UPDATE_GOLDEN:
        assert not in_ci(), "EXASERVE_UPDATE_GOLDEN=1 under CI=true: golden files are refreshed by a person, not CI"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for name, text in files.items():
            (folder / name).write_text(text)
    on_disk = {p.name: p.read_text() for p in folder.iterdir()} if folder.is_dir() else {}
    assert sorted(on_disk) == sorted(files), (
        f"golden files for {stack} differ in names; refresh with EXASERVE_UPDATE_GOLDEN=1 and review the diff"
    )
    for name, text in files.items():
        assert on_disk[name] == text, (
            f"{folder / name} differs from the rendered unit; if the change is intended, refresh with "
            "EXASERVE_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_render_units.py and review the diff"
        )


def test_every_rendered_file_carries_the_do_not_edit_header() -> None:
    for name, text in rendered_files("dev").items():
        if not name.endswith(".json"):
            assert re.match(
                r"# generated from templates/\S+\.j2 by serving\.render\.(?:systemd|chrony) — do not edit\n", text
            ), name


# --- one spec field, exactly the expected flags --------------------------------------------------------

ONE_FIELD_CASES = [
    # (change, server flags, server env, router flags)
    # SGLang's static fraction moves by tp × pp / 8 GiB of reserve: under 0.001 of an 80 GB GPU for TP 2.
    # Half the replicas: the worker list, and the job queue sized from the replica count.
    (
        {"parallelism__tp": 2},
        {"--tp-size"},
        {"CUDA_VISIBLE_DEVICES"},
        {"--worker-urls", "--job-queue-capacity", "--job-queue-concurrency"},
    ),
    # The pool still admits more than max_running_requests (8) sequences of 8,192 tokens.
    ({"limits__context_length": 8192}, {"--context-length"}, set(), {"--request-timeout-secs"}),
    ({"serving__log_level": "debug"}, {"--log-level"}, set(), {"--log-level"}),
    (
        {"serving__heartbeat_interval_s": 2},
        set(),
        set(),
        {
            "--health-check-interval-secs",
            "--cb-window-duration-secs",
            "--worker-startup-check-interval",
            "--load-monitor-interval",
        },
    ),
    (
        {"serving__failure_threshold": 5},
        set(),
        set(),
        {"--health-failure-threshold", "--cb-failure-threshold", "--cb-window-duration-secs"},
    ),
    # The request timeout is the longest generation: context length at the slowest decode, plus the P99 target.
    ({"limits__min_decode_tokens_per_s": 20}, set(), set(), {"--request-timeout-secs"}),
    # (the P99 target also moves the latency histogram buckets SGLang and the routers export, which the gates read)
    (
        {"limits__p99_target_s": 5},
        {"--bucket-e2e-request-latency"},
        set(),
        {"--request-timeout-secs", "--prometheus-duration-buckets"},
    ),
    ({"serving__success_threshold": 3}, set(), set(), {"--health-success-threshold", "--cb-success-threshold"}),
    ({"serving__health_check_timeout_s": 5}, set(), {"SGLANG_HEALTH_CHECK_TIMEOUT"}, {"--health-check-timeout-secs"}),
    ({"serving__startup_budget_s": 900}, set(), set(), {"--worker-startup-timeout-secs"}),
    ({"serving__watchdog_timeout_s": 120}, {"--watchdog-timeout"}, set(), set()),
    (
        {"scheduler__strategy": "cache_aware"},
        set(),
        set(),
        {"--policy", "--balance-rel-threshold", "--balance-abs-threshold"},
    ),
    ({"scheduler__retries": 0}, set(), set(), {"--retry-max-retries", "--disable-retries"}),
    ({"rollout__drain_timeout_s": 60}, set(), set(), {"--shutdown-grace-period-secs"}),
    ({"rollout__batches": 8}, set(), set(), {"--job-queue-concurrency"}),
    ({"limits__max_running_requests": 16}, {"--max-running-requests"}, set(), {"--worker-overload-waiting-requests"}),
    # SGLang sizes the pool itself (no --max-total-tokens); the KV dtype does not move the static fraction.
    ({"model__kv_cache_dtype": "fp8_e5m2"}, {"--kv-cache-dtype"}, set(), set()),
    ({"limits__chunked_prefill_size": 2048}, {"--chunked-prefill-size"}, set(), set()),
    (
        {"serving__version": "v2", "serving__releases": {"v2": "lmsysorg/sglang:v0.5.24-cu126"}},
        set(),
        {"EXASERVE_RELEASE"},
        set(),
    ),
]


@pytest.mark.parametrize(
    ("change", "server", "env", "router"), ONE_FIELD_CASES, ids=[next(iter(c[0])) for c in ONE_FIELD_CASES]
)
def test_one_field_changes_exactly_the_expected_flags(
    change: dict[str, Any], server: set[str], env: set[str], router: set[str]
) -> None:
    base, new = load_stack("dev").spec, spec_from("dev", **change)
    assert (
        changed(
            flag_values(server_argv(fleet_of(base), first(base)), SERVER_ENTRY),
            flag_values(server_argv(fleet_of(new), first(new)), SERVER_ENTRY),
        )
        == server
    )
    assert changed(server_env(fleet_of(base), first(base)), server_env(fleet_of(new), first(new))) == env
    assert (
        changed(
            flag_values(router_args(fleet_of(base)).to_argv(), ROUTER_ENTRY),
            flag_values(router_args(fleet_of(new)).to_argv(), ROUTER_ENTRY),
        )
        == router
    )


def test_heartbeat_settings_drive_the_pod_probes() -> None:
    spec = spec_from(
        "prod",
        serving__heartbeat_interval_s=2,
        serving__failure_threshold=4,
        serving__health_check_timeout_s=2.5,
        serving__startup_budget_s=301,
    )
    c = pod_container(fleet_of(spec), 0)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        # Liveness generates nothing (issue 10, finding 9); started and ready mean the scheduler answers a generation
        # (/health_generate: the server's /health does not generate, SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false).
        path = "/model_info" if probe == "livenessProbe" else "/health_generate"
        assert c[probe]["httpGet"] == {"path": path, "port": "http"}
        assert (c[probe]["periodSeconds"], c[probe]["timeoutSeconds"]) == (2, 3)
    assert c["readinessProbe"]["failureThreshold"] == c["livenessProbe"]["failureThreshold"] == 4
    assert c["readinessProbe"]["successThreshold"] == spec.serving.success_threshold
    assert c["startupProbe"]["failureThreshold"] * 2 >= 301  # the whole start-up budget, rounded up


def test_fabric_decides_the_nccl_environment() -> None:
    dev = server_env(fleet_of(load_stack("dev").spec), first(load_stack("dev").spec))  # 100 Gb Ethernet
    assert dev["NCCL_IB_DISABLE"] == "1" and "NCCL_IB_HCA" not in dev
    prod = load_stack("prod").spec  # InfiniBand, eight HCAs
    env = server_env(fleet_of(prod), first(prod))
    assert env["NCCL_IB_HCA"] == "=" + ",".join(f"mlx5_{i}" for i in range(8))
    assert "NCCL_IB_DISABLE" not in env and "NCCL_IB_GID_INDEX" not in env
    roce = spec_from("prod", cluster__fabric__kind="roce", cluster__fabric__nccl_ib_gid_index=3)
    assert server_env(fleet_of(roce), first(roce))["NCCL_IB_GID_INDEX"] == "3"
    assert env["HF_HUB_OFFLINE"] == "1" and env["SGLANG_HEALTH_CHECK_TIMEOUT"] == "2"


def test_sglang_answers_its_health_verdict_before_the_probes_hang_up() -> None:
    """SGLang's /health_generate answers 503 at its first 1 s look past SGLANG_HEALTH_CHECK_TIMEOUT; the callers (the
    probes on it, the systemd start check) must still be listening then, or they judge a timeout at SGLang's last look."""
    for stack in ("prod", "dev"):
        spec = load_stack(stack).spec
        fleet = fleet_of(spec)
        server = int(server_env(fleet, first(spec))["SGLANG_HEALTH_CHECK_TIMEOUT"])
        c = pod_container(fleet, 0)
        for probe in ("startupProbe", "readinessProbe"):
            assert c[probe]["httpGet"]["path"] == "/health_generate"
            assert server + HEALTH_POLL_S <= c[probe]["timeoutSeconds"], (stack, probe, server, c[probe])


# Run in the SGLang venv: for each [name, value], the value as SGLang's own Envs field parses it, or, for a variable
# that is no Envs field, the files of SGLang that name it in quotes (read with os.getenv / os.environ).
ENV_READER = """
import json, os, pathlib, sys
import sglang
from sglang.srt.environ import Envs
out = []
for name, value in json.load(sys.stdin):
    os.environ[name] = value
    field = Envs.__dict__.get(name)
    if field is not None:
        out.append({"parsed": field.get(), "read_by": []})
        continue
    root = pathlib.Path(sglang.__file__).parent
    needle = repr(name)[1:-1]
    hits = [str(p.relative_to(root)) for p in root.rglob("*.py") if '"' + needle + '"' in p.read_text(errors="replace")]
    out.append({"parsed": None, "read_by": sorted(hits)})
print(json.dumps(out))
"""


def test_every_sglang_variable_in_the_server_env_is_one_the_pinned_sglang_reads(regenerated: Path) -> None:
    """A misspelt or retired SGLANG_* variable is silently ignored by the server: each one rendered must be an Envs
    field of the pinned SGLang (parsing to what we mean) or be read by name in its source."""
    prod = load_stack("prod").spec
    env = {k: v for k, v in server_env(fleet_of(prod), first(prod)).items() if k.startswith("SGLANG_")}
    assert "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION" in env and "SGLANG_HEALTH_CHECK_TIMEOUT" in env
    results = dict(
        zip(env, run_json_script_args(SGLANG_PYTHON, ["-c", ENV_READER], [[k, v] for k, v in env.items()]), strict=True)
    )
    for name, found in results.items():
        assert found["parsed"] is not None or found["read_by"], f"{name}={env[name]}: the pinned SGLang never reads it"
    # /health answers without a generation (the routers' cheap check, http_server.py `health_generate`)
    assert results["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"]["parsed"] is False
    assert "srt/entrypoints/http_server.py" in results["SGLANG_HEALTH_CHECK_TIMEOUT"]["read_by"]


def test_replicas_on_one_node_get_their_own_gpus_and_ports() -> None:
    spec = load_stack("prod").spec
    replicas = fleet_replicas(spec)
    on_node = [r for r in replicas if r.node == replicas[0].node]
    seen = {
        (
            server_env(fleet_of(spec), r)["CUDA_VISIBLE_DEVICES"],
            flag_values(server_argv(fleet_of(spec), r), SERVER_ENTRY)["--port"],
        )
        for r in on_node
    }
    assert len(seen) == len(on_node) == 8
    assert {gpus for gpus, _ in seen} == {str(i) for i in range(8)}


def test_memory_flags_come_from_the_planner() -> None:
    from serving.plan.planner import memory_plan

    spec = load_stack("prod").spec
    flags = flag_values(server_argv(fleet_of(spec), first(spec)), SERVER_ENTRY)
    mp = memory_plan(spec)
    # SGLang sizes its own pool from the static fraction: an estimate good to ±5 % must not cap it.
    assert "--max-total-tokens" not in flags
    assert flags["--mem-fraction-static"] == (f"{math.floor(mp.mem_fraction_static.value * 1000) / 1000:.3f}",)
    # issue 41: the default differs between SGLang versions; the plan says whose it is (the pin's, 0.5.23)
    assert mp.mem_fraction_static.formula.startswith("SGLang 0.5.23's default"), mp.mem_fraction_static.formula
    assert int(flags["--max-running-requests"][0]) == min(
        spec.limits.max_running_requests, int(mp.max_concurrent_sequences.value)
    )


def test_attention_dp_renders_attn_dp_size_and_its_fraction() -> None:
    """parallelism.attn_dp renders --attn-dp-size (SGLang 0.5.23's flag; --enable-dp-attention is deprecated) with
    the fraction the planner sized for it, and the running-request cap over all attention-DP workers (SGLang
    gives each max_running_requests / attn_dp); attn_dp 1 renders no flag."""
    dp8, plain = deepseek_h200_spec(8), deepseek_h200_spec(1)
    flags = flag_values(server_argv(fleet_of(dp8), first(dp8)), SERVER_ENTRY)
    assert flags["--attn-dp-size"] == ("8",) and flags["--tp-size"] == ("8",) and flags["--dp-size"] == ("1",)
    assert "--enable-dp-attention" not in flags
    plain_flags = flag_values(server_argv(fleet_of(plain), first(plain)), SERVER_ENTRY)
    assert "--attn-dp-size" not in plain_flags
    assert float(flags["--mem-fraction-static"][0]) < float(plain_flags["--mem-fraction-static"][0])


def test_expert_parallelism_renders_ep_size_and_passes_the_block_check_tp_alone_fails() -> None:
    """parallelism.ep renders --ep-size (ep 1 renders none). Qwen3-235B-A22B-FP8 at TP 8: SGLang refuses the block-FP8
    expert width 1536 / 8 = 192 (not a multiple of 128) unless EP spreads whole experts (--ep-size 8: 1536 / 1);
    rule model.sglang-shapes judges the layout with its EP. A dense model with EP is a spec error."""
    qwen = {
        "cluster__gpu": {"product": "NVIDIA-H100-80GB-HBM3", "memory_gb": 80},
        "model__name": "qwen3-235b-a22b-fp8",
        "model__hf_config": "models/qwen3-235b-a22b-fp8/config.json",
        "model__architecture": {},
        "model__precision": "fp8",
        "model__quantization": "fp8",
        "parallelism__tp": 8,
        "parallelism__pp": 1,
        "serving__replicas_per_node": 1,
    }

    def shapes(spec: FleetSpec) -> list[Any]:
        return [r for r in rules.check(fleet_of(spec)) if r.check == "model.sglang-shapes"]

    ep8 = spec_from("prod", **qwen, parallelism__ep=8)
    flags = flag_values(server_argv(fleet_of(ep8), first(ep8)), SERVER_ENTRY)
    assert flags["--ep-size"] == ("8",) and flags["--tp-size"] == ("8",)
    assert not shapes(ep8)
    tp8 = spec_from("prod", **qwen)
    assert "--ep-size" not in flag_values(server_argv(fleet_of(tp8), first(tp8)), SERVER_ENTRY)
    [refused] = shapes(tp8)
    assert "1536 / (TP 8 / EP 1) = 192" in refused.observed and "--ep-size 2 passes" in refused.observed
    with pytest.raises(SpecError, match=r"parallelism.ep = 2 on llama-3-70b, which has no experts"):
        spec_from("prod", parallelism__tp=2, parallelism__ep=2, serving__replicas_per_node=4, serving__replicas=1024)
    with pytest.raises(SpecError, match=r"parallelism.ep = 3 does not divide parallelism.tp = 8"):
        spec_from("prod", **qwen, parallelism__ep=3)


def test_speculative_decoding_renders_the_draft_flags() -> None:
    """model.speculative renders SGLang's --speculative-* flags: NEXTN reads its draft from the target's checkpoint
    (no draft path); the draft tokens are num_steps + 1 at eagle_topk 1, as SGLang resets them."""
    mtp = deepseek_h200_spec(1, model__speculative={"algorithm": "NEXTN", "num_steps": 2})
    flags = flag_values(server_argv(fleet_of(mtp), first(mtp)), SERVER_ENTRY)
    assert flags["--speculative-algorithm"] == ("NEXTN",) and flags["--speculative-num-steps"] == ("2",)
    assert flags["--speculative-eagle-topk"] == ("1",) and flags["--speculative-num-draft-tokens"] == ("3",)
    assert "--speculative-draft-model-path" not in flags
    plain = deepseek_h200_spec(1)
    assert not [f for f in flag_values(server_argv(fleet_of(plain), first(plain)), SERVER_ENTRY) if "specul" in f]


def test_a_replica_spanning_nodes_gets_nnodes_rank_and_rendezvous() -> None:
    spec = multi_node_spec()
    replica = first(spec)
    assert len(replica.nodes) == 2
    flags = [flag_values(server_argv(fleet_of(spec), replica, rank), SERVER_ENTRY) for rank in (0, 1)]
    assert [f["--node-rank"] for f in flags] == [("0",), ("1",)]
    assert {f["--nnodes"] for f in flags} == {("2",)}
    assert {f["--dist-init-addr"] for f in flags} == {(f"{replica.nodes[0].address}:{DIST_INIT_PORT}",)}
    assert [f["--host"] for f in flags] == [(str(n.address),) for n in replica.nodes]
    assert "ExecStartPost" in systemd_unit(fleet_of(spec), replica, 0)
    assert "ExecStartPost" not in systemd_unit(fleet_of(spec), replica, 1)  # rank 1 serves no HTTP
    with pytest.raises(RenderError, match=r"node_rank=2 is outside replica .* use 0\.\.1"):
        server_argv(fleet_of(spec), replica, 2)
    single = load_stack("prod").spec
    assert not {"--nnodes", "--node-rank", "--dist-init-addr"} & set(
        flag_values(server_argv(fleet_of(single), first(single)), SERVER_ENTRY)
    )


def test_a_model_that_leaves_no_kv_cache_is_refused_naming_the_fields() -> None:
    spec = spec_from("dev", model__precision="fp16", model__quantization=None)  # 141 GB on one 80 GB GPU
    with pytest.raises(
        RenderError,
        match=r"model\.precision=fp16 .*limits\.context_length=4,096.*raise "
        r"parallelism\.tp",
    ):
        server_argv(fleet_of(spec), first(spec))


# --- flags the pinned version does not know ------------------------------------------------------------


def test_a_flag_unknown_to_the_pinned_sglang_fails_naming_flag_and_version(monkeypatch: pytest.MonkeyPatch) -> None:
    version = load_server_manifest().version
    monkeypatch.setattr(
        "serving.render.sglang.SERVER_FLAGS",
        (*SERVER_FLAGS, FlagRule("--max-prefill-tokenz", "a typo", lambda c: "16384")),
    )
    spec = load_stack("dev").spec
    with pytest.raises(FlagValidationError) as err:
        server_argv(fleet_of(spec), first(spec))
    message = str(err.value)
    assert "'--max-prefill-tokenz'" in message and f"sglang {version}" in message
    assert "'--max-prefill-tokens'" in message  # the closest real flag
    with pytest.raises(FlagValidationError, match="--max-prefill-tokenz"):
        pod_container(fleet_of(spec), 0)


def test_a_flag_missing_from_another_version_fails_naming_that_version() -> None:
    """What a version bump that drops a flag looks like: the rendered argv against the other manifest."""
    pinned = load_server_manifest()
    older = pinned.model_copy(
        update={"version": "0.4.0", "flags": {k: v for k, v in pinned.flags.items() if k != "--watchdog-timeout"}}
    )
    spec = load_stack("prod").spec
    argv = server_argv(fleet_of(spec), first(spec))
    check_server_argv(argv, pinned)
    with pytest.raises(FlagValidationError) as err:
        check_server_argv(argv, older)
    assert "'--watchdog-timeout'" in str(err.value) and "sglang 0.4.0" in str(err.value)


def test_an_abbreviated_router_flag_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        "serving.render.router.ROUTER_FLAGS",
        (*ROUTER_FLAGS, FlagRule("--request-timeout", "abbreviated", lambda c: "60")),
    )
    with pytest.raises(FlagValidationError) as err:
        router_args(fleet_of(load_stack("dev").spec)).to_argv()
    message = str(err.value)
    assert "'--request-timeout'" in message and "'--request-timeout-secs'" in message
    assert load_router_manifest().label in message


def test_cli_exits_1_naming_the_flag_when_the_pin_rejects_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        "serving.render.sglang.SERVER_FLAGS", (*SERVER_FLAGS, FlagRule("--enable-metric", "a typo", lambda c: True))
    )
    register(None)
    # In process (typer's runner), not tests.support.cli: the monkeypatched flag table must be the one that renders.
    result = CliRunner().invoke(app, ["units", "--stack", "dev", "--replica", "dev-r00-n00-s0", "--json"])
    assert result.exit_code == 1
    assert "'--enable-metric'" in result.output and load_server_manifest().label in result.output
    assert "Traceback" not in result.output


# --- the real parsers ------------------------------------------------------------------------------------


def test_the_real_router_parser_reads_the_rendered_flags_back() -> None:
    spec = load_stack("dev").spec
    static = parse_router_args(router_args(fleet_of(spec)).to_argv()[len(ROUTER_ENTRY) :])
    static._validate_router_args()
    assert static.worker_urls == [r.url for r in fleet_replicas(spec)]
    assert (static.policy, static.health_check_interval_secs, static.health_check_timeout_secs) == (
        "power_of_two",
        5,
        3,
    )
    assert (static.health_failure_threshold, static.health_success_threshold) == (3, 2)
    assert (static.retry_max_retries, static.cb_failure_threshold, static.cb_timeout_duration_secs) == (5, 3, 10)
    assert static.retry_max_retries > static.cb_failure_threshold  # one dead replica cannot use up a request's attempts
    assert (static.prometheus_port, static.log_level) == (ROUTER_METRICS_PORT, "warn")
    k8s = parse_router_args(router_args(fleet_of(multi_node_spec()), kubernetes=True).to_argv()[len(ROUTER_ENTRY) :])
    k8s._validate_router_args()
    assert k8s.service_discovery and k8s.worker_urls == []
    # the serving pods' labels, the LWS leader's index, and the updater's admission (rollout membership)
    assert k8s.selector == {
        **SERVER_POD_LABELS,
        "leaderworkerset.sigs.k8s.io/worker-index": "0",
        "exaserve.io/admitted": "true",
    }
    assert (k8s.service_discovery_namespace, k8s.service_discovery_port) == ("exaserve", 30000)


@pytest.mark.slow
def test_the_real_sglang_parser_accepts_every_rendered_server_command(regenerated: Path) -> None:
    """`regenerated` builds the SGLang venv, which holds the pinned SGLang's real parser."""
    multi = multi_node_spec()
    argvs = []
    for stack in ("dev", "prod", "sandbox"):
        spec = load_stack(stack).spec
        argvs += [
            server_argv(fleet_of(spec), first(spec)),
            pod_args_with_lws_values(pod_container(fleet_of(spec), 0)),
        ]
    dp = deepseek_h200_spec(8)  # --attn-dp-size
    mtp = deepseek_h200_spec(8, model__speculative={"algorithm": "NEXTN", "num_steps": 2})  # --speculative-*
    argvs += [
        server_argv(fleet_of(multi), first(multi), 1),
        pod_args_with_lws_values(pod_container(fleet_of(multi), 0)),
        server_argv(fleet_of(dp), first(dp)),
        server_argv(fleet_of(mtp), first(mtp)),
    ]
    results = real_parse("server", [a[len(SERVER_ENTRY) :] for a in argvs])
    assert [r["error"] for r in results] == [""] * len(argvs)
    assert all(r["ok"] for r in results)


# --- systemd-analyze verify, strict ----------------------------------------------------------------------


@pytest.mark.parametrize("case", ["dev", "prod", "multi-rank0", "multi-rank1"])
def test_systemd_analyze_verify_accepts_the_units_without_a_warning(systemd_root: Path, case: str) -> None:
    spec = multi_node_spec() if case.startswith("multi") else load_stack(case).spec
    rank = 1 if case == "multi-rank1" else 0
    replica = first(spec)
    proc = verify_unit(systemd_root, unit_name(replica, rank), systemd_unit(fleet_of(spec), replica, rank))
    assert (proc.returncode, proc.stderr, proc.stdout) == (0, "", "")


def test_strict_verify_catches_what_systemd_only_warns_about(systemd_root: Path) -> None:
    """systemd-analyze exits 0 on an unknown directive; treating stderr as failure is what makes it strict."""
    spec = load_stack("dev").spec
    bad = systemd_unit(fleet_of(spec), first(spec)).replace("RestartSec=", "RestartSecs=")
    proc = verify_unit(systemd_root, "exaserve-sglang@typo.service", bad)
    assert proc.returncode == 0 and "Unknown key 'RestartSecs'" in proc.stderr
    missing = systemd_unit(fleet_of(spec), first(spec)).replace(SERVER_ENTRY[0], "/opt/nowhere/sglang")
    proc = verify_unit(systemd_root, "exaserve-sglang@nobinary.service", missing)
    assert proc.returncode != 0 and "/opt/nowhere/sglang" in proc.stderr


def test_the_unit_carries_the_spec_budgets() -> None:
    spec = spec_from("dev", serving__startup_budget_s=450, rollout__drain_timeout_s=90)
    unit = systemd_unit(fleet_of(spec), first(spec))
    assert "\nTimeoutStartSec=450\n" in unit and "\nTimeoutStopSec=90\n" in unit
    assert "\nRestart=on-failure\n" in unit and "\nEnvironment=CUDA_VISIBLE_DEVICES=0\n" in unit
    assert "--retry-max-time 450 " in unit and "--max-time 3 http://10.41.0.11:30000/health" in unit
    assert f"\nStartLimitIntervalSec={START_LIMIT_BURST * (450 + RESTART_SEC)}\n" in unit
    # ordered after a synchronised clock (time-sync.target, held by chrony-wait.service), as the runtime's units are:
    # chrony.service is reached once chronyd started, before it has synchronised anything; not pulled in (systemd.special)
    [after] = [line.split("=", 1)[1].split() for line in unit.splitlines() if line.startswith("After=")]
    assert "time-sync.target" in after and "chrony.service" not in after, after
    assert "time-sync.target" not in "".join(
        line for line in unit.splitlines() if line.startswith(("Wants=", "Requires="))
    )


@pytest.mark.parametrize(
    ("word", "quoted"),
    [
        ("--port", "--port"),
        ("30000", "30000"),
        ("a b", '"a b"'),
        ("50%", '"50%%"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("$(HOME)", '"$$(HOME)"'),
        ("", '""'),
    ],
)
def test_systemd_words_are_quoted_for_exec_lines(word: str, quoted: str) -> None:
    assert systemd_word(word, exec_line=True) == quoted


def test_systemd_words_refuse_control_characters() -> None:
    with pytest.raises(RenderError, match="control character"):
        systemd_word("a\nb", exec_line=True)


# --- chrony's own parser ----------------------------------------------------------------------------------

CHRONYD = shutil.which("chronyd", path="/usr/sbin:/usr/bin:/sbin:/bin") or "/usr/sbin/chronyd"


def chrony_parse(path: Path) -> subprocess.CompletedProcess[str]:
    """``chronyd -p``: parse the file with chrony's own parser, print it and exit (no daemon, no network)."""
    return subprocess.run([CHRONYD, "-p", "-f", str(path)], capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.parametrize("stack", ["dev", "prod", "sandbox"])
def test_chronyd_parses_the_rendered_chrony_conf(stack: str, tmp_path: Path) -> None:
    spec = load_stack(stack).spec
    conf = tmp_path / "chrony.conf"
    conf.write_text(chrony_conf(spec))
    proc = chrony_parse(conf)
    assert (proc.returncode, proc.stderr) == (0, "")
    directives = [ln for ln in conf.read_text().splitlines() if ln and not ln.startswith("#")]
    assert proc.stdout.splitlines() == directives
    assert [d.split()[1] for d in directives if d.startswith("server ")] == spec.cluster.ntp.servers
    limit = f"{spec.cluster.ntp.max_offset_ms / 1000:g}"
    assert f"makestep {limit} 3" in directives and f"maxdistance {limit}" in directives


def test_chronyd_rejects_a_broken_conf(tmp_path: Path) -> None:
    conf = tmp_path / "chrony.conf"
    conf.write_text(chrony_conf(load_stack("prod").spec).replace("makestep 0.1 3", "makestep 0.1"))
    proc = chrony_parse(conf)
    assert proc.returncode != 0 and "makestep" in proc.stderr


# --- the Kubernetes container ------------------------------------------------------------------------------


@pytest.mark.parametrize("stack", ["dev", "prod", "multi"])
def test_pod_with_the_container_passes_strict_kubernetes_schema(stack: str) -> None:
    spec = multi_node_spec() if stack == "multi" else load_stack(stack).spec
    for leader in (True, False):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "sglang-0"},
            "spec": {
                "containers": [pod_container(fleet_of(spec), 0, leader=leader)],
                "volumes": pod_volumes(fleet_of(spec)),
            },
        }
        kubernetes_validate.validate(pod, spec.kubernetes.version, strict=True)


def test_pod_container_runs_the_same_command_least_privileged() -> None:
    spec = load_stack("prod").spec
    c = pod_container(fleet_of(spec), 2)
    bare = flag_values(server_argv(fleet_of(spec), first(spec)), SERVER_ENTRY)
    pod = flag_values([*c["command"], *c["args"]], SERVER_ENTRY)
    assert changed(bare, pod) == {"--host"} and pod["--host"] == ("0.0.0.0",)
    env = {e["name"]: e for e in c["env"]}
    bare_env = server_env(fleet_of(spec), first(spec))
    assert set(bare_env) - set(env) == {"CUDA_VISIBLE_DEVICES"}  # the device plugin sets it in pods
    assert env["EXASERVE_REPLICA"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert all(
        env[k]["value"] == v for k, v in bare_env.items() if k not in ("CUDA_VISIBLE_DEVICES", "EXASERVE_REPLICA")
    )
    sc = c["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False and sc["runAsNonRoot"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}, "a one-GPU replica uses no fabric (issue 10, finding 7)"
    limits = c["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1" and spec.kubernetes.rdma_resource not in limits
    assert c["resources"]["requests"] == limits
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/dev/shm"]["name"] == VOLUME_SHM
    assert mounts[spec.storage.local_cache.path]["readOnly"] is True
    ethernet = pod_container(fleet_of(load_stack("dev").spec), 0)
    assert ethernet["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert not any(k.startswith("rdma/") for k in ethernet["resources"]["limits"])


def test_pod_memory_limit_covers_shm_weights_and_overhead() -> None:
    spec = load_stack("prod").spec
    limit = pod_memory_bytes(fleet_of(spec))
    from serving.plan.planner import memory_plan

    floor = spec.serving.shm_gb_per_gpu * 1e9 + memory_plan(spec).per_gpu["weights"].value + 5e9
    assert floor <= limit < floor + 2**30
    assert pod_container(fleet_of(spec), 0)["resources"]["limits"]["memory"] == f"{limit // 2**30}Gi"


def test_multi_node_pods_take_rank_and_rendezvous_from_leaderworkerset() -> None:
    spec = multi_node_spec()
    leader, worker = pod_container(fleet_of(spec), 0), pod_container(fleet_of(spec), 0, leader=False)
    flags = flag_values([*leader["command"], *leader["args"]], SERVER_ENTRY)
    assert flags["--node-rank"] == ("$(LWS_WORKER_INDEX)",) and flags["--nnodes"] == ("2",)
    assert flags["--dist-init-addr"] == (f"$(LWS_LEADER_ADDRESS):{DIST_INIT_PORT}",)
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert "readinessProbe" in leader and not {"startupProbe", "readinessProbe", "livenessProbe"} & set(worker)
    with pytest.raises(RenderError, match=r"update group 5 does not exist; rollout\.batches=5"):
        pod_container(fleet_of(spec), 5)


def test_group_version_reaches_the_pod() -> None:
    v2 = "lmsysorg/sglang:v0.5.24-cu126"
    spec = spec_from(
        "prod", rollout__group_versions={1: "v2"}, serving__releases={"v1": "lmsysorg/sglang:v0.5.23-cu126", "v2": v2}
    )
    pods = {g: pod_container(fleet_of(spec), g) for g in range(spec.rollout.batches)}
    release = {g: next(e["value"] for e in c["env"] if e["name"] == "EXASERVE_RELEASE") for g, c in pods.items()}
    assert release == {0: "v1", 1: "v2", 2: "v1", 3: "v1", 4: "v1"}
    pulled = image(spec, v2)  # through prod's mirror
    assert pulled.endswith(f"/{v2}")
    assert [c["image"] for c in pods.values()].count(pulled) == 1 and pods[1]["image"] == pulled


# --- router -------------------------------------------------------------------------------------------------


def test_weighted_round_robin_maps_to_the_load_aware_policy() -> None:
    assert router_policy(load_stack("prod").spec) == "power_of_two"
    for strategy in ("round_robin", "cache_aware", "power_of_two", "random"):
        assert router_policy(spec_from("prod", scheduler__strategy=strategy)) == strategy


def test_sandbox_router_listens_on_loopback_at_the_sandbox_ports() -> None:
    spec = load_stack("sandbox").spec
    assert spec.sandbox is not None
    flags = flag_values(router_args(fleet_of(spec), worker_urls=["http://127.0.0.1:20100"]).to_argv(), ROUTER_ENTRY)
    assert (flags["--host"], flags["--port"]) == (("127.0.0.1",), (str(spec.sandbox.router_port),))
    assert flags["--prometheus-host"] == ("127.0.0.1",)
    assert flags["--prometheus-port"] == (str(spec.sandbox.prometheus_port),)
    assert flags["--worker-urls"] == ("http://127.0.0.1:20100",)


# --- CLI --------------------------------------------------------------------------------------------------

EXASERVE = Path(sys.executable).parent / "exaserve"


def test_cli_prints_one_replica_as_json() -> None:
    r = exaserve("units", "--stack", "dev", "--replica", "dev-r01-n07-s7", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc) == {"stack", "ok", "replica", "argv", "env", "systemd_unit"}
    spec = load_stack("dev").spec
    replica = fleet_replicas(spec)[-1]
    assert doc == {
        "stack": "dev",
        "ok": True,
        "replica": replica.id,
        "argv": server_argv(fleet_of(spec), replica),
        "env": server_env(fleet_of(spec), replica),
        "systemd_unit": systemd_unit(fleet_of(spec), replica),
    }
    assert doc["env"]["CUDA_VISIBLE_DEVICES"] == "7"


def test_cli_prints_the_router_as_json() -> None:
    r = exaserve("units", "--stack", "prod", "--router", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc) == {"stack", "ok", "argv", "env"}
    assert doc["argv"] == router_args(fleet_of(load_stack("prod").spec)).to_argv()
    assert len(flag_values(doc["argv"], ROUTER_ENTRY)["--worker-urls"]) == 2048
    k8s = json.loads(exaserve("units", "--stack", "prod", "--router", "--kubernetes", "--json").stdout)
    assert "--service-discovery" in k8s["argv"] and "--worker-urls" not in k8s["argv"]


def test_cli_text_output_shows_unit_command_and_environment() -> None:
    r = exaserve("units", "--stack", "dev", "--replica", "dev-r00-n00-s0")
    assert r.returncode == 0, r.stderr
    assert "# systemd unit exaserve-sglang@dev-r00-n00-s0.service" in r.stdout
    assert "# command\n/usr/local/bin/sglang serve --model-path " in r.stdout
    assert "\nNCCL_IB_DISABLE=1\n" in r.stdout


def test_cli_unknown_replica_exits_2_naming_close_ids() -> None:
    r = exaserve("units", "--stack", "dev", "--replica", "dev-r00-n00-s9", "--json")
    assert r.returncode == 2
    assert "'dev-r00-n00-s9'" in r.stderr and "dev-r00-n00-s7" in r.stderr and "Traceback" not in r.stderr
    doc = json.loads(r.stdout)  # --json: the error as the JSON envelope too
    assert doc["ok"] is False and doc["stack"] == "dev" and "dev-r00-n00-s7" in doc["error"]


@pytest.mark.parametrize(
    "args", [[], ["--router", "--replica", "dev-r00-n00-s0"], ["--replica", "dev-r00-n00-s0", "--kubernetes"]]
)
def test_cli_needs_exactly_one_target(args: list[str]) -> None:
    r = exaserve("units", "--stack", "dev", *args)
    assert r.returncode == 2 and "error:" in r.stderr and "Traceback" not in r.stderr


def test_cli_infeasible_memory_exits_2_naming_the_fields(tmp_path: Path) -> None:
    text = (REPO / "Pulumi.dev.yaml").read_text()
    text = text.replace("precision: int4\n    quantization: awq\n", "precision: fp16\n")
    stack = tmp_path / "Pulumi.fp16.yaml"
    stack.write_text(text)
    (tmp_path / "models").symlink_to(REPO / "models")
    r = exaserve("units", "--stack-file", str(stack), "--replica", "dev-r00-n00-s0")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "model.precision=fp16" in r.stderr and "limits.context_length" in r.stderr


# --- docs --------------------------------------------------------------------------------------------------


def test_docs_list_every_flag_and_variable() -> None:
    doc = (REPO / "docs" / "units.md").read_text()
    names = [r.flag for r in (*SERVER_FLAGS, *ROUTER_FLAGS)] + [r.name for r in SERVER_ENV]
    missing = [n for n in names if f"`{n}`" not in doc]
    assert not missing, f"docs/units.md does not mention {missing}"


def test_docs_say_which_server_flags_prod_does_not_render() -> None:
    """Issue 28, item 7: docs/units.md listed `--max-total-tokens` as rendered; prod (SGLang's arithmetic) does not
    render it. Every server flag the prod replica's command line leaves out is one the docs call conditional
    ("only …"), and every flag the docs call unconditional is on that line."""
    spec = load_stack("prod").spec
    rendered = set(flag_values(server_argv(fleet_of(spec), first(spec)), SERVER_ENTRY))
    rows = {
        m.group(1): m.group(2)
        for line in (REPO / "docs" / "units.md").read_text().splitlines()
        if (m := re.match(r"^\| `(--[a-z0-9-]+)`(?:, `--[a-z0-9-]+`)* \| (.*) \|$", line))
    }
    flags = {r.flag for r in SERVER_FLAGS}
    missing = sorted(f for f in flags if f not in rendered and "only" not in rows.get(f, "only"))
    assert missing == [], f"docs/units.md lists {missing} as rendered; prod's command line has none of them"
    assert "--max-total-tokens" in flags - rendered and "only" in rows["--max-total-tokens"]


def test_a_quantised_checkpoint_renders_the_kernel_sglang_runs_it_with_on_cuda(tmp_path: Path) -> None:
    """An AWQ checkpoint renders --quantization awq_marlin (awq forces the slow kernel) and a GPTQ one gptq_marlin:
    SGLang 0.5.23 registers "gptq" for NPU, CPU and XPU only, and on CUDA refuses it as an unknown method; both
    are choices SGLang's own parser accepts. A compressed-tensors checkpoint under w8a8_int8 (which SGLang accepts
    over it, configs/model_config.py:2052) is not refused by the spec's method check."""
    base = json.loads((REPO / "models/llama-3-70b/config.json").read_text())
    argvs = []
    for method, kernel in (("awq", "awq_marlin"), ("gptq", "gptq_marlin")):
        path = tmp_path / f"{method}.json"
        path.write_text(json.dumps({**base, "quantization_config": {"quant_method": method, "bits": 4}}))
        spec = spec_from("prod", model__hf_config=str(path), model__architecture={}, model__quantization=method)
        argvs.append(server_argv(fleet_of(spec), first(spec)))
        assert flag_values(argvs[-1], SERVER_ENTRY)["--quantization"] == (kernel,)
    results = real_parse("server", [a[len(SERVER_ENTRY) :] for a in argvs])
    assert [r["error"] for r in results] == ["", ""] and all(r["ok"] for r in results), results
    ct = tmp_path / "ct.json"
    ct.write_text(json.dumps({**base, "quantization_config": {"quant_method": "compressed-tensors"}}))
    spec = spec_from(
        "prod",
        model__hf_config=str(ct),
        model__architecture={},
        model__precision="int8",
        model__quantization="w8a8_int8",
    )
    assert spec.model.quantization == "w8a8_int8"


def test_the_pod_monitor_scrapes_only_pods_that_serve_http() -> None:
    """Issue 40: on a multi-node stack the PodMonitor selected every pod of a LeaderWorkerSet group, and the worker
    pods serve no HTTP (only the leader runs the server's HTTP port): half the targets were down. It now selects the
    leaders (worker-index 0) there, and every serving pod where a replica is one pod."""

    def selector(spec: FleetSpec) -> dict[str, str]:
        (pods,) = [o for o in monitoring.render(fleet_of(spec)) if o["kind"] == "PodMonitor"]
        return dict(pods["spec"]["selector"]["matchLabels"])

    assert selector(multi_node_spec()) == {
        "app.kubernetes.io/name": "sglang",
        "leaderworkerset.sigs.k8s.io/worker-index": "0",
    }
    assert selector(load_stack("prod").spec) == {"app.kubernetes.io/name": "sglang"}
