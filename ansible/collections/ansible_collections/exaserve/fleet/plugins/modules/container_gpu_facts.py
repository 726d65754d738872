#!/usr/bin/python
"""Ansible module: container runtime and NVIDIA container toolkit state, parsed into JSON facts."""

from __future__ import annotations

import json
import re
from typing import Any

from ansible_collections.exaserve.fleet.plugins.module_utils.probe import Probe, ProbeParseError

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
author: ExaServe platform team
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
        server_version: {description: Daemon version, None when it does not answer, type: str, sample: v1.7.12}
        runtime_error: {description: Why the daemon could not be read, type: str, sample: null}
        runtimes: {description: Configured runtime name -> binary, type: dict, sample: {nvidia: /usr/bin/nvidia-container-runtime, runc: null}}
        default_runtime: {description: Default runtime name, type: str, sample: nvidia}
        nvidia_runtime: {description: A runtime runs nvidia-container-runtime, type: bool, sample: true}
        toolkit_error: {description: Why nvidia-container-cli info failed, type: str, sample: null}
        nvrm_version: {description: Driver version the toolkit sees, type: str, sample: 570.195.03}
        cuda_version: {description: CUDA version the toolkit reports, type: str, sample: "12.8"}
        device_count: {description: GPUs the toolkit would pass through, type: int, sample: 8}
        devices: {description: One entry per GPU, type: list, elements: dict, sample: [{index: 0, model: NVIDIA H100 80GB HBM3, uuid: GPU-..., bus_location: "00000000:16:00.0", architecture: "9.0"}]}
"""

_HEADER = re.compile(r"^\s*\[(?P<path>[^\]]+)\]\s*$")
_ASSIGN = re.compile(r"^\s*(?P<key>[A-Za-z0-9_]+)\s*=\s*(?P<value>.+?)\s*$")
_RUNTIME_PATH = re.compile(
    r"""\.containerd\.runtimes\.(?:"(?P<dq>[^"]+)"|'(?P<sq>[^']+)'|(?P<bare>[A-Za-z0-9_-]+))(?P<options>\.options)?$"""
)
_CLI_FIELD = re.compile(r"^(?P<label>[A-Za-z][A-Za-z ]+):\s+(?P<value>.*)$")
ARGUMENT_SPEC: dict[str, Any] = {
    "runtime": {"type": "str", "choices": ["containerd", "docker"], "default": "containerd"},
}
_DEVICE_KEYS = {
    "Device Index": "index",
    "Device Minor": "minor",
    "Model": "model",
    "Brand": "brand",
    "GPU UUID": "uuid",
    "Bus Location": "bus_location",
    "Architecture": "architecture",
}


def _toml_string(value: str) -> str:
    value = value.split(" #", 1)[0].strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def parse_ctr_version(text: str) -> dict[str, str | None]:
    """`ctr version`: the Client: block always, the Server: block only when the daemon answered."""
    versions: dict[str, str | None] = {"client": None, "server": None}
    section = None
    for line in text.splitlines():
        if line.strip() in ("Client:", "Server:"):
            section = line.strip()[:-1].lower()
        elif section and line.strip().startswith("Version:"):
            versions[section] = line.split(":", 1)[1].strip()
    return versions


def parse_containerd_runtimes(toml_text: str) -> dict[str, Any]:
    """Runtimes (name -> BinaryName) and the default runtime from `containerd config dump`.

    Reads the CRI runtime tables of config version 2 (`plugins."io.containerd.grpc.v1.cri"`) and 3
    (`plugins.'io.containerd.cri.v1.runtime'`), which is where `nvidia-ctk runtime configure`
    writes the `nvidia` runtime.
    """
    runtimes: dict[str, str | None] = {}
    default = None
    current: tuple[str, bool] | None = None
    in_cri_containerd = False
    for line in toml_text.splitlines():
        header = _HEADER.match(line)
        if header:
            path = header.group("path").strip()
            match = _RUNTIME_PATH.search(path)
            name = match and (match.group("dq") or match.group("sq") or match.group("bare"))
            current = (name, bool(match.group("options"))) if match and name else None
            if current:
                runtimes.setdefault(current[0], None)
            in_cri_containerd = path.endswith(".containerd") and ("cri" in path)
            continue
        assign = _ASSIGN.match(line)
        if not assign:
            continue
        key, value = assign.group("key"), _toml_string(assign.group("value"))
        if current and current[1] and key == "BinaryName":
            runtimes[current[0]] = value or None
        elif in_cri_containerd and key == "default_runtime_name":
            default = value
    return {"runtimes": runtimes, "default_runtime": default}


def parse_docker_info(text: str) -> dict[str, Any]:
    """`docker info --format '{{json .}}'`: server version, runtimes (name -> path), default runtime."""
    try:
        info = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProbeParseError(f"docker info did not print JSON: {exc}") from exc
    runtimes = {name: (spec or {}).get("path") for name, spec in (info.get("Runtimes") or {}).items()}
    return {
        "server_version": info.get("ServerVersion") or None,
        "runtimes": runtimes,
        "default_runtime": info.get("DefaultRuntime"),
    }


def parse_nvidia_container_cli_info(text: str) -> dict[str, Any]:
    """`nvidia-container-cli info`: driver and CUDA versions, then one block per device."""
    facts: dict[str, Any] = {"nvrm_version": None, "cuda_version": None, "devices": []}
    device: dict[str, Any] | None = None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            device = None
            continue
        field = _CLI_FIELD.match(line)
        if field is None:
            raise ProbeParseError(f"line {lineno}: {line!r} is not 'Label: value'")
        label, value = field.group("label").strip(), field.group("value").strip()
        if label == "NVRM version":
            facts["nvrm_version"] = value
        elif label == "CUDA version":
            facts["cuda_version"] = value
        elif label in _DEVICE_KEYS:
            if label == "Device Index" or device is None:
                device = {}
                facts["devices"].append(device)
            key = _DEVICE_KEYS[label]
            device[key] = int(value) if key in ("index", "minor") and value.isdigit() else value
    facts["device_count"] = len(facts["devices"])
    return facts


def nvidia_runtime(runtimes: dict[str, str | None]) -> bool:
    """A runtime runs the NVIDIA container runtime (its binary, or the conventional name)."""
    return any(
        (binary or "").rsplit("/", 1)[-1].startswith("nvidia-container-runtime") or (name == "nvidia" and not binary)
        for name, binary in runtimes.items()
    )


def _failed(command: str, rc: int, out: str, err: str) -> str:
    return f"{command} exited {rc}: {(err or out).strip()[-300:]}"


def main() -> None:
    probe = Probe("container_gpu_facts", ARGUMENT_SPEC)
    runtime = probe.params["runtime"]
    facts: dict[str, Any] = {
        "runtime": runtime,
        "server_version": None,
        "runtime_error": None,
        "runtimes": {},
        "default_runtime": None,
        "toolkit_error": None,
        "nvrm_version": None,
        "cuda_version": None,
        "device_count": 0,
        "devices": [],
    }
    # A missing piece is recorded in the fact (preflight says what to fix), never a module failure.
    if runtime == "containerd":
        ctr, containerd = probe.which("ctr"), probe.which("containerd")
        if ctr is None or containerd is None:
            facts["runtime_error"] = "containerd is not installed (ctr/containerd not on PATH)"
        else:
            rc, out, err = probe.run([ctr, "version"])
            facts["server_version"] = probe.parse("ctr version", parse_ctr_version, out)["server"] if rc == 0 else None
            if facts["server_version"] is None:
                facts["runtime_error"] = _failed("ctr version", rc, out, err)
            rc, out, err = probe.run([containerd, "config", "dump"])
            if rc == 0:
                facts.update(probe.parse("containerd config dump", parse_containerd_runtimes, out))
            elif facts["runtime_error"] is None:
                facts["runtime_error"] = _failed("containerd config dump", rc, out, err)
    else:
        docker = probe.which("docker")
        if docker is None:
            facts["runtime_error"] = "docker is not installed (not on PATH)"
        else:
            rc, out, err = probe.run([docker, "info", "--format", "{{json .}}"])
            if rc == 0:
                facts.update(probe.parse("docker info", parse_docker_info, out))
            else:
                facts["runtime_error"] = _failed("docker info", rc, out, err)
    cli = probe.which("nvidia-container-cli")
    if cli is None:
        facts["toolkit_error"] = "nvidia-container-cli is not installed (nvidia-container-toolkit)"
    else:
        rc, out, err = probe.run([cli, "info"])
        if rc == 0:
            facts.update(probe.parse("nvidia-container-cli info", parse_nvidia_container_cli_info, out))
        else:
            facts["toolkit_error"] = _failed("nvidia-container-cli info", rc, out, err)
    facts["nvidia_runtime"] = nvidia_runtime(facts["runtimes"])
    probe.facts(container_gpu=facts)


if __name__ == "__main__":
    main()
