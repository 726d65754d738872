"""Bare-metal systemd units of the runtime layer: ``exaserve-agent.service`` on every serving node and
``exaserve-controller@<name>.service`` on each of the ``scheduler.instances`` controller hosts.

Both run the ``exaserve`` command installed on the host (:data:`EXASERVE_BIN`) with the stack file at
:data:`STACK_PATH`; the controller elects its leader on etcd (``runtime.etcd_endpoints``) and acts on every router
instance given. Rendered through ``templates/exaserve-runtime.service.j2``; docs/runtime.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from serving.render.common import RenderError, render_template, whole_seconds
from serving.render.systemd import START_LIMIT_BURST, exec_lines
from serving.spec.schema import FleetSpec

EXASERVE_BIN: Final = "/opt/exaserve/bin/exaserve"
STACK_DIR: Final = "/etc/exaserve"
RUNTIME_USER: Final = "exaserve-runtime"
SSH_DIR: Final = f"{STACK_DIR}/ssh"  # the controller's SSH key and known_hosts (migrations restart replicas over SSH)
RESTART_S: Final = 2
AGENT_UNIT: Final = "exaserve-agent.service"


def stack_path(stack: str) -> str:
    return f"{STACK_DIR}/Pulumi.{stack}.yaml"


def controller_unit_name(name: str) -> str:
    return f"exaserve-controller@{name}.service"


def _unit(
    unit: str,
    description: str,
    argv: Sequence[str],
    identifier: str,
    *,
    stop_s: int,
    dynamic_user: bool,
    after: Sequence[str] = (),
) -> str:
    return render_template(
        "exaserve-runtime.service.j2",
        __name__,
        unit=unit,
        description=description,
        user=RUNTIME_USER,
        exec_start=exec_lines(argv, 3),
        dynamic_user=dynamic_user,
        identifier=identifier,
        stop_timeout_s=stop_s,
        restart_s=RESTART_S,
        start_limit_burst=START_LIMIT_BURST,
        start_limit_interval_s=START_LIMIT_BURST * (RESTART_S + 10),
        after_units=list(after),
    )


def agent_argv(spec: FleetSpec, stack: str, node: str, controllers: Sequence[str]) -> list[str]:
    if not controllers:
        raise RenderError("the agent needs every controller's URL (one --controller each); give at least one")
    del spec  # the node's replicas, intervals and timeouts come from the stack file at run time
    argv = [EXASERVE_BIN, "agent", "run", "--stack-file", stack_path(stack), "--node", node]
    for url in controllers:
        argv += ["--controller", url]
    return argv


def agent_unit(spec: FleetSpec, stack: str, node: str, controllers: Sequence[str]) -> str:
    """The node agent's unit on ``node``: one batched report per ``serving.heartbeat_interval_s`` to each controller."""
    return _unit(
        AGENT_UNIT,
        f"ExaServe node agent on {node}: probes its replicas every {spec.serving.heartbeat_interval_s:g} s, one report",
        agent_argv(spec, stack, node, controllers),
        "exaserve-agent",
        stop_s=whole_seconds(spec.serving.heartbeat_interval_s),
        dynamic_user=True,
    )


def controller_argv(spec: FleetSpec, stack: str, name: str, routers: Sequence[str]) -> list[str]:
    if not routers:
        raise RenderError("the controller acts on every router instance; give each router's URL")
    argv = [EXASERVE_BIN, "controller", "run", "--stack-file", stack_path(stack), "--name", name]
    argv += ["--election", "etcd", "--backend", "ssh", "--known-hosts", f"{SSH_DIR}/known_hosts"]
    argv += ["--identity", f"{SSH_DIR}/id_ed25519"]
    for url in spec.runtime.etcd_endpoints:
        argv += ["--etcd", url]
    for url in routers:
        argv += ["--router", url]
    return argv


def controller_unit(spec: FleetSpec, stack: str, name: str, routers: Sequence[str]) -> str:
    """One controller instance (``runtime.controller_port``); migrations restart replicas over SSH."""
    return _unit(
        controller_unit_name(name),
        f"ExaServe fleet controller {name} (one of {spec.scheduler.instances}; leader elected on etcd)",
        controller_argv(spec, stack, name, routers),
        "exaserve-controller",
        stop_s=whole_seconds(spec.runtime.lease_ttl_s),
        dynamic_user=False,
        after=["etcd.service"],
    )
