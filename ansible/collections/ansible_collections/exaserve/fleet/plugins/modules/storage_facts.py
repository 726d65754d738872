#!/usr/bin/python
"""Ansible module: model store mount, model files and local-cache free space, as JSON facts."""

from __future__ import annotations

import json
import os
from typing import Any

from ansible_collections.exaserve.fleet.plugins.module_utils.probe import Probe

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
author: ExaServe platform team
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

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
NOT_MOUNTED: dict[str, Any] = {"mounted": False, "source": None, "fstype": None}
ARGUMENT_SPEC: dict[str, Any] = {
    "mount_path": {"type": "path", "required": True},
    "model_dir": {"type": "path", "required": True},
    "cache_path": {"type": "path", "required": True},
}


def nearest_existing(path: str) -> str:
    """`path` itself or its closest existing parent."""
    current = os.path.abspath(path)
    while not os.path.exists(current) and current != os.path.dirname(current):
        current = os.path.dirname(current)
    return current


def model_listing(names_and_sizes: list[tuple[str, int]]) -> dict[str, Any]:
    """Summarise a model directory listing: config.json present, weight files and their bytes."""
    weights = [(n, s) for n, s in names_and_sizes if n.endswith(WEIGHT_SUFFIXES)]
    return {
        "has_config": any(n == "config.json" for n, _ in names_and_sizes),
        "weight_files": len(weights),
        "weight_bytes": sum(s for _, s in weights),
    }


def parse_findmnt(text: str) -> dict[str, Any]:
    """`findmnt --json --output TARGET,SOURCE,FSTYPE`: the last (visible) filesystem listed."""
    filesystems = json.loads(text).get("filesystems") or []
    if not filesystems:
        return dict(NOT_MOUNTED)
    fs = filesystems[-1]
    return {"mounted": True, "source": fs.get("source"), "fstype": fs.get("fstype")}


def main() -> None:
    probe = Probe("storage_facts", ARGUMENT_SPEC)
    p = probe.params
    facts: dict[str, Any] = {"mount_path": p["mount_path"], "model_dir": p["model_dir"], "cache_path": p["cache_path"]}
    findmnt = probe.find("findmnt", "Install util-linux ('apt-get install util-linux'), then re-run.")
    rc, out, _err = probe.run([findmnt, "--json", "--output", "TARGET,SOURCE,FSTYPE", "--mountpoint", p["mount_path"]])
    facts.update(probe.parse("findmnt", parse_findmnt, out) if rc == 0 else NOT_MOUNTED)  # rc 1: nothing mounted
    facts["model_dir_exists"] = os.path.isdir(p["model_dir"])
    entries: list[tuple[str, int]] = []
    if facts["model_dir_exists"]:
        with os.scandir(p["model_dir"]) as listing:
            entries = [(e.name, e.stat().st_size) for e in listing if e.is_file()]
    facts.update(model_listing(entries))
    facts["free_path"] = nearest_existing(p["cache_path"])
    vfs = os.statvfs(facts["free_path"])
    facts["free_bytes"] = vfs.f_bavail * vfs.f_frsize
    probe.facts(model_storage=facts)


if __name__ == "__main__":
    main()
