"""Model storage: the shared model store (PV + PVC, ReadOnlyMany; NFS or a CSI driver per spec) and a node-local
cache warmer, so that a restarted replica loads its weights from local disk (source: recovery ≤ 30 s).

The warmer is a DaemonSet on the serving nodes: an init container copies the model from the store into the
node's cache directory (into a staging directory, renamed when complete, so a half-copied model is never
used; the completion marker records the checkpoint's safetensors index, and a changed index re-warms), then a small container keeps the pod running so the DaemonSet reports the node as warmed. It uses the
serving image, which every serving node pulls anyway. Nothing waits for the warmer as a whole: each serving pod
waits for the marker in its own node's cache (:func:`serving.render.k8s.container.cache_init_container`), and
`pulumi up` does not wait for the DaemonSet (every node copying the model from one store takes far longer than
Pulumi's wait, docs/infra.md).
"""

from __future__ import annotations

import shlex
from typing import Any

from serving.render.k8s.common import (
    LABEL_NAME,
    K8sObject,
    await_annotations,
    gigabytes,
    gpu_node_affinity,
    image,
    labels,
    metadata,
    pull_secrets,
    serving_toleration,
)
from serving.render.sglang import model_dir
from serving.spec.checkpoint import INDEX_FILE
from serving.spec.schema import FleetSpec

COMPONENT = "storage"
CLAIM = "model-store"
WARMER = "model-cache-warmer"
COMPLETE_MARKER = ".exaserve-complete"


def volume_name(spec: FleetSpec) -> str:
    """The PersistentVolume is cluster-scoped: prefix it with the namespace to keep stacks apart."""
    return f"{spec.kubernetes.namespace}-model-store"


def _volume_source(spec: FleetSpec) -> dict[str, Any]:
    store = spec.storage.model_store
    if store.kind == "nfs":
        return {"nfs": {"server": store.server, "path": store.export_path, "readOnly": True}}
    return {"csi": {"driver": store.csi_driver, "volumeHandle": store.volume_handle, "readOnly": True}}


def model_dirs(spec: FleetSpec) -> tuple[str, str]:
    """(model directory on the shared store, model directory in the node-local cache): the same
    :func:`~serving.render.sglang.model_dir` join the server's ``--model-path`` uses, so ``org/m/`` and
    ``org/m`` stage into and serve from one directory."""
    return model_dir(spec, spec.storage.model_store.mount_path), model_dir(spec)


def cache_dirs(spec: FleetSpec) -> list[tuple[str, str]]:
    """(store directory, node-cache directory) of every model a server loads: the model (:func:`model_dirs`) and,
    with an EAGLE/EAGLE3 draft (``model.speculative.draft_path``), the draft's, which ``--speculative-draft-model-path``
    names in the cache."""
    out = [model_dirs(spec)]
    draft = spec.model.speculative.draft_path if spec.model.speculative is not None else None
    if draft is not None:
        out.append((model_dir(spec, spec.storage.model_store.mount_path, draft), model_dir(spec, path=draft)))
    return out


def warm_script(spec: FleetSpec) -> str:
    """Copy each model (:func:`cache_dirs`) into the cache once; a marker file says the copy is complete and records
    the checkpoint's safetensors index it copied (:data:`~serving.spec.checkpoint.INDEX_FILE`, the bytes and shards
    the planner counts from). A cache whose recorded index differs from the store's (the checkpoint was replaced
    under the same path) is copied again; a checkpoint without an index is warm once the marker exists."""
    marker, index = shlex.quote(COMPLETE_MARKER), shlex.quote(INDEX_FILE)
    warm = (
        f'warm() {{ src=$1; dst=$2; if [ -f "$dst"/{marker} ] && {{ [ ! -f "$src"/{index} ] || '
        f'cmp -s "$src"/{index} "$dst"/{marker}; }}; then echo cache already warm: "$dst"; return 0; fi; '
        'rm -rf "$dst".partial; mkdir -p "$dst".partial; cp -R "$src"/. "$dst".partial/; '
        f'if [ -f "$src"/{index} ]; then cp "$src"/{index} "$dst".partial/{marker}; '
        f'else touch "$dst".partial/{marker}; fi; rm -rf "$dst"; mv "$dst".partial "$dst"; echo cache warmed: "$dst"; }}'
    )
    calls = "; ".join(f"warm {shlex.quote(src)} {shlex.quote(dst)}" for src, dst in cache_dirs(spec))
    return f"set -eu; {warm}; {calls}"


def render(spec: FleetSpec) -> list[K8sObject]:
    ns = spec.kubernetes.namespace
    store, cache = spec.storage.model_store, spec.storage.local_cache
    lab = labels(COMPONENT, CLAIM)
    warmer_labels = labels(COMPONENT, WARMER)
    volume: K8sObject = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": metadata(volume_name(spec), None, lab),
        "spec": {
            "capacity": {"storage": gigabytes(store.size_gb)},
            "accessModes": ["ReadOnlyMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "claimRef": {"namespace": ns, "name": CLAIM},
            **_volume_source(spec),
        },
    }
    if store.kind == "nfs":
        volume["spec"]["mountOptions"] = ["ro", "nconnect=8", "hard"]
    claim: K8sObject = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(CLAIM, ns, lab),
        "spec": {
            "accessModes": ["ReadOnlyMany"],
            "storageClassName": "",
            "volumeName": volume_name(spec),
            "resources": {"requests": {"storage": gigabytes(store.size_gb)}},
        },
    }
    security = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    warmer: K8sObject = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": metadata(WARMER, ns, warmer_labels, await_annotations(skip=True)),
        "spec": {
            "selector": {"matchLabels": {LABEL_NAME: WARMER}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%"}},
            "template": {
                "metadata": {"labels": warmer_labels},
                "spec": {
                    "affinity": gpu_node_affinity(spec),
                    "tolerations": [serving_toleration()],
                    "enableServiceLinks": False,
                    "automountServiceAccountToken": False,  # it copies files: no API call, no token
                    **pull_secrets(spec),
                    "initContainers": [
                        {
                            "name": "warm",
                            "image": image(spec, spec.serving.image),
                            "command": ["/bin/sh", "-c", warm_script(spec)],
                            "securityContext": security,
                            "resources": {
                                "requests": {"cpu": "1", "memory": "1Gi"},
                                "limits": {"memory": "4Gi"},
                            },
                            "volumeMounts": [
                                {"name": "model-store", "mountPath": store.mount_path, "readOnly": True},
                                {"name": "cache", "mountPath": cache.path},
                            ],
                        }
                    ],
                    "containers": [
                        {
                            "name": "hold",
                            "image": image(spec, spec.serving.image),
                            "command": ["/bin/sleep", "infinity"],
                            "securityContext": security,
                            "resources": {
                                "requests": {"cpu": "10m", "memory": "16Mi"},
                                "limits": {"memory": "64Mi"},
                            },
                        }
                    ],
                    "volumes": [
                        {"name": "model-store", "persistentVolumeClaim": {"claimName": CLAIM, "readOnly": True}},
                        {"name": "cache", "hostPath": {"path": cache.path, "type": "DirectoryOrCreate"}},
                    ],
                },
            },
        },
    }
    return [volume, claim, warmer]
