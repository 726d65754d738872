"""The one stack builder of the tests: stack documents from the repository's real stack files, with
dotted-path changes or deep merges, written back as Pulumi stack files (no 50-field objects by hand)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from serving.plan import audit
from serving.plan.loader import load_fleet
from serving.plan.model import Fleet, MemoryModel
from serving.spec.schema import FleetSpec
from serving.spec.stack import absolute_model_paths, parse_spec, spec_document
from tests.support.paths import REPO

# The source document's config: package data (a plain file in a checkout or an installed wheel).
SOURCE_PLAN = Path(str(audit.SOURCE_PLAN))
# A replica of TP 16 spans two 8-GPU nodes: the LeaderWorkerSet path of the fleet.
MULTI_NODE: dict[str, Any] = {
    "parallelism": {"tp": 16, "pp": 1, "dp": 1},
    "serving.replicas": 128,
    "serving.replicas_per_node": None,
}


def request_timeout_of(timeout_s: int) -> dict[str, float]:
    """The sandbox-stack change that makes the routers' ``--request-timeout-secs`` ``timeout_s``: ⌈4,096 tokens ÷ the
    rate + the 2 s P99 target⌉ (serving.plan.planner.request_timeout). A simulated worker answers any generation within
    its latency_ms, so the sandbox's decode rate is its own to choose; the tests that shorten the heartbeat keep their
    timeout at their detection window (failure threshold × heartbeat), what it was before it was sized to the
    longest generation, and their hung workers' requests retried before a client's 10 s timeout."""
    return {"limits.min_decode_tokens_per_s": 4096 / (timeout_s - 2.01)}


def stack_doc(name: str) -> dict[str, Any]:
    """The ``exaserve:`` document of a repository stack (``prod``, ``dev``, ``sandbox``) or YAML file, as plain
    data; a relative ``model.hf_config`` or ``model.checkpoint`` is made absolute so the document can be written anywhere."""
    path = REPO / f"Pulumi.{name}.yaml" if not name.endswith(".yaml") else REPO / name
    raw = yaml.safe_load(path.read_text())
    doc = spec_document(raw["config"], str(path))
    if doc.get("model"):
        doc["model"] = absolute_model_paths(doc["model"], REPO)
    return doc


def with_changes(doc: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """Copy ``doc`` with dotted-path changes applied, e.g. ``{"serving.replicas_per_node": 12}``.

    A path segment that is an integer indexes a list (``cluster.pools.0.count``).
    """
    out = copy.deepcopy(dict(doc))
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        cur: Any = out
        for part in parents:
            cur = cur[int(part)] if isinstance(cur, list) else cur.setdefault(part, {})
        if isinstance(cur, list):
            cur[int(last)] = value
        else:
            cur[last] = value
    return out


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge: mappings merge key by key, anything else in ``over`` replaces."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merge(out[key], value) if isinstance(value, Mapping) and isinstance(out.get(key), dict) else value
    return out


def spec_from(name: str, **changes: Any) -> FleetSpec:
    """Parse a stack with changes given as keyword arguments using ``__`` for dots."""
    doc = with_changes(stack_doc(name), {k.replace("__", "."): v for k, v in changes.items()})
    return parse_spec(doc, f"{name}+changes", REPO)


def deepseek_h200_spec(attn_dp: int, **changes: Any) -> FleetSpec:
    """DeepSeek-V3 (``models/deepseek-v3``, block FP8) at TP 8 on one 8 × H200 node of the prod stack, with
    ``attn_dp`` attention-DP groups and the decode graphs at SGLang's H200 default (max bs 512: 1,024 running
    requests do not cap it)."""
    base: dict[str, Any] = {
        "cluster__gpu": {"product": "NVIDIA-H200", "memory_gb": 141},
        "model__name": "deepseek-v3",
        "model__hf_config": "models/deepseek-v3/config.json",
        "model__architecture": {},
        "model__precision": "fp8",
        "model__quantization": "fp8",
        "parallelism__tp": 8,
        "parallelism__pp": 1,
        "parallelism__attn_dp": attn_dp,
        "serving__replicas_per_node": 1,
        "limits__max_running_requests": 1024,
    }
    return spec_from("prod", **{**base, **changes})


def fleet_of(spec: FleetSpec, name: str = "test", memory_model: MemoryModel = "sglang") -> Fleet:
    """``spec`` as stack ``name``'s fleet, planned by the stack loader as every command does."""
    return load_fleet(name, spec, memory_model)


def write_stack(path: Path, doc: Mapping[str, Any]) -> Path:
    """``doc`` as a Pulumi stack file (one ``exaserve:<section>`` key per section)."""
    path.write_text(yaml.safe_dump({"config": {f"exaserve:{k}": v for k, v in doc.items()}}, sort_keys=False))
    return path


def write_variant(directory: Path, name: str, base: str = "prod", changes: Mapping[str, Any] | None = None) -> Path:
    """``Pulumi.<name>.yaml`` in ``directory``: stack ``base`` with dotted-path ``changes``."""
    return write_stack(directory / f"Pulumi.{name}.yaml", with_changes(stack_doc(base), changes or {}))


def sandbox_stack_file(
    directory: Path, *, ports_base: int, replicas: int | None = None, changes: Mapping[str, Any] | None = None
) -> Path:
    """``directory/Pulumi.sandbox.yaml``: the repository's sandbox stack on the port block at ``ports_base``
    (workers from ``ports_base``, then the router and its metrics port), with ``replicas`` and dotted ``changes``.

    The runtime layer and the Prometheus server (on in the shipped stack) are off unless ``changes`` turns them on:
    their ports lie outside the block, and a test of the updater or the workers must not share the fleet with a
    controller it did not ask for."""
    doc = stack_doc("sandbox")
    if replicas is not None:
        doc = with_changes(doc, {"serving.replicas": replicas})
    count = int(doc["serving"]["replicas"])
    doc = with_changes(
        doc,
        {
            "sandbox.worker_base_port": ports_base,
            "sandbox.router_port": ports_base + count,
            "sandbox.prometheus_port": ports_base + count + 1,
            "sandbox.runtime": False,
            "sandbox.prometheus": False,
            **(changes or {}),
        },
    )
    directory.mkdir(parents=True, exist_ok=True)
    return write_stack(directory / "Pulumi.sandbox.yaml", doc)
