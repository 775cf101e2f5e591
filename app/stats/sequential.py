"""Group-sequential designs: adding seeds after looking at the data without inflating false alarms.

A study with a seed budget is judged in stages: stage k looks at the seeds of stages 1..k. If
every stage were judged at the nominal level α, a false claim would get K chances and its rate
would grow well above α. Here the claim of stage k is tested at a smaller nominal level α_k,
chosen by an alpha-spending function (Lan & DeMets 1983) so that the chance of a false claim at
*any* stage is at most α:

* Lan–DeMets O'Brien–Fleming type: α(t) = 2 − 2Φ(z_{1−α/2}/√t) — spends almost nothing early.
* Lan–DeMets Pocock type: α(t) = α·ln(1 + (e − 1)t) — spends more evenly, stops earlier.

t is the information fraction of the stage: (n_k − 1)/(N − 1) for n_k seeds of at most N (the
information about a log-variance grows with the degrees of freedom); the last stage allowed by
the budget spends what is left (t = 1). Boundaries are computed for the *actual* fractions by
the recursive numerical integration of Armitage, McPherson & Rowe (1969) as set out in Jennison
& Turnbull (2000), *Group Sequential Methods with Applications to Clinical Trials*, ch. 19: the
sequential z-statistics Z_k = S_k/√I_k with independent increments of the score S, their
sub-density on the continuation region carried from stage to stage on a grid (Simpson's rule),
each boundary found with Brent's method. Classical Pocock and O'Brien–Fleming constants
(Jennison & Turnbull Tables 2.1 and 2.3) are reproduced by ``pocock_constant`` and
``obrien_fleming_constant``, which the tests check against the published values.

Pure numpy/scipy: arrays and numbers in, frozen dataclasses out.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import scipy

from steady.server.stats.seed_stability import KURTOSIS_FLOOR, MIN_SEEDS, spread_decision
from steady.server.stats.quantiles import norm_isf

__all__ = [
    "SPENDING_FUNCTIONS",
    "Boundaries",
    "SequentialDecision",
    "StageLook",
    "StagedLooks",
    "crossing_probabilities",
    "information_fraction",
    "obrien_fleming_constant",
    "pocock_constant",
    "sequential_seed_decision",
    "spending_boundaries",
    "spent_alpha",
    "stage_sizes",
    "staged_looks",
]

SPENDING_FUNCTIONS = ("pocock", "obrien_fleming")
_LOW = -9.0  # the continuation region's lower end in one-sided designs: Φ(−9) ≈ 1e-19


def spent_alpha(t: float, *, alpha: float, spending: str) -> float:
    """Cumulative one-sided error α(t) spent by information fraction ``t`` (Lan & DeMets 1983)."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be strictly between 0 and 1, got {alpha!r}")
    t = min(max(float(t), 0.0), 1.0)
    if t == 0.0:
        return 0.0
    if spending == "pocock":
        return alpha * math.log(1.0 + (math.e - 1.0) * t)
    if spending == "obrien_fleming":
        return float(2.0 - 2.0 * scipy.stats.norm.cdf(norm_isf(alpha / 2.0) / math.sqrt(t)))
    raise ValueError(f"spending must be one of {SPENDING_FUNCTIONS}, got {spending!r}")


def _simpson(a: float, b: float, h: float) -> tuple[np.ndarray, np.ndarray]:
    m = max(2, math.ceil((b - a) / h))
    m += m % 2  # Simpson needs an even number of intervals
    z = np.linspace(a, b, m + 1)
    w = np.ones(m + 1)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return z, w * (b - a) / (3.0 * m)


def _check_info(info) -> np.ndarray:
    t = np.asarray(info, dtype=np.float64)
    if t.ndim != 1 or t.size == 0 or not np.all(np.isfinite(t)) or t[0] <= 0 or np.any(np.diff(t) <= 0):
        raise ValueError(f"information levels must be positive and strictly increasing, got {info!r}")
    return t


class _Recursion:
    """The sub-density of Z_k on the continuation region, carried stage to stage (J&T ch. 19)."""

    def __init__(self, info: np.ndarray, two_sided: bool):
        self.info, self.two_sided = info, two_sided
        # grid, weights, sub-density of the last stage: advance(0) sets them before stage 1 reads them
        self.z = self.w = self.f = np.empty(0)

    def cross(self, k: int, c: float) -> float:
        """P(Z_k ≥ c, no earlier crossing) — doubled for the two-sided symmetric region."""
        if k == 0:
            p = float(scipy.stats.norm.sf(c))
        else:
            i0, i1 = self.info[k - 1], self.info[k]
            d = math.sqrt(i1 - i0)
            p = float(np.sum(self.w * self.f * scipy.stats.norm.sf((c * math.sqrt(i1) - self.z * math.sqrt(i0)) / d)))
        return 2.0 * p if self.two_sided else p

    def advance(self, k: int, c: float) -> None:
        """Fix stage k's boundary ``c`` and carry the density to the continuation region below it."""
        if not math.isfinite(c):
            c = -_LOW
        lo = -c if self.two_sided else _LOW
        if k == 0:
            z, w = _simpson(lo, c, 0.02)
            f = scipy.stats.norm.pdf(z)
        else:
            i0, i1 = self.info[k - 1], self.info[k]
            d = math.sqrt(i1 - i0)
            h = max(min(0.02, d / math.sqrt(i1) / 6.0), 1e-3)  # ≤ 18k grid points
            z, w = _simpson(lo, c, h)
            kern = scipy.stats.norm.pdf((z[:, None] * math.sqrt(i1) - self.z[None, :] * math.sqrt(i0)) / d)
            f = (kern * (self.w * self.f)[None, :]).sum(axis=1) * math.sqrt(i1) / d
        self.z, self.w, self.f = z, w, f


def crossing_probabilities(boundaries: Sequence[float] | np.ndarray, info: Sequence[float] | np.ndarray, *,
                           two_sided: bool = False) -> np.ndarray:
    """Probability, under θ = 0, that the sequential z-statistic first crosses at stage k.

    One-sided: crossing is Z_k ≥ c_k; two-sided: |Z_k| ≥ c_k (symmetric). ``info``: the
    information levels (any scale, strictly increasing). Armitage–McPherson–Rowe recursion."""
    t = _check_info(info)
    c = np.asarray(boundaries, dtype=np.float64)
    if c.shape != t.shape:
        raise ValueError("boundaries and info must have the same length")
    rec = _Recursion(t, two_sided)
    out = []
    for k, ck in enumerate(c):
        out.append(rec.cross(k, ck) if math.isfinite(ck) else 0.0)
        rec.advance(k, ck)
    return np.array(out)


@dataclass(frozen=True)
class Boundaries:
    """Critical values c_k of the sequential z-statistic and what each stage spends."""

    info_fractions: tuple  # t_k
    boundaries: tuple  # c_k (inf: this stage cannot reject)
    nominal_alpha: tuple  # 1 − Φ(c_k): the level the stage's own test is run at
    cumulative_alpha: tuple  # α(t_k), the error spent by stage k
    alpha: float
    spending: str
    two_sided: bool


def spending_boundaries(info_fractions: Sequence[float], *, alpha: float = 0.05, spending: str = "pocock",
                        two_sided: bool = False) -> Boundaries:
    """Boundaries for the actual information fractions ``t_1 < … < t_K ≤ 1`` by alpha spending.

    Stage k's boundary solves P(first crossing at k) = α(t_k) − α(t_{k−1}) given the earlier
    boundaries (Lan & DeMets 1983; Jennison & Turnbull 2000 §7.2 and ch. 19). ``alpha`` is the
    error per side; with ``two_sided`` the region is symmetric and each side spends ``alpha``
    (a two-sided test of level 2·alpha). One-sided boundaries used for two opposite one-sided
    claims (as seed stability does) keep each claim's error ≤ alpha, conservatively."""
    t = _check_info(info_fractions)
    if t[-1] > 1.0 + 1e-12:
        raise ValueError(f"information fractions must be ≤ 1, got {info_fractions!r}")
    if spending not in SPENDING_FUNCTIONS:
        raise ValueError(f"spending must be one of {SPENDING_FUNCTIONS}, got {spending!r}")
    return _boundaries(tuple(float(x) for x in t), float(alpha), spending, bool(two_sided))


@lru_cache(maxsize=1024)
def _boundaries(fractions: tuple, alpha: float, spending: str, two_sided: bool) -> Boundaries:
    t = np.asarray(fractions)
    rec = _Recursion(t, two_sided)
    side = 2.0 if two_sided else 1.0
    cs, spent_before = [], 0.0
    cum = [spent_alpha(x, alpha=alpha, spending=spending) for x in t]
    for k in range(t.size):
        target = side * (cum[k] - spent_before)
        if target <= 1e-15:
            c = math.inf
        else:
            def excess(c: float, k: int = k, target: float = target) -> float:
                return rec.cross(k, c) - target

            if excess(0.0) < 0:  # cannot spend that much even at c = 0 (never happens for α ≤ 0.5)
                c = 0.0
            else:
                c = float(scipy.optimize.brentq(excess, 0.0, 12.0, xtol=1e-10))
        cs.append(c)
        spent_before = cum[k]
        rec.advance(k, c)
    nominal = tuple(float(scipy.stats.norm.sf(c)) if math.isfinite(c) else 0.0 for c in cs)
    return Boundaries(tuple(float(x) for x in t), tuple(cs), nominal, tuple(cum), float(alpha), spending, two_sided)


def pocock_constant(k: int, *, alpha: float = 0.05) -> float:
    """Pocock's (1977) constant C_P(K, α): two-sided level α with |Z_k| ≥ C_P at K equal stages.

    Jennison & Turnbull (2000) Table 2.1, α = 0.05: 2.178, 2.289, 2.361, 2.413 for K = 2..5."""
    info = np.arange(1, k + 1, dtype=float)
    return float(scipy.optimize.brentq(
        lambda c: crossing_probabilities([c] * k, info, two_sided=True).sum() - alpha, 1.0, 6.0, xtol=1e-10))


def obrien_fleming_constant(k: int, *, alpha: float = 0.05) -> float:
    """O'Brien & Fleming's (1979) constant C_B(K, α): two-sided level α with |Z_k| ≥ C_B √(K/k).

    Jennison & Turnbull (2000) Table 2.3, α = 0.05: 1.977, 2.004, 2.024, 2.040 for K = 2..5
    (C_B is the final stage's boundary)."""
    info = np.arange(1, k + 1, dtype=float)
    scale = np.sqrt(k / info)
    return float(scipy.optimize.brentq(
        lambda c: crossing_probabilities(c * scale, info, two_sided=True).sum() - alpha, 1.0, 6.0, xtol=1e-10))


# --------------------------------------------------------------------------- two arms in stages


@dataclass(frozen=True)
class StagedLooks:
    """The looks of a two-arm test in stages: per look, the stage it is at, the values of both arms pooled over
    stages 1..stage, and its information fraction (the input of :func:`spending_boundaries`)."""

    stages: tuple[int, ...]
    arms: tuple[tuple[np.ndarray, np.ndarray], ...]
    fractions: tuple[float, ...]


def staged_looks(first_by_stage: Sequence, second_by_stage: Sequence, *, last_stage: int,
                 fraction: Callable[[int, int, bool], float]) -> StagedLooks:
    """Pool two arms' values stage by stage and decide which stages make a look.

    ``first_by_stage`` / ``second_by_stage``: per stage, the values *added* to each arm at that stage
    (the same number of stages; the caller checks). ``fraction(n_first, n_second, last)``: the information
    fraction at these pooled sizes, 1 when ``last`` (the stage is ``last_stage``). A stage that adds no value
    to either arm, or whose fraction does not grow past the previous look's, makes no new look (its runs
    failed); if it is the last stage, the previous look becomes the final analysis and spends what is left
    (its fraction becomes 1). The first stage always makes a look, empty or not; no stages, no looks."""
    pooled = (np.zeros(0), np.zeros(0))
    stages: list[int] = []
    arms: list[tuple[np.ndarray, np.ndarray]] = []
    fractions: list[float] = []
    for k, (first_add, second_add) in enumerate(zip(first_by_stage, second_by_stage), start=1):
        pooled = (np.concatenate([pooled[0], np.asarray(first_add, dtype=np.float64).ravel()]),
                  np.concatenate([pooled[1], np.asarray(second_add, dtype=np.float64).ravel()]))
        t = fraction(pooled[0].size, pooled[1].size, k == last_stage)
        same = bool(arms) and (pooled[0].size, pooled[1].size) == (arms[-1][0].size, arms[-1][1].size)
        if fractions and (same or t <= fractions[-1]):  # no new information: no new look
            if k == last_stage:
                fractions[-1] = 1.0
            continue
        fractions.append(t)
        arms.append((pooled[0].copy(), pooled[1].copy()))
        stages.append(k)
    return StagedLooks(tuple(stages), tuple(arms), tuple(fractions))


# --------------------------------------------------------------------------- seed stability in stages


def stage_sizes(first: int, step: int, max_seeds: int) -> tuple:
    """Planned cumulative seed counts: first, first + step, … capped at ``max_seeds``."""
    if first < 1 or step < 1 or max_seeds < first:
        raise ValueError(f"need first ≥ 1, step ≥ 1, max_seeds ≥ first; got {first}, {step}, {max_seeds}")
    sizes = [first]
    while sizes[-1] < max_seeds:
        sizes.append(min(sizes[-1] + step, max_seeds))
    return tuple(sizes)


def information_fraction(n: int, max_seeds: int, *, last: bool) -> float:
    """(n − 1)/(N − 1): the share of the log-variance's information at n of N seeds; 1 at the last stage."""
    if last or max_seeds <= 1:
        return 1.0
    return min(max((n - 1.0) / (max_seeds - 1.0), 1e-6), 1.0)


@dataclass(frozen=True)
class StageLook:
    """One stage of a sequential seed-stability verdict."""

    stage: int
    n_seeds: int  # finite final values judged (seeds of stages 1..stage)
    info_fraction: float
    boundary: float  # c_k, the z the claim had to pass (inf: not testable)
    nominal_alpha: float  # 1 − Φ(c_k): each one-sided bound of this stage is at level 1 − nominal_alpha
    cumulative_alpha: float  # α(t_k) spent so far
    std: float | None
    lower: float | None  # the stage's lower bound of σ at 1 − nominal_alpha
    upper: float | None
    verdict: str  # the stage's decision: stable | unstable | inconclusive


@dataclass(frozen=True)
class SequentialDecision:
    verdict: str
    decided_at: int | None  # the stage that crossed a boundary (None: inconclusive)
    final: bool  # no further stage: the budget is spent or a boundary was crossed
    stages: tuple  # StageLook per stage looked at
    alpha: float
    spending: str
    max_seeds: int
    stopped: bool = False  # the study stopped growing before the budget's last stage (its time budget ran out)


def sequential_seed_decision(values_by_stage: Sequence, *, max_std: float, max_seeds: int, last_stage: int,
                             alpha: float = 0.05, spending: str = "pocock", kurtosis_floor: float | None = None,
                             stopped: bool = False, resolution: float | None = None) -> SequentialDecision:
    """Seed stability judged in stages with alpha spending (see the module docstring).

    ``values_by_stage``: per stage, the finite final values of the seeds *added* at that stage
    (stage k is judged on stages 1..k). ``last_stage``: the number of the last stage the budget
    allows (1-based): it spends the remaining error. At each stage the rule of
    ``steady.server.stats.seed_stability.seed_spread`` (robust one-sided σ bounds; ``spread_decision``) is applied at the stage's
    nominal level α_k = 1 − Φ(c_k) instead of α: ``stable`` if the upper bound < max_std,
    ``unstable`` if the lower bound > max_std. The first stage that decides ends the test; later
    data do not change it. A stage with fewer than 5 seeds, or whose boundary needs more seeds than
    it has for Bonett's bound (n ≤ c_k + 1), spends its error without testing (conservative).
    The z of each one-sided bound is a log-variance statistic with asymptotically independent
    increments, so the design holds asymptotically; ``steady.server.stats.calibration`` measures it on
    small, autocorrelated and heavy-tailed studies. ``stopped``: no stage comes after the ones given although
    the budget allowed more (:func:`stopped_early`). ``resolution``: the metric's resolution, at which a
    stage whose values all tie is judged (``seed_stability.tie_decision``: a tie coarser than the limit
    needs is no evidence of stability)."""
    if not (max_std > 0 and math.isfinite(max_std)):
        raise ValueError(f"max_std must be finite and > 0, got {max_std!r}")
    if last_stage < 1 or len(values_by_stage) > last_stage:
        raise ValueError(f"last_stage must be ≥ 1 and ≥ the stages given, got {last_stage}")
    floor = KURTOSIS_FLOOR if kurtosis_floor is None else kurtosis_floor
    # one arm: staged_looks with an empty second arm (a stage adding no seed, its runs all failed, makes no look)
    staged = staged_looks(values_by_stage, [()] * len(values_by_stage), last_stage=last_stage,
                          fraction=lambda n, _none, last: information_fraction(n, max_seeds, last=last))
    looks: list[StageLook] = []
    if not staged.fractions:
        return SequentialDecision("inconclusive", None, stopped, (), alpha, spending, max_seeds, stopped=stopped)
    b = spending_boundaries(staged.fractions, alpha=alpha, spending=spending)
    verdict, decided = "inconclusive", None
    for j, ((x, _), c, k) in enumerate(zip(staged.arms, b.boundaries, staged.stages)):
        n = x.size
        a_k = b.nominal_alpha[j]
        testable = n >= MIN_SEEDS and math.isfinite(c) and n > c + 1.0 and a_k > 0
        std = float(x.std(ddof=1)) if n >= 2 else None
        lower = upper = None
        v = "inconclusive"
        if testable:
            v, db = spread_decision(x, max_std=max_std, alpha=a_k, kurtosis_floor=floor, resolution=resolution)
            if db is not None:
                lower, upper = db.lower, db.upper
        looks.append(StageLook(k, n, b.info_fractions[j], float(c), a_k, b.cumulative_alpha[j], std, lower, upper,
                               v))
        if v != "inconclusive":
            verdict, decided = v, k
            break
    final = decided is not None or stopped or len(values_by_stage) >= last_stage
    return SequentialDecision(verdict, decided, final, tuple(looks), float(alpha), spending, int(max_seeds),
                              stopped=stopped and decided is None)


def stopped_early(verdict: str, final: bool, stopped: bool, *, more: str) -> str:
    """Why a group-sequential verdict is still inconclusive, in words (``more``: the words while stages remain).

    A study may stop growing before its budget's last stage when its time budget (``budget.max_minutes``) runs out.
    That only drops looks: every look already taken keeps its boundary, and no error is spent beyond the plan, so
    each claim stays wrong at most α (the error the dropped looks would have spent is left unused)."""
    if verdict != "inconclusive" or not final:
        return more
    return "stopped by the study's time budget before the budget's last stage" if stopped else "budget spent"
