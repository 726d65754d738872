#!/usr/bin/python
"""Ansible module: every fact preflight checks, read in one round trip to the node."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight_facts
short_description: Read every fact the preflight checks need in one module run
description:
  - Reads /etc/os-release, then the I(sections) asked for, all at once, each in its own thread -
    C(os) (kernel release, cgroup hierarchy), C(gpu) (nvidia-smi), C(rdma) (ibstat),
    C(container) (container runtime and NVIDIA toolkit), C(ntp) (chronyc tracking) and
    C(storage) (model store, model files, cache free space) - and returns the same facts as the
    single-tool modules (C(os_release), C(host_kernel), C(cgroup), C(nvidia_smi), C(ibstat),
    C(container_gpu), C(chrony), C(model_storage)).
  - One SSH round trip per node instead of one per tool; the preflight roles read these facts.
  - A section that fails does not fail the module - its message (the tool, what it printed, the fix)
    goes to C(preflight_probe_errors) and the preflight role of that concern records its checks as
    failed. Only an unreadable /etc/os-release fails the module.
  - Every tool is killed after I(timeout_s); sections run in parallel, so a hung tool costs one
    timeout, not one per tool.
version_added: "0.2.0"
author: ExaServe platform team (@exaserve-platform)
extends_documentation_fragment: [exaserve.fleet.read_only]
options:
  sections:
    description: What to read besides /etc/os-release.
    type: list
    elements: str
    choices: [os, gpu, rdma, container, ntp, storage]
    default: [os, gpu, rdma, container, ntp, storage]
  container_runtime:
    description: The runtime the C(container) section probes.
    type: str
    choices: [containerd, docker]
    default: containerd
  mount_path:
    description: Where the model store is mounted (C(storage)).
    type: path
  model_dir:
    description: The model directory on the store (C(storage)).
    type: path
  cache_path:
    description: The local model cache, whose filesystem's free space is measured (C(storage)).
    type: path
  timeout_s:
    description: Seconds after which a tool still running is killed and its section reported as hung.
    type: float
    default: 60
requirements:
  - Those of the single-tool modules for the sections asked for (nvidia-smi, ibstat, chronyc, findmnt, ...)
"""

EXAMPLES = r"""
- name: Read every preflight fact
  exaserve.fleet.preflight_facts:
    sections: [os, gpu, ntp]
    timeout_s: 30

- name: Eight GPUs, unless nvidia-smi failed
  ansible.builtin.assert:
    that: "'gpu' in ansible_facts.preflight_probe_errors or ansible_facts.nvidia_smi.gpu_count == 8"
    fail_msg: "{{ inventory_hostname }}: {{ ansible_facts.nvidia_smi.gpu_count }} GPUs"
"""

RETURN = r"""
ansible_facts:
  description: >-
    The facts of the single-tool modules for each section that succeeded (see their documentation),
    C(os_release) always, and C(preflight_probe_errors).
  returned: success
  type: dict
  contains:
    preflight_probe_errors:
      description: Section -> why it could not be read (empty when every section was read).
      type: dict
      sample: {gpu: "nvidia-smi did not answer within 60 s and was killed. ..."}
    preflight_probe_seconds:
      description: Section -> seconds it took on the node.
      type: dict
      sample: {os: 0.001, gpu: 0.05, ntp: 0.01}
"""

import threading
import time
from typing import Any

from ansible_collections.exaserve.fleet.plugins.module_utils.chrony import read_chrony
from ansible_collections.exaserve.fleet.plugins.module_utils.container_gpu import read_container_gpu
from ansible_collections.exaserve.fleet.plugins.module_utils.ibstat import read_ibstat
from ansible_collections.exaserve.fleet.plugins.module_utils.kernel import read_kernel
from ansible_collections.exaserve.fleet.plugins.module_utils.nvidia_smi import read_nvidia_smi
from ansible_collections.exaserve.fleet.plugins.module_utils.os_release import read_os_release
from ansible_collections.exaserve.fleet.plugins.module_utils.probe import Probe, ProbeFailure, Reader
from ansible_collections.exaserve.fleet.plugins.module_utils.storage import read_storage

SECTIONS = ("os", "gpu", "rdma", "container", "ntp", "storage")
ARGUMENT_SPEC: dict[str, Any] = {
    "sections": {"type": "list", "elements": "str", "choices": list(SECTIONS), "default": list(SECTIONS)},
    "container_runtime": {"type": "str", "choices": ["containerd", "docker"], "default": "containerd"},
    "mount_path": {"type": "path"},
    "model_dir": {"type": "path"},
    "cache_path": {"type": "path"},
    "timeout_s": {"type": "float", "default": 60},
}
# A section still running this long after the tools' timeout is given up on (e.g. stat() on a hung NFS mount).
GRACE_S = 5.0


def read_storage_of(params: dict[str, Any]) -> Reader:
    """The storage reader for the paths given; a path not given makes the section fail, naming it."""

    def read(probe: Probe) -> dict[str, Any]:
        absent = [key for key in ("mount_path", "model_dir", "cache_path") if not params[key]]
        if absent:
            probe.fail(f"section storage needs {', '.join(absent)}: give them, or leave storage out of sections")
        return read_storage(probe, params["mount_path"], params["model_dir"], params["cache_path"])

    return read


def readers(params: dict[str, Any]) -> dict[str, Reader]:
    """The reader of every section asked for."""
    every: dict[str, Reader] = {
        "os": read_kernel,
        "gpu": read_nvidia_smi,
        "rdma": read_ibstat,
        "container": lambda p: read_container_gpu(p, params["container_runtime"]),
        "ntp": read_chrony,
        "storage": read_storage_of(params),
    }
    return {name: every[name] for name in SECTIONS if name in params["sections"]}


def read_sections(probe: Probe, sections: dict[str, Reader], deadline_s: float) -> dict[str, Any]:
    """Run every reader in its own daemon thread (a thread stuck in the kernel cannot hold the module
    open); collect facts, per-section errors and seconds. A section not done by `deadline_s` is an error."""
    facts: dict[str, Any] = {}
    errors: dict[str, str] = {}
    seconds: dict[str, float] = {}

    def run(name: str, read: Reader) -> None:
        started = time.monotonic()
        try:
            facts.update(read(probe))
        except ProbeFailure as exc:
            errors[name] = str(exc)
        except Exception as exc:  # one section's bug must not hide the others' facts
            errors[name] = f"{type(exc).__name__}: {exc}"
        seconds[name] = round(time.monotonic() - started, 3)

    threads = {name: threading.Thread(target=run, args=(name, read), daemon=True) for name, read in sections.items()}
    for thread in threads.values():
        thread.start()
    stop = time.monotonic() + deadline_s
    for name, thread in threads.items():
        thread.join(max(0.0, stop - time.monotonic()))
        if thread.is_alive():
            errors[name] = (
                f"the {name} section did not finish within {deadline_s:g} s (a call into the kernel hangs, "
                "e.g. on a stale NFS mount): look at dmesg on the node"
            )
    return {**facts, "preflight_probe_errors": errors, "preflight_probe_seconds": seconds}


def main() -> None:
    probe = Probe("preflight_facts", ARGUMENT_SPEC)
    params = probe.params
    probe.timeout_s = params["timeout_s"]
    probe.report(read_os_release, lambda p: read_sections(p, readers(params), params["timeout_s"] + GRACE_S))


if __name__ == "__main__":
    main()
