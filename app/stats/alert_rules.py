"""The statistics behind Steady's alert kinds, as pure functions the service calls and the
calibration harness simulates (``steady.server.stats.calibration.rules_alerts``).

Each alert kind has a stated false-alarm level (``NOMINAL``) and a short guarantee phrase
(``GUARANTEES``) that travels with the alert's details:

* ``out_of_baseline`` (final mode) — ``baseline_outliers``: a normal prediction interval from
  the baseline's runs, Bonferroni-corrected for the number of candidate runs, so that a
  healthy study of any size raises a false alarm at most ``alpha`` of the time per
  (stack, determinism level) group.
* ``band_width`` (std) — ``band_too_wide``: a one-sided chi-square test that the seed std
  exceeds the limit, false alarm ≤ ``alpha`` when the true std is at the limit or below.
* ``suite_shift`` — ``steady.server.stats.changepoint.sequential_shift``: a self-starting CUSUM with a
  lifetime false-alarm budget over a horizon of studies, per stack and determinism level, on the
  studies' AR(1) innovations (consecutive studies may be correlated; checked up to AR(1) 0.5).
* ``determinism_cost`` — fires when the whole 95% CI of the step-time ratio
  (``steady.server.stats.cost.cost_ratio``) lies above ``max_ratio``: the report's budget ``fail``, with
  a false alarm ≤ 2.5% when the true ratio is at the limit (calibrated as ``cost.budget_fail``).
* ``diverged`` and ``repeatability_lost`` are exact checks of the data (a non-finite value; a
  bit that differs), with no false alarm on healthy data by construction.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from steady.server.stats.align import align_series, check_matrix
from steady.server.stats.bands import curve_levels
from steady.server.stats.changepoint import shift_guarantee
from steady.server.stats.intervals import bonett_std_bounds, std_bounds_from
from steady.server.stats.quantiles import t_isf
from steady.server.stats.report import RunData, common_finals

__all__ = ["BaselineCheck", "baseline_outliers", "baseline_curve_outliers", "BandCheck", "band_too_wide", "band_check", "NOMINAL",
           "GUARANTEES", "guarantee"]

# default false-alarm level of each alert kind (per evaluation and group, except suite_shift:
# per lifetime of ``horizon`` studies and group)
NOMINAL = {
    "out_of_baseline": 0.01,
    "band_width": 0.05,
    "suite_shift": 0.01,
    "diverged": 0.0,
    "repeatability_lost": 0.0,
    "determinism_cost": 0.025,  # the cost.budget_fail rule of steady.server.stats.calibration.rules_cost
}


def guarantee(kind: str, *, alpha: float | None = None, horizon: int | None = None, mode: str | None = None,
              stat: str | None = None) -> str:
    """The short phrase a user sees beside an alert of ``kind`` with these parameters."""
    a = NOMINAL.get(kind) if alpha is None else alpha
    if kind == "out_of_baseline":
        what = "whole-curve level" if mode == "curve" else "final value"
        return f"false alarm ≤ {a:.0%} per study and group, whatever the number of runs ({what})"
    if kind == "band_width":
        if stat == "ti_width":
            return "a limit on the tolerance interval's own width (it has its confidence built in)"
        return f"false alarm ≤ {a:.0%} per study and group when the true std is at the limit"
    if kind == "suite_shift":
        return shift_guarantee(NOMINAL["suite_shift"] if a is None else a, horizon or 100)
    if kind == "diverged":
        return "exact: fires only on a logged NaN or ±Inf"
    if kind == "repeatability_lost":
        return "exact: fires only when a bit differs between repeats"
    if kind == "not_equivalent":
        return "relays the stack-portability verdict (TOST); no false-alarm level of its own yet"
    if kind == "determinism_cost":
        return "false alarm ≤ 2.5% when the true ratio is at the limit (the whole 95% CI above it)"
    raise ValueError(f"unknown alert kind {kind!r}")


GUARANTEES = {kind: guarantee(kind) for kind in ("out_of_baseline", "band_width", "suite_shift", "diverged",
                                                 "repeatability_lost", "not_equivalent", "determinism_cost")}


def _finite_1d(name: str, x) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    return arr


def _alpha(alpha: float) -> float:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be strictly between 0 and 1, got {alpha!r}")
    return float(alpha)


@dataclass(frozen=True)
class BaselineCheck:
    """Candidate runs' final values against the baseline's simultaneous prediction interval."""

    low: float
    high: float
    n_baseline: int
    n_candidates: int
    alpha: float  # familywise false-alarm level over the candidates
    per_run_alpha: float  # alpha / n_candidates (Bonferroni)
    outside: tuple[int, ...]  # indices of the candidates outside (a non-finite one is outside)
    mean: float
    std: float

    @property
    def firing(self) -> bool:
        return bool(self.outside)


def baseline_outliers(baseline, candidates, *, alpha: float = 0.01) -> BaselineCheck:
    """Which candidate runs end outside the baseline's range, with a familywise false-alarm level.

    ``baseline`` and ``candidates`` are 1-D arrays of final values (runs). The interval is the
    normal prediction interval for one new run, x̄ ± t_{1−α/(2m), n−1} · s · √(1 + 1/n), at the
    Bonferroni level α/m for m candidates (Hahn & Meeker 1991, *Statistical Intervals*, §4.7,
    simultaneous intervals for m future observations): when the baseline and candidate runs
    come from one normal distribution, the probability that *any* candidate falls outside is at
    most α, however many candidates there are. Non-finite baseline values are dropped (the
    ``diverged`` alert reports them); a non-finite candidate is outside. Needs ≥ 2 finite
    baseline values and ≥ 1 candidate.
    """
    a = _alpha(alpha)
    base = _finite_1d("baseline", baseline)
    cand = _finite_1d("candidates", candidates)
    base = base[np.isfinite(base)]
    if base.size < 2:
        raise ValueError(f"need at least 2 finite baseline values, got {base.size}")
    if cand.size < 1:
        raise ValueError("need at least 1 candidate value")
    n, m = int(base.size), int(cand.size)
    mean, std = float(base.mean()), float(base.std(ddof=1))
    half = t_isf(a / (2 * m), n - 1) * std * np.sqrt(1.0 + 1.0 / n)
    low, high = mean - half, mean + half
    with np.errstate(invalid="ignore"):
        inside = np.isfinite(cand) & (cand >= low) & (cand <= high)
    return BaselineCheck(low=float(low), high=float(high), n_baseline=n, n_candidates=m, alpha=a, per_run_alpha=a / m,
                         outside=tuple(int(i) for i in np.flatnonzero(~inside)), mean=mean, std=std)


def baseline_curve_outliers(baseline, candidates, *, alpha: float = 0.01) -> BaselineCheck:
    """Whole-curve ``baseline_outliers``: which candidate runs' curves leave the baseline's, with a
    familywise false-alarm level valid for autocorrelated steps.

    ``baseline`` (n × T) and ``candidates`` (m × T) share one step grid (NaN where a run has no
    finite value). Each run is reduced to its whole-curve level over the steps where every run
    has a finite value and the runs vary, standardised by the sd over *all* runs (baseline and
    candidates) at each step: ``steady.server.stats.bands.curve_levels``, as ``out_of_band_curves`` does.
    The weights are a symmetric function of every run, so
    healthy runs give exchangeable levels (weights from the baseline alone made its own levels
    too tight: 1.5–2% false alarms at a nominal 1%). Averaging a curve into one number makes the
    step-to-step dependence irrelevant; the levels are then judged by ``baseline_outliers``
    (normal prediction interval, Bonferroni over the m candidates), so a healthy candidate study
    raises a false alarm at most ``alpha`` of the time whatever its size (approximately; the
    calibration harness measures it on AR(1) curves). ``low``/``high`` are on the level scale.
    Raises ValueError when no step is shared and informative.
    """
    base = check_matrix(baseline, name="baseline")
    cand = check_matrix(candidates, name="candidates")
    if base.shape[1] != cand.shape[1]:
        raise ValueError(f"baseline has {base.shape[1]} steps, candidates {cand.shape[1]}: align them first")
    if base.shape[0] < 2 or cand.shape[0] < 1:
        raise ValueError(f"need >= 2 baseline runs and >= 1 candidate, got {base.shape[0]} and {cand.shape[0]}")
    levels, _ = curve_levels(np.vstack([base, cand]))
    if levels is None:
        raise ValueError("no step where every run has a finite value and the runs vary")
    n = base.shape[0]
    return baseline_outliers(levels[:n], levels[n:], alpha=alpha)


@dataclass(frozen=True)
class BandCheck:
    """The seed std of a final metric against a limit."""

    std: float
    lower: float  # one-sided (1 − alpha) lower confidence bound of the true std
    limit: float
    n: int
    alpha: float

    @property
    def firing(self) -> bool:
        return self.lower > self.limit


def band_too_wide(values, *, limit: float, alpha: float = 0.05) -> BandCheck:
    """Is the true seed-to-seed std above ``limit``? One-sided chi-square test of H0: σ ≤ limit.

    Fires when the (1 − α) lower confidence bound s·√((n−1)/χ²_{1−α,n−1}) exceeds the limit
    (normal theory; e.g. NIST/SEMATECH e-Handbook §7.2.3.1): when the true std is at the limit
    or below, the false-alarm probability is at most α. Non-finite values are dropped (the
    ``diverged`` alert reports them). Needs ≥ 2 finite values.
    """
    x = _finite_1d("values", values)
    x = x[np.isfinite(x)]
    if x.size < 2:
        raise ValueError(f"need at least 2 finite values, got {x.size}")
    return band_check(float(x.std(ddof=1)), int(x.size), limit=limit, alpha=alpha)


def band_check_values(values, *, limit: float, alpha: float = 0.05) -> BandCheck:
    """``band_too_wide`` with the lower bound the study report decides ``unstable`` with
    (``steady.server.stats.seed_stability``): from 5 values the smaller of the chi-square bound and
    Bonett's (2006) kurtosis-adjusted one, which stays valid off normality; below 5 the chi-square
    bound. One number per claim: the alert and the report quote the same bound for the same seeds
    (at the same α)."""
    x = _finite_1d("values", values)
    x = x[np.isfinite(x)]
    if x.size < 2:
        raise ValueError(f"need at least 2 finite values, got {x.size}")
    check = band_check(float(x.std(ddof=1)), int(x.size), limit=limit, alpha=alpha)
    if x.size < 5 or check.std == 0.0:
        return check
    robust = bonett_std_bounds(x, alpha=check.alpha)
    return BandCheck(std=check.std, lower=min(check.lower, robust.lower), limit=check.limit, n=check.n,
                     alpha=check.alpha)


def band_check(std: float, n: int, *, limit: float, alpha: float = 0.05) -> BandCheck:
    """``band_too_wide`` from a sample std (ddof=1) of ``n`` values (what the study report carries)."""
    a = _alpha(alpha)
    if not limit > 0:
        raise ValueError(f"limit must be positive, got {limit!r}")
    if int(n) != n or n < 2:
        raise ValueError(f"n must be an integer >= 2, got {n!r}")
    if not np.isfinite(std) or std < 0:
        raise ValueError(f"std must be finite and >= 0, got {std!r}")
    b = std_bounds_from(float(std), int(n), alpha=a)
    return BandCheck(std=float(std), lower=b.lower, limit=float(limit), n=int(n), alpha=a)


def curve_outliers(baseline, candidates, *, alpha: float = 0.01) -> BaselineCheck:
    """``baseline_curve_outliers`` of runs given as ``(steps, values)`` series: the baseline's and
    the candidates' series are aligned on the union of their steps first (NaN where a run has no
    point), so runs logged at different steps are compared on the steps they share. Raises
    ValueError when they cannot be judged (see ``baseline_curve_outliers``)."""
    aligned = align_series({("b", i): s for i, s in enumerate(baseline)}
                           | {("c", i): s for i, s in enumerate(candidates)})
    n = len(baseline)
    return baseline_curve_outliers(aligned.values[:n], aligned.values[n:], alpha=alpha)


@dataclass(frozen=True)
class FinalsCheck:
    """Candidate runs' finals against the baseline's, all read at one common step."""

    step: int | None  # the last step every finite run (baseline and candidates) logged
    baseline: np.ndarray  # the baseline runs' values there (runs without one left out)
    candidates: np.ndarray  # one per candidate run, NaN where it has no finite value there
    check: BaselineCheck | None  # None when fewer than 2 baseline values


def final_outliers(baseline: Sequence[RunData], candidates: Sequence[RunData], metric: str, *,
                   alpha: float = 0.01) -> FinalsCheck:
    """``baseline_outliers`` on final values read at the last step that every non-diverged run,
    baseline and candidate, logged (``steady.server.stats.report.common_finals``): each run's own last step
    made a run that stopped early look off. A diverged candidate (no finite value) is outside.

    Not the report's last-value rule (``last_finals``) on purpose: an alert compares runs with another
    study's, and a candidate cut short (a crash, a smaller budget) read at its own last step is compared with
    baselines at a later point of training and flagged for that alone; at the shared step every run is read at
    one point. A step an MLflow client logged several times reads its latest value here too."""
    fin = common_finals([*baseline, *candidates], metric)
    at = dict(zip(fin.run_ids, fin.values.tolist()))
    base = np.array([at[r.run_id] for r in baseline if r.run_id in at], dtype=np.float64)
    cand = np.array([at.get(r.run_id, np.nan) for r in candidates], dtype=np.float64)
    check = baseline_outliers(base, cand, alpha=alpha) if base.size >= 2 and cand.size else None
    return FinalsCheck(step=fin.step, baseline=base, candidates=cand, check=check)


def study_means(rows: Iterable[tuple[int, str, str, float | None]]) -> dict[tuple[str, str], dict[int, float]]:
    """``(study_id, stack, determinism, final value)`` rows → per (stack, determinism level), each
    study's mean final value over its finite values (None, a metric the run lacks, is skipped): the history ``sequential_shift`` judges."""
    sums: dict[tuple[str, str], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for study_id, stack, determinism, value in rows:
        if isinstance(value, (int, float)) and np.isfinite(value):
            sums[(stack, determinism)][study_id].append(float(value))
    return {group: {s: float(np.mean(v)) for s, v in per_study.items()} for group, per_study in sums.items()}
