#!/usr/bin/python
"""Ansible module: ping other nodes from this node, all at once, with a bounded latency sample."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: peer_ping_facts
short_description: Ping a list of nodes from the managed node in parallel and report loss and RTT
description:
  - Starts one C(ping -n -q -c COUNT -i INTERVAL -w DEADLINE ADDRESS) per target at once and
    parses each summary (packets sent and received, rtt min/avg/max).
  - Bounded time - every ping ends after I(deadline_s); the module returns after the slowest.
  - Sends ICMP echo only.
  - The pings run at once through the probe skeleton; one still running 2 s past I(deadline_s) is killed.
version_added: "0.1.0"
author: ExaServe platform team (@exaserve-platform)
extends_documentation_fragment: [exaserve.fleet.read_only]
options:
  targets:
    description: Nodes to ping, each C({name, address}).
    type: list
    elements: dict
    required: true
  count:
    description: Echo requests per target.
    type: int
    default: 5
  interval_s:
    description: Seconds between requests (0.2 is the smallest an unprivileged user may use).
    type: float
    default: 0.2
  deadline_s:
    description: Seconds after which a target's ping stops, whatever it received.
    type: int
    default: 3
requirements:
  - ping (iputils-ping) on the managed node
"""

EXAMPLES = r"""
- name: Ping the rack
  exaserve.fleet.peer_ping_facts:
    targets:
      - {name: gpu-r00-n01, address: 10.40.0.12}
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: always
  type: dict
  contains:
    peer_ping:
      description: One entry per target, in the order given.
      type: list
      elements: dict
      sample:
        - {name: gpu-r00-n01, address: 10.40.0.12, transmitted: 5, received: 5, loss_pct: 0.0,
           rtt_min_ms: 0.041, rtt_avg_ms: 0.052, rtt_max_ms: 0.071, reachable: true, error: null,
           summary: "gpu-r00-n01 (10.40.0.12) 0.0 % loss, rtt avg/max 0.052/0.071 ms"}
"""

import re
from typing import Any

from ansible_collections.exaserve.fleet.plugins.module_utils.probe import Probe

ARGUMENT_SPEC: dict[str, Any] = {
    "targets": {"type": "list", "elements": "dict", "required": True},
    "count": {"type": "int", "default": 5},
    "interval_s": {"type": "float", "default": 0.2},
    "deadline_s": {"type": "int", "default": 3},
}
_PACKETS = re.compile(r"(?P<tx>\d+) packets transmitted, (?P<rx>\d+) (?:packets )?received")
_RTT = re.compile(
    r"(?:rtt|round-trip) min/avg/max(?:/(?:mdev|stddev))? = (?P<min>[\d.]+)/(?P<avg>[\d.]+)/(?P<max>[\d.]+)"
)


def parse_ping_summary(text: str) -> dict[str, Any]:
    """The summary lines of `ping -q`: packets sent/received, loss and rtt min/avg/max in ms."""
    packets = _PACKETS.search(text)
    if packets is None:
        return {
            "transmitted": 0,
            "received": 0,
            "loss_pct": 100.0,
            "rtt_min_ms": None,
            "rtt_avg_ms": None,
            "rtt_max_ms": None,
        }
    tx, rx = int(packets.group("tx")), int(packets.group("rx"))
    rtt = _RTT.search(text)
    return {
        "transmitted": tx,
        "received": rx,
        "loss_pct": round(100.0 * (tx - rx) / tx, 1) if tx else 100.0,
        "rtt_min_ms": float(rtt.group("min")) if rtt else None,
        "rtt_avg_ms": float(rtt.group("avg")) if rtt else None,
        "rtt_max_ms": float(rtt.group("max")) if rtt else None,
    }


def describe(result: dict[str, Any]) -> str:
    """One line per target: `name (address) 0.0 % loss, rtt avg/max 0.05/0.08 ms`."""
    text = f"{result['name']} ({result['address']}) {result['loss_pct']} % loss"
    if result["rtt_avg_ms"] is not None:
        text += f", rtt avg/max {result['rtt_avg_ms']}/{result['rtt_max_ms']} ms"
    return text


def read_peer_ping(probe: Probe) -> dict[str, Any]:
    """The `peer_ping` fact: every target pinged at once."""
    p = probe.params
    ping = probe.find("ping", "Install iputils-ping ('apt-get install iputils-ping'), then re-run.")
    for target in p["targets"]:
        if not isinstance(target, dict) or not target.get("address"):
            probe.fail(f"targets: every target needs an address, got {target!r}; give each as {{name, address}}")
    probe.timeout_s = p["deadline_s"] + 2
    outcomes = probe.run_all(
        [
            [ping, "-n", "-q", "-c", str(p["count"]), "-i", str(p["interval_s"]), "-w", str(p["deadline_s"]),
             str(target["address"])]
            for target in p["targets"]
        ]
    )  # fmt: skip
    results = []
    for target, (rc, out, err) in zip(p["targets"], outcomes, strict=True):
        killed = f" (killed after {probe.timeout_s} s)" if rc is None else ""
        summary = parse_ping_summary(out)
        summary.update(
            name=target.get("name", target["address"]),
            address=str(target["address"]),
            reachable=summary["received"] > 0,
            error=(err + killed).strip() or None,
        )
        summary["summary"] = describe(summary)
        results.append(summary)
    return {"peer_ping": results}


def main() -> None:
    Probe("peer_ping_facts", ARGUMENT_SPEC).report(read_peer_ping)


if __name__ == "__main__":
    main()
