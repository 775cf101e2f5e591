"""Stack portability in stages: a group-sequential TOST with alpha spending.

An adaptive study adds seeds while a portability verdict (two stacks or arms, equivalence within
±margin) is inconclusive. Judging each stage's TOST at the fixed level α would give a false
``equivalent`` several chances; here both claims spend their error over the stages with the
Lan–DeMets functions of ``steady.server.stats.sequential``:

* ``equivalent`` at stage k when both one-sided Welch tests reject at the stage's nominal level
  a_k = 1 − Φ(c_k) (c_k: the one-sided boundary spending α) — the (1 − 2a_k) CI of the
  difference lies inside ±margin. A false ``equivalent`` (true difference on the margin) needs
  the test against that side to cross at some stage: ≤ α over all stages (intersection–union).
* ``not_equivalent`` at stage k when the (1 − 2a'_k) CI lies entirely outside ±margin, a'_k
  from boundaries spending α/2 per side — with one stage this is the fixed rule's (1 − α) CI.
  A false ``not_equivalent`` (true difference inside the margin) is ≤ α/2 per side.

With a single stage (K = 1) both rules are exactly the fixed-sample verdict of
``steady.server.stats.report`` (TOST p < α; (1 − α) Welch CI outside the margin). The first stage that
decides ends the test. Critical values are Student t quantiles at the stage's Welch df and
level a_k (at a look with ≤ 5 seeds on a stack, the equivalence claim uses the fixed rule's
small-sample rule, ``portability.small_sample_quantile``) (the significance-level approach: exact for a known variance, approximate for an
estimated one; ``steady.server.stats.calibration.rules_adaptive_portability`` measures it).

The information of a difference of means grows with h = n_r·n_c/(n_r + n_c); the fraction of
stage k is h_k/h_max with h_max = N/2 for at most N seeds per stack (failed runs lower it); the
last stage the budget allows spends what is left (t = 1).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import scipy

from steady.server.stats.portability import (
    is_small_sample,
    skew_guard,
    small_sample_quantile,
    small_sample_skew,
    welch_parts,
)
from steady.server.stats.sequential import spending_boundaries, staged_looks, stopped_early

__all__ = ["TostLook", "SequentialTost", "tost_information_fraction", "sequential_tost_decision",
           "sequential_tost_reason"]

_SPENDING_NAMES = {"pocock": "Pocock-type", "obrien_fleming": "O'Brien–Fleming-type"}


@dataclass(frozen=True)
class TostLook:
    """One stage of a sequential portability verdict."""

    stage: int
    n_reference: int  # finite final values judged (seeds of stages 1..stage)
    n_candidate: int
    info_fraction: float
    boundary: float  # c_k of the equivalence claim (z scale; inf: not testable)
    nominal_alpha: float  # a_k: each one-sided test of the equivalence claim
    cumulative_alpha: float  # α(t_k) spent by the equivalence claim so far
    boundary_not_equivalent: float  # c'_k, spending α/2 per side
    nominal_alpha_not_equivalent: float
    diff: float | None  # mean(candidate) − mean(reference)
    se: float | None
    df: float | None
    ci_low: float | None  # the (1 − 2a_k) CI: `equivalent` when inside ±margin
    ci_high: float | None
    verdict: str  # equivalent | not_equivalent | inconclusive


@dataclass(frozen=True)
class SequentialTost:
    verdict: str
    decided_at: int | None  # the stage that crossed a boundary (None: inconclusive)
    final: bool  # no further stage: the budget is spent or a boundary was crossed
    stages: tuple  # TostLook per stage looked at
    alpha: float
    spending: str
    max_seeds: int
    margin: float
    skew_withheld: bool = False  # a look's 'equivalent' was withheld by the skew guard (``portability.skew_guard``)
    stopped: bool = False  # the study stopped growing before the budget's last stage (its time budget ran out)


# The skew guard at every look is stricter than the fixed rule's: each look is another chance for a small,
# wide, skewed stack to miss its tail (calibrated: docs/calibration.md, the adaptive baseline20 rows).
SEQUENTIAL_VISIBLE_Z = 0.25
SEQUENTIAL_IMBALANCE_LIMIT = 0.06


def tost_information_fraction(n_reference: int, n_candidate: int, max_seeds: int, *, last: bool) -> float:
    """h/h_max with h = n_r·n_c/(n_r + n_c), h_max = N/2: the share of the information about a
    difference of means at these seeds, of at most N per stack; 1 at the last stage."""
    if last or max_seeds <= 1:
        return 1.0
    if n_reference < 1 or n_candidate < 1:
        return 1e-6
    h = n_reference * n_candidate / (n_reference + n_candidate)
    return min(max(h / (max_seeds / 2.0), 1e-6), 1.0)


def _t_isf(q: float, df: float) -> float:
    """``float(scipy.stats.t.isf(q, df))`` for 0 < q < 1 and df > 0: the function scipy's t distribution calls
    (−stdtrit), without the distribution object's per-call overhead, so the same bits."""
    if 0.0 < q < 1.0 and df > 0:
        return float(-scipy.special.stdtrit(df, q))
    return float(scipy.stats.t.isf(q, df))


def _judge(d: float, se: float, df: float, margin: float, a_eq: float, a_ne: float,
           small: tuple[float, float] | None = None) -> tuple[str, float, float]:
    """One stage's decision and its (1 − 2a_eq) CI of the difference. ``small``: (df, skew allowance) of the
    fixed rule's small-sample rule (``portability.small_sample_quantile``) for the equivalence claim."""
    if se == 0.0:  # both stacks constant: the difference is known exactly (as the fixed rule)
        verdict = "equivalent" if abs(d) < margin else "not_equivalent" if abs(d) > margin else "inconclusive"
        return verdict, d, d
    if small is not None:
        q_eq = small_sample_quantile(a_eq, small[0], small[1]) if a_eq > 0 else math.inf
    else:
        q_eq = _t_isf(a_eq, df) if a_eq > 0 else math.inf
    q_ne = _t_isf(a_ne, df) if a_ne > 0 else math.inf
    low, high = d - q_eq * se, d + q_eq * se
    if -margin < low and high < margin:
        return "equivalent", low, high
    if d - q_ne * se > margin or d + q_ne * se < -margin:
        return "not_equivalent", low, high
    return "inconclusive", low, high


def sequential_tost_decision(reference_by_stage: Sequence, candidate_by_stage: Sequence, *, margin: float,
                             max_seeds: int, last_stage: int, alpha: float = 0.05, spending: str = "pocock",
                             stopped: bool = False) -> SequentialTost:
    """Equivalence of two stacks judged in stages with alpha spending (see the module docstring).

    ``reference_by_stage`` / ``candidate_by_stage``: per stage, the finite final values of the
    seeds *added* at that stage on each stack (stage k is judged on stages 1..k). ``max_seeds``:
    the most seeds per stack the budget allows; ``last_stage``: the number of the last stage it
    allows (1-based), which spends the remaining error. A stage that adds no value to either
    stack makes no new look; a look with fewer than 2 values on a stack is not tested (its error
    is spent unused — conservative). ``alpha`` is the level of each claim (divide it by the
    number of comparisons for a Bonferroni family). ``stopped``: no stage comes after the ones given although
    the budget allowed more (``sequential.stopped_early``)."""
    if not (margin > 0 and math.isfinite(margin)):
        raise ValueError(f"margin must be finite and > 0, got {margin!r}")
    if len(reference_by_stage) != len(candidate_by_stage):
        raise ValueError("reference and candidate need the same number of stages")
    if last_stage < 1 or len(reference_by_stage) > last_stage:
        raise ValueError(f"last_stage must be ≥ 1 and ≥ the stages given, got {last_stage}")
    staged = staged_looks(reference_by_stage, candidate_by_stage, last_stage=last_stage,
                          fraction=lambda n_r, n_c, last: tost_information_fraction(n_r, n_c, max_seeds, last=last))
    if not staged.fractions:
        return SequentialTost("inconclusive", None, stopped, (), alpha, spending, max_seeds, float(margin),
                              stopped=stopped)
    b_eq = spending_boundaries(staged.fractions, alpha=alpha, spending=spending)
    b_ne = spending_boundaries(staged.fractions, alpha=alpha / 2.0, spending=spending)
    looks, verdict, decided = [], "inconclusive", None
    withheld = False
    for j, ((a, c), k) in enumerate(zip(staged.arms, staged.stages)):
        a_eq, a_ne = b_eq.nominal_alpha[j], b_ne.nominal_alpha[j]
        d = se = df = low = high = None
        v = "inconclusive"
        if a.size >= 2 and c.size >= 2:
            d, se, df = welch_parts(a, c)
            small = (float(min(a.size, c.size) - 1), small_sample_skew(a, c)) if is_small_sample(a.size, c.size) else None
            v, low, high = _judge(d, se, df, float(margin), a_eq, a_ne, small)
            if v == "equivalent" and skew_guard(a, c, visible_z=SEQUENTIAL_VISIBLE_Z,
                                                imbalance_limit=SEQUENTIAL_IMBALANCE_LIMIT):
                v = "inconclusive"  # skewed finals, unequal stacks: as the fixed rule, stricter (repeated looks)
                withheld = True
        looks.append(TostLook(k, int(a.size), int(c.size), b_eq.info_fractions[j], float(b_eq.boundaries[j]), a_eq,
                              b_eq.cumulative_alpha[j], float(b_ne.boundaries[j]), a_ne, d, se, df, low, high, v))
        if v != "inconclusive":
            verdict, decided = v, k
            break
    final = decided is not None or stopped or len(reference_by_stage) >= last_stage
    return SequentialTost(verdict, decided, final, tuple(looks), float(alpha), spending, int(max_seeds),
                          float(margin), skew_withheld=withheld, stopped=stopped and decided is None)


def sequential_tost_reason(d: SequentialTost, *, last_stage: int, n_comparisons: int) -> str:
    """The verdict in words: where it stopped, the boundary and the stage's CI."""
    family = f", Bonferroni over {n_comparisons} comparisons" if n_comparisons > 1 else ""
    head = (f"group-sequential TOST over {len(d.stages)} stage(s) of at most {last_stage} "
            f"({_SPENDING_NAMES.get(d.spending, d.spending)} alpha spending{family}, "
            f"each claim ≤ {d.alpha * n_comparisons:g} over all stages)")
    if not d.stages:
        return head + ": no stage had final values on both stacks"
    look = d.stages[-1]
    if look.diff is None:
        numbers = f"{look.n_reference}/{look.n_candidate} values, need 2 per stack"
    else:
        numbers = (f"Δmean {look.diff:.3g}, {100 * (1 - 2 * look.nominal_alpha):.3g}% CI "
                   f"{look.ci_low:.3g}..{look.ci_high:.3g}, boundary z {look.boundary:.3f}")
    where = f"at stage {look.stage} with {look.n_reference} + {look.n_candidate} seeds ({numbers})"
    if d.verdict == "equivalent":
        return f"{head}: equivalent within ±{d.margin:g} {where}"
    if d.verdict == "not_equivalent":
        return f"{head}: not equivalent, entirely outside ±{d.margin:g} {where}"
    tail = stopped_early(d.verdict, d.final, d.stopped, more="more seeds come in the next stage")
    if d.skew_withheld:
        tail += ("; 'equivalent' withheld at a look: the finals look skewed and the stacks differ in seeds or "
                 "spread, where the TOST cannot claim its level (equal seed counts make the skew cancel)")
    return f"{head}: inconclusive {where}; {tail}"
