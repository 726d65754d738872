"""Benchmark: preflight wall time on 4 and 16 SSH test hosts, tuned vs Ansible's stock settings,
and the paramiko fan-out on 16 hosts.

    sudo .venv/bin/python bench/preflight_bench.py [--repeat N] [--json]

Tuned = ansible/ansible.cfg (forks sized to the fleet, pipelining, SSH multiplexing kept open,
targeted probe modules instead of gathered facts). Stock = the same playbook and roles with
forks 5, no pipelining, interpreter discovery and a full fact-gathering play first (ssh_args
left at Ansible's default). Each figure is the median of --repeat runs. Needs root (network
namespaces); the hosts are the test fixtures' (tests/hosts), the stand-ins those of the tests.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from serving.remote.fanout import Target, fan_out
from tests.hosts.netns import HostFleet, HostPool, unavailable_reason
from tests.support.preflight import (
    ANSIBLE_DIR,
    fleet_stack_doc,
    install_container_stubs,
    model_store,
    node_names,
    run_playbook,
    write_inventory,
)
from tests.support.stacks import write_stack

STOCK_CFG = f"""[defaults]
roles_path = {ANSIBLE_DIR}/roles
collections_path = {ANSIBLE_DIR}/collections
forks = 5
host_key_checking = True

[inventory]
enable_plugins = exaserve.fleet.exaserve

[ssh_connection]
pipelining = False
"""

GATHER_FIRST = f"""- name: Gather facts (Ansible's stock behaviour)
  hosts: exaserve
  gather_facts: true

- name: Preflight
  ansible.builtin.import_playbook: {ANSIBLE_DIR}/preflight.yml
"""


def preflight_seconds(inventory: Path, limit: str, work: Path, *, stock: bool, repeat: int) -> list[float]:
    times = []
    for i in range(repeat):
        control = Path(tempfile.mkdtemp(prefix="cp", dir="/tmp"))  # fresh SSH masters: a cold run each time
        report = work / f"report-{'stock' if stock else 'tuned'}-{limit.count(',') + 1}-{i}.json"
        env = {"ANSIBLE_CONFIG": str(work / "stock.cfg")} if stock else {}
        playbook = str(work / "stock-preflight.yml") if stock else "preflight.yml"
        run = run_playbook(playbook, inventory, control, "--limit", limit, "-e", f"preflight_report_path={report}",
                           env=env, timeout_s=900)  # fmt: skip
        if run.rc != 0:
            raise SystemExit(f"preflight ({'stock' if stock else 'tuned'}) failed rc {run.rc}:\n{run.output[-3000:]}")
        times.append(run.seconds)
    return times


def fanout_seconds(fleet: HostFleet, argv: list[str], repeat: int, max_parallel: int) -> tuple[float, int]:
    targets = [Target(h.name, h.address, h.port, "root") for h in fleet.hosts]
    times, ok = [], 0
    for _ in range(repeat):
        started = time.monotonic()
        results = fan_out(targets, argv, known_hosts=fleet.known_hosts, identity=fleet.client_key,
                          max_parallel=max_parallel)  # fmt: skip
        times.append(time.monotonic() - started)
        ok = sum(r.ok for r in results)
    return statistics.median(times), ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=1, help="runs per figure (median)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args()
    reason = unavailable_reason()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="preflight-bench-"))
    (work / "stock.cfg").write_text(STOCK_CFG)
    (work / "stock-preflight.yml").write_text(GATHER_FIRST)
    pool = HostPool.acquire()
    figures: dict[str, object] = {}
    try:
        with model_store() as store:
            fleet = pool.fleet(16)
            install_container_stubs(fleet)
            stack = write_stack(work / "Pulumi.bench.yaml", fleet_stack_doc(fleet, store, racks=2))
            inventory = write_inventory(work, stack, fleet)
            names = list(node_names(fleet, stack))
            for n in (4, 16):
                limit = ",".join(names[:n])
                tuned = statistics.median(preflight_seconds(inventory, limit, work, stock=False, repeat=args.repeat))
                stock = statistics.median(preflight_seconds(inventory, limit, work, stock=True, repeat=args.repeat))
                figures[f"preflight_{n}_hosts"] = {"tuned_s": round(tuned, 1), "stock_s": round(stock, 1),
                                                   "stock_over_tuned": round(stock / tuned, 2)}  # fmt: skip
            query = ["nvidia-smi", "--query-gpu=index,name,memory.total,memory.used", "--format=csv"]
            parallel, ok = fanout_seconds(fleet, query, max(3, args.repeat), max_parallel=64)
            serial, _ = fanout_seconds(fleet, query, 1, max_parallel=1)
            figures["fanout_16_hosts"] = {"parallel_s": round(parallel, 3), "one_at_a_time_s": round(serial, 3),
                                          "hosts_ok": ok, "command": " ".join(query)}  # fmt: skip
    finally:
        pool.close()
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(f"preflight.yml wall time (median of {args.repeat}; healthy hosts, every check but fabric)")
    print(f"{'hosts':>6} {'tuned s':>9} {'stock s':>9} {'stock/tuned':>12}")
    for n in (4, 16):
        f = figures[f"preflight_{n}_hosts"]
        assert isinstance(f, dict)
        print(f"{n:>6} {f['tuned_s']:>9} {f['stock_s']:>9} {f['stock_over_tuned']:>12}")
    f = figures["fanout_16_hosts"]
    assert isinstance(f, dict)
    print(f"paramiko fan-out, 16 hosts, `{f['command']}`: {f['parallel_s']} s all at once "
          f"({f['hosts_ok']}/16 ok), {f['one_at_a_time_s']} s one at a time")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
