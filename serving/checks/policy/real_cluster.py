"""Resource rules from the first `pulumi up` on a real cluster (issue 10): one per finding (docs/infra.md,
"Findings"), each failing the shape that broke day one — what `up` waits for, the node cache, the rollout budget
Kubernetes ignores, node patches, taints, the RDMA fabric, rack affinity and spread, scraping, liveness, CPU
pinning, the AWQ kernel, hardened pods and alert expressions."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Mapping
from itertools import pairwise
from typing import Any

from serving.checks.policy.common import (
    GPU_RESOURCE,
    SERVING_GROUP_KINDS,
    WORKLOAD_KINDS,
    Props,
    annotation,
    app_of,
    containers,
    finding,
    kind_of,
    pod_templates,
    resource_rule,
)
from serving.render.k8s.common import (
    ANNOTATION_SKIP_AWAIT,
    ANNOTATION_TIMEOUT_S,
    HOSTNAME_LABEL,
    LABEL_NAME,
    LABEL_RACK,
    PREFIX,
    ROUTER_APP,
    SERVING_APP,
    TAINT_KEY,
)
from serving.render.k8s.container import GENERATING_PATHS, LIVENESS_PATH
from serving.render.k8s.fabric import NETWORKS_ANNOTATION
from serving.render.k8s.fleet import LWS_GROUP_KEY
from serving.render.k8s.gateway import DNS_TTL_S
from serving.render.k8s.gateway import LIVENESS_PATH as ROUTER_LIVENESS_PATH
from serving.render.k8s.storage import COMPLETE_MARKER, WARMER
from serving.result import CheckResult

# Workloads whose readiness follows model loading (or the cache copy): `pulumi up` must not wait for them.
NOT_AWAITED_APPS = frozenset({SERVING_APP, ROUTER_APP, WARMER})
# A group this small may keep a rack spread of 1: one rack's share is a single pod.
RACK_SHARE_FLOOR = 16
OFFSET_AFTER_PARENS = re.compile(r"\)\s*offset\s")
# The server's flags naming a model directory it loads from the node cache (the cache warmer fills each, and its
# marker says the copy is complete): the model and a speculative draft.
CACHED_MODEL_FLAGS = ("--model-path", "--speculative-draft-model-path")
# What a cache wait's loop body may run: it prints and sleeps, and nothing in it ends the loop.
WAIT_BODY_COMMANDS = frozenset({"echo", "sleep"})


def _number(value: Any) -> str:
    """An int-or-string as written (the engine hands integers over as floats: 41.0 is shown 41)."""
    return str(value).removesuffix(".0") if isinstance(value, float) else str(value)


def _zero(value: Any) -> bool:
    """An int-or-string budget that is zero: 0 (or 0.0 from the engine), "0" or "0%"."""
    return _number(value).strip() in ("0", "0%")


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
        if app_of(template) != SERVING_APP:
            continue
        if where.endswith("workerTemplate") and lwt.get("leaderTemplate"):
            continue
        out.append((where, template))
    return out


def cached_models(template: Props) -> list[str]:
    """The model directories the pod's serving container loads (:data:`CACHED_MODEL_FLAGS`, ``--flag DIR`` or
    ``--flag=DIR``)."""
    out = []
    for _, c in containers(template):
        if c.get("name") != SERVING_APP:
            continue
        words = [str(w) for w in [*(c.get("command") or []), *(c.get("args") or [])]]
        for i, word in enumerate(words):
            flag, eq, value = word.partition("=")
            if flag in CACHED_MODEL_FLAGS:
                if eq:
                    out.append(value)
                elif i + 1 < len(words):
                    out.append(words[i + 1])
    return out


def cache_waits(script: str) -> tuple[list[str], str | None]:
    """The marker files a ``/bin/sh -c`` script waits for, in order, and why it may end before they all exist (None:
    it cannot). What it accepts is the whole grammar of the render's :func:`~serving.render.k8s.container.wait_script`:
    ``until [ -f FILE ]; do BODY; done`` loops, whose BODY only echoes and sleeps, then echoes; no other command,
    operator (``&&``, ``||``, ``&``, ``|``), redirect, substitution or expansion, so nothing can leave a loop early or
    run instead of it."""
    try:
        lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = ""  # a '#' is refused below, never read as the end of the script
        tokens = list(lexer)
    except ValueError as exc:
        return [], f"the script does not parse ({exc})"
    bad = [t for t in tokens if any(ch in t for ch in "$`#") or (t and set(t) <= set("();<>|&") and t != ";")]
    if bad:
        return [], (
            f"it uses {bad[:3]}: an operator, redirect, subshell, substitution or comment outside the wait's grammar"
        )
    commands: list[list[str]] = [[]]
    for t in tokens:
        if t == ";":
            commands.append([])
        else:
            commands[-1].append(t)
    commands = [c for c in commands if c]
    markers: list[str] = []
    i = 0
    while i < len(commands):
        c = commands[i]
        if c[0] != "until":
            break
        if len(c) != 5 or c[1:3] != ["[", "-f"] or c[4] != "]":
            return markers, f"the loop test {' '.join(c[1:])!r} is not '[ -f FILE ]'"
        body = []
        j = i + 1
        while j < len(commands) and commands[j][0] != "done":
            body.append(commands[j])
            j += 1
        if j == len(commands) or commands[j] != ["done"] or not body or body[0][:1] != ["do"]:
            return markers, f"the loop on {c[3]!r} is not 'do …; done'"
        body[0] = body[0][1:]
        for command in (b for b in body if b):
            if command[0] not in WAIT_BODY_COMMANDS:
                return markers, f"the loop on {c[3]!r} runs {command[0]!r} (only {sorted(WAIT_BODY_COMMANDS)} may)"
        markers.append(c[3])
        i = j + 1
    for c in commands[i:]:
        if c[0] != "echo":
            return markers, f"it runs {' '.join(c)!r} outside a wait loop"
    return markers, None


@resource_rule(
    "serving-waits-for-node-cache",
    "Serving pods wait for their own node's model cache in an init container (never the fleet for the warmer): a "
    "loop that ends only once the marker of every model the server loads exists.",
)
def serving_waits_for_node_cache(resource_type: str, props: Props) -> list[CheckResult]:
    out = []
    for where, template in pod_templates(resource_type, props):
        if app_of(template) != SERVING_APP:
            continue
        models = cached_models(template)
        wanted = [f"{m.rstrip('/')}/{COMPLETE_MARKER}" for m in models]
        inits = (template.get("spec") or {}).get("initContainers") or []
        commands = [[str(w) for w in c.get("command") or []] for c in inits]
        scripts = [cmd[2] for cmd in commands if len(cmd) == 3 and cmd[1] == "-c"]
        seen = [cache_waits(script) for script in scripts]
        if models and any(why is None and set(wanted) <= set(markers) for markers, why in seen):
            continue
        if not models:
            problem = f"its serving container names no {' or '.join(CACHED_MODEL_FLAGS)}, so no wait can be checked"
        elif not scripts:
            problem = f"no init container runs a '/bin/sh -c' wait (commands: {commands})"
        else:
            problem = "; ".join(
                f"wait script {i}: "
                + (why if why is not None else f"waits for {markers}, not {sorted(set(wanted) - set(markers))}")
                for i, (markers, why) in enumerate(seen)
            )
        out.append(
            finding(
                "serving-waits-for-node-cache",
                resource_type,
                props,
                f"{where} has no init container waiting for the cache marker(s) {wanted} of the models it loads: "
                + problem,
                f"an init container holding each serving pod until its node's cache has {wanted}: "
                "'until [ -f MARKER ]; do echo …; sleep N; done' for each, nothing else",
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
    skip = annotation(props, ANNOTATION_SKIP_AWAIT) == "true"
    timeout = annotation(props, ANNOTATION_TIMEOUT_S)
    apps = {app_of(t) for _, t in pod_templates(resource_type, props)}
    must_skip = bool(apps & NOT_AWAITED_APPS)
    if skip or (timeout and not must_skip):
        return []
    observed = (
        f"{ANNOTATION_TIMEOUT_S}={timeout} on pods whose readiness follows model loading ({sorted(a for a in apps if a)})"
        if timeout
        else f"neither {ANNOTATION_SKIP_AWAIT} nor {ANNOTATION_TIMEOUT_S}: `pulumi up` waits for every pod"
    )
    return [
        finding(
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
    if annotation(props, ANNOTATION_SKIP_AWAIT) == "true":
        return []
    return [
        finding(
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
        finding(
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
    "(alpha MaxUnavailableStatefulSet), no LeaderWorkerSet maxUnavailable or maxSurge (copied onto its leader "
    "StatefulSet; a surge also creates replicas beyond the plan) nor partition (the replicas below it never update); a "
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
        if app_of(spec.get("template") or {}) == SERVING_APP and (
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
        if not _zero(surge := config.get("maxSurge", 0)):
            problems.append(
                f"spec.rolloutStrategy.rollingUpdateConfiguration.maxSurge={_number(surge)}: LWS adds it onto its leader "
                "StatefulSet's maxUnavailable (ignored without the alpha gate) and creates that many replicas beyond "
                "the plan's, each needing its own GPUs and nodes"
            )
        if not _zero(partition := config.get("partition", 0)):
            problems.append(
                f"spec.rolloutStrategy.rollingUpdateConfiguration.partition={_number(partition)}: LWS never updates the "
                "replicas below it, so the updater's batch never completes and those replicas keep the old release"
            )
    if not problems:
        return []
    return [
        finding(
            "rollout-ga-only",
            resource_type,
            props,
            "; ".join(problems),
            "a rollout the target Kubernetes performs: serving StatefulSets OnDelete + Parallel, no maxUnavailable; "
            "a LeaderWorkerSet at LWS's default rollout (no maxUnavailable, maxSurge 0, partition 0)",
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
        finding(
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
                finding(
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
        if app_of(template) != SERVING_APP:
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
                finding(
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
                finding(
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
                finding(
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
        finding(
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
        app = app_of(template)
        if app in CHEAP_LIVENESS and path is not None and path != CHEAP_LIVENESS[app]:
            out.append(
                finding(
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
        if app_of(template) != SERVING_APP:
            continue
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        cpu = str(req.get("cpu") or "")
        equal = all(req.get(k) and str(req.get(k)) == str(lim.get(k)) for k in ("cpu", "memory"))
        whole = ".initContainers[" in where or (cpu.isdigit() and int(cpu) > 0)
        if not (equal and whole):
            out.append(
                finding(
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
        if app_of(template) == SERVING_APP and forced:
            out.append(
                finding(
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
                    finding(
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
        app = app_of(template)
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
                finding(
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
            finding(
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
        finding(
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
