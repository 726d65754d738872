"""The serving container of a pod (camelCase, as the Kubernetes API takes it): the SGLang command of
:mod:`serving.render.sglang` with per-pod values from the downward API and, for multi-node replicas, the
LeaderWorkerSet environment; whole CPUs, GPU, memory and (only where a replica spans nodes) RDMA resources;
probes; least-privilege security context; and the init container that holds the pod until its node's model
cache is complete.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Sequence
from typing import Any, Final

from serving.plan.model import Fleet, Plan
from serving.render import sglang
from serving.render.common import RenderError, checked_memory, render_flags, whole_seconds
from serving.render.k8s.common import image
from serving.render.k8s.fabric import has_rdma
from serving.render.k8s.storage import COMPLETE_MARKER, cache_dirs
from serving.render.sglang import (
    SERVER_ENTRY,
    SERVICE_HOME,
    ServerContext,
    check_server_argv,
)
from serving.sglang_health import HEALTH_PATH, SCHEDULER_HEALTH_PATH
from serving.spec.schema import GB, GIB, FleetSpec

# Pods: labels the router's service discovery selects on; the fleet program puts them on the pods
# that serve HTTP (single-node replicas, or the leader pod of a multi-node LeaderWorkerSet group).
SERVER_POD_LABELS: Final = {"app.kubernetes.io/name": "sglang", "app.kubernetes.io/component": "server"}


LWS_LEADER_LABEL: Final = ("leaderworkerset.sigs.k8s.io/worker-index", "0")


# LeaderWorkerSet puts these in every pod of a group; the kubelet expands $(VAR) in args.
LWS_WORKER_INDEX: Final = "$(LWS_WORKER_INDEX)"


LWS_LEADER_ADDRESS: Final = "$(LWS_LEADER_ADDRESS)"


CONTAINER_NAME: Final = "sglang"


VOLUME_SHM, VOLUME_MODELS, VOLUME_HOME = "dshm", "model-cache", "sglang-home"


WAIT_FOR_CACHE = "wait-for-cache"


# Liveness asks only "does the HTTP server answer": /model_info reads the tokenizer manager's state and runs no
# generation. /health runs a one-token generation (SGLang 0.5.x), so a scheduler stall would fail it and a liveness
# probe on it would restart a replica that then reloads for minutes; readiness and the router may generate.
LIVENESS_PATH: Final = "/model_info"
GENERATING_PATHS: Final = frozenset({HEALTH_PATH, SCHEDULER_HEALTH_PATH})  # /health: unless the server's env says not


# Seconds between two looks at the cache marker while a pod waits for its node's cache.
CACHE_POLL_S: Final = 10


# What the cache wait needs: a shell polling a file every CACHE_POLL_S.
WAIT_RESOURCES: Final = {"cpu": "100m", "memory": "32Mi"}


def gpus_per_pod(plan: Plan) -> int:
    """A replica on one node is one pod; a multi-node replica has one pod per node, each with all GPUs."""
    p = plan.placement
    return p.gpus_per_replica if p.nodes_per_replica == 1 else p.gpus_per_node


def shm_bytes(fleet: Fleet) -> int:
    """Shared memory (the /dev/shm mount) of a serving pod: ``serving.shm_gb_per_gpu`` × the pod's GPUs, rounded up to whole GiB. NCCL's
    shared-memory transport keeps buffers per pair of local GPUs, so the need grows with the GPUs in the pod."""
    return math.ceil(fleet.spec.serving.shm_gb_per_gpu * GB * gpus_per_pod(fleet.plan) / GIB) * GIB


def pod_cpus(fleet: Fleet) -> int:
    """Whole CPUs of a serving pod (request = limit): ``serving.cpus_per_gpu`` × the pod's GPUs."""
    return fleet.spec.serving.cpus_per_gpu * gpus_per_pod(fleet.plan)


def pod_memory_bytes(fleet: Fleet) -> int:
    """Host memory of a serving pod (request = limit): its /dev/shm (memory-backed, counted against the
    limit), the pod's share of the weights (staged through host memory while loading) and the framework
    overhead of each GPU process. Rounded up to whole GiB."""
    mp = fleet.plan.memory
    gpus = gpus_per_pod(fleet.plan)
    total = shm_bytes(fleet) + mp.per_gpu["weights"].value * gpus + fleet.spec.model.framework_overhead_gb * GB * gpus
    return math.ceil(total / GIB) * GIB


def _probe(
    spec: FleetSpec, failure_threshold: int, success_threshold: int = 1, path: str = HEALTH_PATH
) -> dict[str, Any]:
    s = spec.serving
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": whole_seconds(s.heartbeat_interval_s),
        "timeoutSeconds": whole_seconds(s.health_check_timeout_s),
        "failureThreshold": failure_threshold,
        "successThreshold": success_threshold,
    }


def pod_volumes(fleet: Fleet) -> list[dict[str, Any]]:
    """The pod-level volumes :func:`pod_container` mounts."""
    return [
        {"name": VOLUME_SHM, "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_bytes(fleet) // GIB}Gi"}},
        {"name": VOLUME_MODELS, "hostPath": {"path": fleet.spec.storage.local_cache.path, "type": "Directory"}},
        {"name": VOLUME_HOME, "emptyDir": {}},
    ]


def as_leader_pod(words: Sequence[str]) -> list[str]:
    """``words`` with the LeaderWorkerSet references expanded as the kubelet would in a leader pod
    (rank 0, an example address): what the parsers check, since they cannot read ``$(VAR)``."""
    leader = {LWS_WORKER_INDEX: "0", LWS_LEADER_ADDRESS: "10.0.0.1"}
    refs = re.compile("|".join(re.escape(ref) for ref in leader))
    return [refs.sub(lambda m: leader[m.group(0)], word) for word in words]


def pod_container(fleet: Fleet, group: int, *, leader: bool = True) -> dict[str, Any]:
    """The serving container (camelCase, as the Kubernetes API takes it) of update group ``group``.

    Same command and environment as :func:`server_argv`/:func:`server_env`, with per-pod values from
    the downward API and, for multi-node replicas, the LeaderWorkerSet environment. ``leader=False``
    is a non-leader pod of a multi-node replica: it serves no HTTP, so it has no probes.
    """
    if not 0 <= group < fleet.spec.rollout.batches:
        raise RenderError(
            f"update group {group} does not exist; rollout.batches={fleet.spec.rollout.batches} gives 0..{fleet.spec.rollout.batches - 1}"
        )
    p = fleet.plan.placement
    ctx = ServerContext(
        spec=fleet.spec,
        memory=checked_memory(fleet),
        host="0.0.0.0",  # noqa: S104  (the pod's own network namespace)
        port=fleet.spec.serving.port,
        nnodes=p.nodes_per_replica,
        node_rank=LWS_WORKER_INDEX,
        dist_init_host=LWS_LEADER_ADDRESS,
        gpu_ids=(),
        replica_id="",
        release=fleet.spec.group_version(group),
    )
    flags = render_flags(sglang.SERVER_FLAGS, ctx)
    check_server_argv([*SERVER_ENTRY, *as_leader_pod(flags)])
    env: list[dict[str, Any]] = []
    for rule in sglang.SERVER_ENV:
        if rule.host_only:
            continue
        if rule.pod_field:
            env.append({"name": rule.name, "valueFrom": {"fieldRef": {"fieldPath": rule.pod_field}}})
        elif (value := rule.value(ctx)) is not None:
            env.append({"name": rule.name, "value": value})
    s = fleet.spec.serving
    resources: dict[str, str] = {
        "cpu": str(pod_cpus(fleet)),
        "memory": f"{pod_memory_bytes(fleet) // GIB}Gi",
        "nvidia.com/gpu": str(gpus_per_pod(fleet.plan)),
    }
    security: dict[str, Any] = {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if has_rdma(fleet):  # only a replica that spans nodes talks over the fabric
        resources[fleet.spec.kubernetes.rdma_resource] = "1"
        # NCCL registers (pins) its RDMA buffers with ibv_reg_mr. A capability reaches a process only when it runs
        # as root: a non-root user gets no ambient capabilities, so IPC_LOCK would do nothing for uid 1000, and the
        # container runtime's default RLIMIT_MEMLOCK (64 KiB) would fail the registration. Root with IPC_LOCK is
        # exempt from RLIMIT_MEMLOCK; every other capability stays dropped and privilege escalation is off.
        security.update(
            runAsNonRoot=False, runAsUser=0, runAsGroup=0, capabilities={"drop": ["ALL"], "add": ["IPC_LOCK"]}
        )
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": image(fleet.spec, fleet.spec.group_image(group)),
        "imagePullPolicy": "IfNotPresent",
        "command": list(SERVER_ENTRY),
        "args": flags,
        "env": env,
        "ports": [{"name": "http", "containerPort": s.port, "protocol": "TCP"}],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "securityContext": security,
        "volumeMounts": [
            {"name": VOLUME_SHM, "mountPath": "/dev/shm"},  # noqa: S108  (a mount point, not a temp file)
            {"name": VOLUME_MODELS, "mountPath": fleet.spec.storage.local_cache.path, "readOnly": True},
            {"name": VOLUME_HOME, "mountPath": SERVICE_HOME},
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    # The router notices a terminating pod through its watch; keep serving one heartbeat interval before SIGTERM so
    # no new request is routed to a process that is shutting down (then terminationGracePeriodSeconds drains).
    container["lifecycle"] = {
        "preStop": {"exec": {"command": ["/bin/sleep", str(whole_seconds(s.heartbeat_interval_s))]}}
    }
    if leader:
        interval = whole_seconds(s.heartbeat_interval_s)
        # Started and ready mean the scheduler answers (a generation), not only the HTTP server.
        container["startupProbe"] = _probe(
            fleet.spec, math.ceil(whole_seconds(s.startup_budget_s) / interval), path=SCHEDULER_HEALTH_PATH
        )
        container["readinessProbe"] = _probe(
            fleet.spec, s.failure_threshold, s.success_threshold, path=SCHEDULER_HEALTH_PATH
        )
        container["livenessProbe"] = _probe(fleet.spec, s.failure_threshold, path=LIVENESS_PATH)
    return container


def wait_script(spec: FleetSpec) -> str:
    """Wait until the node's model cache holds every complete model the server loads (the cache warmer's markers:
    the model's, and a speculative draft's), one ``until`` loop a marker (the shape policy ``CACHE_WAIT`` checks)."""
    loops = [
        f"until [ -f {m} ]; do echo waiting for the model cache of this node: {m}; sleep {CACHE_POLL_S}; done"
        for m in (shlex.quote(f"{dst}/{COMPLETE_MARKER}") for _, dst in cache_dirs(spec))
    ]
    return "; ".join([*loops, "echo model cache complete"])


def cache_init_container(spec: FleetSpec, group: int) -> dict[str, Any]:
    """Hold a serving pod until its own node's cache is warm: each pod waits for its node, not the fleet for every
    node (the cache warmer DaemonSet fills the caches in the background, outside Pulumi's wait)."""
    return {
        "name": WAIT_FOR_CACHE,
        "image": image(spec, spec.group_image(group)),
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", wait_script(spec)],
        # requests = limits: the QoS class counts init containers, and one Burstable container makes the whole pod
        # Burstable, whose CPUs the static CPU manager never pins (kubernetes pkg/apis/core/v1/helper/qos/qos.go).
        "resources": {"requests": dict(WAIT_RESOURCES), "limits": dict(WAIT_RESOURCES)},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [{"name": VOLUME_MODELS, "mountPath": spec.storage.local_cache.path, "readOnly": True}],
    }
