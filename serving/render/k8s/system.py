"""The system pool's sizing: the pods that run there (routers and controllers, never on a GPU node: they do not
tolerate the GPU taint), and the fewest nodes of the pool's size that hold them.

Derived from the rendered pods' own requests and placement (:data:`gateway.ROUTER_REQUESTS` with its required
one-per-node anti-affinity, :data:`runtime.CONTROLLER_REQUESTS` with a preferred spread) and the replica counts of
the spec, so a change to either moves the figure. Both roll with ``maxSurge: 0``: an update needs no extra node.
The cluster's Prometheus is not counted: kube-prometheus-stack runs in its own namespace, placed by its own values.
"""

from __future__ import annotations

from dataclasses import dataclass

from serving.render.k8s import gateway, runtime
from serving.render.k8s.common import Requests
from serving.spec.schema import GB, FleetSpec, SystemPool


@dataclass(frozen=True)
class SystemPods:
    """One kind of pod of the system pool: how many, what each requests, whether at most one may share a node."""

    name: str
    replicas: int
    requests: Requests
    one_per_node: bool


def system_pods(spec: FleetSpec) -> list[SystemPods]:
    return [
        SystemPods(gateway.NAME, gateway.router_replicas(spec), gateway.ROUTER_REQUESTS, one_per_node=True),
        SystemPods(runtime.CONTROLLER, spec.scheduler.instances, runtime.CONTROLLER_REQUESTS, one_per_node=False),
    ]


def _fits(pods: list[SystemPods], nodes: int, pool: SystemPool) -> bool:
    """Whether ``nodes`` nodes of the pool's size hold every pod: the one-per-node kinds on distinct nodes, then the
    rest first-fit on what each node has left (an upper bound on what the scheduler must find)."""
    free = [[round(pool.cpu * 1000), round(pool.memory_gb * GB)] for _ in range(nodes)]
    for kind in sorted(pods, key=lambda k: not k.one_per_node):
        need = (kind.requests.millicpu, kind.requests.memory_bytes)
        if kind.one_per_node and kind.replicas > nodes:
            return False
        used: set[int] = set()
        for _ in range(kind.replicas):
            for i, left in enumerate(free):
                if (not kind.one_per_node or i not in used) and left[0] >= need[0] and left[1] >= need[1]:
                    left[0] -= need[0]
                    left[1] -= need[1]
                    used.add(i)
                    break
            else:
                return False
    return True


def min_nodes(spec: FleetSpec, pool: SystemPool) -> int | None:
    """The fewest nodes of ``pool``'s per-node CPU and memory that hold the system pods; None when one pod alone is
    larger than a node."""
    pods = system_pods(spec)
    floor = max([k.replicas for k in pods if k.one_per_node], default=1)
    ceiling = floor + sum(k.replicas for k in pods)
    return next((n for n in range(floor, ceiling + 1) if _fits(pods, n, pool)), None)
