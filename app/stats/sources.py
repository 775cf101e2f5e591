"""Where the variance comes from: a per-source table (initial weights, data order, dropout/augmentation,
kernels/numerics, a one-ULP change of one weight) against the all-sources arm.

The study design follows Summers & Dinneen (2021), "Nondeterminism and Instability in Neural Network
Optimization" (ICML): one arm per source with only that source varied and everything else pinned, plus an
arm with every source varied. Each arm's final values give an SD with a robust confidence interval; each
source's SD is compared with the all-sources SD by TOST on the ratio of SDs (is that source alone "the
full variance"?); a crossed init × data-order arm gives variance components with intervals; the one-ULP
arm's divergence from its unperturbed twin is followed step by step.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy

from steady.server.stats.intervals import bonett_std_bounds
from steady.server.stats.quantiles import norm_ppf

__all__ = [
    "SD_MARGIN", "KURTOSIS_FLOOR", "KURTOSIS_INFLATION", "SdRatio", "sd_ratio_tost", "SourceRow", "source_row", "CrossedComponents",
    "crossed_components", "mls_difference_interval", "Divergence", "ulp_divergence", "runs_for_equivalence",
    "SourceEntry", "SourcesTable", "sources_table",
]

SD_MARGIN = 1.5  # "the full variance": the source's SD within [1/1.5, 1.5] × the all-sources SD
# Bonett's SE of ln s² rests on a kurtosis estimate, which is biased low for heavy tails: with it as is,
# false "equivalent" reached 7% on t5 arms of 100 runs. The estimate is inflated by 1.25 and floored at the
# normal's 3, which keeps false "equivalent" ≤ α on normal, t5, gamma(2) and lognormal arms of 20–200 runs
# (simulated in tests/stats/test_sources.py; the table is in docs/sources.md).
KURTOSIS_FLOOR = 3.0
KURTOSIS_INFLATION = 1.25
PLANNING_FACTOR = 1.2  # runs_for_equivalence: see there


def _finite(x, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64).ravel()
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: values must be finite; drop diverged runs first")
    return arr


def _kurtosis_sums(arr: np.ndarray) -> tuple[float, float]:
    """Σ(x − m)⁴ with m the mean trimmed by 1/(2√(n−4)) per tail (Bonett 2006), and Σ(x − x̄)²."""
    n = arr.size
    cut = int(np.floor(n / (2.0 * np.sqrt(n - 4.0)))) if n > 5 else 0
    srt = np.sort(arr)
    m = float(srt[cut:n - cut].mean()) if n - 2 * cut > 0 else float(np.median(arr))
    return float(np.sum((arr - m) ** 4)), float(np.sum((arr - arr.mean()) ** 2))


@dataclass(frozen=True)
class SdRatio:
    """SD of ``x`` over SD of ``y``: estimate, two-sided (1 − 2α) interval, TOST verdict against the margin."""

    ratio: float
    lower: float
    upper: float
    alpha: float
    margin: float
    kurtosis: float  # the pooled kurtosis estimate Bonett's SE used (before the floor)
    verdict: str  # equivalent | not_equivalent | inconclusive
    p_value: float  # TOST p-value: the larger of the two one-sided p-values


def sd_ratio_tost(x, y, *, margin: float = SD_MARGIN, alpha: float = 0.05,
                  kurtosis_floor: float = KURTOSIS_FLOOR, kurtosis_inflation: float = KURTOSIS_INFLATION) -> SdRatio:
    """TOST of σₓ/σᵧ within [1/margin, margin], on Bonett's robust interval for a ratio of variances.

    Bonett, D. G. (2006), "Robust confidence interval for a ratio of standard deviations", *Applied
    Psychological Measurement* 30:432–439: ln(c·s²ₓ/s²ᵧ) ± z·√(seₓ² + seᵧ²), c = (nₓ/(nₓ−z))/(nᵧ/(nᵧ−z)),
    seᵢ² = (γ̂ − (nᵢ−3)/nᵢ)/(nᵢ−1), γ̂ the pooled kurtosis with trimmed means (here inflated by
    ``kurtosis_inflation`` and floored at ``kurtosis_floor``). Equivalent when the (1 − 2α) interval lies
    inside the margin (Schuirmann 1987); not_equivalent when it lies wholly outside; inconclusive otherwise.
    Each side needs ≥ 5 values.
    """
    a, b = _finite(x, "x"), _finite(y, "y")
    if a.size < 5 or b.size < 5:
        raise ValueError(f"each arm needs at least 5 runs (got {a.size} and {b.size})")
    if not margin > 1:
        raise ValueError(f"margin must be > 1 (a ratio of SDs), got {margin}")
    s2a, s2b = float(a.var(ddof=1)), float(b.var(ddof=1))
    if s2a == 0.0 or s2b == 0.0:  # a zero SD is exactly known: no interval to draw
        ratio = float("nan") if s2a == s2b else (0.0 if s2a == 0.0 else float("inf"))
        verdict = "inconclusive" if s2a == s2b else "not_equivalent"
        return SdRatio(ratio=ratio, lower=ratio, upper=ratio, alpha=alpha, margin=margin, kurtosis=float("nan"),
                       verdict=verdict, p_value=1.0)
    na, nb = a.size, b.size
    z = norm_ppf(1.0 - alpha)
    qa, da = _kurtosis_sums(a)
    qb, db = _kurtosis_sums(b)
    gam = (na + nb) * (qa + qb) / (da + db) ** 2
    g = max(kurtosis_inflation * gam, kurtosis_floor)
    var = (g - (na - 3.0) / na) / (na - 1.0) + (g - (nb - 3.0) / nb) / (nb - 1.0)
    se = float(np.sqrt(var))
    centre = float(np.log((na / (na - z)) / (nb / (nb - z)) * s2a / s2b))
    lo, hi = np.exp(0.5 * (centre - z * se)), np.exp(0.5 * (centre + z * se))
    m = float(np.log(margin ** 2))
    # scipy.special.ndtr(x) is scipy.stats.norm.cdf(x) (and ndtr(−x) its sf) without the distribution object's
    # per-call overhead: the same function, the same bits
    p_low = float(scipy.special.ndtr(-((centre + m) / se)))  # H0: ln ratio² ≤ −ln margin²
    p_high = float(scipy.special.ndtr((centre - m) / se))  # H0: ln ratio² ≥ ln margin²
    p = max(p_low, p_high)
    if lo >= 1 / margin and hi <= margin:
        verdict = "equivalent"
    elif hi < 1 / margin or lo > margin:
        verdict = "not_equivalent"
    else:
        verdict = "inconclusive"
    return SdRatio(ratio=float(np.sqrt(s2a / s2b)), lower=float(lo), upper=float(hi), alpha=alpha, margin=margin,
                   kurtosis=float(gam), verdict=verdict, p_value=p)


def runs_for_equivalence(ratio: float, *, margin: float = SD_MARGIN, alpha: float = 0.05, power: float = 0.8,
                         kurtosis: float = KURTOSIS_INFLATION * 3.0, limit: int = 10_000) -> int | None:
    """Runs per arm (both arms equal) for TOST on the SD ratio to show equivalence with ``power`` when the true
    ratio is ``ratio``: the smallest n with z₁₋α + z_power ≤ (ln margin² − |ln ratio²|)/se(n), se(n)² =
    2(γ − (n−3)/n)/(n−1) (Bonett's SE at kurtosis γ, by default the normal's 3 inflated as the test inflates
    it), γ taken × ``PLANNING_FACTOR`` for the noise of the test's own kurtosis estimate (without it the planned
    n gave 66% power on normal arms; with it 80%). None when the ratio is outside the margin."""
    kurtosis = kurtosis * PLANNING_FACTOR
    gap = np.log(margin ** 2) - abs(np.log(max(ratio, 1e-300) ** 2))
    if not gap > 0:
        return None
    need = norm_ppf(1 - alpha) + norm_ppf(power)
    for n in range(5, limit + 1):
        se = np.sqrt(2.0 * (kurtosis - (n - 3.0) / n) / (n - 1.0))
        if need * se <= gap:
            return n
    return None


@dataclass(frozen=True)
class SourceRow:
    """One source's row of the table for one metric."""

    source: str
    n: int
    sd: float
    sd_lower: float  # two-sided (1 − 2α) robust interval of the SD (Bonett 2006)
    sd_upper: float
    vs_all: SdRatio | None  # None for the all-sources row itself
    runs_needed: int | None  # runs per arm for a conclusive TOST when vs_all is inconclusive


def source_row(source: str, values, all_values, *, margin: float = SD_MARGIN, alpha: float = 0.05) -> SourceRow:
    """The SD of one source's final values with its robust interval, and its TOST against the all-sources SD."""
    arr = _finite(values, source)
    b = bonett_std_bounds(arr, alpha=alpha)
    vs = None if all_values is None else sd_ratio_tost(arr, all_values, margin=margin, alpha=alpha)
    needed = None
    if vs is not None and vs.verdict == "inconclusive" and np.isfinite(vs.ratio) and vs.ratio > 0:
        needed = runs_for_equivalence(vs.ratio, margin=margin, alpha=alpha,
                                      kurtosis=max(KURTOSIS_INFLATION * vs.kurtosis, KURTOSIS_FLOOR))
    return SourceRow(source=source, n=arr.size, sd=b.std, sd_lower=b.lower, sd_upper=b.upper, vs_all=vs,
                     runs_needed=needed)


def mls_difference_interval(ms1: float, df1: float, ms2: float, df2: float, c: float, *,
                            confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided interval of θ = c(E[MS₁] − E[MS₂]) by the modified large-sample method (Ting, Burdick,
    Graybill, Jeyaratnam & Lu 1990, J. Statist. Comput. Simul. 35:135–143; Burdick & Graybill 1992,
    *Confidence Intervals on Variance Components*, §3.3), for independent mean squares with χ²/df laws.
    Both ends are truncated at 0, as Burdick & Graybill (1992, §3.3) set a negative bound of a variance
    component to zero: when MS₁ falls far enough below MS₂, the upper end is negative too, and the
    interval of a variance (estimated as max(0, θ̂)) is then [0, 0], not an upper end below its lower end."""
    a = (1.0 - confidence) / 2.0
    f_up = lambda q, d1, d2: float(scipy.stats.f.ppf(1.0 - q, d1, d2))  # noqa: E731 — F with area q to the right
    chi_inf = lambda q, d: float(scipy.stats.chi2.ppf(1.0 - q, d) / d)  # noqa: E731 — F(d, ∞) with area q right
    g1 = 1.0 - 1.0 / chi_inf(a, df1)
    h1 = 1.0 / chi_inf(1.0 - a, df1) - 1.0
    g2 = 1.0 - 1.0 / chi_inf(a, df2)
    h2 = 1.0 / chi_inf(1.0 - a, df2) - 1.0
    f_a, f_1a = f_up(a, df1, df2), f_up(1.0 - a, df1, df2)
    g12 = ((f_a - 1.0) ** 2 - g1 ** 2 * f_a ** 2 - h2 ** 2) / f_a
    h12 = ((1.0 - f_1a) ** 2 - h1 ** 2 * f_1a ** 2 - g2 ** 2) / f_1a
    est = ms1 - ms2
    vl = g1 ** 2 * ms1 ** 2 + h2 ** 2 * ms2 ** 2 + g12 * ms1 * ms2
    vu = h1 ** 2 * ms1 ** 2 + g2 ** 2 * ms2 ** 2 + h12 * ms1 * ms2
    return max(0.0, float(c * (est - np.sqrt(max(vl, 0.0))))), max(0.0, float(c * (est + np.sqrt(max(vu, 0.0)))))


@dataclass(frozen=True)
class CrossedComponents:
    """Variance components of a crossed init × data-order design, one run per cell:
    y_ij = μ + a_i + b_j + e_ij (e: everything else — interaction, numerics)."""

    n_init: int
    n_data: int
    ms_init: float
    ms_data: float
    ms_residual: float
    init: float  # σ²_init (method of moments, truncated at 0)
    data: float
    residual: float
    init_ci: tuple[float, float]
    data_ci: tuple[float, float]
    residual_ci: tuple[float, float]
    confidence: float

    @property
    def total(self) -> float:
        return self.init + self.data + self.residual


def crossed_components(y, *, confidence: float = 0.95) -> CrossedComponents:
    """Two-way crossed random-effects ANOVA without replication (``y``: init seeds × data seeds).

    Mean squares as in Searle, Casella & McCulloch (1992) §4.6; σ̂²_init = (MS_init − MS_res)/J,
    σ̂²_data = (MS_data − MS_res)/I, σ̂²_res = MS_res; intervals: modified large-sample for the
    differences (:func:`mls_difference_interval`), exact χ² for the residual.
    """
    arr = np.asarray(y, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] < 2 or arr.shape[1] < 2:
        raise ValueError(f"need an init × data table of at least 2 × 2 runs, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("the crossed table has NaN or Inf; drop diverged runs first")
    i, j = arr.shape
    grand = arr.mean()
    ri, cj = arr.mean(axis=1), arr.mean(axis=0)
    ms_a = j * float(np.sum((ri - grand) ** 2)) / (i - 1)
    ms_b = i * float(np.sum((cj - grand) ** 2)) / (j - 1)
    resid = arr - ri[:, None] - cj[None, :] + grand
    df_e = (i - 1) * (j - 1)
    ms_e = float(np.sum(resid ** 2)) / df_e
    a = (1.0 - confidence) / 2.0
    res_ci = (df_e * ms_e / float(scipy.stats.chi2.ppf(1 - a, df_e)), df_e * ms_e / float(scipy.stats.chi2.ppf(a, df_e)))
    return CrossedComponents(
        n_init=i, n_data=j, ms_init=ms_a, ms_data=ms_b, ms_residual=ms_e,
        init=max(0.0, (ms_a - ms_e) / j), data=max(0.0, (ms_b - ms_e) / i), residual=ms_e,
        init_ci=mls_difference_interval(ms_a, i - 1, ms_e, df_e, 1.0 / j, confidence=confidence),
        data_ci=mls_difference_interval(ms_b, j - 1, ms_e, df_e, 1.0 / i, confidence=confidence),
        residual_ci=res_ci, confidence=confidence,
    )


@dataclass(frozen=True)
class Divergence:
    """How fast a one-ULP change grows to the full band: per step, the RMS difference between perturbed runs and
    their unperturbed twin over √2 × the all-sources SD (1: as far apart as two independent runs)."""

    steps: tuple[int, ...]
    ratio: tuple[float, ...]
    first_half: int | None  # first step where the ratio reaches 0.5
    first_full: int | None  # first step where it reaches 0.9 ("reaches the band")
    final: float
    n_perturbed: int = 0  # runs of the one-ULP arm
    absorbed: int = 0  # of them, runs equal to the twin at every step: the change never reached this metric


def ulp_divergence(perturbed, twin, all_sources, steps) -> Divergence:
    """``perturbed``: runs × steps of the one-ULP arm; ``twin``: the unperturbed run's steps; ``all_sources``:
    runs × steps of the all-sources arm (≥ 2 runs), all on the same ``steps``.

    A perturbed run equal to its twin at every step is counted as ``absorbed``: the one-ULP change never reached
    the metric (rounding swallowed it, or the weight feeds a unit that never reaches the loss, a dead ReLU). In a
    small network that is common (the built-in MLP: about a third of the draws, docs/sources.md), and it makes the
    arm a mixture: its SD is then below the full variance however chaotic the runs the change does reach."""
    p = np.asarray(perturbed, dtype=np.float64)
    t = np.asarray(twin, dtype=np.float64).ravel()
    a = np.asarray(all_sources, dtype=np.float64)
    st = np.asarray(steps)
    if p.ndim != 2 or a.ndim != 2 or p.shape[1] != t.size or a.shape[1] != t.size or st.size != t.size:
        raise ValueError("perturbed, twin, all_sources and steps must share the step axis")
    if a.shape[0] < 2 or p.shape[0] < 1:
        raise ValueError("need ≥ 1 perturbed run and ≥ 2 all-sources runs")
    # np.nanmean / np.nanstd by hand: a step with no finite difference (a NaN twin) is NaN, without a warning
    sq = (p - t[None, :]) ** 2
    n_p, n_a = np.sum(~np.isnan(sq), axis=0), np.sum(~np.isnan(a), axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        rms = np.sqrt(np.nansum(sq, axis=0) / n_p)
        centred = a - np.nansum(a, axis=0) / n_a
        band = np.where(n_a >= 2, np.sqrt(2.0) * np.sqrt(np.nansum(centred ** 2, axis=0) / (n_a - 1)), np.nan)
        ratio = np.where(band > 0, rms / band, np.where(rms > 0, np.inf, 0.0))

    def first(level: float) -> int | None:
        hit = np.nonzero(ratio >= level)[0]
        return int(st[hit[0]]) if hit.size else None

    same = np.all((p == t[None, :]) | (np.isnan(p) & np.isnan(t[None, :])), axis=1)
    return Divergence(steps=tuple(int(s) for s in st), ratio=tuple(float(r) for r in ratio),
                      first_half=first(0.5), first_full=first(0.9), final=float(ratio[-1]),
                      n_perturbed=int(p.shape[0]), absorbed=int(same.sum()))


@dataclass(frozen=True)
class SourceEntry:
    """A source's row: measured (``row``), or why not (``status``: not_varied — the code never reads this
    source's seed, so the arm says nothing about it; it is not a zero — or too_few_runs)."""

    source: str
    status: str  # measured | not_varied | too_few_runs
    row: SourceRow | None
    note: str = ""


@dataclass(frozen=True)
class SourcesTable:
    metric: str
    margin: float
    alpha: float
    entries: tuple[SourceEntry, ...]
    all_sources: SourceRow | None
    crossed: CrossedComponents | None
    divergence: Divergence | None


MIN_ARM_RUNS = 5


def sources_table(metric: str, finals: dict[str, np.ndarray], *, exposed: dict[str, bool],
                  crossed_grid: np.ndarray | None = None, divergence: Divergence | None = None,
                  margin: float = SD_MARGIN, alpha: float = 0.05) -> SourcesTable:
    """The table for one metric: ``finals`` maps an arm (a source, or ``all``) to its runs' final values;
    ``exposed`` says which sources the code reads (an unexposed source is reported as not varied)."""
    all_vals = finals.get("all")
    all_ok = all_vals is not None and np.asarray(all_vals).size >= MIN_ARM_RUNS
    all_row = source_row("all", all_vals, None, margin=margin, alpha=alpha) if all_ok else None
    entries = []
    for source, values in finals.items():
        if source == "all":
            continue
        arr = np.asarray(values, dtype=np.float64)
        if not exposed.get(source, False):
            entries.append(SourceEntry(source, "not_varied", None,
                                       "the code never reads this source's seed: not varied (not a zero)"))
        elif arr.size < MIN_ARM_RUNS:
            entries.append(SourceEntry(source, "too_few_runs", None,
                                       f"{arr.size} finished run(s); the SD and its test need {MIN_ARM_RUNS}"))
        else:
            row = source_row(source, arr, all_vals if all_ok else None, margin=margin, alpha=alpha)
            entries.append(SourceEntry(source, "measured", row))
    return SourcesTable(metric=metric, margin=margin, alpha=alpha, entries=tuple(entries), all_sources=all_row,
                        crossed=crossed_components(crossed_grid) if crossed_grid is not None else None,
                        divergence=divergence)
