"""The report's inputs and outputs as frozen dataclasses, and the grouping helpers the level
builders share: ``RunData``, ``MetricSpec``, ``SeedStages``, ``Verdict``, ``StudyReport``,
``GroupBand`` and ``compute_bands``, ``Finals``, ``last_finals`` and ``common_finals``."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from steady.server.stats.align import align_series
from steady.server.stats.bands import DEFAULT_QUANTILES, Band, compute_band
from steady.server.stats.downsample import extreme_indices
from steady.server.stats.serialize import WIRE, to_data, to_plain
from steady.server.stats.vocabulary import DETERMINISM_LEVELS

STEP_TIME_KEY = "step_time"
# Where a run's step times come from, in the order the cost of determinism prefers them: the run's own
# (logged ``step_time``, or the SDK timing its ``log`` calls), then what the worker derives for a run
# that logs none: TensorBoard events' wall times, the arrival of step lines on stdout.
STEP_TIME_SOURCES = {
    STEP_TIME_KEY: "the run's own step_time (logged, printed and captured as step_time, or the SDK timing its log calls)",
    "step_time:tensorboard": "TensorBoard events' wall times",
    "step_time:stdout": "the arrival times of step lines on stdout",
}


@dataclass(frozen=True)
class RunData:
    """One run as the stats core sees it. ``series`` maps a metric key to (steps int64, values float64)."""

    run_id: int
    seed: int
    repeat: int
    determinism: str
    stack: str
    fingerprint: Mapping = field(default_factory=dict)
    digests: Mapping = field(default_factory=dict)
    status: str = "succeeded"
    series: Mapping = field(default_factory=dict)
    worker: int | str | None = None  # who ran it (pairs the cost comparison when one worker ran both runs)
    dtypes: Mapping = field(default_factory=dict)  # metric key -> logged value type ("float32"…); absent: float64
    # metric key -> the last printed digit's unit of values parsed from text (stdout); absent: binary floats
    resolutions: Mapping = field(default_factory=dict)
    # metric key -> where its step counter went back on the run's output ({"line", "step_before", "step_after"}):
    # its values at steps already logged were not stored, so its final value is not its last printed one
    restarts: Mapping = field(default_factory=dict)
    # digest kind -> why the run has none (its code's note: no optimizer stepped, no model found); absent: none given
    digest_notes: Mapping = field(default_factory=dict)


@dataclass(frozen=True)
class MetricSpec:
    """A metric to judge: repeatability tolerance (atol, rtol), seed-spread limit, stack margin."""

    name: str
    atol: float = 0.0
    rtol: float = 0.0
    max_std: float | None = None
    margin: float | None = None
    resolution: float | None = None  # the metric's resolution, declared (e.g. 1/N for accuracy over N examples)


@dataclass(frozen=True)
class SeedStages:
    """An adaptive study's stages: seed-stability verdicts are then group-sequential
    (``steady.server.stats.sequential.sequential_seed_decision``). ``stage_of_seed`` maps each seed to the
    stage that added it (1-based); ``last_stage`` is the last stage the budget allows; ``stopped``: the study
    stopped growing before it (its time budget ran out), so no stage comes after ``current``."""

    stage_of_seed: Mapping
    last_stage: int
    max_seeds: int
    spending: str = "pocock"
    stopped: bool = False

    @property
    def current(self) -> int:
        return max(self.stage_of_seed.values(), default=1)


@dataclass(frozen=True)
class Verdict:
    level: str  # repeatability | seed_stability | stack_portability
    metric: str
    group: Mapping
    verdict: str
    n_runs: int
    reason: str
    details: Mapping  # the numbers behind the verdict (plain data after to_dict)


@dataclass(frozen=True)
class StudyReport:
    verdicts: tuple
    variance_by_source: tuple
    determinism_cost: tuple
    diverged: tuple
    options: Mapping
    headline: tuple = ()  # expectations.LevelHeadline per determinism level (repeatability)
    cost_note: str | None = None  # why there is no cost of determinism, when there is none
    # The full-resolution seed band (GroupBand) of every (metric, group) behind the seed-stability
    # verdicts, for consumers that draw it; not part of ``to_dict``.
    bands: tuple = ()

    def to_dict(self) -> dict:
        """JSON-safe plain data (NaN, ±Inf → "NaN", "Infinity", "-Infinity")."""
        return self._plain(to_plain)

    def to_data(self) -> dict:
        """Plain data with non-finite floats kept as floats (for a caller that spells them)."""
        return self._plain(to_data)

    def _plain(self, convert) -> dict:
        out = {
            "headline": convert(self.headline),
            "verdicts": [],
            "variance_by_source": convert(self.variance_by_source),
            "determinism_cost": convert(self.determinism_cost),
            "diverged": convert(self.diverged),
            "options": convert(self.options),
            "cost_note": self.cost_note,
        }
        for v in self.verdicts:
            entry = {"level": v.level, "metric": v.metric, "group": convert(v.group), "verdict": v.verdict,
                     "n_runs": int(v.n_runs), "reason": v.reason}
            entry.update(convert(v.details))
            out["verdicts"].append(entry)
        return out


# --------------------------------------------------------------------------- validation


def _validate(runs: Sequence[RunData], metrics: Sequence[MetricSpec] | None = None) -> list[RunData]:
    runs = list(runs)
    ids = set()
    for r in runs:
        if not isinstance(r, RunData):
            raise ValueError(f"runs must be RunData, got {type(r).__name__}")
        if r.determinism not in DETERMINISM_LEVELS:
            raise ValueError(f"run {r.run_id}: determinism must be one of {DETERMINISM_LEVELS}, got {r.determinism!r}")
        if r.run_id in ids:
            raise ValueError(f"duplicate run_id {r.run_id}")
        ids.add(r.run_id)
        for key, sv in r.series.items():
            if len(sv) != 2:
                raise ValueError(f"run {r.run_id} series {key!r} must be a (steps, values) pair")
    if metrics is not None:
        names = [m.name for m in metrics]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate metric names in {names}")
        for m in metrics:
            if m.atol < 0 or m.rtol < 0:
                raise ValueError(f"metric {m.name!r}: atol and rtol must be >= 0")
            if m.max_std is not None and not m.max_std > 0:
                raise ValueError(f"metric {m.name!r}: max_std must be > 0")
            if m.margin is not None and not m.margin > 0:
                raise ValueError(f"metric {m.name!r}: margin must be > 0")
    return runs


def _groups(runs: Sequence[RunData]) -> dict[tuple[str, str], list[RunData]]:
    out: dict[tuple[str, str], list[RunData]] = defaultdict(list)
    for r in runs:
        out[(r.determinism, r.stack)].append(r)
    return dict(sorted(out.items(), key=lambda kv: (DETERMINISM_LEVELS.index(kv[0][0]), kv[0][1])))


def _with_metric(runs: Sequence[RunData], metric: str) -> list[RunData]:
    return [r for r in runs if metric in r.series]


def _one_per_seed(runs: Sequence[RunData], metric: str) -> list[RunData]:
    """Among runs that logged ``metric``: the lowest repeat (then run_id) per seed, by seed."""
    return _lowest_repeat_per_seed(_with_metric(runs, metric))


def _lowest_repeat_per_seed(runs: Sequence[RunData]) -> list[RunData]:
    best: dict[int, RunData] = {}
    for r in runs:
        cur = best.get(r.seed)
        if cur is None or (r.repeat, r.run_id) < (cur.repeat, cur.run_id):
            best[r.seed] = r
    return [best[s] for s in sorted(best)]


def _series(r: RunData, metric: str):
    sv = r.series.get(metric)
    if sv is None:
        return None
    steps, values = np.asarray(sv[0]), np.asarray(sv[1], dtype=np.float64)
    return steps, values


def _final(r: RunData, metric: str) -> tuple[float | None, int | None]:
    """(value at the last logged step, first non-finite step or None); (None, None) if absent."""
    sv = _series(r, metric)
    if sv is None or sv[1].size == 0:
        return None, None
    steps, values = sv
    bad = ~np.isfinite(values)
    div = int(steps[int(np.argmax(bad))]) if bad.any() else None
    return float(values[-1]), div


@dataclass(frozen=True)
class Finals:
    """Final values of a set of runs.

    From ``last_finals`` (what the report judges): each run's last logged value, whatever its step
    (early stopping and epochs of different length are normal); ``steps`` holds each run's last
    step (in ``run_ids`` order) and ``step`` is that step when every run ended on the same one, else
    None. From ``common_finals``: each run's value at the last step every run logged (``step``, None
    when the runs share no logged step). ``short_run_ids`` are runs (not diverged) that stopped
    before the longest one; ``diverged_run_ids`` are runs whose metric turned non-finite (they have
    no final value and count against stability)."""

    values: np.ndarray
    run_ids: list
    diverged_run_ids: list
    step: int | None
    short_run_ids: list
    steps: tuple = ()  # each run's final step, in ``run_ids`` order

    @property
    def step_range(self) -> tuple[int, int] | None:
        """(first, last) of the runs' final steps; None without a final value."""
        return (min(self.steps), max(self.steps)) if self.steps else None

    def where(self) -> str:
        """Where the final values were taken, in words: ``at step 999``, ``at each run's last step,
        325–1,450``, or (no final value) the empty string."""
        if self.step is not None:
            return f"at step {self.step:,}"
        rng = self.step_range
        if rng is None:
            return ""
        return f"at each run's last step, {rng[0]:,}–{rng[1]:,}"


def last_finals(runs: Sequence[RunData], metric: str) -> Finals:
    """Each run's last logged value and its step (see ``Finals``); runs without the metric are skipped."""
    ok: list[tuple] = []
    bad: list = []
    for r in runs:
        sv = _series(r, metric)
        if sv is None or sv[1].size == 0:
            continue
        if np.all(np.isfinite(sv[1])):
            ok.append((r, int(sv[0][-1]), float(sv[1][-1])))
        else:
            bad.append(r.run_id)
    if not ok:
        return Finals(np.zeros(0), [], bad, None, [])
    steps = tuple(s for _, s, _ in ok)
    longest = max(steps)
    return Finals(np.array([v for _, _, v in ok], dtype=np.float64), [r.run_id for r, _, _ in ok], bad,
                  steps[0] if min(steps) == longest else None, [r.run_id for r, s, _ in ok if s < longest], steps)


def final_step_spread(fin: Finals) -> dict | None:
    """How the runs' final steps spread when they differ (steps to stop is a stability measure in its
    own right): their range, median and quartiles over the runs; None when every run ended at one step."""
    if fin.step is not None or len(fin.steps) < 2:
        return None
    s = np.asarray(fin.steps, dtype=np.float64)
    q1, med, q3 = (float(x) for x in np.quantile(s, [0.25, 0.5, 0.75]))
    return {"n": int(s.size), "min": int(s.min()), "max": int(s.max()), "median": med, "q1": q1, "q3": q3}


def final_step_phrase(spread: dict | None) -> str:
    """``the runs stopped at different steps: median 790, quartiles 500–1,100 over 5 runs``."""
    if spread is None:
        return ""

    def n(x: float) -> str:
        return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.1f}"
    return (f"the runs stopped at different steps: median {n(spread['median'])}, "
            f"quartiles {n(spread['q1'])}–{n(spread['q3'])} over {spread['n']} runs")


def common_finals(runs: Sequence[RunData], metric: str) -> Finals:
    """Each run's value at the common final step (see ``Finals``); runs without the metric are skipped."""
    ok: list[tuple] = []
    bad: list[tuple] = []
    for r in runs:
        sv = _series(r, metric)
        if sv is None or sv[1].size == 0:
            continue
        (bad if not np.all(np.isfinite(sv[1])) else ok).append((r, sv))
    if not ok:
        return Finals(np.zeros(0), [], [r.run_id for r, _ in bad], None, [])
    common = ok[0][1][0]
    for _, (steps, _) in ok[1:]:
        if steps is common or (steps.shape == common.shape and np.array_equal(steps, common)):
            continue  # the usual case, runs on one step grid: no sort
        common = np.intersect1d(common, steps, assume_unique=True)
    if common.size == 0:
        return Finals(np.zeros(0), [], [r.run_id for r, _ in bad], None, [])
    step = int(common[-1])
    longest = max(int(steps[-1]) for _, (steps, _) in ok)
    vals = [float(values[int(np.searchsorted(steps, step))]) for _, (steps, values) in ok]
    return Finals(np.array(vals, dtype=np.float64), [r.run_id for r, _ in ok], [r.run_id for r, _ in bad], step,
                  [r.run_id for r, (steps, _) in ok if int(steps[-1]) < longest], (step,) * len(ok))


# --------------------------------------------------------------------------- bands


@dataclass(frozen=True)
class GroupBand:
    group: Mapping
    metric: str
    run_ids: tuple  # runs used (one per seed)
    excluded_run_ids: tuple  # diverged runs left out of the band
    one_run_per_seed: bool  # True when repeats existed and only the first repeat was used
    downsampled: bool
    band: Band

    def to_dict(self, *, spelling: tuple = WIRE) -> dict:
        """JSON-safe plain data (NaN, +Inf, -Inf spelled as ``spelling``: the API's strings by default)."""
        return to_plain(self._fields(), spelling=spelling)

    def to_data(self) -> dict:
        """Plain data with non-finite floats kept as floats."""
        return to_data(self._fields())

    def to_arrays(self) -> dict:
        """The fields of ``to_data`` with every per-step statistic left a 1-D numpy array (steps
        and n integers, the rest float64 with NaN and ±Inf as they are), for a renderer that
        writes arrays without a Python object per value."""
        return self._fields()

    def _fields(self) -> dict:
        b = self.band
        return ({
            "group": self.group, "metric": self.metric, "run_ids": self.run_ids,
            "excluded_run_ids": self.excluded_run_ids, "one_run_per_seed": self.one_run_per_seed,
            "downsampled": self.downsampled, "coverage": b.coverage, "confidence": b.confidence,
            "steps": b.steps, "n": b.n, "mean": b.mean, "std": b.std, "min": b.min, "max": b.max,
            "quantiles": {f"{q:g}": b.quantiles[i] for i, q in enumerate(b.quantile_levels)},
            "ci_low": b.ci_low, "ci_high": b.ci_high, "ti_low": b.ti_low, "ti_high": b.ti_high,
        })


def _group_band(group_runs, metric, *, coverage, confidence, quantiles):
    chosen = _one_per_seed(group_runs, metric)
    aligned = align_series({r.run_id: _series(r, metric) for r in chosen})
    band = compute_band(aligned.values, steps=aligned.steps, coverage=coverage, confidence=confidence,
                        quantiles=quantiles, diverged=aligned.diverged)
    return chosen, aligned, band


@dataclass(frozen=True)
class BandMembers:
    """The runs of one (determinism, stack) group that enter its band of a metric."""

    group: tuple[str, str]  # (determinism, stack)
    runs: list[RunData]  # one per seed (its lowest repeat), by seed: the band's rows, in order
    one_run_per_seed: bool  # True when repeats existed and only the first repeat was used


def band_members(runs: Sequence[RunData], metric: str, *, logged: Collection[int] | None = None) -> list[BandMembers]:
    """Every group with runs of ``metric``, in report order, and the runs that enter its band.
    ``logged``: the ids of the runs that logged the metric, for runs given without their series
    (default: the runs whose ``series`` holds it)."""
    out = []
    for group, group_runs in _groups(_validate(runs)).items():
        have = _with_metric(group_runs, metric) if logged is None else [r for r in group_runs if r.run_id in logged]
        chosen = _lowest_repeat_per_seed(have)
        if chosen:
            out.append(BandMembers(group, chosen, len(chosen) < len(have)))
    return out


def group_band(members: BandMembers, metric: str, band: Band, diverged, *, max_points: int | None) -> GroupBand:
    """The ``GroupBand`` of ``band`` (computed over ``members.runs``, ``diverged`` flagged per run),
    ``decimated`` to ``max_points``."""
    ids = tuple(int(r.run_id) for r in members.runs)
    det, stack = members.group
    return decimated(GroupBand(group={"determinism": det, "stack": stack}, metric=metric,
                               run_ids=tuple(i for i, d in zip(ids, diverged) if not d),
                               excluded_run_ids=tuple(i for i, d in zip(ids, diverged) if d),
                               one_run_per_seed=members.one_run_per_seed, downsampled=False, band=band), max_points)


def decimated(g: GroupBand, max_points: int | None) -> GroupBand:
    """``g`` with its steps decimated to ``max_points``, keeping each bucket's min of the band minimum and
    max of the band maximum (``steady.server.stats.downsample.extreme_indices``), marked ``downsampled``;
    ``g`` itself when it has no more steps than that."""
    if max_points is None or g.band.steps.size <= max_points:
        return g
    return replace(g, downsampled=True, band=g.band.take(extreme_indices(g.band.min, g.band.max,
                                                                         max_points=int(max_points))))


def check_max_points(max_points: int | None) -> None:
    if max_points is not None and (int(max_points) != max_points or max_points < 2):
        raise ValueError(f"max_points must be an integer >= 2, got {max_points!r}")


def compute_bands(runs: Sequence[RunData], *, metric: str, coverage: float = 0.9, confidence: float = 0.95,
                  quantiles=DEFAULT_QUANTILES, max_points: int | None = None) -> tuple:
    """Per-step seed bands of ``metric`` for every (determinism, stack) group.

    One run per seed (the lowest repeat) enters the band, diverged runs (a non-finite value
    anywhere) are excluded and listed. Statistics per step as in ``steady.server.stats.bands.compute_band``;
    with ``max_points`` the steps are decimated (``group_band``).
    """
    check_max_points(max_points)
    out = []
    for members in band_members(runs, metric):
        aligned = align_series({r.run_id: _series(r, metric) for r in members.runs})
        band = compute_band(aligned.values, steps=aligned.steps, coverage=coverage, confidence=confidence,
                            quantiles=quantiles, diverged=aligned.diverged)
        out.append(group_band(members, metric, band, aligned.diverged, max_points=max_points))
    return tuple(out)


