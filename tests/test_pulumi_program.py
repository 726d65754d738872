"""The Pulumi program wired under Pulumi's mocks — the engine itself cannot run here.

`serving.pulumi.program.run_program` executes the program (`serving.pulumi.components.fleet_stack`, which
`infra/__main__.py` calls) with `pulumi.runtime.set_mocks`; these tests read what it registered: components and
their type tokens, parents, the one explicit provider, object counts per stack, unique names, exports, and the
content each concern renders from the spec; and that the entry point Pulumi runs registers exactly the same.
"""

from __future__ import annotations

import copy
import gc
import json
import subprocess
import warnings
from collections import Counter
from pathlib import Path

import pytest

from serving.plan.planner import placement
from serving.pulumi import program
from serving.pulumi.crds import pinned_crd
from serving.pulumi.program import ProgramRun, kubernetes_objects, run_program
from serving.render.k8s import fabric, fleet, gateway, storage
from serving.render.k8s.common import LABEL_GROUP, LABEL_RACK, LABEL_VERSION, TAINT_KEY
from serving.render.k8s.container import WAIT_FOR_CACHE, pod_container, wait_script
from serving.render.k8s.prerequisites import LWS_CRD, lws_crd_problem, required_crds
from serving.render.router import router_args
from serving.render.sglang import model_dir
from serving.spec.checkpoint import INDEX_FILE
from serving.spec.schema import FleetSpec
from serving.spec.stack import load_stack, load_stack_file, pulumi_config, spec_from_config
from tests.support.k8s import of_kind, one, render_file
from tests.support.paths import REPO
from tests.support.stacks import MULTI_NODE, fleet_of, write_variant

STACKS = ("prod", "dev", "sandbox")
COMPONENTS = {
    "namespace": "exaserve:core:Namespace",
    "nodes": "exaserve:cluster:Nodes",
    "fabric": "exaserve:fabric:RdmaFabric",
    "storage": "exaserve:storage:ModelStorage",
    "fleet": "exaserve:serving:ServingFleet",
    "gateway": "exaserve:serving:Gateway",
    "monitoring": "exaserve:observability:Monitoring",
    "network-policy": "exaserve:security:NetworkPolicies",
    "runtime": "exaserve:runtime:Runtime",
    "updater": "exaserve:rollout:Updater",
}


@pytest.fixture(scope="session")
def runs() -> dict[str, ProgramRun]:
    return {name: run_program(name) for name in STACKS}


@pytest.mark.parametrize("stack", STACKS)
def test_one_component_per_concern_parented_to_the_stack(runs: dict[str, ProgramRun], stack: str) -> None:
    run = runs[stack]
    root = [r for r in run.registrations if r.type == "pulumi:pulumi:Stack"]
    assert [r.name for r in root] == [f"exaserve-{stack}"]
    components = {r.name: r for r in run.registrations if r.is_component}
    assert {n: r.type for n, r in components.items()} == COMPONENTS
    assert all(r.parent == root[0].urn for r in components.values())
    # register_outputs ran for every component (outputs recorded per URN)
    assert all(r.urn in run.outputs for r in components.values())


@pytest.mark.parametrize("stack", STACKS)
def test_every_kubernetes_object_is_a_child_of_a_component_and_uses_the_explicit_provider(
    runs: dict[str, ProgramRun], stack: str
) -> None:
    run = runs[stack]
    providers = [r for r in run.registrations if r.type == "pulumi:providers:kubernetes"]
    assert len(providers) == 1, "exactly one explicit Kubernetes provider"
    spec = load_stack(stack).spec
    assert providers[0].inputs.get("context") == spec.kubernetes.context
    by_urn = run.by_urn()
    k8s = [r for r in run.registrations if r.is_kubernetes_object]
    assert k8s
    for reg in k8s:
        assert by_urn[reg.parent].is_component, f"{reg.urn} is not parented to a component"
        assert reg.provider.startswith(providers[0].urn + "::"), (
            f"{reg.urn} uses {reg.provider or 'the default provider'}"
        )


@pytest.mark.parametrize("stack", STACKS)
def test_object_counts_follow_nodes_and_batches(runs: dict[str, ProgramRun], stack: str) -> None:
    spec = load_stack(stack).spec
    counts = Counter(o.component for o in kubernetes_objects(runs[stack]))
    rdma = fabric.has_rdma(fleet_of(spec))
    expected = {
        "namespace": 1,
        "nodes": spec.cluster.node_count + len(spec.cluster.system_nodes),
        "fabric": (2 + spec.cluster.fabric.secondary_network) if rdma else 0,
        "storage": 3,
        "fleet": 2 * spec.rollout.batches + 1,
        "gateway": 7,  # with the headless Service of the router pods (membership is per router instance)
        "monitoring": 3,
        "network-policy": 3,
        "runtime": 16,  # fixed: controller, agent, their RBAC, the controllers' headless Service, 3 policies (the
        # third lets the controllers read the routers' breakers, issue 24), rule,
        # monitor, stack
        # the rolling updater's ServiceAccount, Role, RoleBinding (tests/test_render_updater.py), its admission policy
        # and binding (tests/test_render_admission.py)
        "updater": 5,
    }
    assert {k: counts.get(k, 0) for k in expected} == expected
    assert sum(counts.values()) == sum(expected.values())


@pytest.mark.parametrize("stack", STACKS)
def test_names_are_unique(runs: dict[str, ProgramRun], stack: str) -> None:
    run = runs[stack]
    urns = Counter(r.urn for r in run.registrations)
    assert [u for u, n in urns.items() if n > 1] == []
    keys = Counter(o.key for o in kubernetes_objects(run))
    assert [k for k, n in keys.items() if n > 1] == []
    assert all(o.name for o in kubernetes_objects(run)), "every object is named (no auto-naming)"


def test_stack_exports(runs: dict[str, ProgramRun]) -> None:
    spec = load_stack("prod").spec
    out = runs["prod"].stack_outputs()
    assert out["namespace"] == "exaserve"
    assert out["nodes"] == 256
    assert out["system_nodes"] == 3
    assert out["replicas"] == 2048
    assert out["group_sizes"] == {fleet.group_name(g): n for g, n in enumerate(fleet_of(spec).plan.rollout_group_sizes)}
    assert out["group_versions"] == {fleet.group_name(g): "v1" for g in range(5)}
    assert out["router_endpoint"] == "http://sglang-router.exaserve.svc:30000"
    assert out["updater_service_account"] == "exaserve-updater"
    assert out.get("rdma_resource") is None, "one-GPU replicas use no fabric"
    assert "ExaServeClockOffset" in out["alerts"]


def test_resource_count_does_not_grow_with_replicas(tmp_path: Path, runs: dict[str, ProgramRun]) -> None:
    """Half the replicas: the same objects; only the groups' replica counts and budgets change."""
    half = render_file(write_variant(tmp_path, "half", changes={"serving.replicas": 1024}))
    full = kubernetes_objects(runs["prod"])
    assert sorted(o.key for o in half) == sorted(o.key for o in full)
    assert sum(s["spec"]["replicas"] for s in of_kind(half, "StatefulSet")) == 1024
    assert sum(s["spec"]["replicas"] for s in of_kind(full, "StatefulSet")) == 2048


def test_node_patches_carry_inventory_labels_only(runs: dict[str, ProgramRun]) -> None:
    spec = load_stack("prod").spec
    nodes = {o.name: o.obj for o in kubernetes_objects(runs["prod"]) if o.kind == "Node"}
    assert set(nodes) == {n.name for n in (*spec.cluster.nodes, *spec.cluster.system_nodes)}
    # Issue 25, finding 6: the system pool's nodes carry the label the routers' and controllers' nodeSelector names.
    for n in spec.cluster.system_nodes:
        assert nodes.pop(n.name)["metadata"]["labels"] == {"exaserve.io/pool": "system"}
    for n in spec.cluster.nodes:
        patch = nodes[n.name]
        labels = patch["metadata"]["labels"]
        assert (labels[LABEL_RACK], labels["exaserve.io/leaf"], labels["exaserve.io/pool"]) == (n.rack, n.leaf, n.pool)
        assert labels["exaserve.io/gpu-product"] == "NVIDIA-A100-SXM4-80GB"
        assert labels["exaserve.io/fabric"] == "infiniband"
        assert "spec" not in patch, "taints are the kubelet's (Ansible role kubelet): spec.taints is an atomic list"
    assert len({p["metadata"]["labels"][LABEL_RACK] for p in nodes.values()}) == 16


def test_fleet_groups_carry_their_own_versions(tmp_path: Path) -> None:
    path = write_variant(
        tmp_path,
        "canary",
        changes={"serving.releases.v2": "lmsysorg/sglang:v0.5.24-cu126", "rollout.group_versions": {0: "v2"}},
    )
    objects = render_file(path)
    sets = sorted(of_kind(objects, "StatefulSet"), key=lambda s: s["metadata"]["name"])
    assert [s["metadata"]["name"] for s in sets] == [fleet.group_name(g) for g in range(5)]
    versions = [s["metadata"]["labels"][LABEL_VERSION] for s in sets]
    assert versions == ["v2", "v1", "v1", "v1", "v1"]
    for g, s in enumerate(sets):
        template = s["spec"]["template"]
        assert template["metadata"]["labels"][LABEL_VERSION] == versions[g]
        assert template["metadata"]["labels"][LABEL_GROUP] == str(g)
        container = template["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["EXASERVE_RELEASE"] == versions[g]
        tag = "v0.5.24-cu126" if g == 0 else "v0.5.23-cu126"
        assert container["image"] == f"registry.exaserve.internal/mirror/lmsysorg/sglang:{tag}"  # prod's mirror
        assert s["metadata"]["annotations"] == {"pulumi.com/skipAwait": "true"}


def test_fleet_pods_wait_for_their_cache_and_spread_satisfiably(runs: dict[str, ProgramRun]) -> None:
    """Findings 1, 7, 10, 12: each pod waits for its own node's cache; one-GPU replicas get no fabric; whole CPUs;
    shared memory sized per GPU; a rack spread one rack's share wide that ignores cordoned nodes."""
    spec = load_stack("prod").spec
    fl = fleet_of(spec)
    pl = fl.plan
    objects = kubernetes_objects(runs["prod"])
    s = one(objects, "StatefulSet", "sglang-g0")
    # Issue 25: the updater replaces a batch's pods (OnDelete) and the controller creates them at once (Parallel).
    assert (s["spec"]["updateStrategy"], s["spec"]["podManagementPolicy"]) == ({"type": "OnDelete"}, "Parallel")
    assert s["spec"]["serviceName"] == fleet.WORKERS_SERVICE
    assert s["spec"]["selector"] == {"matchLabels": fleet.group_selector(0)}
    template = s["spec"]["template"]
    pod = template["spec"]
    assert pod["containers"] == [pod_container(fl, 0)]
    (wait,) = pod["initContainers"]
    assert wait["name"] == WAIT_FOR_CACHE and f"{model_dir(spec)}/{storage.COMPLETE_MARKER}" in wait["command"][-1]
    spread = {c["topologyKey"]: c for c in pod["topologySpreadConstraints"]}
    assert spread[LABEL_RACK] == {
        "maxSkew": 26,  # ceil(410 / 16 racks)
        "topologyKey": LABEL_RACK,
        "whenUnsatisfiable": "DoNotSchedule",
        "nodeTaintsPolicy": "Honor",
        "labelSelector": {"matchLabels": fleet.group_selector(0)},
    }
    resources = pod["containers"][0]["resources"]
    assert resources["requests"] == resources["limits"] == {"cpu": "8", "memory": "44Gi", "nvidia.com/gpu": "1"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}
    assert "annotations" not in template["metadata"], "no Multus network for a replica inside one node"
    assert [o for o in objects if o.component == "fabric"] == []
    assert (
        pod["tolerations"]
        == [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]
        == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    )
    budgets = {p["metadata"]["name"]: p for p in of_kind(objects, "PodDisruptionBudget")}
    for g, size in enumerate(pl.rollout_group_sizes):
        assert budgets[fleet.group_name(g)]["spec"]["selector"]["matchLabels"] == fleet.group_selector(g)
        assert budgets[fleet.group_name(g)]["spec"]["maxUnavailable"] == int(size * 0.10)


def test_the_fleet_never_waits_for_the_cache_warmer(runs: dict[str, ProgramRun]) -> None:
    """Finding 1: the fleet component does not depend on storage (Pulumi would wait for every node's copy); storage
    follows the node labels its warmer selects on. Finding 15: the CRDs are read before the custom resources."""
    run = runs["prod"]
    components = {r.name: r for r in run.registrations if r.is_component}
    deps = {name: {d.rsplit("::", 1)[-1] for d in run.dependencies.get(r.urn, [])} for name, r in components.items()}
    # depends_on a component means on each of its objects (the SDK expands it): the warmer is not among them.
    assert not {storage.WARMER, storage.CLAIM} & deps["fleet"]
    assert {"exaserve", "gpu-r00-n00", "gpu-r15-n15"} <= deps["fleet"] & deps["storage"]
    # One-node replicas are StatefulSets: prod needs no LeaderWorkerSet CRD (a multi-node stack does: below).
    assert not {d for d in deps["fleet"] if d.startswith("crd-")}
    assert {
        "crd-prometheusrules.monitoring.coreos.com",
        "crd-servicemonitors.monitoring.coreos.com",
        "crd-podmonitors.monitoring.coreos.com",
    } <= deps["monitoring"]


def test_pulumi_config_and_the_stack_file_give_the_same_spec() -> None:
    """Finding 14: under `pulumi up` the program reads `pulumi.Config("exaserve")`; the offline tools read the file.
    The file's keys, fed to Pulumi's config as the engine would pass them, parse to the very spec load_stack gives."""
    for name in STACKS:
        stack = load_stack(name)
        config = pulumi_config(stack.path)
        assert set(config) == {k for k in config if k.startswith("exaserve:")} != set()
        via_config = spec_from_config(
            lambda k, c=config: json.loads(c[f"exaserve:{k}"]) if f"exaserve:{k}" in c else None, "config", REPO
        )
        # The one difference: model.hf_config, made absolute so the program finds it from any working directory.
        hf = {"model": {"hf_config"}}
        assert via_config.model_dump(exclude=hf) == stack.spec.model_dump(exclude=hf), name


def test_multi_node_replicas_become_leader_worker_sets(tmp_path: Path) -> None:
    """TP 16 on 8-GPU nodes: each replica spans 2 nodes, so each group is one LeaderWorkerSet."""
    path = write_variant(
        tmp_path,
        "tp16",
        changes=MULTI_NODE,
    )
    objects = render_file(path)
    spec = load_stack_file(path).spec
    assert placement(spec).nodes_per_replica == 2
    assert required_crds(fleet_of(spec))["fleet"] == ["leaderworkersets.leaderworkerset.x-k8s.io"]
    sets = sorted(of_kind(objects, "LeaderWorkerSet"), key=lambda s: s["metadata"]["name"])
    assert [s["spec"]["replicas"] for s in sets] == fleet_of(spec).plan.rollout_group_sizes
    lwt = sets[0]["spec"]["leaderWorkerTemplate"]
    assert lwt["size"] == 2
    leader = lwt["leaderTemplate"]["spec"]["containers"][0]
    worker = lwt["workerTemplate"]["spec"]["containers"][0]
    assert "readinessProbe" in leader and "readinessProbe" not in worker
    assert "$(LWS_WORKER_INDEX)" in worker["args"] and leader["resources"]["limits"]["nvidia.com/gpu"] == "8"
    # Finding 7/8: the fabric goes to replicas that span nodes; NCCL pins memory as root with IPC_LOCK only; the
    # group's pods stay in their leader's rack.
    assert leader["resources"]["limits"]["rdma/hca_shared_devices_a"] == "1"
    assert leader["securityContext"]["runAsUser"] == 0 and leader["securityContext"]["capabilities"] == {
        "drop": ["ALL"],
        "add": ["IPC_LOCK"],
    }
    affinity = lwt["workerTemplate"]["spec"]["affinity"]["podAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert affinity[0]["topologyKey"] == LABEL_RACK and affinity[0]["matchLabelKeys"] == [fleet.LWS_GROUP_KEY]
    assert one(objects, "DaemonSet", fabric.DAEMONSET)["spec"]["template"]["spec"]["tolerations"] == [
        {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
    ]
    workers_policy = one(objects, "NetworkPolicy", fleet.WORKERS_SERVICE)
    assert {"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "sglang"}}}]} in workers_policy["spec"][
        "ingress"
    ], "the pods of one replica must reach each other"


def test_an_lws_older_than_v0_9_0_is_refused_where_its_crd_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 40: the updater waits on an LWS's status.observedGeneration, which LWS sets from v0.9.0 (#807); the
    Pulumi program read the CRD only to see that it exists. Its schema has the field from v0.9.0 on, so the program
    now refuses a CRD without it where it reads it, before any LeaderWorkerSet is created (the updater's own check
    reads the live status later, at the first rollout). The offline run reads the pinned v0.10.0 CRD and passes."""
    crd = pinned_crd(LWS_CRD)
    assert crd is not None and lws_crd_problem(crd["spec"]) is None
    old = copy.deepcopy(crd)
    for version in old["spec"]["versions"]:
        del version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["observedGeneration"]
    problem = lws_crd_problem(old["spec"])
    assert problem is not None and "served version(s) v1 have no status.observedGeneration" in problem
    assert "upgrade LWS to v0.9.0 or later" in problem and lws_crd_problem(None) is None
    path = write_variant(tmp_path, "tp16", changes=MULTI_NODE)
    run_program("tp16", stack_file=path)  # the pinned CRD: no refusal
    monkeypatch.setattr(program, "pinned_crd", lambda name: old if name == LWS_CRD else None)
    with pytest.raises(Exception, match=r"older than v0\.9\.0"):
        run_program("tp16", stack_file=path)


def test_gateway_discovers_workers_with_least_privilege(runs: dict[str, ProgramRun]) -> None:
    spec = load_stack("prod").spec
    objects = kubernetes_objects(runs["prod"])
    role = one(objects, "Role", "sglang-router-discovery")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    binding = one(objects, "RoleBinding", "sglang-router-discovery")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "sglang-router", "namespace": "exaserve"}]
    deploy = one(objects, "Deployment", gateway.NAME)
    assert deploy["spec"]["replicas"] == spec.scheduler.instances == 3
    pod = deploy["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "sglang-router"
    argv = pod["containers"][0]["command"]
    assert argv == router_args(fleet_of(spec), kubernetes=True).to_argv()
    assert "--service-discovery" in argv
    service = one(objects, "Service", gateway.NAME)
    assert service["spec"]["type"] == "ClusterIP"
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"http": 30000, "metrics": 29000}


def test_time_sync_stays_on_the_host(runs: dict[str, ProgramRun]) -> None:
    """Finding 3: no clock daemon in the cluster (the host's chronyd keeps time); the cluster alerts on offsets and
    on unsynchronised clocks from node exporter's timex metrics."""
    objects = kubernetes_objects(runs["prod"])
    assert not [o for o in objects if o.kind == "DaemonSet" and "chrony" in o.name]
    alerts = runs["prod"].stack_outputs()["alerts"]
    assert {"ExaServeClockOffset", "ExaServeClockUnsynchronised"} <= set(alerts)


def test_model_store_is_read_only_many_on_nfs_or_csi(tmp_path: Path, runs: dict[str, ProgramRun]) -> None:
    objects = kubernetes_objects(runs["prod"])
    pv = one(objects, "PersistentVolume", "exaserve-model-store")
    assert pv["spec"]["accessModes"] == ["ReadOnlyMany"]
    assert pv["spec"]["nfs"] == {"server": "nfs.exaserve.internal", "path": "/export/models", "readOnly": True}
    pvc = one(objects, "PersistentVolumeClaim", storage.CLAIM)
    assert pvc["spec"]["accessModes"] == ["ReadOnlyMany"] and pvc["spec"]["volumeName"] == pv["metadata"]["name"]
    csi = render_file(
        write_variant(
            tmp_path,
            "csi",
            changes={"storage.model_store": {"kind": "csi", "csi_driver": "csi.weka.io", "volume_handle": "models-1"}},
        )
    )
    pv = one(csi, "PersistentVolume", "exaserve-model-store")
    assert "nfs" not in pv["spec"]
    assert pv["spec"]["csi"] == {"driver": "csi.weka.io", "volumeHandle": "models-1", "readOnly": True}


def _cache_variant(tmp_path: Path, changes: dict[str, object]) -> tuple[FleetSpec, Path, Path]:
    """prod with its model store and node cache under ``tmp_path`` (and ``changes``): the spec, store and cache."""
    store, cache = tmp_path / "store", tmp_path / "cache"
    dirs = {"storage.model_store.mount_path": str(store), "storage.local_cache.path": str(cache)}
    return load_stack_file(write_variant(tmp_path, "warm", changes={**dirs, **changes})).spec, store, cache


@pytest.mark.parametrize("model_path", ["org/m", "org/m/"])
def test_cache_warmer_script_copies_once_and_atomically(tmp_path: Path, model_path: str) -> None:
    """The warmer's real shell script, run here against directories standing in for the store and the cache.

    Regression (issue 9): with ``model.path: org/m/`` the warmer once staged into ``…/m/.partial``, then
    ``rm -rf …/m/`` deleted the staging copy and ``mv`` failed; the warmer and ``--model-path`` now share
    one join (:func:`serving.render.sglang.model_dir`)."""
    spec, _, cache = _cache_variant(tmp_path, {"model.path": model_path})
    src, dst = (Path(p) for p in storage.model_dirs(spec))
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "sub" / "model.safetensors").write_bytes(b"\0" * 4096)
    script = storage.warm_script(spec)
    first = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=True)
    assert "cache warmed" in first.stdout
    assert (dst / "sub" / "model.safetensors").read_bytes() == b"\0" * 4096
    assert (dst / storage.COMPLETE_MARKER).exists() and not Path(f"{dst}.partial").exists()
    assert str(dst) == model_dir(spec) == f"{cache}/org/m", "the warmer fills the directory the servers load from"
    second = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=True)
    assert "already warm" in second.stdout
    # The marker records the store's safetensors index; a checkpoint replaced under the same path re-warms.
    (src / INDEX_FILE).write_text('{"metadata": {"total_size": 4096}, "weight_map": {"w": "sub/model.safetensors"}}')
    third = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=True)
    assert "cache warmed" in third.stdout
    assert (dst / storage.COMPLETE_MARKER).read_text() == (src / INDEX_FILE).read_text()
    fourth = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=True)
    assert "already warm" in fourth.stdout
    (src / INDEX_FILE).write_text('{"metadata": {"total_size": 8192}, "weight_map": {"w": "sub/model.safetensors"}}')
    fifth = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=True)
    assert "cache warmed" in fifth.stdout and "8192" in (dst / storage.COMPLETE_MARKER).read_text()


def test_cache_warmer_and_pods_take_a_speculative_draft_too(tmp_path: Path) -> None:
    """With an EAGLE draft (model.speculative.draft_path) the warmer's real script copies the draft's directory into
    the cache beside the model, where --speculative-draft-model-path names it, and a serving pod waits for both
    markers. Before, only model.path was warmed and the server would not find its draft."""
    draft_cfg = tmp_path / "draft.json"
    draft_cfg.write_text(json.dumps({"hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64,
                                     "num_key_value_heads": 8, "num_hidden_layers": 1, "vocab_size": 128256}))  # fmt: skip
    speculative = {"algorithm": "EAGLE", "draft_path": "org/d", "draft_hf_config": str(draft_cfg)}
    spec, store, cache = _cache_variant(tmp_path, {"model.speculative": speculative, "parallelism.pp": 1})
    (model_src, model_dst), (draft_src, draft_dst) = ((Path(a), Path(b)) for a, b in storage.cache_dirs(spec))
    assert draft_dst == cache / "org" / "d" and draft_src == store / "org" / "d"
    for src in (model_src, draft_src):
        src.mkdir(parents=True)
        (src / "config.json").write_text(str(src))
    wait = ["/bin/sh", "-c", wait_script(spec)]
    with pytest.raises(subprocess.TimeoutExpired):  # no marker yet: the pod waits
        subprocess.run(wait, capture_output=True, text=True, timeout=1)
    first = subprocess.run(["/bin/sh", "-c", storage.warm_script(spec)], capture_output=True, text=True, check=True)
    assert first.stdout.count("cache warmed") == 2
    assert (draft_dst / "config.json").read_text() == str(draft_src) and (draft_dst / storage.COMPLETE_MARKER).exists()
    (model_dst / storage.COMPLETE_MARKER).unlink()  # the draft alone is not enough
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(wait, capture_output=True, text=True, timeout=1)
    second = subprocess.run(["/bin/sh", "-c", storage.warm_script(spec)], capture_output=True, text=True, check=True)
    assert "already warm" in second.stdout and second.stdout.count("cache warmed") == 1
    done = subprocess.run(wait, capture_output=True, text=True, timeout=10, check=True)
    assert "model cache complete" in done.stdout


def test_network_policies_admit_only_router_updater_and_monitoring(runs: dict[str, ProgramRun]) -> None:
    objects = kubernetes_objects(runs["prod"])
    deny = one(objects, "NetworkPolicy", "default-deny-ingress")["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": []}
    workers = one(objects, "NetworkPolicy", fleet.WORKERS_SERVICE)["spec"]
    assert workers["ingress"] == [
        {
            "from": [
                {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "sglang-router"}}},
                {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "exaserve-updater"}}},
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
            ],
            "ports": [{"protocol": "TCP", "port": 30000}],
        }
    ]
    router = one(objects, "NetworkPolicy", "sglang-router")["spec"]["ingress"]
    metrics = [r for r in router if r["ports"] == [{"protocol": "TCP", "port": 29000}]]
    assert metrics == [
        {
            "from": [
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
                {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "exaserve-updater"}}},
            ],
            "ports": [{"protocol": "TCP", "port": 29000}],
        }
    ]


def test_alerts_take_thresholds_from_the_spec(tmp_path: Path) -> None:
    objects = render_file(
        write_variant(
            tmp_path,
            "alerts",
            changes={"cluster.ntp.max_offset_ms": 50, "rollout.max_error_rate": 0.002, "limits.p99_target_s": 1.5},
        )
    )
    rules = {
        r["alert"]: r for g in one(objects, "PrometheusRule", "exaserve-alerts")["spec"]["groups"] for r in g["rules"]
    }
    assert rules["ExaServeClockOffset"]["expr"] == "abs(node_timex_offset_seconds) > 0.05"
    assert rules["ExaServeErrorRate"]["expr"].endswith("> 0.002")
    assert rules["ExaServeP99LatencyHigh"]["expr"].endswith("> 1.5")
    assert "> 90 and min" in rules["ExaServeGpuUtilisationImbalance"]["expr"]
    assert "< 30" in rules["ExaServeGpuUtilisationImbalance"]["expr"]
    assert "kube_pod_container_status_restarts_total" in rules["ExaServeReplicaRestarts"]["expr"]
    monitors = {m["metadata"]["name"]: m["spec"] for m in of_kind(objects, "ServiceMonitor")}
    assert monitors["sglang-router"]["endpoints"][0]["port"] == "metrics"
    # Workers: one target per pod (a PodMonitor), never the 1,000-address Endpoints of their Service (issue 25).
    assert fleet.WORKERS_SERVICE not in monitors
    (pods,) = of_kind(objects, "PodMonitor")
    assert pods["spec"]["selector"] == {"matchLabels": {"app.kubernetes.io/name": "sglang"}}
    assert pods["spec"]["podMetricsEndpoints"][0]["port"] == "http"


def test_ethernet_stack_has_no_rdma_objects(runs: dict[str, ProgramRun]) -> None:
    objects = kubernetes_objects(runs["dev"])
    assert [o for o in objects if o.component == "fabric"] == []
    pod = one(objects, "StatefulSet", "sglang-g0")["spec"]["template"]
    assert "annotations" not in pod["metadata"]
    assert "rdma/hca_shared_devices_a" not in pod["spec"]["containers"][0]["resources"]["limits"]


def test_a_second_run_registers_the_same_resources(runs: dict[str, ProgramRun]) -> None:
    """Nothing is created at import time or leaks between runs: re-running gives the same registrations."""
    again = run_program("sandbox")
    assert sorted(r.urn for r in again.registrations) == sorted(r.urn for r in runs["sandbox"].registrations)


def test_a_run_leaves_no_event_loop_open() -> None:
    """Pulumi's mock monitor makes an event loop in each executor thread and never closes it; left to the garbage
    collector at exit, one can be finalised after its socket and print a traceback (CI: ``exaserve render`` exiting
    2 with a ValueError from ``BaseEventLoop.__del__``). The run closes every loop it leaves behind: none is
    finalised open (asyncio warns "unclosed event loop" for each that is)."""
    gc.collect()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        run_program("dev")
        gc.collect()
    unclosed = [str(w.message) for w in caught if "unclosed event loop" in str(w.message)]
    assert unclosed == [], f"{len(unclosed)} event loop(s) left open by the run: {unclosed[:2]}"


def test_the_pulumi_entry_point_registers_what_the_package_program_does(runs: dict[str, ProgramRun]) -> None:
    """`pulumi up` runs infra/__main__.py (Pulumi.yaml `main: infra/`); render runs the package's function. Run the
    entry point as Pulumi's language host does (runpy) and compare every registration: the same program."""
    entry = run_program("dev", program_dir=REPO / "infra")

    def shape(run: ProgramRun) -> list[tuple[str, str, str, str, bool, str]]:
        return sorted((r.urn, r.type, r.parent, r.provider, r.custom, repr(r.inputs)) for r in run.registrations)

    assert shape(entry) == shape(runs["dev"])
    assert entry.stack_outputs() == runs["dev"].stack_outputs() != {}
