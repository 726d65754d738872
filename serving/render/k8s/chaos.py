"""The fault drills as Chaos Mesh experiments (``exaserve drill --render-only``): one experiment per scenario of
:mod:`serving.drill.scenarios` that Chaos Mesh can express, and a ``Schedule`` that runs ``drills.scheduled`` one
after another on ``drills.schedule``.

Experiments select pods by the labels the renderers put on them, in the stack's namespace: the serving pods by
:data:`~serving.render.k8s.container.SERVER_POD_LABELS` (the leader pod of a multi-node replica: that is the
server), the router, controller and agent pods by ``app.kubernetes.io/name``. Sizes come from
:func:`serving.drill.scenarios.fault_sizes`: a held fault lasts the plan's restoration time.

What Chaos Mesh cannot express exactly is said in the experiment's notes, and a scenario it cannot express at all
is returned as :class:`NotRendered` with the reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from serving.drill.scenarios import SCENARIOS, Component, Fault, FaultKind, Scenario, fault_sizes, plan_targets
from serving.drill.scenarios import TargetName as T
from serving.plan.model import Fleet, Plan
from serving.render.common import RenderError
from serving.render.k8s.common import (
    LABEL_NAME,
    PREFIX,
    ROUTER_APP,
    SERVING_APP,
    K8sObject,
    labels,
    metadata,
)
from serving.render.k8s.container import CONTAINER_NAME, LWS_LEADER_LABEL, SERVER_POD_LABELS, gpus_per_pod
from serving.render.k8s.runtime import AGENT, CONTROLLER
from serving.spec.schema import GIB, DrillName, FleetSpec

API = "chaos-mesh.org/v1alpha1"
COMPONENT = "drills"
LABEL_DRILL = f"{PREFIX}/drill"
SCHEDULE_NAME = "exaserve-drills"
SCHEDULE_HISTORY = 5
ENTRY = "drills"
# Chaos Mesh's field in a Schedule or a workflow template for each kind.
EMBED_FIELD = {"PodChaos": "podChaos", "NetworkChaos": "networkChaos", "StressChaos": "stressChaos"}
NO_WEDGE_CHAOS = (
    "not rendered: no Chaos Mesh experiment stops a server's scheduler while its HTTP server answers (PodChaos kills "
    "or fails the whole container, NetworkChaos cuts every answer: that is replica-hang). On a cluster, SGLang's "
    "--watchdog-timeout ends a forward batch hung that long; the sandbox drill wedges the simulated scheduler."
)
NO_HTTP_CHAOS = (
    "not rendered: making a server answer HTTP 500 needs Chaos Mesh's HTTPChaos, which is not among the pinned CRDs "
    "(serving/data/crds.lock.json: PodChaos, NetworkChaos, StressChaos, Schedule), so it could not be validated; "
    "PodChaos and NetworkChaos cannot produce an HTTP status. The sandbox drill injects it in the worker."
)

NO_FLAP_CHAOS = (
    "not rendered: no Chaos Mesh experiment stalls a server's scheduler now and then while its HTTP server answers "
    "(PodChaos kills or fails the whole container, NetworkChaos cuts every answer); the sandbox drill stalls the "
    "simulated scheduler at every other health check."
)


@dataclass(frozen=True)
class Step:
    """One fault as Chaos Mesh expresses it: the kind, its spec without a duration, and whether it is held (lasts a
    duration) or happens at once."""

    kind: str
    action: str
    spec: dict[str, Any]
    held: bool
    note: str = ""


@dataclass(frozen=True)
class Experiment:
    """A scenario as Chaos Mesh objects applied together (two for a double fault)."""

    scenario: DrillName
    objects: tuple[K8sObject, ...]
    actions: tuple[str, ...]
    notes: tuple[str, ...]

    def summary(self) -> str:
        return " + ".join(f"{o['kind']} {action}" for o, action in zip(self.objects, self.actions, strict=True))


@dataclass(frozen=True)
class NotRendered:
    scenario: DrillName
    reason: str


def _ms(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms"


def _serving(fleet: Fleet) -> dict[str, Any]:
    selected = dict(SERVER_POD_LABELS)
    if fleet.plan.multi_node:  # the server of a multi-node replica is its leader pod
        selected[LWS_LEADER_LABEL[0]] = LWS_LEADER_LABEL[1]
    return {"namespaces": [fleet.spec.kubernetes.namespace], "labelSelectors": selected}


def _by_name(spec: FleetSpec, app: str) -> dict[str, Any]:
    return {"namespaces": [spec.kubernetes.namespace], "labelSelectors": {LABEL_NAME: app}}


def _node(plan: Plan) -> str:
    """The node the node-wide drills hit: the first of the plan's placement."""
    return plan.replicas[0].node.name


def stress_bytes(fleet: Fleet) -> int:
    """Memory the stressor takes in one serving container: half the host memory the pod holds for staging its
    weights, which a loaded replica no longer needs. Pressure inside the pod's limit, not an OOM kill."""
    staging = fleet.plan.memory.per_gpu["weights"].value * gpus_per_pod(fleet.plan)
    return max(1, math.floor(staging / 2 / GIB)) * GIB


def _step(fault: Fault, fleet: Fleet) -> Step | str:
    sizes = fault_sizes(fleet)
    one_replica: dict[str, Any] = {"mode": "one", "selector": _serving(fleet)}
    match fault.kind, fault.component:
        case FaultKind.SIGKILL, Component.REPLICA:
            return Step(
                "PodChaos",
                "container-kill",
                {**one_replica, "action": "container-kill", "containerNames": [CONTAINER_NAME]},
                held=False,
                note="container-kill sends SIGKILL to the serving container; the kubelet restarts it in place",
            )
        case FaultKind.SIGSTOP, Component.REPLICA:
            return Step(
                "NetworkChaos",
                "loss",
                {**one_replica, "action": "loss", "loss": {"loss": "100", "correlation": "100"}},
                held=True,
                note="Chaos Mesh has no SIGSTOP: every packet of one serving pod dropped looks the same from outside "
                "(requests and probes time out, nothing is refused)",
            )
        case FaultKind.LATENCY, Component.REPLICA:
            return Step(
                "NetworkChaos",
                "delay",
                {**one_replica, "action": "delay", "delay": {"latency": _ms(sizes.slow_latency_s.value)}},
                held=True,
                note=f"every packet of one serving pod delayed {sizes.slow_latency_s.formula}",
            )
        case FaultKind.MEMORY, Component.REPLICA:
            size = stress_bytes(fleet)
            return Step(
                "StressChaos",
                "memory",
                {
                    **one_replica,
                    "containerNames": [CONTAINER_NAME],
                    "stressors": {"memory": {"workers": 1, "size": f"{size // GIB}GiB"}},
                },
                held=True,
                note=f"stress-ng takes {size // GIB} GiB in one serving container's cgroup: half its weights' "
                "staging memory, pressure inside the limit",
            )
        case FaultKind.JITTER, Component.NODE:
            delay = {"latency": _ms(sizes.jitter_delay_s.value), "jitter": _ms(sizes.jitter_s.value)}
            node = _node(fleet.plan)
            return Step(
                "NetworkChaos",
                "delay",
                {
                    "mode": "all",
                    "selector": {**_serving(fleet), "nodes": [node]},
                    "action": "delay",
                    "delay": delay,
                },
                held=True,
                note=f"every serving pod on node {node}: {sizes.jitter_delay_s.formula}, {sizes.jitter_s.formula}",
            )
        case FaultKind.SIGKILL, Component.NODE:
            selector = {
                "namespaces": [fleet.spec.kubernetes.namespace],
                "expressionSelectors": [{"key": LABEL_NAME, "operator": "In", "values": [SERVING_APP, AGENT]}],
                "nodes": [_node(fleet.plan)],
            }
            return Step(
                "PodChaos",
                "pod-failure",
                {"mode": "all", "selector": selector, "action": "pod-failure"},
                held=True,
                note=f"the agent and every serving pod on node {_node(fleet.plan)} fail for the hold (pod-kill would be "
                "re-created on the same node at once: a reboot, not a loss)",
            )
        case FaultKind.SIGKILL, Component.ROUTER:
            return Step(
                "PodChaos",
                "pod-failure",
                {"mode": "one", "selector": _by_name(fleet.spec, ROUTER_APP), "action": "pod-failure"},
                held=True,
                note="one router pod fails for the hold, so the failover and ExaServeRouterInstanceDown are "
                "exercised (the Deployment would replace a killed pod within seconds)",
            )
        case FaultKind.SIGKILL, Component.CONTROLLER:
            return Step(
                "PodChaos",
                "pod-kill",
                {"mode": "one", "selector": _by_name(fleet.spec, CONTROLLER), "action": "pod-kill"},
                held=False,
                note=f"Chaos Mesh selects by label and no label marks the leader: this kills one of the "
                f"{fleet.spec.scheduler.instances} controllers, the leader one time in {fleet.spec.scheduler.instances}; to kill "
                f"exactly the leader, delete the pod the Lease names: kubectl -n {fleet.spec.kubernetes.namespace} delete "
                f"pod $(kubectl -n {fleet.spec.kubernetes.namespace} get lease {fleet.spec.runtime.lease_name} "
                "-o jsonpath='{.spec.holderIdentity}')",
            )
        case FaultKind.ERRORS | FaultKind.GENERATION_ERRORS, _:
            return NO_HTTP_CHAOS
        case FaultKind.WEDGED, _:
            return NO_WEDGE_CHAOS
        case FaultKind.FLAP, _:
            return NO_FLAP_CHAOS
    return f"not rendered: Chaos Mesh has no experiment for {fault.kind} of a {fault.component}"


def steps(scenario: Scenario, fleet: Fleet) -> tuple[Step, ...] | str:
    """The scenario's faults as Chaos Mesh steps, or why it cannot be rendered."""
    found = [_step(f, fleet) for f in scenario.faults]
    reasons = [s for s in found if isinstance(s, str)]
    if reasons:
        return reasons[0]
    return tuple(s for s in found if isinstance(s, Step))


def _name(scenario: Scenario, fault: Fault) -> str:
    base = f"exaserve-drill-{scenario.name}"
    return f"{base}-{fault.component}" if len(scenario.faults) > 1 else base


def experiment(scenario: Scenario, fleet: Fleet) -> Experiment | NotRendered:
    """The scenario as Chaos Mesh objects to apply at once (a one-off drill), or why there are none."""
    found = steps(scenario, fleet)
    if isinstance(found, str):
        return NotRendered(scenario.name, found)
    hold = f"{fault_sizes(fleet).hold_s.value:g}s"
    objects = []
    for fault, step in zip(scenario.faults, found, strict=True):
        name = _name(scenario, fault)
        objects.append(
            {
                "apiVersion": API,
                "kind": step.kind,
                "metadata": metadata(
                    name, fleet.spec.kubernetes.namespace, labels(COMPONENT, name, **{LABEL_DRILL: scenario.name})
                ),
                "spec": {**step.spec, **({"duration": hold} if step.held else {})},
            }
        )
    return Experiment(
        scenario.name, tuple(objects), tuple(s.action for s in found), tuple(s.note for s in found if s.note)
    )


def experiments(fleet: Fleet) -> list[Experiment | NotRendered]:
    return [experiment(s, fleet) for s in SCENARIOS.values()]


def schedule(fleet: Fleet) -> K8sObject:
    """The regular drills: a Chaos Mesh ``Schedule`` of a workflow that runs ``drills.scheduled`` in turn on
    ``drills.schedule``, each fault for the hold, each followed by a pause of the plan's restoration time so the
    fleet is whole before the next one. Raises :class:`RenderError` for a scheduled scenario Chaos Mesh cannot run."""
    hold = f"{fault_sizes(fleet).hold_s.value:g}s"
    settle = f"{math.ceil(plan_targets(fleet)[T.RESTORATION].value)}s"
    templates: list[dict[str, Any]] = []
    children: list[str] = []
    for name in fleet.spec.drills.scheduled:
        scenario = SCENARIOS[name]
        found = steps(scenario, fleet)
        if isinstance(found, str):
            raise RenderError(
                f"drills.scheduled names {name}, which Chaos Mesh cannot run ({found.removeprefix('not rendered: ')}); "
                "remove it from drills.scheduled"
            )
        names = [name] if len(found) == 1 else [f"{name}-{f.component}" for f in scenario.faults]
        if len(found) > 1:  # a double fault: its faults at the same instant
            templates.append({"name": name, "templateType": "Parallel", "children": names})
        templates += [
            {"name": n, "templateType": s.kind, "deadline": hold, EMBED_FIELD[s.kind]: s.spec}
            for n, s in zip(names, found, strict=True)
        ]
        children += [name, f"settle-{name}"]
        templates.append({"name": f"settle-{name}", "templateType": "Suspend", "deadline": settle})
    return {
        "apiVersion": API,
        "kind": "Schedule",
        "metadata": metadata(SCHEDULE_NAME, fleet.spec.kubernetes.namespace, labels(COMPONENT, SCHEDULE_NAME)),
        "spec": {
            "schedule": fleet.spec.drills.schedule,
            "type": "Workflow",
            "concurrencyPolicy": "Forbid",
            "historyLimit": SCHEDULE_HISTORY,
            "workflow": {
                "entry": ENTRY,
                "templates": [{"name": ENTRY, "templateType": "Serial", "children": children}, *templates],
            },
        },
    }
