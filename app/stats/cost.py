"""Cost of determinism: step-time ratios between determinism levels."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["CostRatio", "cost_ratio"]


@dataclass(frozen=True)
class CostRatio:
    numerator: str
    denominator: str
    ratio: float  # mean over runs of per-run median step time, numerator / denominator
    ci_low: float | None
    ci_high: float | None
    confidence: float
    n_numerator: int
    n_denominator: int
    n_resamples: int
    method: str = "ratio of means of per-run median step times; percentile bootstrap over runs"


def _per_run_medians(runs: Sequence, name: str) -> np.ndarray:
    out = []
    for r in runs:
        a = np.asarray(r, dtype=np.float64)
        if a.ndim != 1:
            raise ValueError(f"{name}: each run's step times must be 1-D, got shape {a.shape}")
        a = a[np.isfinite(a)]
        if a.size:
            out.append(float(np.median(a)))
    if not out:
        raise ValueError(f"{name}: no finite step times")
    return np.array(out)


def cost_ratio(numerator_runs: Sequence, denominator_runs: Sequence, *, rng: np.random.Generator,
               numerator: str = "strict", denominator: str = "none", confidence: float = 0.95,
               n_resamples: int = 2000) -> CostRatio:
    """Ratio of step time between two determinism levels, with a bootstrap CI.

    Each run is summarised by its median step time (robust to warm-up and stragglers); the
    ratio is mean(numerator medians) / mean(denominator medians). The CI is the percentile
    bootstrap (Efron & Tibshirani 1993, ch. 13) resampling runs within each level
    independently, since steps within a run are not independent. With fewer than 2 runs on
    either side the CI is None. ``rng`` is the only source of randomness.
    """
    if not isinstance(rng, np.random.Generator):
        raise ValueError("rng must be a numpy.random.Generator")
    if not (0 < confidence < 1) or n_resamples < 100:
        raise ValueError("confidence must be in (0, 1) and n_resamples >= 100")
    a = _per_run_medians(numerator_runs, numerator)
    b = _per_run_medians(denominator_runs, denominator)
    if b.mean() <= 0:
        raise ValueError(f"{denominator}: mean step time must be > 0")
    ratio = float(a.mean() / b.mean())
    lo = hi = None
    if a.size >= 2 and b.size >= 2:
        ra = a[rng.integers(0, a.size, (n_resamples, a.size))].mean(axis=1)
        rb = b[rng.integers(0, b.size, (n_resamples, b.size))].mean(axis=1)
        boot = ra / rb
        alpha = 1 - confidence
        lo, hi = (float(v) for v in np.quantile(boot, [alpha / 2, 1 - alpha / 2]))
    return CostRatio(numerator=numerator, denominator=denominator, ratio=ratio, ci_low=lo, ci_high=hi,
                     confidence=float(confidence), n_numerator=int(a.size), n_denominator=int(b.size),
                     n_resamples=int(n_resamples))
