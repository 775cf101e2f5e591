"""Cost of determinism: step-time ratios between determinism levels, with a CI that covers at 2–5 runs.

Method
------
1. Each run is summarised by the **median step time after dropping its warm-up**: the first
   ``⌈warmup_fraction · n⌉`` logged steps (10% by default, at least one step when the run has
   two or more) are left out, because they carry compilation, cuDNN autotuning and cache
   warm-up, which are not the steady-state cost. The median keeps stragglers (GC pauses,
   checkpoint writes) from moving the summary.
2. Run-to-run variation of step time is multiplicative (a slower node, a busier PCIe bus), so
   the comparison is made on the **log scale**: x_i = log(median_i).
3. **Independent runs** (the default): the CI of the difference of mean log-medians is
   Welch's t-interval (Welch 1947, *Biometrika* 34:28–35; Satterthwaite degrees of freedom),
   and the ratio and its CI are ``exp`` of the difference and its interval — the ratio of
   geometric means of the per-run medians.
   **Paired runs** (``paired=True``: run i of one level ran next to run i of the other, on the
   same worker): a one-sample t-interval on the per-pair log ratios (Student 1908), which
   removes what the two runs of a pair share (the worker, the machine load at that time).
4. Against a **budget** B (the largest acceptable ratio): ``pass`` when the CI's upper end is
   ≤ B, ``fail`` when its lower end is > B, else ``inconclusive``. With a (1 − a) two-sided
   CI, a true ratio ≤ B is called ``fail`` with probability ≤ a/2, and a true ratio > B is
   called ``pass`` with probability ≤ a/2 (2.5% each at 95%).

The interval is valid when runs of the compared levels are **interleaved** in time
(``balanced_level_order``): a drift in machine load while the study runs then spreads over both
levels instead of reading as a cost. The calibration harness
(``steady.server.stats.calibration.rules_cost``) measures coverage with lognormal run-to-run variation,
heavy-tailed step times, warm-up steps and a linear load drift, under blocked and interleaved
orders.

Degenerate inputs are answered exactly: when every run of each level has the same summary
(bit-identical step times, or zero run-to-run variance) the interval is the point ratio.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy

__all__ = ["CostRatio", "cost_ratio", "run_summary", "cost_verdict", "balanced_level_order",
           "DEFAULT_WARMUP_FRACTION", "cost_guarantee", "cost_summary"]

DEFAULT_WARMUP_FRACTION = 0.1


@dataclass(frozen=True)
class CostRatio:
    numerator: str
    denominator: str
    ratio: float  # exp(mean log-median numerator − mean log-median denominator)
    ci_low: float | None  # None with fewer than 2 runs (pairs) on a side
    ci_high: float | None
    confidence: float
    n_numerator: int
    n_denominator: int
    design: str  # "independent" (Welch) | "paired" (one-sample t on log ratios)
    df: float | None  # degrees of freedom of the t-interval (None: no interval / exact)
    warmup_fraction: float
    budget: float | None  # the largest acceptable ratio, or None
    verdict: str | None  # pass | fail | inconclusive against the budget; None without a budget
    reason: str
    guarantee: str
    method: str
    summary: str = ""  # the plain first line: a cost, no evidence of one, or faster, with the interval (cost_summary)


def cost_guarantee(confidence: float, *, interleaved: bool | None = True) -> str:
    """The phrase shown beside a cost verdict: the CI's level and the two error rates it bounds, which
    hold for runs of the two levels interleaved in time. ``interleaved=None``: the report cannot know
    (runs uploaded from elsewhere, no worker recorded), and the phrase says so."""
    tail = (1.0 - confidence) / 2.0
    head = (f"{confidence * 100:.3g}% CI; false 'fail' ≤ {tail * 100:.3g}%, false 'pass' ≤ {tail * 100:.3g}% for "
            "interleaved runs")
    if interleaved is None:
        return head + " (the runs' order is unknown here, e.g. uploaded runs: a load drift could read as a cost)"
    if not interleaved:
        return head + " (these runs were not interleaved: not claimed)"
    return head


def _r(x: float) -> str:
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def cost_summary(ratio: float, ci_low: float | None, ci_high: float | None, confidence: float, *,
                 numerator: str, denominator: str, n_runs: int) -> str:
    """The plain first line of a cost: what the interval shows, never a bare point that carries no evidence.

    * CI above 1: "strict costs ×1.8 the step time of none (95% CI 1.4–2.3)";
    * CI below 1: "strict is faster than none: ×0.6 (95% CI 0.4–0.8)";
    * CI covers 1: "no evidence of a cost (ratio ×0.53, 95% CI 0.2–1.4 covers 1)";
    * no CI (one run per level): "×1.9 from 1 run per level: no interval, so no evidence of a cost either way".
    """
    if not math.isfinite(ratio):
        return "no ratio: the step times give none"
    if ci_low is None or ci_high is None:
        return (f"×{_r(ratio)} from {n_runs} run{'s' if n_runs != 1 else ''} per level: no interval, so no evidence "
                "of a cost either way (run each level at least twice)")
    ci = f"{confidence * 100:.3g}% CI {_r(ci_low)}–{_r(ci_high)}"
    if ci_low == ci_high:
        ci = "exact: every run of each level has the same step time"
    if ci_low > 1:
        return f"{numerator} costs ×{_r(ratio)} the step time of {denominator} ({ci})"
    if ci_high < 1:
        return f"{numerator} is faster than {denominator}: ×{_r(ratio)} the step time ({ci})"
    if ci_low == ci_high == 1:
        return f"no cost: the same step time ({ci})"
    return f"no evidence of a cost (ratio ×{_r(ratio)}, {ci} covers 1)"


def run_summary(step_times, *, warmup_fraction: float = DEFAULT_WARMUP_FRACTION) -> float | None:
    """Median of one run's finite step times after dropping the first ⌈warmup_fraction·n⌉ steps.

    At least one step is dropped when the run has two or more and ``warmup_fraction > 0``;
    at least one step is always kept. None when the run has no finite step time.
    """
    a = np.asarray(step_times, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"each run's step times must be 1-D, got shape {a.shape}")
    if not (0.0 <= warmup_fraction < 1.0):
        raise ValueError(f"warmup_fraction must be in [0, 1), got {warmup_fraction!r}")
    a = a[np.isfinite(a)]
    if a.size == 0:
        return None
    drop = 0
    if warmup_fraction > 0 and a.size >= 2:
        drop = min(a.size - 1, max(1, math.ceil(warmup_fraction * a.size)))
    return float(np.median(a[drop:]))


def _summaries(runs: Sequence, name: str, warmup_fraction: float, *, keep_missing: bool) -> list[float | None]:
    out = [run_summary(r, warmup_fraction=warmup_fraction) for r in runs]
    for v in out:
        if v is not None and not v > 0:
            raise ValueError(f"{name}: step times must be > 0, got a run with median {v!r}")
    if not keep_missing:
        out = [v for v in out if v is not None]
    if not any(v is not None for v in out):
        raise ValueError(f"{name}: no finite step times")
    return out


def cost_verdict(ci_low: float | None, ci_high: float | None, budget: float | None) -> str | None:
    """``pass`` if ci_high ≤ budget, ``fail`` if ci_low > budget, else ``inconclusive`` (None: no budget)."""
    if budget is None:
        return None
    if ci_low is None or ci_high is None:
        return "inconclusive"
    if ci_high <= budget:
        return "pass"
    if ci_low > budget:
        return "fail"
    return "inconclusive"


def _check_budget(budget: float | None) -> None:
    if budget is not None and not (math.isfinite(budget) and budget > 1.0):
        raise ValueError(f"budget must be a finite ratio > 1, got {budget!r}")


def cost_ratio(numerator_runs: Sequence, denominator_runs: Sequence, *, numerator: str = "strict",
               denominator: str = "none", confidence: float = 0.95, paired: bool = False,
               budget: float | None = None, warmup_fraction: float = DEFAULT_WARMUP_FRACTION) -> CostRatio:
    """Step-time ratio numerator / denominator between two determinism levels, with a t-interval.

    ``numerator_runs`` / ``denominator_runs``: one 1-D array of step times (seconds) per run.
    See the module docstring for the method (warm-up dropped, per-run median, log scale,
    Welch t-interval or paired t-interval, exp back) and the budget rule. With ``paired=True``
    the two sequences must have the same length and run i of one is paired with run i of the
    other; a pair with a run without finite step times is dropped. Fewer than two runs (pairs)
    on a side: the ratio without an interval and, with a budget, ``inconclusive``.
    """
    if not (0 < confidence < 1):
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    _check_budget(budget)
    if paired and len(numerator_runs) != len(denominator_runs):
        raise ValueError(f"paired runs need the same number of runs per level, got {len(numerator_runs)} "
                         f"and {len(denominator_runs)}")
    a = _summaries(numerator_runs, numerator, warmup_fraction, keep_missing=paired)
    b = _summaries(denominator_runs, denominator, warmup_fraction, keep_missing=paired)
    lo = hi = df = exact = None
    if paired:
        keep = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
        if not keep:
            raise ValueError("paired: no pair where both runs have finite step times")
        r = np.array([x / y for x, y in keep])
        d = np.log(r)
        na = nb = len(keep)
        est = float(d.mean())
        if d.size >= 2:
            sd = 0.0 if np.ptp(r) == 0 else float(d.std(ddof=1))
            if sd == 0.0:  # every pair has the same ratio: exact
                exact = float(r[0])
                lo = hi = est = math.log(exact)
            else:
                df = float(d.size - 1)
                q = float(scipy.stats.t.ppf(0.5 + confidence / 2.0, df))
                h = q * sd / math.sqrt(d.size)
                lo, hi = est - h, est + h
    else:
        a_, b_ = np.array(a, dtype=np.float64), np.array(b, dtype=np.float64)
        x, y = np.log(a_), np.log(b_)
        na, nb = x.size, y.size
        est = float(x.mean() - y.mean())
        if na >= 2 and nb >= 2:
            # A level whose runs all have the same summary has exactly zero variance (not rounding noise).
            vx = 0.0 if np.ptp(a_) == 0 else float(x.var(ddof=1)) / na
            vy = 0.0 if np.ptp(b_) == 0 else float(y.var(ddof=1)) / nb
            se2 = vx + vy
            if se2 == 0.0:  # bit-identical summaries within each level: exact
                exact = float(a_[0] / b_[0])
                lo = hi = est = math.log(exact)
            else:
                df = se2 ** 2 / (vx ** 2 / (na - 1) + vy ** 2 / (nb - 1))
                q = float(scipy.stats.t.ppf(0.5 + confidence / 2.0, df))
                h = q * math.sqrt(se2)
                lo, hi = est - h, est + h
    ratio = math.exp(est)
    ci_low = None if lo is None else math.exp(lo)
    ci_high = None if hi is None else math.exp(hi)
    if exact is not None:
        ratio = ci_low = ci_high = exact
    verdict = cost_verdict(ci_low, ci_high, budget)
    design = "paired" if paired else "independent"
    summary = cost_summary(ratio, ci_low, ci_high, confidence, numerator=numerator, denominator=denominator,
                           n_runs=min(na, nb))
    reason = f"{numerator}/{denominator}: {summary}"
    if verdict == "pass":
        reason += f" ≤ budget ×{budget:g}"
    elif verdict == "fail":
        reason += f" > budget ×{budget:g}"
    elif verdict == "inconclusive":
        reason += f"; cannot tell against budget ×{budget:g}" if ci_low is not None else \
            f"; budget ×{budget:g} not judged"
    method = ("ratio of geometric means of per-run median step times (warm-up dropped); "
              + ("paired t-interval on per-pair log ratios" if paired else "Welch t-interval on log medians"))
    return CostRatio(numerator=numerator, denominator=denominator, ratio=ratio, ci_low=ci_low, ci_high=ci_high,
                     confidence=float(confidence), n_numerator=int(na), n_denominator=int(nb), design=design,
                     df=None if df is None else float(df), warmup_fraction=float(warmup_fraction),
                     budget=None if budget is None else float(budget), verdict=verdict, reason=reason,
                     guarantee=cost_guarantee(confidence), method=method, summary=summary)


def balanced_level_order(levels: Sequence, n_blocks: int) -> list[list]:
    """The order in which a study's runs should execute so that a load drift cancels between levels.

    Block k holds one run of every level; blocks run one after the other, and the levels within
    a block alternate direction (A B C, C B A, A B C, …), the counterbalanced "ABBA" order
    (e.g. Box, Hunter & Hunter, *Statistics for Experimenters*, 2nd ed. 2005, ch. 4): a linear
    drift then shifts all levels by the same amount over each pair of blocks, instead of
    landing on whichever level ran last.
    """
    if n_blocks < 0:
        raise ValueError(f"n_blocks must be >= 0, got {n_blocks!r}")
    fwd = list(levels)
    return [fwd if k % 2 == 0 else fwd[::-1] for k in range(n_blocks)]
