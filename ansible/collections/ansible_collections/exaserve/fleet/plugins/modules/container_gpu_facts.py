#!/usr/bin/python
"""Ansible module: container runtime and NVIDIA container toolkit state, parsed into JSON facts."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: container_gpu_facts
short_description: Read whether containers on the node get GPUs (runtime, NVIDIA runtime, toolkit)
description:
  - For containerd, runs C(ctr version) (is the daemon answering), C(containerd config dump) (is a
    runtime whose binary is C(nvidia-container-runtime) configured, and is it the default); for
    Docker, C(docker info --format '{{json .}}').
  - Runs C(nvidia-container-cli info) and lists the GPUs the NVIDIA container toolkit would pass
    into a container (the devices C(--gpus all) gets).
  - Never fails on a missing piece; it is reported in the fact so preflight can say what to fix.
version_added: "0.1.0"
author: ExaServe platform team (@exaserve-platform)
extends_documentation_fragment: [exaserve.fleet.read_only]
options:
  runtime:
    description: Container runtime the fleet uses (C(cluster.host.container_runtime)).
    type: str
    choices: [containerd, docker]
    default: containerd
requirements:
  - containerd (ctr) or Docker, and nvidia-container-toolkit, on the managed node
"""

EXAMPLES = r"""
- name: Read container GPU support
  exaserve.fleet.container_gpu_facts:
    runtime: containerd

- name: Containers get all eight GPUs
  ansible.builtin.assert:
    that:
      - container_gpu.server_version is not none
      - container_gpu.nvidia_runtime
      - container_gpu.device_count == 8
    fail_msg: "{{ inventory_hostname }}: {{ container_gpu }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: always
  type: dict
  contains:
    container_gpu:
      description: Runtime and toolkit state.
      type: dict
      contains:
        runtime: {description: The runtime probed, type: str, sample: containerd}
        server_version: {description: "Daemon version, None when it does not answer", type: str, sample: v1.7.12}
        runtime_error: {description: Why the daemon could not be read, type: str, sample: null}
        runtimes: {description: Configured runtime name -> binary, type: dict, sample: {nvidia: /usr/bin/nvidia-container-runtime, runc: null}}
        default_runtime: {description: Default runtime name, type: str, sample: nvidia}
        nvidia_runtime: {description: A runtime runs nvidia-container-runtime, type: bool, sample: true}
        toolkit_error: {description: Why nvidia-container-cli info failed, type: str, sample: null}
        nvrm_version: {description: Driver version the toolkit sees, type: str, sample: 570.195.03}
        cuda_version: {description: CUDA version the toolkit reports, type: str, sample: "12.8"}
        device_count: {description: GPUs the toolkit would pass through, type: int, sample: 8}
        devices:
          description: One entry per GPU
          type: list
          elements: dict
          sample: [{index: 0, model: NVIDIA H100 80GB HBM3, uuid: GPU-..., bus_location: "00000000:16:00.0", architecture: "9.0"}]
"""

from typing import Any

from ansible_collections.exaserve.fleet.plugins.module_utils.container_gpu import read_container_gpu
from ansible_collections.exaserve.fleet.plugins.module_utils.probe import Probe

ARGUMENT_SPEC: dict[str, Any] = {
    "runtime": {"type": "str", "choices": ["containerd", "docker"], "default": "containerd"},
}


def main() -> None:
    probe = Probe("container_gpu_facts", ARGUMENT_SPEC)
    probe.report(lambda p: read_container_gpu(p, p.params["runtime"]))


if __name__ == "__main__":
    main()
