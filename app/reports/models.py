"""The report, bands and compare responses as typed models: what the routes declare and every
consumer (alerts, dashboard, terminal, Prometheus, CLI gate) reads.

A verdict is one of three models, told apart by ``level`` (a discriminated union): each level has
its own ``Literal`` verdict values (``steady.server.stats.vocabulary``) and its own numbers. The stats core
stays plain dataclasses; ``Report.model_validate`` reads ``StudyReport.to_data()`` plus the
study's header.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, overload

from pydantic import Field, TypeAdapter, model_validator

from steady.server.reports.fleet import FleetReport
from steady.server.reports.outcome import Outcome, judge
from steady.server.reports.sources import SourcesTableOut
from steady.server.reports.parts import (
    Compared,
    Convergence,
    DeterminismCost,
    DivergedRun,
    FinalStepSpread,
    LevelHeadline,
    Localization,
    OutOfBandTest,
    PairGroup,
    Part,
    Portability,
    ReportOptions,
    ResumeCheck,
    SeedRepeats,
    SeedSpread,
    SequentialDecision,
    StackGroup,
    StackPairs,
    VarianceBySource,
)
from steady.server.stats.vocabulary import (
    Determinism,
    Level,
    PortabilityValue,
    RepeatabilityValue,
    SeedStabilityValue,
    VerdictValue,
    severity,
)
from steady.server.kit.wire import NONFINITE_SPELLING, WireFloat, WireModel

if TYPE_CHECKING:
    from steady.server.stats.report import StudyReport

NONFINITE_ENCODING = "NaN, +Inf, -Inf -> " + ", ".join(f'"{s}"' for s in NONFINITE_SPELLING) + "; null: absent"

__all__ = [
    "RepeatabilityVerdict", "SeedStabilityVerdict", "PortabilityVerdict", "Verdict", "Report", "StudyHeader",
    "JudgedMetric", "ExcludedRun", "Stage", "StageDecision", "SequentialTost", "TostLook", "ArmDifference", "BandGroup", "Bands", "Compare",
    "CompareStudy", "CompareDifference", "CompareMetric", "CodeComparison", "RunCounts", "worst", "verdicts_of", "typed_verdicts",
]


class _VerdictBase(Part):
    metric: str
    n_runs: int
    summary: str = Field(description="the plain first line: what the verdict means and what to do "
                         "(the statistics are in `reason`)")
    reason: str
    guarantee: str = Field(description="the verdict's false-alarm level, in one phrase")

    def numbers(self, *fields: str) -> dict[str, Any]:
        """The named fields as JSON data (non-finite floats spelled as the API spells them), in order."""
        data = self.model_dump(mode="json", include=set(fields))
        return {f: data.get(f) for f in fields}


class RepeatabilityVerdict(_VerdictBase):
    """Level 1: same seed, same stack — are repeats bitwise identical? The worst seed decides."""

    level: Literal["repeatability"] = "repeatability"
    group: StackGroup
    verdict: RepeatabilityValue
    worst_seed: int | None = None
    max_abs_delta: WireFloat | None = None
    max_rel_delta: WireFloat | None = None
    max_ulps: int | None = None
    resolution: WireFloat | None = Field(None, description="values parsed from printed text: the unit of their last "
                                         "printed digit, which |Δ| is counted in instead of ULPs")
    first_divergent_step: int | None = None
    steps_compared: int | None = Field(None, description="the worst seed's repeats: how many steps they all logged "
                                       "(values are compared there only)")
    last_steps: list[int | None] = Field(default_factory=list, description="the worst seed's repeats: each one's "
                                         "last logged step")
    source: str | None = Field(None, description="what diverged first: stack, seeding, data_order (input pipeline), "
                               "distributed (reduction order or per-rank state of a multi-process run) or numerics "
                               "(kernels)")
    data_order_epoch: int | None = None
    atol: WireFloat
    rtol: WireFloat
    per_seed: list[SeedRepeats]
    dtype: str
    seeds_identical: bool | None
    n_seeds_compared: int
    expected: str
    met_expectation: bool | None
    expectation: str
    suspicious: list[str]
    localization: Localization | None = Field(None, description="where two of these repeats parted: the first "
                                              "divergent step and op, from `steady localize`")
    compared: Compared | None = Field(None, description="what the repeats were compared on: values at the printed "
                                      "precision or bit for bit, the digests compared and those missing")


class SeedStabilityVerdict(_VerdictBase):
    """Level 2: different seeds, same stack — the final-value spread against ``max_std``."""

    level: Literal["seed_stability"] = "seed_stability"
    group: StackGroup
    verdict: SeedStabilityValue
    spread: SeedSpread
    final_values: list[WireFloat]
    final_run_ids: list[int]
    diverged_run_ids: list[int]
    final_step: int | None = Field(description="the step of every run's final value when they all ended on one; "
                                   "null when they stopped at different steps (see final_steps)")
    short_run_ids: list[int]
    final_steps: list[int] = Field(default_factory=list, description="each run's last logged step (the final value "
                                   "judged is the run's last logged value), in final_run_ids order")
    final_step_spread: FinalStepSpread | None = None
    one_run_per_seed: bool
    n_needed: int | None
    out_of_band: list[int] = Field(description="runs whose whole curve lies outside the others' band")
    out_of_band_test: OutOfBandTest | None
    sequential: SequentialDecision | None


class TostLook(Part):
    """One stage of a group-sequential TOST (``steady.server.stats.sequential_tost.TostLook``)."""

    stage: int
    n_reference: int
    n_candidate: int
    info_fraction: WireFloat
    boundary: WireFloat
    nominal_alpha: WireFloat
    cumulative_alpha: WireFloat
    boundary_not_equivalent: WireFloat
    nominal_alpha_not_equivalent: WireFloat
    diff: WireFloat | None
    se: WireFloat | None
    df: WireFloat | None
    ci_low: WireFloat | None
    ci_high: WireFloat | None
    verdict: PortabilityValue


class SequentialTost(Part):
    """A portability verdict judged in stages (adaptive seeds); ``alpha`` is per comparison."""

    verdict: PortabilityValue
    decided_at: int | None
    final: bool
    stages: list[TostLook]
    alpha: WireFloat
    spending: str
    max_seeds: int
    margin: WireFloat
    skew_withheld: bool = False  # a look's 'equivalent' was withheld: skewed finals on unequal stacks
    stopped: bool = Field(
        False, description="the study stopped growing before the budget's last stage: its time budget (max_minutes) ran out")


class PortabilityVerdict(_VerdictBase):
    """Level 3: one stack against the reference — equivalent within the margin (TOST)?"""

    level: Literal["stack_portability"] = "stack_portability"
    group: PairGroup
    verdict: PortabilityValue
    n_reference: int
    n_candidate: int
    diverged_run_ids: list[int]
    band_containment: WireFloat
    band_steps_compared: int
    margin: WireFloat | None
    final_step: int | None
    short_run_ids: list[int]
    final_steps: list[int] = Field(default_factory=list, description="each run's last logged step, reference runs "
                                   "first")
    final_step_spread: FinalStepSpread | None = None
    same_seed: StackPairs
    adjust_method: str
    n_comparisons_tost: int
    n_comparisons_welch: int
    n_needed: int | None
    result: Portability | None = None
    tost_p_adjusted: WireFloat | None = None
    welch_p_adjusted: WireFloat | None = None
    sequential: SequentialTost | None = None


Verdict = Annotated[RepeatabilityVerdict | SeedStabilityVerdict | PortabilityVerdict, Field(discriminator="level")]


def worst(values: list[VerdictValue] | list[PortabilityValue]) -> str:
    """The most severe of ``values`` (``inconclusive`` when there is none)."""
    return max(values, key=severity, default="inconclusive")


class RunCounts(Part):
    """The study's runs by status."""

    total: int = 0
    queued: int = 0
    running: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0


class StudyHeader(Part):
    id: int
    name: str
    status: str
    kind: str = "managed"
    suite: str | None = None
    progress: RunCounts = Field(default_factory=RunCounts)
    status_reason: str | None = Field(None, description="why the study ended as it did, e.g. what the runs of a "
                                      "failed study hit")
    repeats: int | None = Field(None, description="repeats of each seed the spec asks for: with 1, repeatability "
                                "is not asked (null: not known)")


class JudgedMetric(Part):
    name: str
    atol: WireFloat
    rtol: WireFloat
    max_std: WireFloat | None
    margin: WireFloat | None
    resolution: WireFloat | None = Field(None, description="the metric's declared resolution (e.g. 1/N for accuracy "
                                         "over N examples): a tie of final values is judged at it")


class ExcludedRun(Part):
    run_id: int
    excluded_at: str
    excluded_by: str | None
    reason: str | None


class StageDecision(Part):
    """What one stage of an adaptive study decided for one seed-stability or portability verdict (or
    why it could not); a portability decision names its stacks and the stage's CI of the difference; a
    sources decision (level ``sources``) names the source's arm as candidate, ``all`` as reference, and the
    stage's interval of the SD ratio (``ratio``, ``lower``, ``upper``)."""

    level: Level | Literal["sources"] | None = None
    metric: str | None = None
    determinism: Determinism | None = None
    stack: str | None = None
    reference_stack: str | None = None
    candidate_stack: str | None = None
    verdict: SeedStabilityValue | PortabilityValue | None = None
    decided_at: int | None = None
    n_seeds: int | None = None
    info_fraction: WireFloat | None = None
    boundary: WireFloat | None = None
    nominal_alpha: WireFloat | None = None
    cumulative_alpha: WireFloat | None = None
    std: WireFloat | None = None
    lower: WireFloat | None = None
    upper: WireFloat | None = None
    n_reference: int | None = None
    n_candidate: int | None = None
    diff: WireFloat | None = None
    ci_low: WireFloat | None = None
    ci_high: WireFloat | None = None
    ratio: WireFloat | None = Field(None, description="a sources decision: σ_source/σ_all at this stage")
    decision: SeedStabilityValue | PortabilityValue | None = None
    error: str | None = None


class Stage(Part):
    stage: int
    seeds: list[int]
    created_at: str
    judged_at: str | None
    outcome: str | None
    decisions: list[StageDecision]


class ArmDifference(Part):
    reference: str
    candidate: str
    differ_by: list[str]


class Caveat(Part):
    """Something the verdicts rest on that a reader should know, e.g. a run whose capture met a second,
    different value for a step (``capture_conflicts``: the first value was judged, the second not stored), or
    a sources study's arm that pins every seed the code reads (``pinned_arm``: no seed stability judged there)."""

    kind: Literal["capture_conflicts", "pinned_arm"]
    run_id: int | None = None
    stack: str | None = None
    message: str


class Report(Part):
    """A study's report: verdicts per level, metric and group, with the numbers behind them."""

    study: StudyHeader
    metrics: list[JudgedMetric]
    n_runs_judged: int
    excluded_runs: list[ExcludedRun]
    stages: list[Stage]
    headline: list[LevelHeadline]
    verdicts: list[Verdict]
    variance_by_source: list[VarianceBySource]
    determinism_cost: list[DeterminismCost]
    cost_note: str | None = None  # why determinism_cost is empty, when the study has completed runs
    diverged: list[DivergedRun]
    options: ReportOptions
    arms: list[ArmDifference]
    convergence: list[Convergence] | None = None
    sources: list[SourcesTableOut] | None = Field(
        None, description="a sources study: per source the SD of each final metric, its TOST against the "
        "all-sources SD, the crossed init × data variance components and the one-ULP divergence")
    caveats: list[Caveat] = []
    resume: list[ResumeCheck] | None = Field(None, description="the resume check of each run that got one")
    fleet: FleetReport | None = Field(None, description="a fleet check: per stack-fingerprint group, the workers "
                                      "whose runs part from the group's majority, the slow ones, what it could miss")
    outcome: Outcome = Field(None, description="the study's judgment (pass / fail / inconclusive) and its one reason, "  # type: ignore[assignment]
                             "computed once from the checks below: what `steady report`, `submit --wait`, "
                             "`check`, the dashboard and the metrics export present")

    @model_validator(mode="after")
    def _judged(self) -> Report:
        """A report read without its outcome (built here, or cached before it had one) is judged now."""
        if self.outcome is None:
            self.outcome = judge(self)
        return self

    @classmethod
    def assemble(cls, built: StudyReport, *, study: StudyHeader | dict, metrics: list | tuple = (),
                 n_runs_judged: int = 0, excluded_runs: list | tuple = (), stages: list | tuple = (),
                 arms: list | tuple = (), convergence: list | None = None,
                 nonfinite_encoding: str = NONFINITE_ENCODING) -> Report:
        """The report of ``built`` (the stats core's result) under the study's header."""
        body = built.to_data()
        body["options"]["nonfinite_encoding"] = nonfinite_encoding
        return cls.model_validate({"study": study, "metrics": list(metrics), "n_runs_judged": n_runs_judged,
                                   "excluded_runs": list(excluded_runs), "stages": list(stages),
                                   "arms": list(arms), "convergence": convergence, **body})

    @overload
    def of_level(self, level: Literal["repeatability"], metric: str | None = None) -> list[RepeatabilityVerdict]: ...
    @overload
    def of_level(self, level: Literal["seed_stability"], metric: str | None = None) -> list[SeedStabilityVerdict]: ...
    @overload
    def of_level(self, level: Literal["stack_portability"], metric: str | None = None) -> list[PortabilityVerdict]: ...
    def of_level(self, level: Level, metric: str | None = None) -> list:
        """The verdicts of one level (and metric), typed as that level's model."""
        return verdicts_of(self.verdicts, level, metric)


def verdicts_of(verdicts: list, level: Level, metric: str | None = None) -> list:
    return [v for v in verdicts if v.level == level and (metric is None or v.metric == metric)]


_VERDICT: TypeAdapter[Verdict] = TypeAdapter(Verdict)


def typed_verdicts(built: StudyReport) -> list[Verdict]:
    """The verdicts of a report of the stats core (not a study's: a comparison, a cross-check) as models."""
    return [_VERDICT.validate_python(v) for v in built.to_data()["verdicts"]]


# --------------------------------------------------------------------------- bands


class BandGroup(Part):
    """Per-step seed band of one metric in one (determinism, stack) group (``steady.server.stats.bands``)."""

    group: StackGroup
    metric: str
    run_ids: list[int]
    excluded_run_ids: list[int]
    one_run_per_seed: bool
    downsampled: bool
    coverage: WireFloat
    confidence: WireFloat
    steps: list[int]
    n: list[int]
    mean: list[WireFloat]
    std: list[WireFloat]
    min: list[WireFloat]
    max: list[WireFloat]
    quantiles: dict[str, list[WireFloat]] = Field(description="quantile level (e.g. '0.05') → per-step values")
    ci_low: list[WireFloat]
    ci_high: list[WireFloat]
    ti_low: list[WireFloat]
    ti_high: list[WireFloat]


class Bands(Part):
    study_id: int
    metric: str
    coverage: WireFloat
    confidence: WireFloat
    groups: list[BandGroup]


# --------------------------------------------------------------------------- compare


class CompareStudy(Part):
    id: int
    name: str
    n_runs: int


class CodeComparison(Part):
    baseline: str | None
    candidate: str | None
    differs: bool = Field(description="whether a file the runs execute differs (a changed spec file does not count)")
    changed_files: list[str] = Field([], description="files of the code that differ (changed, added or removed)")
    spec_files: list[str] = Field([], description="study spec files in the code that differ: settings, not code")
    note: str


class CompareDifference(Part):
    """One thing the two studies differ by (``steady.server.reports.differences``)."""

    kind: Literal["workload", "command", "params", "config", "code", "spec_file", "determinism", "settings", "stack"]
    name: str = Field(description="as a user knows it: '--lr', 'params.lr', 'train.py', 'numpy_version'")
    baseline: str | None = Field(description="its value (a file: its digest) in the baseline; null: unset or absent")
    candidate: str | None
    note: str = Field(description="one line: '--lr: 0.05 → 0.1'")


class CompareMetric(Part):
    """A metric judged, with the margin and tolerances it was judged with."""

    name: str
    margin: WireFloat | None
    margin_from: Literal["spec", "query", "relative_margin", "none"]
    atol: WireFloat
    rtol: WireFloat


class Compare(Part):
    """Stack portability of two studies, their runs relabelled ``baseline`` and ``candidate``, and what
    differs between them."""

    baseline: CompareStudy
    candidate: CompareStudy
    metric: str = Field(description="the first metric judged (all of them: metrics)")
    margin: WireFloat | None = Field(description="the first metric's margin")
    metrics: list[CompareMetric]
    verdicts: list[PortabilityVerdict]
    verdict: PortabilityValue
    code: CodeComparison
    differences: list[CompareDifference]
    attribution: str = Field(description="what a difference in results is attributed to: the studies' setup when it "
                             "differs, else the stack when it differs, else numerics")


class BaselineComparisonOut(WireModel):
    """A study's final metrics against its suite's baseline snapshot (stack-portability verdicts)."""

    suite: str
    study_id: int
    baseline_study_id: int
    baseline_version: int | None
    baseline_digest: str | None
    alpha: float
    verdicts: list[PortabilityVerdict]
