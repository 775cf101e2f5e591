"""A noisy bisect: the first point of an ordered history (commits, package versions) where a property changes,
when each point can only be judged by a statistical test.

``git bisect`` asks a yes/no oracle once per point; a training metric is noisy, so here each point is
*decided* by one of Steady's own sequential rules (``sequential.sequential_seed_decision``,
``sequential_tost.sequential_tost_decision``, or exact repeatability), which adds runs in stages until it
claims ``good`` (as at the GOOD end) or ``bad`` (changed), or spends its share of the budget and stays
``undecided``. A point whose code cannot build or run is ``skipped`` (``git bisect skip``). The search never
guesses: a point left undecided is excluded like a skipped one, and when only such points separate the last
good from the first bad, the answer is "undecided between A and B", with the points that could not be
decided.

k-ary search (Pinpoint's parallel bisect): each round judges up to ``parallel`` points of the open
interval at once, spaced to split it into ``parallel + 1`` near-equal parts, so ``⌈log_{k+1} n⌉`` rounds
locate the change among n candidates.

Error. The search names a wrong point only if some point's claim is wrong (a good point claimed bad, or a
bad one claimed good): with m points decided, each by a rule whose claims are wrong with probability at most
α_point, P(wrong point named) ≤ m·α_point (Bonferroni; the claims may share a reference sample, the bound
does not need them independent). :func:`plan` splits a total α over the most points a search can decide
(the two ends plus ``parallel`` per round), so a search that decides no more than planned names a wrong
point with probability at most α; :class:`BisectResult` states its own bound, m·α_point, for the points it
actually decided. Undecided points cost runs, never errors. The property must change once (good … good,
bad … bad, skipped points aside); a round whose claims contradict that (a good point after a bad one) ends
the search as ``inconsistent``, naming both.

Pure: the oracle is a callable, the result frozen dataclasses; no I/O.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from steady.server.stats.report import COST_PAIRS
from steady.server.stats.sequential import sequential_seed_decision, stage_sizes
from steady.server.stats.sequential_tost import sequential_tost_decision

__all__ = [
    "GOOD", "BAD", "UNDECIDED", "SKIPPED", "STATES",
    "BisectPlan", "BisectResult", "PointOutcome", "Round",
    "bisect", "checks_per_point", "decide_point", "plan", "rounds_needed", "split_points", "staged_seed_stability", "staged_tost",
    "wrong_point_bound",
]

GOOD, BAD, UNDECIDED, SKIPPED = "good", "bad", "undecided", "skipped"
STATES = (GOOD, BAD, UNDECIDED, SKIPPED)


@dataclass(frozen=True)
class PointOutcome:
    """A point as its rule decided it: ``state`` one of :data:`STATES`, the runs it used, and ``ref``, what the
    caller needs to show the evidence (a study id; ``None`` in a simulation)."""

    point: int
    state: str
    runs: int
    ref: object = None
    why: str = ""


@dataclass(frozen=True)
class Round:
    """One round of the search: the interval it split (last good, first bad) and its points' outcomes."""

    low: int
    high: int
    outcomes: tuple[PointOutcome, ...]


@dataclass(frozen=True)
class BisectPlan:
    """What a search over ``n_points`` (GOOD = 0 … BAD = n_points − 1) may spend and risk."""

    n_points: int
    parallel: int
    rounds: int  # rounds of the search proper, with no point skipped or undecided
    max_decided: int  # the ends judged, plus ``parallel`` per round
    alpha: float  # the stated chance of naming a wrong point
    alpha_point: float  # each point's rule: alpha / max_decided
    budget_runs: int


@dataclass(frozen=True)
class BisectResult:
    """``state``: ``found`` (``first_bad`` is the first point where the property changed, ``last_good`` its parent,
    adjacent); ``undecided`` (the change lies in ``last_good`` + 1 … ``first_bad``, separated only by points
    that were skipped or undecided, listed; or an end could not be decided, or the budget ran out);
    ``no_change`` (an end was claimed the opposite of what was given: GOOD bad or BAD good, in ``ends``);
    ``inconsistent`` (a good point after a bad one, both in ``conflict``).
    ``error_bound``: m·α_point for the m points decided (good or bad)."""

    state: str
    last_good: int
    first_bad: int
    undecided: tuple[int, ...]
    skipped: tuple[int, ...]
    rounds: tuple[Round, ...]
    ends: tuple[PointOutcome, ...]
    runs: int
    decided: int
    error_bound: float
    budget_spent: bool
    conflict: tuple[int, int] | None = None
    time_spent: bool = False  # the time budget ran out before the next points would have started

    def outcome(self, point: int) -> PointOutcome | None:
        """The last outcome judged at ``point`` (an end or a round's), or None."""
        found = None
        for o in self.ends + tuple(o for r in self.rounds for o in r.outcomes):
            if o.point == point:
                found = o
        return found


def rounds_needed(candidates: int, parallel: int) -> int:
    """Rounds a k-ary search needs to locate a change among ``candidates`` interior points (every point
    decided): ⌈log_{k+1}(candidates + 1)⌉."""
    if candidates < 0 or parallel < 1:
        raise ValueError(f"need candidates ≥ 0 and parallel ≥ 1, got {candidates}, {parallel}")
    r, span = 0, 1
    while span < candidates + 1:
        span *= parallel + 1
        r += 1
    return r


def plan(n_points: int, *, parallel: int = 1, budget_runs: int, alpha: float = 0.05,
         judge_ends: int = 2) -> BisectPlan:
    """The search's plan: its rounds, the most points it decides, and each point's level α/max_decided
    (Bonferroni over the points decided). ``judge_ends``: how many of GOOD and BAD are judged first (0–2)."""
    if n_points < 2:
        raise ValueError(f"a bisect needs GOOD and BAD: 2 points or more, got {n_points}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if budget_runs < 1 or parallel < 1 or judge_ends not in (0, 1, 2):
        raise ValueError(f"need budget_runs ≥ 1, parallel ≥ 1, judge_ends in 0..2; got {budget_runs}, {parallel}, "
                         f"{judge_ends}")
    rounds = rounds_needed(n_points - 2, parallel)
    max_decided = judge_ends + rounds * parallel
    return BisectPlan(n_points, parallel, rounds, max_decided, float(alpha), float(alpha) / max(max_decided, 1),
                      int(budget_runs))


def split_points(candidates: Sequence[int], parallel: int) -> tuple[int, ...]:
    """Up to ``parallel`` of ``candidates`` (sorted), splitting them into ``parallel + 1`` near-equal parts."""
    m = len(candidates)
    if m == 0:
        return ()
    k = min(parallel, m)
    picks = sorted({candidates[min(m - 1, max(0, round(j * (m + 1) / (k + 1)) - 1))] for j in range(1, k + 1)})
    return tuple(picks)


Judge = Callable[[tuple[int, ...], int], Sequence[PointOutcome]]


def bisect(n_points: int, judge: Judge, *, parallel: int = 1, budget_runs: int, alpha_point: float,
           min_runs: int = 1, judge_good: bool = True, judge_bad: bool = True,
           out_of_time: Callable[[], bool] | None = None) -> BisectResult:
    """Search points 0 (GOOD) … ``n_points`` − 1 (BAD) for the first ``bad`` point.

    ``judge(points, runs_each)``: decides each of ``points`` (judged at once, e.g. on several workers) with
    at most ``runs_each`` runs each, by a rule whose claims are wrong with probability at most
    ``alpha_point``; returns one :class:`PointOutcome` per point. Each point's share is fixed by the plan:
    ``budget_runs`` over the points a search without skipped or undecided points judges (the ends, and
    ``parallel`` per round); what decided points leave unused pays for the rounds that skipped or undecided
    points add, and a share below ``min_runs`` (the least a rule can decide on) ends the search with what it
    knows (``budget_spent``). The ends are
    judged first (``judge_good`` / ``judge_bad``; an end not judged is taken as given): an end that is not
    as given ends the search as ``no_change``. ``out_of_time()``, asked before each set of points is started
    (the points being judged run to their end), ends the search with what it knows once it says so
    (``time_spent``)."""
    if n_points < 2 or parallel < 1 or budget_runs < 1 or min_runs < 1:
        raise ValueError(f"need n_points ≥ 2, parallel ≥ 1, budget_runs ≥ 1, min_runs ≥ 1; got {n_points}, "
                         f"{parallel}, {budget_runs}, {min_runs}")
    low, high = 0, n_points - 1
    spent = 0
    rounds: list[Round] = []
    ends: list[PointOutcome] = []
    excluded: dict[int, str] = {}  # point → skipped | undecided
    budget_spent = time_spent = False
    end_points = tuple(p for p, asked in ((low, judge_good), (high, judge_bad)) if asked)
    per_point = budget_runs // (len(end_points) + parallel * rounds_needed(high - low - 1, parallel))

    def to_judge(points: tuple[int, ...]) -> tuple[PointOutcome, ...] | None:
        nonlocal spent, budget_spent, time_spent
        share = min(per_point, (budget_runs - spent) // len(points))
        if share < min_runs:
            budget_spent = True
            return None
        if out_of_time is not None and out_of_time():
            time_spent = True
            return None
        outcomes = tuple(judge(points, share))
        if sorted(o.point for o in outcomes) != sorted(points):
            raise ValueError(f"the judge answered for {[o.point for o in outcomes]}, asked {list(points)}")
        for o in outcomes:
            if o.state not in STATES:
                raise ValueError(f"point {o.point}: unknown state {o.state!r}")
        spent += sum(o.runs for o in outcomes)
        return outcomes

    def result(state: str, conflict: tuple[int, int] | None = None) -> BisectResult:
        decided = sum(o.state in (GOOD, BAD) for o in ends) + sum(
            o.state in (GOOD, BAD) for r in rounds for o in r.outcomes)
        inside = range(low + 1, high)
        return BisectResult(state, low, high, tuple(p for p in inside if excluded.get(p) == UNDECIDED),
                            tuple(p for p in inside if excluded.get(p) == SKIPPED), tuple(rounds), tuple(ends),
                            spent, decided, wrong_point_bound(decided, alpha_point), budget_spent, conflict,
                            time_spent)

    if end_points:
        got = to_judge(end_points)
        if got is None:
            return result("undecided")
        ends.extend(got)
        opposite = {low: BAD, high: GOOD}
        if any(o.state == opposite[o.point] for o in got):
            return result("no_change")
        if any(o.state != GOOD if o.point == low else o.state != BAD for o in got):
            return result("undecided")  # an end that could not be decided (or run): nothing known between them
    while True:
        candidates = [p for p in range(low + 1, high) if p not in excluded]
        if not candidates:
            return result("found" if high - low == 1 else "undecided")
        points = split_points(candidates, parallel)
        got = to_judge(points)
        if got is None:
            return result("undecided")
        rounds.append(Round(low, high, got))
        goods = [o.point for o in got if o.state == GOOD]
        bads = [o.point for o in got if o.state == BAD]
        if goods and bads and max(goods) > min(bads):
            return result("inconsistent", (min(bads), max(goods)))
        for o in got:
            if o.state in (SKIPPED, UNDECIDED):
                excluded[o.point] = o.state
        if goods:
            low = max(goods)
        if bads:
            high = min(bads)


def checks_per_point(kind: str, spec: Mapping[str, Any]) -> int:
    """How many claims of the bisected check a point's study (its spec, as stored) makes: each at
    α_point / this keeps the point's own claim wrong with probability ≤ α_point (Bonferroni: a good point is
    claimed bad when any check fails, a bad one good only when its changed check passes).
    ``seed_stability``: one per metric with a ``max_std``, determinism level and stack (or arm);
    ``determinism_cost``: one per pair of levels the report compares, per stack; ``stack_portability``: one, the
    report adjusting its TOSTs over all comparisons (Holm; Bonferroni in stages); ``convergence``: one per
    determinism level and stack (or arm), each group's steps to target against the reference; ``repeatability``:
    exact."""
    levels = [str(x) for x in spec.get("determinism") or ["seeded"]]
    groups = max(len(spec.get("arms") or spec.get("stacks") or [None]), 1)
    if kind == "seed_stability":
        judged = sum(1 for m in spec.get("metrics") or [] if isinstance(m, Mapping) and m.get("max_std"))
        return max(judged, 1) * len(levels) * groups
    if kind == "determinism_cost":
        return max(sum(a in levels and b in levels for a, b in COST_PAIRS), 1) * groups
    if kind == "convergence":
        return len(levels) * groups
    return 1


def decide_point(checks: Sequence[tuple[str, str]], *, failed: int, runs: int, prop: str) -> tuple[str, str] | None:
    """A judged point's state and its deciding line, from its study's checks of the bisected kind, each (status,
    summary), those not asked left out: ``bad`` when one fails, ``good`` when all pass, else ``undecided``, with
    the first such check's summary. With no check: ``skipped`` when some of its ``runs`` failed (e.g. a TOST
    point whose own arm's runs all failed while GOOD's ran), else None (nothing decides the point)."""
    if not checks:
        if failed:
            return SKIPPED, f"{failed} of its {runs} runs failed, leaving no {prop} check to judge"
        return None
    statuses = {status for status, _ in checks}
    state = BAD if "fail" in statuses else GOOD if statuses == {"pass"} else UNDECIDED
    want = {BAD: "fail", GOOD: "pass", UNDECIDED: "inconclusive"}[state]
    return state, next(summary for status, summary in checks if status == want)


def wrong_point_bound(decided: int, alpha_point: float) -> float:
    """The chance of naming a wrong point after ``decided`` claims at level ``alpha_point`` each (Bonferroni)."""
    return min(1.0, max(decided, 0) * alpha_point) if math.isfinite(alpha_point) else 1.0


# --------------------------------------------------------------------------- one point, decided in stages


Draw = Callable[[int], np.ndarray]


def staged_seed_stability(draw: Draw, *, max_std: float, first: int, step: int, max_runs: int, alpha: float,
                          spending: str = "pocock") -> tuple[str, int]:
    """One point judged by seed stability in stages, as a study with a budget is (docs/adaptive-seeds.md):
    ``draw(n)`` gives the final values of n more seeds; stages of ``first``, then ``step`` more, up to
    ``max_runs`` seeds, each judged by ``sequential.sequential_seed_decision`` at level ``alpha``.
    Returns (``good`` for stable | ``bad`` for unstable | ``undecided``, runs used)."""
    sizes = stage_sizes(first, step, max(max_runs, first))
    by_stage: list[np.ndarray] = []
    used = 0
    for n in sizes:
        by_stage.append(np.asarray(draw(n - used), dtype=np.float64))
        used = n
        d = sequential_seed_decision(by_stage, max_std=max_std, max_seeds=sizes[-1], last_stage=len(sizes),
                                     alpha=alpha, spending=spending)
        if d.verdict != "inconclusive":
            return (GOOD if d.verdict == "stable" else BAD), used
    return UNDECIDED, used


def staged_tost(draw_reference: Draw, draw_point: Draw, *, margin: float, first: int, step: int, max_runs: int,
                alpha: float, spending: str = "pocock") -> tuple[str, int]:
    """One point judged against the GOOD end's distribution by the sequential TOST, as a two-arm study with a
    budget is: both arms (GOOD's code, the point's code) grow by ``step`` seeds per stage from ``first`` up to
    ``max_runs`` runs in all (``max_runs // 2`` seeds per arm), each stage judged by
    ``sequential_tost.sequential_tost_decision`` at level ``alpha``. Returns (``good`` for equivalent | ``bad``
    for not equivalent | ``undecided``, runs used)."""
    per_arm = max(max_runs // 2, first)
    sizes = stage_sizes(first, step, per_arm)
    ref: list[np.ndarray] = []
    cand: list[np.ndarray] = []
    used = 0
    for n in sizes:
        ref.append(np.asarray(draw_reference(n - used), dtype=np.float64))
        cand.append(np.asarray(draw_point(n - used), dtype=np.float64))
        used = n
        d = sequential_tost_decision(ref, cand, margin=margin, max_seeds=sizes[-1], last_stage=len(sizes),
                                     alpha=alpha, spending=spending)
        if d.verdict != "inconclusive":
            return (GOOD if d.verdict == "equivalent" else BAD), 2 * used
    return UNDECIDED, 2 * used
