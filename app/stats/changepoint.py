"""Shift detection in a sequence: has a suite's history of a final metric changed level?

One study of a suite gives one number (e.g. the mean final loss over its seeds of one stack
and determinism level); the sequence of those numbers, oldest first, is watched for a change
of mean.

Two methods:

* ``sequential_shift`` — what the ``suite_shift`` alert runs after every study: a
  self-starting CUSUM (Hawkins 1987) on winsorised scores (Lucas & Crosier 1982) of the
  studies' AR(1) innovations (``prewhitened_scores``: consecutive studies share data, code and
  machines, so their summaries can be correlated), whose threshold is set so that the
  probability of *any* false alarm over the first ``horizon`` evaluations is at most ``alpha``
  (for normal study summaries; the run-length distribution comes from the Brook & Evans 1972
  Markov chain, ``cusum_run_length``; checked by simulation for AR(1) summaries up to 0.5). An alarm claims
  that level only where its history rules out a slowly wandering environment (``wander_bound``).
  Re-evaluating after every study does not inflate the error.
* ``detect_shift`` — a one-shot permutation test of the maximal CUSUM statistic over a whole
  sequence. Valid for one look; re-run after every study its false alarms accumulate (5% over
  30 looks, 13% over 100 at α = 1%), which is why the alert no longer uses it.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy

__all__ = ["ShiftResult", "detect_shift", "DIRECTIONS", "SequentialShift", "RunLength", "sequential_shift",
           "self_starting_scores", "cusum_run_length", "cusum_threshold", "CUSUM_REFERENCE", "SCORE_CLIP",
           "EXCLUDE_ABOVE", "lag1_autocorrelations", "ar1_estimate", "prewhitened_scores", "Whitening",
           "shift_guarantee", "AR_LAG", "AR_MIN_VALUES", "AR_MARGIN_Z", "AR_TOO_DEPENDENT_Z", "AR_CHECKED_UP_TO",
           "wander_bound", "Wander", "WANDER_LAGS", "WANDER_Z", "WANDER_LIMIT", "WANDER_MIN_VALUES"]

# the CUSUM reference value k, in standard deviations: tuned to detect a 1σ shift fastest
CUSUM_REFERENCE = 0.5
# scores enter the CUSUM winsorised at ±2.5 (Lucas & Crosier 1982): one odd study cannot push it
# over the threshold, which keeps the false-alarm rate near nominal for skewed or heavy-tailed
# study summaries
SCORE_CLIP = 2.5
# a value scoring beyond ±4 (probability 6e-5 for normal data) does not enter the running mean
# and std: after a large jump the next values are still scored against the old level, instead
# of against estimates the jump itself inflated (the self-starting chart's blind spot on short
# histories)
EXCLUDE_ABOVE = 4.0

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
    base: dict[str, Any] = dict(alpha=float(alpha), n=n, n_permutations=int(n_permutations), direction=direction)
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


# --------------------------------------------------------------------------- sequential


@dataclass(frozen=True)
class RunLength:
    """Run length of a one-sided CUSUM on independent N(shift, 1) scores (optionally winsorised)."""

    k: float
    h: float
    clip: float | None  # scores winsorised at ±clip before entering the CUSUM
    arl: float  # average run length (evaluations until an alarm)
    p_alarm_by_horizon: float  # P(run length <= horizon)
    horizon: int
    shift: float  # mean of the scores (0: in control)


def _chain(h: float, k: float, shift: float, m: int, clip: float | None) -> np.ndarray:
    """Transient transition matrix of the discretised CUSUM (Brook & Evans 1972): state i is S ≈ i·w.

    S' = max(0, S + clip(Z) − k) with Z ~ N(shift, 1); an S' above h leaves the transient states."""
    w = 2.0 * h / (2 * m - 1)

    def cdf(t: np.ndarray) -> np.ndarray:  # P(clip(Z) <= t)
        p = scipy.stats.norm.cdf(t - shift)
        if clip is not None:
            p = np.where(t < -clip, 0.0, np.where(t >= clip, 1.0, p))
        return p

    # transitions depend on j − i only: evaluate the CDF once per offset
    offsets = np.arange(-(m - 1), m)
    hi = cdf((offsets + 0.5) * w + k)
    lo = cdf((offsets - 0.5) * w + k)
    d = np.arange(m)[None, :] - np.arange(m)[:, None] + (m - 1)
    return np.where(np.arange(m)[None, :] == 0, hi[d], hi[d] - lo[d])


def cusum_run_length(h: float, *, k: float = CUSUM_REFERENCE, horizon: int = 100, shift: float = 0.0,
                     clip: float | None = None, states: int = 400) -> RunLength:
    """Run length of the one-sided CUSUM S_n = max(0, S_{n−1} + clip(Z_n) − k), alarm when S_n > h,
    Z ~ N(shift, 1) independent, S_0 = 0: its average (ARL) and P(alarm within ``horizon`` steps).

    Markov-chain approximation of Brook & Evans (1972, *Biometrika* 59:539). Without clip, 400
    states match the published ARLs (k = 0.5, h = 4: 336 in control, 8.38 at a 1σ shift; h = 5:
    930 and 10.4 — Montgomery, *Introduction to Statistical Quality Control*, Table 9.3,
    two-sided values doubled for one side) to within 0.5%.
    """
    if not h > 0 or not np.isfinite(h):
        raise ValueError(f"h must be positive and finite, got {h!r}")
    if int(horizon) != horizon or horizon < 1:
        raise ValueError(f"horizon must be a positive integer, got {horizon!r}")
    r = _chain(float(h), float(k), float(shift), int(states), clip)
    arl = float(np.linalg.solve(np.eye(states) - r, np.ones(states))[0])
    return RunLength(k=float(k), h=float(h), clip=clip, arl=arl, p_alarm_by_horizon=_p_alarm(r, int(horizon)),
                     horizon=int(horizon), shift=float(shift))


def _p_alarm(r: np.ndarray, horizon: int) -> float:
    alive = np.zeros(r.shape[0])
    alive[0] = 1.0
    for _ in range(horizon):
        alive = alive @ r
    return float(1.0 - alive.sum())


@functools.lru_cache(maxsize=256)
def cusum_threshold(alpha: float, horizon: int, *, k: float = CUSUM_REFERENCE, sides: int = 2,
                    clip: float | None = SCORE_CLIP) -> float:
    """The smallest CUSUM threshold h (to 1e-3) with P(one side alarms within ``horizon`` steps) ≤ alpha / sides.

    By the union bound the two-sided scheme then raises a false alarm within ``horizon`` steps
    with probability at most ``alpha`` (for independent N(0, 1) scores)."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be strictly between 0 and 1, got {alpha!r}")
    if sides not in (1, 2):
        raise ValueError(f"sides must be 1 or 2, got {sides!r}")
    if int(horizon) != horizon or horizon < 1:
        raise ValueError(f"horizon must be a positive integer, got {horizon!r}")
    target = alpha / sides
    lo, hi = 0.05, 40.0
    while hi - lo > 1e-3:
        mid = 0.5 * (lo + hi)
        if _p_alarm(_chain(mid, float(k), 0.0, 400, clip), int(horizon)) > target:
            lo = mid
        else:
            hi = mid
    return float(hi)


@functools.lru_cache(maxsize=256)
def _design(alpha: float, horizon: int, k: float, sides: int) -> tuple[float, float]:
    """(CUSUM threshold, in-control ARL of the scheme) for a lifetime budget alpha over horizon.

    Two sides: ARL ≥ ARL_side / 2 (union bound on the alarm rate)."""
    h = cusum_threshold(alpha, horizon, k=k, sides=sides, clip=SCORE_CLIP)
    return h, cusum_run_length(h, k=k, horizon=1, clip=SCORE_CLIP).arl / sides


def self_starting_scores(values, *, exclude_above: float | None = None) -> np.ndarray:
    """Hawkins' (1987) self-starting scores: each value standardised by the mean and std of the values before it.

    For the value at 0-based index i ≥ 2: T_i = (x_i − x̄) / s · √(m / (m + 1)), with x̄ and s
    over the m values before it, is Student-t with m − 1 degrees of freedom, and
    U_i = Φ⁻¹(F_{t,m−1}(T_i)). For independent normal values with any mean and variance the U_i
    are *independent* N(0, 1) (Hawkins 1987, *Technometrics* 29:93; Quesenberry 1991), so a
    CUSUM on them needs no known in-control mean or variance. With ``exclude_above``, a value
    whose |U| exceeds it is left out of x̄ and s for the values after it. Returns an array of
    len(values) with NaN at indices 0 and 1. A value after constant values scores 0 if equal,
    else ±40 (a certain change).
    """
    x = np.asarray(values, dtype=np.float64)
    n = x.size
    u = np.full(n, np.nan)
    if n < 3:
        return u
    c = x - x[0]  # centred for the running sums
    s1, s2, m = c[0] + c[1], c[0] ** 2 + c[1] ** 2, 2
    for i in range(2, n):
        mean = s1 / m
        sd = math.sqrt(max((s2 - m * mean * mean) / (m - 1), 0.0))
        d = c[i] - mean
        tiny = 1e-13 * max(abs(mean) + abs(c[i]) + abs(x[0]), 1e-300)
        if sd <= tiny:
            z = 0.0 if abs(d) <= tiny else math.copysign(40.0, d)
        else:
            t = d / sd * math.sqrt(m / (m + 1))
            z = math.copysign(-float(scipy.special.ndtri(scipy.special.stdtr(m - 1, -abs(t)))), t)
        u[i] = min(max(z, -40.0), 40.0)
        if exclude_above is None or abs(u[i]) <= exclude_above:
            s1, s2, m = s1 + c[i], s2 + c[i] * c[i], m + 1
    return u


# Consecutive studies share data, code and machines, so their summaries can be correlated. Scored as
# independent values, AR(1) 0.3 / 0.5 between consecutive study summaries made the CUSUM fire in 16.8% /
# 46.5% of 100-study lifetimes at a 1% budget. So each value is scored *prewhitened*: its innovation
# x_i − φ·x_{i−1} against the innovations before it (the residual chart of Alwan & Roberts 1988, made
# self-starting), with φ the bias-corrected lag-1 autocorrelation of the values up to AR_LAG studies before
# (a shift that just began does not enter the estimate) plus AR_MARGIN_Z standard errors: its upper 90%
# confidence bound. Above the estimate because under-whitening leaves positively correlated scores, which inflate the CUSUM's false
# alarms, while over-whitening leaves negatively correlated ones, which lower them (and cost power:
# docs/calibration.md, "Suite shift"). Until AR_MIN_VALUES values are old enough to estimate φ the values
# are scored as independent (the reason says so). The lifetime level is checked by simulation for AR(1)
# coefficients 0, 0.3 and 0.5 (AR_CHECKED_UP_TO); an alarm whose history is more dependent than that with
# 90% confidence says so and does not claim its level (``too_dependent``).
AR_LAG = 5
AR_MIN_VALUES = 5
AR_MARGIN_Z = 1.2816  # φ̂ + 1.28 se: the upper (one-sided) 90% confidence bound
AR_TOO_DEPENDENT_Z = 1.2816  # "too dependent" when φ̂ − 1.28 se (the lower 90% bound) exceeds AR_CHECKED_UP_TO
AR_CHECKED_UP_TO = 0.5
# above this φ a history is a random walk more than a level: the innovations are not whitened further
AR_CAP = 0.9
# A slowly wandering environment (``wander_bound``): a study effect that wanders slowly under independent seed
# noise (AR(1) 0.7–0.9 in the environment alone) gives summaries whose lag-1 correlation is modest (0.35–0.45)
# but whose correlation persists over many lags, which AR(1) whitening leaves in the scores (1.5–9% false
# alarms over 100 studies at 1%). The history cannot always show it (too short, or the wander not yet
# visible), so the condition is checked the other way round: an alarm claims its level only where the history
# rules the wander out, i.e. where the upper WANDER_Z (one-sided 95%) bound on the sum of its AR(1)
# innovations' autocorrelations over lags 1 … WANDER_LAGS is below WANDER_LIMIT; every other alarm says that
# its level is not guaranteed, with the bound. WANDER_LIMIT is set by simulation: with it at most 0.55% of
# wandering lifetimes alarm with no caveat beside them (results/calibration.md, "Slowly wandering environments").
WANDER_LAGS = 8
WANDER_Z = 1.6449
WANDER_LIMIT = 0.4
WANDER_MIN_VALUES = 9


def lag1_autocorrelations(values) -> np.ndarray:
    """The lag-1 sample autocorrelation r₁ of every prefix: element m − 1 is r₁ of ``values[:m]``.

    r₁ = Σ_{t<m−1} (x_t − x̄)(x_{t+1} − x̄) / Σ_t (x_t − x̄)², x̄ the prefix mean (Box, Jenkins & Reinsel
    2008, §2.1.4; statsmodels' ``acf`` with ``adjusted=False``). NaN for prefixes of fewer than 3 values
    or with no spread. O(n) through running sums of the values centred on the first one."""
    x = np.asarray(values, dtype=np.float64)
    n = x.size
    out = np.full(n, np.nan)
    if n < 3:
        return out
    c = x - x[0]
    s1 = np.cumsum(c)
    s2 = np.cumsum(c * c)
    p = np.concatenate(([0.0], np.cumsum(c[1:] * c[:-1])))
    m = np.arange(1, n + 1, dtype=np.float64)
    mean = s1 / m
    den = s2 - m * mean * mean
    # Σ_{t=0}^{m−2} (c_t − c̄)(c_{t+1} − c̄) = P − c̄·(Σ_{0..m−2} c + Σ_{1..m−1} c) + (m − 1)·c̄²; c_0 = 0
    num = p - mean * ((s1 - c) + s1) + (m - 1) * mean * mean
    scale = 1e-12 * np.maximum(s2, 1e-300)
    ok = (m >= 3) & (den > scale)
    out[ok] = num[ok] / den[ok]
    return out


def ar1_estimate(r1: float, m: int) -> tuple[float, float]:
    """(φ̂, its standard error) of an AR(1) coefficient from the lag-1 autocorrelation r₁ of m values.

    r₁ is biased low in short series: E[r₁] ≈ φ − (1 + 3φ)/m when the mean is estimated (Marriott & Pope
    1954, *Biometrika* 41:390; Kendall 1954), so φ̂ = (m·r₁ + 1)/(m − 3), clipped to [−0.99, 0.99]. Its
    standard error is m/(m − 3) times Bartlett's 1/√m for r₁ of independent values (Box, Jenkins & Reinsel
    2008, §6.2.2): √m/(m − 3). Bartlett's √((1 − φ²)/m) is smaller for φ ≠ 0, but r₁ of short dependent
    series is skewed towards 0: φ̂ + 1.28·√((1 − φ̂²)/m) stays above φ = 0.5 in only 72–85% of series of
    5–20 values, φ̂ + 1.28·√m/(m − 3) in about 89–90% for φ from 0 to 0.5 at every length from 5
    (simulated in tests/stats/test_alert_calibration.py). Needs m ≥ 4."""
    if m < 4:
        raise ValueError(f"need at least 4 values to estimate an AR(1) coefficient, got {m}")
    phi = min(max((m * r1 + 1.0) / (m - 3), -0.99), 0.99)
    return phi, math.sqrt(m) / (m - 3)


def _whitening_coefficient(r1: np.ndarray, i: int) -> tuple[float, float | None, int]:
    """(φ used to score the value at index i, the point estimate or None, values it was estimated from)."""
    m = i - AR_LAG
    if m < AR_MIN_VALUES or not np.isfinite(r1[m - 1]):
        return 0.0, None, max(m, 0)
    phi, se = ar1_estimate(float(r1[m - 1]), m)
    return min(max(phi + AR_MARGIN_Z * se, 0.0), AR_CAP), phi, m


@dataclass(frozen=True)
class Wander:
    """How far a history rules out dependence beyond its lag-1 form (``wander_bound``): ``bound`` is the upper
    one-sided 95% bound on Σ_{k=1…lags} ρ_k of its AR(1) innovations (None: fewer than WANDER_MIN_VALUES values),
    ``ruled_out`` whether it is below WANDER_LIMIT, ``values`` the number of values it was computed from."""

    ruled_out: bool
    bound: float | None
    lags: int
    values: int


def wander_bound(values) -> Wander:
    """Does a history rule out a slowly wandering environment? An upper bound on its dependence beyond AR(1).

    The values are whitened with their bias-corrected AR(1) estimate (``ar1_estimate``, clipped to [0, AR_CAP]);
    the innovations' sample autocorrelations r_1 … r_L (L = min(WANDER_LAGS, a quarter of the innovations)) are
    each about N(−1/n, 1/n) and independent when the values are AR(1) (Bartlett 1946; Box, Jenkins & Reinsel
    2008, §8.2.1, the residual autocorrelations), so Σ r_k + L/n + WANDER_Z·√(L/n) is an upper one-sided 95%
    bound on Σ ρ_k: correlation that persists over lags is what inflates the CUSUM's false alarms. The wander
    is ruled out when the bound is below WANDER_LIMIT; with fewer than WANDER_MIN_VALUES values it is not."""
    x = np.asarray(values, dtype=np.float64)
    m = int(x.size)
    if m < WANDER_MIN_VALUES:
        return Wander(False, None, 0, m)
    r1 = lag1_autocorrelations(x)[-1]
    phi = min(max(ar1_estimate(float(r1), m)[0], 0.0), AR_CAP) if np.isfinite(r1) else 0.0
    e = x[1:] - phi * x[:-1]
    n = e.size
    d = e - e.mean()
    den = float(d @ d)
    lags = min(WANDER_LAGS, n // 4)
    if not den > 1e-20 * float(e @ e):  # no spread (up to rounding)
        return Wander(False, None, 0, m)
    r = np.array([float(d[:-k] @ d[k:]) / den for k in range(1, lags + 1)])
    bound = float(r.sum() + lags / n + WANDER_Z * math.sqrt(lags / n))
    return Wander(bound < WANDER_LIMIT, bound, lags, m)


@dataclass(frozen=True)
class Whitening:
    """How the values of a history were scored (``prewhitened_scores``): ``phi[i]`` is the AR(1) coefficient
    the value at index i was whitened with (0: scored as independent), ``estimate[i]`` the bias-corrected
    point estimate it came from (NaN: too few values to estimate), ``estimated_from[i]`` its number of values."""

    scores: np.ndarray
    phi: np.ndarray
    estimate: np.ndarray
    estimated_from: np.ndarray


def prewhitened_scores(values, *, exclude_above: float | None = EXCLUDE_ABOVE) -> Whitening:
    """Self-starting scores (``self_starting_scores``) of the AR(1) innovations of a history.

    The value at index i is scored through its innovation e_i = x_i − φ_i·x_{i−1} against the innovations
    e_j = x_j − φ_i·x_{j−1} of the values before it (j = 1 … i − 1, those not left out), with the same
    t-to-normal transform: for AR(1) values with coefficient φ_i the innovations are independent with a
    common mean, so the scores are the self-starting scores of independent values again. φ_i is the
    bias-corrected AR(1) estimate (``ar1_estimate``) from the values up to index i − 1 − AR_LAG plus
    AR_MARGIN_Z standard errors, clipped to [0, AR_CAP]; with fewer than AR_MIN_VALUES of them φ_i = 0 and the
    score is exactly ``self_starting_scores``'. Every φ_i uses only values before i, so the score of a value
    never changes as the history grows. A value whose |score| exceeds ``exclude_above`` is left out of the
    running estimates (its value and its innovation). Scores at indices 0 and 1 are NaN.
    """
    x = np.asarray(values, dtype=np.float64)
    n = x.size
    u = np.full(n, np.nan)
    phis = np.zeros(n)
    est = np.full(n, np.nan)
    used = np.zeros(n, dtype=np.int64)
    if n < 3:
        return Whitening(u, phis, est, used)
    r1 = lag1_autocorrelations(x)
    c = x - x[0]
    # running sums over the values kept: of the values (independent scoring) and of the pairs (c_j, c_{j−1})
    s1, s2, m = c[0] + c[1], c[0] ** 2 + c[1] ** 2, 2
    sa, sb, saa, sbb, sab, mp = c[1], c[0], c[1] ** 2, c[0] ** 2, c[1] * c[0], 1
    for i in range(2, n):
        phi, point, used[i] = _whitening_coefficient(r1, i)
        phis[i] = phi
        if point is not None:
            est[i] = point
        if phi > 0.0 and mp >= 2:
            k, mean = mp, (sa - phi * sb) / mp
            var = max((saa - 2.0 * phi * sab + phi * phi * sbb - mp * mean * mean) / (mp - 1), 0.0)
            d = c[i] - phi * c[i - 1] - mean
            size = abs(mean) + abs(c[i]) + abs(c[i - 1]) + abs(x[0])
        else:
            k, mean = m, s1 / m
            var = max((s2 - m * mean * mean) / (m - 1), 0.0)
            d = c[i] - mean
            size = abs(mean) + abs(c[i]) + abs(x[0])
        sd = math.sqrt(var)
        tiny = 1e-13 * max(size, 1e-300)
        if sd <= tiny:
            z = 0.0 if abs(d) <= tiny else math.copysign(40.0, d)
        else:
            t = d / sd * math.sqrt(k / (k + 1))
            z = math.copysign(-float(scipy.special.ndtri(scipy.special.stdtr(k - 1, -abs(t)))), t)
        u[i] = min(max(z, -40.0), 40.0)
        if exclude_above is None or abs(u[i]) <= exclude_above:
            s1, s2, m = s1 + c[i], s2 + c[i] * c[i], m + 1
            a, b = c[i], c[i - 1]
            sa, sb, saa, sbb, sab, mp = sa + a, sb + b, saa + a * a, sbb + b * b, sab + a * b, mp + 1
    return Whitening(u, phis, est, used)


@dataclass(frozen=True)
class SequentialShift:
    """The state of the self-starting CUSUM after the last value of a history.

    ``detected`` is latched: once the CUSUM crossed the threshold at ``alarm_index`` it stays
    detected for every longer history (until the history restarts, at a new baseline).
    ``index`` is the estimated first value of the new level: the most likely single change
    point (max standardised CUSUM, Hinkley 1970) in the values up to the alarm."""

    detected: bool
    index: int | None
    alarm_index: int | None
    statistic: float | None  # the CUSUM at the alarm, else the larger CUSUM side at the last value
    threshold: float  # h
    upper: float | None  # the CUSUM sides at the last value
    lower: float | None
    alpha: float
    horizon: int
    arl0: float  # in-control average run length of the scheme (a lower bound for two sides)
    n: int
    mean_before: float | None
    mean_after: float | None
    std: float | None
    direction: str
    reason: str
    guarantee: str
    # dependence between consecutive studies at the alarm (else at the last value): "independent" (scored
    # as independent values: too few to estimate it), "prewhitened" (scored through AR(1) innovations)
    dependence: str = "independent"
    ar_coefficient: float | None = None  # φ the value was whitened with (the upper 90% bound), None if not
    ar_estimate: float | None = None  # the bias-corrected AR(1) estimate it came from
    ar_values: int = 0  # the number of values φ was estimated from
    too_dependent: bool = False  # more dependent than AR_CHECKED_UP_TO with 90% confidence: the level is not claimed
    # a slowly wandering environment (``wander_bound``, on the values the dependence was estimated from): an alarm
    # claims its level only when ``wander_ruled_out``
    wander_ruled_out: bool = False
    wander_bound: float | None = None  # upper 95% bound on the innovations' Σ ρ_k, lags 1 … wander_lags
    wander_lags: int = 0
    wander_values: int = 0  # the values it was computed from


def shift_guarantee(alpha: float, horizon: int) -> str:
    """The one-line guarantee of the suite-shift alert, with the condition it needs."""
    return (f"false alarm ≤ {alpha:.0%} over {int(horizon)} studies per stack and level, for consecutive studies "
            f"independent or AR(1)-correlated up to {AR_CHECKED_UP_TO:g}, not wandering slowly (an alarm whose history "
            "cannot rule a wander out says so)")


def _dependence_note(wh: Whitening, at: int, alpha: float) -> tuple[str, str, bool]:
    """(dependence, the sentence for the reason, too_dependent) for the value at index ``at``."""
    phi, est, m = float(wh.phi[at]), float(wh.estimate[at]), int(wh.estimated_from[at])
    if not np.isfinite(est) and at >= AR_LAG + AR_MIN_VALUES:
        return "independent", "scored as independent studies (dependence not estimated)", False
    if not np.isfinite(est):
        need = AR_LAG + AR_MIN_VALUES + 1
        return ("independent", f"history too short to estimate the dependence between consecutive studies (fewer "
                f"than {need} values): scored as independent studies", False)
    low = est - AR_TOO_DEPENDENT_Z * math.sqrt(m) / (m - 3)
    if phi > 0:
        note = (f"prewhitened: each study scored through its AR(1) innovation x − {phi:.2f}·x₋₁ (the upper 90% "
                f"bound of the lag-1 dependence {est:.2f}, bias-corrected, from the {m} studies before the latest "
                f"{AR_LAG + 1})")
    else:
        note = (f"consecutive studies look independent (lag-1 dependence {est:.2f}, bias-corrected, from {m} "
                "studies): scored as independent")
    too = low > AR_CHECKED_UP_TO
    if too:
        note += (f"; but consecutive studies are more dependent than the level is checked for (AR(1) ≥ {low:.2f} "
                 f"with 90% confidence; checked up to {AR_CHECKED_UP_TO:g}): the history is too dependent to judge "
                 f"and the lifetime false-alarm level of {alpha:.0%} is not claimed")
    return ("prewhitened" if phi > 0 else "independent"), note, too


def _wander_note(w: Wander, alpha: float) -> str:
    """The sentence on a slowly wandering environment beside an alarm."""
    if w.ruled_out:
        return (f"a slowly wandering environment is ruled out (the AR(1) innovations' autocorrelations over lags "
                f"1–{w.lags} sum to at most {w.bound:.2f}, upper 95% bound, below {WANDER_LIMIT:g}; {w.values} studies)")
    if w.bound is None:
        return (f"the history before the alarm ({w.values} studies, fewer than {WANDER_MIN_VALUES}) cannot rule out a "
                f"slowly wandering environment, which looks like a shift: the lifetime false-alarm level of "
                f"{alpha:.0%} is not guaranteed for this alarm")
    return (f"the history of {w.values} studies cannot rule out a slowly wandering environment, which looks like a "
            f"shift (the AR(1) innovations' autocorrelations over lags 1–{w.lags} may sum to {w.bound:.2f}, upper "
            f"95% bound; the level is claimed below {WANDER_LIMIT:g}): the lifetime false-alarm level of {alpha:.0%} is "
            "not guaranteed for this alarm")


def sequential_shift(values, *, alpha: float = 0.01, horizon: int = 100, min_history: int = 6,
                     direction: str = "both", k: float = CUSUM_REFERENCE, prewhiten: bool = True) -> SequentialShift:
    """Self-starting CUSUM for a change of mean in a history re-evaluated after every new value.

    ``values`` is 1-D, oldest first, finite (one summary per study of one stack and determinism
    level). Each value gets the self-starting score U_i of its AR(1) innovation
    (``prewhitened_scores``: Hawkins 1987 on the residuals of Alwan & Roberts 1988, φ estimated from the
    history with a small-sample bias correction, its upper 90% bound; values scoring beyond ±4 stay out
    of the running estimates), winsorised at ±2.5 (Lucas & Crosier 1982), into the two-sided tabular
    CUSUM (Page 1954; Hawkins & Olwell 1998, §7.3) C⁺_i = max(0, C⁺_{i−1} + U_i − k),
    C⁻_i = max(0, C⁻_{i−1} − U_i − k), one side for ``increase``/``decrease``. The threshold h
    (``cusum_threshold``) makes the probability of any false alarm within the first ``horizon`` values
    ≤ ``alpha`` for independent normal study summaries (Brook–Evans chain of each side, union bound over
    the sides); ``arl0`` is their in-control average run length. With the estimated dependence the
    lifetime level holds, by simulation, for AR(1) study summaries up to AR_CHECKED_UP_TO
    (docs/calibration.md); an alarm claims it only where the history before it rules out a slowly wandering
    environment (``wander_bound``), and says so otherwise. Alarms count only once the history has ``min_history`` values. The answer
    for a history is the same as for each of its prefixes evaluated in turn (the alarm is latched), so
    an alert re-evaluated after every study has this lifetime error. ``prewhiten=False`` scores the
    values as independent studies (the rule before dependence was estimated; kept to measure what the
    estimate costs in power).
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be strictly between 0 and 1, got {alpha!r}")
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if int(min_history) != min_history or min_history < 3:
        raise ValueError(f"min_history must be an integer >= 3, got {min_history!r}")
    if int(horizon) != horizon or horizon < 1:
        raise ValueError(f"horizon must be a positive integer, got {horizon!r}")
    if not k >= 0:
        raise ValueError(f"k must be >= 0, got {k!r}")
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"values must be 1-D (one value per study, oldest first), got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("values must be finite")
    sides = 2 if direction == "both" else 1
    h, arl0 = _design(float(alpha), int(horizon), float(k), sides)
    guarantee = f"{shift_guarantee(alpha, horizon)} (in-control ARL ≥ {arl0:.0f} studies)"
    n = int(x.size)
    std = float(x.std(ddof=1)) if n > 1 else None
    base: dict[str, Any] = dict(threshold=h, alpha=float(alpha), horizon=int(horizon), arl0=float(arl0), n=n, std=std,
                direction=direction, guarantee=guarantee)
    if n < min_history:
        return SequentialShift(False, None, None, None, upper=None, lower=None, mean_before=None, mean_after=None,
                               reason=f"{n} value(s) in the history; need at least {min_history}", **base)
    if prewhiten:
        wh = prewhitened_scores(x, exclude_above=EXCLUDE_ABOVE)
    else:
        wh = Whitening(self_starting_scores(x, exclude_above=EXCLUDE_ABOVE), np.zeros(n), np.full(n, np.nan),
                       np.zeros(n, dtype=np.int64))
    w = np.clip(wh.scores, -SCORE_CLIP, SCORE_CLIP)
    up = np.zeros(n)
    lo = np.zeros(n)
    cu = cl = 0.0
    for i in range(2, n):
        cu = max(0.0, cu + w[i] - k)
        cl = max(0.0, cl - w[i] - k)
        up[i], lo[i] = cu, cl
    watched = ([up] if direction != "decrease" else []) + ([lo] if direction != "increase" else [])
    start = min_history - 1
    first: int | None = None
    side = up  # the side whose CUSUM crossed first, once first is set
    for c in watched:
        over = np.flatnonzero(c[start:] > h)
        if over.size and (first is None or int(over[0]) + start < first):
            first, side = int(over[0]) + start, c
    at = n - 1 if first is None else first
    dependence, note, too = _dependence_note(wh, at, alpha)
    wander = wander_bound(x[:int(wh.estimated_from[at])]) if prewhiten else Wander(False, None, 0, 0)
    if first is not None and not too:
        note += "; " + _wander_note(wander, alpha)
    ar: dict[str, Any] = dict(dependence=dependence, ar_coefficient=float(wh.phi[at]) if wh.phi[at] > 0 else None,
                              ar_estimate=float(wh.estimate[at]) if np.isfinite(wh.estimate[at]) else None,
                              ar_values=int(wh.estimated_from[at]), too_dependent=too,
                              wander_ruled_out=wander.ruled_out, wander_bound=wander.bound, wander_lags=wander.lags,
                              wander_values=wander.values)
    last = max(float(c[-1]) for c in watched)
    if first is None:
        return SequentialShift(False, None, None, last, upper=float(up[-1]), lower=float(lo[-1]), mean_before=None,
                               mean_after=None, reason=f"no shift: CUSUM {last:.3g} ≤ h={h:.3g} over {n} values; {note}",
                               **ar, **base)
    seen = x[:first + 1]
    where = "increase" if side is up else "decrease"
    index = int(np.argmax(_cusum_stats(seen, where))) + 1
    before, after = float(x[:index].mean()), float(x[index:].mean())
    reason = (f"shift: CUSUM {float(side[first]):.3g} > h={h:.3g} at index {first}; mean {before:.4g} over "
              f"{index} value(s), then {after:.4g} over {n - index} from index {index}; {note}")
    return SequentialShift(True, index, first, float(side[first]), upper=float(up[-1]), lower=float(lo[-1]),
                           mean_before=before, mean_after=after, reason=reason, **ar, **base)
