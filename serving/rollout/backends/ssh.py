"""Bare-metal nodes over SSH: install the replica's systemd unit for the new release and restart it.

Each replica runs as ``exaserve-sglang@<replica>.service`` (one unit per node of a multi-node replica),
rendered by :func:`serving.render.systemd.systemd_unit` from the stack with the batch's group set to the new
version — so the unit on the node is exactly what the stack says that group runs (image release in
``EXASERVE_RELEASE``, command line, limits). Per node, one SSH session writes the units atomically,
runs ``systemctl daemon-reload`` and ``systemctl restart --no-block`` (the updater's health step
bounds the start, not systemd). The running release is read back from ``systemctl show``: the loaded unit's
``EXASERVE_RELEASE``, and only while the unit is active — a failed, stopped or still-starting unit is down.

Connections go through :func:`serving.remote.fanout.run_one`: host keys verified against known_hosts
(paramiko ``RejectPolicy``: an unknown or changed key fails that node with the fix), per-host
connect and command timeouts.
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from serving.plan.model import Fleet, Replica
from serving.remote.fanout import HostResult, Target, run_one
from serving.render.systemd import systemd_unit, unit_name
from serving.rollout.backends import BackendError, ReplicaIndex, RestartUnreached
from serving.rollout.membership import RouterApiMembership
from serving.rollout.plan import with_group_version
from serving.router.membership import RouterSet
from serving.spec.schema import Node

UNIT_DIR = "/etc/systemd/system"
RELEASE_ENV = "EXASERVE_RELEASE"
# run_one's statuses that come only from paramiko's connect, before a session opens or a command is sent
# (serving/remote/fanout.py): the TCP connect refused or timed out ("unreachable": connect and its socket errors are
# the only OSError/TimeoutError of that call, the command's reads catch their own timeouts), the host key refused
# ("host-key") or the login refused ("auth"). "ssh-error" is not one: paramiko raises SSHException from opening the
# session or sending the command too, where the command may have started; "timeout" and "exit" ran it.
NOT_CONNECTED = frozenset({"unreachable", "host-key", "auth"})


@dataclass(frozen=True)
class UnitFile:
    node: Node
    name: str
    text: str


def unit_files(fleet: Fleet, replicas: Sequence[Replica], version: str) -> list[UnitFile]:
    """Every unit (all nodes of each replica) of ``replicas`` at ``version``."""
    out = []
    for replica in replicas:
        moved = with_group_version(fleet, replica.group, version)
        for rank, node in enumerate(replica.nodes):
            out.append(UnitFile(node, unit_name(replica, rank), systemd_unit(moved, replica, rank)))
    return out


def install_script(files: Sequence[UnitFile], unit_dir: str = UNIT_DIR) -> str:
    """Shell run on one node: write each unit atomically (temp file + rename), reload, restart them."""
    lines = ["set -eu", "umask 022", f"mkdir -p {shlex.quote(unit_dir)}"]
    for f in files:
        path = shlex.quote(f"{unit_dir}/{f.name}")
        tmp = shlex.quote(f"{unit_dir}/.{f.name}.tmp")
        lines += [f"printf '%s' {shlex.quote(f.text)} > {tmp}", f"mv -f {tmp} {path}"]
    lines += ["systemctl daemon-reload", "systemctl restart --no-block " + " ".join(shlex.quote(f.name) for f in files)]
    return "\n".join(lines) + "\n"


def show_command(unit_names: Sequence[str]) -> str:
    return "systemctl show --property=Id,ActiveState,Environment " + " ".join(shlex.quote(n) for n in unit_names)


def parse_show(text: str) -> dict[str, str | None]:
    """``systemctl show --property=Id,ActiveState,Environment`` output → unit → its EXASERVE_RELEASE (None if
    unset, or when the block has an ``ActiveState`` other than ``active``: the unit is not running).

    systemd prints one block per unit, blocks separated by a blank line; ``Environment=`` holds the
    assignments separated by spaces, each one quoted if it contains spaces.
    """
    out: dict[str, str | None] = {}
    for block in text.strip().split("\n\n"):
        fields = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if "Id" not in fields:
            continue
        release = None
        if fields.get("ActiveState", "active") != "active":
            out[fields["Id"]] = None
            continue
        for item in shlex.split(fields.get("Environment", "")):
            key, _, value = item.partition("=")
            if key == RELEASE_ENV:
                release = value
        out[fields["Id"]] = release
    return out


class SshBackend(ReplicaIndex):
    """Restart the batch's systemd units on bare-metal nodes."""

    def __init__(
        self,
        fleet: Fleet,
        *,
        known_hosts: Path,
        identity: Path | None = None,
        connect_timeout_s: float = 5.0,
        unit_dir: str = UNIT_DIR,
        ssh_config: str = "",
    ) -> None:
        self.fleet = fleet
        self.spec = fleet.spec
        self.known_hosts = known_hosts
        self.identity = identity
        self.connect_timeout_s = connect_timeout_s
        self.ssh_config = ssh_config  # the OpenSSH client configuration's text (run_one reads it per node)
        self.unit_dir = unit_dir
        self._unreachable: dict[str, str] = {}
        super().__init__(list(fleet.plan.replicas))

    @property
    def name(self) -> str:
        return f"ssh ({len({n.name for r in self.replicas.values() for n in r.nodes})} nodes)"

    def worker_url(self, replica_id: str) -> str:
        return self._replica(replica_id).url

    def known_versions(self) -> None:
        return None  # any release of serving.releases

    def membership(self, routers: RouterSet) -> RouterApiMembership:
        return RouterApiMembership(routers, self.worker_url)  # the routers know the replicas by these static URLs

    @property
    def updates_whole_groups(self) -> bool:
        return False  # one systemd unit per replica

    def _run(self, node: Node, command: str, timeout_s: float) -> HostResult:
        return run_one(
            Target.from_node(node),
            command,
            known_hosts=self.known_hosts,
            identity=self.identity,
            connect_timeout_s=self.connect_timeout_s,
            timeout_s=timeout_s,
            ssh_config=self.ssh_config,
        )

    async def _per_node(self, commands: dict[Node, str], timeout_s: float) -> dict[Node, HostResult]:
        nodes = list(commands)
        results = await asyncio.gather(*(asyncio.to_thread(self._run, n, commands[n], timeout_s) for n in nodes))
        return dict(zip(nodes, results, strict=True))

    async def versions(self, replica_ids: Sequence[str]) -> dict[str, str | None]:
        """The release of each replica's units as systemd has them loaded, on every node of the replica: one
        release when every unit is active and they agree; None (down) when a unit is not active, its node does
        not answer, or the nodes disagree (a multi-node replica half updated cannot serve)."""
        by_node: dict[Node, list[tuple[str, str]]] = {}
        for rid in replica_ids:
            replica = self._replica(rid)
            for rank, node in enumerate(replica.nodes):
                by_node.setdefault(node, []).append((rid, unit_name(replica, rank)))
        results = await self._per_node(
            {n: show_command([u for _, u in pairs]) for n, pairs in by_node.items()}, 2 * self.connect_timeout_s
        )
        self._unreachable = {
            f"{n.name} ({r.address})": r.error or r.status for n, r in results.items() if r.status not in ("ok", "exit")
        }
        seen: dict[str, set[str | None]] = {rid: set() for rid in replica_ids}
        for node, pairs in by_node.items():
            loaded = parse_show(results[node].stdout) if results[node].ok else {}
            for rid, unit in pairs:
                seen[rid].add(loaded.get(unit))
        return {rid: found.pop() if len(found) == 1 else None for rid, found in seen.items()}

    def unreachable(self) -> dict[str, str]:
        return dict(self._unreachable)

    async def update(self, replica_ids: Sequence[str], version: str, timeout_s: float) -> None:
        files = unit_files(self.fleet, [self._replica(r) for r in replica_ids], version)
        by_node: dict[Node, list[UnitFile]] = {}
        for f in files:
            by_node.setdefault(f.node, []).append(f)
        results = await self._per_node({n: install_script(fs, self.unit_dir) for n, fs in by_node.items()}, timeout_s)
        failed = {n.name: r for n, r in results.items() if not r.ok}
        if failed:
            detail = "; ".join(
                f"{name} ({r.address}): {r.error}{': ' + r.stderr.strip()[:200] if r.stderr.strip() else ''}"
                for name, r in sorted(failed.items())
            )
            message = f"updating systemd units to {version} failed on {len(failed)} node(s): {detail}"
            if all(r.status in NOT_CONNECTED for r in results.values()):
                raise RestartUnreached(f"{message}; no node was reached, nothing ran")
            raise BackendError(message)

    async def aclose(self) -> None:
        return None
