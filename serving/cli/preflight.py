"""``exaserve preflight``: run ansible/preflight.yml through ansible-runner and show the report.

The same playbook users run with ``ansible-playbook``; this command writes a temporary ``exaserve``
inventory config for the stack, shows progress while the playbook runs (progress goes to stderr,
so ``--json`` output stays clean), then prints a hosts × checks table and every failing check with
its fix, or the JSON report. Exit 0 when every node passes, 1 when any node fails or is
unreachable, 2 on bad input.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections import Counter
from collections.abc import Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.status import Status
from rich.table import Table

from serving.checks.preflight import CHECKS, Report, ReportError, load_report, summary_lines
from serving.cli.options import (
    DEFAULT_KNOWN_HOSTS,
    EXIT_OK,
    EXIT_PROBLEM,
    IdentityOpt,
    JsonOpt,
    KnownHostsOpt,
    StackFileOpt,
    StackOpt,
    StateDirOpt,
    app,
    console,
    emit_json,
    err_console,
    fail,
    require_file,
    resolve_stack,
)
from serving.paths import ProjectNotFoundError, project_dir, state_dir
from serving.render.inventory import FLEET_GROUP, SYSTEM_GROUP, groups, unmatched_limit_patterns
from serving.spec.stack import Stack

# Short column headers of the hosts × checks table, in CHECKS order.
SHORT = {
    "ssh": "ssh",
    "play": "run",
    "os_release": "os",
    "kernel": "kern",
    "cgroup_v2": "cg2",
    "gpu_count": "gpus",
    "gpu_product": "prod",
    "gpu_memory": "mem",
    "driver": "drv",
    "cuda": "cuda",
    "ib_ports": "ib",
    "ib_rate": "rate",
    "container_runtime": "ctr",
    "container_gpu": "ctr-gpu",
    "ntp_sync": "ntp",
    "ntp_offset": "offs",
    "model_store": "store",
    "model_present": "model",
    "cache_disk": "disk",
    "rack_peers": "peers",
    "rack_leaders": "leaders",
    "fabric_pair": "f-pair",
    "fabric_rack": "f-rack",
}
_CELL = {"pass": "[green]ok[/]", "fail": "[bold red]FAIL[/]", "skip": "[dim]-[/]"}


def write_inventory(directory: Path, stack: Stack, known_hosts: Path | None, identity: Path | None) -> Path:
    """The ``exaserve`` inventory plugin config for this stack (any stack file, not only named ones)."""
    config: dict[str, Any] = {"plugin": "exaserve.fleet.exaserve", "stack_file": str(stack.path.resolve())}
    if known_hosts:
        config["known_hosts_file"] = str(known_hosts.resolve())
    if identity:
        config["private_key_file"] = str(identity.resolve())
    path = directory / f"{stack.name}.exaserve.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def parse_vars(pairs: list[str]) -> dict[str, str]:
    """``--var KEY=VALUE`` options -> extra vars; the key must be a role variable (``preflight_*``)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.startswith("preflight_") or not key.isidentifier():
            fail(
                f"--var {pair!r}: expected KEY=VALUE with KEY a preflight role variable (preflight_*), "
                "e.g. --var preflight_fabric_python=/opt/exaserve/venv/bin/python"
            )
        out[key] = value
    return out


class Progress:
    """Counts runner events and shows the current task and per-host outcomes on a status line."""

    def __init__(self, status: Status | None, hosts: int) -> None:
        self.status = status
        self.hosts = hosts
        self.task = "starting"
        self.outcomes: Counter[str] = Counter()
        self.unreachable: set[str] = set()

    def __call__(self, event: Mapping[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        if kind == "playbook_on_task_start":
            self.task = str(data.get("task", ""))
            self.outcomes.clear()
        elif kind.startswith("runner_on_") and kind != "runner_on_start":
            self.outcomes[kind.removeprefix("runner_on_")] += 1
            if kind == "runner_on_unreachable":
                self.unreachable.add(str(data.get("host", "")))
        if self.status is not None:
            done = ", ".join(f"{n} {k}" for k, n in sorted(self.outcomes.items()))
            self.status.update(f"preflight on {self.hosts} nodes: {self.task} [{done or 'running'}]")
        return True  # keep the event in the runner's artifacts


def print_table(out: Console, report: Report) -> None:
    checks = report["checks"]
    table = Table(title=f"preflight {report['stack']}", header_style="bold")
    table.add_column("node", no_wrap=True)
    table.add_column("status", no_wrap=True)
    for check in checks:
        table.add_column(SHORT.get(check, check), justify="center", no_wrap=True)
    status_cell = {"pass": "[green]pass[/]", "fail": "[bold red]fail[/]", "unreachable": "[bold red]unreachable[/]"}
    for host, hr in report["hosts"].items():
        cells = [_CELL[hr["checks"][c]["status"]] if c in hr["checks"] else "" for c in checks]
        table.add_row(host, status_cell[hr["status"]], *cells)
    out.print(table)
    out.print("columns: " + "; ".join(f"{SHORT.get(c, c)} = {CHECKS[c]}" for c in checks), style="dim")
    lines = summary_lines(report)
    out.print(lines[0], style="bold " + ("green" if report["ok"] else "red"), markup=False, highlight=False)
    for line in lines[1:]:
        out.print(f"  {line}", markup=False, highlight=False)


@app.command()
def preflight(
    stack: StackOpt = None,
    stack_file: StackFileOpt = None,
    as_json: JsonOpt = False,
    limit: Annotated[
        str | None, typer.Option("--limit", "-l", help="Ansible host pattern: nodes or groups (pool_*, rack_*).")
    ] = None,
    fabric: Annotated[bool, typer.Option("--fabric", help="Also run the all-reduce bus-bandwidth test.")] = False,
    known_hosts: KnownHostsOpt = DEFAULT_KNOWN_HOSTS,
    identity: IdentityOpt = None,
    state_root: StateDirOpt = None,
    report_path: Annotated[
        Path | None,
        typer.Option("--report", help="Where to write the JSON report (default <state dir>/<stack>/preflight.json)."),
    ] = None,
    variables: Annotated[
        list[str] | None, typer.Option("--var", help="Role variable KEY=VALUE, e.g. preflight_fabric_python=…")
    ] = None,
) -> None:
    """Check every node against the spec (ansible/preflight.yml). Exit 1 when any node fails."""
    st = resolve_stack(stack, stack_file)
    require_file(known_hosts, "--known-hosts", "host keys are always verified, pass the fleet's known_hosts")
    require_file(identity, "--identity", "pass an existing private key, or none to use your agent")
    if limit is not None:
        bad = unmatched_limit_patterns(st.spec, limit)
        if bad:
            known = ", ".join(sorted(g for g in groups(st.spec) if g != FLEET_GROUP)[:12])
            fail(
                f"--limit {limit!r}: {', '.join(map(repr, bad))} match no node or group of stack {st.name!r}; "
                f"use node names (e.g. {st.spec.cluster.nodes[0].name}) or groups ({FLEET_GROUP}, {SYSTEM_GROUP}, {known})"
            )
    extra = parse_vars(variables or [])
    import ansible_runner  # noqa: PLC0415 - heavy; only this command needs it

    try:  # the playbooks are the project's, not the package's
        ansible_dir = project_dir() / "ansible"
    except ProjectNotFoundError as exc:
        fail(f"preflight runs the Pulumi project's ansible/preflight.yml: {exc}")
    report = (report_path or state_dir(state_root) / st.name / "preflight.json").resolve()
    report.unlink(missing_ok=True)
    venv_bin = str(Path(sys.executable).parent)
    hosts = len(st.spec.cluster.nodes) + len(st.spec.cluster.system_nodes)
    with tempfile.TemporaryDirectory(prefix="exaserve-preflight-") as tmp:
        inventory = write_inventory(Path(tmp), st, known_hosts, identity)
        show = not as_json and err_console.is_terminal
        with err_console.status(f"preflight on {hosts} nodes: starting") if show else nullcontext() as status:
            progress = Progress(status, hosts)
            runner = ansible_runner.run(
                private_data_dir=tmp,
                project_dir=str(ansible_dir),
                playbook="preflight.yml",
                inventory=str(inventory),
                limit=limit,
                tags="all,fabric" if fabric else None,
                extravars={"preflight_report_path": str(report), **extra},
                envvars={
                    "ANSIBLE_CONFIG": str(ansible_dir / "ansible.cfg"),
                    "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
                },
                event_handler=progress,
                quiet=True,
                suppress_env_files=True,
            )
            tail = runner.stdout.read()[-3000:] if runner.stdout else ""
    try:
        doc = load_report(report)
    except ReportError as exc:
        fail(
            f"{exc}. ansible-playbook ended with status {runner.status} (rc {runner.rc}); its output ends:\n{tail}",
            EXIT_PROBLEM,
        )
    if as_json:
        emit_json(doc, stack=doc["stack"], ok=doc["ok"])
    else:
        print_table(console, doc)
        console.print(f"report: {report}", style="dim", markup=False, highlight=False)
    raise typer.Exit(EXIT_OK if doc["ok"] else EXIT_PROBLEM)
