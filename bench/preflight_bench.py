"""Benchmark: preflight.yml at fleet scale - wall time, controller CPU and memory on 16, 32 and 64 SSH test hosts.

    sudo .venv/bin/python bench/preflight_bench.py --hosts 16,32,64 [--repeat 2] [--configs ...] [--json]

One fleet of the largest host count is started (tests/support/hosts: one network namespace and real sshd per
node, stub nvidia-smi/ibstat/chronyc as in the tests); each host count runs the first N nodes with
``--limit``. Among them, always: one node that is unreachable (blackholed route) and one whose
nvidia-smi hangs (a wedged GPU) - each must cost one timeout, not a serial wait. Every run's report
is checked: the dead node unreachable, the hung node failing exactly its GPU checks, every other
node passing; a wrong report aborts the benchmark.

Configurations (``config`` in the output):

- ``stock``: the playbook as it was before this change (BASELINE, one probe task per concern) with
  Ansible's defaults - forks 5, no pipelining, interpreter discovery, linear strategy, a full
  fact-gathering play first.
- ``tuned``: the same BASELINE playbook with the project's ansible.cfg of that commit (forks 256,
  pipelining, SSH multiplexing, interpreter pinned, no fact gathering).
- ``one_probe``: today's playbook and ansible.cfg (one exaserve.fleet.preflight_facts round trip per
  node reads every fact), its plays forced to the linear strategy.
- ``one_probe_free``: today's playbook as shipped (free strategy where ordering does not matter).
- ``mitogen``: today's playbook with Mitogen's ``mitogen_free`` strategy instead of ``free``; only when
  ``ansible_mitogen`` is importable (install the pinned ``mitogen`` to evaluate it).

Figures: ``wall_s`` (ansible-playbook start to exit), ``controller_cpu_s`` (user + system CPU of
ansible-playbook and every process it waited for: workers, ssh clients; the test hosts' sshd and module
Python are not included, though they run on this machine's cores too), ``peak_rss_mb`` (the largest
sum of proportional set sizes of ansible-playbook and its descendants, sampled every 0.5 s). ``controller_cpu_per_host_s`` is that CPU over the host count: what scales with the fleet, and what wall time mixes
with the test hosts' own CPU on a small machine. ``tasks_per_host`` (the PLAY RECAP's ok + unreachable + failed + skipped,
averaged over the hosts) and ``controller_cpu_per_task_s`` say where that CPU goes. The 256-node figures are projected from a least-squares line through
each configuration's minimum wall times and controller CPU, and said to be a projection; ``wall_on_cores_s`` puts the
projected controller CPU on a controller of ``--controller-cores`` cores (default 16) that runs nothing else, plus one
probe timeout (the hung node's, the critical path): ``cpu_256 / cores + TIMEOUT_S``. Needs root.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.hosts.collection import PLAYBOOKS_DIR
from tests.support.hosts.faults import HostFaults
from tests.support.hosts.netns import HostPool, unavailable_reason
from tests.support.paths import REPO
from tests.support.preflight import (
    ANSIBLE_DIR,
    VENV_BIN,
    ansible_env,
    fleet_stack_doc,
    install_container_stubs,
    model_store,
    node_names,
    write_inventory,
)
from tests.support.stacks import write_stack

# The last commit with one probe task per concern (before exaserve.fleet.preflight_facts).
BASELINE = "6240f2b"
CONFIGS = ("stock", "tuned", "one_probe", "one_probe_free", "mitogen")
PROJECT_TO = 256
TIMEOUT_S = 10  # SSH connect timeout and probe timeout: what the dead and the hung node each cost
UNREACHABLE, HUNG = "node15", "node16"  # inside the smallest host count
RACKS = 4
PING_CHECKS = {"rack_peers", "rack_leaders"}

STOCK_CFG = """[defaults]
roles_path = {ansible}/roles
collections_path = {ansible}/collections
host_key_checking = True
timeout = {timeout}

[inventory]
enable_plugins = exaserve.fleet.exaserve
"""

GATHER_FIRST = """- name: Gather facts (Ansible's stock behaviour)
  hosts: exaserve
  gather_facts: true

- name: Preflight
  ansible.builtin.import_playbook: {ansible}/preflight.yml
"""


@dataclass(frozen=True)
class Run:
    wall_s: float
    controller_cpu_s: float
    peak_rss_mb: float
    tasks_per_host: float


RECAP = re.compile(r"^\S+\s+: ok=(\d+)\s+changed=\d+\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)", re.M)


def tasks_per_host(log: str) -> float:
    """Task results per host from the PLAY RECAP (ok + unreachable + failed + skipped): each one is a task the
    controller queued, templated and processed for that host."""
    counts = [sum(map(int, m.groups())) for m in RECAP.finditer(log)]
    assert counts, "no PLAY RECAP in the log"
    return round(statistics.fmean(counts), 1)


def baseline_tree(work: Path) -> Path:
    """ansible/ as it was at BASELINE, extracted from git."""
    archive = work / "baseline.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "-C", str(REPO), "archive", BASELINE, "ansible"], stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(work / "baseline", filter="data")
    # BASELINE's report task read a node's results with `default=none`, which Jinja's map() takes as no default: a
    # node that recorded nothing (unreachable in a fact-gathering play first) failed the report, not the probes.
    # Patched as today's task reads them (the fix of this bug), so the stock run measures the probes.
    report = work / "baseline" / "ansible" / "roles" / "preflight_report" / "tasks" / "main.yml"
    text = report.read_text()
    old = "map(attribute='ansible_facts')\n      | map(attribute='preflight_results', default=none)"
    assert old in text, f"{report}: the report task changed; revisit this patch"
    fixed = "map(attribute='ansible_facts', default={})\n      | map(attribute='preflight_results', default={})"
    report.write_text(text.replace(old, fixed))
    return work / "baseline" / "ansible"


def mitogen_strategies() -> Path | None:
    spec = importlib.util.find_spec("ansible_mitogen")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "plugins" / "strategy"


def playbook_with_strategy(work: Path, strategy: str) -> Path:
    """Today's exaserve.fleet.preflight with each `strategy: free` play set to `strategy` (the roles are the
    collection's, called by FQCN)."""
    path = work / f"preflight-{strategy}.yml"
    path.write_text((PLAYBOOKS_DIR / "preflight.yml").read_text().replace("strategy: free", f"strategy: {strategy}"))
    return path


def config_command(config: str, work: Path, baseline: Path) -> tuple[list[str], dict[str, str], Path]:
    """(playbook and extra arguments, environment, working directory) of one configuration."""
    # BASELINE bounded nvidia-smi by its role's timeout; today one probe timeout bounds every tool.
    probe_timeout = "preflight_gpu_timeout_s" if config in ("stock", "tuned") else "preflight_ssh_probe_timeout_s"
    # Pings between namespaces on a loaded 2-core machine take milliseconds: time is measured, not the network.
    extra = ["-e", f"{probe_timeout}={TIMEOUT_S}", "-e", "preflight_connectivity_max_avg_rtt_ms=1000"]
    env = {"ANSIBLE_TIMEOUT": str(TIMEOUT_S)}
    if config == "stock":
        cfg = work / "stock.cfg"
        cfg.write_text(STOCK_CFG.format(ansible=baseline, timeout=TIMEOUT_S))
        playbook = work / "stock-preflight.yml"
        playbook.write_text(GATHER_FIRST.format(ansible=baseline))
        return [str(playbook), *extra], {**env, "ANSIBLE_CONFIG": str(cfg)}, baseline
    if config == "tuned":
        return (
            [str(baseline / "preflight.yml"), *extra],
            {**env, "ANSIBLE_CONFIG": str(baseline / "ansible.cfg")},
            baseline,
        )
    env["ANSIBLE_CONFIG"] = str(ANSIBLE_DIR / "ansible.cfg")
    if config == "one_probe":
        return [str(playbook_with_strategy(work, "linear")), *extra], env, ANSIBLE_DIR
    if config == "one_probe_free":
        return [str(ANSIBLE_DIR / "preflight.yml"), *extra], env, ANSIBLE_DIR
    strategies = mitogen_strategies()
    assert strategies is not None
    env["ANSIBLE_STRATEGY_PLUGINS"] = str(strategies)
    return [str(playbook_with_strategy(work, "mitogen_free")), *extra], env, ANSIBLE_DIR


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _pss_mb(pids: list[int]) -> float:
    total_kb = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total_kb += int(line.split()[1])
    return total_kb / 1024


@contextlib.contextmanager
def pss_sampler(pid: int, interval_s: float = 0.5) -> Iterator[list[float]]:
    peak = [0.0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _pss_mb(_descendants(pid)))
            stop.wait(interval_s)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        stop.set()
        thread.join()


def run_once(args: list[str], env: Mapping[str, str], cwd: Path, inventory: Path, limit: str, report: Path) -> Run:
    control = Path(tempfile.mkdtemp(prefix="cp", dir="/tmp"))  # fresh SSH masters: a cold run each time
    command = [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), *args, "--limit", limit,
               "-e", f"preflight_report_path={report}"]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    with open(report.with_suffix(".log"), "w") as log:
        proc = subprocess.Popen(command, cwd=cwd, env={**ansible_env(control), **env}, stdout=log, stderr=log)
        with pss_sampler(proc.pid) as peak:
            rc = proc.wait(timeout=3600)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    # The dead and the hung node fail the run (2; 4 when a stock fact-gathering play marks the dead node
    # unreachable); check_report then proves nothing else failed.
    if rc not in (2, 4):
        raise SystemExit(f"{' '.join(command)} exited {rc} (expected 2 or 4); log: {report.with_suffix('.log')}")
    tasks = tasks_per_host(report.with_suffix(".log").read_text())
    return Run(round(wall, 2), round(cpu, 2), round(peak[0], 1), tasks)


def check_report(report: Path, names: Mapping[str, str], hosts: int, config: str) -> list[str]:
    """What the run got wrong: it must find exactly the two faults it was given (the stock run's fact-gathering play
    meets the dead node first: the report then says it left the play, the one difference). A wrong report does not
    stop the benchmark: its row says what was wrong and is left out of the ratios and projections."""
    doc = json.loads(report.read_text())
    by_host = {names[n]: e for n, e in doc["hosts"].items()}
    if len(by_host) != hosts:
        return [f"{len(by_host)} hosts in the report, not {hosts}"]
    wrong = []
    for host, entry in sorted(by_host.items()):
        if host == UNREACHABLE:
            left = config == "stock" and entry["failed_checks"] == ["play"]
            if entry["status"] != "unreachable" and not left:
                wrong.append(f"{host} (dead) {entry['status']}")
        elif host == HUNG:
            if entry["failed_checks"] != ["gpu_count", "gpu_product", "gpu_memory", "driver", "cuda"]:
                wrong.append(f"{host} (hung nvidia-smi) failed {entry['failed_checks']}")
        elif entry["status"] != "pass":
            if set(entry["failed_checks"]) <= PING_CHECKS:  # a lost ping on 2 saturated cores: said, not wrong
                print(f"note: {report.name}: {host} failed {entry['failed_checks']} (ping on a loaded machine)",
                      file=sys.stderr)  # fmt: skip
                continue
            observed = entry["checks"].get("ssh", {}).get("observed", "")
            wrong.append(f"{host} (healthy) {entry['status']} {entry['failed_checks']} {observed}".strip())
    return wrong


def slope(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) through (hosts, seconds)."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return my - b * mx, b


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", default="16,32,64", help="comma-separated host counts (each >= 16)")
    p.add_argument("--repeat", type=int, default=2, help="runs per host count and configuration (min and median)")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, from {','.join(CONFIGS)}")
    p.add_argument("--json", action="store_true", help="print a JSON list, one object per host count and configuration")
    p.add_argument(
        "--controller-cores", type=int, default=16, help="cores of the controller the 256-node projection assumes"
    )
    args = p.parse_args()
    counts = sorted({int(n) for n in args.hosts.split(",")})
    configs = [c for c in args.configs.split(",") if c]
    bad = [c for c in configs if c not in CONFIGS] + [str(n) for n in counts if n < 16]
    if bad:
        print(f"--configs/--hosts: {bad} not allowed; configs are {list(CONFIGS)}, host counts >= 16", file=sys.stderr)
        return 2
    if "mitogen" in configs and mitogen_strategies() is None:
        print("mitogen: ansible_mitogen is not importable; install the pinned mitogen to evaluate it", file=sys.stderr)
        configs.remove("mitogen")
    reason = unavailable_reason()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="preflight-bench-"))
    baseline = baseline_tree(work)
    pool = HostPool.acquire()
    rows: list[dict[str, Any]] = []
    try:
        with model_store() as store:
            faults = {UNREACHABLE: HostFaults(unreachable=True), HUNG: HostFaults(hangs=("nvidia-smi",))}
            fleet = pool.fleet(max(counts), faults)
            install_container_stubs(fleet)
            stack = write_stack(work / "Pulumi.bench.yaml", fleet_stack_doc(fleet, store, racks=RACKS))
            inventory = write_inventory(work, stack, fleet)
            names = node_names(fleet, stack)
            order = sorted(names, key=lambda n: names[n])  # node01, node02, ...
            for n in counts:
                limit = ",".join(order[:n])
                for config in configs:
                    command, env, cwd = config_command(config, work, baseline)
                    runs, wrong = [], []
                    for i in range(args.repeat):
                        report = work / f"report-{config}-{n}-{i}.json"
                        runs.append(run_once(command, env, cwd, inventory, limit, report))
                        wrong += check_report(report, names, n, config)
                    walls = sorted(r.wall_s for r in runs)
                    row = {
                        "hosts": n,
                        "config": config,
                        "wall_s": walls[0],
                        "wall_median_s": round(statistics.median(walls), 2),
                        "controller_cpu_s": min(r.controller_cpu_s for r in runs),
                        "controller_cpu_per_host_s": round(min(r.controller_cpu_s for r in runs) / n, 3),
                        "peak_rss_mb": max(r.peak_rss_mb for r in runs),
                        "tasks_per_host": max(r.tasks_per_host for r in runs),
                        "controller_cpu_per_task_s": round(
                            min(r.controller_cpu_s for r in runs) / n / max(r.tasks_per_host for r in runs), 3
                        ),
                        "runs": len(runs),
                    }
                    if wrong:
                        row["wrong_report"] = wrong
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        pool.close()
    projections = project(rows, args.controller_cores)
    status = 1 if any("wrong_report" in r for r in rows) else 0  # a configuration that misreported the fleet
    if args.json:
        print(json.dumps(rows + projections, indent=2))
        return status
    print_table(rows, projections, args.repeat, args.controller_cores)
    return status


def project(rows: list[dict[str, Any]], cores: int) -> list[dict[str, Any]]:
    """One projected row per configuration measured at two or more host counts (marked ``projected``), with the wall
    time of a ``cores``-core controller running the projected controller CPU (``wall_on_cores_s``)."""
    out = []
    for config in dict.fromkeys(r["config"] for r in rows):
        mine = [r for r in rows if r["config"] == config and "wrong_report" not in r]
        if len({r["hosts"] for r in mine}) < 2:
            continue
        row: dict[str, Any] = {"hosts": PROJECT_TO, "config": config, "projected": True}
        for key in ("wall_s", "controller_cpu_s", "peak_rss_mb"):
            a, b = slope([(r["hosts"], r[key]) for r in mine])
            row[key] = round(a + b * PROJECT_TO, 1)
            row[f"{key}_per_host"] = round(b, 4)
        row["controller_cores"] = cores
        row["wall_on_cores_s"] = round(row["controller_cpu_s"] / cores + TIMEOUT_S, 1)
        out.append(row)
    return out


def print_table(rows: list[dict[str, Any]], projections: list[dict[str, Any]], repeat: int, cores: int) -> None:
    print(f"preflight.yml, one unreachable and one hung node among the hosts; {repeat} runs each (min / median wall)")
    print(f"{'hosts':>6} {'config':<15} {'wall s':>8} {'median':>8} {'ctrl cpu s':>11} {'cpu/host':>9} {'peak MB':>8} "
          f"{'stock/x':>8} {'stock cpu/x':>12} {'tasks/host':>11} {'cpu/task':>9}")  # fmt: skip
    stock = {r["hosts"]: r for r in rows if r["config"] == "stock" and "wrong_report" not in r}
    for r in rows:
        base = stock.get(r["hosts"]) if "wrong_report" not in r else None  # no ratio for a wrong report
        ratio = f"{base['wall_s'] / r['wall_s']:.2f}" if base else "-"
        cpu_ratio = f"{base['controller_cpu_s'] / r['controller_cpu_s']:.2f}" if base else "-"
        print(f"{r['hosts']:>6} {r['config']:<15} {r['wall_s']:>8} {r['wall_median_s']:>8} "
              f"{r['controller_cpu_s']:>11} {r['controller_cpu_per_host_s']:>9} {r['peak_rss_mb']:>8} {ratio:>8} "
              f"{cpu_ratio:>12} {r['tasks_per_host']:>11} {r['controller_cpu_per_task_s']:>9}")  # fmt: skip
    for r in rows:
        if "wrong_report" in r:
            print(f"{r['hosts']:>6} {r['config']:<15} WRONG REPORT ({len(r['wrong_report'])}): "
                  f"{'; '.join(r['wrong_report'][:3])}")  # fmt: skip
    for r in projections:
        print(f"{r['hosts']:>6} {r['config']:<15} {r['wall_s']:>8} {'':>8} {r['controller_cpu_s']:>11} "
              f"{r['controller_cpu_s_per_host']:>9} {r['peak_rss_mb']:>8}   projected from the slope "
              f"({r['wall_s_per_host']} s/host wall here); on a {cores}-core controller: {r['wall_on_cores_s']} s")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
