"""Deployment policies: pure rules over Kubernetes resources, shared by the CrossGuard pack (``policies/``, run by
``pulumi preview/up``) and ``exaserve check`` (run offline on the rendered stack).

A resource rule takes the Pulumi resource type and the resource's properties (the camelCase object) and
returns failing :class:`~serving.checks.result.CheckResult`s; a stack rule takes every resource and the fleet
spec. Each result names the rule (``check``), the resource (``subject``), what is wrong with the offending value
(``observed``), what the rule asks for (``expected``) and the fix.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from serving.checks.result import CheckResult, Status
from serving.checks.rules import MIN_HEALTH_TIMEOUT_S
from serving.plan.planner import plan
from serving.render.k8s.common import (
    ANNOTATION_ALLOW_LOAD_BALANCER,
    ANNOTATION_PRIVILEGED_REASON,
    LABEL_GROUP,
    LABEL_NAME,
    ROUTER_APP,
    SERVING_APP,
)
from serving.spec.schema import FleetSpec, pinned_image

GPU_RESOURCE = "nvidia.com/gpu"
# DaemonSets allowed a privileged container (still only with a reason in ANNOTATION_PRIVILEGED_REASON).
PRIVILEGED_DAEMONSETS = frozenset({"rdma-shared-device-plugin"})
WORKLOAD_KINDS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"})
SERVING_GROUP_KINDS = frozenset({"StatefulSet", "LeaderWorkerSet"})


Props = Mapping[str, Any]
ResourceRule = Callable[[str, Props], list[CheckResult]]
StackRule = Callable[[Sequence[tuple[str, Props]], FleetSpec], list[CheckResult]]


@dataclass(frozen=True)
class Rule:
    name: str
    description: str


RESOURCE_RULES: dict[str, tuple[Rule, ResourceRule]] = {}
STACK_RULES: dict[str, tuple[Rule, StackRule]] = {}


def resource_rule(name: str, description: str) -> Callable[[ResourceRule], ResourceRule]:
    def register(fn: ResourceRule) -> ResourceRule:
        RESOURCE_RULES[name] = (Rule(name, description), fn)
        return fn

    return register


def stack_rule(name: str, description: str) -> Callable[[StackRule], StackRule]:
    def register(fn: StackRule) -> StackRule:
        STACK_RULES[name] = (Rule(name, description), fn)
        return fn

    return register


# ------------------------------------------------------------------------------------------ helpers


def kind_of(resource_type: str, props: Props) -> str:
    """The object's kind: from its properties, else from the Pulumi type token (``kubernetes:apps/v1:StatefulSet``)."""
    kind = props.get("kind")
    return str(kind) if kind else resource_type.rsplit(":", 1)[-1].removesuffix("Patch")


def violation(rule: str, subject: str, observed: str, expected: str, fix: str) -> CheckResult:
    """A policy's failing result (every policy is mandatory, so there are no warnings)."""
    return CheckResult(rule, Status.FAIL, observed, expected, fix, subject)


def describe(resource_type: str, props: Props) -> str:
    meta = props.get("metadata") or {}
    name = meta.get("name", "?")
    where = f"{meta['namespace']}/{name}" if meta.get("namespace") else name
    return f"{kind_of(resource_type, props)} {where}"


def pod_templates(resource_type: str, props: Props) -> list[tuple[str, Props]]:
    """``(where, pod template)`` for each pod the resource creates (a Pod is its own template)."""
    kind, spec = kind_of(resource_type, props), props.get("spec") or {}
    if kind in WORKLOAD_KINDS:
        return [("spec.template", spec.get("template") or {})]
    if kind == "CronJob":
        return [
            (
                "spec.jobTemplate.spec.template",
                ((spec.get("jobTemplate") or {}).get("spec") or {}).get("template") or {},
            )
        ]
    if kind == "Pod":
        return [("", props)]
    if kind == "LeaderWorkerSet":
        lwt = spec.get("leaderWorkerTemplate") or {}
        return [(f"spec.leaderWorkerTemplate.{t}", lwt[t]) for t in ("leaderTemplate", "workerTemplate") if lwt.get(t)]
    return []


def containers(template: Props) -> Iterator[tuple[str, Props]]:
    spec = template.get("spec") or {}
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(field) or []:
            yield f"{field}[{c.get('name', '?')}]", c


def _app(template: Props) -> str | None:
    value = ((template.get("metadata") or {}).get("labels") or {}).get(LABEL_NAME)
    return None if value is None else str(value)


def _annotation(props: Props, key: str) -> str:
    return str(((props.get("metadata") or {}).get("annotations") or {}).get(key) or "").strip()


def selector_matches(selector: Props, labels: Mapping[str, str]) -> bool:
    """Kubernetes label-selector semantics (matchLabels AND matchExpressions); an empty selector matches all."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), set(expr.get("values") or [])
        present = key in labels
        if (
            (op == "In" and (not present or labels[key] not in values))
            or (op == "NotIn" and present and labels[key] in values)
            or (op == "Exists" and not present)
            or (op == "DoesNotExist" and present)
        ):
            return False
    return True


# ------------------------------------------------------------------------------------------ resource rules


@resource_rule("images-pinned", "Every container image is pinned to a tag other than 'latest' or to a digest.")
def images_pinned(resource_type: str, props: Props) -> list[CheckResult]:
    out: list[CheckResult] = []
    for where, template in pod_templates(resource_type, props):
        for cwhere, c in containers(template):
            image = str(c.get("image") or "")
            try:
                pinned_image(image)
            except ValueError:
                out.append(
                    violation(
                        "images-pinned",
                        describe(resource_type, props),
                        f"{where}.{cwhere}.image is {image!r}: not pinned (no tag, or 'latest')",
                        "an explicit version tag or an @sha256 digest",
                        "Use an explicit version tag or an @sha256 digest, e.g. 'repo/image:v1.2.3'.",
                    )
                )
    return out


@resource_rule("serving-resource-limits", "Serving containers set limits for GPUs (nvidia.com/gpu) and memory.")
def serving_resource_limits(resource_type: str, props: Props) -> list[CheckResult]:
    out: list[CheckResult] = []
    for where, template in pod_templates(resource_type, props):
        if _app(template) != SERVING_APP:
            continue
        for cwhere, c in containers(template):
            limits = (c.get("resources") or {}).get("limits") or {}
            missing = [r for r in (GPU_RESOURCE, "memory") if not str(limits.get(r) or "").strip("0")]
            if missing:
                out.append(
                    violation(
                        "serving-resource-limits",
                        describe(resource_type, props),
                        f"{where}.{cwhere}.resources.limits has no {' or '.join(missing)} (got {dict(limits)})",
                        f"limits for {GPU_RESOURCE} and memory on every serving container",
                        "Set resources.limits['nvidia.com/gpu'] to the replica's GPUs and memory to its host budget "
                        "(serving.render.k8s.container.pod_container does both).",
                    )
                )
    return out


@resource_rule(
    "probes-timeout",
    f"Serving and router containers have readiness and liveness probes (serving: startup too), each with a "
    f"timeout of at least {MIN_HEALTH_TIMEOUT_S:g} s (a 1 s timeout restarted replicas every 10 minutes).",
)
def probes_timeout(resource_type: str, props: Props) -> list[CheckResult]:
    out: list[CheckResult] = []
    for where, template in pod_templates(resource_type, props):
        app = _app(template)
        if app not in (SERVING_APP, ROUTER_APP) or where.endswith("workerTemplate"):
            continue  # non-leader pods of a multi-node replica serve no HTTP
        needed = ["readinessProbe", "livenessProbe"] + (["startupProbe"] if app == SERVING_APP else [])
        for cwhere, c in containers(template):
            if cwhere.startswith("initContainers"):
                continue
            for probe in needed:
                spec = c.get(probe)
                timeout = (spec or {}).get("timeoutSeconds", 1)  # Kubernetes' default is 1 s
                if spec is None or float(timeout) < MIN_HEALTH_TIMEOUT_S:
                    out.append(
                        violation(
                            "probes-timeout",
                            describe(resource_type, props),
                            f"{where}.{cwhere}.{probe} is "
                            + ("missing" if spec is None else f"set with timeoutSeconds={timeout}"),
                            f"a {probe} with timeoutSeconds ≥ {MIN_HEALTH_TIMEOUT_S:g}",
                            f"Add {probe} with timeoutSeconds ≥ {MIN_HEALTH_TIMEOUT_S:g} "
                            "(serving.health_check_timeout_s in the stack).",
                        )
                    )
    return out


@resource_rule(
    "no-privileged-containers",
    "No privileged container, except in the named DaemonSets that state their reason in an annotation.",
)
def no_privileged_containers(resource_type: str, props: Props) -> list[CheckResult]:
    kind = kind_of(resource_type, props)
    name = str((props.get("metadata") or {}).get("name", ""))
    allowed = kind == "DaemonSet" and name in PRIVILEGED_DAEMONSETS
    reason = _annotation(props, ANNOTATION_PRIVILEGED_REASON)
    out: list[CheckResult] = []
    for where, template in pod_templates(resource_type, props):
        for cwhere, c in containers(template):
            if not (c.get("securityContext") or {}).get("privileged"):
                continue
            if allowed and reason:
                continue
            if allowed:
                expected = f"a privileged container only with its reason in {ANNOTATION_PRIVILEGED_REASON}"
                fix = f"State the reason in the annotation {ANNOTATION_PRIVILEGED_REASON}."
            else:
                expected = f"no privileged container outside the DaemonSets {sorted(PRIVILEGED_DAEMONSETS)}"
                fix = (
                    "Drop privileged and add only the capabilities the container needs; privileged is reserved "
                    f"for the DaemonSets {sorted(PRIVILEGED_DAEMONSETS)} with a reason annotation."
                )
            out.append(
                violation(
                    "no-privileged-containers",
                    describe(resource_type, props),
                    f"{where}.{cwhere} runs privileged",
                    expected,
                    fix,
                )
            )
    return out


@resource_rule(
    "no-unannotated-load-balancer",
    f"No Service of type LoadBalancer unless annotated {ANNOTATION_ALLOW_LOAD_BALANCER} with a reason.",
)
def no_unannotated_load_balancer(resource_type: str, props: Props) -> list[CheckResult]:
    if kind_of(resource_type, props) != "Service" or (props.get("spec") or {}).get("type") != "LoadBalancer":
        return []
    if _annotation(props, ANNOTATION_ALLOW_LOAD_BALANCER):
        return []
    return [
        violation(
            "no-unannotated-load-balancer",
            describe(resource_type, props),
            "spec.type is LoadBalancer, which exposes the service outside the cluster",
            f"ClusterIP, or a LoadBalancer annotated {ANNOTATION_ALLOW_LOAD_BALANCER} with a reason",
            f"Use ClusterIP behind the cluster's ingress, or annotate {ANNOTATION_ALLOW_LOAD_BALANCER}: '<reason>'.",
        )
    ]


# ------------------------------------------------------------------------------------------ stack rules


def serving_groups(resources: Sequence[tuple[str, Props]]) -> list[tuple[str, Props]]:
    """Resources that run a serving update group (their pods carry the sglang app label)."""
    return [
        (t, p)
        for t, p in resources
        if kind_of(t, p) in SERVING_GROUP_KINDS and any(_app(tpl) == SERVING_APP for _, tpl in pod_templates(t, p))
    ]


@stack_rule("pdb-per-serving-group", "Every serving update group has a PodDisruptionBudget selecting its pods.")
def pdb_per_serving_group(resources: Sequence[tuple[str, Props]], spec: FleetSpec) -> list[CheckResult]:
    del spec  # the rule reads only the resources
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
def serving_group_replicas(resources: Sequence[tuple[str, Props]], spec: FleetSpec) -> list[CheckResult]:
    expected = plan(spec).rollout_group_sizes
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


def check(resources: Sequence[tuple[str, Props]], spec: FleetSpec) -> list[CheckResult]:
    """Every rule over every resource; the offline twin of the CrossGuard pack."""
    findings = [f for t, p in resources for _, fn in RESOURCE_RULES.values() for f in fn(t, p)]
    findings += [f for _, fn in STACK_RULES.values() for f in fn(resources, spec)]
    return findings
