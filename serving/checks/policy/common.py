"""What every deployment policy shares: the two registries a rule joins by its decorator, reading a Kubernetes
resource (its kind, pod templates, containers, labels and annotations) and the failing result a rule returns."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from serving.plan.model import Fleet
from serving.render.k8s.common import LABEL_NAME
from serving.result import CheckResult, Status

GPU_RESOURCE = "nvidia.com/gpu"
WORKLOAD_KINDS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"})
SERVING_GROUP_KINDS = frozenset({"StatefulSet", "LeaderWorkerSet"})


Props = Mapping[str, Any]
ResourceRule = Callable[[str, Props], list[CheckResult]]
StackRule = Callable[[Sequence[tuple[str, Props]], Fleet], list[CheckResult]]


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


def app_of(template: Props) -> str | None:
    """The app a pod template runs: its ``LABEL_NAME`` label (None without one)."""
    value = ((template.get("metadata") or {}).get("labels") or {}).get(LABEL_NAME)
    return None if value is None else str(value)


def annotation(props: Props, key: str) -> str:
    """The resource's annotation ``key``, stripped ("" when absent)."""
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


def finding(rule: str, resource_type: str, props: Props, observed: str, expected: str, fix: str) -> CheckResult:
    """A rule's failing result on a resource, named as :func:`describe` names it."""
    return violation(rule, describe(resource_type, props), observed, expected, fix)
