"""Runs as the API shows them, and runs uploaded into external studies."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from steady.server.kit.bounds import bounded
from steady.server.kit.wire import WireFloat, WireModel
from steady.worker.contract.protocol import Determinism, FloatDtype, MetricKey


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RunStory(WireModel):
    """What a run executed, as its study and arm define it: with the run's ``argv`` (what the worker
    ran) and ``stderr_tail`` (the end of what it printed), a finished run can be read without its study."""

    workload: str | None = Field(None, description="the built-in workload's name")
    entrypoint: str | None = None
    command: list[str] | None = Field(None, description="the command as the study gives it, with its placeholders")
    params: dict[str, Any] = {}
    config_file: dict[str, Any] | None = Field(None, description="the arm's config file: name and content")
    code_sha256: str | None = Field(None, description="the digest of the code archive the run executed")
    code_git_commit: str | None = None
    code_dirty: bool | None = None


class RunOut(WireModel):
    id: int
    study_id: int
    seed: int
    repeat: int
    determinism: str
    stack: str
    framework: str
    status: str
    attempt: int
    max_attempts: int
    worker_id: int | None
    engine: dict[str, Any] | None = None  # protocol.EngineJob of the batch job that ran / runs it
    lease_expires_at: datetime | None
    cancel_requested: bool
    progress_step: int | None
    fingerprint: dict[str, Any]
    digests: dict[str, Any]
    determinism_applied: dict[str, Any]
    timings: dict[str, Any]
    final_metrics: dict[str, WireFloat]  # the last logged value of each metric
    failure_kind: str | None
    error: str | None
    stderr_tail: str | None = Field(description="the end of the run's stdout and stderr (every finished run)")
    argv: list[str] | None = Field(None, description="a command workload's argv as it ran (placeholders filled)")
    story: RunStory | None = Field(None, description="what the run executed (GET /api/v1/runs/{id} only)")
    metric_conflicts: dict[str, Any] | None = Field(
        None, description="values the run logged twice, differently, for one (key, step): {count, first: "
        "[{key, step, kept: {value, source}, dropped: {value, source}}]}; the kept value is the first logged")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    excluded_at: datetime | None = Field(None, description="set when a person excluded the run: shown, not judged")
    excluded_by: str | None = None
    excluded_reason: str | None = None
    metric_keys: list[str] | None = None


class SeriesIn(_Spec):
    steps: list[int]
    values: list[WireFloat]  # NaN and ±Inf as "NaN", "Infinity", "-Infinity"; null is not a value
    dtype: FloatDtype | None = None  # the type the values were logged in; ULPs are counted in it

    @model_validator(mode="after")
    def _same_length(self) -> SeriesIn:
        if len(self.steps) != len(self.values):
            raise ValueError(f"steps has {len(self.steps)} items but values has {len(self.values)}")
        repeated = _repeated_step(self.steps, self.values)
        if repeated is not None:
            step, first, second = repeated
            raise ValueError(f"step {step} is given twice, with {first!r} and then {second!r}: one value per step "
                             "(a second, different value is never silently dropped; the same value twice is fine)")
        return self


def _repeated_step(steps: list[int], values: list[float]) -> tuple[int, float, float] | None:
    """The first step given twice with two different values (NaN is NaN), as (step, first, second)."""
    if all(a < b for a, b in zip(steps, steps[1:])):
        return None
    first: dict[int, float] = {}
    for step, value in zip(steps, values):
        kept = first.setdefault(step, value)
        if not (kept == value or (math.isnan(kept) and math.isnan(value))):
            return step, kept, value
    return None


# An uploaded run's free-form parts are listed with every report of its study: a fingerprint's and a run's
# digests' size, as an agent's are.
MAX_EXTERNAL_STACK_BYTES = 16 * 1024
MAX_EXTERNAL_DIGESTS_BYTES = 64 * 1024


class ExternalRunIn(_Spec):
    """A finished run produced elsewhere, uploaded into an external study."""

    seed: Annotated[int, Field(ge=0, le=2**63 - 1)]
    repeat: Annotated[int, Field(ge=0)] = 0
    determinism: Determinism = Determinism.seeded
    stack: Annotated[dict[str, Any], AfterValidator(bounded("stack", MAX_EXTERNAL_STACK_BYTES))] = Field(
        {}, description=f"the stack fingerprint; its 'name' (or a hash) names the group; at most "
        f"{MAX_EXTERNAL_STACK_BYTES} bytes as JSON")
    metrics: Annotated[dict[MetricKey, SeriesIn], Field(min_length=1, max_length=256)]
    digests: Annotated[dict[str, Any], AfterValidator(bounded("digests", MAX_EXTERNAL_DIGESTS_BYTES))] = {}
    step_times: list[WireFloat] | None = None
    framework: Annotated[str, Field(max_length=32)] = "external"


class SeriesOut(WireModel):
    run_id: int
    key: str
    n: int
    steps: list[int] | None = None
    values: list[WireFloat] | None = None
    steps_b64: str | None = None
    values_b64: str | None = None


class ExcludeIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, Field(min_length=1, max_length=2000, description="why the run is left out (recorded)")]
