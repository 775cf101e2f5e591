"""Seed stability: is the final metric's spread over seeds within the user's limit?"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import scipy

from steady.server.stats.intervals import (MeanCI, OrderStatisticTolerance, PredictionInterval, RobustStdBounds, StdBounds,
                                 ToleranceInterval, bonett_std_bounds, mean_ci, normal_tolerance_interval,
                                 order_statistic_tolerance, prediction_interval, std_confidence_bounds)
from steady.server.stats.planning import INDISTINGUISHABLE, seeds_for_std_claim
from steady.server.stats.quantiles import norm_ppf

__all__ = ["SeedSpread", "seed_spread", "spread_decision", "MIN_SEEDS", "KURTOSIS_FLOOR", "divergence_rate_ci",
           "lattice_step", "tie_decision", "TieDecision", "metric_resolution"]

MIN_SEEDS = 5
KURTOSIS_FLOOR = 9.0  # the "stable" bound assumes the final value's kurtosis is at most this (t5: 9)
# The alternatives "seeds needed" is planned for: σ = 0.8·max_std to show "stable" (when the
# estimate is below the limit), σ = 1.25·max_std to show "unstable" (when it is at or above).
PLAN_STABLE, PLAN_UNSTABLE = 0.8, 1.25


def divergence_rate_ci(k: int, n: int, *, confidence: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper–Pearson 1934) two-sided CI of a divergence rate, k diverged seeds of n."""
    a = 1.0 - confidence
    low = 0.0 if k == 0 else float(scipy.stats.beta.ppf(a / 2, k, n - k + 1))
    high = 1.0 if k == n else float(scipy.stats.beta.ppf(1 - a / 2, k + 1, n - k))
    return low, high


@dataclass(frozen=True)
class SeedSpread:
    verdict: str  # stable | unstable | inconclusive
    reason: str
    n: int
    mean: float | None
    std: float | None
    min: float | None
    max: float | None
    max_std: float | None
    std_bounds: StdBounds | None
    mean_ci: MeanCI | None
    tolerance: ToleranceInterval | None
    order_statistic: OrderStatisticTolerance
    prediction: PredictionInterval | None
    n_needed: int | None  # seeds the claim would need when inconclusive (None: unknown/unreachable)
    robust_bounds: RobustStdBounds | None = None  # Bonett (2006) bounds behind the verdict
    decision_bounds: StdBounds | None = None  # the one-sided bounds the verdict compared with max_std
    n_diverged: int = 0  # seeds whose run diverged (non-finite); they count against stability
    divergence_rate_ci: tuple | None = None  # 95% Clopper–Pearson CI of the divergence rate
    plan: str | None = None  # the alternative n_needed is planned for, in words
    resolution: float | None = None  # the resolution a tie was judged at (declared or the values' lattice step)
    tied: bool = False  # every finite final value is the same: the spread is judged at ``resolution``


def seed_spread(final_values, *, max_std: float | None = None, coverage: float = 0.9,
                confidence: float = 0.95, alpha: float = 0.05, n_diverged: int = 0,
                kurtosis_floor: float = KURTOSIS_FLOOR, resolution: float | None = None) -> SeedSpread:
    """Judge the spread of a final metric over seeds (one finite value per seed).

    Rule (level α for each one-sided claim, calibrated in ``steady.server.stats.calibration``):

    * Diverged seeds (``n_diverged`` > 0, runs whose metric turned non-finite) count against
      stability: the verdict is ``unstable`` — a healthy training never diverges, so this claim
      is exact (it cannot fire on a study without divergences); the rate and its exact CI are given.
    * With n ≥ 5 finite seeds and a limit ``max_std``: ``unstable`` when the one-sided (1 − α)
      lower bound of σ is above max_std, the lower bound being the smaller of the chi-square
      bound and Bonett's (2006) kurtosis-adjusted bound — valid off normality (t, lognormal,
      contaminated final values), where the chi-square bound alone is not;
      ``stable`` when the one-sided (1 − α) upper bound is below max_std: Bonett's bound with
      the kurtosis estimate floored at ``kurtosis_floor`` (default 9, the kurtosis of t5), the
      larger of that and the chi-square bound. Kurtosis estimates from a few seeds are biased
      low, so without the floor a heavy-tailed population looks stable too often; with it the
      claim holds for any population with kurtosis ≤ the floor (normal, t5, lognormal log-sd
      0.5, 10% contaminated), not for heavier tails (t3). Else ``inconclusive`` with the seeds
      needed (``seeds_for_std_claim`` at power 80%, a normal-theory planning value for
      σ = 0.8·max_std when the estimate is below the limit and 1.25·max_std otherwise; the
      reason states the alternative, and says "indistinguishable from the limit at this
      precision" when the bounds straddle the limit).
    * All finite values identical (a tie): a quantized metric (accuracy over a finite evaluation
      set, a value printed with few decimals) ties often although its σ is at the limit, so a
      tie is judged at the metric's resolution q (``resolution``: declared, or the step of the
      lattice the values lie on, ``lattice_step``): ``stable`` only when the smallest spread q
      could show — one seed one step off — still has its upper bound below max_std
      (``tie_decision``); a tie at an unknown resolution, or one coarser than that, is no
      evidence of stability (``inconclusive``, the reason says so).
    * Below 5 seeds: ``inconclusive``. Without a limit no claim is made: ``inconclusive`` with
      reason "no max_std limit given" and all the numbers.

    Intervals: t CI of the mean, exact normal tolerance interval, order-statistic (min..max)
    tolerance interval, normal prediction interval for one new seed.
    """
    x = np.asarray(final_values, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"final_values must be 1-D (one value per seed), got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("final_values contain NaN or Inf; exclude diverged runs first (pass n_diverged)")
    if max_std is not None and not (max_std > 0 and np.isfinite(max_std)):
        raise ValueError(f"max_std must be finite and > 0, got {max_std!r}")
    if int(n_diverged) != n_diverged or n_diverged < 0:
        raise ValueError(f"n_diverged must be a non-negative integer, got {n_diverged!r}")
    if not kurtosis_floor >= 1.0:
        raise ValueError(f"kurtosis_floor must be >= 1, got {kurtosis_floor!r}")
    _check_resolution(resolution)
    n_diverged = int(n_diverged)
    n = x.size
    total = n + n_diverged
    div_ci = divergence_rate_ci(n_diverged, total) if total else None
    div_reason = (f"{n_diverged} of {total} seeds diverged (rate {n_diverged / total:.0%}, 95% CI "
                  f"{div_ci[0]:.0%}–{div_ci[1]:.0%}): diverged seeds count against stability"
                  ) if n_diverged and div_ci else ""
    osti = order_statistic_tolerance(n, coverage=coverage, confidence=confidence)
    if n < 2:
        verdict = "unstable" if n_diverged else "inconclusive"
        reason = div_reason or f"{n} seed(s): need at least {MIN_SEEDS}"
        return SeedSpread(verdict, reason, n,
                          float(x[0]) if n else None, None, float(x.min()) if n else None,
                          float(x.max()) if n else None, max_std, None, None, None, osti, None,
                          None if n_diverged else MIN_SEEDS, n_diverged=n_diverged, divergence_rate_ci=div_ci)
    sb = std_confidence_bounds(x, alpha=alpha)
    s = sb.std
    rb = bonett_std_bounds(x, alpha=alpha) if n >= MIN_SEEDS else None
    db = _decision_bounds(x, sb, rb, alpha=alpha, kurtosis_floor=kurtosis_floor) if rb is not None else None
    needed = plan = None
    tied, tie_q = False, resolution
    if n_diverged:
        verdict, reason = "unstable", div_reason + f"; std {s:.3g} over the {n} finite seeds"
    elif max_std is None:
        verdict, reason = "inconclusive", f"no max_std limit given; std {s:.3g} over {n} seeds"
    elif db is not None and s == 0.0:
        tie = tie_decision(x, max_std=max_std, alpha=alpha, kurtosis_floor=kurtosis_floor, resolution=resolution)
        verdict, reason, db, needed = tie.verdict, tie.reason, tie.bounds or db, tie.n_needed
        tied, tie_q = True, tie.resolution
        plan = None if verdict == "stable" else tie.plan
    else:
        planned = seeds_for_std_claim((PLAN_STABLE if s < max_std else PLAN_UNSTABLE) * max_std, max_std,
                                      alpha=alpha)
        needed, plan = planned.n, planned.text
        if db is not None and db.upper < max_std:
            verdict, needed, plan = "stable", None, None
            reason = (f"std {s:.3g} over {n} seeds; upper {(1 - alpha) * 100:.3g}% bound {db.upper:.3g} < max_std {max_std:g}"
                      f" (robust to kurtosis ≤ {kurtosis_floor:g})")
        elif db is not None and db.lower > max_std:
            verdict, needed, plan = "unstable", None, None
            reason = (f"std {s:.3g} over {n} seeds; lower {(1 - alpha) * 100:.3g}% bound {db.lower:.3g} > max_std {max_std:g}"
                      " (robust to non-normal values)")
        else:
            if n < MIN_SEEDS:
                needed = max(MIN_SEEDS, needed) if needed is not None else None
            verdict = "inconclusive"
            why = f"only {n} seeds (minimum {MIN_SEEDS})" if db is None else (
                f"std {s:.3g} bounds [{db.lower:.3g}, {db.upper:.3g}] straddle max_std {max_std:g}: "
                f"{INDISTINGUISHABLE}")
            reason = f"{why}; {plan}"
    return SeedSpread(verdict, reason, n, float(x.mean()), s, float(x.min()), float(x.max()), max_std, sb,
                      mean_ci(x, confidence=confidence),
                      normal_tolerance_interval(x, coverage=coverage, confidence=confidence), osti,
                      prediction_interval(x, confidence=confidence), needed, robust_bounds=rb, decision_bounds=db,
                      n_diverged=n_diverged, divergence_rate_ci=div_ci, plan=plan, resolution=tie_q, tied=tied)


def _decision_bounds(x: np.ndarray, sb: StdBounds, rb: RobustStdBounds, *, alpha: float,
                     kurtosis_floor: float) -> StdBounds:
    """The one-sided bounds the verdict compares with max_std (see ``seed_spread``)."""
    floored = _bonett_upper(x, rb, alpha=alpha, kurtosis_floor=kurtosis_floor) if sb.std > 0 else 0.0
    return StdBounds(n=x.size, std=sb.std, lower=min(sb.lower, rb.lower), upper=max(sb.upper, floored),
                     alpha=sb.alpha)


def spread_decision(final_values, *, max_std: float, alpha: float = 0.05,
                    kurtosis_floor: float = KURTOSIS_FLOOR,
                    resolution: float | None = None) -> tuple[str, StdBounds | None]:
    """Only the verdict of ``seed_spread`` and its decision bounds, for finite values and a limit
    (no intervals, no planning): what the sequential rule applies at each stage. A tie is judged
    at ``resolution`` as ``seed_spread`` judges it (``tie_decision``)."""
    x = np.asarray(final_values, dtype=np.float64)
    if x.ndim != 1 or not np.all(np.isfinite(x)):
        raise ValueError("final_values must be 1-D and finite")
    _check_resolution(resolution)
    if x.size < MIN_SEEDS:
        return "inconclusive", None
    sb = std_confidence_bounds(x, alpha=alpha)
    if sb.std == 0.0:
        tie = tie_decision(x, max_std=max_std, alpha=alpha, kurtosis_floor=kurtosis_floor, resolution=resolution,
                           plan=False)
        return tie.verdict, tie.bounds
    db = _decision_bounds(x, sb, bonett_std_bounds(x, alpha=alpha), alpha=alpha, kurtosis_floor=kurtosis_floor)
    if db.upper < max_std:
        return "stable", db
    if db.lower > max_std:
        return "unstable", db
    return "inconclusive", db


def _bonett_upper(x: np.ndarray, rb: RobustStdBounds, *, alpha: float, kurtosis_floor: float) -> float:
    """Bonett's (2006) one-sided upper bound of σ with the kurtosis estimate floored at ``kurtosis_floor``;
    ``rb`` is ``bonett_std_bounds(x, alpha=alpha)`` (the caller has it already)."""
    n = x.size
    z = norm_ppf(1.0 - alpha)
    c = n / (n - z)
    g = max(rb.kurtosis, kurtosis_floor)
    se = c * np.sqrt(max(g - (n - 3.0) / n, 0.0) / (n - 1.0))
    return float(np.sqrt(np.exp(np.log(c * rb.std * rb.std) + z * se)))


def _check_resolution(resolution) -> None:
    if resolution is not None and not (resolution > 0 and np.isfinite(resolution)):
        raise ValueError(f"resolution must be finite and > 0, got {resolution!r}")


# A lattice a + k·q is inferred only where the values span at most this many steps (beyond it they are
# effectively continuous: binary floats) and fit it to this share of a step (float32 values of k/N fit k/N).
_LATTICE_MAX_STEPS = 1e6
_LATTICE_TOL = 1e-3
_LATTICE_DIVISORS = 12


def lattice_step(values) -> float | None:
    """The resolution the values show: the largest q such that every finite value is a + k·q for an
    integer k (within 1/1000 of a step), or None when they show none (fewer than two distinct values,
    or no such q within 10⁶ steps of their range: continuous values).

    q is the smallest gap between distinct values divided by the smallest m ≤ 12 that fits, so it is
    never finer than the data show: accuracy over N examples gives 1/N once two values differ by one
    example (a coarser q when they do not: conservative for the tie rule, which then asks more),
    values printed with two decimals give 0.01 or a multiple of it."""
    v = np.asarray(values, dtype=np.float64).ravel()
    v = np.unique(v[np.isfinite(v)])
    if v.size < 2:
        return None
    g = float(np.min(np.diff(v)))
    if g <= 0:
        return None
    r = (v - v[0]) / g
    if r[-1] > _LATTICE_MAX_STEPS:
        return None
    for m in range(1, _LATTICE_DIVISORS + 1):
        rm = r * m
        if np.all(np.abs(rm - np.round(rm)) <= _LATTICE_TOL):
            return g / m
    return None


@dataclass(frozen=True)
class TieDecision:
    verdict: str  # stable | inconclusive
    reason: str
    resolution: float | None
    bounds: StdBounds | None  # the bounds of the one-step-off sample (None: resolution unknown)
    n_needed: int | None = None  # tied seeds that would make the one-step-off bound clear max_std (None: never)
    plan: str | None = None


_MAX_PLANNED_TIES = 1000


def tie_decision(final_values, *, max_std: float, alpha: float = 0.05, kurtosis_floor: float = KURTOSIS_FLOOR,
                 resolution: float | None = None, plan: bool = True) -> TieDecision:
    """Seed stability of n ≥ 5 final values that all tie, judged at the metric's resolution.

    A quantized metric (accuracy over a few hundred examples, a value printed with two decimals)
    ties often though its σ is at the limit: 5 seeds of an accuracy over 300 examples with
    Poisson(0.3) errors each (σ = max_std) all tie 22% of the time. A tie says only that the
    spread is below what the resolution q can show, so it is judged as the smallest spread q can
    show: one seed one step off (n − 1 values equal, one q away, std q/√n). ``stable`` when that
    sample's decision upper bound (``seed_spread``'s: robust to kurtosis ≤ the floor) is below
    max_std, else ``inconclusive``. Exact computation over Poisson and binomial error counts
    (tests/stats/test_quantized_seed_stability.py) shows a false ``stable`` ≤ α with it.

    ``resolution`` None: the resolution is the values' lattice step (``lattice_step``), unknown
    for values that all tie; at an unknown resolution a tie is no evidence of stability.
    ``plan``: compute how many tied seeds would suffice (``n_needed``)."""
    x = np.asarray(final_values, dtype=np.float64)
    n = x.size
    value = f"{float(x[0]):.6g}"
    q = resolution if resolution is not None else lattice_step(x)
    if q is None:
        return TieDecision("inconclusive",
                           f"all {n} seeds end on the same value {value} and the metric's resolution is unknown: a tie "
                           "is no evidence of stability, since the spread below the resolution is not seen (declare "
                           "the metric's resolution, e.g. 1/N for accuracy over N examples)", None, None, None,
                           "declare the metric's resolution to judge a tie")
    bounds = _one_step_off_bounds(n, q, alpha=alpha, kurtosis_floor=kurtosis_floor)
    head = (f"all {n} seeds end on the same value {value} at resolution {q:.3g}; the smallest spread that "
            f"resolution can show, one seed one step off (std {bounds.std:.3g}), has upper {(1 - alpha) * 100:.3g}% bound "
            f"{bounds.upper:.3g}")
    if bounds.upper < max_std:
        return TieDecision("stable", f"{head} < max_std {max_std:g}", q, bounds)
    needed = _ties_needed(n, q, max_std, alpha=alpha, kurtosis_floor=kurtosis_floor) if plan else None
    more = (f"{needed} tied seeds would show it" if needed is not None else
            f"no number of tied seeds shows it at this resolution (up to {_MAX_PLANNED_TIES})")
    return TieDecision("inconclusive",
                       f"{head} ≥ max_std {max_std:g}: a tie at this resolution is no evidence of stability; {more}",
                       q, bounds, needed, more)


def _one_step_off_bounds(n: int, q: float, *, alpha: float, kurtosis_floor: float) -> StdBounds:
    y = np.zeros(n)
    y[0] = q
    sb = std_confidence_bounds(y, alpha=alpha)
    return _decision_bounds(y, sb, bonett_std_bounds(y, alpha=alpha), alpha=alpha, kurtosis_floor=kurtosis_floor)


def _ties_needed(n: int, q: float, max_std: float, *, alpha: float, kurtosis_floor: float) -> int | None:
    """The fewest tied seeds (> n) whose one-step-off upper bound is below max_std (it falls about as q/√n)."""
    def ok(m: int) -> bool:
        return _one_step_off_bounds(m, q, alpha=alpha, kurtosis_floor=kurtosis_floor).upper < max_std

    hi = n + 1
    while not ok(hi):
        if hi >= _MAX_PLANNED_TIES:
            return None
        hi = min(2 * hi, _MAX_PLANNED_TIES)
    lo = max(n, hi // 2)  # not ok at lo (or lo == n)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


_LATTICE_TAIL = 1000  # the values of each run the lattice is inferred from: its last ones (the final value's neighbours)


def metric_resolution(declared: float | None, printed, curves) -> float | None:
    """The resolution a tie of final values is judged at: the coarsest of what is known — the
    resolution the spec declares, the last printed digit of values parsed from text (``printed``,
    one per run, None for binary values), and the step of the lattice the runs' values lie on
    (``curves``: each run's values; their last ``_LATTICE_TAIL`` are used). None when nothing
    shows one (binary floats that are not on a lattice)."""
    known = [float(q) for q in (declared, *printed) if q is not None and q > 0 and np.isfinite(q)]
    tails = [np.asarray(c, dtype=np.float64)[-_LATTICE_TAIL:] for c in curves]
    step = lattice_step(np.concatenate(tails)) if tails else None
    if step is not None:
        known.append(step)
    return max(known) if known else None
