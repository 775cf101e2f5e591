"""Study specs as users write them (JSON over REST, YAML in the CLI), and API responses."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.alerts.schemas import AlertRuleSpec, check_spec_alerts
from worker.protocol import (
    FloatDtype,
    BUILTIN_WORKLOADS,
    MAX_NAME_LENGTH,
    Determinism,
    Framework,
    Label,
    MetricKey,
)

MAX_PARAMS_BYTES = 64 * 1024
MAX_STAGES = 20  # adaptive seeds: looks of the group-sequential design  # workload.params travel with every lease of the study's runs

Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH)]
StackName = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.:+\-]+$")]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WorkloadSpec(_Spec):
    framework: Framework
    name: str | None = Field(None, description="a built-in workload: " + ", ".join(sorted(BUILTIN_WORKLOADS)))
    entrypoint: Annotated[str, Field(min_length=1, max_length=500)] | None = Field(
        None, description="user code: 'package.module:function' or 'path/to/script.py'"
    )
    params: dict[str, Any] = Field({}, description=f"passed to the workload; at most {MAX_PARAMS_BYTES} bytes as JSON")

    @model_validator(mode="after")
    def _check(self) -> WorkloadSpec:
        size = len(json.dumps(self.params, separators=(",", ":"), default=str))
        if size > MAX_PARAMS_BYTES:
            raise ValueError(f"params take {size} bytes as JSON; the limit is {MAX_PARAMS_BYTES}: "
                             "ship large inputs as files with your code, not as parameters")
        if (self.name is None) == (self.entrypoint is None):
            raise ValueError("give exactly one of 'name' (a built-in workload) or 'entrypoint' (your code)")
        if self.name is not None:
            framework = BUILTIN_WORKLOADS.get(self.name)
            if framework is None:
                raise ValueError(
                    f"unknown built-in workload {self.name!r}; known: {', '.join(sorted(BUILTIN_WORKLOADS))}"
                )
            if framework != self.framework.value:
                raise ValueError(f"workload {self.name!r} runs on {framework}, not {self.framework.value}")
        if self.entrypoint is not None and ":" not in self.entrypoint and not self.entrypoint.endswith(".py"):
            raise ValueError("entrypoint must be 'package.module:function' or a path ending in .py")
        return self


class StackSpec(_Spec):
    name: StackName
    labels: Annotated[list[Label], Field(max_length=64)] = Field(
        [], description="a worker runs this stack's runs only if it has all these labels"
    )


class MetricSpec(_Spec):
    name: MetricKey
    atol: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
    rtol: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
    max_std: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = Field(
        None, description="seed stability: the final value's standard deviation across seeds must stay below this"
    )
    margin: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = Field(
        None, description="stack portability: equivalence margin on the final value (absolute)"
    )


class BudgetSpec(_Spec):
    """Adaptive seeds: while a seed-stability verdict is inconclusive, add seeds in stages."""

    max_seeds: Annotated[int, Field(ge=2, le=10_000)] = Field(
        ..., description="the most seeds the study may use in all, the spec's seeds included"
    )
    max_runs: Annotated[int, Field(ge=1)] | None = Field(
        None, description="the most runs the study may use in all (each seed runs repeats × determinism × stacks)"
    )
    stage_seeds: Annotated[int, Field(ge=1, le=10_000)] | None = Field(
        None, description="seeds added per stage (default: as many as the spec names)"
    )
    spending: Literal["pocock", "obrien_fleming"] = Field(
        "pocock",
        description="alpha-spending function of the group-sequential design (Lan–DeMets Pocock or "
        "O'Brien–Fleming type): each claim stays wrong ≤ 5% over all stages together",
    )


class StudySpec(_Spec):
    """What to run and how to judge it. The matrix seeds × repeats × determinism × stacks becomes runs."""

    name: Name
    kind: Literal["managed", "external"] = "managed"
    description: Annotated[str, Field(max_length=10_000)] = ""
    workload: WorkloadSpec | None = None
    seeds: Annotated[list[Annotated[int, Field(ge=0, le=2**63 - 1)]], Field(max_length=10_000)] = []
    repeats: Annotated[int, Field(ge=1, le=1000)] = 1
    determinism: Annotated[list[Determinism], Field(min_length=1)] = [Determinism.seeded]
    stacks: Annotated[list[StackSpec], Field(min_length=1, max_length=100)] = [StackSpec(name="default")]
    reference_stack: StackName | None = None
    metrics: Annotated[list[MetricSpec], Field(min_length=1, max_length=100)] = [MetricSpec(name="loss")]
    threads: Annotated[int, Field(ge=1, le=1024)] = 2
    time_limit_s: Annotated[float, Field(gt=0, le=7 * 86400)] = 1800.0
    max_attempts: Annotated[int, Field(ge=1, le=100)] = 3
    coverage: Annotated[float, Field(gt=0, lt=1)] = 0.9
    confidence: Annotated[float, Field(gt=0, lt=1)] = 0.95
    cost_budget: Annotated[float, Field(gt=1, allow_inf_nan=False)] | None = Field(
        None,
        description="cost of determinism: the largest acceptable step-time ratio of a more deterministic level "
        "over a less deterministic one (e.g. 1.5: strict may take at most 1.5× the step time of seeded). Each "
        "ratio is judged 'pass' (CI upper end ≤ budget), 'fail' (CI lower end > budget) or 'inconclusive'; "
        "false 'fail' and false 'pass' ≤ 2.5% each at 95% confidence. Without it only ratio and CI are reported",
    )
    suite: Name | None = None
    budget: BudgetSpec | None = Field(
        None,
        description="adaptive seeds: when a seed-stability verdict is inconclusive, the server adds seeds in "
        "stages (group-sequential, alpha spending) until it is conclusive or the budget is spent",
    )
    alerts: Annotated[list[AlertRuleSpec], Field(max_length=100)] = Field(
        [], description="alert rules; scoped to the suite when the study has one, else to the study"
    )

    @field_validator("metrics", mode="before")
    @classmethod
    def _metric_names(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [{"name": v} if isinstance(v, str) else v for v in value]
        return value

    @field_validator("seeds")
    @classmethod
    def _unique_seeds(cls, value: list[int]) -> list[int]:
        if len(set(value)) != len(value):
            raise ValueError("seeds must be distinct")
        return value

    @field_validator("determinism")
    @classmethod
    def _unique_levels(cls, value: list[Determinism]) -> list[Determinism]:
        if len(set(value)) != len(value):
            raise ValueError("determinism levels must be distinct")
        return value

    @model_validator(mode="after")
    def _check(self) -> StudySpec:
        names = [s.name for s in self.stacks]
        if len(set(names)) != len(names):
            raise ValueError("stack names must be distinct")
        if self.reference_stack is not None and self.reference_stack not in names:
            raise ValueError(f"reference_stack {self.reference_stack!r} is not one of the stacks {names}")
        metric_names = [m.name for m in self.metrics]
        if len(set(metric_names)) != len(metric_names):
            raise ValueError("metric names must be distinct")
        check_spec_alerts(self.alerts, metric_names, self.suite)
        if self.kind == "managed":
            if self.workload is None:
                raise ValueError("a managed study needs a 'workload'")
            if not self.seeds:
                raise ValueError("'seeds' must name at least one seed")
        if self.budget is not None:
            self._check_budget(self.budget)
        return self

    def _check_budget(self, budget: BudgetSpec) -> None:
        if self.kind != "managed":
            raise ValueError("budget: only a managed study can add seeds (an external study's runs are uploaded)")
        if not any(m.max_std is not None for m in self.metrics):
            raise ValueError("budget: no metric has a 'max_std', so no seed-stability verdict can become conclusive")
        if budget.max_seeds < len(self.seeds):
            raise ValueError(f"budget: max_seeds {budget.max_seeds} is below the {len(self.seeds)} seeds of the spec")
        if budget.max_runs is not None and budget.max_runs < self.run_count:
            raise ValueError(f"budget: max_runs {budget.max_runs} is below the {self.run_count} runs of the spec")
        step = budget.stage_seeds or len(self.seeds)
        stages = 1 + -(-(self.max_seeds - len(self.seeds)) // step)
        if stages > MAX_STAGES:
            raise ValueError(f"budget: {stages} stages of {step} seeds; at most {MAX_STAGES} stages — "
                             "raise stage_seeds or lower max_seeds")

    @property
    def runs_per_seed(self) -> int:
        return self.repeats * len(self.determinism) * len(self.stacks)

    @property
    def max_seeds(self) -> int:
        """The most seeds the budget allows (the spec's seeds without a budget)."""
        if self.budget is None:
            return len(self.seeds)
        n = self.budget.max_seeds
        if self.budget.max_runs is not None:
            n = min(n, self.budget.max_runs // self.runs_per_seed)
        return max(n, len(self.seeds))

    @property
    def run_count(self) -> int:
        return len(self.seeds) * self.repeats * len(self.determinism) * len(self.stacks)


class Progress(BaseModel):
    total: int = 0
    queued: int = 0
    running: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0


class StageInfo(BaseModel):
    """Where an adaptive study stands: its current stage, of at most ``last_stage``."""

    stage: int
    last_stage: int
    seeds: int = Field(description="seeds of all stages so far")
    max_seeds: int


class StudySummary(BaseModel):
    """A study in a list: everything but its spec (GET /studies/{id} has the spec)."""

    id: int
    name: str
    kind: str
    status: str
    suite: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    progress: Progress
    owner_token_id: int | None = Field(None, description="the token that created it; it and admins may change it")
    stage: StageInfo | None = Field(None, description="adaptive seeds (a study with a budget): the current stage")


class StudyOut(StudySummary):
    spec: dict[str, Any]


class StudyPage(BaseModel):
    items: list[StudySummary]
    total: int
    limit: int
    offset: int


class RunOut(BaseModel):
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
    final_metrics: dict[str, Any]
    failure_kind: str | None
    error: str | None
    stderr_tail: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    excluded_at: datetime | None = Field(None, description="set when a person excluded the run: shown, not judged")
    excluded_by: str | None = None
    excluded_reason: str | None = None
    metric_keys: list[str] | None = None


class RunPage(BaseModel):
    items: list[RunOut]
    total: int
    limit: int
    offset: int


class SeriesIn(_Spec):
    steps: list[int]
    values: list[float]
    dtype: FloatDtype | None = None  # the type the values were logged in; ULPs are counted in it

    @model_validator(mode="after")
    def _same_length(self) -> SeriesIn:
        if len(self.steps) != len(self.values):
            raise ValueError(f"steps has {len(self.steps)} items but values has {len(self.values)}")
        return self


class ExternalRunIn(_Spec):
    """A finished run produced elsewhere, uploaded into an external study."""

    seed: Annotated[int, Field(ge=0, le=2**63 - 1)]
    repeat: Annotated[int, Field(ge=0)] = 0
    determinism: Determinism = Determinism.seeded
    stack: dict[str, Any] = Field({}, description="the stack fingerprint; its 'name' (or a hash) names the group")
    metrics: Annotated[dict[MetricKey, SeriesIn], Field(min_length=1, max_length=256)]
    digests: dict[str, Any] = {}
    step_times: list[float] | None = None
    framework: Annotated[str, Field(max_length=32)] = "external"
