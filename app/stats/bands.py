"""Per-step seed bands over a ``runs × steps`` matrix, and out-of-band run detection."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from steady.server.stats.align import check_matrix
from steady.server.stats.intervals import normal_tolerance_factor
from steady.server.stats.quantiles import t_ppf

__all__ = ["Band", "compute_band", "OutOfBand", "out_of_band_runs", "tolerance_factors", "CurveOutliers",
           "curve_levels", "out_of_band_curves"]

DEFAULT_QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


@dataclass(frozen=True)
class Band:
    """Per-step statistics over runs. Every array has one entry per step.

    ``n`` counts the finite values used at each step (diverged runs excluded entirely, missing
    points skipped). Where n < 2, std and the intervals are NaN; where n == 0 everything is NaN.
    ``quantiles`` has shape (len(quantile_levels), steps) and uses numpy's default (linear,
    Hyndman & Fan type 7) definition.
    """

    steps: np.ndarray
    n: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    min: np.ndarray
    max: np.ndarray
    quantile_levels: tuple
    quantiles: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    ti_low: np.ndarray
    ti_high: np.ndarray
    coverage: float
    confidence: float
    n_runs: int  # rows given
    excluded_runs: tuple  # row indices excluded as diverged

    @property
    def n_excluded(self) -> int:
        return len(self.excluded_runs)

    def take(self, idx) -> Band:
        """The band restricted to the step positions ``idx`` (e.g. from downsampling)."""
        idx = np.asarray(idx)
        return Band(steps=self.steps[idx], n=self.n[idx], mean=self.mean[idx], std=self.std[idx],
                    min=self.min[idx], max=self.max[idx], quantile_levels=self.quantile_levels,
                    quantiles=self.quantiles[:, idx], ci_low=self.ci_low[idx], ci_high=self.ci_high[idx],
                    ti_low=self.ti_low[idx], ti_high=self.ti_high[idx], coverage=self.coverage,
                    confidence=self.confidence, n_runs=self.n_runs, excluded_runs=self.excluded_runs)


def tolerance_factors(n, *, coverage: float, confidence: float) -> np.ndarray:
    """Exact tolerance factor for each entry of the integer array ``n`` (NaN where n < 2),
    computed once per distinct n."""
    n = np.asarray(n)
    out = np.full(n.shape, np.nan)
    for value in np.unique(n):
        if value >= 2:
            out[n == value] = normal_tolerance_factor(int(value), coverage=coverage, confidence=confidence)
    return out


def _t_quantiles(n: np.ndarray, confidence: float) -> np.ndarray:
    out = np.full(n.shape, np.nan)
    for value in np.unique(n):
        if value >= 2:
            out[n == value] = t_ppf(0.5 + confidence / 2.0, int(value) - 1)
    return out


def _block_stats(xb, qs, n_out, mean_out, std_out, min_out, max_out, q_out) -> None:
    """Fill per-column statistics of one block (rows = runs); NaN/±Inf cells are skipped."""
    xs = np.array(xb, dtype=np.float64, copy=True)
    xs[~np.isfinite(xs)] = np.nan
    xs.sort(axis=0)  # NaN sorts last: the first n entries of a column are its finite values
    finite = ~np.isnan(xs)
    n = finite.sum(axis=0)
    n_out[:] = n
    has = n > 0
    if not has.any():
        return
    cols = np.arange(xs.shape[1])
    last = np.maximum(n - 1, 0)
    min_out[:] = np.where(has, xs[0], np.nan)
    max_out[:] = np.where(has, xs[last, cols], np.nan)
    for j, q in enumerate(qs):  # numpy's default "linear" (Hyndman & Fan type 7) quantile
        pos = q * last
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, last)
        a, b = xs[lo, cols], xs[hi, cols]
        q_out[j] = np.where(has, a + (b - a) * (pos - lo), np.nan)
    xs[~finite] = 0.0
    with np.errstate(invalid="ignore", divide="ignore"):
        mu = xs.sum(axis=0) / n
        xs -= mu
        xs[~finite] = 0.0
        var = np.einsum("ij,ij->j", xs, xs) / (n - 1)
    mean_out[:] = np.where(has, mu, np.nan)
    std_out[:] = np.where(n > 1, np.sqrt(np.maximum(var, 0.0)), np.nan)


def compute_band(
    matrix,
    *,
    steps=None,
    coverage: float = 0.9,
    confidence: float = 0.95,
    quantiles=DEFAULT_QUANTILES,
    diverged=None,
) -> Band:
    """Pointwise band over runs for each step of a ``runs × steps`` matrix.

    Per step: n, mean, std (ddof=1), min, max, quantiles, the Student-t CI of the mean, and the
    two-sided normal tolerance interval mean ± k·std with the exact factor k(n, coverage,
    confidence) (Krishnamoorthy & Mathew 2009, §2.3; see ``normal_tolerance_factor``).

    NaN cells are missing points. Runs flagged in ``diverged`` (bool per row) are excluded from
    every statistic and listed in ``excluded_runs``; when ``diverged`` is None a row is treated
    as diverged if it contains ±Inf. Any remaining non-finite cell is skipped.
    """
    x = check_matrix(matrix)
    runs, m = x.shape
    step_arr = np.arange(m, dtype=np.int64) if steps is None else np.asarray(steps)
    if step_arr.shape != (m,):
        raise ValueError(f"steps must have length {m} (matrix columns), got shape {step_arr.shape}")
    if not (0 < coverage < 1 and 0 < confidence < 1):
        raise ValueError("coverage and confidence must be strictly between 0 and 1")
    qs = tuple(float(q) for q in quantiles)
    if any(not (0.0 <= q <= 1.0) for q in qs):
        raise ValueError(f"quantiles must lie in [0, 1], got {qs}")
    if diverged is None:
        div = np.isinf(x).any(axis=1) if runs else np.zeros(0, bool)
    else:
        div = np.asarray(diverged, dtype=bool)
        if div.shape != (runs,):
            raise ValueError(f"diverged must have one flag per run ({runs}), got shape {div.shape}")
    excluded = tuple(int(i) for i in np.flatnonzero(div))

    # Sorting each column puts NaN last, so min/max/quantiles are gathers (one O(R log R) pass).
    n = np.zeros(m, dtype=np.int64)
    mean, std, vmin, vmax = (np.full(m, np.nan) for _ in range(4))
    qarr = np.full((len(qs), m), np.nan)
    rows = np.flatnonzero(~div)
    # Column blocks keep temporaries small (cache-resident, no page faults on fresh memory).
    block = max(256, (1 << 19) // max(rows.size, 1))
    for c0 in range(0, m, block):
        c1 = min(m, c0 + block)
        _block_stats(x[rows, c0:c1] if excluded else x[:, c0:c1], qs, n[c0:c1], mean[c0:c1], std[c0:c1],
                     vmin[c0:c1], vmax[c0:c1], qarr[:, c0:c1])

    tq = _t_quantiles(n, confidence)
    k = tolerance_factors(n, coverage=coverage, confidence=confidence)
    with np.errstate(invalid="ignore", divide="ignore"):
        half_ci = tq * std / np.sqrt(n)
        half_ti = k * std
    return Band(steps=step_arr, n=n.astype(np.int64), mean=mean, std=std, min=vmin, max=vmax,
                quantile_levels=qs, quantiles=qarr, ci_low=mean - half_ci, ci_high=mean + half_ci,
                ti_low=mean - half_ti, ti_high=mean + half_ti, coverage=float(coverage),
                confidence=float(confidence), n_runs=runs, excluded_runs=excluded)


def _default_q(band: Band, in_sample: bool) -> float:
    q = 0.0
    ns = np.unique(band.n[np.isfinite(band.ti_low)])
    for n in ns[ns >= 3]:
        k = normal_tolerance_factor(int(n), coverage=band.coverage, confidence=band.confidence)
        if in_sample:
            qn = stats.beta.sf(n * k * k / (n - 1) ** 2, 0.5, (n - 2) / 2.0)
        else:
            qn = 2.0 * stats.t.sf(k / np.sqrt(1.0 + 1.0 / n), n - 1)
        q = max(q, float(qn))
    return min(max(q, 1e-12), 1.0 - 1e-12)


@dataclass(frozen=True)
class OutOfBand:
    """Per-run exceedance counts against a band and the binomial decision rule."""

    exceedances: np.ndarray  # (runs,) steps where the run is outside [ti_low, ti_high]
    checkpoints: np.ndarray  # (runs,) steps where both the run and the band are defined
    threshold: np.ndarray  # (runs,) largest count still compatible with chance
    p_value: np.ndarray  # (runs,) P(Binomial(K, q) >= count)
    flagged: np.ndarray  # (runs,) bool
    q: float
    level: float  # per-run false-alarm level actually used
    bonferroni: bool


def out_of_band_runs(
    matrix,
    band: Band,
    *,
    q: float | None = None,
    false_alarm: float = 0.01,
    bonferroni: bool = False,
    in_sample: bool = True,
) -> OutOfBand:
    """Flag runs that leave the band at more steps than chance allows.

    With K checkpoints and a per-step exceedance probability q, a run is flagged when its
    exceedance count is above the upper ``false_alarm`` quantile of Binomial(K, q) — an exact
    binomial test per run; with ``bonferroni`` the level is divided by the number of runs.

    Default q: the exact normal-theory probability that a healthy run falls outside
    mean ± k·s. For a run that is one of the n runs the band was built from (``in_sample``),
    n(xᵢ − x̄)²/((n−1)²s²) ~ Beta(1/2, (n−2)/2) (Pope 1976; the internally studentised
    residual), so q = P(Beta > n k²/(n−1)²); for a new run, q = 2 P(t_{n−1} > k/√(1+1/n)).
    With varying n per step the largest q is used (conservative). ``q = 1 − coverage`` is the
    distribution-free bound but is so conservative that it rarely flags anything. Caveat: the
    binomial model treats steps as independent. Training
    curves are autocorrelated, so a run that sits persistently high is exactly what this
    flags; it is a screening rule, not a test of a curve-level hypothesis.
    """
    x = check_matrix(matrix)
    if x.shape[1] != band.steps.size:
        raise ValueError(f"matrix has {x.shape[1]} steps but the band has {band.steps.size}")
    qq = _default_q(band, in_sample) if q is None else float(q)
    if not (0 < qq < 1) or not (0 < false_alarm < 1):
        raise ValueError("q and false_alarm must be strictly between 0 and 1")
    runs = x.shape[0]
    level = false_alarm / max(runs, 1) if bonferroni else float(false_alarm)
    defined = np.isfinite(x) & np.isfinite(band.ti_low)[None, :] & np.isfinite(band.ti_high)[None, :]
    with np.errstate(invalid="ignore"):
        out = defined & ((x < band.ti_low[None, :]) | (x > band.ti_high[None, :]))
    counts = out.sum(axis=1)
    k = defined.sum(axis=1)
    threshold = stats.binom.isf(level, k, qq)  # P(X > threshold) <= level
    pval = stats.binom.sf(counts - 1, k, qq)
    return OutOfBand(exceedances=counts, checkpoints=k, threshold=threshold.astype(np.int64),
                     p_value=pval, flagged=(counts > threshold) & (k > 0), q=qq, level=level,
                     bonferroni=bool(bonferroni))


@dataclass(frozen=True)
class CurveOutliers:
    """The whole-curve leave-one-out outlier test over runs (see ``out_of_band_curves``).

    Arrays have one entry per run given. ``testable`` is False (nothing flagged, ``reason`` says
    why) with fewer than 3 runs or no step shared by all runs."""

    testable: bool
    level_score: np.ndarray  # (runs,) the run's mean standardized deviation over the shared steps
    statistic: np.ndarray  # (runs,) studentized deleted residual of level_score
    df: int  # degrees of freedom of the t reference distribution (runs − 2)
    p_value: np.ndarray  # (runs,) two-sided, per run
    p_adjusted: np.ndarray  # (runs,) Bonferroni over runs: min(1, runs × p)
    flagged: np.ndarray  # (runs,) bool: p_adjusted < false_alarm
    steps_used: int
    false_alarm: float  # per-study familywise level
    exact: bool  # True when the flags came from a zero-spread (bit-identical) comparison
    reason: str
    method: str = "leave-one-out studentized deleted residual of the whole-curve level, t(n-2), Bonferroni"


def curve_levels(x: np.ndarray) -> tuple[np.ndarray | None, int]:
    """Each run's whole-curve level, ``mean_t (x_it − m_t) / s_t`` over the steps every run logged
    with a finite value, m_t and s_t the mean and sd over the runs (rows of ``x``) at step t; steps
    where s_t = 0 carry no information and are skipped. Returns (levels, number of shared steps);
    levels is None when no shared step varies (also when none is shared: then the count is 0).
    The weights are a symmetric function of the runs, so exchangeable runs give exchangeable levels."""
    runs, m = x.shape
    total = np.zeros(runs)
    k = used = 0
    # Column blocks: temporaries stay a few MB however long the curves are.
    block = max(256, (1 << 19) // max(runs, 1))
    for c0 in range(0, m, block):
        xb = x[:, c0:c0 + block]
        shared = np.isfinite(xb).all(axis=0)
        k += int(shared.sum())
        if runs < 2 or not shared.any():
            continue
        xs = xb if shared.all() else xb[:, shared]
        d = xs - xs.mean(axis=0)  # the deviations and sd exactly as ``xs.std(axis=0, ddof=1)`` forms them
        s = np.sqrt(np.einsum("ij,ij->j", d, d) / (runs - 1))
        informative = s > 0
        if informative.all():
            d /= s
        elif informative.any():
            d = d[:, informative] / s[informative]
        else:
            continue
        total += d.sum(axis=1)
        used += int(informative.sum())
    if k == 0 or runs < 2 or used == 0:
        return None, k
    return total / used, k


def out_of_band_curves(matrix, *, false_alarm: float = 0.01) -> CurveOutliers:
    """Flag runs whose whole curve sits outside the band of the *other* runs.

    Each run i is reduced to one number, its level over the steps that every run logged with a
    finite value: ``level_i = mean_t (x_it − m_t) / s_t`` with m_t, s_t the mean and sd over runs
    at step t (steps where s_t = 0 carry no information and are skipped). The weights 1/s_t are
    a symmetric function of the runs, so healthy runs (exchangeable: persistent seed offsets plus
    autocorrelated noise) give exchangeable levels, and averaging over steps removes the step
    autocorrelation problem of per-step rules. Run i is then compared to the other n − 1 levels by
    the studentized deleted residual

        t_i = (level_i − mean_{−i}) / (sd_{−i} √(1 + 1/(n − 1)))  ~  t_{n−2}

    — a normal-theory prediction interval for one new observation (Hahn & Meeker 1991,
    *Statistical Intervals*, §4.6), equivalently the externally studentized residual of
    Cook & Weisberg (1982, *Residuals and Influence in Regression*, §2.2.2). A run is flagged
    when the two-sided p-value times n (Bonferroni over runs) is below ``false_alarm``, so the
    probability that a healthy study flags any run is at most ``false_alarm`` when the levels
    are normal (exact up to the Bonferroni inequality; the data-dependent weights make it
    approximate, which the calibration harness measures). With n = 5 runs the reference is t_3,
    so a planted bad seed *can* be flagged (unlike a per-step band that contains the run).

    Degenerate case, answered exactly: when the other runs' levels are identical (sd_{−i} = 0),
    run i is flagged iff its level differs (p = 0), else not (p = 1).
    """
    x = check_matrix(matrix)
    if not (0 < false_alarm < 1):
        raise ValueError(f"false_alarm must be strictly between 0 and 1, got {false_alarm!r}")
    n = x.shape[0]
    nan = np.full(n, np.nan)
    none = np.zeros(n, dtype=bool)

    def untestable(why):
        return CurveOutliers(False, nan, nan, max(n - 2, 0), nan, nan, none, 0, float(false_alarm), False, why)

    if n < 3:
        return untestable(f"{n} run(s): need at least 3 to compare a run with the others")
    level, k = curve_levels(x)
    if k == 0:
        return untestable("no step logged with a finite value by every run")
    if level is None:  # every run bit-identical at every shared step: exactly nothing to flag
        z = np.zeros(n)
        return CurveOutliers(True, z, z, n - 2, np.ones(n), np.ones(n), none, k, float(false_alarm), True,
                             f"all {n} runs identical at the {k} shared steps")
    total, total2 = level.sum(), (level * level).sum()
    mean_o = (total - level) / (n - 1)
    var_o = np.maximum((total2 - level * level - (n - 1) * mean_o * mean_o) / (n - 2), 0.0)
    # recompute exactly where cancellation could matter (tiny spreads)
    for i in np.flatnonzero(var_o <= 1e-12 * max(1.0, float(np.max(np.abs(level))) ** 2)):
        others = np.delete(level, i)
        var_o[i] = others.var(ddof=1)
    sd_o = np.sqrt(var_o)
    diff = level - mean_o
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(sd_o > 0, diff / (sd_o * np.sqrt(1.0 + 1.0 / (n - 1))),
                     np.where(diff == 0, 0.0, np.sign(diff) * np.inf))
    p = 2.0 * stats.t.sf(np.abs(t), n - 2)
    p = np.where(sd_o > 0, p, np.where(diff == 0, 1.0, 0.0))
    padj = np.minimum(1.0, n * p)
    flagged = padj < false_alarm
    exact = bool((sd_o == 0).any())
    reason = (f"{int(flagged.sum())} of {n} runs outside the others' whole-curve band "
              f"(false alarm ≤ {false_alarm:g} per study, {k} shared steps)")
    return CurveOutliers(True, level, t, n - 2, p, padj, flagged, k, float(false_alarm), exact, reason)
