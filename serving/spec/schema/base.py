"""What every section of the fleet spec shares: the base model (unknown fields refused, values frozen) and the byte
units the spec and the planner count in."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

GIB = 1024**3
GB = 10**9


class SpecModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
