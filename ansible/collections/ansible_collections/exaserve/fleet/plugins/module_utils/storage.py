"""Probe reader: the model store mount, the model directory and the cache's free space (parsers and the reader).

Shared by the single-tool module ``storage_facts`` and ``preflight_facts``. Runs on the managed node.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ansible_collections.exaserve.fleet.plugins.module_utils.probe import Probe

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
NOT_MOUNTED: dict[str, Any] = {"mounted": False, "source": None, "fstype": None}


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
        "has_config": any(n == "config.json" for n, _size in names_and_sizes),
        "weight_files": len(weights),
        "weight_bytes": sum(s for _name, s in weights),
    }


INDEX_FILE = "model.safetensors.index.json"


def checkpoint_index(text: str, present: set[str]) -> dict[str, Any]:
    """The store's safetensors index (the file the planner counts weights from): its ``metadata.total_size``, the
    shard files its ``weight_map`` names and those of them not in the model directory (``present``)."""
    doc = json.loads(text)
    total = doc.get("metadata", {}).get("total_size") if isinstance(doc, dict) else None
    wmap = doc.get("weight_map") if isinstance(doc, dict) else None
    shards = sorted(set(wmap.values())) if isinstance(wmap, dict) else []
    return {
        "index_total_size": total if isinstance(total, int) else None,
        "index_shards": len(shards),
        "index_shards_missing": [s for s in shards if s not in present],
    }


def parse_findmnt(text: str) -> dict[str, Any]:
    """`findmnt --json --output TARGET,SOURCE,FSTYPE`: the last (visible) filesystem listed."""
    filesystems = json.loads(text).get("filesystems") or []
    if not filesystems:
        return dict(NOT_MOUNTED)
    fs = filesystems[-1]
    return {"mounted": True, "source": fs.get("source"), "fstype": fs.get("fstype")}


def read_storage(probe: Probe, mount_path: str, model_dir: str, cache_path: str) -> dict[str, Any]:
    """The `model_storage` fact."""
    facts: dict[str, Any] = {"mount_path": mount_path, "model_dir": model_dir, "cache_path": cache_path}
    findmnt = probe.find("findmnt", "Install util-linux ('apt-get install util-linux'), then re-run.")
    rc, out, _err = probe.run([findmnt, "--json", "--output", "TARGET,SOURCE,FSTYPE", "--mountpoint", mount_path])
    facts.update(probe.parse("findmnt", parse_findmnt, out) if rc == 0 else NOT_MOUNTED)  # rc 1: nothing mounted
    facts["model_dir_exists"] = os.path.isdir(model_dir)
    entries: list[tuple[str, int]] = []
    if facts["model_dir_exists"]:
        with os.scandir(model_dir) as listing:
            entries = [(e.name, e.stat().st_size) for e in listing if e.is_file()]
    facts.update(model_listing(entries))
    facts.update(index_total_size=None, index_shards=0, index_shards_missing=[])
    if any(name == INDEX_FILE for name, _size in entries):
        with open(os.path.join(model_dir, INDEX_FILE), encoding="utf-8") as index:
            text = index.read()
        facts.update(probe.parse(INDEX_FILE, lambda t: checkpoint_index(t, {n for n, _s in entries}), text))
    facts["free_path"] = nearest_existing(cache_path)
    vfs = os.statvfs(facts["free_path"])
    facts["free_bytes"] = vfs.f_bavail * vfs.f_frsize
    return {"model_storage": facts}
