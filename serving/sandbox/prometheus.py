"""A real Prometheus server in the sandbox: Debian's ``prometheus`` (2.42) on loopback, started by ``exaserve sandbox
up`` when ``sandbox.prometheus`` is on and stopped by ``sandbox down`` like every other sandbox process (its record
is ``prometheus``).

It scrapes what the rendered ServiceMonitors and PodMonitors describe (:func:`scrape_configs`), not a list of its
own: a monitor selects Services (a PodMonitor: pods) by label, and each of its endpoints names a port and a path.
The sandbox runs the pods those Services select as loopback processes (:func:`sandbox_pods`: per
``app.kubernetes.io/name``, each process with its ports by the names the pod templates give them), so an endpoint
becomes one target per process, labelled as prometheus-operator labels it (``job`` the Service's name,
``namespace``, ``service``, ``pod``, ``endpoint``): the rendered alert rules select on those labels and match here
as they do in a cluster. A monitor that selects nothing, or names a port the Service or the sandbox's processes do
not have, is an error naming both. The agents export no metrics and no monitor names them; the controllers' series
(``exaserve_runtime_node_suspect``, ``…_last_report_age_seconds``) are how Prometheus sees them.

Rules are the PrometheusRule objects' groups as one rule file (:func:`serving.checks.promtool.rule_file`);
``promtool check config`` checks the configuration and the rules before the server starts. Targets are scraped and
rules evaluated every ``serving.heartbeat_interval_s`` (the monitors' own ``interval`` is the cluster's). The server
listens on ``sandbox.runtime_base_port + 19``; its data lives under the sandbox's state directory and starts empty
at each ``sandbox up``.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from serving.checks.promtool import rule_file
from serving.plan.model import Fleet
from serving.prometheus_api import PrometheusError, query
from serving.render.k8s import fleet as serving_fleet
from serving.render.k8s import gateway, monitoring, runtime
from serving.render.k8s.common import LABEL_NAME, ROUTER_APP, SERVING_APP, K8sObject
from serving.sandbox.backend import worker_config
from serving.sandbox.processes import ProcessRecord, SandboxError, StateDir, start_service
from serving.sandbox.runtime import runtime_ports
from serving.sandbox.worker_config import LOOPBACK
from serving.spec.schema import FleetSpec

PROMETHEUS_BINARY = "prometheus"
PROMTOOL_BINARY = "promtool"
NAME = "prometheus"
PORT_OFFSET = 19  # from sandbox.runtime_base_port: after etcd and the controllers, before the extra routers
MONITOR_KINDS = ("ServiceMonitor", "PodMonitor")
INSTALL = "install the Debian package prometheus (scripts/bootstrap.sh does)"


@dataclass(frozen=True)
class Pod:
    """A sandbox process standing in for one pod: its name and its listening ports by the pod template's names."""

    name: str
    ports: Mapping[str, int]


def prometheus_port(spec: FleetSpec) -> int:
    if spec.sandbox is None:
        raise SandboxError("this stack has no sandbox: section")
    return spec.sandbox.runtime_base_port + PORT_OFFSET


def prometheus_url(spec: FleetSpec) -> str:
    return f"http://{LOOPBACK}:{prometheus_port(spec)}"


def sandbox_pods(fleet: Fleet) -> dict[str, list[Pod]]:
    """``app.kubernetes.io/name`` → the processes ``sandbox up`` runs for those pods: router 0 (all routers with the
    runtime on), one simulated worker per replica, the controllers (runtime on; none otherwise). Process names are
    those of the sandbox's records; the workers are named by replica id."""
    if fleet.spec.sandbox is None:
        raise SandboxError("this stack has no sandbox: section")
    on = fleet.spec.sandbox.runtime
    ports = runtime_ports(fleet.spec)
    routers = ports.routers if on else ports.routers[:1]
    return {
        ROUTER_APP: [
            Pod("router" if i == 0 else f"router-{i}", {gateway.HTTP_PORT_NAME: api, gateway.METRICS_PORT_NAME: m})
            for i, (api, m) in enumerate(routers)
        ],
        SERVING_APP: [
            Pod(
                r.id,
                {serving_fleet.HTTP_PORT_NAME: worker_config(fleet.spec, r, fleet.spec.group_version(r.group)).port},
            )
            for r in fleet.plan.replicas
        ],
        runtime.CONTROLLER: [
            Pod(f"controller-{i}", {runtime.HTTP_PORT_NAME: p}) for i, p in enumerate(ports.controllers if on else ())
        ],
    }


def rendered_objects(fleet: Fleet) -> list[K8sObject]:
    """The objects the scrape configuration and the rules come from: the Services (fleet, gateway, runtime), the
    monitors and the PrometheusRules, exactly as ``exaserve render`` writes them."""
    return [o for m in (serving_fleet, gateway, monitoring, runtime) for o in m.render(fleet)]


def _selected(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _pods(pods: Mapping[str, Sequence[Pod]], app: str | None, what: str) -> Sequence[Pod]:
    if app is None or app not in pods:
        raise SandboxError(
            f"{what} selects pods {LABEL_NAME}={app}, which the sandbox does not run (it runs {sorted(pods)}); "
            "add them to serving.sandbox.prometheus.sandbox_pods or select pods the sandbox runs"
        )
    return pods[app]


def _port(pod: Pod, name: Any, what: str) -> int:
    if name not in pod.ports:
        raise SandboxError(
            f"{what} scrapes port {name!r}, which the sandbox's {pod.name} does not listen on (its ports: "
            f"{dict(pod.ports)}); name a port the pod template declares"
        )
    return pod.ports[name]


def _named(service: K8sObject, port: str) -> dict[str, Any] | None:
    return next((p for p in service["spec"]["ports"] if p.get("name") == port), None)


def _targets(pods: Sequence[Pod], port: Any, labels: Mapping[str, str], what: str) -> list[dict[str, Any]]:
    """One static target per pod, labelled as prometheus-operator labels it."""
    return [{"targets": [f"{LOOPBACK}:{_port(p, port, what)}"], "labels": {**labels, "pod": p.name}} for p in pods]


def scrape_configs(objects: Sequence[K8sObject], pods: Mapping[str, Sequence[Pod]]) -> list[dict[str, Any]]:
    """One scrape job per monitor endpoint (named as prometheus-operator names it), one target per sandbox process
    of the selected pods. As in a cluster, a selected Service without the endpoint's port adds no target; a monitor
    endpoint that finds no target port at all, or a port the sandbox's processes lack, raises :class:`SandboxError`."""
    services = [o for o in objects if o["kind"] == "Service"]
    out = []
    for mon in (o for o in objects if o["kind"] in MONITOR_KINDS):
        meta, spec = mon["metadata"], mon["spec"]
        ns, name = meta["namespace"], meta["name"]
        what = f"{mon['kind']} {ns}/{name}"
        selector = spec["selector"].get("matchLabels", {})
        if mon["kind"] == "PodMonitor":
            chosen = _pods(pods, selector.get(LABEL_NAME), what)
            for i, ep in enumerate(spec["podMetricsEndpoints"]):
                labels = {"job": f"{ns}/{name}", "namespace": ns, "endpoint": ep["port"]}
                out.append(
                    {
                        "job_name": f"podMonitor/{ns}/{name}/{i}",
                        "metrics_path": ep.get("path", "/metrics"),
                        "static_configs": _targets(chosen, ep["port"], labels, what),
                    }
                )
            continue
        namespaces = spec.get("namespaceSelector", {}).get("matchNames", [ns])
        matched = [
            s
            for s in services
            if s["metadata"]["namespace"] in namespaces and _selected(selector, s["metadata"].get("labels", {}))
        ]
        for i, ep in enumerate(spec["endpoints"]):
            ports = {s["metadata"]["name"]: _named(s, ep["port"]) for s in matched}
            if not any(ports.values()):
                named = {s["metadata"]["name"]: [p.get("name") for p in s["spec"]["ports"]] for s in matched}
                raise SandboxError(
                    f"{what} scrapes port {ep['port']!r}, but no Service it selects (matchLabels {selector}, "
                    f"namespaces {namespaces}) names that port: {named or 'none selected'}; fix the monitor or the "
                    "Service in the renderer"
                )
            groups: list[dict[str, Any]] = []
            for svc in matched:
                svc_name, port = svc["metadata"]["name"], ports[svc["metadata"]["name"]]
                if port is None:
                    continue
                chosen = _pods(pods, svc["spec"].get("selector", {}).get(LABEL_NAME), f"{what} (Service {svc_name})")
                labels = {"job": svc_name, "namespace": ns, "service": svc_name, "endpoint": ep["port"]}
                groups += _targets(chosen, port.get("targetPort", port["port"]), labels, what)
            out.append(
                {
                    "job_name": f"serviceMonitor/{ns}/{name}/{i}",
                    "metrics_path": ep.get("path", "/metrics"),
                    "static_configs": groups,
                }
            )
    return out


def _duration(seconds: float) -> str:
    """A Prometheus duration for an interval that may be fractional (``1s``, ``500ms``, ``1500ms``)."""
    ms = max(1, round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def write_config(
    directory: Path, spec: FleetSpec, objects: Sequence[K8sObject], pods: Mapping[str, Sequence[Pod]]
) -> Path:
    """``directory/prometheus.yml`` and ``directory/rules.yaml``, checked by ``promtool check config`` (which checks
    the rule file too); raises :class:`SandboxError` with promtool's words when either does not load."""
    every = _duration(spec.serving.heartbeat_interval_s)
    directory.mkdir(parents=True, exist_ok=True)
    rules = directory / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule_file(objects), sort_keys=False))
    config = {
        "global": {"scrape_interval": every, "scrape_timeout": every, "evaluation_interval": every},
        "rule_files": [rules.name],
        "scrape_configs": scrape_configs(objects, pods),
    }
    path = directory / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    promtool = shutil.which(PROMTOOL_BINARY)
    if promtool is None:
        raise SandboxError(f"promtool is not installed: {INSTALL}")
    proc = subprocess.run(
        [promtool, "check", "config", path.name], cwd=directory, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        said = (proc.stdout + proc.stderr).strip()
        raise SandboxError(
            f"promtool check config rejected the sandbox's Prometheus configuration ({path}):\n{said}\n"
            "fix the rule or monitor it names in serving/render/k8s/"
        )
    return path


def _target_count(config: Path) -> int:
    jobs = yaml.safe_load(config.read_text())["scrape_configs"]
    return sum(len(c["targets"]) for job in jobs for c in job["static_configs"])


def _scraped(url: str, expected: int) -> bool:
    """Ready, and every target scraped at least once (one ``up`` series each)."""
    try:
        return len(query(url, "up", timeout_s=1.0)) >= expected
    except PrometheusError:
        return False


def start_prometheus(state: StateDir, fleet: Fleet, *, timeout_s: float) -> ProcessRecord:
    """Write and check the configuration, start Prometheus on a fresh data directory and wait until it has scraped
    every target once."""
    binary = shutil.which(PROMETHEUS_BINARY)
    if binary is None:
        raise SandboxError(f"prometheus is not installed: {INSTALL}")
    directory = state.root / NAME
    data = directory / "data"
    shutil.rmtree(data, ignore_errors=True)
    config = write_config(directory, fleet.spec, rendered_objects(fleet), sandbox_pods(fleet))
    url = prometheus_url(fleet.spec)
    argv = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={data}",
        f"--web.listen-address={LOOPBACK}:{prometheus_port(fleet.spec)}",
        "--log.level=warn",
    ]
    expected = _target_count(config)
    return start_service(state, NAME, "prometheus", argv, url, lambda: _scraped(url, expected), timeout_s)
