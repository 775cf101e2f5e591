"""Stack portability: do two stacks give equivalent final metrics?"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy

from steady.server.stats.planning import seeds_for_equivalence

__all__ = ["welch", "tost", "skew_guard", "small_sample_quantile", "small_sample_skew", "is_small_sample",
           "SMALL_SAMPLE_SEEDS", "brown_forsythe", "hedges_g", "bootstrap_mean_diff", "band_containment",
           "holm", "benjamini_hochberg", "adjust", "TestResult", "Tost", "BootstrapCI", "Portability",
           "compare_stacks"]


def _two(x, y) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(x, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    if a.ndim != 1 or b.ndim != 1:
        raise ValueError("samples must be 1-D")
    if a.size < 2 or b.size < 2:
        raise ValueError(f"need at least 2 values per sample, got {a.size} and {b.size}")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("samples contain NaN or Inf; exclude diverged runs first")
    return a, b


@dataclass(frozen=True)
class TestResult:
    statistic: float
    p_value: float
    df: float | None = None


def welch_parts(a, b):
    """(mean(b) − mean(a), its Welch standard error, Welch–Satterthwaite df): shared by every Welch-based test."""
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = np.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1)) if se > 0 else float(a.size + b.size - 2)
    return float(b.mean() - a.mean()), float(se), float(df)


def welch(reference, candidate) -> TestResult:
    """Welch's unequal-variance t-test of mean(candidate) − mean(reference) (Welch 1947)."""
    a, b = _two(reference, candidate)
    d, se, df = welch_parts(a, b)
    t = d / se if se > 0 else (0.0 if d == 0 else np.sign(d) * np.inf)
    return TestResult(float(t), float(2 * scipy.stats.t.sf(abs(t), df)), df)


# The skew guard of the TOST (see ``skew_guard``): finals as skewed as a lognormal with log-sd 0.5
# (skewness 1.75, kurtosis 8.9) make the Welch t's own skewness about SKEW_BOUND·|σ_c³/n_c² − σ_r³/n_r²|/se³.
SKEW_BOUND = 1.75
SKEW_IMBALANCE_LIMIT = 0.12  # that skewness of the t above which a visible skew withholds 'equivalent'
SKEW_VISIBLE_Z = 0.5  # pooled sample skewness beyond this many of its normal-theory sds counts as visible


def skew_guard(reference, candidate, *, visible_z: float = SKEW_VISIBLE_Z,
               imbalance_limit: float = SKEW_IMBALANCE_LIMIT) -> str | None:
    """Why a Welch TOST's 'equivalent' cannot claim its level for these samples, or None.

    The Welch statistic of a difference of means is skewed when the finals are skewed and the two
    stacks differ in seed count or spread: its third cumulant is γ(σ_c³/n_c² − σ_r³/n_r²)/se³ for a
    common standardized skewness γ (the Edgeworth term of Hall 1992, §2.6, for two samples), and a
    small, wide, right-skewed group that misses its tail gives a small mean *and* a small sd, so a
    false 'equivalent' at the margin comes 11–14% of the time at 5% nominal (5 vs 20 seeds, variance
    ratio 4, lognormal or gamma finals). One cannot estimate that skewness from 5 seeds, but the
    pooled standardized residuals of both stacks show it: the claim is withheld when the imbalance
    term at the bound skewness ``SKEW_BOUND`` exceeds ``SKEW_IMBALANCE_LIMIT`` *and* the pooled
    sample skewness is beyond ``SKEW_VISIBLE_Z`` of its normal-theory sd (D'Agostino 1970). Balanced
    designs (equal counts and spreads: the skew cancels) are never withheld. Calibrated by the
    harness (docs/calibration.md, ``stack_portability:equivalent`` skewed-unequal rows)."""
    a = np.asarray(reference, dtype=np.float64)
    b = np.asarray(candidate, dtype=np.float64)
    if a.size < 2 or b.size < 2:
        return None
    sa, sb = float(a.std(ddof=1)), float(b.std(ddof=1))
    se = float(np.sqrt(sa * sa / a.size + sb * sb / b.size))
    if se == 0 or sa == 0 or sb == 0:
        return None
    imbalance = SKEW_BOUND * abs(sb**3 / b.size**2 - sa**3 / a.size**2) / se**3
    if imbalance <= imbalance_limit:
        return None
    z = np.concatenate([(a - a.mean()) / sa, (b - b.mean()) / sb])
    n = z.size
    g = float(np.mean(z**3))
    sd_g = float(np.sqrt(6.0 * n * (n - 1) / ((n - 2) * (n + 1) * (n + 3))))
    if abs(g) <= visible_z * sd_g:
        return None
    return (f"the finals look skewed (pooled skewness {g:.2f}) and the stacks differ in seeds or spread "
            f"({a.size} vs {b.size} seeds, sd {sa:.3g} vs {sb:.3g}): the TOST cannot claim its level here, "
            "so 'equivalent' is withheld (equal seed counts make the skew cancel)")


# The small-sample rule of the TOST (``small_sample_quantile``): with 5 or fewer seeds on a stack the Welch
# df overstates what a few seeds with unequal spreads know, and skewed finals (gamma, lognormal) tilt the
# statistic; measured false 'equivalent' 6–9% at 3–5 seeds (variance ratio 6, true Δ = margin = 4 se).
SMALL_SAMPLE_SEEDS = 5
SMALL_SAMPLE_SKEW_SHARE = 0.5  # the share of the Cornish–Fisher skew term (at SKEW_BOUND) added to the critical value


def small_sample_skew(reference, candidate) -> float:
    """The Welch statistic's skewness allowance at the bound skewness: SKEW_BOUND·|s_c³/n_c² − s_r³/n_r²|/se³
    (Hall 1992, §2.6; the imbalance term of ``skew_guard``) times ``SMALL_SAMPLE_SKEW_SHARE``; 0 for constant stacks."""
    a = np.asarray(reference, dtype=np.float64)
    b = np.asarray(candidate, dtype=np.float64)
    sa, sb = float(a.std(ddof=1)), float(b.std(ddof=1))
    se = float(np.sqrt(sa * sa / a.size + sb * sb / b.size))
    if se == 0:
        return 0.0
    return SMALL_SAMPLE_SKEW_SHARE * SKEW_BOUND * abs(sb**3 / b.size**2 - sa**3 / a.size**2) / se**3


def is_small_sample(n_reference: int, n_candidate: int) -> bool:
    """3 to ``SMALL_SAMPLE_SEEDS`` seeds on the smaller stack: where the rule is calibrated (2 seeds keep the Welch TOST,
    whose df is already 1 to 2)."""
    return 3 <= min(n_reference, n_candidate) <= SMALL_SAMPLE_SEEDS


def small_sample_quantile(level: float, df: float, skew: float) -> float:
    """The one-sided critical value of the small-sample rule at ``level``: the Student t quantile at
    df = min(n_r, n_c) − 1 (Hsu 1938; conservative for normal finals at any variance ratio, Mickey & Brown
    1966) plus the Cornish–Fisher skew term skew·(2t² + 1)/6 (``small_sample_skew``)."""
    t = float(scipy.stats.t.isf(level, df)) if level > 0 else np.inf
    return t + skew * (2.0 * t * t + 1.0) / 6.0


def _small_sample_p(stat: float, df: float, skew: float) -> float:
    """The p-value of ``stat`` under the small-sample rule: the level at which ``small_sample_quantile``
    equals it (the positive root of t + skew·(2t² + 1)/6 = stat; below t = 0, shifted by the term at 0)."""
    if skew <= 0:
        return float(scipy.stats.t.sf(stat, df))
    c = skew / 6.0
    if stat <= c:
        return float(scipy.stats.t.sf(stat - c, df))
    t = (-1.0 + np.sqrt(1.0 - 8.0 * c * (c - stat))) / (4.0 * c)
    return float(scipy.stats.t.sf(t, df))


SMALL_SAMPLE_PHRASE = ("with {n} seeds on a stack the TOST uses its small-sample rule (df {df:g} = the smaller stack's "
                       "seeds − 1, and an allowance for skewed finals), which holds its level at 3–5 seeds")


@dataclass(frozen=True)
class Tost:
    diff: float  # mean(candidate) − mean(reference)
    se: float
    df: float
    margin: float
    p_lower: float
    p_upper: float
    p_value: float  # max of the two one-sided p-values
    exact: bool = False  # both samples constant (zero standard error): the difference is known exactly
    withheld: str | None = None  # why 'equivalent' is not claimed although p_value is small (``skew_guard``)
    small_sample: str | None = None  # the small-sample rule was used (≤ 5 seeds on a stack), in words


def tost(reference, candidate, *, margin: float) -> Tost:
    """Two one-sided Welch t-tests for |μ_cand − μ_ref| < margin (Schuirmann 1987).

    H0: diff ≤ −margin or diff ≥ margin; p = max(p_lower, p_upper). Same as statsmodels'
    ``ttost_ind(candidate, reference, -margin, margin, usevar='unequal')``.

    Degenerate case, answered exactly: when both samples are constant (standard error 0, e.g.
    bit-identical groups) the difference is known without error, so p = 0 when |diff| < margin
    and p = 1 otherwise, with ``exact=True`` (no 0/0 t statistic).

    ``withheld`` says why 'equivalent' must not be claimed even when p is small: skewed finals with
    unequal seed counts or spreads (``skew_guard``).

    Small samples (3 to ``SMALL_SAMPLE_SEEDS`` seeds on the smaller stack): each one-sided test uses the
    small-sample rule of ``small_sample_quantile`` (df = min(n_r, n_c) − 1 and a skew allowance that
    grows with the stacks' imbalance of spread and seeds), its p-value the level at which the statistic
    meets that critical value; ``df`` is then that df and ``small_sample`` says so. Calibrated by the
    harness (docs/calibration.md, "Where users are": 3–5 seeds per stack, variance ratios to 6, gamma,
    lognormal and 10%-outlier finals).
    """
    if not (margin > 0 and np.isfinite(margin)):
        raise ValueError(f"margin must be finite and > 0, got {margin!r}")
    a, b = _two(reference, candidate)
    d, se, df = welch_parts(a, b)
    if se == 0:
        p1 = 0.0 if d > -margin else 1.0
        p2 = 0.0 if d < margin else 1.0
        return Tost(d, se, df, float(margin), p1, p2, max(p1, p2), exact=True)
    if is_small_sample(a.size, b.size):
        df, skew = float(min(a.size, b.size) - 1), small_sample_skew(a, b)
        p1 = _small_sample_p((d + margin) / se, df, skew)
        p2 = _small_sample_p((margin - d) / se, df, skew)
        note = SMALL_SAMPLE_PHRASE.format(n=min(a.size, b.size), df=df)
        return Tost(d, se, df, float(margin), p1, p2, max(p1, p2), withheld=skew_guard(a, b), small_sample=note)
    p1 = float(scipy.stats.t.sf((d + margin) / se, df))
    p2 = float(scipy.stats.t.cdf((d - margin) / se, df))
    return Tost(d, se, df, float(margin), p1, p2, max(p1, p2), withheld=skew_guard(a, b))


def brown_forsythe(reference, candidate) -> TestResult:
    """Brown–Forsythe test of equal variances: one-way ANOVA on |x − median| (Brown & Forsythe 1974)."""
    groups = [np.abs(g - np.median(g)) for g in _two(reference, candidate)]
    k, n = len(groups), sum(g.size for g in groups)
    grand = np.concatenate(groups).mean()
    ssb = sum(g.size * (g.mean() - grand) ** 2 for g in groups)
    ssw = sum(((g - g.mean()) ** 2).sum() for g in groups)
    if ssw == 0:
        return TestResult(float("inf") if ssb > 0 else float("nan"), 0.0 if ssb > 0 else 1.0, float(n - k))
    f = (ssb / (k - 1)) / (ssw / (n - k))
    return TestResult(float(f), float(scipy.stats.f.sf(f, k - 1, n - k)), float(n - k))


def hedges_g(reference, candidate) -> float:
    """Hedges' g: (mean_c − mean_r)/s_pooled × (1 − 3/(4(n₁+n₂) − 9)) (Hedges 1981)."""
    a, b = _two(reference, candidate)
    n1, n2 = a.size, b.size
    sp = np.sqrt(((n1 - 1) * a.var(ddof=1) + (n2 - 1) * b.var(ddof=1)) / (n1 + n2 - 2))
    if sp == 0:
        return 0.0 if b.mean() == a.mean() else float(np.sign(b.mean() - a.mean()) * np.inf)
    return float((b.mean() - a.mean()) / sp * (1 - 3 / (4 * (n1 + n2) - 9)))


@dataclass(frozen=True)
class BootstrapCI:
    estimate: float
    low: float
    high: float
    confidence: float
    n_resamples: int
    method: str = "percentile"


def bootstrap_mean_diff(reference, candidate, *, rng: np.random.Generator, confidence: float = 0.95,
                        n_resamples: int = 5000) -> BootstrapCI:
    """Percentile bootstrap CI of mean(candidate) − mean(reference), resampling each sample
    independently (Efron & Tibshirani 1993, ch. 13). ``rng`` is the only source of randomness."""
    if not isinstance(rng, np.random.Generator):
        raise ValueError("rng must be a numpy.random.Generator")
    if not (0 < confidence < 1) or n_resamples < 100:
        raise ValueError("confidence must be in (0, 1) and n_resamples >= 100")
    a, b = _two(reference, candidate)
    ra = a[rng.integers(0, a.size, (n_resamples, a.size))].mean(axis=1)
    rb = b[rng.integers(0, b.size, (n_resamples, b.size))].mean(axis=1)
    alpha = 1 - confidence
    lo, hi = np.quantile(rb - ra, [alpha / 2, 1 - alpha / 2])
    return BootstrapCI(float(b.mean() - a.mean()), float(lo), float(hi), float(confidence), int(n_resamples))


def band_containment(curve, low, high) -> tuple[float, int]:
    """Share of steps where ``curve`` lies inside [low, high], over steps where all three are
    finite; returns (share, number of steps compared). Share is NaN when nothing is compared."""
    c, lo, hi = (np.asarray(v, dtype=np.float64) for v in (curve, low, high))
    if not (c.shape == lo.shape == hi.shape) or c.ndim != 1:
        raise ValueError("curve, low and high must be 1-D of equal length")
    ok = np.isfinite(c) & np.isfinite(lo) & np.isfinite(hi)
    k = int(ok.sum())
    if k == 0:
        return float("nan"), 0
    inside = (c[ok] >= lo[ok]) & (c[ok] <= hi[ok])
    return float(inside.mean()), k


def _pvals(p) -> np.ndarray:
    arr = np.asarray(p, dtype=np.float64)
    if arr.ndim != 1 or np.any(~np.isfinite(arr)) or np.any((arr < 0) | (arr > 1)):
        raise ValueError("p-values must be a 1-D array of numbers in [0, 1]")
    return arr


def holm(p) -> np.ndarray:
    """Holm (1979) step-down adjusted p-values (family-wise error control)."""
    arr = _pvals(p)
    m = arr.size
    order = np.argsort(arr, kind="stable")
    adj = np.maximum.accumulate((m - np.arange(m)) * arr[order])
    out = np.empty(m)
    out[order] = np.minimum(adj, 1.0)
    return out


def benjamini_hochberg(p) -> np.ndarray:
    """Benjamini–Hochberg (1995) step-up adjusted p-values (false-discovery-rate control)."""
    arr = _pvals(p)
    m = arr.size
    order = np.argsort(arr, kind="stable")
    scaled = arr[order] * m / np.arange(1, m + 1)
    adj = np.minimum.accumulate(scaled[::-1])[::-1]
    out = np.empty(m)
    out[order] = np.minimum(adj, 1.0)
    return out


def adjust(p, *, method: str = "holm") -> np.ndarray:
    """Adjusted p-values by ``method``: "holm", "bh" (Benjamini–Hochberg) or "none"."""
    if method == "holm":
        return holm(p)
    if method in ("bh", "fdr_bh", "benjamini_hochberg"):
        return benjamini_hochberg(p)
    if method == "none":
        return _pvals(p).copy()
    raise ValueError(f"unknown adjustment method {method!r} (use 'holm', 'bh' or 'none')")


@dataclass(frozen=True)
class Portability:
    n_reference: int
    n_candidate: int
    mean_reference: float
    mean_candidate: float
    diff: float
    diff_ci_low: float  # (1 − α) Welch CI of the difference
    diff_ci_high: float
    margin: float | None
    welch: TestResult
    tost: Tost | None
    brown_forsythe: TestResult
    mann_whitney: TestResult
    ks: TestResult
    bootstrap: BootstrapCI
    hedges_g: float
    n_needed: int | None  # seeds per stack for TOST power 0.8 when the true difference is 0 (σ as observed)
    plan: str | None = None  # that planning answer in words, with its alternative


def compare_stacks(reference, candidate, *, margin: float | None, rng: np.random.Generator,
                   alpha: float = 0.05, n_resamples: int = 5000) -> Portability:
    """All two-sample statistics of a final metric on two stacks (unadjusted p-values).

    Welch t, TOST within ±margin, Brown–Forsythe, Mann–Whitney U (two-sided, scipy's default
    exact/asymptotic choice), two-sample Kolmogorov–Smirnov, percentile bootstrap CI of the
    mean difference, Hedges' g. The verdict (after multiple-comparison adjustment) is made by
    the caller, see ``steady.server.stats.report``.
    """
    a, b = _two(reference, candidate)
    if not (0 < alpha < 1):
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    d, se, df = welch_parts(a, b)
    h = float(scipy.stats.t.ppf(1 - alpha / 2, df)) * se
    t = tost(a, b, margin=margin) if margin is not None else None
    mw = scipy.stats.mannwhitneyu(b, a, alternative="two-sided")
    ks = scipy.stats.ks_2samp(a, b)
    sp = float(np.sqrt(((a.size - 1) * a.var(ddof=1) + (b.size - 1) * b.var(ddof=1)) / (a.size + b.size - 2)))
    planned = seeds_for_equivalence(0.0, sp, margin, alpha=alpha) if (margin is not None and sp > 0) else None
    return Portability(int(a.size), int(b.size), float(a.mean()), float(b.mean()), d, d - h, d + h,
                       None if margin is None else float(margin), welch(a, b), t, brown_forsythe(a, b),
                       TestResult(float(mw.statistic), float(mw.pvalue)),
                       TestResult(float(ks.statistic), float(ks.pvalue)),
                       bootstrap_mean_diff(a, b, rng=rng, confidence=1 - alpha, n_resamples=n_resamples),
                       hedges_g(a, b), None if planned is None else planned.n,
                       None if planned is None else planned.text)
