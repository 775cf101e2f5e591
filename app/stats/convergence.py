"""Convergence against a reference, as MLPerf Training judges submissions (reference convergence points).

Method — the rules of MLPerf's ``rcp_checker`` (mlcommons/logging, ``mlperf_logging/rcp_checker/
rcp_checker.py``: ``get_submission_epochs``, ``_compute_rcp_stats``, ``_find_min_acceptable_mean``,
``_eval_submission_record``; MLPerf Training rules, section "Convergence reference points"):

1. **Per run, the steps to reach the target**: the first logged step at which the metric is ≤ the
   target (``direction="min"``, e.g. a loss) or ≥ it (``"max"``, e.g. an accuracy). MLPerf counts
   epochs or samples; here the unit is whatever the run logs as its step.
2. **Runs that never reach the target** count as infinitely slow (MLPerf gives a non-converged run
   a huge epoch count), so the olympic trimming drops them as the slowest runs. When more runs
   than are trimmed at the slow end never converge, MLPerf rejects the set of runs
   (``get_submission_epochs`` returns None when more than one run — four for UNet3D — did not
   converge): here the candidate then ``fail``s, and a reference cannot be formed.
3. **Olympic mean**: sort, drop the ``trim`` fastest and ``trim`` slowest runs (1 in MLPerf; 4 for
   UNet3D), take the mean of the rest. The checker's reference standard deviation is ``numpy.std``
   of the trimmed runs (population form, ``ddof=0``); a reference given as numbers (a published
   RCP) is used as is. A reference formed here from runs uses a σ that holds the level instead
   (``reference_from_runs``: Yuen's winsorized variance; MLPerf's is available as ``"mlperf"``).
4. **Minimum acceptable mean**: the smallest candidate mean that a one-sided pooled two-sample
   t-test at ``alpha`` (0.05) does not call faster than the reference, with both samples given the
   reference's standard deviation σ and ``df = n_R + n_S − 2`` (n after trimming):
   ``min_mean = μ + t_{alpha, df} · σ · sqrt(1/n_R + 1/n_S)`` (``t_{alpha}`` < 0). MLPerf finds the
   same number by bisection; this is its closed form. The **maximum speed-up** is ``μ / min_mean``.
5. **Verdict**: ``pass`` when the candidate's olympic mean ≥ ``min_mean`` (not significantly faster
   than the reference), else ``fail``. The **normalisation factor** is the checker's
   ``_find_norm_factor``: ``max(1, μ / candidate mean)``; a passing candidate that is faster than
   the reference mean (within the allowed speed-up) has its score (time to train) multiplied by
   it, as if it had converged at the reference's pace. ``inconclusive`` when fewer than two
   candidate runs remain after trimming.

False alarm: a candidate that converges like the reference fails with probability ≈ ``alpha`` (the
one-sided test's level; measured by ``steady.server.stats.calibration.rules_convergence`` with normal,
lognormal, heavy-tailed and quantised steps-to-target).

Checked against a published checker log: μ = 215040, σ = 11976.9, n_R = 18, n_S = 8 give the
minimum acceptable mean 206333 and the maximum speed-up 1.0422.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy

from steady.server.stats.report import to_plain
from steady.server.stats.quantiles import t_ppf

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_TRIM",
    "ConvergenceResult",
    "ReferencePoint",
    "check_convergence",
    "convergence_guarantee",
    "min_acceptable_mean",
    "olympic_trim",
    "reference_from_runs",
    "steps_to_target",
]

DEFAULT_ALPHA = 0.05
DEFAULT_TRIM = 1


def convergence_guarantee(alpha: float = DEFAULT_ALPHA) -> str:
    return (f"a candidate that converges like the reference fails with probability ≤ {alpha:g} "
            "(one-sided pooled t-test on olympic means, MLPerf RCP)")


@dataclass(frozen=True)
class ReferencePoint:
    """A reference convergence point: olympic mean and standard deviation of the steps to target,
    and the number of runs they rest on after trimming."""

    mean: float
    std: float
    n: int
    n_runs: int | None = None  # before trimming, when formed from runs
    n_unconverged: int = 0


@dataclass(frozen=True)
class ConvergenceResult:
    verdict: str  # "pass" | "fail" | "inconclusive"
    reason: str
    guarantee: str
    alpha: float
    trim: int
    reference_mean: float
    reference_std: float
    n_reference: int
    candidate_mean: float | None  # olympic mean of the candidate's steps to target
    n_candidate: int  # after trimming
    n_candidate_runs: int
    n_unconverged: int
    steps_to_target: tuple[float, ...]  # per candidate run, inf when it never reached the target
    df: int | None
    t_quantile: float | None  # t_{alpha, df} (negative)
    min_acceptable_mean: float | None
    max_speedup: float | None
    normalization_factor: float | None  # max(1, reference mean / candidate mean), as the checker
    t_statistic: float | None
    p_value: float | None  # one-sided: P(T ≤ t) under "as fast as the reference"

    def to_dict(self) -> dict:
        """Plain data; a run that never reached the target has steps_to_target "Infinity"."""
        return to_plain(self)


def steps_to_target(steps: Sequence[float], values: Sequence[float], *, target: float, direction: str) -> float:
    """The first step at which ``values`` reach ``target`` (≤ for "min", ≥ for "max"); ``inf`` when
    they never do. Non-finite values never count as reaching it. ``steps`` need not be sorted."""
    if direction not in ("min", "max"):
        raise ValueError(f"direction must be 'min' or 'max', got {direction!r}")
    s = np.asarray(steps, dtype=float)
    v = np.asarray(values, dtype=float)
    if s.shape != v.shape or s.ndim != 1:
        raise ValueError(f"steps and values must be 1-d of one length, got {s.shape} and {v.shape}")
    with np.errstate(invalid="ignore"):
        hit = (v <= target) if direction == "min" else (v >= target)
    hit &= np.isfinite(v)
    return float(s[hit].min()) if hit.any() else math.inf


def olympic_trim(x: Sequence[float] | np.ndarray, *, trim: int = DEFAULT_TRIM) -> np.ndarray:
    """``x`` sorted, without its ``trim`` smallest and ``trim`` largest values (``inf`` sorts last)."""
    a = np.sort(np.asarray(x, dtype=float))
    if trim < 0:
        raise ValueError(f"trim must be >= 0, got {trim}")
    return a[trim:a.size - trim] if a.size > 2 * trim else a[:0]


def reference_from_runs(x: Sequence[float] | np.ndarray, *, trim: int = DEFAULT_TRIM,
                        std_method: str = "yuen") -> ReferencePoint:
    """The reference point of runs' steps to target (``inf``: never reached): the olympic mean, and
    a standard deviation σ for the checker's formula.

    ``std_method="mlperf"``: ``numpy.std`` (ddof=0) of the trimmed runs, exactly as
    ``rcp_checker._compute_rcp_stats``. That σ underestimates the spread (the trimmed runs are
    the middle ones): drawn from the reference's own distribution, a candidate then fails about
    7–8% of the time instead of 5% (measured by ``steady.server.stats.calibration.rules_convergence``).
    ``std_method="yuen"`` (default): σ chosen so that σ²/n_R is Yuen's variance of the trimmed
    mean, s_w² / ((1 − 2g)² n) (Yuen 1974, *Biometrika* 61:165–170; s_w the winsorized standard
    deviation, ddof=1, g = trim/n), i.e. σ = s_w / (1 − 2g) · sqrt(n_R / n). With it the test holds
    its level (calibration table).

    Raises ValueError when more runs than ``trim`` never converged or fewer than two remain."""
    if std_method not in ("yuen", "mlperf"):
        raise ValueError(f"std_method must be 'yuen' or 'mlperf', got {std_method!r}")
    a = np.sort(np.asarray(x, dtype=float))
    if a.ndim != 1 or np.isnan(a).any():
        raise ValueError("steps to target must be a 1-d array without NaN (use inf for a run that never converged)")
    unconverged = int(np.isinf(a).sum())
    if unconverged > trim:
        raise ValueError(f"{unconverged} of the reference's {a.size} runs never reached the target; "
                         f"at most {trim} may (the olympic trimming drops {trim} slowest)")
    kept = olympic_trim(a, trim=trim)
    if kept.size < 2:
        raise ValueError(f"the reference needs at least {2 * trim + 2} runs ({a.size} given)")
    if std_method == "mlperf":
        std = float(kept.std())
    else:
        w = a.copy()
        if trim:
            w[:trim], w[a.size - trim:] = kept[0], kept[-1]
        std = float(w.std(ddof=1) / (1 - 2 * trim / a.size) * math.sqrt(kept.size / a.size))
    return ReferencePoint(mean=float(kept.mean()), std=std, n=int(kept.size), n_runs=int(a.size),
                          n_unconverged=unconverged)


def min_acceptable_mean(mean: float, std: float, n_reference: int, n_candidate: int, *,
                        alpha: float = DEFAULT_ALPHA) -> tuple[float, float, int]:
    """(minimum acceptable candidate mean, t_{alpha, df}, df): the smallest mean a one-sided pooled
    t-test at ``alpha`` with both standard deviations ``std`` does not call faster than ``mean``."""
    if n_reference < 1 or n_candidate < 1 or n_reference + n_candidate < 3:
        raise ValueError(f"need n_reference + n_candidate >= 3, got {n_reference} and {n_candidate}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    df = n_reference + n_candidate - 2
    t = t_ppf(alpha, df)
    if std == 0:
        return float(mean), t, df  # as the checker: no spread, no allowance
    return float(mean + t * std * math.sqrt(1.0 / n_reference + 1.0 / n_candidate)), t, df


def check_convergence(candidate: Sequence[float] | np.ndarray, reference: ReferencePoint, *,
                      alpha: float = DEFAULT_ALPHA, trim: int = DEFAULT_TRIM) -> ConvergenceResult:
    """Judge the candidate runs' steps to target (``inf``: never reached) against ``reference``.

    See the module docstring for the rule (MLPerf ``rcp_checker``)."""
    a = np.asarray(candidate, dtype=float)
    if a.ndim != 1 or np.isnan(a).any():
        raise ValueError("candidate must be a 1-d array of steps to target (inf for never), without NaN")
    if not (math.isfinite(reference.mean) and math.isfinite(reference.std) and reference.std >= 0
            and reference.n >= 1):
        raise ValueError(f"reference needs a finite mean, a finite std >= 0 and n >= 1, got {reference}")
    unconverged = int(np.isinf(a).sum())
    kept = olympic_trim(a, trim=trim)
    base: dict[str, Any] = {"guarantee": convergence_guarantee(alpha), "alpha": alpha, "trim": trim,
            "reference_mean": reference.mean, "reference_std": reference.std, "n_reference": reference.n,
            "n_candidate": int(kept.size), "n_candidate_runs": int(a.size), "n_unconverged": unconverged,
            "steps_to_target": tuple(a.tolist())}
    none: dict[str, Any] = {"df": None, "t_quantile": None, "min_acceptable_mean": None, "max_speedup": None,
            "normalization_factor": None, "t_statistic": None, "p_value": None}
    if unconverged > trim:
        return ConvergenceResult(
            verdict="fail", candidate_mean=None, **base, **none,
            reason=f"{unconverged} of {a.size} runs never reached the target; at most {trim} may "
                   "(MLPerf rejects the set of runs)")
    if kept.size < 2:
        return ConvergenceResult(
            verdict="inconclusive", candidate_mean=None, **base, **none,
            reason=f"{a.size} runs: need at least {2 * trim + 2} to judge after dropping the {trim} fastest "
                   f"and {trim} slowest")
    cand = float(kept.mean())
    floor, t, df = min_acceptable_mean(reference.mean, reference.std, reference.n, int(kept.size), alpha=alpha)
    se = reference.std * math.sqrt(1.0 / reference.n + 1.0 / kept.size)
    t_stat = (cand - reference.mean) / se if se > 0 else (0.0 if cand == reference.mean else math.copysign(math.inf, cand - reference.mean))
    p = float(scipy.stats.t.cdf(t_stat, df))
    speedup = reference.mean / floor if floor > 0 else math.inf
    factor = max(1.0, reference.mean / cand) if cand > 0 else math.inf
    if cand >= floor:
        verdict = "pass"
        reason = (f"olympic mean {cand:.6g} steps ≥ minimum acceptable {floor:.6g} (reference {reference.mean:.6g}, "
                  f"max speed-up ×{speedup:.4f}): not significantly faster than the reference")
        if factor > 1:
            reason += f"; faster than the reference mean: score normalised by ×{factor:.4f}"
    else:
        verdict = "fail"
        reason = (f"olympic mean {cand:.6g} steps < minimum acceptable {floor:.6g} (reference {reference.mean:.6g}, "
                  f"max speed-up ×{speedup:.4f}): converges significantly faster than the reference "
                  f"(p = {p:.3g})")
    return ConvergenceResult(verdict=verdict, reason=reason, candidate_mean=cand, df=df, t_quantile=t,
                             min_acceptable_mean=floor, max_speedup=speedup, normalization_factor=factor,
                             t_statistic=float(t_stat), p_value=p, **base)
