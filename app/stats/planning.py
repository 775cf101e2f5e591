"""How many seeds a claim needs, and for which alternative.

Every answer is planned for a stated alternative (the true value the study is sized to detect),
never for the observed estimate taken as the truth: an estimate near the limit would make the
answer explode. ``SeedPlan.text`` says it in one line, e.g. "to show σ < 0.5 when the true σ is
0.4 (0.8·max_std): ~42 seeds (power 80%)". Searches find any answer up to ``MAX_SEEDS``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import scipy

from steady.server.stats.intervals import normal_tolerance_factor
from steady.server.stats.quantiles import chi2_ppf, t_ppf

__all__ = ["seeds_for_difference", "seeds_for_tolerance_halfwidth", "seeds_for_std_claim",
           "seeds_for_equivalence", "SeedPlan", "MAX_SEEDS", "INDISTINGUISHABLE"]

MAX_SEEDS = 100_000
INDISTINGUISHABLE = "indistinguishable from the limit at this precision"


@dataclass(frozen=True)
class SeedPlan:
    """Seeds a claim needs under a stated alternative. ``n`` is None when more than MAX_SEEDS."""

    n: int | None
    claim: str  # what the study would show, e.g. "σ < 0.5"
    alternative: str  # the truth it is planned for, e.g. "the true σ is 0.4 (0.8·max_std)"
    power: float
    unit: str  # "seeds" | "seeds per stack"
    text: str


def _plan(n: int | None, claim: str, alternative: str, power: float, unit: str) -> SeedPlan:
    count = f"~{n} {unit}" if n is not None else f"more than {MAX_SEEDS} {unit}"
    return SeedPlan(n=n, claim=claim, alternative=alternative, power=float(power), unit=unit,
                    text=f"to show {claim} when {alternative}: {count} (power {power:.0%})")


def _smallest_n(ok: Callable[[int], bool], lo: int = 2) -> int | None:
    """Smallest n in [lo, MAX_SEEDS] with ok(n), for ok monotone in n; None if ok(MAX_SEEDS) is False.

    Doubling, capped at MAX_SEEDS (so answers between the last power of two and the cap are
    found), then bisection."""
    if ok(lo):
        return lo
    below = lo  # ok(below) is False
    while True:
        above = min(below * 2, MAX_SEEDS)
        if ok(above):
            break
        if above >= MAX_SEEDS:
            return None
        below = above
    while above - below > 1:
        mid = (below + above) // 2
        if ok(mid):
            above = mid
        else:
            below = mid
    return int(above)


def _check(alpha: float, power: float) -> None:
    if not (0 < alpha < 1) or not (0 < power < 1):
        raise ValueError(f"alpha and power must be strictly between 0 and 1, got {alpha!r}, {power!r}")


def _ttest_power(n: int, d: float, alpha: float) -> float:
    df = 2 * n - 2
    nc = d * np.sqrt(n / 2.0)
    tc = t_ppf(1 - alpha / 2, df)
    return float(scipy.stats.nct.sf(tc, df, nc) + scipy.stats.nct.cdf(-tc, df, nc))


def seeds_for_difference(delta: float, sigma: float, *, alpha: float = 0.05, power: float = 0.8) -> int | None:
    """Seeds per arm for a two-sided two-sample t-test to detect a mean difference δ.

    Exact power from the noncentral t (Cohen 1988, ch. 2): smallest n with
    P(|T'| > t_{1−α/2, 2n−2}) ≥ power, T' ~ nct(2n−2, (δ/σ)√(n/2)). None if > MAX_SEEDS.
    """
    _check(alpha, power)
    if not (delta > 0 and sigma > 0 and np.isfinite(delta) and np.isfinite(sigma)):
        raise ValueError(f"delta and sigma must be finite and > 0, got {delta!r}, {sigma!r}")
    d = delta / sigma
    return _smallest_n(lambda n: _ttest_power(n, d, alpha) >= power)


def seeds_for_tolerance_halfwidth(sigma: float, half_width: float, *, coverage: float = 0.9,
                                  confidence: float = 0.95) -> int | None:
    """Smallest n with k(n, p, γ)·σ ≤ half_width (exact two-sided normal tolerance factor).

    Treats σ as known (a planning value); k decreases to z_{(1+p)/2}, so a target below
    z·σ is unreachable and returns None.
    """
    if not (sigma > 0 and half_width > 0):
        raise ValueError(f"sigma and half_width must be > 0, got {sigma!r}, {half_width!r}")
    target = half_width / sigma
    if target <= scipy.stats.norm.ppf(0.5 + coverage / 2):
        return None
    return _smallest_n(lambda n: normal_tolerance_factor(n, coverage=coverage, confidence=confidence) <= target)


def _std_claim_power(n: int, r2: float, alpha: float, stable: bool) -> float:
    """Exact power of the one-sided chi-square bound of σ (Neyman & Pearson; e.g. Desu & Raghavarao
    1990, *Sample Size Methodology*, §1.3): with (n−1)s²/σ² ~ χ²_{n−1} and r² = (max_std/σ)²,
    P(upper bound < max_std) = F(r²·χ²_{α,n−1}) and P(lower bound > max_std) = 1 − F(r²·χ²_{1−α,n−1})."""
    df = n - 1
    if stable:
        return float(scipy.stats.chi2.cdf(r2 * chi2_ppf(alpha, df), df))
    return float(scipy.stats.chi2.sf(r2 * chi2_ppf(1 - alpha, df), df))


@lru_cache(maxsize=1024)  # seed_spread asks it the same few questions (0.8 or 1.25 × max_std)
def seeds_for_std_claim(planned_std: float, max_std: float, *, alpha: float = 0.05,
                        power: float = 0.8) -> SeedPlan:
    """Seeds for the (1 − α) chi-square bound of σ to clear ``max_std`` with ``power`` when the true σ is ``planned_std``.

    The alternative is the caller's planning value, never the observed std (plugging in an
    estimate that sits near the limit makes n explode): ``seed_stability`` plans for
    σ = 0.8·max_std ("stable") or 1.25·max_std ("unstable"). If planned_std < max_std the claim
    is "σ < max_std" (the upper bound below the limit), else "σ > max_std". Exact power from the
    chi-square distribution (``_std_claim_power``). ``n`` is None when more than MAX_SEEDS are needed.
    """
    _check(alpha, power)
    if not (np.isfinite(planned_std) and planned_std >= 0 and np.isfinite(max_std) and max_std > 0):
        raise ValueError(f"planned_std must be finite and >= 0 and max_std finite and > 0, "
                         f"got {planned_std!r}, {max_std!r}")
    if planned_std == max_std:
        raise ValueError("planned_std equals max_std: no claim can be planned at the limit itself")
    stable = planned_std < max_std
    claim = f"σ {'<' if stable else '>'} {max_std:g}"
    alt = f"the true σ is {planned_std:.3g} ({planned_std / max_std:.3g}·max_std)"
    if planned_std == 0:
        return _plan(2, claim, alt, power, "seeds")  # every seed identical: s = 0 and the bound is 0
    r2 = (max_std / planned_std) ** 2
    n = _smallest_n(lambda m: _std_claim_power(m, r2, alpha, stable) >= power)
    return _plan(n, claim, alt, power, "seeds")


def _tost_power(n: int, diff: float, sigma: float, margin: float, alpha: float) -> float:
    df = 2 * n - 2
    se = sigma * np.sqrt(2.0 / n)
    tc = t_ppf(1 - alpha, df)
    # Shifted central-t approximation of TOST power (Chow, Shao & Wang 2008, §3.2.3).
    # scipy.special.stdtr(df, x) is scipy.stats.t.cdf(x, df) without the distribution object's per-call overhead
    p = scipy.special.stdtr(df, (margin - diff) / se - tc) + scipy.special.stdtr(df, (margin + diff) / se - tc) - 1.0
    return float(max(p, 0.0))


def seeds_for_equivalence(diff: float, sigma: float, margin: float, *, alpha: float = 0.05,
                          power: float = 0.8) -> SeedPlan:
    """Seeds per arm for TOST to show |μ₁ − μ₂| < margin when the true difference is ``diff`` and the sd ``sigma``.

    ``diff`` is the planned alternative (``portability`` plans for 0, the usual choice in
    equivalence studies), not the observed difference. Shifted central-t power approximation
    (Chow, Shao & Wang 2008, *Sample Size Calculations in Clinical Research*, §3.2.3).
    ``n`` is None when more than MAX_SEEDS are needed.
    """
    _check(alpha, power)
    if not (np.isfinite(sigma) and sigma > 0 and np.isfinite(margin) and margin > 0 and np.isfinite(diff)):
        raise ValueError(f"sigma and margin must be finite and > 0, diff finite, got {sigma!r}, {margin!r}, {diff!r}")
    if abs(diff) >= margin:
        raise ValueError(f"the planned difference {diff!r} must lie inside the margin ±{margin!r}")
    claim = f"|Δ| < {margin:g}"
    alt = f"the true Δ is {diff:g} and σ = {sigma:.3g}"
    n = _smallest_n(lambda m: _tost_power(m, abs(diff), sigma, margin, alpha) >= power)
    return _plan(n, claim, alt, power, "seeds per stack")
