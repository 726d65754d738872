"""Model storage: the shared store and the node-local cache warmer."""

from __future__ import annotations

import pulumi

from serving.pulumi.components.base import KubernetesComponent
from serving.render.k8s import storage
from serving.spec.schema import FleetSpec


class ModelStorage(KubernetesComponent):
    """PV + PVC (ReadOnlyMany, NFS or CSI) for the model store; a DaemonSet warming each node's cache."""

    def __init__(self, name: str, spec: FleetSpec, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("exaserve:storage:ModelStorage", name, storage.render(spec), opts)
        self.claim: str = storage.CLAIM
        self.cache_path: str = spec.storage.local_cache.path
        self.register_outputs({"claim": self.claim, "cache_path": self.cache_path})
