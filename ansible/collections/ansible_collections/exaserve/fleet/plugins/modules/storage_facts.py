#!/usr/bin/python
"""Ansible module: model store mount, model files and local-cache free space, as JSON facts."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: storage_facts
short_description: Read whether the model store is mounted, the model is there and the cache has room
description:
  - Asks C(findmnt) whether I(mount_path) is a mount point and what is mounted there.
  - Lists I(model_dir) - C(config.json) and the weight files (C(*.safetensors), C(*.bin), C(*.pt),
    C(*.gguf)) with their total size - without reading them.
  - Reports the free space of the filesystem that holds I(cache_path) (its nearest existing
    parent when the cache directory does not exist yet).
version_added: "0.1.0"
author: ExaServe platform team (@exaserve-platform)
extends_documentation_fragment: [exaserve.fleet.read_only]
options:
  mount_path:
    description: Where the shared model store is mounted (C(storage.model_store.mount_path)).
    type: path
    required: true
  model_dir:
    description: The model's directory on the store.
    type: path
    required: true
  cache_path:
    description: The node-local model cache (C(storage.local_cache.path)).
    type: path
    required: true
requirements:
  - findmnt (util-linux) on the managed node
"""

EXAMPLES = r"""
- name: Read model store and cache state
  exaserve.fleet.storage_facts:
    mount_path: /models
    model_dir: /models/meta-llama/Meta-Llama-3-70B-Instruct
    cache_path: /var/cache/exaserve/models
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: always
  type: dict
  contains:
    model_storage:
      description: Store, model and cache state.
      type: dict
      contains:
        mounted: {description: mount_path is a mount point, type: bool, sample: true}
        source: {description: What is mounted there, type: str, sample: "nfs.exaserve.internal:/export/models"}
        fstype: {description: Its filesystem type, type: str, sample: nfs4}
        model_dir_exists: {description: The model directory exists, type: bool, sample: true}
        has_config: {description: config.json is in the model directory, type: bool, sample: true}
        weight_files: {description: Number of weight files, type: int, sample: 30}
        weight_bytes: {description: Their total size, type: int, sample: 141107412992}
        free_path: {description: The existing path whose filesystem was measured, type: str, sample: /var/cache/exaserve/models}
        free_bytes: {description: Bytes available to unprivileged users there, type: int, sample: 2199023255552}
"""

from typing import Any

from ansible_collections.exaserve.fleet.plugins.module_utils.probe import Probe
from ansible_collections.exaserve.fleet.plugins.module_utils.storage import read_storage

ARGUMENT_SPEC: dict[str, Any] = {
    "mount_path": {"type": "path", "required": True},
    "model_dir": {"type": "path", "required": True},
    "cache_path": {"type": "path", "required": True},
}


def main() -> None:
    probe = Probe("storage_facts", ARGUMENT_SPEC)
    probe.report(lambda p: read_storage(p, p.params["mount_path"], p.params["model_dir"], p.params["cache_path"]))


if __name__ == "__main__":
    main()
