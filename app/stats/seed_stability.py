"""Seed stability: is the final metric's spread over seeds within the user's limit?"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.stats.intervals import (MeanCI, OrderStatisticTolerance, PredictionInterval, StdBounds,
                                 ToleranceInterval, mean_ci, normal_tolerance_interval,
                                 order_statistic_tolerance, prediction_interval, std_confidence_bounds)
from app.stats.planning import INDISTINGUISHABLE, seeds_for_std_claim

__all__ = ["SeedSpread", "seed_spread", "MIN_SEEDS"]

MIN_SEEDS = 5
# The alternatives "seeds needed" is planned for: σ = 0.8·max_std to show "stable" (when the
# estimate is below the limit), σ = 1.25·max_std to show "unstable" (when it is at or above).
PLAN_STABLE, PLAN_UNSTABLE = 0.8, 1.25


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
    plan: str | None = None  # the alternative n_needed is planned for, in words


def seed_spread(final_values, *, max_std: float | None = None, coverage: float = 0.9,
                confidence: float = 0.95, alpha: float = 0.05) -> SeedSpread:
    """Judge the spread of a final metric over seeds (one finite value per seed).

    Rule: with n ≥ 5 seeds and a limit ``max_std``, ``stable`` when the one-sided (1 − α)
    chi-square upper confidence bound of σ is below max_std, ``unstable`` when the lower bound
    is above it, else ``inconclusive`` with the seeds needed (``seeds_for_std_claim`` at power
    80%, planned for σ = 0.8·max_std when the estimate is below the limit and 1.25·max_std
    otherwise; the reason states the alternative, and says "indistinguishable from the limit at
    this precision" when the chi-square bounds straddle the limit). Below 5 seeds:
    ``inconclusive``. Without a limit no claim is made: ``inconclusive`` with reason "no max_std limit given" and all the numbers.
    Intervals: t CI of the mean, exact normal tolerance interval, order-statistic (min..max)
    tolerance interval, normal prediction interval for one new seed.
    """
    x = np.asarray(final_values, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"final_values must be 1-D (one value per seed), got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("final_values contain NaN or Inf; exclude diverged runs first")
    if max_std is not None and not (max_std > 0 and np.isfinite(max_std)):
        raise ValueError(f"max_std must be finite and > 0, got {max_std!r}")
    n = x.size
    osti = order_statistic_tolerance(n, coverage=coverage, confidence=confidence)
    if n < 2:
        return SeedSpread("inconclusive", f"{n} seed(s): need at least {MIN_SEEDS}", n,
                          float(x[0]) if n else None, None, float(x.min()) if n else None,
                          float(x.max()) if n else None, max_std, None, None, None, osti, None, MIN_SEEDS)
    sb = std_confidence_bounds(x, alpha=alpha)
    s = sb.std
    needed = plan = None
    if max_std is None:
        verdict, reason = "inconclusive", f"no max_std limit given; std {s:.3g} over {n} seeds"
    else:
        planned = seeds_for_std_claim((PLAN_STABLE if s < max_std else PLAN_UNSTABLE) * max_std, max_std,
                                      alpha=alpha)
        needed, plan = planned.n, planned.text
        if n >= MIN_SEEDS and sb.upper < max_std:
            verdict, needed, plan = "stable", None, None
            reason = f"std {s:.3g} over {n} seeds; upper {1 - alpha:.0%} bound {sb.upper:.3g} < max_std {max_std:g}"
        elif n >= MIN_SEEDS and sb.lower > max_std:
            verdict, needed, plan = "unstable", None, None
            reason = f"std {s:.3g} over {n} seeds; lower {1 - alpha:.0%} bound {sb.lower:.3g} > max_std {max_std:g}"
        else:
            if n < MIN_SEEDS:
                needed = max(MIN_SEEDS, needed) if needed is not None else None
            verdict = "inconclusive"
            why = f"only {n} seeds (minimum {MIN_SEEDS})" if n < MIN_SEEDS else (
                f"std {s:.3g} bounds [{sb.lower:.3g}, {sb.upper:.3g}] straddle max_std {max_std:g}: "
                f"{INDISTINGUISHABLE}")
            reason = f"{why}; {plan}"
    return SeedSpread(verdict, reason, n, float(x.mean()), s, float(x.min()), float(x.max()), max_std, sb,
                      mean_ci(x, confidence=confidence),
                      normal_tolerance_interval(x, coverage=coverage, confidence=confidence), osti,
                      prediction_interval(x, confidence=confidence), needed, plan)
