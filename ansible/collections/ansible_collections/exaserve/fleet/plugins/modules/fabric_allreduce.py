#!/usr/bin/python
"""Ansible module: run this node's rank of an all-reduce bus-bandwidth test (python -m serving.node.fabric)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fabric_allreduce
short_description: Run one rank of the torch.distributed all-reduce bus-bandwidth test
description:
  - Runs C(PYTHON -m serving.node.fabric) with this node's rank; every node of the group must run
    the same task at the same time (one Ansible task over the group does that). Rank 0 hosts
    the TCP rendezvous at I(master).
  - Uses NCCL when the node has a GPU and gloo otherwise; reports bus bandwidth the way
    nccl-tests does (busbw = algbw x 2(n-1)/n).
  - Never fails on a measurement problem (peer missing, timeout, no torch); the error is in the
    result so preflight can report it. Bounded by I(timeout_s) plus the interpreter start-up.
  - Only measures (network traffic between the nodes of the group). Runs the worker itself, bounded by I(timeout_s), not through the probe skeleton's C(run).
version_added: "0.1.0"
author: ExaServe platform team (@exaserve-platform)
extends_documentation_fragment: [exaserve.fleet.read_only]
options:
  python:
    description: Interpreter on the node with torch and the exaserve-deploy package installed.
    type: path
    required: true
  rank: {description: This node's rank in the group, type: int, required: true}
  world_size: {description: Nodes in the group, type: int, required: true}
  master: {description: "ADDR:PORT of rank 0's rendezvous", type: str, required: true}
  backend: {description: Collective backend, type: str, choices: [auto, nccl, gloo], default: auto}
  size_mib: {description: Buffer size, type: int, default: 64}
  iterations: {description: Timed iterations, type: int, default: 20}
  timeout_s: {description: Rendezvous and collective timeout, type: int, default: 60}
  ifname: {description: Bootstrap interface (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME), type: str}
"""

EXAMPLES = r"""
- name: Measure the pair
  exaserve.fleet.fabric_allreduce:
    python: /opt/exaserve/venv/bin/python
    rank: 0
    world_size: 2
    master: 10.40.0.11:29500
"""

RETURN = r"""
fabric:
  description: The test's result, or C(error) when it could not run.
  returned: always
  type: dict
  sample: {backend: gloo, world_size: 2, rank: 0, size_bytes: 67108864, time_s: 0.07, busbw_gbps: 7.6, error: null}
"""

import json
import subprocess
from typing import Any

from ansible_collections.exaserve.fleet.plugins.module_utils.probe import Probe

STARTUP_ALLOWANCE_S = 60
ARGUMENT_SPEC: dict[str, Any] = {
    "python": {"type": "path", "required": True},
    "rank": {"type": "int", "required": True},
    "world_size": {"type": "int", "required": True},
    "master": {"type": "str", "required": True},
    "backend": {"type": "str", "choices": ["auto", "nccl", "gloo"], "default": "auto"},
    "size_mib": {"type": "int", "default": 64},
    "iterations": {"type": "int", "default": 20},
    "timeout_s": {"type": "int", "default": 60},
    "ifname": {"type": "str"},
}


def parse_worker_output(stdout: str) -> dict[str, Any]:
    """The last JSON object the worker printed (torch may print warnings before it)."""
    for raw in reversed(stdout.splitlines()):
        line = raw.strip()
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(doc, dict):
                doc.setdefault("error", None)
                return doc
    return {"error": f"the worker printed no result: {stdout.strip()[-500:] or '(nothing)'}"}


def main() -> None:
    probe = Probe("fabric_allreduce", ARGUMENT_SPEC)
    p = probe.params
    args = [
        p["python"],
        "-m",
        "serving.node.fabric",
        "--rank",
        str(p["rank"]),
        "--world-size",
        str(p["world_size"]),
        "--master",
        p["master"],
        "--backend",
        p["backend"],
        "--size-mib",
        str(p["size_mib"]),
        "--iterations",
        str(p["iterations"]),
        "--timeout-s",
        str(p["timeout_s"]),
    ]
    if p["ifname"]:
        args += ["--ifname", p["ifname"]]
    try:
        proc = subprocess.run(
            args, capture_output=True, text=True, timeout=p["timeout_s"] + STARTUP_ALLOWANCE_S, check=False
        )
        result = parse_worker_output(proc.stdout)
        if result["error"] is None and proc.returncode != 0:
            result["error"] = f"worker exited {proc.returncode}: {proc.stderr.strip()[-500:]}"
    except FileNotFoundError:
        result = {"error": f"{p['python']} does not exist; install torch and exaserve-deploy there"}
    except subprocess.TimeoutExpired:
        result = {"error": f"no result within {p['timeout_s'] + STARTUP_ALLOWANCE_S} s; killed"}
    probe.done(fabric=result)


if __name__ == "__main__":
    main()
