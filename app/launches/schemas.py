from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from steady.server.kit.bounds import bounded

# What `steady launch` records (the script's path, the cluster's answer): listed with every launch in
# `steady status`, so a few kB, never a payload.
MAX_DETAIL_BYTES = 16 * 1024


class LaunchIn(BaseModel):
    """A batch job of agents started for a study (recorded by ``steady launch``)."""

    model_config = ConfigDict(extra="forbid")

    engine: Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[a-z0-9_\-]+$")]
    job_id: Annotated[str, Field(min_length=1, max_length=200)]
    tasks: Annotated[int, Field(ge=1, le=100_000)]
    detail: Annotated[dict[str, Any], Field(max_length=32),
                      AfterValidator(bounded("the launch's detail", MAX_DETAIL_BYTES))] = {}


class LaunchOut(BaseModel):
    id: int
    study_id: int
    engine: str
    job_id: str
    tasks: int
    detail: dict[str, Any]
    created_at: datetime
