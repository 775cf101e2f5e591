"""Study specs as users write them (JSON over REST, YAML in the CLI), and API responses."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, Literal, NoReturn

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from steady.server.studies.alert_specs import AlertRuleSpec, SuiteName, check_spec_alerts
from steady.server.studies.fleet_spec import FleetSpec
from steady.server.studies.spec_parts import ArmSpec, CodeRef, SourcesSpec, StackName, StackSpec, WorkloadSpec, _Spec
from steady.server.kit.wire import WireModel
from steady.worker.contract.distributed import torchrun_launch
from steady.worker.contract.protocol import MAX_NAME_LENGTH, Determinism, MetricKey, ResumeSpec
from steady.worker.contract.resume import FRAMEWORKS as RESUME_FRAMEWORKS

MAX_STAGES = 20  # adaptive seeds: looks of the group-sequential design

Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH)]


def _refuse(loc: tuple[str, ...], value: Any, message: str) -> NoReturn:
    """A cross-field refusal naming its field: a model validator's ValueError would name only the body,
    a ValidationError raised in it keeps its own ``loc`` (under ``body`` in the 422)."""
    error = PydanticCustomError("value_error", message.replace("{", "{{").replace("}", "}}"))
    raise ValidationError.from_exception_data("StudySpec", [InitErrorDetails(type=error, loc=loc, input=value)])


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
    resolution: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = Field(
        None, description="the metric's resolution, e.g. 1/N for accuracy over N examples: seeds that all end on the "
        "same value are judged at it (a tie coarser than max_std needs is no evidence of stability)"
    )


class ConvergenceReferenceSpec(_Spec):
    """A reference convergence point: published numbers (an MLPerf RCP: olympic mean and standard
    deviation of the steps to target, and the number of runs after trimming), or another study
    whose completed runs form it."""

    mean: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    std: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    n: Annotated[int, Field(ge=1, le=100_000)] | None = None
    study: Annotated[int, Field(ge=1)] | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> ConvergenceReferenceSpec:
        numbers = [self.mean, self.std, self.n]
        if self.study is not None:
            if any(x is not None for x in numbers):
                raise ValueError("give either {mean, std, n} or {study}, not both")
        elif any(x is None for x in numbers):
            raise ValueError("give {mean, std, n} (a published reference point) or {study} (a study's runs)")
        return self


class ConvergenceSpec(_Spec):
    """Convergence against a reference, as MLPerf judges submissions (reference convergence points):
    steps to reach ``target`` per run, olympic means, a one-sided pooled t-test at ``alpha``."""

    metric: MetricKey
    target: Annotated[float, Field(allow_inf_nan=False)]
    direction: Literal["min", "max"] = Field(..., description="'min': reached when value <= target (a loss); "
                                             "'max': when value >= target (an accuracy)")
    reference: ConvergenceReferenceSpec
    alpha: Annotated[float, Field(gt=0, le=0.5)] = 0.05
    trim: Annotated[int, Field(ge=0, le=10)] = Field(1, description="runs dropped at each end (MLPerf: 1)")


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
        "O'Brien–Fleming type): each claim stays wrong ≤ the study's alpha (5% unless set) over all stages together",
    )
    max_minutes: Annotated[float, Field(gt=0, le=7 * 24 * 60)] | None = Field(
        None, description="a time budget: no next stage is queued when, at the pace of the stage just ended, it "
        "would end more than this many minutes after the study's first stage began; the study then completes with "
        "its undecided verdicts marked stopped (each claim stays wrong ≤ alpha: stopping early only drops looks)",
    )


class StudySpec(_Spec):
    """What to run and how to judge it. The matrix seeds × repeats × determinism × stacks becomes runs."""

    name: Name
    kind: Literal["managed", "external"] = "managed"
    description: Annotated[str, Field(max_length=10_000)] = ""
    workload: WorkloadSpec | None = None
    code: CodeRef | None = Field(None, description="the code the workload runs; set by `steady submit`")
    seeds: Annotated[list[Annotated[int, Field(ge=0, le=2**63 - 1)]], Field(max_length=10_000)] = []
    repeats: Annotated[int, Field(ge=1, le=1000)] = 1
    determinism: Annotated[list[Determinism], Field(min_length=1)] = [Determinism.seeded]
    stacks: Annotated[list[StackSpec], Field(min_length=1, max_length=100)] = [StackSpec(name="default")]
    arms: Annotated[list[ArmSpec], Field(min_length=2, max_length=100)] | None = Field(
        None,
        description="arms that differ by stack, workload params, config file or code; instead of "
        "'stacks' (which is shorthand for arms that differ only by stack). 'reference_stack' may name the "
        "reference arm (default: the first)",
    )
    reference_stack: StackName | None = None
    sources: SourcesSpec | None = Field(
        None, description="a sources study (where does the variance come from?): the server writes one arm per "
        "source with only that source varied, 'none' and 'all' (and an init × data arm with 'crossed'); the code "
        "reads each source's seed as ctx.seed_for('init') or the placeholders {init_seed}, {data_seed}, "
        "{dropout_seed}, {numerics_seed}, {ulp_seed}. Instead of 'arms' and 'stacks'",
    )
    metrics: Annotated[list[MetricSpec], Field(min_length=1, max_length=100)] = [MetricSpec(name="loss")]
    threads: Annotated[int, Field(ge=1, le=1024)] = 2
    localize: Literal["off", "steps"] = Field(
        "off", description="`steps`: every run records a digest of its training state (parameters, gradients, "
        "optimizer state) at every optimizer step (PyTorch) or batch (Keras), as the series `steady.step_digest`, "
        "so `steady localize` knows the first divergent step and replays only that step (2 replays, not 4); "
        "costs about 17-35% of a training step (docs/localize.md)")
    time_limit_s: Annotated[float, Field(gt=0, le=7 * 86400)] = 1800.0
    max_attempts: Annotated[int, Field(ge=1, le=100)] = 3
    coverage: Annotated[float, Field(gt=0, lt=1)] = 0.9
    confidence: Annotated[float, Field(gt=0, lt=1)] = 0.95
    alpha: Annotated[float, Field(gt=0, le=0.5)] | None = Field(
        None, description="the level each claim of the study's decisions is made at: seed stability (max_std), stack "
        "portability (the TOST with a margin, and 'not equivalent'), the sources table, each over all stages with a "
        "budget, and the cost check (a 1 − alpha CI: false 'pass' and false 'fail' ≤ alpha/2 each). Unset: 0.05, and "
        "the cost check's CI at 'confidence'. steady bisect sets it to its total level divided over the points it may "
        "decide and each point's checks",
    )
    cost_budget: Annotated[float, Field(gt=1, allow_inf_nan=False)] | None = Field(
        None,
        description="cost of determinism: the largest acceptable step-time ratio of a more deterministic level "
        "over a less deterministic one (e.g. 1.5: strict may take at most 1.5× the step time of seeded). Each "
        "ratio is judged 'pass' (CI upper end ≤ budget), 'fail' (CI lower end > budget) or 'inconclusive'; "
        "false 'fail' and false 'pass' ≤ 2.5% each at 95% confidence (≤ alpha/2 each when 'alpha' is set). Without it "
        "only ratio and CI are reported",
    )
    convergence: ConvergenceSpec | None = Field(
        None, description="judge the steps to reach a target against a reference (MLPerf RCP check)"
    )
    suite: SuiteName | None = None
    budget: BudgetSpec | None = Field(
        None,
        description="adaptive seeds: when a seed-stability verdict (max_std), a stack-portability verdict "
        "(margin) or a source of a sources study is inconclusive, the server adds seeds in stages (group-sequential, "
        "alpha spending) until it is conclusive or the budget is spent (a sources study grows only its undecided "
        "sources' arms and the all-sources arm)",
    )
    alerts: Annotated[list[AlertRuleSpec], Field(max_length=100)] = Field(
        [], description="alert rules; scoped to the suite when the study has one, else to the study"
    )
    respect_quarantine: bool | None = Field(
        None, description="keep this study's runs from quarantined workers; unset: yes, except for a fleet check "
        "(a `fleet` section), which re-tests quarantined workers so that a scheduled check shows whether the fault "
        "is still there (docs/fleet.md)")
    fleet: FleetSpec | None = Field(
        None, description="a fleet check: the workload runs `repeats` times at strict on each worker of a pool, each "
        "run pinned to its worker, and the report names the workers whose runs part from their fingerprint group's "
        "majority (docs/fleet.md). Needs one seed, determinism [strict], no arms, stacks or budget")
    resume: ResumeSpec | None = Field(
        None,
        description="the resume check: the first `runs` seeds are also trained interrupted (killed after each "
        "step in `at`) and restarted by the code's own resume path (checkpoints in {checkpoint_dir} / "
        "ctx.checkpoint_dir); the report says whether the resumed run matches and which state it failed to restore",
    )

    @model_validator(mode="before")
    @classmethod
    def _sources_arms(cls, data: Any) -> Any:
        """A sources study's arms, written from ``sources`` (a spec read back carries them already)."""
        if not isinstance(data, dict) or not isinstance(data.get("sources"), dict):
            return data
        try:
            arms = SourcesSpec.model_validate(data["sources"]).arms()
        except ValidationError:
            return data  # the field's own validation names the error
        def bare(items: Any) -> Any:  # an arm as written, without the defaults a stored spec spells out
            if not isinstance(items, list):
                return items
            return [{k: v for k, v in a.items() if v not in (None, {}, [])} if isinstance(a, dict) else a
                    for a in items]

        if data.get("arms") is not None and bare(data["arms"]) != arms:
            _refuse(("arms",), data["arms"], "a sources study writes its own arms from 'sources': leave 'arms' out")
        if data.get("stacks") is not None and bare(data["stacks"]) != [{"name": "default"}]:
            _refuse(("stacks",), data["stacks"], "a sources study runs on one stack: leave 'stacks' out")
        params = ((data.get("workload") or {}).get("params") or {}) if isinstance(data.get("workload"), dict) else {}
        for key in ("sources", "crossed"):
            if key in params:
                _refuse(("workload", "params", key), params[key],
                        f"'{key}' is set per arm by the sources study; leave it out of workload.params")
        return {**data, "arms": arms}

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
        if self.arms is not None:
            if "stacks" in self.model_fields_set and names != ["default"]:
                raise ValueError("give either 'arms' or 'stacks', not both: an arm may set its own 'stack'")
            names = [a.name for a in self.arms]
        if self.reference_stack is not None and self.reference_stack not in names:
            kind = "arms" if self.arms is not None else "stacks"
            raise ValueError(f"reference_stack {self.reference_stack!r} is not one of the {kind} {names}")
        metric_names = [m.name for m in self.metrics]
        if len(set(metric_names)) != len(metric_names):
            raise ValueError("metric names must be distinct")
        check_spec_alerts(self.alerts, metric_names, self.suite)
        if self.kind == "managed":
            if self.workload is None:
                raise ValueError("a managed study needs a 'workload'")
            if not self.seeds:
                raise ValueError("'seeds' must name at least one seed")
            # (a string is the label of an older study, read back: refused at creation, steady.server.studies.service)
            arm_code = any(isinstance(a.code, CodeRef) for a in self.arms or [])
            if self.workload.name is not None and (self.code is not None or arm_code):
                raise ValueError("built-in workloads ship no code: leave 'code' out (of the study and its arms)")
        if self.fleet is not None:
            self._check_fleet()
        if self.budget is not None:
            self._check_budget(self.budget)
        if self.resume is not None:
            if self.kind != "managed" or self.workload is None or self.workload.name is not None:
                _refuse(("resume",), self.resume.model_dump(), "the resume check runs your own code (a "
                        "'command' or an 'entrypoint' that saves and loads checkpoints), not an external study "
                        "or a built-in workload")
            framework = self.workload.framework.value
            if framework not in RESUME_FRAMEWORKS:
                _refuse(("resume",), self.resume.model_dump(), "the resume check reads the state of a torch or "
                        "TensorFlow/Keras run; framework is " + framework)
            if framework == "tensorflow" and self.resume.micro_batches is not None:
                _refuse(("resume", "micro_batches"), self.resume.micro_batches, "a stop between micro-batches counts "
                        "torch backward passes; Keras accumulates gradients inside its optimizer "
                        "(gradient_accumulation_steps), where each micro-batch is an apply the check counts as a step")
            if framework == "tensorflow" and self.resume.signal == "term":
                _refuse(("resume", "signal"), self.resume.signal, "signal 'term' is for torch runs: a Keras step "
                        "compiled by TensorFlow holds the Python signal handler until it ends, so the stop "
                        "would wait out the grace; use 'kill'")
            if self.workload.distributed is not None or torchrun_launch(self.workload.command or []) is not None or any(
                    a.distributed is not None for a in self.arms or []):
                _refuse(("resume",), self.resume.model_dump(), "the resume check runs one process per launch; a "
                        "multi-process run (distributed or torchrun) is not covered yet: check its resume with one process")
            if self.resume.runs > len(self.seeds):
                _refuse(("resume", "runs"), self.resume.runs,
                        f"resume.runs is {self.resume.runs} but the study has only {len(self.seeds)} seed(s)")
        return self

    def _check_fleet(self) -> None:
        """A fleet check runs one thing many times: one seed, at strict, on the one default stack."""
        why = ("an external study" if self.kind != "managed" else
               "more than one seed" if len(self.seeds) != 1 else
               "determinism other than [strict]" if [d.value for d in self.determinism] != ["strict"] else
               "arms or stacks" if self.arms is not None or [s.name for s in self.stacks] != ["default"] else
               "repeats (give fleet.repeats)" if self.repeats != 1 else
               "a budget, sources or a resume check" if self.budget or self.sources or self.resume else "")
        if why:
            _refuse(("fleet",), self.fleet.model_dump() if self.fleet else None,
                    f"a fleet check runs one seed at strict, fleet.repeats times on each worker; this spec has {why}")

    @field_validator("arms")
    @classmethod
    def _distinct_arms(cls, value: list[ArmSpec] | None, info: ValidationInfo) -> list[ArmSpec] | None:
        if value is None:
            return value
        names = [a.name for a in value]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"arm names must be distinct; repeated: {duplicates}")
        workload = info.data.get("workload")
        seen: dict[str, str] = {}
        for arm in value:
            key = json.dumps(arm.effective(workload), sort_keys=True, default=str)
            if key in seen:
                raise ValueError(
                    f"arms {seen[key]!r} and {arm.name!r} are identical (same stack, params, config and code): "
                    "arms must differ in something to be compared"
                )
            seen[key] = arm.name
        return value

    @property
    def groups(self) -> list[StackSpec]:
        """The groups runs are expanded over and compared between: the arms (as stacks named after
        each arm, with the arm's stack labels) or the stacks."""
        if self.arms is None:
            return list(self.stacks)
        return [StackSpec(name=a.name, labels=a.stack.labels if a.stack else []) for a in self.arms]

    def _check_budget(self, budget: BudgetSpec) -> None:
        if self.kind != "managed":
            _refuse(("budget",), budget, "only a managed study can add seeds (an external study's runs are uploaded)")
        if self.sources is None and not any(m.max_std is not None or (m.margin is not None and len(self.groups) > 1)
                                            for m in self.metrics):
            _refuse(("budget",), budget, "no metric has a 'max_std' (seed stability) or a 'margin' with two or more "
                    "stacks (stack portability), and the study has no 'sources', so no verdict can become conclusive")
        if budget.max_seeds < len(self.seeds):
            _refuse(("budget", "max_seeds"), budget.max_seeds,
                    f"max_seeds {budget.max_seeds} is below the {len(self.seeds)} seeds of the spec")
        if budget.max_runs is not None and budget.max_runs < self.run_count:
            _refuse(("budget", "max_runs"), budget.max_runs,
                    f"max_runs {budget.max_runs} is below the {self.run_count} runs of the spec")
        step = budget.stage_seeds or len(self.seeds)
        stages = 1 + -(-(self.max_seeds - len(self.seeds)) // step)
        if stages > MAX_STAGES:
            _refuse(("budget", "stage_seeds"), budget.stage_seeds,
                    f"{stages} stages of {step} seeds; at most {MAX_STAGES} stages — raise stage_seeds or lower max_seeds")

    @property
    def runs_per_seed(self) -> int:
        return self.repeats * len(self.determinism) * len(self.groups)

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
        if self.fleet is not None:  # per worker; the pool is known at creation (studies.fleet)
            return len(self.fleet.pool or []) * self.fleet.repeats
        return len(self.seeds) * self.repeats * len(self.determinism) * len(self.groups)


class Progress(WireModel):
    total: int = 0
    queued: int = 0
    running: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0


class StageInfo(WireModel):
    """Where an adaptive study stands: its current stage, of at most ``last_stage``."""

    stage: int
    last_stage: int
    seeds: int = Field(description="seeds of all stages so far")
    max_seeds: int


class StudySummary(WireModel):
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
    code_sha256: str | None = Field(None, description="digest of the study's code archive")
    code_git_commit: str | None = None
    code_dirty: bool | None = Field(None, description="the work tree had uncommitted changes when submitted")
    status_reason: str | None = Field(None, description="why the study failed, or what its data lacks")
    stage: StageInfo | None = Field(None, description="adaptive seeds (a study with a budget): the current stage")


class StudyOut(StudySummary):
    spec: dict[str, Any]


