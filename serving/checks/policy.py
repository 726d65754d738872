"""Deployment policies: pure rules over Kubernetes resources, shared by the CrossGuard pack (``policies/``, run by
``pulumi preview/up``) and ``exaserve check`` (run offline on the rendered stack).

A resource rule takes the Pulumi resource type and the resource's properties (the camelCase object) and
returns failing :class:`~serving.result.CheckResult`s; a stack rule takes every resource and the fleet
(the spec and its plan). Each result names the rule (``check``), the resource (``subject``), what is wrong with the offending value
(``observed``), what the rule asks for (``expected``) and the fix.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from serving.checks.rules import MIN_HEALTH_TIMEOUT_S
from serving.plan.model import Fleet
from serving.render.k8s import admission
from serving.render.k8s.common import (
    ANNOTATION_ALLOW_LOAD_BALANCER,
    ANNOTATION_PRIVILEGED_REASON,
    ANNOTATION_SKIP_AWAIT,
    ANNOTATION_TIMEOUT_S,
    HOSTNAME_LABEL,
    LABEL_GROUP,
    LABEL_NAME,
    LABEL_POOL,
    LABEL_RACK,
    PREFIX,
    ROUTER_APP,
    SERVING_APP,
    TAINT_KEY,
    system_pool_selector,
)
from serving.render.k8s.container import GENERATING_PATHS, LIVENESS_PATH
from serving.render.k8s.fabric import IMAGE as RDMA_PLUGIN_IMAGE
from serving.render.k8s.fabric import NETWORKS_ANNOTATION
from serving.render.k8s.fleet import LWS_GROUP_KEY
from serving.render.k8s.gateway import DNS_TTL_S
from serving.render.k8s.gateway import LIVENESS_PATH as ROUTER_LIVENESS_PATH
from serving.render.k8s.runtime import CONTROLLER
from serving.render.k8s.storage import COMPLETE_MARKER, WARMER
from serving.result import CheckResult, Status
from serving.spec.schema import IMAGE_DIGEST, FleetSpec, pinned_image

GPU_RESOURCE = "nvidia.com/gpu"
# DaemonSets allowed a privileged container (still only with a reason in ANNOTATION_PRIVILEGED_REASON).
PRIVILEGED_DAEMONSETS = frozenset({"rdma-shared-device-plugin"})
WORKLOAD_KINDS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"})
SERVING_GROUP_KINDS = frozenset({"StatefulSet", "LeaderWorkerSet"})
# Workloads whose readiness follows model loading (or the cache copy): `pulumi up` must not wait for them.
NOT_AWAITED_APPS = frozenset({SERVING_APP, ROUTER_APP, WARMER})
# Pods that run on the system pool, never on a GPU node.
SYSTEM_APPS = frozenset({ROUTER_APP, CONTROLLER})
# A group this small may keep a rack spread of 1: one rack's share is a single pod.
RACK_SHARE_FLOOR = 16
OFFSET_AFTER_PARENS = re.compile(r"\)\s*offset\s")
# The cache wait as a shell really runs it: a loop until the marker file exists (a comment naming the marker is not).
CACHE_WAIT = re.compile(r"^until \[ -f '?/[^' ]+/" + re.escape(COMPLETE_MARKER) + r"'? \]; do [^#]*; done\b")


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
            if cwhere.startswith("initContainers"):
                continue  # the cache wait holds no GPU
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
        lwt = (props.get("spec") or {}).get("leaderWorkerTemplate") or {}
        if app not in (SERVING_APP, ROUTER_APP) or (where.endswith("workerTemplate") and lwt.get("leaderTemplate")):
            continue  # non-leader pods of a multi-node replica serve no HTTP (a group of one runs its leader from it)
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


def check(resources: Sequence[tuple[str, Props]], fleet: Fleet) -> list[CheckResult]:
    """Every rule over every resource; the offline twin of the CrossGuard pack."""
    findings = [f for t, p in resources for _, fn in RESOURCE_RULES.values() for f in fn(t, p)]
    findings += [f for _, fn in STACK_RULES.values() for f in fn(resources, fleet)]
    return findings


# ------------------------------------------------------------------------------------------ `pulumi up` on a real cluster
# One rule per finding of issue 10 (docs/infra.md, "Findings"): each fails the shape that broke day one.


def _containers_of(resource_type: str, props: Props, *, init: bool = False) -> Iterator[tuple[str, Props, Props]]:
    """``(where, pod template, container)`` for every (non-init, unless ``init``) container the resource runs."""
    for where, template in pod_templates(resource_type, props):
        for cwhere, c in containers(template):
            if init or not cwhere.startswith("initContainers"):
                yield f"{where}.{cwhere}", template, c


def _serving_leader_templates(resource_type: str, props: Props) -> list[tuple[str, Props]]:
    """Serving pod templates that serve HTTP: every template except a multi-node group's ``workerTemplate`` (a
    LeaderWorkerSet without ``leaderTemplate`` runs its leader from ``workerTemplate``)."""
    lwt = (props.get("spec") or {}).get("leaderWorkerTemplate") or {}
    out = []
    for where, template in pod_templates(resource_type, props):
        if _app(template) != SERVING_APP:
            continue
        if where.endswith("workerTemplate") and lwt.get("leaderTemplate"):
            continue
        out.append((where, template))
    return out


def _finding(rule: str, resource_type: str, props: Props, observed: str, expected: str, fix: str) -> CheckResult:
    return violation(rule, describe(resource_type, props), observed, expected, fix)


@resource_rule(
    "serving-waits-for-node-cache",
    "Serving pods wait for their own node's model cache in an init container (never the fleet for the warmer).",
)
def serving_waits_for_node_cache(resource_type: str, props: Props) -> list[CheckResult]:
    out = []
    for where, template in pod_templates(resource_type, props):
        if _app(template) != SERVING_APP:
            continue
        inits = (template.get("spec") or {}).get("initContainers") or []
        commands = [[str(w) for w in c.get("command") or []] for c in inits]
        if not any(len(cmd) == 3 and cmd[1] == "-c" and CACHE_WAIT.match(cmd[2]) for cmd in commands):
            out.append(
                _finding(
                    "serving-waits-for-node-cache",
                    resource_type,
                    props,
                    f"{where} has no init container waiting for the cache marker {COMPLETE_MARKER} (commands: "
                    f"{commands})",
                    "an init container that holds each serving pod until its node's cache is complete",
                    "Add serving.render.k8s.container.cache_init_container; never make the fleet depend on the "
                    "cache warmer DaemonSet (Pulumi would wait for every node's copy).",
                )
            )
    return out


@resource_rule(
    "await-decided",
    "Every workload says what `pulumi up` waits for (pulumi.com/skipAwait or pulumi.com/timeoutSeconds); serving "
    "groups, the router and the cache warmer are not awaited.",
)
def await_decided(resource_type: str, props: Props) -> list[CheckResult]:
    kind = kind_of(resource_type, props)
    if kind == "Service":
        return _service_await_decided(resource_type, props)
    if kind not in WORKLOAD_KINDS | SERVING_GROUP_KINDS:
        return []
    skip = _annotation(props, ANNOTATION_SKIP_AWAIT) == "true"
    timeout = _annotation(props, ANNOTATION_TIMEOUT_S)
    apps = {_app(t) for _, t in pod_templates(resource_type, props)}
    must_skip = bool(apps & NOT_AWAITED_APPS)
    if skip or (timeout and not must_skip):
        return []
    observed = (
        f"{ANNOTATION_TIMEOUT_S}={timeout} on pods whose readiness follows model loading ({sorted(a for a in apps if a)})"
        if timeout
        else f"neither {ANNOTATION_SKIP_AWAIT} nor {ANNOTATION_TIMEOUT_S}: `pulumi up` waits for every pod"
    )
    return [
        _finding(
            "await-decided",
            resource_type,
            props,
            observed,
            f"{ANNOTATION_SKIP_AWAIT}: 'true' on serving groups, the router and the cache warmer; a "
            f"{ANNOTATION_TIMEOUT_S} or skip on every other workload",
            "Render it with serving.render.k8s.common.await_annotations (docs/infra.md, 'What up waits for').",
        )
    ]


def _service_await_decided(resource_type: str, props: Props) -> list[CheckResult]:
    """A Service with a cluster IP and a selector is awaited until a selected pod is Ready (pulumi-kubernetes
    ``provider/pkg/await/service.go``, ``shouldWaitForPods``; a headless one is not): one in front of pods whose
    readiness follows model loading must not be."""
    spec = props.get("spec") or {}
    selected = (spec.get("selector") or {}).get(LABEL_NAME)
    if spec.get("clusterIP") == "None" or selected not in NOT_AWAITED_APPS:
        return []
    if _annotation(props, ANNOTATION_SKIP_AWAIT) == "true":
        return []
    return [
        _finding(
            "await-decided",
            resource_type,
            props,
            f"a Service selecting {LABEL_NAME}={selected} without {ANNOTATION_SKIP_AWAIT}: `pulumi up` waits until one "
            "of those pods is Ready, which follows model loading",
            f"{ANNOTATION_SKIP_AWAIT}: 'true' on a non-headless Service in front of {sorted(NOT_AWAITED_APPS)}",
            "Render it with serving.render.k8s.common.await_annotations(skip=True) (docs/infra.md, 'What up waits "
            "for').",
        )
    ]


@resource_rule(
    "no-clock-daemons", "No container may set the clock (SYS_TIME): time sync belongs to the host's chronyd."
)
def no_clock_daemons(resource_type: str, props: Props) -> list[CheckResult]:
    return [
        _finding(
            "no-clock-daemons",
            resource_type,
            props,
            f"{where} adds SYS_TIME: a second daemon disciplining the host's clock",
            "no SYS_TIME capability in any container",
            "Remove the container; chronyd runs on the host (Ansible role ntp) and the ExaServeClock* alerts "
            "observe node_timex metrics.",
        )
        for where, _, c in _containers_of(resource_type, props, init=True)
        if "SYS_TIME" in (((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or [])
    ]


@resource_rule(
    "rollout-ga-only",
    "No workload relies on a rollout budget Kubernetes 1.33 ignores: no StatefulSet rollingUpdate.maxUnavailable "
    "(alpha MaxUnavailableStatefulSet), no LeaderWorkerSet maxUnavailable (copied onto its leader StatefulSet); a "
    "serving StatefulSet is OnDelete and Parallel, so the updater replaces a batch's pods at once.",
)
def rollout_ga_only(resource_type: str, props: Props) -> list[CheckResult]:
    kind, spec = kind_of(resource_type, props), props.get("spec") or {}
    problems: list[str] = []
    if kind == "StatefulSet":
        strategy = spec.get("updateStrategy") or {}
        if "maxUnavailable" in (rolling := strategy.get("rollingUpdate") or {}):
            problems.append(
                f"spec.updateStrategy.rollingUpdate.maxUnavailable={rolling['maxUnavailable']}: ignored without the "
                "alpha MaxUnavailableStatefulSet gate, so pods update one at a time"
            )
        if _app(spec.get("template") or {}) == SERVING_APP and (
            strategy.get("type") != "OnDelete" or spec.get("podManagementPolicy") != "Parallel"
        ):
            problems.append(
                f"a serving group with updateStrategy.type={strategy.get('type', 'RollingUpdate')}, "
                f"podManagementPolicy={spec.get('podManagementPolicy', 'OrderedReady')}: its controller replaces "
                "(or creates) one pod at a time"
            )
    elif kind == "LeaderWorkerSet":
        config = (spec.get("rolloutStrategy") or {}).get("rollingUpdateConfiguration") or {}
        if "maxUnavailable" in config:
            problems.append(
                f"spec.rolloutStrategy.rollingUpdateConfiguration.maxUnavailable={config['maxUnavailable']}: LWS "
                "copies it onto its leader StatefulSet, where it is ignored without the alpha "
                "MaxUnavailableStatefulSet gate, so replicas update one at a time"
            )
    if not problems:
        return []
    return [
        _finding(
            "rollout-ga-only",
            resource_type,
            props,
            "; ".join(problems),
            "a rollout the target Kubernetes performs: serving StatefulSets OnDelete + Parallel, no maxUnavailable",
            "Render the group with serving.render.k8s.fleet (docs/infra.md, 'How a batch is rolled'): the updater "
            "deletes a batch's pods and the StatefulSet recreates them at once.",
        )
    ]


@resource_rule(
    "node-patch-labels-only", "Node patches carry labels only; taints are set by the kubelet at registration."
)
def node_patch_labels_only(resource_type: str, props: Props) -> list[CheckResult]:
    if kind_of(resource_type, props) != "Node" or "taints" not in (props.get("spec") or {}):
        return []
    return [
        _finding(
            "node-patch-labels-only",
            resource_type,
            props,
            "spec.taints is patched: an atomic list, so the apply conflicts with every other taint (cordon, NotReady, "
            "the kubelet's) and forcing it wipes them",
            "a labels-only node patch",
            "Drop spec.taints; the Ansible role kubelet registers nodes with --register-with-taints.",
        )
    ]


@resource_rule(
    "gpu-taint-convention",
    f"Pods tolerate the GPU operator's {TAINT_KEY} taint, never a custom key NVIDIA's DaemonSets do not tolerate.",
)
def gpu_taint_convention(resource_type: str, props: Props) -> list[CheckResult]:
    out = []
    for where, template in pod_templates(resource_type, props):
        keys = [str(t.get("key") or "") for t in (template.get("spec") or {}).get("tolerations") or []]
        custom = [k for k in keys if k.startswith(f"{PREFIX}/")]
        gpus = any(GPU_RESOURCE in (((c.get("resources") or {}).get("limits")) or {}) for _, c in containers(template))
        if custom or (gpus and TAINT_KEY not in keys):
            out.append(
                _finding(
                    "gpu-taint-convention",
                    resource_type,
                    props,
                    f"{where} tolerates {keys}"
                    + (f": {custom} is a taint NVIDIA's device plugin does not tolerate" if custom else ""),
                    f"GPU pods tolerate {TAINT_KEY} (NoSchedule) and no {PREFIX}/ taint",
                    "Use serving.render.k8s.common.serving_toleration (the GPU operator's convention).",
                )
            )
    return out


@resource_rule(
    "fabric-only-across-nodes",
    "RDMA resources, IPC_LOCK and the Multus secondary network go only to replicas that span nodes.",
)
def fabric_only_across_nodes(resource_type: str, props: Props) -> list[CheckResult]:
    size = ((props.get("spec") or {}).get("leaderWorkerTemplate") or {}).get("size", 1)
    if kind_of(resource_type, props) == "LeaderWorkerSet" and int(size) > 1:
        return []
    out = []
    for where, template in pod_templates(resource_type, props):
        if _app(template) != SERVING_APP:
            continue
        found = (
            [f"network annotation {NETWORKS_ANNOTATION}"]
            if NETWORKS_ANNOTATION in ((template.get("metadata") or {}).get("annotations") or {})
            else []
        )
        for cwhere, c in containers(template):
            found += [
                f"{cwhere} requests {r}"
                for r in ((c.get("resources") or {}).get("limits") or {})
                if r.startswith("rdma/")
            ]
            if "IPC_LOCK" in (((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or []):
                found.append(f"{cwhere} adds IPC_LOCK")
        if found:
            out.append(
                _finding(
                    "fabric-only-across-nodes",
                    resource_type,
                    props,
                    f"{where} of a replica inside one node: {'; '.join(found)}",
                    "the RDMA fabric only on pods of replicas that span nodes (LeaderWorkerSet size > 1)",
                    "Drop them: a replica inside one node does its collectives over NVLink/PCIe "
                    "(serving.render.k8s.fabric.has_rdma).",
                )
            )
    return out


@resource_rule(
    "ipc-lock-runs-as-root",
    "A container adding IPC_LOCK runs as root: a non-root process gets no ambient capabilities.",
)
def ipc_lock_runs_as_root(resource_type: str, props: Props) -> list[CheckResult]:
    out = []
    for where, template, c in _containers_of(resource_type, props):
        sc = c.get("securityContext") or {}
        pod_sc = (template.get("spec") or {}).get("securityContext") or {}
        uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
        if "IPC_LOCK" in ((sc.get("capabilities") or {}).get("add") or []) and (uid is None or int(uid) != 0):
            out.append(
                _finding(
                    "ipc-lock-runs-as-root",
                    resource_type,
                    props,
                    f"{where} adds IPC_LOCK but runs as uid {uid}: the capability never reaches the process and NCCL's "
                    "RDMA registration hits RLIMIT_MEMLOCK",
                    "runAsUser 0 (with runAsNonRoot false) wherever IPC_LOCK is added",
                    "Run the multi-node serving container as root with only IPC_LOCK added "
                    "(serving.render.k8s.container.pod_container).",
                )
            )
    return out


@resource_rule(
    "replica-in-one-rack",
    "The pods of one multi-node replica stay in one rack (pod affinity on the LeaderWorkerSet group key).",
)
def replica_in_one_rack(resource_type: str, props: Props) -> list[CheckResult]:
    lwt = (props.get("spec") or {}).get("leaderWorkerTemplate") or {}
    if kind_of(resource_type, props) != "LeaderWorkerSet" or int(lwt.get("size", 1)) <= 1:
        return []
    out = []
    for where, template in pod_templates(resource_type, props):
        terms = (((template.get("spec") or {}).get("affinity") or {}).get("podAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        ) or []
        if not any(
            t.get("topologyKey") == LABEL_RACK and LWS_GROUP_KEY in (t.get("matchLabelKeys") or []) for t in terms
        ):
            out.append(
                _finding(
                    "replica-in-one-rack",
                    resource_type,
                    props,
                    f"{where} has no required pod affinity keeping the group in one {LABEL_RACK}",
                    f"requiredDuringScheduling pod affinity, matchLabelKeys [{LWS_GROUP_KEY}], topologyKey {LABEL_RACK}",
                    "Render the group with serving.render.k8s.fleet (a rack spread alone splits leader and workers).",
                )
            )
    return out


@resource_rule(
    "workers-scraped-as-pods",
    "Serving pods are scraped by a PodMonitor, never through a Service's Endpoints (truncated at 1,000 addresses).",
)
def workers_scraped_as_pods(resource_type: str, props: Props) -> list[CheckResult]:
    if kind_of(resource_type, props) != "ServiceMonitor":
        return []
    selector = ((props.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    if selector.get(LABEL_NAME) != SERVING_APP:
        return []
    return [
        _finding(
            "workers-scraped-as-pods",
            resource_type,
            props,
            f"spec.selector {dict(selector)} scrapes the serving pods through a Service: Prometheus discovers it "
            "through its Endpoints, which hold at most 1,000 addresses, so the rest of the workers go unscraped",
            "a PodMonitor selecting the serving pods (one target per pod)",
            "Render the workers' monitor with serving.render.k8s.monitoring (a PodMonitor); or, only where every "
            "Prometheus sets serviceDiscoveryRole: EndpointSlice, keep the ServiceMonitor.",
        )
    ]


# The liveness endpoints known to generate nothing (an allow-list: a new path is refused until it is checked).
CHEAP_LIVENESS = {SERVING_APP: LIVENESS_PATH, ROUTER_APP: ROUTER_LIVENESS_PATH}


@resource_rule(
    "liveness-is-cheap",
    f"Liveness probes of serving and router containers call only their cheap endpoint ({CHEAP_LIVENESS}); never a "
    f"generating one ({sorted(GENERATING_PATHS)}) or an unchecked one.",
)
def liveness_is_cheap(resource_type: str, props: Props) -> list[CheckResult]:
    out = []
    for where, template, c in _containers_of(resource_type, props):
        path = (((c.get("livenessProbe") or {}).get("httpGet")) or {}).get("path")
        app = _app(template)
        if app in CHEAP_LIVENESS and path is not None and path != CHEAP_LIVENESS[app]:
            out.append(
                _finding(
                    "liveness-is-cheap",
                    resource_type,
                    props,
                    f"{where}.livenessProbe calls {path}"
                    + (
                        ", which runs a one-token generation: a scheduler stall restarts a replica that then reloads "
                        "for minutes"
                        if path in GENERATING_PATHS
                        else f", which is not {app}'s checked liveness endpoint"
                    ),
                    f"the liveness path that generates nothing ({CHEAP_LIVENESS[app]}); readiness may generate",
                    f"Probe {CHEAP_LIVENESS[app]} for liveness (serving.render.k8s.container.LIVENESS_PATH, "
                    "serving.render.k8s.gateway.LIVENESS_PATH).",
                )
            )
    return out


@resource_rule(
    "serving-guaranteed-cpu",
    "Serving pods are Guaranteed: serving containers request whole CPUs, and every container, init containers "
    "included, requests cpu and memory equal to its limits (QoS counts them all; only Guaranteed CPUs are pinned).",
)
def serving_guaranteed_cpu(resource_type: str, props: Props) -> list[CheckResult]:
    out = []
    for where, template, c in _containers_of(resource_type, props, init=True):
        if _app(template) != SERVING_APP:
            continue
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        cpu = str(req.get("cpu") or "")
        equal = all(req.get(k) and str(req.get(k)) == str(lim.get(k)) for k in ("cpu", "memory"))
        whole = ".initContainers[" in where or (cpu.isdigit() and int(cpu) > 0)
        if not (equal and whole):
            out.append(
                _finding(
                    "serving-guaranteed-cpu",
                    resource_type,
                    props,
                    f"{where} requests cpu={req.get('cpu')!r}, memory={req.get('memory')!r} with limits "
                    f"cpu={lim.get('cpu')!r}, memory={lim.get('memory')!r}: the pod is Burstable",
                    "request = limit for cpu and memory in every container (whole CPUs in the serving container)",
                    "Set serving.cpus_per_gpu in the stack; serving.render.k8s.container sizes the serving container "
                    "and gives the cache wait WAIT_RESOURCES as both requests and limits.",
                )
            )
    return out


@resource_rule("no-slow-awq-kernel", "Serving containers never force SGLang's slow AWQ kernel (--quantization awq).")
def no_slow_awq_kernel(resource_type: str, props: Props) -> list[CheckResult]:
    out = []
    for where, template, c in _containers_of(resource_type, props):
        args = [str(a) for a in [*(c.get("command") or []), *(c.get("args") or [])]]
        forced = any(a == "--quantization=awq" for a in args) or any(
            a == "--quantization" and b == "awq" for a, b in pairwise(args)
        )
        if _app(template) == SERVING_APP and forced:
            out.append(
                _finding(
                    "no-slow-awq-kernel",
                    resource_type,
                    props,
                    f"{where} passes --quantization awq: SGLang runs the slow AWQ kernel instead of awq_marlin",
                    "--quantization awq_marlin (or no flag: SGLang picks the kernel from the checkpoint)",
                    "Keep model.quantization: awq in the stack; serving.render.sglang renders awq_marlin.",
                )
            )
    return out


@resource_rule(
    "spread-satisfiable",
    "A hard (DoNotSchedule) spread of serving pods over racks lets one rack fall a whole share behind and ignores "
    "tainted (cordoned, NotReady) nodes, so a full or lost rack does not strand the rest of a group Pending.",
)
def spread_satisfiable(resource_type: str, props: Props) -> list[CheckResult]:
    out = []
    replicas = int((props.get("spec") or {}).get("replicas") or 1)
    for where, template in _serving_leader_templates(resource_type, props):
        for c in (template.get("spec") or {}).get("topologySpreadConstraints") or []:
            if c.get("topologyKey") != LABEL_RACK or c.get("whenUnsatisfiable") != "DoNotSchedule":
                continue
            skew = int(c.get("maxSkew") or 1)
            if c.get("nodeTaintsPolicy") != "Honor" or (replicas > RACK_SHARE_FLOOR and skew <= 1):
                out.append(
                    _finding(
                        "spread-satisfiable",
                        resource_type,
                        props,
                        f"{where} spreads {replicas} replicas over racks with maxSkew={skew}, nodeTaintsPolicy="
                        f"{c.get('nodeTaintsPolicy')!r}: once one rack is full or cordoned the rest stays Pending",
                        "maxSkew of one rack's share of the group and nodeTaintsPolicy Honor",
                        "Render the spread with serving.render.k8s.fleet.rack_max_skew.",
                    )
                )
    return out


@resource_rule(
    "hardened-pods",
    "Serving and router containers run as non-root where they can, under the RuntimeDefault seccomp profile, and "
    "serving and router containers have a preStop hook (the router's holds it at least the DNS TTL), the grace period "
    "covers the preStop and the router's drain; a Deployment with required host anti-affinity does not surge.",
)
def hardened_pods(resource_type: str, props: Props) -> list[CheckResult]:
    out = []
    for where, template, c in _containers_of(resource_type, props):
        app = _app(template)
        if app not in (SERVING_APP, ROUTER_APP):
            continue
        sc = c.get("securityContext") or {}
        problems = []
        if (sc.get("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append("no seccomp profile")
        adds = ((sc.get("capabilities") or {}).get("add")) or []
        if not sc.get("runAsNonRoot") and "IPC_LOCK" not in adds:
            problems.append("runAsNonRoot is not set")
        held = _pre_stop_s(c)
        if held is None:
            problems.append("no preStop hook (requests are routed to it while it shuts down)")
        elif app == ROUTER_APP and held < DNS_TTL_S:
            problems.append(
                f"preStop holds it {held:g} s < {DNS_TTL_S} s, the DNS TTL the updater and controllers may reuse its "
                "address for: they reach a router that is shutting down"
            )
        words = [str(w) for w in [*(c.get("command") or []), *(c.get("args") or [])]]
        if "--shutdown-grace-period-secs" in words[:-1]:
            drain = float(words[words.index("--shutdown-grace-period-secs") + 1])
            grace = float((template.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
            if grace < (held or 0) + drain:
                problems.append(
                    f"terminationGracePeriodSeconds={grace:g} < preStop {held or 0:g} s + --shutdown-grace-period-secs "
                    f"{drain:g}: the kubelet counts the preStop in the grace period and kills the router mid-drain"
                )
        if problems:
            out.append(
                _finding(
                    "hardened-pods",
                    resource_type,
                    props,
                    f"{where}: {', '.join(problems)}",
                    "runAsNonRoot (unless the container needs IPC_LOCK), seccompProfile RuntimeDefault, a preStop hook "
                    f"(the router's at least {DNS_TTL_S} s), a grace period covering the preStop and the router's drain",
                    "Render the containers with serving.render.k8s.container / gateway.",
                )
            )
    spec = props.get("spec") or {}
    surge = ((spec.get("strategy") or {}).get("rollingUpdate") or {}).get("maxSurge", 0)
    anti = ((((spec.get("template") or {}).get("spec") or {}).get("affinity") or {}).get("podAntiAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or []
    if (
        kind_of(resource_type, props) == "Deployment"
        and str(surge).removesuffix(".0") not in ("0", "0%")  # the engine hands numbers over as floats
        and any(t.get("topologyKey") == HOSTNAME_LABEL for t in anti)
    ):
        out.append(
            _finding(
                "hardened-pods",
                resource_type,
                props,
                f"maxSurge={surge} with required one-per-node anti-affinity: a rollout needs a node beyond the replicas'",
                "maxSurge 0 (and maxUnavailable 1) when pods must sit on distinct nodes",
                "Roll one pod at a time (serving.render.k8s.gateway).",
            )
        )
    return out


def _pre_stop_s(container: Mapping[str, Any]) -> float | None:
    """How long a container's preStop hook holds it before its SIGTERM: the kubelet's sleep action or an exec of
    ``sleep N`` (0: another hook, which holds it for no known time); None without a preStop hook."""
    hook = (container.get("lifecycle") or {}).get("preStop")
    if not hook:
        return None
    if isinstance(hook.get("sleep"), Mapping):
        return float(hook["sleep"].get("seconds", 0))
    command = [str(w) for w in ((hook.get("exec") or {}).get("command") or [])]
    if len(command) == 2 and command[0].rsplit("/", 1)[-1] == "sleep" and command[1].isdigit():
        return float(command[1])
    return 0.0


@resource_rule(
    "alert-offset-placement",
    "Alert expressions put `offset` after a selector or subquery (promtool rejects `(…) offset 25m`).",
)
def alert_offset_placement(resource_type: str, props: Props) -> list[CheckResult]:
    if kind_of(resource_type, props) != "PrometheusRule":
        return []
    return [
        _finding(
            "alert-offset-placement",
            resource_type,
            props,
            f"alert {r.get('alert')}: {str(r.get('expr'))!r} puts offset after a parenthesised expression",
            "offset directly after a vector or range selector (rate(x[5m] offset 25m))",
            "Render the rule with serving.render.k8s.monitoring; `exaserve render` runs promtool check rules.",
        )
        for g in (props.get("spec") or {}).get("groups") or []
        for r in g.get("rules") or []
        if OFFSET_AFTER_PARENS.search(str(r.get("expr") or ""))
    ]


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
                _finding(
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
            if _app(template) not in SYSTEM_APPS:
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
                    _finding(
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
                    _finding(
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
                    _finding(
                        "images-by-digest",
                        t,
                        p,
                        f"{where}.{cwhere}.image is {pulled!r}: a tag, in a production stack",
                        "repo[:tag]@sha256:<64 hex digits>",
                        fix,
                    )
                )
    return out


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
