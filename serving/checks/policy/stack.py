"""Stack rules: every resource of the stack at once, against the fleet (its spec and plan) — a disruption budget and
the planned replica count for each serving group, monitoring objects the cluster's Prometheus selects, routers and
controllers on the system pool, images through the stack's mirror and (in production) by digest, and the updater's
admission policy beside any role that may patch serving workloads. ``monitoring-selected`` and
``images-through-mirror`` are findings of issue 10 too (:mod:`.real_cluster`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from serving.checks.policy.common import (
    SERVING_GROUP_KINDS,
    Props,
    app_of,
    containers,
    describe,
    finding,
    kind_of,
    pod_templates,
    selector_matches,
    stack_rule,
    violation,
)
from serving.plan.model import Fleet
from serving.render.k8s import admission
from serving.render.k8s.common import LABEL_GROUP, LABEL_POOL, ROUTER_APP, SERVING_APP, TAINT_KEY, system_pool_selector
from serving.render.k8s.fabric import IMAGE as RDMA_PLUGIN_IMAGE
from serving.render.k8s.runtime import CONTROLLER
from serving.result import CheckResult
from serving.spec.schema import IMAGE_DIGEST, FleetSpec

# Pods that run on the system pool, never on a GPU node.
SYSTEM_APPS = frozenset({ROUTER_APP, CONTROLLER})


def serving_groups(resources: Sequence[tuple[str, Props]]) -> list[tuple[str, Props]]:
    """Resources that run a serving update group (their pods carry the sglang app label)."""
    return [
        (t, p)
        for t, p in resources
        if kind_of(t, p) in SERVING_GROUP_KINDS and any(app_of(tpl) == SERVING_APP for _, tpl in pod_templates(t, p))
    ]


@stack_rule("pdb-per-serving-group", "Every serving update group has a PodDisruptionBudget selecting its pods.")
def pdb_per_serving_group(resources: Sequence[tuple[str, Props]], fleet: Fleet) -> list[CheckResult]:
    del fleet  # the rule reads only the resources
    budgets = [
        ((p.get("metadata") or {}).get("namespace"), (p.get("spec") or {}).get("selector") or {})
        for t, p in resources
        if kind_of(t, p) == "PodDisruptionBudget"
    ]
    out: list[CheckResult] = []
    for t, p in serving_groups(resources):
        ns = (p.get("metadata") or {}).get("namespace")
        labels = ((pod_templates(t, p)[0][1].get("metadata") or {}).get("labels")) or {}
        if not any(bns == ns and sel and selector_matches(sel, labels) for bns, sel in budgets):
            out.append(
                violation(
                    "pdb-per-serving-group",
                    describe(t, p),
                    f"no PodDisruptionBudget in namespace {ns!r} selects this group's pods ({dict(labels)})",
                    "a PodDisruptionBudget selecting the pods of every serving update group",
                    "Add a PodDisruptionBudget whose selector matches the group's pod labels "
                    "(serving.render.k8s.fleet renders one per group).",
                )
            )
    return out


@stack_rule(
    "serving-group-replicas",
    "There are exactly rollout.batches serving groups and each runs the replica count the spec's plan gives it.",
)
def serving_group_replicas(resources: Sequence[tuple[str, Props]], fleet: Fleet) -> list[CheckResult]:
    spec, expected = fleet.spec, fleet.plan.rollout_group_sizes
    out: list[CheckResult] = []
    seen: Counter[int] = Counter()
    for t, p in serving_groups(resources):
        label = ((p.get("metadata") or {}).get("labels") or {}).get(LABEL_GROUP)
        replicas = (p.get("spec") or {}).get("replicas")
        if label is None or not str(label).isdigit() or int(label) >= len(expected):
            out.append(
                violation(
                    "serving-group-replicas",
                    describe(t, p),
                    f"label {LABEL_GROUP}={label!r} names no update group of the spec",
                    f"an update group 0..{len(expected) - 1} (rollout.batches={spec.rollout.batches})",
                    f"Render serving groups from the spec (rollout.batches={spec.rollout.batches}); remove this one.",
                )
            )
            continue
        group = int(label)
        seen[group] += 1
        if replicas is None or int(replicas) != expected[group]:
            out.append(
                violation(
                    "serving-group-replicas",
                    describe(t, p),
                    f"spec.replicas is {replicas}",
                    f"{expected[group]} replicas, update group {group}'s share of the spec's plan "
                    f"({sum(expected):,} in {len(expected)} groups)",
                    "Change serving.replicas or rollout.batches in the stack, never the object's replica count.",
                )
            )
    for group in range(len(expected)):
        if seen[group] != 1:
            out.append(
                violation(
                    "serving-group-replicas",
                    f"update group {group}",
                    f"{seen[group]} serving objects carry {LABEL_GROUP}={group}",
                    "exactly one per update group",
                    f"Render exactly rollout.batches={spec.rollout.batches} groups (serving.render.k8s.fleet).",
                )
            )
    return out


@stack_rule(
    "monitoring-selected",
    "PrometheusRules, ServiceMonitors and PodMonitors carry kubernetes.prometheus_selector_labels, so the cluster's Prometheus "
    "loads them.",
)
def monitoring_selected(resources: Sequence[tuple[str, Props]], fleet: Fleet) -> list[CheckResult]:
    wanted = fleet.spec.kubernetes.prometheus_selector_labels
    out = []
    for t, p in resources:
        if kind_of(t, p) not in ("PrometheusRule", "ServiceMonitor", "PodMonitor"):
            continue
        have = (p.get("metadata") or {}).get("labels") or {}
        missing = {k: v for k, v in wanted.items() if have.get(k) != v}
        if missing:
            out.append(
                finding(
                    "monitoring-selected",
                    t,
                    p,
                    f"metadata.labels lack {missing}: the Prometheus operator's ruleSelector/serviceMonitorSelector "
                    "never picks it up",
                    f"the labels {wanted}",
                    "Set kubernetes.prometheus_selector_labels to what the cluster's Prometheus selects.",
                )
            )
    return out


@stack_rule(
    "system-pool-placement",
    f"The routers and controllers run on cluster.system_pool: a nodeSelector naming it, and no toleration of "
    f"{TAINT_KEY} (they would take a GPU node's CPUs, and the routers' one-per-node spread a GPU node each).",
)
def system_pool_placement(resources: Sequence[tuple[str, Props]], fleet: Fleet) -> list[CheckResult]:
    wanted = system_pool_selector(fleet.spec)
    out = []
    for t, p in resources:
        for where, template in pod_templates(t, p):
            if app_of(template) not in SYSTEM_APPS:
                continue
            pod = template.get("spec") or {}
            selector = dict(pod.get("nodeSelector") or {})
            problems = []
            if not wanted:
                problems.append("the stack declares no cluster.system_pool, so no untainted node is named for it")
            elif any(selector.get(k) != v for k, v in wanted.items()):
                problems.append(f"{where}.spec.nodeSelector is {selector}: not the system pool's {wanted}")
            gpu = [
                dict(tol)
                for tol in pod.get("tolerations") or []
                if tol.get("key") == TAINT_KEY or (not tol.get("key") and tol.get("operator") == "Exists")
            ]
            if gpu:
                problems.append(f"{where}.spec.tolerations {gpu} let it onto the GPU nodes")
            if problems:
                out.append(
                    finding(
                        "system-pool-placement",
                        t,
                        p,
                        "; ".join(problems),
                        f"spec.nodeSelector {wanted or {LABEL_POOL: '<cluster.system_pool.name>'}} and no toleration "
                        f"of {TAINT_KEY}",
                        "Declare cluster.system_pool (exaserve plan sizes it, rule cluster.system-pool) and render the "
                        "pod with serving.render.k8s.common.on_system_pool; tolerate no GPU taint.",
                    )
                )
    return out


@stack_rule(
    "images-through-mirror",
    "When the stack names a registry mirror or a pull secret, every pod pulls through it; a production stack "
    "(kubernetes.production) names a mirror.",
)
def images_through_mirror(resources: Sequence[tuple[str, Props]], fleet: Fleet) -> list[CheckResult]:
    k8s = fleet.spec.kubernetes
    mirror, secret = k8s.image_registry, k8s.image_pull_secret
    out = []
    for t, p in resources:
        for where, template in pod_templates(t, p):
            pod = template.get("spec") or {}
            problems = [
                f"{cwhere}.image {c.get('image')!r} bypasses the mirror"
                for cwhere, c in containers(template)
                if mirror and not str(c.get("image") or "").startswith(f"{mirror}/")
            ]
            if k8s.production and not mirror:
                problems.append(
                    "a production stack without kubernetes.image_registry: every image is pulled from its public "
                    "registry, by a name anyone there can move"
                )
            if secret and {"name": secret} not in (pod.get("imagePullSecrets") or []):
                problems.append(f"imagePullSecrets lacks {secret!r}")
            if problems:
                out.append(
                    finding(
                        "images-through-mirror",
                        t,
                        p,
                        f"{where}: {'; '.join(problems)}",
                        f"images under {mirror}/ and imagePullSecrets naming {secret!r}",
                        "Set kubernetes.image_registry to the cluster's mirror in a production stack; render images "
                        "with serving.render.k8s.common.image and pull_secrets.",
                    )
                )
    return out


def image_fields(spec: FleetSpec) -> dict[str, str]:
    """Each image the spec names → the spec field that names it."""
    fields = {image: f"serving.releases.{name}" for name, image in spec.serving.releases.items()}
    fields[spec.runtime.image] = "runtime.image"
    fields[spec.kubernetes.router_image] = "kubernetes.router_image"
    fields[RDMA_PLUGIN_IMAGE] = "serving.render.k8s.fabric.IMAGE"
    return fields


@stack_rule(
    "images-by-digest",
    "A production stack (kubernetes.production) runs every image by digest (repo[:tag]@sha256:…), never by a tag "
    "the registry can move.",
)
def images_by_digest(resources: Sequence[tuple[str, Props]], fleet: Fleet) -> list[CheckResult]:
    spec = fleet.spec
    if not spec.kubernetes.production:
        return []
    mirror = spec.kubernetes.image_registry
    fields = image_fields(spec)
    out = []
    for t, p in resources:
        for where, template in pod_templates(t, p):
            for cwhere, c in containers(template):
                pulled = str(c.get("image") or "")
                name, _, digest = pulled.partition("@")
                if IMAGE_DIGEST.fullmatch(digest):
                    continue
                named = pulled.removeprefix(f"{mirror}/") if mirror else pulled
                field = fields.get(named)
                fix = (
                    f"Set {field} to '{named}@sha256:<digest>'"
                    + (
                        ", the digest the image workflow prints for the tag (.github/workflows/image.yml, job summary)"
                        if field == "runtime.image"
                        else f", the digest the mirror serves: skopeo inspect --format '{{{{.Digest}}}}' docker://{name}"
                    )
                    + " (docs/infra.md, 'Production images')."
                    if field
                    else "Render the image from the spec's fields (serving.releases, runtime.image, "
                    "kubernetes.router_image) and pin it there by digest."
                )
                out.append(
                    finding(
                        "images-by-digest",
                        t,
                        p,
                        f"{where}.{cwhere}.image is {pulled!r}: a tag, in a production stack",
                        "repo[:tag]@sha256:<64 hex digits>",
                        fix,
                    )
                )
    return out


@stack_rule(
    "rollout-gates-enforced",
    "A stack deployed to a cluster enforces every rollout gate: rollout.dry_run_gates (measured, never decisive) is "
    "for a sandbox's own processes.",
)
def rollout_gates_enforced(resources: Sequence[tuple[str, Props]], fleet: Fleet) -> list[CheckResult]:
    dry = list(fleet.spec.rollout.dry_run_gates)
    if not dry:
        return []
    return [
        violation(
            "rollout-gates-enforced",
            "rollout.dry_run_gates",
            f"rollout.dry_run_gates is {dry}: the {' and '.join(dry)} gate(s) of this cluster's rollouts would never "
            "pause or roll back",
            "every gate enforced on a cluster (rollout.dry_run_gates empty)",
            "Remove rollout.dry_run_gates from the stack.",
        )
    ]


def _plain(value: Any) -> Any:
    """``value`` as plain dicts and lists (the CrossGuard engine hands properties over as read-only proxies, which
    do not compare equal to the rendered dicts and lists)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [_plain(v) for v in value]
    return value


_WRITE_VERBS = {"patch", "update", "*"}
_GUARDED = {"statefulsets", "leaderworkersets", "pods", "*"}


@stack_rule(
    "updater-admission-policy",
    "Whenever a Role may patch or update serving workloads or pods, the updater's ValidatingAdmissionPolicy and its "
    "Deny binding are present exactly as rendered (only images, the release and version labels may change).",
)
def updater_admission_policy(resources: Sequence[tuple[str, Props]], fleet: Fleet) -> list[CheckResult]:
    writers = [
        describe(t, p)
        for t, p in resources
        if kind_of(t, p) in ("Role", "ClusterRole")
        and any(
            _WRITE_VERBS & set(r.get("verbs") or []) and _GUARDED & set(r.get("resources") or [])
            for r in p.get("rules") or []
        )
    ]
    if not writers:
        return []
    want = {o["kind"]: o for o in admission.render(fleet)}
    problems = []
    for kind, rendered in want.items():
        found = [
            p
            for t, p in resources
            if kind_of(t, p) == kind and (p.get("metadata") or {}).get("name") == admission.POLICY
        ]
        if not found:
            problems.append(f"no {kind} {admission.POLICY}")
        elif _plain(found[0].get("spec")) != rendered["spec"]:
            problems.append(f"{kind} {admission.POLICY} differs from its render (a weakened or stale policy)")
    if not problems:
        return []
    return [
        violation(
            "updater-admission-policy",
            ", ".join(writers),
            f"{', '.join(writers)} may patch serving workloads or pods, but {'; '.join(problems)}",
            f"the {admission.POLICY} ValidatingAdmissionPolicy and binding of serving.render.k8s.admission",
            "Render the updater with serving.render.k8s.updater.render, which includes serving.render.k8s.admission: "
            "RBAC cannot narrow a patch to fields, so without the policy the account can rewrite a pod template.",
        )
    ]
