"""The rolling updater's own objects, rendered: its Role grants exactly what the Kubernetes backend calls, the network
policies admit its pods to exactly the ports it uses, and the routers' headless Service names both router ports.

No Kubernetes API server or CNI runs here. Two STAND-INS take their place, each stated where it is used: an RBAC
authorizer in front of the API-server stand-in of ``tests/test_rollout_backends.py`` (the real
``KubernetesBackend`` makes its real calls; each is allowed or answered 403 by the rendered Role, as the API server's
RBAC authorizer decides), and an evaluator of NetworkPolicy ingress semantics over the rendered policies.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from serving.kubeapi import KubeApi
from serving.plan.planner import fleet_replicas
from serving.pulumi.program import ProgramRun, RenderedObject, kubernetes_objects, run_program
from serving.render.k8s import gateway, runtime, updater
from serving.render.k8s.common import LABEL_NAME, SERVING_APP, UPDATER_APP
from serving.render.k8s.netpol import NAMESPACE_NAME_LABEL
from serving.rollout.backends import BackendError
from serving.rollout.backends.kubernetes import KubernetesBackend
from serving.rollout.plan import plan_batches
from serving.spec.schema import FleetSpec
from serving.spec.stack import load_stack
from tests.support.apiserver import AuthorizingApiServer, allowed, k8s_spec
from tests.support.k8s import of_kind, one, render_file
from tests.support.stacks import MULTI_NODE, fleet_of, spec_from, write_variant


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[RenderedObject]]:
    """The Pulumi program's objects: prod (one-GPU replicas) and a prod variant whose replicas span two nodes."""
    multi = write_variant(tmp_path_factory.mktemp("multi"), "multi", changes=MULTI_NODE)
    prod: ProgramRun = run_program("prod")
    return {"prod": kubernetes_objects(prod), "multi": render_file(multi)}


# ----------------------------------------------------------------------------------------- RBAC


def test_the_updater_role_is_exactly_the_backends_calls(runs: dict[str, list[RenderedObject]]) -> None:
    """Exact rules: a Role that grants one verb, resource or name more fails here."""
    spec = load_stack("prod").spec
    objects = runs["prod"]
    assert sorted((o.kind, o.name) for o in objects if o.component == "updater") == [
        ("Role", "exaserve-updater-rollout"),
        ("RoleBinding", "exaserve-updater-rollout"),
        ("ServiceAccount", "exaserve-updater"),
        ("ValidatingAdmissionPolicy", "exaserve-updater-release-only"),
        ("ValidatingAdmissionPolicyBinding", "exaserve-updater-release-only"),
    ]
    sizes = fleet_of(spec).plan.rollout_group_sizes
    assert sum(sizes) == 2048
    role = one(objects, "Role", "exaserve-updater-rollout")
    assert role["metadata"]["namespace"] == "exaserve"
    assert role["rules"] == [
        {
            "apiGroups": ["apps"],
            "resources": ["statefulsets"],
            "resourceNames": ["sglang-g0", "sglang-g1", "sglang-g2", "sglang-g3", "sglang-g4"],
            "verbs": ["get", "patch"],
        },
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        {
            "apiGroups": [""],
            "resources": ["pods"],
            "resourceNames": [f"sglang-g{g}-{i}" for g, n in enumerate(sizes) for i in range(n)],
            "verbs": ["patch", "delete"],
        },
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["exaserve-rollout-exaserve"],
            "verbs": ["get", "update"],
        },
    ]
    binding = one(objects, "RoleBinding", "exaserve-updater-rollout")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": UPDATER_APP, "namespace": "exaserve"}]
    assert one(objects, "ServiceAccount", UPDATER_APP)["metadata"]["namespace"] == "exaserve"


def test_a_multi_node_replicas_worker_pods_are_not_patchable(runs: dict[str, list[RenderedObject]]) -> None:
    role = one(runs["multi"], "Role", "exaserve-updater-rollout")
    lws = {o["metadata"]["name"]: o["spec"] for o in of_kind(runs["multi"], "LeaderWorkerSet")}
    assert {s["leaderWorkerTemplate"]["size"] for s in lws.values()} == {2}
    names = set(role["rules"][2]["resourceNames"])
    assert names == {f"{g}-{i}" for g, s in lws.items() for i in range(s["replicas"])}, "leader pods, all of them"
    assert not allowed(role["rules"], "patch", "", "pods", "sglang-g0-0-1"), "worker pod of replica 0"
    assert not allowed(role["rules"], "delete", "", "pods", "sglang-g0-0"), "LeaderWorkerSet replaces its own pods"
    assert role["rules"][0]["resources"] == ["leaderworkersets"]
    assert not allowed(role["rules"], "patch", "", "pods", "sglang-router-7d9f-abcde")
    assert allowed(role["rules"], "patch", "", "pods", "sglang-g0-0")


def _updater_role(spec: FleetSpec) -> dict[str, Any]:
    return one_object(updater.render(fleet_of(spec)), "Role")


def one_object(objects: Sequence[Mapping[str, Any]], kind: str) -> dict[str, Any]:
    found = [dict(o) for o in objects if o["kind"] == kind]
    assert len(found) == 1
    return found[0]


async def _a_batch_moved_and_readmitted(spec: FleetSpec, api: AuthorizingApiServer) -> dict[str, str | None]:
    """What the runner asks of the backend for one batch: read every replica's version, update the batch (patch,
    wait, hold the new pods out), take the batch's pods back in; the versions after."""
    every = [r.id for r in fleet_replicas(spec)]
    batch = list(plan_batches(fleet_of(spec).plan)[1].replicas)
    backend = KubernetesBackend(fleet_of(spec), KubeApi(api.url))
    try:
        await backend.versions(every)
        await backend.announce(True)  # the batch Lease, held while the batch is out (alert ExaServeWorkersUnhealthy)
        await backend.update(batch, "v2", timeout_s=10)
        for pod in (await backend.leader_pods(batch)).values():
            assert pod is not None
            await backend.admit(pod, admitted=True)
        await backend.announce(False)
        return await backend.versions(batch)
    finally:
        await backend.aclose()


@pytest.mark.parametrize("multi", [False, True], ids=["one-node-replicas", "two-node-replicas"])
def test_every_call_of_a_batch_is_allowed_and_every_grant_is_used(multi: bool) -> None:
    spec = k8s_spec(multi)
    role = _updater_role(spec)
    api = AuthorizingApiServer(spec, role)
    with api:
        after = asyncio.run(_a_batch_moved_and_readmitted(spec, api))
    assert set(after.values()) == {"v2"}
    denied = [d for d in api.decisions if not d[-1]]
    assert denied == []
    used = {(verb, resource) for verb, _, resource, _, _ in api.decisions}
    granted = {(verb, resource) for r in role["rules"] for resource in r["resources"] for verb in r["verbs"]}
    assert used == granted, "each verb the Role grants is one the backend uses"
    patched_pods = {name for verb, _, resource, name, _ in api.decisions if (verb, resource) == ("patch", "pods")}
    assert patched_pods and patched_pods <= set(updater.leader_pods(fleet_of(spec).plan))


def test_the_batch_lease_is_held_while_the_batch_is_out_and_given_up_after() -> None:
    """The updater announces a batch on its Lease (what alert ExaServeWorkersUnhealthy reads through
    kube-state-metrics' ``kube_lease_renew_time``): held by the updater with a current renewTime while the batch is
    out, then the holder cleared and renewTime the epoch (KSM then publishes 0: no longer fresh); a second announcement
    while another holder keeps it is refused, naming the holder."""
    spec = k8s_spec(False)
    api = AuthorizingApiServer(spec, _updater_role(spec))
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{spec.kubernetes.namespace}/leases/exaserve-rollout-exaserve"

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], str]:
        backend = KubernetesBackend(fleet_of(spec), KubeApi(api.url))
        try:
            await backend.announce(True)
            held = copy.deepcopy(api.objects[lease_path]["spec"])
            # renewals that ended (the Lease lost, an error no renewal mends) are no announcement: the next one
            # takes the Lease again
            assert backend._renewing is not None
            backend._renewing.cancel()
            await asyncio.gather(backend._renewing, return_exceptions=True)
            writes = len(api.lease_writes)
            await backend.announce(True)
            assert len(api.lease_writes) == writes + 1 and not backend._renewing.done()
            await backend.announce(False)
            released = copy.deepcopy(api.objects[lease_path]["spec"])
            # another updater (another identity) holds it now: this one is refused, naming it
            api.objects[lease_path]["spec"] |= {"holderIdentity": "someone-else", "leaseDurationSeconds": 60}
            try:
                await backend.announce(True)
            except BackendError as exc:
                return held, released, str(exc)
            return held, released, ""
        finally:
            await backend.aclose()

    with api:
        held, released, refused = asyncio.run(scenario())
    assert held["holderIdentity"] == "exaserve-updater/exaserve" and held["renewTime"] > "2026"
    assert released["holderIdentity"] == "" and released["renewTime"].startswith("1970-01-01T00:00:00")
    assert "held by 'someone-else', not this stack's updater" in refused, refused
    assert [d for d in api.decisions if not d[-1]] == []


def test_a_role_without_the_pod_patch_fails_the_update_naming_the_answer() -> None:
    """The authorizing stand-in really enforces: drop the pod-patch grant and the backend's first label change is
    refused with the API server's 403, which the backend reports with the path."""
    spec = k8s_spec(False)
    role = copy.deepcopy(_updater_role(spec))
    role["rules"] = [r for r in role["rules"] if "patch" not in r["verbs"] or r["resources"] != ["pods"]]
    api = AuthorizingApiServer(spec, role)
    with (
        api,
        pytest.raises(BackendError, match=r"PATCH /api/v1/namespaces/exaserve/pods/sglang-g1-\d+ answered 403"),
    ):
        asyncio.run(_a_batch_moved_and_readmitted(spec, api))


# ----------------------------------------------------------------------------------------- network policy


def _matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    if selector.get("matchExpressions"):
        raise NotImplementedError("the evaluator reads matchLabels only; extend it before rendering expressions")
    return dict(selector.get("matchLabels") or {}).items() <= dict(labels).items()


def admitted(
    policies: Sequence[Mapping[str, Any]],
    namespaces: Mapping[str, Mapping[str, str]],
    source: tuple[str, Mapping[str, str]],
    dest: tuple[str, Mapping[str, str]],
    port: int,
) -> bool:
    """STAND-IN for a CNI enforcing NetworkPolicy ingress: ``source`` (namespace, pod labels) reaches ``dest`` on TCP
    ``port`` when no Ingress policy selects ``dest``, or one rule of a policy that selects it admits both."""
    src_ns, src_labels = source
    dst_ns, dst_labels = dest
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == dst_ns
        and "Ingress" in p["spec"]["policyTypes"]
        and _matches(p["spec"]["podSelector"], dst_labels)
    ]

    def peer(p: Mapping[str, Any], policy_ns: str) -> bool:
        if "ipBlock" in p:
            raise NotImplementedError("ipBlock peers are not rendered")
        in_ns = (
            _matches(p["namespaceSelector"], namespaces[src_ns]) if "namespaceSelector" in p else src_ns == policy_ns
        )
        return in_ns and _matches(p.get("podSelector") or {}, src_labels)

    def port_ok(p: Mapping[str, Any]) -> bool:
        if "endPort" in p or not isinstance(p.get("port"), int):
            raise NotImplementedError(f"port {p}: the evaluator reads single numeric ports")
        return bool(p.get("protocol", "TCP") == "TCP" and p["port"] == port)

    return not selecting or any(
        (not rule.get("from") or any(peer(f, pol["metadata"]["namespace"]) for f in rule["from"]))
        and (not rule.get("ports") or any(port_ok(p) for p in rule["ports"]))
        for pol in selecting
        for rule in pol["spec"]["ingress"]
    )


def _pod_labels(objects: list[RenderedObject]) -> dict[str, dict[str, str]]:
    """Pod labels by app name, from the rendered pod templates (LeaderWorkerSets: leader and worker templates)."""
    templates = [
        t
        for kind in ("Deployment", "DaemonSet", "StatefulSet")
        for d in of_kind(objects, kind)
        for t in [d["spec"]["template"]]
    ]
    for lws in of_kind(objects, "LeaderWorkerSet"):
        templates += [t for k, t in lws["spec"]["leaderWorkerTemplate"].items() if k.endswith("Template")]
    return {t["metadata"]["labels"][LABEL_NAME]: t["metadata"]["labels"] for t in templates}


@pytest.mark.parametrize("stack", ["prod", "multi"])
def test_the_updater_reaches_exactly_the_workers_serving_port_and_the_routers_api_and_metrics(
    runs: dict[str, list[RenderedObject]], stack: str
) -> None:
    objects = runs[stack]
    spec = load_stack("prod").spec
    ns = spec.kubernetes.namespace
    policies = of_kind(objects, "NetworkPolicy")
    namespace_labels = one(objects, "Namespace", ns)["metadata"]["labels"]
    namespaces = {
        ns: {**namespace_labels, NAMESPACE_NAME_LABEL: ns},
        "monitoring": {NAMESPACE_NAME_LABEL: "monitoring"},
        "tenant": {NAMESPACE_NAME_LABEL: "tenant"},
    }
    pods = _pod_labels(objects)
    router = gateway.cluster_router(fleet_of(spec))
    http, metrics = router.port, router.metrics_port
    candidates = {spec.serving.port, http, metrics, spec.runtime.controller_port, 5000, 29500, 40000}
    candidates |= {p["port"] for pol in policies for r in pol["spec"]["ingress"] for p in r.get("ports", [])}

    def ports(source: tuple[str, Mapping[str, str]], app: str) -> set[int]:
        return {port for port in candidates if admitted(policies, namespaces, source, (ns, pods[app]), port)}

    updater_pod = (ns, {LABEL_NAME: UPDATER_APP})
    assert ports(updater_pod, SERVING_APP) == {spec.serving.port}
    assert ports(updater_pod, gateway.NAME) == {http, metrics}
    assert ports(updater_pod, runtime.CONTROLLER) == set()
    assert ports(updater_pod, runtime.AGENT) == set()
    # the label admits only in the serving namespace, and the metrics port is not open to any pod there
    assert ports(("tenant", {LABEL_NAME: UPDATER_APP}), SERVING_APP) == set()
    assert ports(("tenant", {LABEL_NAME: UPDATER_APP}), gateway.NAME) == {http}
    assert ports((ns, {LABEL_NAME: "something-else"}), gateway.NAME) == {http}
    assert ports(("monitoring", {}), gateway.NAME) == {http, metrics}


# ----------------------------------------------------------------------------------------- the routers' Services


def test_the_routers_headless_service_names_the_api_and_metrics_ports(runs: dict[str, list[RenderedObject]]) -> None:
    objects = runs["prod"]
    spec = load_stack("prod").spec
    router = gateway.cluster_router(fleet_of(spec))
    http, metrics = router.port, router.metrics_port
    headless = one(objects, "Service", gateway.PODS_SERVICE)["spec"]
    assert headless["clusterIP"] == "None"
    assert headless["selector"] == {LABEL_NAME: gateway.NAME}
    assert {p["name"]: (p["port"], p["targetPort"]) for p in headless["ports"]} == {
        "http": (http, "http"),
        "metrics": (metrics, "metrics"),
    }
    container = one(objects, "Deployment", gateway.NAME)["spec"]["template"]["spec"]["containers"][0]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": http, "metrics": metrics}


@pytest.mark.parametrize(("heartbeat_s", "drain_s", "pre_stop_s"), [(5, 120, 30), (0.5, 30, 30), (40, 60, 40)])
def test_a_router_pod_keeps_serving_until_its_endpoints_are_gone_then_drains(
    heartbeat_s: float, drain_s: float, pre_stop_s: int
) -> None:
    """Issue 25: the routers had no preStop, so SIGTERM came while kube-proxy and resolvers still sent them requests.
    The kubelet's sleep holds a deleted router the 30 s kubeadm's CoreDNS may keep answering with its address (or a
    heartbeat, if longer); the grace period counts that sleep, the router's drain (--shutdown-grace-period-secs) and
    the kubelet's 2 s stop window."""
    spec = spec_from("prod", serving__heartbeat_interval_s=heartbeat_s, rollout__drain_timeout_s=drain_s)
    [deployment] = [o for o in gateway.render(fleet_of(spec)) if o["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["lifecycle"] == {"preStop": {"sleep": {"seconds": pre_stop_s}}}
    flags = container["command"]
    assert flags[flags.index("--shutdown-grace-period-secs") + 1] == str(drain_s)
    assert pod["terminationGracePeriodSeconds"] == pre_stop_s + drain_s + 2


def test_each_service_monitor_scrapes_one_service(runs: dict[str, list[RenderedObject]]) -> None:
    """The headless Service carries the metrics port too, but its own name label: a monitor that also selected it
    would scrape every router twice and double every sum of router series."""
    objects = runs["prod"]
    services = of_kind(objects, "Service")
    for monitor in of_kind(objects, "ServiceMonitor"):
        port_names = {e["port"] for e in monitor["spec"]["endpoints"]}
        scraped = [
            s["metadata"]["name"]
            for s in services
            if _matches(monitor["spec"]["selector"], s["metadata"]["labels"])
            and port_names & {p.get("name") for p in s["spec"]["ports"]}
        ]
        assert len(scraped) == 1, f"ServiceMonitor {monitor['metadata']['name']} scrapes {scraped}"
