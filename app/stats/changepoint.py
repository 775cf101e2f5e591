"""Shift detection in a sequence: has a suite's history of a final metric changed level?

One study of a suite gives one number (e.g. the mean final loss over its seeds); the
sequence of those numbers, oldest first, is tested for a single change of mean.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["ShiftResult", "detect_shift", "DIRECTIONS"]

DIRECTIONS = ("both", "increase", "decrease")


@dataclass(frozen=True)
class ShiftResult:
    detected: bool
    index: int | None  # 0-based index of the first value of the new level (the most likely change)
    p_value: float | None
    statistic: float | None
    alpha: float
    n: int
    mean_before: float | None
    mean_after: float | None
    std: float | None
    n_permutations: int
    direction: str
    reason: str


def _cusum_stats(x: np.ndarray, direction: str) -> np.ndarray:
    """Standardised CUSUM statistic per candidate change point, for each row of ``x`` (rows × n).

    For a change before index k (k = 1 … n−1): (k·x̄ − S_k) / sqrt(k (n−k) / n), where S_k is the
    sum of the first k values; positive when the values after k are larger. This is the
    likelihood-ratio statistic for one change of mean in Gaussian data with known variance,
    up to the common scale (Hinkley 1970; Csörgő & Horváth 1997, §1.4).
    """
    n = x.shape[-1]
    k = np.arange(1, n, dtype=np.float64)
    s = np.cumsum(x, axis=-1)[..., :-1]
    total = x.sum(axis=-1, keepdims=True)
    t = (k * total / n - s) / np.sqrt(k * (n - k) / n)
    if direction == "increase":
        return t
    if direction == "decrease":
        return -t
    return np.abs(t)


def detect_shift(values, *, rng: np.random.Generator, alpha: float = 0.01, n_permutations: int = 999,
                 min_history: int = 5, direction: str = "both") -> ShiftResult:
    """Test a sequence for one change of mean: a permutation test of the maximal CUSUM statistic.

    ``values`` is 1-D, oldest first, finite. The statistic is the maximum over change points of
    the standardised CUSUM (see ``_cusum_stats``); its null distribution is taken from
    ``n_permutations`` random permutations of the sequence, so under exchangeability (no
    change, no trend) the false-alarm probability is at most ``alpha`` whatever the
    distribution of the values (permutation test, Antoch & Hušková 2001). The p-value is
    (1 + #{T* ≥ T}) / (1 + B). The detected change is the argmax: ``index`` is the first value
    after the change. Fewer than ``min_history`` values: no test (``detected`` False).
    ``direction`` restricts to ``increase`` or ``decrease`` of the level (one-sided).
    ``rng`` is the only source of randomness.
    """
    if not isinstance(rng, np.random.Generator):
        raise ValueError("rng must be a numpy.random.Generator")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be strictly between 0 and 1, got {alpha!r}")
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if int(n_permutations) != n_permutations or n_permutations < 99:
        raise ValueError(f"n_permutations must be an integer >= 99, got {n_permutations!r}")
    if int(min_history) != min_history or min_history < 3:
        raise ValueError(f"min_history must be an integer >= 3, got {min_history!r}")
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"values must be 1-D (one value per study, oldest first), got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("values must be finite")
    n = int(x.size)
    base = dict(alpha=float(alpha), n=n, n_permutations=int(n_permutations), direction=direction)
    if n < min_history:
        return ShiftResult(False, None, None, None, mean_before=None, mean_after=None,
                           std=float(x.std(ddof=1)) if n > 1 else None,
                           reason=f"{n} value(s) in the history; need at least {min_history}", **base)
    std = float(x.std(ddof=1))
    if std == 0.0:
        return ShiftResult(False, None, 1.0, 0.0, mean_before=float(x[0]), mean_after=float(x[0]), std=0.0,
                           reason=f"all {n} values are equal", **base)
    obs = _cusum_stats(x, direction)
    k = int(np.argmax(obs)) + 1
    t_obs = float(obs[k - 1])
    perms = rng.permuted(np.broadcast_to(x, (int(n_permutations), n)), axis=1)
    t_null = _cusum_stats(perms, direction).max(axis=1)
    # a relative tolerance so that permutations equal to the observed order count as ties
    exceed = int(np.count_nonzero(t_null >= t_obs * (1 - 1e-12)))
    p = (1 + exceed) / (1 + int(n_permutations))
    before, after = float(x[:k].mean()), float(x[k:].mean())
    detected = p <= alpha
    reason = (f"{'shift' if detected else 'no significant shift'}: mean {before:.4g} over {k} value(s), then "
              f"{after:.4g} over {n - k} from index {k}; permutation p={p:.3g} "
              f"({'≤' if detected else '>'} α={alpha:g}, {int(n_permutations)} permutations)")
    return ShiftResult(detected, k, p, t_obs, mean_before=before, mean_after=after, std=std, reason=reason, **base)
