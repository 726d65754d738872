"""The root of the fleet spec: every section, and the rules across sections it checks when it loads (every version
it runs is a release, simulated too in a sandbox; speculative decoding and attention DP only where the planner
models them), and the JSON Schema editors read."""

from __future__ import annotations

from typing import Any, Self

from pydantic import Field, model_validator

from serving.spec.schema.base import SpecModel
from serving.spec.schema.cluster import ClusterSpec, StorageSpec
from serving.spec.schema.model import ATTN_TP_ATTENTION, ModelSpec
from serving.spec.schema.operations import DrillSpec, KubernetesSpec, RolloutSpec, SandboxSpec
from serving.spec.schema.serving import (
    HealthScoreSpec,
    LimitsSpec,
    ParallelismSpec,
    RuntimeSpec,
    SchedulerSpec,
    ServingSpec,
)


class FleetSpec(SpecModel):
    """The whole fleet: the one source of truth."""

    cluster: ClusterSpec
    storage: StorageSpec = Field(default_factory=StorageSpec)
    model: ModelSpec = Field(default_factory=ModelSpec)
    parallelism: ParallelismSpec = Field(default_factory=ParallelismSpec)
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    serving: ServingSpec = Field(default_factory=ServingSpec)
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec)
    health: HealthScoreSpec = Field(default_factory=HealthScoreSpec)
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    drills: DrillSpec = Field(default_factory=DrillSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    kubernetes: KubernetesSpec = Field(default_factory=KubernetesSpec)
    sandbox: SandboxSpec | None = Field(default=None)

    @model_validator(mode="after")
    def _versions_known(self) -> Self:
        """Every version a group runs is a release; in a sandbox, also a simulated release."""
        unknown = sorted(set(self.rollout.group_versions.values()) - set(self.serving.releases))
        if unknown:
            raise ValueError(
                f"rollout.group_versions uses {unknown}, not in serving.releases ({sorted(self.serving.releases)}); "
                "add their images there"
            )
        if self.sandbox is not None:
            used = {self.serving.version, *self.rollout.group_versions.values()}
            missing = sorted(used - set(self.sandbox.versions))
            if missing:
                raise ValueError(
                    f"version(s) {missing} are not defined in sandbox.versions "
                    f"({sorted(self.sandbox.versions)}); add them there"
                )
        return self

    @model_validator(mode="after")
    def _speculative_modelled(self) -> Self:
        """NEXTN's draft is the checkpoint's multi-token-prediction layers: config.json must declare them; the draft
        is planned without pipeline parallelism."""
        spec = self.model.speculative
        if spec is not None and self.parallelism.pp > 1:
            raise ValueError(
                f"model.speculative with parallelism.pp = {self.parallelism.pp}: the planner models a draft beside "
                "the target on one pipeline stage only; set parallelism.pp to 1 or drop model.speculative"
            )
        if spec is not None and spec.algorithm == "NEXTN" and self.model.architecture.nextn_layers == 0:
            raise ValueError(
                f"model.speculative.algorithm NEXTN: {self.model.name}'s config.json declares no "
                "num_nextn_predict_layers (MTP layers) to draft with; use EAGLE/EAGLE3 with a draft model"
            )
        return self

    @model_validator(mode="after")
    def _attn_dp_modelled(self) -> Self:
        """Attention DP is planned for the models whose attention SGLang splits over the attention-TP group
        (:data:`ATTN_TP_ATTENTION`: DeepSeek, Qwen2/3-MoE); Llama or Mixtral build theirs over the whole TP group
        (``models/llama.py:181``, ``models/mixtral.py:137``), which the planner does not model."""
        n, arch = self.parallelism.attn_dp, self.model.architecture
        if n == 1:
            return self
        if not arch.attention_over_attn_tp:
            known = ", ".join(f"{c} ({w})" for c, w in ATTN_TP_ATTENTION.items())
            got = (
                f"model class {arch.model_class}, whose attention SGLang splits over the whole TP group"
                if arch.model_class
                else "no model class (give model.hf_config: config.json's architectures names it)"
            )
            raise ValueError(
                f"parallelism.attn_dp = {n} on {self.model.name} ({got}): the planner models attention DP only for "
                f"models whose attention SGLang splits over the attention-TP group: {known}; "
                "set parallelism.attn_dp to 1"
            )
        if arch.mla is not None and arch.attention_parameters is None:
            raise ValueError(
                f"parallelism.attn_dp = {n}: model.architecture.attention_parameters is unknown for this MLA model "
                "(its low-rank shapes); give model.hf_config (config.json) so it is counted"
            )
        return self

    @model_validator(mode="after")
    def _ep_on_moe(self) -> Self:
        """EP spreads experts: SGLang builds its EP groups for any model, but a dense one has nothing to spread and
        the planner counts no such layout."""
        if self.parallelism.ep > 1 and self.model.architecture.moe is None:
            raise ValueError(
                f"parallelism.ep = {self.parallelism.ep} on {self.model.name}, which has no experts (a dense model); "
                "set parallelism.ep to 1"
            )
        return self

    def group_version(self, group: int) -> str:
        return self.rollout.group_versions.get(group, self.serving.version)

    def group_image(self, group: int) -> str:
        return self.serving.releases[self.group_version(group)]

    def breaker_dwell_s(self) -> float:
        """``runtime.breaker_dwell_s``, or its default: twice serving.failure_threshold × serving.heartbeat_interval_s
        (the controller's rule and the drills' detection target both read it here)."""
        return self.runtime.breaker_dwell_s or 2 * self.serving.failure_threshold * self.serving.heartbeat_interval_s


def json_schema() -> dict[str, Any]:
    """JSON Schema of a stack's ``exaserve:`` config, for editors."""
    return FleetSpec.model_json_schema(mode="validation")
