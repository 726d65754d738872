#!/usr/bin/python
"""Ansible module: GPU inventory from `nvidia-smi`, parsed into JSON facts."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_smi_facts
short_description: Read GPU count, memory, driver and CUDA version from nvidia-smi as facts
description:
  - Runs C(nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version
    --format=csv,noheader,nounits) and the plain C(nvidia-smi) summary on the node and returns
    the C(nvidia_smi) fact.
  - The CUDA version is the highest CUDA runtime the installed driver supports, as printed in the
    summary header.
  - Fails with the fix when C(nvidia-smi) is missing or cannot talk to the driver.
version_added: "0.1.0"
author: ExaServe platform team (@exaserve-platform)
extends_documentation_fragment: [exaserve.fleet.read_only]
options: {}
requirements:
  - The NVIDIA driver (it ships nvidia-smi) on the managed node
notes:
  - C(nvidia-smi) can hang on a wedged GPU; set the task keyword C(timeout) to bound it.
"""

EXAMPLES = r"""
- name: Read the GPU inventory
  exaserve.fleet.nvidia_smi_facts:
  timeout: 60

- name: Eight 80 GB GPUs and a driver new enough for CUDA 12.1
  ansible.builtin.assert:
    that:
      - nvidia_smi.gpu_count == 8
      - nvidia_smi.cuda_version is version('12.1', '>=')
    fail_msg: >-
      {{ inventory_hostname }}: {{ nvidia_smi.gpu_count }} GPUs, CUDA {{ nvidia_smi.cuda_version }};
      expected 8 GPUs and CUDA >= 12.1. Reseat or replace the missing GPU, or upgrade the driver.
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: success
  type: dict
  contains:
    nvidia_smi:
      description: Parsed nvidia-smi output.
      type: dict
      contains:
        gpu_count:
          description: Number of GPUs nvidia-smi lists.
          type: int
          sample: 8
        driver_version:
          description: Driver version (the same on every GPU of a node).
          type: str
          sample: "570.195.03"
        cuda_version:
          description: Highest CUDA version the driver supports, from the summary header.
          type: str
          sample: "12.8"
        gpus:
          description: One entry per GPU; memory in MiB as nvidia-smi reports it.
          type: list
          elements: dict
          sample:
            - index: 0
              name: NVIDIA H100 80GB HBM3
              memory_total_mib: 81559
              memory_used_mib: 0
              driver_version: "570.195.03"
"""

from typing import Any

from ansible_collections.exaserve.fleet.plugins.module_utils.nvidia_smi import read_nvidia_smi
from ansible_collections.exaserve.fleet.plugins.module_utils.probe import Probe

ARGUMENT_SPEC: dict[str, Any] = {}  # no options (DOCUMENTATION says so too)


def main() -> None:
    probe = Probe("nvidia_smi_facts", ARGUMENT_SPEC)
    probe.report(read_nvidia_smi)


if __name__ == "__main__":
    main()
