"""Request and response bodies of the MLflow REST API 2.0 subset Steady implements.

Field names follow MLflow's protobuf JSON (``mlflow/protos/service.proto``); int64 fields may
arrive as JSON strings (proto3 JSON), doubles as numbers or as ``"NaN"`` / ``"Infinity"`` /
``"-Infinity"``. Fields the client sends that Steady has no use for are accepted and ignored.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from steady.worker.contract.protocol import MetricKey

MLFLOW_VERSION = "3.17.2"  # the client version the support table (docs/mlflow.md) was checked against
MAX_BATCH_METRICS = 1000  # MLflow's own limits for log-batch
MAX_BATCH_PARAMS = 100
MAX_BATCH_TAGS = 100
MAX_PARAM_LENGTH = 6000
MAX_TAG_LENGTH = 8000
# Per run, over all calls (MLflow sets none): without them 60 log-batch calls of 100 × 8 KB tags make
# one run's record 48 MB, rewritten on every write. An MLflow autolog run stays far below.
MAX_RUN_PARAMS = 1000
MAX_RUN_TAGS = 1000
MAX_RUN_PARAMS_TAGS_BYTES = 1024 * 1024  # keys and values, UTF-8, params and tags together

_SPECIAL = {"nan": math.nan, "infinity": math.inf, "-infinity": -math.inf, "inf": math.inf, "-inf": -math.inf}


def _double(value: Any) -> Any:
    if isinstance(value, str) and value.strip().lower() in _SPECIAL:
        return _SPECIAL[value.strip().lower()]
    return value


Double = Annotated[float, BeforeValidator(_double)]
RunId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[0-9]+$")]
ParamValue = Annotated[str, Field(max_length=MAX_PARAM_LENGTH)]
TagValue = Annotated[str, Field(max_length=MAX_TAG_LENGTH)]
ParamKey = Annotated[str, Field(min_length=1, max_length=250)]


class _In(BaseModel):
    model_config = ConfigDict(extra="ignore")

    def run(self) -> int:
        return int(getattr(self, "run_id", None) or getattr(self, "run_uuid", None) or 0)


class MetricIn(_In):
    key: MetricKey
    value: Double
    timestamp: int = 0
    step: Annotated[int, Field(ge=-(2**63), le=2**63 - 1)] = 0


class ParamIn(_In):
    key: ParamKey
    value: ParamValue


class TagIn(_In):
    key: ParamKey
    value: TagValue


class LogMetricIn(MetricIn):
    run_id: RunId | None = None
    run_uuid: RunId | None = None


class LogParamIn(ParamIn):
    run_id: RunId | None = None
    run_uuid: RunId | None = None


class SetTagIn(TagIn):
    run_id: RunId | None = None
    run_uuid: RunId | None = None


class LogBatchIn(_In):
    run_id: RunId
    metrics: Annotated[list[MetricIn], Field(max_length=MAX_BATCH_METRICS)] = []
    params: Annotated[list[ParamIn], Field(max_length=MAX_BATCH_PARAMS)] = []
    tags: Annotated[list[TagIn], Field(max_length=MAX_BATCH_TAGS)] = []


class CreateRunIn(_In):
    experiment_id: Annotated[str, Field(pattern=r"^[0-9]+$", max_length=20)]
    run_name: Annotated[str, Field(max_length=250)] | None = None
    start_time: int | None = None
    tags: Annotated[list[TagIn], Field(max_length=MAX_BATCH_TAGS)] = []


class UpdateRunIn(_In):
    run_id: RunId | None = None
    run_uuid: RunId | None = None
    status: Annotated[str, Field(pattern=r"^(RUNNING|SCHEDULED|FINISHED|FAILED|KILLED)$")] | None = None
    end_time: int | None = None
    run_name: Annotated[str, Field(max_length=250)] | None = None


class CreateExperimentIn(_In):
    name: Annotated[str, Field(min_length=1, max_length=200)]
    artifact_location: str | None = None
    tags: list[TagIn] = []


class Empty(BaseModel):
    """MLflow answers a successful write with an empty JSON object."""


class MlflowErrorOut(BaseModel):
    error_code: str
    message: str
