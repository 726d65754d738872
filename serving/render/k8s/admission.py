"""What the rolling updater may change, enforced at admission: a ValidatingAdmissionPolicy and its binding.

The updater's Role (:mod:`serving.render.k8s.updater`) lets it ``patch`` the update groups' workloads and the
replicas' serving pods. RBAC cannot narrow a patch to fields, and the namespace is labelled ``privileged``, so
``patch`` alone would let it rewrite a pod template (a hostPath volume, a privileged container, another command):
root on every GPU node. CrossGuard (:mod:`serving.checks.policy`) runs at ``pulumi up``, not at admission. This
policy (``admissionregistration.k8s.io/v1``, GA since Kubernetes 1.30) closes that at the API server: for requests
of the updater's service account only (``matchConditions``), an ``UPDATE`` of a group's workload may change exactly
what :func:`serving.rollout.backends.kubernetes.version_patch` changes between two releases, comparing ``object``
with ``oldObject``:

* every container's and init container's ``image``, to one of the stack's releases (``serving.releases``' pinned
  references, through the stack's mirror: :func:`release_images`, rendered into the CEL as a list);
* the value of the serving container's ``EXASERVE_RELEASE`` (a plain value, never ``valueFrom``);
* the version label :data:`~serving.render.k8s.common.LABEL_VERSION`, on the workload and its pod template(s);
* a LeaderWorkerSet's ``spec.replicas``, to 0 or to its rendered count only: the updater replaces a multi-node group
  by scaling it through 0 (:meth:`serving.rollout.backends.kubernetes.KubernetesBackend._through_zero`);

never the workload's annotations, finalizers or ownerReferences; an ``UPDATE`` of a pod may change only its
:data:`~serving.render.k8s.common.LABEL_ADMITTED` label (not its finalizers, owners or spec, ephemeral containers
included: the ``pods/ephemeralcontainers`` subresource is matched too), and a ``CREATE`` of a pod is refused.

The comparison is field by field (Kubernetes' CEL cannot iterate a typed object's fields): the field lists below
are the schemas' properties less the ones allowed to change, and ``tests/test_render_admission.py`` derives them
from the pinned OpenAPI schemas and CRD, so a field a newer schema adds fails that test rather than slipping past.
Semantics and upstream lines: docs/k8s-semantics.md ("ValidatingAdmissionPolicy").
"""

from __future__ import annotations

from collections.abc import Mapping

from serving.plan.model import Fleet
from serving.render.k8s.common import LABEL_ADMITTED, LABEL_VERSION, UPDATER_APP, K8sObject, image, labels
from serving.render.k8s.fleet import group_name, workload_kind
from serving.render.k8s.netpol import NAMESPACE_NAME_LABEL

COMPONENT = "rollout"
API_VERSION = "admissionregistration.k8s.io/v1"
POLICY = f"{UPDATER_APP}-release-only"
RELEASE_ENV = "EXASERVE_RELEASE"

# io.k8s.api.core.v1.Container's properties less ``image`` and ``env`` (compared on their own).
CONTAINER_FIELDS = (
    "args",
    "command",
    "envFrom",
    "imagePullPolicy",
    "lifecycle",
    "livenessProbe",
    "name",
    "ports",
    "readinessProbe",
    "resizePolicy",
    "resources",
    "restartPolicy",
    "securityContext",
    "startupProbe",
    "stdin",
    "stdinOnce",
    "terminationMessagePath",
    "terminationMessagePolicy",
    "tty",
    "volumeDevices",
    "volumeMounts",
    "workingDir",
)
# io.k8s.api.core.v1.PodSpec's properties less ``containers`` and ``initContainers`` (compared container by container).
POD_SPEC_FIELDS = (
    "activeDeadlineSeconds",
    "affinity",
    "automountServiceAccountToken",
    "dnsConfig",
    "dnsPolicy",
    "enableServiceLinks",
    "ephemeralContainers",
    "hostAliases",
    "hostIPC",
    "hostNetwork",
    "hostPID",
    "hostUsers",
    "hostname",
    "imagePullSecrets",
    "nodeName",
    "nodeSelector",
    "os",
    "overhead",
    "preemptionPolicy",
    "priority",
    "priorityClassName",
    "readinessGates",
    "resourceClaims",
    "resources",
    "restartPolicy",
    "runtimeClassName",
    "schedulerName",
    "schedulingGates",
    "securityContext",
    "serviceAccount",
    "serviceAccountName",
    "setHostnameAsFQDN",
    "shareProcessNamespace",
    "subdomain",
    "terminationGracePeriodSeconds",
    "tolerations",
    "topologySpreadConstraints",
    "volumes",
)
# io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta's fields a pod template's metadata may carry, less ``labels``.
TEMPLATE_META_FIELDS = ("annotations", "finalizers", "name", "namespace", "ownerReferences")
# The top-level ObjectMeta fields of a workload or pod the updater may never change (beside ``labels``, compared but
# for one key): the API server sets the rest (resourceVersion, generation, managedFields, …) or they are immutable.
OBJECT_META_FIELDS = ("annotations", "finalizers", "ownerReferences")
# Per workload kind: the spec's fields compared whole, and the fields holding pod templates.
WORKLOAD_SPEC_FIELDS = {
    # io.k8s.api.apps.v1.StatefulSetSpec less ``template``
    "StatefulSet": (
        "minReadySeconds",
        "ordinals",
        "persistentVolumeClaimRetentionPolicy",
        "podManagementPolicy",
        "replicas",
        "revisionHistoryLimit",
        "selector",
        "serviceName",
        "updateStrategy",
        "volumeClaimTemplates",
    ),
    # the LeaderWorkerSet CRD's spec less ``leaderWorkerTemplate`` and ``replicas`` (0 or the rendered count)
    "LeaderWorkerSet": ("networkConfig", "rolloutStrategy", "startupPolicy"),
}
# the LeaderWorkerSet CRD's spec.leaderWorkerTemplate less its two pod templates
LWS_TEMPLATE_FIELDS = (
    "persistentVolumeClaimRetentionPolicy",
    "restartPolicy",
    "size",
    "subGroupPolicy",
    "volumeClaimTemplates",
)


def _same(a: str, b: str, field: str) -> str:
    """CEL: ``field`` is absent from both or equal in both (an absent field is an error to read, so ``has`` first)."""
    return f"(has({a}.{field}) == has({b}.{field}) && (!has({a}.{field}) || {a}.{field} == {b}.{field}))"


def _all_same(a: str, b: str, fields: tuple[str, ...]) -> str:
    return " && ".join(_same(a, b, f) for f in fields)


def _labels_same_except(a: str, b: str, key: str) -> str:
    """CEL: the label maps at ``a`` and ``b`` differ at most in ``key``. Both must be present (every object the
    policy matches is rendered with labels; no empty-map literal, whose type a ternary with the labels'
    map(string, string) would have to unify)."""
    na, nb = f"{a}.labels", f"{b}.labels"
    return (
        f"(has({na}) && has({nb}) && {na}.all(k, k == '{key}' || (k in {nb} && {na}[k] == {nb}[k]))"
        f" && {nb}.all(k, k == '{key}' || k in {na}))"
    )


def _env_same(c: str, o: str) -> str:
    """CEL: container ``c``'s env is ``o``'s but for the value of :data:`RELEASE_ENV`, which stays a plain value."""
    other = f"filter(e, e.name != '{RELEASE_ENV}')"
    return (
        f"has({c}.env) == has({o}.env) && (!has({c}.env) || ({c}.env.{other} == {o}.env.{other}"
        f" && {c}.env.filter(e, e.name == '{RELEASE_ENV}').size() == {o}.env.filter(e, e.name == '{RELEASE_ENV}')"
        f".size() && {c}.env.all(e, e.name != '{RELEASE_ENV}' || !has(e.valueFrom))))"
    )


def _literal(value: str) -> str:
    """A CEL string literal (single-quoted); a value needing escapes is refused, never rendered half-quoted."""
    if any(ch in value for ch in "'\\\n\r"):
        raise ValueError(f"{value!r} cannot be a plain CEL string literal")
    return f"'{value}'"


def _image_allowed(c: str, o: str, images: tuple[str, ...]) -> str:
    """CEL: container ``c`` keeps ``o``'s image, or runs one of ``images`` (the stack's releases, as pulled)."""
    return f"({c}.image == {o}.image || {c}.image in [{', '.join(_literal(i) for i in images)}])"


def _containers_same(new: str, old: str, field: str, images: tuple[str, ...]) -> str:
    """CEL: the pod specs' ``field`` lists hold the same containers by name, differing only in the release and in an
    image, which is then one of ``images``."""
    a, b = f"{new}.{field}", f"{old}.{field}"
    each = f"{_all_same('c', 'o', CONTAINER_FIELDS)} && {_env_same('c', 'o')} && {_image_allowed('c', 'o', images)}"
    return (
        f"has({a}) == has({b}) && (!has({a}) || ({a}.size() == {b}.size()"
        f" && {a}.all(c, {b}.exists_one(o, o.name == c.name) && {b}.filter(o, o.name == c.name).all(o, {each}))))"
    )


def template_same(new: str, old: str, images: tuple[str, ...]) -> str:
    """CEL: the pod templates at ``new`` and ``old`` differ only in images (each one of ``images``), the release and
    the version label."""
    return " && ".join(
        [
            f"has({new}.metadata) == has({old}.metadata)",
            f"(!has({new}.metadata) || ({_all_same(f'{new}.metadata', f'{old}.metadata', TEMPLATE_META_FIELDS)}"
            f" && {_labels_same_except(f'{new}.metadata', f'{old}.metadata', LABEL_VERSION)}))",
            _all_same(f"{new}.spec", f"{old}.spec", POD_SPEC_FIELDS),
            _containers_same(f"{new}.spec", f"{old}.spec", "containers", images),
            _containers_same(f"{new}.spec", f"{old}.spec", "initContainers", images),
        ]
    )


def replicas_through_zero(counts: Mapping[str, int]) -> str:
    """CEL: the workload's ``spec.replicas`` is unchanged, 0, or its rendered count (``counts``, by name)."""
    table = "{" + ", ".join(f"{_literal(name)}: {n}" for name, n in sorted(counts.items())) + "}"
    return (
        f"({_same('object.spec', 'oldObject.spec', 'replicas')} || (has(object.spec.replicas)"
        f" && (object.spec.replicas == 0 || (object.metadata.name in {table}"
        f" && object.spec.replicas == {table}[object.metadata.name]))))"
    )


def workload_same(kind: str, images: tuple[str, ...], counts: Mapping[str, int]) -> str:
    """CEL: a ``kind`` update (object vs oldObject) changes only images (each one of ``images``), the release and the
    version label; a LeaderWorkerSet's replicas also to 0 and back to its rendered count (``counts``, by name)."""
    parts = [
        _labels_same_except("object.metadata", "oldObject.metadata", LABEL_VERSION),
        _all_same("object.metadata", "oldObject.metadata", OBJECT_META_FIELDS),
        _all_same("object.spec", "oldObject.spec", WORKLOAD_SPEC_FIELDS[kind]),
    ]
    if kind == "StatefulSet":
        parts.append(template_same("object.spec.template", "oldObject.spec.template", images))
    else:
        new, old = "object.spec.leaderWorkerTemplate", "oldObject.spec.leaderWorkerTemplate"
        leader = template_same(f"{new}.leaderTemplate", f"{old}.leaderTemplate", images)
        parts += [
            replicas_through_zero(counts),
            _all_same(new, old, LWS_TEMPLATE_FIELDS),
            template_same(f"{new}.workerTemplate", f"{old}.workerTemplate", images),
            f"has({new}.leaderTemplate) == has({old}.leaderTemplate)",
            f"(!has({new}.leaderTemplate) || ({leader}))",
        ]
    return " && ".join(parts)


def pod_same() -> str:
    """CEL: a pod update changes only the :data:`LABEL_ADMITTED` label (a pod's image is mutable in place); its
    finalizers and owners stay, and the spec (ephemeral containers included) is untouched."""
    return (
        f"{_labels_same_except('object.metadata', 'oldObject.metadata', LABEL_ADMITTED)}"
        " && object.spec == oldObject.spec"
        f" && {_all_same('object.metadata', 'oldObject.metadata', OBJECT_META_FIELDS)}"
    )


def release_images(fleet: Fleet) -> tuple[str, ...]:
    """Every image the updater may set: each of ``serving.releases``' pinned references, as the pods pull it
    (through ``kubernetes.image_registry``); sorted, without repeats (two releases may share an image)."""
    return tuple(sorted({image(fleet.spec, ref) for ref in fleet.spec.serving.releases.values()}))


def updater_username(namespace: str) -> str:
    """The username the API server gives the updater's service-account tokens."""
    return f"system:serviceaccount:{namespace}:{UPDATER_APP}"


def render(fleet: Fleet) -> list[K8sObject]:
    """The policy and its binding (both cluster-scoped), bound to the stack's namespace."""
    namespace = fleet.spec.kubernetes.namespace
    api_version, kind = workload_kind(fleet)
    group, version = api_version.rsplit("/", 1)
    resource = f"{kind.lower()}s"
    images = release_images(fleet)
    counts = {group_name(g): size for g, size in enumerate(fleet.plan.rollout_group_sizes)}
    meta = {"labels": labels(COMPONENT, UPDATER_APP)}
    policy = {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY, **meta},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [group],
                        "apiVersions": [version],
                        "resources": [resource],
                        "operations": ["UPDATE"],
                    },
                    # CREATE: a pod of its own in this privileged namespace is root on its node; the
                    # ephemeralcontainers subresource adds a process to a running pod. Both are refused below.
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods", "pods/ephemeralcontainers"],
                        "operations": ["CREATE", "UPDATE"],
                    },
                ]
            },
            "matchConditions": [
                {"name": "the-updater", "expression": f"request.userInfo.username == '{updater_username(namespace)}'"}
            ],
            "validations": [
                {
                    "expression": f"request.resource.resource != '{resource}' || ({workload_same(kind, images, counts)})",
                    "message": (
                        f"{UPDATER_APP} may change only a {kind}'s images (to a release of serving.releases), the "
                        f"{RELEASE_ENV} value and the {LABEL_VERSION} label"
                        + (
                            ", and its replicas to 0 and back to the rendered count"
                            if kind == "LeaderWorkerSet"
                            else ""
                        )
                    ),
                    "reason": "Forbidden",
                },
                {
                    # on CREATE oldObject is null: the operation is tested first (&& short-circuits)
                    "expression": (
                        f"request.resource.resource != 'pods' || (request.operation == 'UPDATE' && {pod_same()})"
                    ),
                    "message": f"{UPDATER_APP} may change only an existing pod's {LABEL_ADMITTED} label",
                    "reason": "Forbidden",
                },
            ],
        },
    }
    binding = {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY, **meta},
        "spec": {
            "policyName": POLICY,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}}},
        },
    }
    return [policy, binding]
