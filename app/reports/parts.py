"""The numbers behind the verdicts as response models: one model per result dataclass of the
stats core (``steady.server.stats.intervals``, ``seed_stability``, ``repeatability``, ``portability``,
``stack_pairs``, ``sequential``, ``cost``, ``variance``, ``expectations``, ``convergence``).

Field names are the dataclasses' own: a report is validated from
``steady.server.stats.report.StudyReport.to_data()``. Every float is a ``WireFloat``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import ConfigDict, Field

from steady.server.stats.vocabulary import (
    CheckValue,
    Determinism,
    RepeatabilityValue,
    SeedStabilityValue,
)
from steady.server.kit.wire import WireFloat, WireModel


class Part(WireModel):
    """A part of a report: its fields are exactly those listed (an unknown key is an error)."""

    model_config = ConfigDict(extra="forbid")


class _Group(Part):
    def as_dict(self) -> dict[str, Any]:
        """The group as plain data, absent fields left out (how alerts key and label a group)."""
        return self.model_dump(mode="json", exclude_none=True)


class StackGroup(_Group):
    """Runs of one determinism level on one stack (or arm)."""

    determinism: Determinism
    stack: str


class PairGroup(_Group):
    """A candidate stack against a reference stack, at one determinism level."""

    determinism: Determinism
    reference_stack: str | None  # None: a suite baseline recorded without a stack
    candidate_stack: str
    reference: str | None = None  # "baseline" when the reference is a suite's baseline
    differ_by: list[str] | None = None  # what differs between the two arms, when the study has arms


# --------------------------------------------------------------------------- intervals


class MeanCI(Part):
    n: int
    mean: WireFloat
    std: WireFloat
    low: WireFloat
    high: WireFloat
    confidence: WireFloat


class ToleranceInterval(Part):
    n: int
    mean: WireFloat
    std: WireFloat
    k: WireFloat
    low: WireFloat
    high: WireFloat
    coverage: WireFloat
    confidence: WireFloat


class OrderStatisticTolerance(Part):
    n: int
    coverage: WireFloat
    confidence: WireFloat
    achieved_confidence: WireFloat
    sufficient: bool
    n_needed: int


class PredictionInterval(Part):
    n: int
    mean: WireFloat
    std: WireFloat
    low: WireFloat
    high: WireFloat
    confidence: WireFloat


class StdBounds(Part):
    n: int
    std: WireFloat
    lower: WireFloat
    upper: WireFloat
    alpha: WireFloat


class RobustStdBounds(StdBounds):
    kurtosis: WireFloat
    method: str


class SeedSpread(Part):
    """``steady.server.stats.seed_stability.SeedSpread``: the final-value spread of one group's seeds."""

    verdict: SeedStabilityValue
    reason: str
    n: int
    mean: WireFloat | None
    std: WireFloat | None
    min: WireFloat | None
    max: WireFloat | None
    max_std: WireFloat | None
    std_bounds: StdBounds | None
    mean_ci: MeanCI | None
    tolerance: ToleranceInterval | None
    order_statistic: OrderStatisticTolerance
    prediction: PredictionInterval | None
    n_needed: int | None
    robust_bounds: RobustStdBounds | None = None
    decision_bounds: StdBounds | None = None
    n_diverged: int = 0
    divergence_rate_ci: list[WireFloat] | None = None
    plan: str | None = None
    resolution: WireFloat | None = Field(None, description="the resolution a tie of final values was judged at "
                                         "(declared with the metric, or the step of the values' lattice)")
    tied: bool = Field(False, description="every finite final value is the same: the spread is judged at resolution")


class OutOfBandTest(Part):
    """The whole-curve leave-one-out test behind a seed-stability verdict's ``out_of_band`` runs."""

    run_ids: list[int]
    testable: bool
    level_score: list[WireFloat]
    statistic: list[WireFloat]
    df: int
    p_value: list[WireFloat]
    p_adjusted: list[WireFloat]
    steps_used: int
    false_alarm: WireFloat
    exact: bool
    method: str
    reason: str
    guarantee: str


class StageLook(Part):
    stage: int
    n_seeds: int
    info_fraction: WireFloat
    boundary: WireFloat
    nominal_alpha: WireFloat
    cumulative_alpha: WireFloat
    std: WireFloat | None
    lower: WireFloat | None
    upper: WireFloat | None
    verdict: SeedStabilityValue


class SequentialDecision(Part):
    verdict: SeedStabilityValue
    decided_at: int | None
    final: bool
    stages: list[StageLook]
    alpha: WireFloat
    spending: str
    max_seeds: int
    stopped: bool = Field(
        False, description="the study stopped growing before the budget's last stage: its time budget (max_minutes) ran out")


# --------------------------------------------------------------------------- repeatability


class RepeatabilityResult(Part):
    """``steady.server.stats.repeatability.Repeatability`` of one seed's repeats."""

    verdict: RepeatabilityValue
    n_runs: int
    atol: WireFloat
    rtol: WireFloat
    values_identical: bool
    digests_identical: bool
    steps_identical: bool
    max_abs_delta: WireFloat
    max_rel_delta: WireFloat
    max_ulps: int | None = Field(description="null when values were parsed from text (see resolution)")
    first_divergent_step: int | None
    first_out_of_tolerance_step: int | None
    source: str | None
    data_order_epoch: int | None
    reason: str
    dtype: str = "float64"
    resolution: WireFloat | None = Field(None, description="values parsed from printed text: the unit of their last "
                                         "printed digit, which differences are counted in instead of ULPs")
    steps_compared: int | None = Field(None, description="values are compared at the steps every repeat logged: "
                                       "how many there were (0: the repeats share no logged step)")
    last_steps: list[int | None] = Field(default_factory=list, description="each repeat's last logged step")


class FinalStepSpread(Part):
    """How the runs' final steps spread when they differ (early stopping, convergence criteria)."""

    n: int
    min: int
    max: int
    median: WireFloat
    q1: WireFloat
    q3: WireFloat


class SeedRepeats(RepeatabilityResult):
    seed: int
    run_ids: list[int]


class StackPairs(Part):
    """Seeds run on both stacks compared step by step (``steady.server.stats.stack_pairs``)."""

    n_pairs: int
    verdict: RepeatabilityValue
    source: str | None
    worst_seed: int | None
    first_divergent_step: int | None
    max_abs_delta: WireFloat
    max_rel_delta: WireFloat
    max_ulps: int | None = Field(description="null when values were parsed from text (see resolution)")
    reason: str
    resolution: WireFloat | None = Field(None, description="values parsed from printed text: the unit of their last "
                                         "printed digit")


# --------------------------------------------------------------------------- portability


class TestResult(Part):
    __test__ = False  # not a pytest class

    statistic: WireFloat
    p_value: WireFloat
    df: WireFloat | None = None


class Tost(Part):
    diff: WireFloat
    se: WireFloat
    df: WireFloat
    margin: WireFloat
    p_lower: WireFloat
    p_upper: WireFloat
    p_value: WireFloat
    exact: bool = False
    withheld: str | None = None  # why 'equivalent' is not claimed although p_value is small (skewed, unequal stacks)
    small_sample: str | None = Field(None, description="the small-sample rule was used (5 or fewer seeds on a stack), "
                                     "in words")


class BootstrapCI(Part):
    estimate: WireFloat
    low: WireFloat
    high: WireFloat
    confidence: WireFloat
    n_resamples: int
    method: str = "percentile"


class Portability(Part):
    """``steady.server.stats.portability.Portability``: one candidate stack against the reference."""

    n_reference: int
    n_candidate: int
    mean_reference: WireFloat
    mean_candidate: WireFloat
    diff: WireFloat
    diff_ci_low: WireFloat
    diff_ci_high: WireFloat
    margin: WireFloat | None
    welch: TestResult
    tost: Tost | None
    brown_forsythe: TestResult
    mann_whitney: TestResult
    ks: TestResult
    bootstrap: BootstrapCI
    hedges_g: WireFloat
    n_needed: int | None
    plan: str | None = None


# --------------------------------------------------------------------------- the rest of a report


class LevelHeadline(Part):
    """Did a determinism level do what it should (``steady.server.stats.expectations``)?"""

    determinism: Determinism
    expected: str
    met: bool | None
    phrase: str
    n_verdicts: int
    suspicious: list[str]


class VarianceComponents(Part):
    n_groups: int
    n_total: int
    group_sizes: list[int]
    n0: WireFloat
    ms_between: WireFloat
    ms_within: WireFloat
    between: WireFloat
    within: WireFloat
    share_between: WireFloat
    share_within: WireFloat
    method: str = "anova"


class VarianceBySource(Part):
    """Final-value variance of one (metric, group): between seeds against run to run."""

    metric: str
    group: StackGroup
    n_seeds: int
    n_runs: int
    final_step: int | None
    available: bool
    components: VarianceComponents | None = None
    estimator: str | None = None
    between_seed_applies: bool | None = None
    note: str | None = None
    reason: str | None = None


class DeterminismCost(Part):
    """``steady.server.stats.cost.CostRatio`` of one stack: step time of one determinism level over another's."""

    stack: str
    numerator: Determinism
    denominator: Determinism
    ratio: WireFloat
    ci_low: WireFloat | None
    ci_high: WireFloat | None
    confidence: WireFloat
    n_numerator: int
    n_denominator: int
    design: str
    df: WireFloat | None
    warmup_fraction: WireFloat
    budget: WireFloat | None
    verdict: CheckValue | None
    reason: str
    guarantee: str
    method: str
    source: str | None = None  # the series the step times came from (steady.server.stats.report_data.STEP_TIME_SOURCES)
    source_text: str | None = None  # the same in words, for a reader
    summary: str = Field("", description="the plain first line: a cost, no evidence of one (the interval covers 1) "
                         "or faster, always with the interval it rests on")


class DivergedRun(Part):
    run_id: int
    metric: str
    step: int
    determinism: Determinism
    stack: str
    seed: int


class SequentialOptions(Part):
    last_stage: int
    max_seeds: int
    spending: str
    stage: int
    stopped: bool = Field(False, description="the time budget ended the study at this stage, before the last")


class ReportOptions(Part):
    coverage: WireFloat
    confidence: WireFloat
    alpha: WireFloat
    reference_stack: str | None
    adjust_method: str
    false_alarm: WireFloat
    sequential: SequentialOptions | None
    nonfinite_encoding: str


class ConvergenceReference(Part):
    source: Literal["numbers", "study"]
    study: int | None = None
    n_runs: int | None = None
    reason: str | None = None
    mean: WireFloat | None = None
    std: WireFloat | None = None
    n: int | None = None


class Convergence(Part):
    """One group's steps to target against the reference (``steady.server.stats.convergence``)."""

    metric: str
    target: WireFloat
    direction: Literal["min", "max"]
    group: StackGroup
    reference: ConvergenceReference
    verdict: CheckValue
    reason: str
    guarantee: str
    n_candidate_runs: int
    alpha: WireFloat | None = None
    trim: int | None = None
    reference_mean: WireFloat | None = None
    reference_std: WireFloat | None = None
    n_reference: int | None = None
    candidate_mean: WireFloat | None = None
    n_candidate: int | None = None
    n_unconverged: int | None = None
    steps_to_target: list[WireFloat] | None = None
    df: int | None = None
    t_quantile: WireFloat | None = None
    min_acceptable_mean: WireFloat | None = None
    max_speedup: WireFloat | None = None
    normalization_factor: WireFloat | None = None
    t_statistic: WireFloat | None = None
    p_value: WireFloat | None = None


class LocalizationAnswer(Part):
    """The first op whose output differs between two replays of one step (``steady.worker.contract.oplocate``)."""

    step: int = Field(ge=0, description="the first optimizer step whose training state differs")
    op: str = Field(min_length=1, max_length=200, description="the ATen op, e.g. `aten::index_add_`")
    module: str = Field(max_length=500, description="its module's path (FQN); empty outside every module")
    phase: Literal["data", "forward", "backward", "optimizer", ""]
    line: str = Field(max_length=500, description="the user's line that called it, `file.py:42`")
    index: int = Field(ge=0, description="its position in the step's op stream")
    inputs_identical: bool = Field(description="true: the op itself diverged; false: an input no traced op made")
    cause: Literal["op", "outside"]
    aligned_by: Literal["ops", "modules"] = Field(description="`modules`: the op streams differ in shape "
                                                  "(another kernel, a fused op) and were aligned at module boundaries")
    note: str = Field("", max_length=2000)
    ops_compared: int = Field(0, ge=0)


class Localization(Part):
    """Where two repeats of a study parted, found by replaying them (``steady localize``)."""

    run_ids: list[int] = Field(min_length=2, max_length=2, description="the two runs, replayed")
    status: Literal["localized", "identical", "failed"] = Field(
        description="localized: the op is named; identical: the replays did not part (the divergence did "
        "not recur); failed: a replay did not get there (see sentence)")
    step: int | None = Field(None, ge=0)
    replays: int = Field(ge=0, le=8, description="training runs it took (2 per pair of replays)")
    answer: LocalizationAnswer | None = None
    sentence: str = Field(min_length=1, max_length=4000, description="the answer in one line")
    localized_at: datetime | None = None
class ResumeCheck(Part):
    """One run's resume check (``steady.worker.contract.resume``): the run trained uninterrupted, and killed after
    each step in ``at`` then restarted by its own resume path; the state at each resume point compared bitwise."""

    run_id: int
    seed: int
    stack: str
    determinism: Determinism
    at: list[int]
    verdict: Literal["identical", "not_restored", "failed", "within_seed_band", "outside_seed_band", "not_judged"]
    missing: list[str] = Field([], description="the state the resumed run failed to restore: parameters, "
                                "optimizer_state, optimizer_iterations (Keras), lr_scheduler, grad_scaler, "
                                "accumulated_gradients, micro_batch_counter, python_rng, numpy_rng, torch_rng, tf_rng "
                                "(Keras), loader_worker_seeds, data (the data position), step_counter; checkpoint when "
                                "it started from scratch; 'unseen' when all matched but the end differs")
    summary: str = Field(description="the plain first line: what the resumed run got wrong, or that it matched")
    reason: str
    guarantee: str
    steps: dict[str, int] | None = Field(None, description="updates made: uninterrupted, and all launches of the resume")


class Compared(Part):
    """What the repeats of a group were compared on, at which resolution (``steady.server.stats.resolution``)."""

    basis: Literal["printed", "binary"] = Field(description="printed: values parsed from text, equal to their last "
                                                "printed digit; binary: floats compared bit for bit")
    dtype: str = Field(description="binary: the type the values were logged in")
    resolution: WireFloat | None = Field(description="printed: the unit of the last printed digit")
    decimals: int | None = Field(description="printed: digits after the point")
    significant: int | None = Field(description="printed: significant digits of the last value")
    digests: list[str] = Field(description="digest kinds every repeat recorded, compared bit for bit")
    missing: dict[str, str] = Field(description="digest kind -> why a repeat has none: the weight digests always, "
                                    "the data order and optimizer state where a run said why")
    values: str = Field(description="how the values were compared, in words")
    digest_phrase: str = Field(description="which digests were compared and which are missing, in words")
