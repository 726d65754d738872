"""The CrossGuard policy pack: every policy with a passing and a failing resource, through the pack's own
validate functions (no PolicyPack in this process: it would start its gRPC server and block); the pack itself
served by `python policies` in a subprocess and queried over gRPC like the Pulumi engine does; and the same
rules offline through `exaserve check`.

Passing resources are the rendered prod objects; failing ones are copies with one defect each. Properties are
passed as the engine hands them to an analyzer: numbers as floats.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import empty_pb2, struct_pb2
from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc
from pulumi_policy import (
    EnforcementLevel,
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    StackValidationArgs,
)

from serving.checks import policy
from serving.checks.policy.stack import images_by_digest, images_through_mirror, system_pool_placement
from serving.pulumi.program import RenderedObject, kubernetes_objects, run_program
from serving.render.k8s.common import ANNOTATION_ALLOW_LOAD_BALANCER, ANNOTATION_PRIVILEGED_REASON
from serving.rollout.backends.kubernetes import batch_lease_name
from serving.spec.stack import load_stack_file
from tests.support.cli import exaserve
from tests.support.k8s import policy_pack, render_file
from tests.support.paths import REPO
from tests.support.stacks import MULTI_NODE, fleet_of, stack_doc, write_stack, write_variant

Mutation = Callable[[dict[str, Any]], None]


def _floats(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return float(value)
    if isinstance(value, dict):
        return {k: _floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_floats(v) for v in value]
    return value


def _opts() -> PolicyResourceOptions:
    return PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])


@pytest.fixture(scope="module")
def prod() -> list[RenderedObject]:
    return kubernetes_objects(run_program("prod"))


def _find(objects: list[RenderedObject], kind: str, name: str) -> RenderedObject:
    return next(o for o in objects if o.kind == kind and o.name == name)


def _resource_policy(name: str) -> Any:
    return next(p for p in policy_pack().policies() if p.name == name)


def _validate(name: str, obj: RenderedObject, props: dict[str, Any] | None = None) -> list[str]:
    messages: list[str] = []
    args = ResourceValidationArgs(
        obj.resource_type, _floats(props if props is not None else obj.obj), f"urn:{obj.name}", obj.name, _opts(), None
    )
    _resource_policy(name).validate(args, lambda msg, urn=None: messages.append(msg))
    return messages


def _pod(props: dict[str, Any]) -> dict[str, Any]:
    """The pod template of a workload (a LeaderWorkerSet group of one runs its leader from workerTemplate)."""
    spec = props["spec"]
    template: dict[str, Any] = (
        spec["leaderWorkerTemplate"]["workerTemplate"] if "leaderWorkerTemplate" in spec else spec["template"]
    )
    return template


def _container(props: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = _pod(props)["spec"]["containers"][0]
    return container


def _image_latest(p: dict[str, Any]) -> None:
    _container(p)["image"] = "lmsysorg/sglang:latest"


def _no_gpu_limit(p: dict[str, Any]) -> None:
    del _container(p)["resources"]["limits"]["nvidia.com/gpu"]


def _short_timeout(p: dict[str, Any]) -> None:
    _container(p)["readinessProbe"]["timeoutSeconds"] = 1


def _no_liveness(p: dict[str, Any]) -> None:
    del _container(p)["livenessProbe"]


def _privileged(p: dict[str, Any]) -> None:
    _container(p)["securityContext"]["privileged"] = True


def _load_balancer(p: dict[str, Any]) -> None:
    p["spec"]["type"] = "LoadBalancer"


def _no_cache_wait(p: dict[str, Any]) -> None:
    del _pod(p)["spec"]["initContainers"]


def _awaited(p: dict[str, Any]) -> None:
    p["metadata"]["annotations"] = {"pulumi.com/timeoutSeconds": "600"}


def _clock_daemon(p: dict[str, Any]) -> None:
    _container(p)["securityContext"]["capabilities"]["add"] = ["SYS_TIME"]


def _statefulset_surge(p: dict[str, Any]) -> None:
    p["spec"]["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 4}}


def _ordered_ready(p: dict[str, Any]) -> None:
    del p["spec"]["podManagementPolicy"]


def _node_taints(p: dict[str, Any]) -> None:
    p["spec"] = {"taints": [{"key": "exaserve.io/reserved", "value": "serving", "effect": "NoSchedule"}]}


def _custom_taint(p: dict[str, Any]) -> None:
    _pod(p)["spec"]["tolerations"] = [{"key": "exaserve.io/reserved", "operator": "Exists", "effect": "NoSchedule"}]


def _fabric_on_one_gpu(p: dict[str, Any]) -> None:
    _container(p)["resources"]["limits"]["rdma/hca_shared_devices_a"] = "1"


def _ipc_lock_non_root(p: dict[str, Any]) -> None:
    _container(p)["securityContext"]["capabilities"]["add"] = ["IPC_LOCK"]


def _generating_liveness(p: dict[str, Any]) -> None:
    _container(p)["livenessProbe"]["httpGet"]["path"] = "/health"


def _unchecked_liveness(p: dict[str, Any]) -> None:
    _container(p)["livenessProbe"]["httpGet"]["path"] = "/v1/models"


def _burstable(p: dict[str, Any]) -> None:
    del _container(p)["resources"]["requests"]["cpu"]


def _burstable_init(p: dict[str, Any]) -> None:
    _pod(p)["spec"]["initContainers"][0]["resources"]["requests"] = {"cpu": "10m", "memory": "16Mi"}


def _commented_cache_wait(p: dict[str, Any]) -> None:
    _pod(p)["spec"]["initContainers"][0]["command"] = ["/bin/sh", "-c", "true # .exaserve-complete"]


def _cache_wait_script(p: dict[str, Any], edit: Callable[[str], str]) -> None:
    command = _pod(p)["spec"]["initContainers"][0]["command"]
    command[2] = edit(command[2])


def _cache_wait_breaks(p: dict[str, Any]) -> None:
    """Issue 40: the loop's shape, but its body leaves at once (the pod starts before the cache is complete)."""
    _cache_wait_script(p, lambda s: s.replace("sleep 10", "break"))


def _other_models_cache_wait(p: dict[str, Any]) -> None:
    """Issue 40: a well-formed wait, for a marker another model's warm-up writes."""
    _cache_wait_script(p, lambda s: s.replace("meta-llama/Meta-Llama-3-70B-Instruct-AWQ-INT4", "org/other-model"))


def _slow_awq(p: dict[str, Any]) -> None:
    args = _container(p)["args"]
    args[args.index("--quantization") + 1] = "awq"


def _hard_spread(p: dict[str, Any]) -> None:
    for c in _pod(p)["spec"]["topologySpreadConstraints"]:
        c["maxSkew"] = 1
        c.pop("nodeTaintsPolicy", None)


def _no_pre_stop(p: dict[str, Any]) -> None:
    del _container(p)["lifecycle"]


def _workers_through_service(p: dict[str, Any]) -> None:
    p["metadata"]["name"] = "sglang-workers"
    p["spec"]["selector"]["matchLabels"] = {"app.kubernetes.io/name": "sglang"}
    p["spec"]["endpoints"][0]["port"] = "http"


def _default_grace(p: dict[str, Any]) -> None:
    del _pod(p)["spec"]["terminationGracePeriodSeconds"]


def _grace_without_pre_stop(p: dict[str, Any]) -> None:
    """A grace period that covers the router's drain (120 s) but not the preStop before it as well."""
    _pod(p)["spec"]["terminationGracePeriodSeconds"] = 125


def _short_pre_stop(p: dict[str, Any]) -> None:
    _container(p)["lifecycle"] = {"preStop": {"exec": {"command": ["/bin/sleep", "1"]}}}


def _offset_after_parens(p: dict[str, Any]) -> None:
    rule = p["spec"]["groups"][0]["rules"][0]
    rule["expr"] = "sum(rate(x[5m])) < 0.8 * (sum(rate(x[5m])) offset 25m)"


RESOURCE_CASES: list[tuple[str, str, str, Mutation, str]] = [
    ("images-pinned", "StatefulSet", "sglang-g0", _image_latest, "'lmsysorg/sglang:latest': not pinned"),
    ("images-pinned", "Deployment", "sglang-router", lambda p: _container(p).update(image="r/x"), "not pinned"),
    # issue 25: anything after '@' passed as a digest
    ("images-pinned", "Deployment", "sglang-router", lambda p: _container(p).update(image="r/x@latest"), "not pinned"),
    ("serving-resource-limits", "StatefulSet", "sglang-g1", _no_gpu_limit, "has no nvidia.com/gpu"),
    ("probes-timeout", "StatefulSet", "sglang-g2", _short_timeout, "readinessProbe is set with timeoutSeconds=1"),
    ("probes-timeout", "Deployment", "sglang-router", _no_liveness, "livenessProbe is missing"),
    ("no-privileged-containers", "StatefulSet", "sglang-g3", _privileged, "runs privileged"),
    ("no-unannotated-load-balancer", "Service", "sglang-router", _load_balancer, "spec.type is LoadBalancer"),
    # Issue 10: one case per finding, the defective shape each rule exists to refuse.
    ("serving-waits-for-node-cache", "StatefulSet", "sglang-g0", _no_cache_wait, "no init container waiting"),
    ("await-decided", "StatefulSet", "sglang-g1", _awaited, "pulumi.com/timeoutSeconds=600 on pods"),
    ("await-decided", "DaemonSet", "model-cache-warmer", lambda p: p["metadata"].pop("annotations"), "neither"),
    # Issue 25: the router's Service was awaited until a router turned Ready (after the fleet loads).
    ("await-decided", "Service", "sglang-router", lambda p: p["metadata"].pop("annotations"), "waits until one"),
    ("no-clock-daemons", "Deployment", "sglang-router", _clock_daemon, "adds SYS_TIME"),
    # Issue 25: a batch replaced at once with GA semantics only.
    ("rollout-ga-only", "StatefulSet", "sglang-g2", _statefulset_surge, "rollingUpdate.maxUnavailable=4"),
    ("rollout-ga-only", "StatefulSet", "sglang-g3", _ordered_ready, "podManagementPolicy=OrderedReady"),
    ("node-patch-labels-only", "Node", "gpu-r00-n00", _node_taints, "spec.taints is patched"),
    ("gpu-taint-convention", "StatefulSet", "sglang-g3", _custom_taint, "does not tolerate"),
    ("fabric-only-across-nodes", "StatefulSet", "sglang-g4", _fabric_on_one_gpu, "requests rdma/"),
    ("ipc-lock-runs-as-root", "StatefulSet", "sglang-g0", _ipc_lock_non_root, "runs as uid 1000"),
    ("liveness-is-cheap", "StatefulSet", "sglang-g1", _generating_liveness, "livenessProbe calls /health"),
    # Issue 25: an allow-list; an unchecked path passed the old deny-list.
    ("liveness-is-cheap", "StatefulSet", "sglang-g2", _unchecked_liveness, "not sglang's checked liveness endpoint"),
    ("liveness-is-cheap", "Deployment", "sglang-router", _unchecked_liveness, "not sglang-router's checked liveness"),
    ("serving-guaranteed-cpu", "StatefulSet", "sglang-g2", _burstable, "requests cpu=None"),
    # Issue 25: both passed before (the rule skipped init containers; any command naming the marker counted).
    ("serving-guaranteed-cpu", "StatefulSet", "sglang-g3", _burstable_init, "initContainers[wait-for-cache] requests"),
    ("serving-waits-for-node-cache", "StatefulSet", "sglang-g1", _commented_cache_wait, "no init container waiting"),
    ("serving-waits-for-node-cache", "StatefulSet", "sglang-g2", _cache_wait_breaks, "'break'"),
    ("serving-waits-for-node-cache", "StatefulSet", "sglang-g3", _other_models_cache_wait, "org/other-model"),
    ("no-slow-awq-kernel", "StatefulSet", "sglang-g3", _slow_awq, "passes --quantization awq"),
    # Issue 40: host namespaces passed every guard; the serving and warmer pods mounted a token they never use.
    ("pod-host-isolation", "StatefulSet", "sglang-g0", lambda p: _pod(p)["spec"].update(hostPID=True), "hostPID"),
    ("pod-host-isolation", "StatefulSet", "sglang-g1", lambda p: _pod(p)["spec"].update(hostIPC=True), "hostIPC"),
    (
        "pod-host-isolation",
        "Deployment",
        "sglang-router",
        lambda p: _pod(p)["spec"].update(hostNetwork=True),
        "hostNetwork",
    ),
    (
        "pod-host-isolation",
        "DaemonSet",
        "exaserve-agent",
        lambda p: _pod(p)["spec"].update(hostNetwork=True),
        "hostNetwork",
    ),
    (
        "pod-host-isolation",
        "StatefulSet",
        "sglang-g2",
        lambda p: _pod(p)["spec"].pop("automountServiceAccountToken"),
        "token",
    ),
    (
        "pod-host-isolation",
        "DaemonSet",
        "model-cache-warmer",
        lambda p: _pod(p)["spec"].update(automountServiceAccountToken=True),
        "mounts a service-account token",
    ),
    ("spread-satisfiable", "StatefulSet", "sglang-g4", _hard_spread, "maxSkew=1"),
    ("hardened-pods", "StatefulSet", "sglang-g0", _no_pre_stop, "no preStop hook"),
    # Issue 25: the router had the default 30 s against its 120 s drain.
    ("hardened-pods", "Deployment", "sglang-router", _default_grace, "terminationGracePeriodSeconds=30 < preStop 30 s"),
    # Issue 25: the router had no preStop; SIGTERM came while kube-proxy and DNS still sent it requests.
    ("hardened-pods", "Deployment", "sglang-router", _no_pre_stop, "no preStop hook"),
    ("hardened-pods", "Deployment", "sglang-router", _short_pre_stop, "preStop holds it 1 s < 30 s, the DNS TTL"),
    (
        "hardened-pods",
        "Deployment",
        "sglang-router",
        _grace_without_pre_stop,
        "terminationGracePeriodSeconds=125 < preStop 30 s + --shutdown-grace-period-secs 120",
    ),
    ("alert-offset-placement", "PrometheusRule", "exaserve-alerts", _offset_after_parens, "offset after"),
    # Issue 25, finding 4: the workers' monitor as it was (a ServiceMonitor on their 2,048-pod Service) is refused.
    ("workers-scraped-as-pods", "ServiceMonitor", "sglang-router", _workers_through_service, "at most 1,000"),
]


@pytest.mark.parametrize(("rule", "kind", "name", "mutate", "expected"), RESOURCE_CASES)
def test_resource_policy_passes_the_render_and_fails_the_defect(
    prod: list[RenderedObject], rule: str, kind: str, name: str, mutate: Mutation, expected: str
) -> None:
    obj = _find(prod, kind, name)
    assert _validate(rule, obj) == []
    bad = copy.deepcopy(obj.obj)
    mutate(bad)
    messages = _validate(rule, obj, bad)
    assert len(messages) == 1, messages
    assert expected in messages[0]
    assert (
        messages[0].startswith(f"{bad.get('kind', kind)} ")
        and "(expected " in messages[0]
        and "). Fix: " in messages[0]
    )


def test_every_policy_is_covered_and_mandatory() -> None:
    policies = policy_pack().policies()
    assert {p.name for p in policies} == {c[0] for c in RESOURCE_CASES} | {"replica-in-one-rack"} | set(
        policy.STACK_RULES
    )
    assert all(p.enforcement_level == EnforcementLevel.MANDATORY for p in policies)


def test_annotated_load_balancer_and_non_kubernetes_resources_pass(prod: list[RenderedObject]) -> None:
    service = _find(prod, "Service", "sglang-router")
    lb = copy.deepcopy(service.obj)
    _load_balancer(lb)
    lb["metadata"]["annotations"] = {ANNOTATION_ALLOW_LOAD_BALANCER: "public inference endpoint, WAF in front"}
    assert _validate("no-unannotated-load-balancer", service, lb) == []
    messages: list[str] = []
    args = ResourceValidationArgs("aws:s3/bucket:Bucket", {"spec": {"type": "LoadBalancer"}}, "u", "b", _opts(), None)
    _resource_policy("no-unannotated-load-balancer").validate(args, lambda m, u=None: messages.append(m))
    assert messages == []


@pytest.fixture(scope="module")
def multi_node(tmp_path_factory: pytest.TempPathFactory) -> list[RenderedObject]:
    """TP 16 on 8-GPU nodes: replicas span two nodes, so the fabric (RDMA plugin, IPC_LOCK) is rendered."""
    return render_file(write_variant(tmp_path_factory.mktemp("mn"), "tp16", changes=MULTI_NODE))


def test_privileged_is_refused_outside_the_named_daemonsets(multi_node: list[RenderedObject]) -> None:
    ds = _find(multi_node, "DaemonSet", "rdma-shared-device-plugin")
    assert _validate("no-privileged-containers", ds) == []
    renamed = copy.deepcopy(ds.obj)
    renamed["metadata"]["name"] = "debug-tools"
    messages = _validate("no-privileged-containers", ds, renamed)
    assert len(messages) == 1 and "reserved for the DaemonSets ['rdma-shared-device-plugin']" in messages[0]
    unexplained = copy.deepcopy(ds.obj)
    del unexplained["metadata"]["annotations"][ANNOTATION_PRIVILEGED_REASON]
    assert ANNOTATION_PRIVILEGED_REASON in _validate("no-privileged-containers", ds, unexplained)[0]


def test_a_leaderworkerset_with_max_unavailable_fails_rollout_ga_only(multi_node: list[RenderedObject]) -> None:
    """Issue 25, blocker 1 (this failed to fail before: the guard looked at StatefulSets only): the rendered
    multi-node group leaves LWS's rollout at its default, and the same group with maxUnavailable is refused."""
    lws = _find(multi_node, "LeaderWorkerSet", "sglang-g0")
    assert _validate("rollout-ga-only", lws) == []
    budget = copy.deepcopy(lws.obj)
    budget["spec"]["rolloutStrategy"] = {
        "type": "RollingUpdate",
        "rollingUpdateConfiguration": {"maxUnavailable": 41, "maxSurge": 0},
    }
    messages = _validate("rollout-ga-only", lws, budget)
    assert len(messages) == 1 and "rollingUpdateConfiguration.maxUnavailable=41" in messages[0], messages


def test_multi_node_replicas_stay_in_one_rack_and_lock_memory_as_root(multi_node: list[RenderedObject]) -> None:
    """Finding 8: the rendered multi-node group passes; without the rack affinity, or with IPC_LOCK for uid 1000,
    it fails; and the fabric rule lets a group that spans nodes use RDMA."""
    lws = _find(multi_node, "LeaderWorkerSet", "sglang-g0")
    for rule in ("replica-in-one-rack", "ipc-lock-runs-as-root", "fabric-only-across-nodes", "hardened-pods"):
        assert _validate(rule, lws) == [], rule
    split = copy.deepcopy(lws.obj)
    del split["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["affinity"]["podAffinity"]
    messages = _validate("replica-in-one-rack", lws, split)
    assert len(messages) == 1 and "workerTemplate has no required pod affinity" in messages[0]
    non_root = copy.deepcopy(lws.obj)
    non_root["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["securityContext"][
        "runAsUser"
    ] = 1000
    assert "runs as uid 1000" in _validate("ipc-lock-runs-as-root", lws, non_root)[0]


def _stack_args(objects: list[dict[str, Any]]) -> StackValidationArgs:
    resources = [
        PolicyResource(
            f"kubernetes:{o['apiVersion']}:{o['kind']}", _floats(o), f"urn:{o['kind']}:{o['metadata']['name']}",
            o["metadata"]["name"], _opts(), None, None, [], {},
        )
        for o in objects
    ]  # fmt: skip
    return StackValidationArgs(resources)


def _validate_stack(name: str, objects: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    reported: list[tuple[str, str | None]] = []
    _resource_policy(name).validate(_stack_args(objects), lambda msg, urn=None: reported.append((msg, urn)))
    return reported


def test_pdb_per_serving_group(prod: list[RenderedObject], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PULUMI_STACK", "prod")
    objects = [o.obj for o in prod]
    assert _validate_stack("pdb-per-serving-group", objects) == []
    without = [o for o in objects if not (o["kind"] == "PodDisruptionBudget" and o["metadata"]["name"] == "sglang-g4")]
    reported = _validate_stack("pdb-per-serving-group", without)
    assert len(reported) == 1
    message, urn = reported[0]
    assert (
        message.startswith("StatefulSet exaserve/sglang-g4: no PodDisruptionBudget")
        and urn == "urn:StatefulSet:sglang-g4"
    )
    # A budget selecting other pods does not count.
    moved = copy.deepcopy(objects)
    for o in moved:
        if o["kind"] == "PodDisruptionBudget" and o["metadata"]["name"] == "sglang-g1":
            o["spec"]["selector"]["matchLabels"]["exaserve.io/group"] = "7"
    reported = _validate_stack("pdb-per-serving-group", moved)
    assert [m.split(":")[0] for m, _ in reported] == ["StatefulSet exaserve/sglang-g1"]


def test_group_replicas_equal_the_spec(prod: list[RenderedObject], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PULUMI_STACK", "prod")
    objects = [o.obj for o in prod]
    assert _validate_stack("serving-group-replicas", objects) == []
    edited = copy.deepcopy(objects)
    for o in edited:
        if o["kind"] == "StatefulSet" and o["metadata"]["name"] == "sglang-g0":
            o["spec"]["replicas"] = 500
    reported = _validate_stack("serving-group-replicas", edited)
    assert [m for m, _ in reported] == [
        "StatefulSet exaserve/sglang-g0: spec.replicas is 500.0 (expected 410 replicas, update group 0's share of "
        "the spec's plan (2,048 in 5 groups)). Fix: Change serving.replicas or rollout.batches in the stack, never "
        "the object's replica count."
    ]
    missing = [o for o in objects if not (o["kind"] == "StatefulSet" and o["metadata"]["name"] == "sglang-g3")]
    assert any(
        "0 serving objects carry exaserve.io/group=3" in m
        for m, _ in _validate_stack("serving-group-replicas", missing)
    )


def test_monitoring_objects_carry_the_prometheus_selector_labels(
    prod: list[RenderedObject], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 13: kube-prometheus-stack selects its `release` label; an object without it is never loaded."""
    monkeypatch.setenv("PULUMI_STACK", "prod")
    objects = [o.obj for o in prod]
    assert _validate_stack("monitoring-selected", objects) == []
    unlabelled = copy.deepcopy(objects)
    for o in unlabelled:
        if o["kind"] == "PrometheusRule":
            del o["metadata"]["labels"]["release"]
    reported = _validate_stack("monitoring-selected", unlabelled)
    assert sorted(m.split(":")[0] for m, _ in reported) == [
        "PrometheusRule exaserve/exaserve-alerts",
        "PrometheusRule exaserve/exaserve-runtime-alerts",  # the runtime layer's alerts (controller, agents)
    ]
    assert all("lack {'release': 'kube-prometheus-stack'}" in m for m, _ in reported)


def test_a_stack_with_a_mirror_pulls_every_image_through_it(tmp_path: Path) -> None:
    """Finding 16: a registry mirror and a pull-secret name in the stack reach every pod; an image that bypasses
    them fails `images-through-mirror`."""
    path = write_variant(
        tmp_path,
        "mirrored",
        base="dev",
        changes={"kubernetes.image_registry": "mirror.internal:5000/proxy", "kubernetes.image_pull_secret": "pull"},
    )
    objects = [o.obj for o in render_file(path)]
    fleet = fleet_of(load_stack_file(path).spec)
    assert images_through_mirror([(f"kubernetes:x:{o['kind']}", o) for o in objects], fleet) == []
    router = next(o for o in objects if o["kind"] == "Deployment")
    _container(router)["image"] = "lightseekorg/smg:1.13.0"
    del router["spec"]["template"]["spec"]["imagePullSecrets"]
    found = images_through_mirror([(f"kubernetes:x:{o['kind']}", o) for o in objects], fleet)
    assert len(found) == 1 and "bypasses the mirror" in found[0].observed and "lacks 'pull'" in found[0].observed


def test_stack_policy_without_a_stack_name_reports_instead_of_passing(
    prod: list[RenderedObject], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PULUMI_STACK", raising=False)
    reported = _validate_stack("serving-group-replicas", [o.obj for o in prod])
    assert len(reported) == 1
    message, urn = reported[0]
    assert message.startswith("cannot check serving-group-replicas: PULUMI_STACK") and urn is None
    assert "Fix: Run the pack through `pulumi preview/up --policy-pack policies`" in message


# ------------------------------------------------------------------------------------------ exaserve check


@pytest.mark.parametrize("stack", ["dev", "sandbox"])
def test_check_passes_the_shipped_stacks(stack: str) -> None:
    result = exaserve("check", "--stack", stack, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(result.stdout)
    assert doc["ok"] is True and doc["violations"] == [] and doc["pending"] == []
    assert set(doc["rules"]) == set(policy.RESOURCE_RULES) | set(policy.STACK_RULES)


def test_prod_passes_but_for_the_digests_it_cannot_have_yet() -> None:
    """Issue 25, finding 7: prod is a production stack, so every image must come through its mirror and by digest.
    No digest can be resolved here, so `check` fails on exactly those, naming the field and the digest's source;
    --allow-tags (scripts/run.sh, pull requests) lists them as pending and passes; everything else passes."""
    strict = exaserve("check", "--stack", "prod", "--json")
    doc = json.loads(strict.stdout)
    assert strict.returncode == 1 and doc["ok"] is False
    assert {v["check"] for v in doc["violations"]} == {"images-by-digest"}
    # one per container: 5 groups × (sglang + wait-for-cache), the warmer's 2, the router, controller and agent
    assert len(doc["violations"]) == 15
    fixes = {v["fix"].split(" to ")[0] for v in doc["violations"]}
    assert fixes == {"Set serving.releases.v1", "Set runtime.image", "Set kubernetes.router_image"}
    assert all(
        v["observed"].split(" is '")[1].startswith("registry.exaserve.internal/mirror/") for v in doc["violations"]
    )
    allowed = exaserve("check", "--stack", "prod", "--allow-tags", "--json")
    doc = json.loads(allowed.stdout)
    assert allowed.returncode == 0 and doc["ok"] is True and doc["violations"] == []
    assert [p["check"] for p in doc["pending"]] == ["images-by-digest"] * 15
    assert all(p["status"] == "warn" for p in doc["pending"])


def test_a_production_stack_demands_a_mirror_and_digests(tmp_path: Path) -> None:
    """Issue 25, finding 7: before, prod set no mirror (images-through-mirror was a no-op) and images-pinned accepted
    tags. A production stack without a mirror fails images-through-mirror; with its images pinned by digest it
    passes images-by-digest, the same tags fail it; a stack not marked production is not held to either."""
    digest = "sha256:" + "ab" * 32
    pinned = {
        "serving.releases": {"v1": f"lmsysorg/sglang:v0.5.23-cu126@{digest}"},
        "runtime.image": f"exaserve/exaserve-deploy:0.1.0@{digest}",
        "kubernetes.router_image": f"lightseekorg/smg:1.13.0@{digest}",
    }

    def findings(name: str, changes: dict[str, Any], rule: Any) -> list[Any]:
        path = write_variant(tmp_path, name, base="prod", changes=changes)
        objects = [o.obj for o in render_file(path)]
        return list(rule([(f"kubernetes:x:{o['kind']}", o) for o in objects], fleet_of(load_stack_file(path).spec)))

    assert findings("pinned", pinned, images_by_digest) == []
    # Once the digests are set, prod passes the whole pack with no waiver: what `pulumi up` will then accept.
    strict = exaserve("check", "--stack-file", str(tmp_path / "Pulumi.pinned.yaml"))
    assert strict.returncode == 0 and "no violations" in strict.stdout, strict.stdout[-3000:]
    assert findings("pinned2", pinned, images_through_mirror) == []
    tags = findings("tags", {}, images_by_digest)
    assert len(tags) == 15 and all("a tag, in a production stack" in f.observed for f in tags)
    router = next(f for f in tags if f.subject == "Deployment exaserve/sglang-router")
    assert router.fix == (
        "Set kubernetes.router_image to 'lightseekorg/smg:1.13.0@sha256:<digest>', the digest the mirror serves: "
        "skopeo inspect --format '{{.Digest}}' docker://registry.exaserve.internal/mirror/lightseekorg/smg:1.13.0 "
        "(docs/infra.md, 'Production images')."
    )
    unmirrored = findings("unmirrored", {**pinned, "kubernetes.image_registry": None}, images_through_mirror)
    assert len(unmirrored) == 9 and all(  # 5 groups, the warmer, router, controller and agent
        "a production stack without kubernetes.image_registry" in f.observed for f in unmirrored
    )
    assert findings("plain", {"kubernetes.production": False}, images_by_digest) == []


def test_check_fails_a_stack_with_a_1s_health_timeout(tmp_path: Path) -> None:
    """A spec the pydantic model accepts but the policy refuses: the 1 s health-check timeout of the source."""
    path = write_variant(tmp_path, "flappy", base="dev", changes={"serving.health_check_timeout_s": 1})
    result = exaserve("check", "--stack-file", str(path))
    assert result.returncode == 1, result.stdout + result.stderr
    # Three probes on each of 5 groups, readiness and liveness on the router.
    assert result.stdout.count("✗ fail [probes-timeout]") == 5 * 3 + 2
    assert "✗ fail [probes-timeout] StatefulSet exaserve/sglang-g0\n" in result.stdout
    assert "    expected: a readinessProbe with timeoutSeconds ≥ 3\n" in result.stdout
    assert "    fix:      Add readinessProbe with timeoutSeconds ≥ 3" in result.stdout
    assert "17 violation(s)" in result.stdout
    as_json = json.loads(exaserve("check", "--stack-file", str(path), "--json").stdout)
    assert as_json["ok"] is False and len(as_json["violations"]) == 17
    g0 = [v for v in as_json["violations"] if v["subject"] == "StatefulSet exaserve/sglang-g0"]
    assert {(v["check"], v["status"]) for v in g0} == {("probes-timeout", "fail")}
    assert [v["observed"] for v in g0] == [
        f"spec.template.containers[sglang].{probe} is set with timeoutSeconds=1"
        for probe in ("readinessProbe", "livenessProbe", "startupProbe")
    ]


def test_a_stack_with_gates_in_dry_run_is_refused_by_check_and_the_pack(tmp_path: Path) -> None:
    """rollout.dry_run_gates is for a sandbox's own processes: a cluster stack with it fails `exaserve check` (the
    CrossGuard pack's rule, so `pulumi up` too), and `exaserve rollout` refuses to run it against the cluster."""
    path = write_variant(tmp_path, "dry", base="dev", changes={"rollout.dry_run_gates": ["p99"]})
    as_json = json.loads(exaserve("check", "--stack-file", str(path), "--json").stdout)
    assert as_json["ok"] is False
    [found] = [v for v in as_json["violations"] if v["check"] == "rollout-gates-enforced"]
    assert "would never pause or roll back" in found["observed"] and found["subject"] == "rollout.dry_run_gates"
    r = exaserve("rollout", "--stack-file", str(path), "--to", "v2", "--dry-run", "--backend", "kubernetes",
                 "--kube-server", "http://127.0.0.1:9", "--state-dir", str(tmp_path / "state"))  # fmt: skip
    assert r.returncode == 2 and "rollout.dry_run_gates ['p99']" in r.stderr, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr


# ------------------------------------------------------------------------------------------ the pack as the engine sees it


def _struct(obj: dict[str, Any]) -> Any:
    s = struct_pb2.Struct()
    s.update(json.loads(json.dumps(obj)))
    return s


def test_policy_pack_serves_the_rules_over_grpc(prod: list[RenderedObject]) -> None:
    """`python policies` as the Pulumi CLI starts it (analyzer plugin on a loopback port), queried over gRPC with
    the engine's own requests: property proxies, float numbers, stack resources. Killed when done."""
    env = {**os.environ, "PULUMI_STACK": "prod"}
    proc = subprocess.Popen(
        [sys.executable, "policies"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = analyzer_pb2_grpc.AnalyzerStub(channel)
            info = stub.GetAnalyzerInfo(empty_pb2.Empty(), timeout=30)
            assert info.name == "exaserve"
            assert {p.name for p in info.policies} == set(policy.RESOURCE_RULES) | set(policy.STACK_RULES)
            assert {p.enforcementLevel for p in info.policies} == {analyzer_pb2.MANDATORY}

            sts = _find(prod, "StatefulSet", "sglang-g0")
            clean = stub.Analyze(
                analyzer_pb2.AnalyzeRequest(
                    type=sts.resource_type, properties=_struct(sts.obj), urn="u", name=sts.name
                ),
                timeout=30,
            )
            assert list(clean.diagnostics) == []
            bad = copy.deepcopy(sts.obj)
            _image_latest(bad)
            dirty = stub.Analyze(
                analyzer_pb2.AnalyzeRequest(type=sts.resource_type, properties=_struct(bad), urn="u", name=sts.name),
                timeout=30,
            )
            assert [(d.policyName, d.enforcementLevel) for d in dirty.diagnostics] == [
                ("images-pinned", analyzer_pb2.MANDATORY)
            ]

            resources = [
                analyzer_pb2.AnalyzerResource(
                    type=o.resource_type, properties=_struct(o.obj), urn=f"urn:{o.kind}:{o.name}", name=o.name
                )
                for o in prod
                if not (o.kind == "PodDisruptionBudget" and o.name == "sglang-g0")
            ]
            stack = stub.AnalyzeStack(analyzer_pb2.AnalyzeStackRequest(resources=resources), timeout=60)
            found = [(d.policyName, d.urn) for d in stack.diagnostics]
            assert [f for f in found if f[0] != "images-by-digest"] == [
                ("pdb-per-serving-group", "urn:StatefulSet:sglang-g0")
            ]
            # Issue 25, finding 7: the pack at `pulumi up` has no --allow-tags: prod's tags are refused, one per
            # container, until their digests are set.
            assert len([f for f in found if f[0] == "images-by-digest"]) == 15
    finally:
        proc.kill()
        proc.wait()


def _system_findings(objects: list[dict[str, Any]], path: Path) -> list[Any]:
    fleet = fleet_of(load_stack_file(path).spec)
    return system_pool_placement([(f"kubernetes:x:{o['kind']}", o) for o in objects], fleet)


def test_routers_and_controllers_stay_on_the_system_pool(
    prod: list[RenderedObject], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 25, finding 6: the routers and controllers tolerate no taint and every GPU node carries nvidia.com/gpu,
    so they run on the declared system pool. A router without its nodeSelector, or a controller tolerating the GPU
    taint, passed before (no guard looked)."""
    monkeypatch.setenv("PULUMI_STACK", "prod")
    objects = [o.obj for o in prod]
    assert _validate_stack("system-pool-placement", objects) == []
    for name in ("sglang-router", "exaserve-controller"):
        assert _pod(_find(prod, "Deployment", name).obj)["spec"]["nodeSelector"] == {"exaserve.io/pool": "system"}
    edited = copy.deepcopy(objects)
    for o in (o for o in edited if o["kind"] == "Deployment"):
        pod = o["spec"]["template"]["spec"]
        if o["metadata"]["name"] == "sglang-router":
            del pod["nodeSelector"]
        if o["metadata"]["name"] == "exaserve-controller":
            pod["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    reported = sorted(m for m, _ in _validate_stack("system-pool-placement", edited))
    assert len(reported) == 2, reported
    assert reported[0].startswith("Deployment exaserve/exaserve-controller: spec.template.spec.tolerations")
    assert "let it onto the GPU nodes" in reported[0]
    assert reported[1].startswith(
        "Deployment exaserve/sglang-router: spec.template.spec.nodeSelector is {}: not the system pool's "
        "{'exaserve.io/pool': 'system'}"
    )
    assert all("Fix: Declare cluster.system_pool" in m for m in reported)


def test_a_stack_without_a_system_pool_fails_the_placement_guard(tmp_path: Path) -> None:
    doc = stack_doc("dev")
    del doc["cluster"]["system_pool"]
    path = write_stack(tmp_path / "Pulumi.nopool.yaml", doc)
    objects = [o.obj for o in render_file(path)]
    found = _system_findings(objects, path)
    assert sorted(f.subject for f in found) == [
        "Deployment exaserve/exaserve-controller",
        "Deployment exaserve/sglang-router",
    ]
    assert all("declares no cluster.system_pool" in f.observed for f in found)
    # With the pool declared, the same stack renders the selector and passes.
    declared = write_variant(tmp_path, "pool", base="dev", changes={})
    assert _system_findings([o.obj for o in render_file(declared)], declared) == []


# ------------------------------------------------------------------------------------------ issue 40: guards that let
# through what they should refuse. Each failing example passed every guard of the pack before (policy.check: only
# prod's pending digests were found).

RBAC_KINDS = ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")


def _pack(objects: list[dict[str, Any]], fleet: Any) -> list[Any]:
    """Every rule of the pack over the objects, less prod's pending digests (images-by-digest)."""
    return [
        f
        for f in policy.check([(f"kubernetes:x:{o['kind']}", o) for o in objects], fleet)
        if f.check != "images-by-digest"
    ]


@pytest.fixture(scope="module")
def prod_fleet() -> Any:
    return fleet_of(load_stack_file(REPO / "Pulumi.prod.yaml").spec)


@pytest.fixture(scope="module")
def prod_objects(prod: list[RenderedObject]) -> list[dict[str, Any]]:
    return [copy.deepcopy(o.obj) for o in prod]


def _role(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == "Role" and o["metadata"]["name"] == name)


UPDATER_ROLE, CONTROLLER_ROLE = "exaserve-updater-rollout", "exaserve-controller-runtime"
LEASE_BY_NAME = {  # the updater's batch Lease rule as rendered (serving/render/k8s/updater.py)
    "apiGroups": ["coordination.k8s.io"],
    "resources": ["leases"],
    "resourceNames": [batch_lease_name("exaserve")],
    "verbs": ["get", "update"],
}
EXTRA_RULES: dict[str, tuple[str, dict[str, Any], str]] = {
    # in a privileged namespace, pods: create alone is root on any node (a hostPath / privileged pod of its own)
    "updater pods create": (
        UPDATER_ROLE,
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]},
        "create on pods",
    ),
    "updater pods/exec create": (
        UPDATER_ROLE,
        {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]},
        "create on pods/exec",
    ),
    "updater pods/ephemeralcontainers patch": (
        UPDATER_ROLE,
        {"apiGroups": [""], "resources": ["pods/ephemeralcontainers"], "verbs": ["patch"]},
        "patch on pods/ephemeralcontainers",
    ),
    "updater pods/ephemeralcontainers update": (
        UPDATER_ROLE,
        {"apiGroups": [""], "resources": ["pods/ephemeralcontainers"], "verbs": ["update"]},
        "update on pods/ephemeralcontainers",
    ),
    "controller pods delete": (
        CONTROLLER_ROLE,
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]},
        "delete on pods, which the fleet controller never calls",
    ),
    "controller pods deletecollection": (
        CONTROLLER_ROLE,
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["deletecollection"]},
        "deletecollection on pods",
    ),
    "wildcard verbs": (CONTROLLER_ROLE, {"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]}, "a wildcard"),
    "wildcard resources": (UPDATER_ROLE, {"apiGroups": [""], "resources": ["*"], "verbs": ["get"]}, "a wildcard"),
    "updater leases of another name": (
        UPDATER_ROLE,
        {**LEASE_BY_NAME, "resourceNames": ["exaserve-controller"]},
        "names the rolling updater never uses",
    ),
    "updater leases without a name": (
        UPDATER_ROLE,
        {k: v for k, v in LEASE_BY_NAME.items() if k != "resourceNames"},
        "update on leases (coordination.k8s.io) for any name",
    ),
    "updater leases list": (
        UPDATER_ROLE,
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["list"]},
        "list on leases",
    ),
    "updater patches another pod": (
        UPDATER_ROLE,
        {"apiGroups": [""], "resources": ["pods"], "resourceNames": ["sglang-router-0"], "verbs": ["patch"]},
        "names the rolling updater never uses",
    ),
}


@pytest.mark.parametrize("case", EXTRA_RULES.values(), ids=EXTRA_RULES.keys())
def test_a_role_beyond_its_accounts_calls_is_refused(
    prod_objects: list[dict[str, Any]], prod_fleet: Any, case: tuple[str, dict[str, Any], str]
) -> None:
    role_name, rule, said = case
    assert _pack(prod_objects, prod_fleet) == []
    objects = copy.deepcopy(prod_objects)
    role = _role(objects, role_name)
    role["rules"].append(rule)
    (found,) = _pack(objects, prod_fleet)
    assert found.check == "rbac-allowlist" and found.subject == f"Role exaserve/{role_name}"
    assert f"rules[{len(role['rules']) - 1}]" in found.observed and said in found.observed, found.observed
    assert "allowlist" in found.expected and found.fix.startswith("Remove the extra rule")


def test_the_updaters_rollout_lease_rules_pass_and_a_lease_delete_does_not(
    prod_objects: list[dict[str, Any]], prod_fleet: Any
) -> None:
    """The updater's batch Lease (serving/rollout/backends/kubernetes.py ``announce``): create, then get/update by
    name, as rendered, pass; a delete, which the backend never calls (it resigns the Lease), is refused."""
    rules = _role(prod_objects, UPDATER_ROLE)["rules"]
    lease = [r for r in rules if r["resources"] == ["leases"]]
    assert lease == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [batch_lease_name("exaserve")],
            "verbs": ["get", "update"],
        },
    ]
    assert _pack(prod_objects, prod_fleet) == []
    objects = copy.deepcopy(prod_objects)
    (named,) = [
        r for r in _role(objects, UPDATER_ROLE)["rules"] if r.get("resourceNames") == [batch_lease_name("exaserve")]
    ]
    named["verbs"] = ["get", "update", "delete"]
    (found,) = _pack(objects, prod_fleet)
    assert found.check == "rbac-allowlist" and "delete on leases" in found.observed, found.observed


def test_access_beside_the_roles_is_refused(prod_objects: list[dict[str, Any]], prod_fleet: Any) -> None:
    """A binding to a ClusterRole, a ClusterRole(Binding), an unknown Role: each passed before."""
    objects = copy.deepcopy(prod_objects)
    binding = next(o for o in objects if o["kind"] == "RoleBinding" and o["metadata"]["name"] == UPDATER_ROLE)
    binding["roleRef"] = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"}
    cluster_role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "tools"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}],
    }
    unknown = {**copy.deepcopy(_role(objects, UPDATER_ROLE)), "metadata": {"name": "debug", "namespace": "exaserve"}}
    found = _pack([*objects, cluster_role, unknown], prod_fleet)
    assert sorted((f.check, f.subject) for f in found) == [
        ("rbac-allowlist", "ClusterRole tools"),
        ("rbac-allowlist", "Role exaserve/debug"),
        ("rbac-allowlist", f"RoleBinding exaserve/{UPDATER_ROLE}"),
    ]
    assert any("roleRef ClusterRole/admin" in f.observed for f in found)


def test_the_multi_node_roles_pass_and_a_leader_pod_delete_does_not(tmp_path: Path) -> None:
    """A LeaderWorkerSet replaces its own pods: its updater may patch the leader pods but delete none."""
    path = write_variant(tmp_path, "tp16", changes=MULTI_NODE)
    fleet = fleet_of(load_stack_file(path).spec)
    objects = [o.obj for o in render_file(path)]
    assert _pack(objects, fleet) == []
    role = _role(objects, UPDATER_ROLE)
    (by_name,) = [r for r in role["rules"] if r.get("resourceNames") and r["resources"] == ["pods"]]
    by_name["verbs"] = ["patch", "delete"]
    (found,) = _pack(objects, fleet)
    assert "delete on pods, which the rolling updater never calls" in found.observed


LWS_BUDGETS: dict[str, tuple[dict[str, Any], str]] = {
    # maxSurge is added onto the leader StatefulSet's maxUnavailable (ignored without the alpha gate) and creates
    # replicas beyond the plan; a partition keeps the groups below it on the old template for good.
    "maxSurge": ({"maxSurge": 41}, "rollingUpdateConfiguration.maxSurge=41"),
    "maxSurge percent": ({"maxSurge": "10%"}, "rollingUpdateConfiguration.maxSurge=10%"),
    "partition": ({"partition": 3}, "rollingUpdateConfiguration.partition=3"),
}


@pytest.mark.parametrize("case", LWS_BUDGETS.values(), ids=LWS_BUDGETS.keys())
def test_a_leaderworkerset_with_a_surge_or_a_partition_fails_rollout_ga_only(
    multi_node: list[RenderedObject], case: tuple[dict[str, Any], str]
) -> None:
    config, said = case
    lws = _find(multi_node, "LeaderWorkerSet", "sglang-g0")
    budget = copy.deepcopy(lws.obj)
    budget["spec"]["rolloutStrategy"] = {"type": "RollingUpdate", "rollingUpdateConfiguration": config}
    messages = _validate("rollout-ga-only", lws, budget)
    assert len(messages) == 1 and said in messages[0], messages
    # LWS's defaults written out (maxSurge 0, partition 0) are what the render leaves unset: they pass
    default = copy.deepcopy(lws.obj)
    default["spec"]["rolloutStrategy"] = {
        "type": "RollingUpdate",
        "rollingUpdateConfiguration": {"maxSurge": 0, "partition": 0},
    }
    assert _validate("rollout-ga-only", lws, default) == []


EARLY_EXITS = {
    "exit before the loop": lambda s: "exit 0; " + s,
    "true in the test": lambda s: s.replace("until [", "until true || ["),
    "in the background": lambda s: s.replace("; done", " & done", 1),
    "a command substitution": lambda s: s.replace("echo model cache complete", "echo $(rm -rf /)"),
    "a redirect": lambda s: s.replace("sleep 10", "sleep 10 > /dev/null"),
    "a file test that is not -f": lambda s: s.replace("[ -f", "[ ! -f"),
    "no loop at all": lambda s: "echo model cache complete",
}


@pytest.mark.parametrize("edit", EARLY_EXITS.values(), ids=EARLY_EXITS.keys())
def test_a_cache_wait_that_can_end_before_the_marker_exists_is_refused(
    prod: list[RenderedObject], edit: Callable[[str], str]
) -> None:
    sts = _find(prod, "StatefulSet", "sglang-g0")
    bad = copy.deepcopy(sts.obj)
    _cache_wait_script(bad, edit)
    (message,) = _validate("serving-waits-for-node-cache", sts, bad)
    assert "Meta-Llama-3-70B-Instruct-AWQ-INT4/.exaserve-complete" in message and "Fix: " in message


def test_a_draft_models_cache_is_waited_for_too(prod: list[RenderedObject]) -> None:
    """A server that loads a speculative draft from the cache waits for the draft's marker as well (the render's
    wait_script loops once per model, tests/test_pulumi_program.py runs it)."""
    sts = _find(prod, "StatefulSet", "sglang-g0")
    drafted = copy.deepcopy(sts.obj)
    _container(drafted)["args"] += ["--speculative-draft-model-path", "/var/cache/exaserve/models/org/d"]
    (message,) = _validate("serving-waits-for-node-cache", sts, drafted)
    assert "/var/cache/exaserve/models/org/d/.exaserve-complete" in message
    loop = "until [ -f /var/cache/exaserve/models/org/d/.exaserve-complete ]; do sleep 10; done; "
    _cache_wait_script(drafted, lambda s: loop + s)
    assert _validate("serving-waits-for-node-cache", sts, drafted) == []


def test_only_the_rdma_device_plugin_shares_the_hosts_network(multi_node: list[RenderedObject]) -> None:
    """The RDMA device plugin finds its HCAs through the host's network devices (hostNetwork, as upstream renders it):
    it passes; the same DaemonSet sharing the host's PIDs, or a LeaderWorkerSet on the host network, does not."""
    ds = _find(multi_node, "DaemonSet", "rdma-shared-device-plugin")
    assert _pod(ds.obj)["spec"]["hostNetwork"] is True
    assert _validate("pod-host-isolation", ds) == []
    pid = copy.deepcopy(ds.obj)
    _pod(pid)["spec"]["hostPID"] = True
    (message,) = _validate("pod-host-isolation", ds, pid)
    assert "hostPID" in message
    lws = _find(multi_node, "LeaderWorkerSet", "sglang-g0")
    assert _validate("pod-host-isolation", lws) == []
    host = copy.deepcopy(lws.obj)
    host["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["hostNetwork"] = True
    (message,) = _validate("pod-host-isolation", lws, host)
    assert "leaderTemplate" in message and "hostNetwork" in message
