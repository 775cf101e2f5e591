"""Variance decomposition: between-seed vs within-seed (nondeterminism)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["VarianceComponents", "variance_components"]


@dataclass(frozen=True)
class VarianceComponents:
    n_groups: int
    n_total: int
    group_sizes: tuple
    n0: float  # effective group size used for the between component
    ms_between: float
    ms_within: float
    between: float  # σ²_seed (truncated at 0)
    within: float  # σ²_repeat (nondeterminism)
    share_between: float
    share_within: float
    method: str = "anova"


def variance_components(groups: Sequence) -> VarianceComponents:
    """One-way random-effects ANOVA (method of moments) with seed as the group.

    Model y_ij = μ + a_i + e_ij, a_i ~ (0, σ²_b), e_ij ~ (0, σ²_w). Unbalanced groups use the
    classical ANOVA estimator (Searle, Casella & McCulloch 1992, *Variance Components*, §3.5):
    σ̂²_w = MSW, σ̂²_b = max(0, (MSB − MSW)/n₀), n₀ = (N − Σnᵢ²/N)/(a − 1).
    For balanced data it equals REML when σ̂²_b > 0. Groups must be finite 1-D arrays; groups
    of size 1 contribute to the between part only. Needs ≥ 2 groups and N > a.
    """
    gs = [np.asarray(g, dtype=np.float64) for g in groups]
    if any(g.ndim != 1 or g.size == 0 for g in gs):
        raise ValueError("each group must be a non-empty 1-D array")
    if any(not np.all(np.isfinite(g)) for g in gs):
        raise ValueError("groups contain NaN or Inf; drop diverged runs first")
    a = len(gs)
    sizes = np.array([g.size for g in gs], dtype=np.float64)
    total = float(sizes.sum())
    if a < 2 or total <= a:
        raise ValueError(f"need at least 2 groups and some group with 2+ values (groups={a}, values={int(total)})")
    means = np.array([g.mean() for g in gs])
    grand = float(np.concatenate(gs).mean())
    ssb = float(np.sum(sizes * (means - grand) ** 2))
    ssw = float(sum(np.sum((g - m) ** 2) for g, m in zip(gs, means)))
    msb, msw = ssb / (a - 1), ssw / (total - a)
    n0 = (total - np.sum(sizes**2) / total) / (a - 1)
    between = max(0.0, (msb - msw) / n0)
    tot = between + msw
    sb = between / tot if tot > 0 else float("nan")
    return VarianceComponents(n_groups=a, n_total=int(total), group_sizes=tuple(int(s) for s in sizes),
                              n0=float(n0), ms_between=msb, ms_within=msw, between=between, within=msw,
                              share_between=sb, share_within=(1.0 - sb) if tot > 0 else float("nan"))
