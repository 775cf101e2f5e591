"""Per-step seed bands over a ``runs × steps`` matrix, and out-of-band run detection."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import scipy

from steady.server.stats.align import check_matrix
from steady.server.stats.intervals import normal_tolerance_factor
from steady.server.stats.quantiles import t_ppf

__all__ = ["Band", "compute_band", "BandBlocks", "block_width", "OutOfBand", "out_of_band_runs", "tolerance_factors", "CurveOutliers",
           "curve_levels", "out_of_band_curves", "window_levels", "null_max_deleted_t", "SEED_SKEW_LOGSD",
           "SEED_TAIL_DF", "critical_deleted_t", "MAX_WINDOW_OUTLIERS",
           "N_WINDOWS", "WINDOW_SHARE"]

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


def _distinct(n: np.ndarray) -> np.ndarray:
    """``np.unique(n)``, without hashing every step when all steps count the same runs."""
    if n.size and n.min() == n.max():
        return n.reshape(-1)[:1]
    return np.unique(n)


def tolerance_factors(n, *, coverage: float, confidence: float) -> np.ndarray:
    """Exact tolerance factor for each entry of the integer array ``n`` (NaN where n < 2),
    computed once per distinct n."""
    n = np.asarray(n)
    out = np.full(n.shape, np.nan)
    for value in _distinct(n):
        if value >= 2:
            out[n == value] = normal_tolerance_factor(int(value), coverage=coverage, confidence=confidence)
    return out


def _t_quantiles(n: np.ndarray, confidence: float) -> np.ndarray:
    out = np.full(n.shape, np.nan)
    for value in _distinct(n):
        if value >= 2:
            out[n == value] = t_ppf(0.5 + confidence / 2.0, int(value) - 1)
    return out


def _block_stats(xb, qs, n_out, mean_out, std_out, min_out, max_out, q_out, *, owned: bool = False) -> None:
    """Fill per-column statistics of one block (rows = runs); NaN/±Inf cells are skipped. ``owned``: the
    block is a C-contiguous float64 array the caller gives up (sorted in place, not copied)."""
    xs = xb if owned else np.array(xb, dtype=np.float64, copy=True)
    if np.isfinite(xs).all():
        _finite_block_stats(xs, qs, n_out, mean_out, std_out, min_out, max_out, q_out)
        return
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


def _finite_block_stats(xs, qs, n_out, mean_out, std_out, min_out, max_out, q_out) -> None:
    """``_block_stats`` of a block with every cell finite, sorted in place: every column has the
    same n, so min, max and the quantiles are whole rows of the sorted block, not gathers. Same
    operations on the same values in the same order as the general path, so the same bits."""
    runs = xs.shape[0]
    n_out[:] = runs
    if runs == 0:
        return
    xs.sort(axis=0)
    last = runs - 1
    min_out[:] = xs[0]
    max_out[:] = xs[last]
    for j, q in enumerate(qs):  # numpy's default "linear" (Hyndman & Fan type 7) quantile
        pos = np.float64(q * last)
        lo = int(np.floor(pos))
        hi = min(lo + 1, last)
        a, b = xs[lo], xs[hi]
        q_out[j] = a + (b - a) * (pos - np.float64(lo))
    n = np.int64(runs)
    with np.errstate(invalid="ignore", divide="ignore"):
        mu = xs.sum(axis=0) / n
        xs -= mu
        var = np.einsum("ij,ij->j", xs, xs) / (n - 1)
    mean_out[:] = mu
    if runs > 1:
        std_out[:] = np.sqrt(np.maximum(var, 0.0))


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
    if diverged is None:
        div = np.isinf(x).any(axis=1) if runs else np.zeros(0, bool)
    else:
        div = np.asarray(diverged, dtype=bool)
        if div.shape != (runs,):
            raise ValueError(f"diverged must have one flag per run ({runs}), got shape {div.shape}")
    excluded = tuple(int(i) for i in np.flatnonzero(div))
    rows = np.flatnonzero(~div)
    width = block_width(rows.size)
    band = BandBlocks(step_arr, n_runs=runs, excluded_runs=excluded, coverage=coverage, confidence=confidence,
                      quantiles=quantiles)
    for c0 in range(0, m, width):
        band.add(c0, x[rows, c0:c0 + width] if excluded else x[:, c0:c0 + width])
    return band.band()


def block_width(rows: int) -> int:
    """The columns of one block of ``BandBlocks`` over ``rows`` runs: temporaries stay small
    (cache-resident, no page faults on fresh memory)."""
    return max(256, (1 << 19) // max(rows, 1))


class BandBlocks:
    """``compute_band`` of a matrix given as column blocks (rows = the runs that enter the band), so the
    matrix need not be held whole: ``add`` each block at its first column, in any order and from several
    threads at once (blocks never overlap), then ``band``. Blocks ``block_width(rows)`` wide, at multiples
    of it, give ``compute_band``'s bits."""

    def __init__(self, steps, *, n_runs: int, excluded_runs: tuple = (), coverage: float = 0.9,
                 confidence: float = 0.95, quantiles=DEFAULT_QUANTILES) -> None:
        if not (0 < coverage < 1 and 0 < confidence < 1):
            raise ValueError("coverage and confidence must be strictly between 0 and 1")
        self.qs = tuple(float(q) for q in quantiles)
        if any(not (0.0 <= q <= 1.0) for q in self.qs):
            raise ValueError(f"quantiles must lie in [0, 1], got {self.qs}")
        self.steps = np.asarray(steps)
        self.n_runs, self.excluded_runs = int(n_runs), tuple(excluded_runs)
        self.coverage, self.confidence = float(coverage), float(confidence)
        m = self.steps.size
        # Sorting each column puts NaN last, so min/max/quantiles are gathers (one O(R log R) pass).
        self.n = np.zeros(m, dtype=np.int64)
        self.mean, self.std, self.min, self.max = (np.full(m, np.nan) for _ in range(4))
        self.quantiles = np.full((len(self.qs), m), np.nan)
        self._added = np.zeros(m, dtype=bool)

    def add(self, c0: int, block, *, owned: bool = False) -> None:
        """The statistics of the columns ``c0`` on of ``block``. ``owned``: the block is a C-contiguous
        float64 array the caller gives up (sorted in place, not copied)."""
        c1 = c0 + block.shape[1]
        if c0 < 0 or c1 > self.steps.size:
            raise ValueError(f"a block at columns {c0}..{c1} lies outside the {self.steps.size} steps given")
        _block_stats(block, self.qs, self.n[c0:c1], self.mean[c0:c1], self.std[c0:c1], self.min[c0:c1],
                     self.max[c0:c1], self.quantiles[:, c0:c1], owned=owned)
        self._added[c0:c1] = True

    def band(self) -> Band:
        if not self._added.all() and self.n_runs > len(self.excluded_runs):
            raise ValueError(f"blocks hold {int(self._added.sum())} of the {self.steps.size} steps given")
        n, std, mean = self.n, self.std, self.mean
        tq = _t_quantiles(n, self.confidence)
        k = tolerance_factors(n, coverage=self.coverage, confidence=self.confidence)
        with np.errstate(invalid="ignore", divide="ignore"):
            half_ci = tq * std / np.sqrt(n)
            half_ti = k * std
        return Band(steps=self.steps, n=n.astype(np.int64), mean=mean, std=std, min=self.min, max=self.max,
                    quantile_levels=self.qs, quantiles=self.quantiles, ci_low=mean - half_ci, ci_high=mean + half_ci,
                    ti_low=mean - half_ti, ti_high=mean + half_ti, coverage=self.coverage,
                    confidence=self.confidence, n_runs=self.n_runs, excluded_runs=self.excluded_runs)


def _default_q(band: Band, in_sample: bool) -> float:
    q = 0.0
    ns = np.unique(band.n[np.isfinite(band.ti_low)])
    for n in ns[ns >= 3]:
        k = normal_tolerance_factor(int(n), coverage=band.coverage, confidence=band.confidence)
        if in_sample:
            qn = scipy.stats.beta.sf(n * k * k / (n - 1) ** 2, 0.5, (n - 2) / 2.0)
        else:
            qn = 2.0 * scipy.stats.t.sf(k / np.sqrt(1.0 + 1.0 / n), n - 1)
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
    threshold = scipy.stats.binom.isf(level, k, qq)  # P(X > threshold) <= level
    pval = scipy.stats.binom.sf(counts - 1, k, qq)
    return OutOfBand(exceedances=counts, checkpoints=k, threshold=threshold.astype(np.int64),
                     p_value=pval, flagged=(counts > threshold) & (k > 0), q=qq, level=level,
                     bonferroni=bool(bonferroni))


# The seed effects the out-of-band level is calibrated for: per-seed levels as skewed as a lognormal with
# log-sd 0.6 (skewness 2.3), and as heavy-tailed as a symmetric Student-t with 3 degrees of freedom (infinite
# kurtosis). The familywise p is the larger of the two nulls'. Calibrated for log-sd 0.5 alone, t3 and log-sd 0.6
# seed offsets gave 7/400 false alarms each at 1% (20 seeds), and no check on one study could see them: a false
# flag takes the one extreme seed out and leaves the others looking ordinary.
SEED_SKEW_LOGSD = 0.6
SEED_TAIL_DF = 3
# Consecutive windows of the shared steps the worst-window statistic looks at (each a tenth of the curve).
N_WINDOWS = 10
# The share of the per-study level the worst-window statistic spends (the whole curve gets the rest):
# a late blow-up is far out, so a small share names it, and the whole-curve test keeps most of its power.
WINDOW_SHARE = 0.2
# Runs that may blow up together in one window and still be named (generalized ESD steps, ≤ a third of the runs).
MAX_WINDOW_OUTLIERS = 3
_NULL_SIMS = 200_000


@dataclass(frozen=True)
class CurveOutliers:
    """The leave-one-out outlier test over runs (see ``out_of_band_curves``): the whole curve, and
    the worst of ``N_WINDOWS`` consecutive windows of it.

    Arrays have one entry per run given. ``testable`` is False (nothing flagged, ``reason`` says
    why) with fewer than 3 runs or no step shared by all runs."""

    testable: bool
    level_score: np.ndarray  # (runs,) the run's mean standardized deviation over the shared steps
    statistic: np.ndarray  # (runs,) studentized deleted residual of level_score
    df: int  # degrees of freedom of the t reference distribution (runs − 2)
    p_value: np.ndarray  # (runs,) two-sided normal-theory t(n − 2) p-value of ``statistic``, per run
    p_adjusted: np.ndarray  # (runs,) familywise over runs, whole curve and windows, skew-calibrated
    flagged: np.ndarray  # (runs,) bool: p_adjusted < false_alarm
    steps_used: int
    false_alarm: float  # per-study familywise level
    exact: bool  # True when the flags came from a zero-spread (bit-identical) comparison
    reason: str
    method: str = ("leave-one-out studentized deleted residual of the whole-curve level and of the worst of "
                   f"{N_WINDOWS} windows; familywise level calibrated for lognormal (log-sd {SEED_SKEW_LOGSD}) and "
                   f"Student-t({SEED_TAIL_DF}) seed effects, not Bonferroni-t")
    window_statistic: np.ndarray | None = None  # (runs,) |deleted residual| in the run's worst window
    window_steps: tuple = ()  # per run: (first step index, last step index) of its worst window, or None
    windows: int = 0  # windows looked at (0: too few shared steps, whole curve only)
    by_window: np.ndarray | None = None  # (runs,) bool: flagged by the window statistic, not the whole curve
    skew_ok: bool = True  # False when the runs' levels are visibly more skewed than the level is calibrated for
    skewness: float = float("nan")  # sample skewness of the whole-curve levels, run with the largest |t| left out


def curve_levels(x: np.ndarray) -> tuple[np.ndarray | None, int]:
    """Each run's whole-curve level, ``mean_t (x_it − m_t) / s_t`` over the steps every run logged
    with a finite value, m_t and s_t the mean and sd over the runs (rows of ``x``) at step t; steps
    where s_t = 0 carry no information and are skipped. Returns (levels, number of shared steps);
    levels is None when no shared step varies (also when none is shared: then the count is 0).
    The weights are a symmetric function of the runs, so exchangeable runs give exchangeable levels."""
    whole, _, k, _ = window_levels(x, windows=0)
    return whole, k


def window_levels(x: np.ndarray, *, windows: int = N_WINDOWS
                  ) -> tuple[np.ndarray | None, np.ndarray, int, list[tuple[int, int]]]:
    """The whole-curve level of each run (as ``curve_levels``) and its level over each of ``windows``
    consecutive, equal parts of the shared steps (the same standardized deviations, averaged over the
    window only). Returns (whole (runs,) or None, windowed (runs × windows), shared step count, the
    (first, last) column index of each window). A window with no informative step is NaN; with fewer
    than 2 shared steps per window no windows are formed (windowed has 0 columns).

    A window's level is the run's plain mean deviation from the step means over the window, not
    the standardized one: a standardized deviation is bounded by (n − 1)/√n (Samuelson 1968), so a
    run that grows ×40 late would look no further out than a run a little above the others. Any
    fixed average over steps keeps exchangeable runs exchangeable."""
    runs, m = x.shape
    shared_all = np.zeros(m, dtype=bool)
    block = max(256, (1 << 19) // max(runs, 1))  # column blocks: temporaries stay a few MB
    for c0 in range(0, m, block):
        shared_all[c0:c0 + block] = np.isfinite(x[:, c0:c0 + block]).all(axis=0)
    cols = np.flatnonzero(shared_all)
    k = int(cols.size)
    w = int(windows) if k >= 2 * max(int(windows), 1) else 0
    seg = np.zeros(m, dtype=np.int64)
    spans: list[tuple[int, int]] = []
    if w:
        for j, part in enumerate(np.array_split(cols, w)):
            seg[part] = j
            spans.append((int(part[0]), int(part[-1])))
    total = np.zeros(runs)
    wsum = np.zeros((runs, max(w, 1)))
    wused = np.zeros(max(w, 1), dtype=np.int64)
    used = 0
    if runs >= 2:
        for c0 in range(0, m, block):
            sh = shared_all[c0:c0 + block]
            if not sh.any():
                continue
            xb = x[:, c0:c0 + block]
            xs = xb if sh.all() else xb[:, sh]
            d = xs - xs.mean(axis=0)
            if w:  # a window's level: the run's plain mean deviation there (a late blow-up is not bounded)
                sid = seg[c0:c0 + block][sh]
                for j in np.unique(sid):
                    sel = sid == j
                    wsum[:, j] += d[:, sel].sum(axis=1)
                    wused[j] += int(sel.sum())
            s = np.sqrt(np.einsum("ij,ij->j", d, d) / (runs - 1))
            informative = s > 0
            if not informative.any():
                continue
            d = d[:, informative] / s[informative]
            total += d.sum(axis=1)
            used += int(informative.sum())
    if k == 0 or runs < 2 or used == 0:
        return None, np.zeros((runs, 0)), k, []
    wl = wsum[:, :w] / np.maximum(wused[None, :w], 1)
    return total / used, wl, k, spans


def _deleted_t(level: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Studentized deleted residual of each entry along the last axis (any leading shape):
    t_i = (l_i − mean_{−i}) / (sd_{−i} √(1 + 1/(n − 1))). Returns (t, diff, sd_{−i}); where
    sd_{−i} = 0, t is 0 (diff = 0) or ±inf."""
    n = level.shape[-1]
    total = level.sum(axis=-1, keepdims=True)
    total2 = (level * level).sum(axis=-1, keepdims=True)
    mean_o = (total - level) / (n - 1)
    var_o = np.maximum((total2 - level * level - (n - 1) * mean_o * mean_o) / (n - 2), 0.0)
    if level.ndim <= 2:  # recompute exactly where cancellation could matter (tiny spreads)
        scale = np.maximum(1.0, np.max(np.abs(level), axis=-1, keepdims=True)) ** 2
        for idx in np.argwhere(var_o <= 1e-12 * scale):
            row = level[tuple(idx[:-1])]
            var_o[tuple(idx)] = np.delete(row, idx[-1]).var(ddof=1)
    sd_o = np.sqrt(var_o)
    diff = level - mean_o
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(sd_o > 0, diff / (sd_o * np.sqrt(1.0 + 1.0 / (n - 1))),
                     np.where(diff == 0, 0.0, np.sign(diff) * np.inf))
    return t, diff, sd_o


@lru_cache(maxsize=64)
def null_max_deleted_t(n: int, *, logsd: float = SEED_SKEW_LOGSD, df: int = 0, sims: int = _NULL_SIMS,
                       chunk_values: int = 200_000) -> np.ndarray:
    """The sorted simulated null distribution of max_i |t_i| (``_deleted_t``) over ``n`` runs whose
    levels are i.i.d. lognormal with log-sd ``logsd`` or, with ``df`` > 0, i.i.d. Student-t with ``df``
    degrees of freedom (location and scale do not matter: t is invariant to both). Seeded by n (and the
    family), so the same n always gives the same table. ``logsd = 0`` gives normal levels, where
    P(max |t_i| ≥ c) ≤ n · 2 P(t_{n−2} ≥ c) (Bonferroni)."""
    if n < 3:
        raise ValueError(f"need at least 3 runs, got {n}")
    seed = [20263, n, int(df)] if df > 0 else [20261, n, int(round(logsd * 1000))]
    rng = np.random.default_rng(seed)
    out = np.empty(sims)
    # ``chunk_values`` per temporary: at 200,000 (1.6 MB) the allocator reuses its blocks, while 16 MB ones were
    # mapped afresh for every intermediate and their page faults tripled the time. The draws come in the same
    # order whatever the chunk, so the table is the same bit for bit.
    chunk = max(1000, chunk_values // n)
    for c0 in range(0, sims, chunk):
        b = min(chunk, sims - c0)
        if df > 0:
            lv = rng.standard_t(df, (b, n))
        else:
            z = rng.standard_normal((b, n))
            lv = np.exp(logsd * z) if logsd > 0 else z
        t, _, _ = _deleted_t(lv)
        out[c0:c0 + b] = np.abs(t).max(axis=-1)
    out.sort()
    out.setflags(write=False)
    return out


def _nulls(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The two calibrated nulls of max |t| over n runs: lognormal (log-sd SEED_SKEW_LOGSD) and t(SEED_TAIL_DF) levels."""
    return null_max_deleted_t(n), null_max_deleted_t(n, df=SEED_TAIL_DF)


def critical_deleted_t(n: int, level: float) -> float:
    """The |t| a run's deleted residual must reach to be flagged at familywise ``level`` among n runs: the larger
    of the (1 − level) quantiles of the two calibrated nulls (``_nulls``)."""
    return max(float(np.quantile(null, 1.0 - level)) for null in _nulls(int(n)))


def _familywise_p(abs_t: np.ndarray, n: int) -> np.ndarray:
    """P(max_i |t_i| ≥ |t|) under the calibrated nulls, (1 + count) / (sims + 1) (Davison & Hinkley 1997,
    eq. 4.11), the larger of the lognormal and the Student-t one; +inf gives 0 (the degenerate, exact case)."""
    p = np.zeros(np.shape(abs_t))
    for null in _nulls(n):
        above = null.size - np.searchsorted(null, abs_t, side="left")
        p = np.maximum(p, (1.0 + above) / (null.size + 1.0))
    return np.where(np.isinf(abs_t), 0.0, np.where(np.isnan(abs_t), 1.0, p))


def _window_esd(wl: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per run and window (``wl``: runs × windows): the generalized ESD many-outlier procedure
    (Rosner 1983) with the deleted residual and the skew-calibrated null. In each window the most
    extreme run is taken out, then the most extreme of the rest, up to ``MAX_WINDOW_OUTLIERS``
    (at most a third of the runs); R_j is the j-th one's |t| among the n − j + 1 runs left, with
    familywise p_j = P(max |t| ≥ R_j) for n − j + 1 runs (``null_max_deleted_t``). Several runs that
    blow up together inflate each other's sd_{−i} (masking); the step-up rule flags the first j
    runs taken out when p_j is small, so they cannot hide each other. A run's p in the window is
    min over j ≥ (its order) of k · p_j (Bonferroni over the k steps); a run never taken out gets
    its own deleted residual's p times k. Returns (statistic, p) of shape runs × windows."""
    n, w = wl.shape
    k = max(1, min(MAX_WINDOW_OUTLIERS, n // 3))
    t0, _, _ = _deleted_t(wl.T)
    stat = np.abs(t0).T.copy()
    p = np.minimum(1.0, k * _familywise_p(stat, n))
    if k == 1:
        return stat, p
    lv = wl.T  # (windows, runs)
    alive = np.ones((w, n), dtype=bool)
    rows = np.arange(w)
    tiny = 1e-12 * np.maximum(1.0, np.max(np.abs(lv), axis=1)) ** 2
    order, pj = [], []
    for step in range(k):
        m = n - step
        z = np.where(alive, lv, 0.0)
        total, total2 = z.sum(axis=1, keepdims=True), (z * z).sum(axis=1, keepdims=True)
        mean_o = (total - lv) / (m - 1)
        var_o = np.maximum((total2 - lv * lv - (m - 1) * mean_o * mean_o) / (m - 2), 0.0)
        diff = lv - mean_o
        flat = var_o <= tiny[:, None]  # the others identical (up to rounding): exact, as ``_deleted_t``
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(flat, np.where(np.abs(diff) <= np.sqrt(tiny)[:, None], 0.0, np.inf),
                         np.abs(diff) / np.sqrt(var_o * (1.0 + 1.0 / (m - 1))))
        t = np.where(alive, t, -1.0)
        i = np.argmax(t, axis=1)
        r = t[rows, i]
        order.append(i)
        pj.append(np.minimum(1.0, k * _familywise_p(r, m)))
        alive[rows, i] = False
    tail = np.minimum.accumulate(np.array(pj)[::-1], axis=0)[::-1]  # (k, windows): min over j >= order
    for step, i in enumerate(order):
        p[i, rows] = np.minimum(p[i, rows], tail[step])
    return stat, p


def _sample_skewness(v: np.ndarray) -> np.ndarray | float:
    """The adjusted Fisher–Pearson sample skewness G1 along the last axis (as
    ``scipy.stats.skew(v, bias=False)``; Joanes & Gill 1998)."""
    m = v.shape[-1]
    d = v - v.mean(axis=-1, keepdims=True)
    m2 = (d * d).mean(axis=-1)
    m3 = (d * d * d).mean(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        g1 = m3 / m2**1.5 * np.sqrt(m * (m - 1.0)) / (m - 2.0)
    return float(g1) if np.ndim(g1) == 0 else g1


def _skewness_limit(n: int) -> float:
    """The 99.5th percentile of |sample skewness| of n − 1 lognormal(log-sd SEED_SKEW_LOGSD) levels:
    skew beyond it says the seed effects are more skewed than the level is calibrated for."""
    return _skew_limits(n - 1)


@lru_cache(maxsize=64)
def _skew_limits(m: int) -> float:
    rng = np.random.default_rng([20262, m, int(round(SEED_SKEW_LOGSD * 1000))])
    lv = np.exp(SEED_SKEW_LOGSD * rng.standard_normal((20_000, m)))
    return float(np.quantile(np.abs(_sample_skewness(lv)), 0.995))


def out_of_band_curves(matrix, *, false_alarm: float = 0.01, windows: int = N_WINDOWS) -> CurveOutliers:
    """Flag runs whose whole curve, or one tenth of it, sits outside the band of the *other* runs.

    Each run i is reduced to its level over the steps that every run logged with a finite value:
    ``level_i = mean_t (x_it − m_t) / s_t`` with m_t, s_t the mean and sd over runs at step t
    (steps where s_t = 0 carry no information and are skipped), and to the same mean over each
    of ``windows`` consecutive equal parts of those steps. The weights 1/s_t are a symmetric
    function of the runs, so healthy (exchangeable) runs give exchangeable levels, and averaging
    over steps removes the step autocorrelation problem of per-step rules. Run i is compared to
    the other n − 1 levels by the studentized deleted residual

        t_i = (level_i − mean_{−i}) / (sd_{−i} √(1 + 1/(n − 1)))

    (Hahn & Meeker 1991, *Statistical Intervals*, §4.6; Cook & Weisberg 1982, §2.2.2), which is
    t_{n−2} for normal levels (``p_value``). Seeds often act multiplicatively (a per-seed learning
    speed, a per-seed scale of the excess loss), which makes the levels right-skewed, or now and then
    land far out on either side (heavy tails), and a Bonferroni t level (p < α/n) reaches far into
    those tails. So the familywise level is calibrated instead: ``p_adjusted`` is the larger of
    P(max_i |t_i| ≥ |t|) under i.i.d. lognormal levels with log-sd ``SEED_SKEW_LOGSD`` and under
    i.i.d. Student-t(``SEED_TAIL_DF``) levels (simulated, ``null_max_deleted_t``), for the whole curve at
    (1 − ``WINDOW_SHARE``)·α and, for the worst window, with the window maxima treated as
    independent (1 − (1 − p)^windows) at ``WINDOW_SHARE``·α (a union bound over the two parts);
    ``p_adjusted`` is the smaller p over its share. In a window the deleted residual goes through
    the generalized ESD procedure (``_window_esd``), so that up to ``MAX_WINDOW_OUTLIERS`` runs that
    blow up together cannot mask each other. The window statistic is what names a run that stays in the band and then
    blows up late: its whole-curve level dilutes a late excursion, one window's does not.

    When the levels of the other runs are visibly more skewed than the calibration covers
    (sample skewness beyond the 99.5th percentile for lognormal log-sd 0.6) ``skew_ok`` is False
    and the reason says the level is not claimed.

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
    level, wl, k, spans = window_levels(x, windows=windows)
    if k == 0:
        return untestable("no step logged with a finite value by every run")
    if level is None:  # every run bit-identical at every shared step: exactly nothing to flag
        z = np.zeros(n)
        return CurveOutliers(True, z, z, n - 2, np.ones(n), np.ones(n), none, k, float(false_alarm), True,
                             f"all {n} runs identical at the {k} shared steps")
    t, diff, sd_o = _deleted_t(level)
    p = 2.0 * scipy.stats.t.sf(np.abs(t), n - 2)
    p = np.where(sd_o > 0, p, np.where(diff == 0, 1.0, 0.0))
    exact = bool((sd_o == 0).any())
    p_whole = _familywise_p(np.abs(t), n)
    w = wl.shape[1]
    wt = np.zeros(n)
    wspan: list = [None] * n
    p_win = np.ones(n)
    if w:
        tw, pw_all = _window_esd(wl)  # (runs, windows)
        exact = exact or bool(np.isinf(tw).any())
        worst = np.argmin(pw_all - 1e-9 * np.minimum(tw, 1e300), axis=1)  # ties (p at its floor): the larger statistic
        wt = tw[np.arange(n), worst]
        wspan = [spans[j] for j in worst]
        p_win = 1.0 - (1.0 - pw_all[np.arange(n), worst]) ** w
        padj = np.minimum(1.0, np.minimum(p_whole / (1.0 - WINDOW_SHARE), p_win / WINDOW_SHARE))
    else:
        padj = p_whole
    flagged = padj < false_alarm
    by_window = flagged & (p_win < p_whole) if w else none
    others = np.delete(level, int(np.argmax(np.abs(np.where(np.isfinite(t), t, 1e300)))))
    skew = float(_sample_skewness(others)) if n >= 4 and np.ptp(others) > 0 else float("nan")
    skew_ok = not (n >= 6 and np.isfinite(skew) and abs(skew) > _skewness_limit(n))
    reason = (f"{int(flagged.sum())} of {n} runs outside the others' band over the whole curve or its worst "
              f"window (false alarm ≤ {false_alarm:g} per study, {k} shared steps)")
    if not skew_ok:
        reason += (f"; the runs' levels are more skewed (skewness {skew:.2f}) than the level is calibrated for "
                   f"(lognormal seed effects, log-sd {SEED_SKEW_LOGSD:g}): the false-alarm level is not claimed")
    return CurveOutliers(True, level, t, n - 2, p, padj, flagged, k, float(false_alarm), exact, reason,
                         window_statistic=wt, window_steps=tuple(wspan), windows=w, by_window=by_window,
                         skew_ok=skew_ok, skewness=skew)
