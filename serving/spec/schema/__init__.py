"""The typed fleet spec: one pydantic tree that every other part of ExaServe deploy reads.

Defaults are the source plan's values (see ``docs/source-plan.md`` and MISSION.md); a stack file
(``Pulumi.<stack>.yaml``, ``exaserve:`` namespace) overrides them. Single-field rules live in the
fields' bounds and ``field_validator``s; rules that need arithmetic across sections (placement,
memory, heartbeats, recovery) live in :mod:`serving.checks.rules`, so that a spec which is well-formed but
infeasible still loads and the plan can show *why* it is infeasible.

The tree is this package's API; its sections live by concern in its modules: :mod:`.cluster` (the hardware and
storage), :mod:`.model` (the model, from its config.json and checkpoint), :mod:`.serving` (replicas, router,
health, runtime), :mod:`.operations` (drills, rollout, Kubernetes, sandbox), and :mod:`.fleet`, the root.
"""

from serving.spec.schema.base import GB, GIB
from serving.spec.schema.cluster import (
    ClusterSpec,
    CostSpec,
    FabricKind,
    FabricSpec,
    GpuSpec,
    HostRequirements,
    LocalCache,
    ModelStore,
    Node,
    NtpSpec,
    Pool,
    StorageSpec,
    SystemPool,
)
from serving.spec.schema.fleet import FleetSpec, json_schema
from serving.spec.schema.model import (
    ATTN_TP_ATTENTION,
    BYTES_PER_PARAM,
    MODEL_PATH_FIELDS,
    Architecture,
    CheckpointWeights,
    MlaSpec,
    ModelSpec,
    MoeSpec,
    Precision,
    SpeculativeSpec,
    architecture_from_hf_config,
    attention_parameters,
    count_parameters,
    load_hf_config,
)
from serving.spec.schema.operations import (
    DrillName,
    DrillSpec,
    KubernetesSpec,
    RolloutSpec,
    SandboxSpec,
    SandboxVersion,
)
from serving.spec.schema.serving import (
    IMAGE_DIGEST,
    IMAGE_TAG,
    HealthScoreSpec,
    LimitsSpec,
    LoadMetric,
    LogLevel,
    ParallelismSpec,
    ReleaseName,
    RuntimeSpec,
    SchedulerSpec,
    ServingSpec,
    image_repository,
    pinned_image,
)

__all__ = [
    "ATTN_TP_ATTENTION",
    "BYTES_PER_PARAM",
    "GB",
    "GIB",
    "IMAGE_DIGEST",
    "IMAGE_TAG",
    "MODEL_PATH_FIELDS",
    "Architecture",
    "CheckpointWeights",
    "ClusterSpec",
    "CostSpec",
    "DrillName",
    "DrillSpec",
    "FabricKind",
    "FabricSpec",
    "FleetSpec",
    "GpuSpec",
    "HealthScoreSpec",
    "HostRequirements",
    "KubernetesSpec",
    "LimitsSpec",
    "LoadMetric",
    "LocalCache",
    "LogLevel",
    "MlaSpec",
    "ModelSpec",
    "ModelStore",
    "MoeSpec",
    "Node",
    "NtpSpec",
    "ParallelismSpec",
    "Pool",
    "Precision",
    "ReleaseName",
    "RolloutSpec",
    "RuntimeSpec",
    "SandboxSpec",
    "SandboxVersion",
    "SchedulerSpec",
    "ServingSpec",
    "SpeculativeSpec",
    "StorageSpec",
    "SystemPool",
    "architecture_from_hf_config",
    "attention_parameters",
    "count_parameters",
    "image_repository",
    "json_schema",
    "load_hf_config",
    "pinned_image",
]
