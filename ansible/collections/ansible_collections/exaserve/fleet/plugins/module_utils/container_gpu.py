"""Probe reader: the container runtime and the NVIDIA container toolkit (parsers and the reader).

Shared by the single-tool module ``container_gpu_facts`` and ``preflight_facts``. Runs on the managed node.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ansible_collections.exaserve.fleet.plugins.module_utils.probe import Probe, ProbeParseError

_HEADER = re.compile(r"^\s*\[(?P<path>[^\]]+)\]\s*$")
_ASSIGN = re.compile(r"^\s*(?P<key>[A-Za-z0-9_]+)\s*=\s*(?P<value>.+?)\s*$")
_RUNTIME_PATH = re.compile(
    r"""\.containerd\.runtimes\.(?:"(?P<dq>[^"]+)"|'(?P<sq>[^']+)'|(?P<bare>[A-Za-z0-9_-]+))(?P<options>\.options)?$"""
)
_CLI_FIELD = re.compile(r"^(?P<label>[A-Za-z][A-Za-z ]+):\s+(?P<value>.*)$")
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


def read_container_gpu(probe: Probe, runtime: str = "containerd") -> dict[str, Any]:
    """The `container_gpu` fact; a missing or silent piece is recorded in it, never a failure."""
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
    return {"container_gpu": facts}
