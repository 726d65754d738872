"""The serving container of a pod (camelCase, as the Kubernetes API takes it): the SGLang command of
:mod:`serving.render.sglang` with per-pod values from the downward API and, for multi-node replicas, the
LeaderWorkerSet environment; GPU, RDMA and memory resources; probes; least-privilege security context.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, Final

from serving.plan.model import Plan
from serving.render import sglang
from serving.render.common import RenderError, checked_memory, rdma, render_flags, whole_seconds
from serving.render.sglang import (
    HEALTH_PATH,
    SERVER_ENTRY,
    SERVICE_HOME,
    ServerContext,
    check_server_argv,
)
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


def gpus_per_pod(plan: Plan) -> int:
    """A replica on one node is one pod; a multi-node replica has one pod per node, each with all GPUs."""
    p = plan.placement
    return p.gpus_per_replica if p.nodes_per_replica == 1 else p.gpus_per_node


def pod_memory_bytes(spec: FleetSpec, plan: Plan) -> int:
    """Host memory limit of a serving pod: its /dev/shm (memory-backed, counted against the limit),
    the pod's share of the weights (staged through host memory while loading) and the framework
    overhead of each GPU process. Rounded up to whole GiB."""
    mp = plan.memory
    gpus = gpus_per_pod(plan)
    total = (
        spec.serving.shm_size_gb * GB
        + mp.per_gpu["weights"].value * gpus
        + spec.model.framework_overhead_gb * GB * gpus
    )
    return math.ceil(total / GIB) * GIB


def _probe(spec: FleetSpec, failure_threshold: int, success_threshold: int = 1) -> dict[str, Any]:
    s = spec.serving
    return {
        "httpGet": {"path": HEALTH_PATH, "port": "http"},
        "periodSeconds": whole_seconds(s.heartbeat_interval_s),
        "timeoutSeconds": whole_seconds(s.health_check_timeout_s),
        "failureThreshold": failure_threshold,
        "successThreshold": success_threshold,
    }


def pod_volumes(spec: FleetSpec) -> list[dict[str, Any]]:
    """The pod-level volumes :func:`pod_container` mounts."""
    return [
        {
            "name": VOLUME_SHM,
            "emptyDir": {"medium": "Memory", "sizeLimit": f"{math.ceil(spec.serving.shm_size_gb * GB / GIB)}Gi"},
        },
        {"name": VOLUME_MODELS, "hostPath": {"path": spec.storage.local_cache.path, "type": "Directory"}},
        {"name": VOLUME_HOME, "emptyDir": {}},
    ]


def as_leader_pod(words: Sequence[str]) -> list[str]:
    """``words`` with the LeaderWorkerSet references expanded as the kubelet would in a leader pod
    (rank 0, an example address): what the parsers check, since they cannot read ``$(VAR)``."""
    leader = {LWS_WORKER_INDEX: "0", LWS_LEADER_ADDRESS: "10.0.0.1"}
    refs = re.compile("|".join(re.escape(ref) for ref in leader))
    return [refs.sub(lambda m: leader[m.group(0)], word) for word in words]


def pod_container(spec: FleetSpec, plan: Plan, group: int, *, leader: bool = True) -> dict[str, Any]:
    """The serving container (camelCase, as the Kubernetes API takes it) of update group ``group``.

    Same command and environment as :func:`server_argv`/:func:`server_env`, with per-pod values from
    the downward API and, for multi-node replicas, the LeaderWorkerSet environment. ``leader=False``
    is a non-leader pod of a multi-node replica: it serves no HTTP, so it has no probes.
    """
    if not 0 <= group < spec.rollout.batches:
        raise RenderError(
            f"update group {group} does not exist; rollout.batches={spec.rollout.batches} gives 0..{spec.rollout.batches - 1}"
        )
    p = plan.placement
    ctx = ServerContext(
        spec=spec,
        memory=checked_memory(spec, plan),
        host="0.0.0.0",  # noqa: S104  (the pod's own network namespace)
        port=spec.serving.port,
        nnodes=p.nodes_per_replica,
        node_rank=LWS_WORKER_INDEX,
        dist_init_host=LWS_LEADER_ADDRESS,
        gpu_ids=(),
        replica_id="",
        release=spec.group_version(group),
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
    s = spec.serving
    gpus = str(gpus_per_pod(plan))
    memory = f"{pod_memory_bytes(spec, plan) // GIB}Gi"
    resources: dict[str, str] = {"nvidia.com/gpu": gpus, "memory": memory}
    capabilities: dict[str, list[str]] = {"drop": ["ALL"]}
    if rdma(spec):
        resources[spec.kubernetes.rdma_resource] = "1"
        capabilities["add"] = ["IPC_LOCK"]  # pin RDMA buffers (ibv_reg_mr)
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.group_image(group),
        "imagePullPolicy": "IfNotPresent",
        "command": list(SERVER_ENTRY),
        "args": flags,
        "env": env,
        "ports": [{"name": "http", "containerPort": s.port, "protocol": "TCP"}],
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "securityContext": {
            "privileged": False,
            "allowPrivilegeEscalation": False,
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "capabilities": capabilities,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": VOLUME_SHM, "mountPath": "/dev/shm"},  # noqa: S108  (a mount point, not a temp file)
            {"name": VOLUME_MODELS, "mountPath": spec.storage.local_cache.path, "readOnly": True},
            {"name": VOLUME_HOME, "mountPath": SERVICE_HOME},
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if leader:
        interval = whole_seconds(s.heartbeat_interval_s)
        container["startupProbe"] = _probe(spec, math.ceil(whole_seconds(s.startup_budget_s) / interval))
        container["readinessProbe"] = _probe(spec, s.failure_threshold, s.success_threshold)
        container["livenessProbe"] = _probe(spec, s.failure_threshold)
    return container
