"""A sources study in stages: the TOST of a source's SD against the all-sources SD, group-sequential.

A fixed sources table judges each source at one sample size; showing that a source alone is "the full
variance" takes about 100 runs per arm with normal final values and 200 with heavy tails (docs/sources.md),
and a study cannot know beforehand which. With a budget the arms grow in stages until each source's TOST
decides, and re-judging at α at every stage would give a false ``equivalent`` several chances. Here each
look k is judged by the fixed rule (:func:`steady.server.stats.sources.sd_ratio_tost`: Bonett's robust
interval of σ_source/σ_all) at a smaller nominal level a_k = 1 − Φ(c_k), the boundaries c_k spending α with
the Lan–DeMets functions of :mod:`steady.server.stats.sequential` (as the adaptive seed-stability and
portability verdicts do):

* ``equivalent`` at look k when the (1 − 2a_k) interval lies inside [1/margin, margin]. A false
  ``equivalent`` (true ratio on the margin) needs the one-sided test against that edge to cross at some
  look: ≤ α over all stages (intersection–union, as for the fixed TOST).
* ``not_equivalent`` when that interval lies wholly outside the margin: with the truth on an edge, only the
  one-sided test towards that edge can err, so it too is ≤ α over all stages.
* otherwise ``inconclusive``; the first look that decides ends the test, later stages never reopen it.

With one stage both claims are exactly the fixed rule. The statistic is ln(s²_source/s²_all), whose
information grows with h = 1/(1/(n_s − 1) + 1/(n_a − 1)); the look's fraction is h/h_max with
h_max = (N − 1)/2 for at most N runs per arm; the last stage the budget allows spends what is left (t = 1).
A look with fewer than 5 runs on an arm is not tested (its error is spent unused: conservative). The
increments are independent only asymptotically and Bonett's interval is approximate off normality:
``steady.server.stats.calibration.rules_sources`` measures the whole process on normal, heavy-tailed and
skewed arms.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from steady.server.stats.sequential import spending_boundaries, staged_looks, stopped_early
from steady.server.stats.sources import MIN_ARM_RUNS, SD_MARGIN, sd_ratio_tost

__all__ = ["SdRatioLook", "SequentialSdRatio", "sd_ratio_information_fraction", "sequential_sd_ratio_tost",
           "sequential_sd_ratio_reason", "by_stage"]

_SPENDING_NAMES = {"pocock": "Pocock-type", "obrien_fleming": "O'Brien–Fleming-type"}


@dataclass(frozen=True)
class SdRatioLook:
    """One stage of a source's sequential TOST."""

    stage: int
    n_source: int  # finite final values judged (runs of stages 1..stage)
    n_all: int
    info_fraction: float
    boundary: float  # c_k on the z scale (inf: this look cannot decide)
    nominal_alpha: float  # a_k: each one-sided test at this look
    cumulative_alpha: float  # α(t_k) spent so far
    ratio: float | None  # σ_source/σ_all at this look
    lower: float | None  # the (1 − 2a_k) robust interval of the ratio
    upper: float | None
    p_value: float | None  # the TOST p-value of this look's data (compared with nominal_alpha)
    verdict: str  # equivalent | not_equivalent | inconclusive


@dataclass(frozen=True)
class SequentialSdRatio:
    verdict: str
    decided_at: int | None  # the stage that decided (None: inconclusive)
    final: bool  # no further stage: decided, or the budget's last stage was judged
    stages: tuple[SdRatioLook, ...]
    alpha: float
    spending: str
    max_runs: int
    margin: float
    stopped: bool = False  # the study stopped growing before the budget's last stage (its time budget ran out)

    @property
    def deciding(self) -> SdRatioLook | None:
        """The look the verdict stands on: the one that decided, else the last."""
        return self.stages[-1] if self.stages else None


def sd_ratio_information_fraction(n_source: int, n_all: int, max_runs: int, *, last: bool) -> float:
    """h/h_max, h = 1/(1/(n_s − 1) + 1/(n_a − 1)), h_max = (N − 1)/2: the share of the information about
    ln(σ²_source/σ²_all) at these runs, of at most N per arm; 1 at the last stage."""
    if last or max_runs <= 2:
        return 1.0
    if n_source < 2 or n_all < 2:
        return 1e-6
    h = 1.0 / (1.0 / (n_source - 1.0) + 1.0 / (n_all - 1.0))
    return min(max(h / ((max_runs - 1.0) / 2.0), 1e-6), 1.0)


def sequential_sd_ratio_tost(source_by_stage: Sequence, all_by_stage: Sequence, *, max_runs: int, last_stage: int,
                             margin: float = SD_MARGIN, alpha: float = 0.05, spending: str = "pocock",
                             stopped: bool = False) -> SequentialSdRatio:
    """Is one source alone the full variance, judged in stages with alpha spending (module docstring).

    ``source_by_stage`` / ``all_by_stage``: per stage, the finite final values of the runs *added* at that
    stage to the source's arm and to the all-sources arm (stage k is judged on stages 1..k; an arm that stopped
    growing adds nothing). ``max_runs``: the most runs per arm the budget allows; ``last_stage``: the number of
    the budget's last stage (1-based), which spends what is left. ``stopped``: no stage comes after the ones
    given although the budget allowed more (``sequential.stopped_early``)."""
    if not (margin > 1 and math.isfinite(margin)):
        raise ValueError(f"margin must be finite and > 1 (a ratio of SDs), got {margin!r}")
    if len(source_by_stage) != len(all_by_stage):
        raise ValueError("the source's arm and the all-sources arm need the same number of stages")
    if last_stage < 1 or len(source_by_stage) > last_stage:
        raise ValueError(f"last_stage must be ≥ 1 and ≥ the stages given, got {last_stage}")
    staged = staged_looks(source_by_stage, all_by_stage, last_stage=last_stage,
                          fraction=lambda n_s, n_a, last: sd_ratio_information_fraction(n_s, n_a, max_runs, last=last))
    if not staged.fractions:
        return SequentialSdRatio("inconclusive", None, stopped, (), float(alpha), spending, int(max_runs),
                                 float(margin), stopped=stopped)
    b = spending_boundaries(staged.fractions, alpha=alpha, spending=spending)
    looks: list[SdRatioLook] = []
    verdict, decided = "inconclusive", None
    for j, ((x, y), k) in enumerate(zip(staged.arms, staged.stages)):
        a_k, c = b.nominal_alpha[j], float(b.boundaries[j])
        ratio = lower = upper = p = None
        v = "inconclusive"
        if x.size >= MIN_ARM_RUNS and y.size >= MIN_ARM_RUNS and a_k > 0:
            r = sd_ratio_tost(x, y, margin=margin, alpha=a_k)
            ratio, lower, upper, p, v = r.ratio, r.lower, r.upper, r.p_value, r.verdict
        looks.append(SdRatioLook(k, int(x.size), int(y.size), b.info_fractions[j], c, a_k, b.cumulative_alpha[j],
                                 ratio, lower, upper, p, v))
        if v != "inconclusive":
            verdict, decided = v, k
            break
    final = decided is not None or stopped or len(source_by_stage) >= last_stage
    return SequentialSdRatio(verdict, decided, final, tuple(looks), float(alpha), spending, int(max_runs),
                             float(margin), stopped=stopped and decided is None)


def by_stage(values, stages, n_stages: int) -> list[np.ndarray]:
    """``values`` split by the stage (1-based, aligned ``stages``) that added each: the input of
    :func:`sequential_sd_ratio_tost`. Values of a stage above ``n_stages`` are left out."""
    v, s = np.asarray(values, dtype=np.float64).ravel(), np.asarray(stages).ravel()
    if v.shape != s.shape:
        raise ValueError("values and stages must align")
    return [v[s == k] for k in range(1, n_stages + 1)]


def sequential_sd_ratio_reason(d: SequentialSdRatio, *, last_stage: int) -> str:
    """Where the test stopped, in words."""
    head = (f"group-sequential TOST over {len(d.stages)} look(s) of at most {last_stage} stage(s) "
            f"({_SPENDING_NAMES.get(d.spending, d.spending)} alpha spending, each claim ≤ {d.alpha:g} over all stages)")
    look = d.deciding
    if look is None:
        return head + ": no stage had final values on both arms"
    if look.ratio is None:
        numbers = f"{look.n_source} + {look.n_all} runs, need {MIN_ARM_RUNS} per arm"
    else:
        numbers = (f"SD ratio {look.ratio:.3g}, {100 * (1 - 2 * look.nominal_alpha):.3g}% interval "
                   f"{look.lower:.3g}..{look.upper:.3g}")
    where = f"at stage {look.stage} with {look.n_source} + {look.n_all} runs ({numbers})"
    if d.verdict == "equivalent":
        return f"{head}: equivalent within ×{d.margin:g} {where}"
    if d.verdict == "not_equivalent":
        return f"{head}: not equivalent, wholly outside ×{d.margin:g} {where}"
    return f"{head}: inconclusive {where}; " + stopped_early(d.verdict, d.final, d.stopped,
                                                            more="more runs come in the next stage")
