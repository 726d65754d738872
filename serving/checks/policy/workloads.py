"""Resource rules every workload meets: pinned images, serving containers with GPU and memory limits, probes with
a timeout that does not flap, no privileged container outside the named DaemonSets, no unannotated LoadBalancer."""

from __future__ import annotations

from serving.checks.policy.common import (
    GPU_RESOURCE,
    Props,
    annotation,
    app_of,
    containers,
    describe,
    kind_of,
    pod_templates,
    resource_rule,
    violation,
)
from serving.checks.rules import MIN_HEALTH_TIMEOUT_S
from serving.render.k8s.common import (
    ANNOTATION_ALLOW_LOAD_BALANCER,
    ANNOTATION_PRIVILEGED_REASON,
    ROUTER_APP,
    SERVING_APP,
)
from serving.result import CheckResult
from serving.spec.schema import pinned_image

# DaemonSets allowed a privileged container (still only with a reason in ANNOTATION_PRIVILEGED_REASON).
PRIVILEGED_DAEMONSETS = frozenset({"rdma-shared-device-plugin"})


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
        if app_of(template) != SERVING_APP:
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
        app = app_of(template)
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
    reason = annotation(props, ANNOTATION_PRIVILEGED_REASON)
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
    if annotation(props, ANNOTATION_ALLOW_LOAD_BALANCER):
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
