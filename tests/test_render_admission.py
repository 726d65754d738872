"""Issue 25, finding 5: the updater's ValidatingAdmissionPolicy, its CEL run by a real CEL evaluator (cel-python).

No API server runs here, so the admission step around the CEL is a STAND-IN (:func:`admit`), written from the
upstream plugin (docs/k8s-semantics.md, "ValidatingAdmissionPolicy"): every ``matchConditions`` expression true
(else the policy does not apply), then every ``validations`` expression true (else, with ``validationActions:
[Deny]``, the request is refused), with ``object``, ``oldObject`` and ``request`` bound as the API server binds them.
cel-python is kinder than the API server in one way: it reads a typed object as a map, where the API server
type-checks each field against the schema; two fidelity tests below check every compared and every selected field
against the pinned OpenAPI schemas and the LWS CRD instead.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from functools import cache
from typing import Any

import celpy
import pytest
from kubernetes_validate import utils as kv

from serving.checks.policy.stack import updater_admission_policy
from serving.plan.model import Fleet
from serving.pulumi.validate import CrdCatalog, Validator
from serving.render.k8s import admission, updater
from serving.render.k8s.common import LABEL_ADMITTED, LABEL_VERSION, UPDATER_APP, image
from serving.rollout.backends.kubernetes import version_patch, workload
from tests.support.apiserver import merge_patch, serving_pod
from tests.support.k8s import crd_dir
from tests.support.stacks import MULTI_NODE, fleet_of, spec_from

Obj = dict[str, Any]
RELEASES = {"v1": "lmsysorg/sglang:v0.5.4", "v2": "lmsysorg/sglang:v0.5.5"}


@cache
def _fleet(multi: bool) -> Fleet:
    changes = {k.replace(".", "__"): v for k, v in (MULTI_NODE if multi else {}).items()}
    return fleet_of(spec_from("prod", serving__releases=RELEASES, serving__version="v1", **changes))


@pytest.fixture(scope="module", params=[False, True], ids=["statefulset", "leaderworkerset"])
def fleet(request: pytest.FixtureRequest) -> Fleet:
    return _fleet(request.param)


_RENDERED: dict[int, tuple[Obj, Obj, Obj]] = {}  # by id: a Fleet is not hashable; _fleet keeps each one alive


def _rendered(fleet: Fleet) -> tuple[Obj, Obj, Obj]:
    """(policy, group 0's workload, the same after the backend's own patch to v2): one render of the fleet each."""
    if id(fleet) not in _RENDERED:
        (vap,) = [o for o in updater.render(fleet) if o["kind"] == "ValidatingAdmissionPolicy"]
        old = workload(fleet, 0)
        _RENDERED[id(fleet)] = (vap, old, merge_patch(old, version_patch(fleet, 0, "v2")))
    return _RENDERED[id(fleet)]


def _policy(fleet: Fleet) -> Obj:
    return copy.deepcopy(_rendered(fleet)[0])


def _old(fleet: Fleet) -> Obj:
    return copy.deepcopy(_rendered(fleet)[1])


def _patched(fleet: Fleet) -> Obj:
    """Group 0's workload after the release patch; a deep copy (merge_patch shares untouched subtrees with the old)."""
    return copy.deepcopy(_rendered(fleet)[2])


def admit(vap: Obj, old: Obj | None, new: Obj, *, resource: str, username: str, operation: str = "UPDATE") -> list[str]:
    """The messages of the validations that refuse ``old`` → ``new`` (empty: admitted). STAND-IN (module doc); on
    CREATE ``oldObject`` is null, as the API server binds it."""
    env = celpy.Environment()
    activation = {
        "object": celpy.json_to_cel(new),
        "oldObject": celpy.json_to_cel(old),
        "request": celpy.json_to_cel(
            {"operation": operation, "resource": {"resource": resource}, "userInfo": {"username": username}}
        ),
    }

    def holds(expression: str) -> bool:
        result = env.program(env.compile(expression)).evaluate(activation)
        assert isinstance(result, celpy.celtypes.BoolType), f"{expression[:80]}… gave {result!r}, not a bool"
        return bool(result)

    if not all(holds(c["expression"]) for c in vap["spec"]["matchConditions"]):
        return []
    return [v["message"] for v in vap["spec"]["validations"] if not holds(v["expression"])]


def _updater(fleet: Fleet) -> str:
    return f"system:serviceaccount:{fleet.spec.kubernetes.namespace}:{UPDATER_APP}"


def _resource(obj: Obj) -> str:
    return f"{obj['kind'].lower()}s"


def _templates(obj: Obj) -> list[Obj]:
    spec = obj["spec"]
    if "template" in spec:
        return [spec["template"]]
    lwt = spec["leaderWorkerTemplate"]
    return [t for t in (lwt.get("leaderTemplate"), lwt["workerTemplate"]) if t is not None]


def test_the_updaters_own_release_patch_is_admitted(fleet: Fleet) -> None:
    """The real patch of the Kubernetes backend (version_patch), applied as the API server applies a merge patch:
    images, EXASERVE_RELEASE and the version labels change, and the policy admits it."""
    old, new = _old(fleet), _patched(fleet)
    assert new != old and serving_pod(new)["spec"]["containers"][0]["image"] == image(fleet.spec, RELEASES["v2"])
    assert admit(_policy(fleet), old, new, resource=_resource(old), username=_updater(fleet)) == []


def _host_path(t: Obj) -> None:
    t["spec"]["volumes"].append({"name": "root", "hostPath": {"path": "/"}})


def _privileged(t: Obj) -> None:
    t["spec"]["containers"][0]["securityContext"] = {"privileged": True}


def _command(t: Obj) -> None:
    t["spec"]["containers"][0]["command"] = ["sh", "-c", "cat /etc/shadow"]


def _new_container(t: Obj) -> None:
    t["spec"]["containers"].append({"name": "sidecar", "image": "busybox"})


def _renamed_container(t: Obj) -> None:
    t["spec"]["containers"][0]["name"] = "other"


def _new_init_container(t: Obj) -> None:
    t["spec"]["initContainers"].append({"name": "pre", "image": "busybox"})


def _host_network(t: Obj) -> None:
    t["spec"]["hostNetwork"] = True


def _release_from_secret(t: Obj) -> None:
    env = t["spec"]["containers"][0]["env"]
    (release,) = [e for e in env if e["name"] == admission.RELEASE_ENV]
    release.pop("value")
    release["valueFrom"] = {"secretKeyRef": {"name": "hf-token", "key": "token"}}


def _other_env(t: Obj) -> None:
    t["spec"]["containers"][0]["env"].append({"name": "LD_PRELOAD", "value": "/tmp/x.so"})


def _other_label(t: Obj) -> None:
    t["metadata"]["labels"]["app.kubernetes.io/name"] = "elsewhere"


def _service_account(t: Obj) -> None:
    t["spec"]["serviceAccountName"] = "default"


REFUSED: dict[str, Callable[[Obj], None]] = {
    "hostPath volume": _host_path,
    "privileged": _privileged,
    "command change": _command,
    "new container": _new_container,
    "renamed container": _renamed_container,
    "new init container": _new_init_container,
    "hostNetwork": _host_network,
    "EXASERVE_RELEASE from a secret": _release_from_secret,
    "another env var": _other_env,
    "a template label other than the version": _other_label,
    "serviceAccountName": _service_account,
}


@pytest.mark.parametrize("mutation", REFUSED.values(), ids=REFUSED.keys())
def test_a_template_change_beyond_the_release_is_refused(fleet: Fleet, mutation: Callable[[Obj], None]) -> None:
    """Each mutation, on top of the legitimate release patch, in every pod template of the workload: refused. The
    same change made by another user is not the policy's business (matchConditions)."""
    old, new = _old(fleet), _patched(fleet)
    for i in range(len(_templates(new))):
        changed = copy.deepcopy(new)
        mutation(_templates(changed)[i])
        vap = _policy(fleet)
        refused = admit(vap, old, changed, resource=_resource(old), username=_updater(fleet))
        assert refused == [vap["spec"]["validations"][0]["message"]]
        assert admit(vap, old, changed, resource=_resource(old), username="system:admin") == []


WORKLOAD_REFUSED: dict[str, Callable[[Obj], None]] = {
    "replicas": lambda o: o["spec"].update(replicas=o["spec"]["replicas"] + 1),
    "workload label": lambda o: o["metadata"]["labels"].update({"exaserve.io/group": "7"}),
    "workload label removed": lambda o: o["metadata"]["labels"].pop("exaserve.io/group"),
    "workload annotation": lambda o: o["metadata"].setdefault("annotations", {}).update(x="y"),
    # Issue 40: the workload's own finalizers and owners were not compared (a finalizer pins it against deletion,
    # an owner hands it to another object's garbage collection)
    "workload finalizer": lambda o: o["metadata"].setdefault("finalizers", []).append("example.com/hold"),
    "workload owner": lambda o: o["metadata"].update(
        ownerReferences=[{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "0"}]
    ),
}


@pytest.mark.parametrize("mutation", WORKLOAD_REFUSED.values(), ids=WORKLOAD_REFUSED.keys())
def test_a_workload_change_beyond_the_release_is_refused(fleet: Fleet, mutation: Callable[[Obj], None]) -> None:
    old, new = _old(fleet), _patched(fleet)
    mutation(new)
    assert admit(_policy(fleet), old, new, resource=_resource(old), username=_updater(fleet)) != []


def test_a_leaderworkerset_goes_through_0_and_back_to_its_rendered_count_and_nowhere_else(fleet: Fleet) -> None:
    """The updater replaces a multi-node group by scaling it through 0 with the new template (issue 40, item 4): the
    policy admits replicas 0 (with the release patch, as the backend sends them together) and the rendered count
    back, and nothing else; a StatefulSet's replicas stay as rendered."""
    old, new = _old(fleet), _patched(fleet)
    vap, user, resource = _policy(fleet), _updater(fleet), _resource(old)
    count = old["spec"]["replicas"]
    zero = copy.deepcopy(new)
    zero["spec"]["replicas"] = 0
    back = copy.deepcopy(zero)
    back["spec"]["replicas"] = count
    other = copy.deepcopy(zero)
    other["spec"]["replicas"] = count + 5
    if old["kind"] == "LeaderWorkerSet":
        assert admit(vap, old, zero, resource=resource, username=user) == []
        assert admit(vap, zero, back, resource=resource, username=user) == []
        assert admit(vap, zero, other, resource=resource, username=user) != []
        renamed = copy.deepcopy(back)
        renamed["metadata"]["name"] = "sglang-g99"  # not a rendered group: no count to go back to
        assert admit(vap, zero, renamed, resource=resource, username=user) != []
    else:
        assert admit(vap, old, zero, resource=resource, username=user) != []


def _pod(fleet: Fleet) -> Obj:
    template = serving_pod(_old(fleet))
    return {"apiVersion": "v1", "kind": "Pod", **copy.deepcopy(template)}


def test_a_pod_may_change_only_its_admitted_label(fleet: Fleet) -> None:
    """The backend's admit() patch passes; a pod's image (mutable in place) or any other label does not."""
    old = _pod(fleet)
    vap, user = _policy(fleet), _updater(fleet)
    admitted = merge_patch(old, {"metadata": {"labels": {LABEL_ADMITTED: "false"}}})
    assert admit(vap, old, admitted, resource="pods", username=user) == []
    image = copy.deepcopy(old)
    image["spec"]["containers"][0]["image"] = "evil/root:latest"
    relabel = merge_patch(old, {"metadata": {"labels": {LABEL_VERSION: "v2"}}})
    for new in (image, relabel):
        assert admit(vap, old, new, resource="pods", username=user) == [vap["spec"]["validations"][1]["message"]]


def test_the_policy_matches_only_the_updater_and_its_namespace(fleet: Fleet) -> None:
    vap, binding = updater.render(fleet)[-2:]
    (condition,) = vap["spec"]["matchConditions"]
    assert _updater(fleet) in condition["expression"]
    assert binding["spec"]["policyName"] == vap["metadata"]["name"] and binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": fleet.spec.kubernetes.namespace
    }
    (rule,) = [r for r in vap["spec"]["matchConstraints"]["resourceRules"] if "pods" not in r["resources"]]
    assert rule["resources"] == [_resource(_old(fleet))] and rule["operations"] == ["UPDATE"]
    assert vap["spec"]["failurePolicy"] == "Fail"


def test_the_policy_and_binding_validate_against_the_pinned_schemas(fleet: Fleet) -> None:
    validator = Validator(fleet.spec.kubernetes.version, crd_dir())
    objects = admission.render(fleet)
    assert [o["kind"] for o in objects] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    assert validator.validate_all(objects) == []
    assert validator.unvalidated == []
    for obj in objects:  # both kinds have a strict schema: an unknown field fails
        broken = copy.deepcopy(obj)
        broken["spec"]["bogusField"] = 1
        assert validator.problems(broken) != []


def _properties(definition: str, k8s_version: str) -> set[str]:
    defs = kv.schema_contents(f"kubernetes-json-schema/v{k8s_version}-local-strict/_definitions.json", k8s_version)
    return set(defs["$defs"][definition]["properties"])


def test_the_compared_fields_are_every_schema_field_but_the_allowed_ones() -> None:
    """Fidelity: the field lists the CEL compares are the pinned OpenAPI schemas' (and the LWS CRD's) properties less
    exactly the ones the release may change, so a field the schema has and the policy forgets fails here."""
    version = Validator(_fleet(False).spec.kubernetes.version, None).k8s_version
    core, apps = "io.k8s.api.core.v1", "io.k8s.api.apps.v1"
    assert set(admission.CONTAINER_FIELDS) == _properties(f"{core}.Container", version) - {"image", "env"}
    assert set(admission.POD_SPEC_FIELDS) == _properties(f"{core}.PodSpec", version) - {"containers", "initContainers"}
    sts = admission.WORKLOAD_SPEC_FIELDS["StatefulSet"]
    assert set(sts) == _properties(f"{apps}.StatefulSetSpec", version) - {"template"}
    lws = CrdCatalog(crd_dir()).schema("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
    assert lws is not None
    spec = lws["properties"]["spec"]["properties"]
    assert set(admission.WORKLOAD_SPEC_FIELDS["LeaderWorkerSet"]) == set(spec) - {"leaderWorkerTemplate", "replicas"}
    lwt = spec["leaderWorkerTemplate"]["properties"]
    assert set(admission.LWS_TEMPLATE_FIELDS) == set(lwt) - {"leaderTemplate", "workerTemplate"}


def _stack(fleet: Fleet, objects: list[Obj]) -> list[tuple[str, Obj]]:
    return [(f"kubernetes:x:{o['kind']}", o) for o in objects]


def test_the_guard_demands_the_policy_whenever_the_updater_may_patch() -> None:
    """Failing examples: the updater's Role without the policy, without the binding, and with a weakened policy."""
    fleet = _fleet(False)
    objects = updater.render(fleet)
    assert updater_admission_policy(_stack(fleet, objects), fleet) == []
    without = [o for o in objects if o["kind"] != "ValidatingAdmissionPolicy"]
    unbound = [o for o in objects if o["kind"] != "ValidatingAdmissionPolicyBinding"]
    weakened = copy.deepcopy(objects)
    weakened[-2]["spec"]["validations"][0]["expression"] = "true"
    for stack, said in ((without, "no ValidatingAdmissionPolicy"), (unbound, "no ValidatingAdmissionPolicyBinding")):
        (found,) = updater_admission_policy(_stack(fleet, stack), fleet)
        assert said in found.observed and "Role" in found.observed
    (found,) = updater_admission_policy(_stack(fleet, weakened), fleet)
    assert "differs from its render" in found.observed
    read_only = [o for o in without if o["kind"] != "Role"]
    assert updater_admission_policy(_stack(fleet, read_only), fleet) == []


def test_every_field_the_cel_selects_exists_in_the_schemas(fleet: Fleet) -> None:
    """Fidelity: cel-python reads any name off a map and returns an error only when it is absent at run time, while
    the API server type-checks each field selection against the schema. So every ``.name`` the policy selects (on
    ``object``/``oldObject``, beyond the request's own ``resource``/``userInfo.username``/``operation``) must be a property of the
    pinned schemas it walks: a misspelt field fails here instead of being refused by the API server at ``up``."""
    version = Validator(fleet.spec.kubernetes.version, None).k8s_version
    known: set[str] = set()
    for definition in (
        "io.k8s.api.apps.v1.StatefulSet",
        "io.k8s.api.apps.v1.StatefulSetSpec",
        "io.k8s.api.core.v1.Pod",
        "io.k8s.api.core.v1.PodTemplateSpec",
        "io.k8s.api.core.v1.PodSpec",
        "io.k8s.api.core.v1.Container",
        "io.k8s.api.core.v1.EnvVar",
        "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
    ):
        known |= _properties(definition, version)
    lws = CrdCatalog(crd_dir()).schema("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
    assert lws is not None
    known |= set(lws["properties"]["spec"]["properties"])
    known |= set(lws["properties"]["spec"]["properties"]["leaderWorkerTemplate"]["properties"])
    vap = _policy(fleet)
    expressions = [c["expression"] for c in vap["spec"]["matchConditions"]]
    expressions += [v["expression"] for v in vap["spec"]["validations"]]
    selected: set[str] = set()
    for expression in expressions:
        bare = re.sub(r"'[^']*'", "''", expression)  # string literals ('exaserve.io/version') select nothing
        for attribute in ("request.resource.resource", "request.userInfo.username", "request.operation"):
            bare = bare.replace(attribute, "")  # the admission request's own attributes, not the object's
        selected |= set(re.findall(r"\.([A-Za-z_]\w*)\b(?!\s*\()", bare))  # not a method call (.all(, .size()
    assert selected and selected - known == set()


# ------------------------------------------------------------------------------------------ issue 40


def test_a_pods_finalizers_and_owners_are_not_the_updaters() -> None:
    """Issue 40: the pod validation compared labels, annotations and the spec, not the top-level finalizers and
    ownerReferences: the updater could orphan a pod from its StatefulSet or pin it with a finalizer."""
    fleet = _fleet(False)
    old, vap, user = _pod(fleet), _policy(fleet), _updater(fleet)
    orphan = merge_patch(
        old, {"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "x", "uid": "0"}]}}
    )
    pinned = merge_patch(old, {"metadata": {"finalizers": ["example.com/hold"]}})
    for new in (orphan, pinned):
        assert admit(vap, old, new, resource="pods", username=user) == [vap["spec"]["validations"][1]["message"]]


def _serving(template: Obj) -> Obj:
    (container,) = [c for c in template["spec"]["containers"] if c["name"] == "sglang"]
    return container


IMAGE_REFUSED: dict[str, Callable[[Obj], None]] = {
    "serving image from another registry": lambda t: _serving(t).update(image="evil.example/sglang:v0.5.5"),
    "serving image of no release": lambda t: _serving(t).update(image="lmsysorg/sglang:v0.0.1"),
    "cache wait image of no release": lambda t: t["spec"]["initContainers"][0].update(image="busybox:1.36"),
}


@pytest.mark.parametrize("mutation", IMAGE_REFUSED.values(), ids=IMAGE_REFUSED.keys())
def test_an_image_outside_the_stacks_releases_is_refused(fleet: Fleet, mutation: Callable[[Obj], None]) -> None:
    """Issue 40: the release patch's images were unconstrained (any registry, any tag); now an image the updater
    sets is one of serving.releases' pinned references (through the stack's mirror), as rendered into the policy."""
    old, new = _old(fleet), _patched(fleet)
    vap = _policy(fleet)
    for i in range(len(_templates(new))):
        changed = copy.deepcopy(new)
        mutation(_templates(changed)[i])
        refused = admit(vap, old, changed, resource=_resource(old), username=_updater(fleet))
        assert refused == [vap["spec"]["validations"][0]["message"]]
    allowed = [image(fleet.spec, ref) for ref in fleet.spec.serving.releases.values()]
    assert all(f"'{ref}'" in vap["spec"]["validations"][0]["expression"] for ref in allowed)


def test_a_rollback_to_any_release_is_admitted(fleet: Fleet) -> None:
    """v2 → v1 (an image of the list that the workload ran before) is as admitted as v1 → v2."""
    old, new = _old(fleet), _patched(fleet)
    assert admit(_policy(fleet), new, old, resource=_resource(old), username=_updater(fleet)) == []


def test_the_updater_creates_no_pod_and_adds_no_ephemeral_container() -> None:
    """Issue 40: the policy matched only UPDATE of pods. In a privileged namespace a pod the updater creates (a
    hostPath, a privileged container) is root on its node, and an ephemeral container is a new process in a serving
    pod: the policy now matches CREATE of pods and the ephemeralcontainers subresource, and refuses both (RBAC
    grants neither: guard rbac-allowlist)."""
    fleet = _fleet(False)
    vap, user = _policy(fleet), _updater(fleet)
    (pods,) = [r for r in vap["spec"]["matchConstraints"]["resourceRules"] if "pods" in r["resources"]]
    assert set(pods["resources"]) == {"pods", "pods/ephemeralcontainers"}
    assert set(pods["operations"]) == {"CREATE", "UPDATE"}
    created = _pod(fleet)
    refused = admit(vap, None, created, resource="pods", username=user, operation="CREATE")
    assert refused == [vap["spec"]["validations"][1]["message"]]
    old = _pod(fleet)
    debug = copy.deepcopy(old)
    debug["spec"]["ephemeralContainers"] = [{"name": "debug", "image": "busybox:1.36", "targetContainerName": "sglang"}]
    assert admit(vap, old, debug, resource="pods", username=user) == [vap["spec"]["validations"][1]["message"]]
