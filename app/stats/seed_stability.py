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

__all__ = ["SeedSpread", "seed_spread", "spread_decision", "MIN_SEEDS", "KURTOSIS_FLOOR", "divergence_rate_ci"]

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


def seed_spread(final_values, *, max_std: float | None = None, coverage: float = 0.9,
                confidence: float = 0.95, alpha: float = 0.05, n_diverged: int = 0,
                kurtosis_floor: float = KURTOSIS_FLOOR) -> SeedSpread:
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
    * All finite values identical: the spread is exactly 0 and, with n ≥ 5, ``stable`` (exact).
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
    if n_diverged:
        verdict, reason = "unstable", div_reason + f"; std {s:.3g} over the {n} finite seeds"
    elif max_std is None:
        verdict, reason = "inconclusive", f"no max_std limit given; std {s:.3g} over {n} seeds"
    elif db is not None and s == 0.0:
        verdict, reason = "stable", f"all {n} seeds have the identical final value: std exactly 0 < max_std {max_std:g}"
    else:
        planned = seeds_for_std_claim((PLAN_STABLE if s < max_std else PLAN_UNSTABLE) * max_std, max_std,
                                      alpha=alpha)
        needed, plan = planned.n, planned.text
        if db is not None and db.upper < max_std:
            verdict, needed, plan = "stable", None, None
            reason = (f"std {s:.3g} over {n} seeds; upper {1 - alpha:.0%} bound {db.upper:.3g} < max_std {max_std:g}"
                      f" (robust to kurtosis ≤ {kurtosis_floor:g})")
        elif db is not None and db.lower > max_std:
            verdict, needed, plan = "unstable", None, None
            reason = (f"std {s:.3g} over {n} seeds; lower {1 - alpha:.0%} bound {db.lower:.3g} > max_std {max_std:g}"
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
                      n_diverged=n_diverged, divergence_rate_ci=div_ci, plan=plan)


def _decision_bounds(x: np.ndarray, sb: StdBounds, rb: RobustStdBounds, *, alpha: float,
                     kurtosis_floor: float) -> StdBounds:
    """The one-sided bounds the verdict compares with max_std (see ``seed_spread``)."""
    floored = _bonett_upper(x, rb, alpha=alpha, kurtosis_floor=kurtosis_floor) if sb.std > 0 else 0.0
    return StdBounds(n=x.size, std=sb.std, lower=min(sb.lower, rb.lower), upper=max(sb.upper, floored),
                     alpha=sb.alpha)


def spread_decision(final_values, *, max_std: float, alpha: float = 0.05,
                    kurtosis_floor: float = KURTOSIS_FLOOR) -> tuple[str, StdBounds | None]:
    """Only the verdict of ``seed_spread`` and its decision bounds, for finite values and a limit
    (no intervals, no planning): what the sequential rule applies at each stage."""
    x = np.asarray(final_values, dtype=np.float64)
    if x.ndim != 1 or not np.all(np.isfinite(x)):
        raise ValueError("final_values must be 1-D and finite")
    if x.size < MIN_SEEDS:
        return "inconclusive", None
    sb = std_confidence_bounds(x, alpha=alpha)
    db = _decision_bounds(x, sb, bonett_std_bounds(x, alpha=alpha), alpha=alpha, kurtosis_floor=kurtosis_floor)
    if sb.std == 0.0 or db.upper < max_std:
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
