"""How many seeds a claim needs."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from app.stats.intervals import normal_tolerance_factor

__all__ = ["seeds_for_difference", "seeds_for_tolerance_halfwidth", "seeds_for_std_claim",
           "seeds_for_equivalence", "MAX_SEEDS"]

MAX_SEEDS = 100_000


def _check(alpha: float, power: float) -> None:
    if not (0 < alpha < 1) or not (0 < power < 1):
        raise ValueError(f"alpha and power must be strictly between 0 and 1, got {alpha!r}, {power!r}")


def _ttest_power(n: int, d: float, alpha: float) -> float:
    df = 2 * n - 2
    nc = d * np.sqrt(n / 2.0)
    tc = stats.t.ppf(1 - alpha / 2, df)
    return float(stats.nct.sf(tc, df, nc) + stats.nct.cdf(-tc, df, nc))


def seeds_for_difference(delta: float, sigma: float, *, alpha: float = 0.05, power: float = 0.8) -> int | None:
    """Seeds per arm for a two-sided two-sample t-test to detect a mean difference δ.

    Exact power from the noncentral t (Cohen 1988, ch. 2): smallest n with
    P(|T'| > t_{1−α/2, 2n−2}) ≥ power, T' ~ nct(2n−2, (δ/σ)√(n/2)). None if > MAX_SEEDS.
    """
    _check(alpha, power)
    if not (delta > 0 and sigma > 0 and np.isfinite(delta) and np.isfinite(sigma)):
        raise ValueError(f"delta and sigma must be finite and > 0, got {delta!r}, {sigma!r}")
    d = delta / sigma
    lo, hi = 2, 2
    while _ttest_power(hi, d, alpha) < power:
        lo, hi = hi, hi * 2
        if hi > MAX_SEEDS:
            return None
    while lo < hi:  # power is increasing in n
        mid = (lo + hi) // 2
        if _ttest_power(mid, d, alpha) >= power:
            hi = mid
        else:
            lo = mid + 1
    return int(hi)


def seeds_for_tolerance_halfwidth(sigma: float, half_width: float, *, coverage: float = 0.9,
                                  confidence: float = 0.95) -> int | None:
    """Smallest n with k(n, p, γ)·σ ≤ half_width (exact two-sided normal tolerance factor).

    Treats σ as known (a planning value); k decreases to z_{(1+p)/2}, so a target below
    z·σ is unreachable and returns None.
    """
    if not (sigma > 0 and half_width > 0):
        raise ValueError(f"sigma and half_width must be > 0, got {sigma!r}, {half_width!r}")
    target = half_width / sigma
    if target <= stats.norm.ppf(0.5 + coverage / 2):
        return None
    k = lambda n: normal_tolerance_factor(n, coverage=coverage, confidence=confidence)  # noqa: E731
    lo, hi = 2, 2
    while k(hi) > target:
        lo, hi = hi, hi * 2
        if hi > MAX_SEEDS:
            return None
    while lo < hi:
        mid = (lo + hi) // 2
        if k(mid) <= target:
            hi = mid
        else:
            lo = mid + 1
    return int(hi)


def seeds_for_std_claim(std: float, max_std: float, *, alpha: float = 0.05) -> int | None:
    """Seeds needed for the chi-square bound of σ to clear ``max_std`` if the sample std stays ``std``.

    If std < max_std: smallest n with s√((n−1)/χ²_{α,n−1}) < max_std (claim "stable");
    if std > max_std: smallest n with s√((n−1)/χ²_{1−α,n−1}) > max_std (claim "unstable");
    None when std == max_std or more than MAX_SEEDS would be needed.
    """
    if not (std >= 0 and max_std > 0):
        raise ValueError(f"std must be >= 0 and max_std > 0, got {std!r}, {max_std!r}")
    if std == max_std:
        return None
    if std == 0:
        return 2
    ratio2 = (max_std / std) ** 2

    def ok(n: int) -> bool:
        df = n - 1
        if std < max_std:
            return df / stats.chi2.ppf(alpha, df) < ratio2
        return df / stats.chi2.ppf(1 - alpha, df) > ratio2

    lo, hi = 2, 2
    while not ok(hi):
        lo, hi = hi, hi * 2
        if hi > MAX_SEEDS:
            return None
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return int(hi)


def _tost_power(n: int, diff: float, sigma: float, margin: float, alpha: float) -> float:
    df = 2 * n - 2
    se = sigma * np.sqrt(2.0 / n)
    tc = stats.t.ppf(1 - alpha, df)
    # Shifted central-t approximation of TOST power (Chow, Shao & Wang 2008, §3.2.3).
    p = stats.t.cdf((margin - diff) / se - tc, df) + stats.t.cdf((margin + diff) / se - tc, df) - 1.0
    return float(max(p, 0.0))


def seeds_for_equivalence(diff: float, sigma: float, margin: float, *, alpha: float = 0.05,
                          power: float = 0.8) -> int | None:
    """Seeds per arm for TOST to show |μ₁ − μ₂| < margin when the true difference is ``diff``.

    Shifted central-t power approximation (Chow, Shao & Wang 2008, *Sample Size Calculations
    in Clinical Research*, §3.2.3). None when |diff| ≥ margin or more than MAX_SEEDS needed.
    """
    _check(alpha, power)
    if not (sigma > 0 and margin > 0):
        raise ValueError(f"sigma and margin must be > 0, got {sigma!r}, {margin!r}")
    if abs(diff) >= margin:
        return None
    lo, hi = 2, 2
    while _tost_power(hi, abs(diff), sigma, margin, alpha) < power:
        lo, hi = hi, hi * 2
        if hi > MAX_SEEDS:
            return None
    while lo < hi:
        mid = (lo + hi) // 2
        if _tost_power(mid, abs(diff), sigma, margin, alpha) >= power:
            hi = mid
        else:
            lo = mid + 1
    return int(hi)
