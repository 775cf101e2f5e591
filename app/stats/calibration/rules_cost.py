"""Calibration scenarios: cost family (see steady.server.stats.calibration.rules).

Rules
-----
* ``cost.ratio_ci`` — the step-time ratio's CI (``steady.server.stats.cost.cost_ratio``) excludes 1.0.
  Healthy: two identical levels; a firing is a non-covering interval, nominal 5% at 95%.
* ``cost.budget_fail`` — the verdict against a budget is ``fail``. Healthy: the true ratio
  equals the budget (the least favourable true ratio for a false ``fail``), nominal 2.5%.
* ``cost.budget_pass`` — the verdict is ``pass``. Healthy: the true ratio equals the budget
  (a ``pass`` would wrongly clear a level that costs more than allowed), nominal 2.5%.
* ``planning.std_claim`` — a study planned with ``seeds_for_std_claim`` then judged by the
  chi-square bound of σ. Healthy: σ equals the limit (``stable`` is a false claim), nominal α;
  planted: σ is the planned alternative; the firing rate is the achieved power (≥ 80%).
* ``planning.equivalence`` — a two-stack study planned with ``seeds_for_equivalence`` then
  judged by TOST. Healthy: the true difference equals the margin, nominal α; planted: the
  planned alternative (difference 0), power ≥ 80%.

Step-time generator (``simulate_step_times``): per run, ``steps`` step times
``base · ratio[level] · exp(σ_run·Z) · (1 + drift·position/(N−1)) · exp(σ_step·Z_step) · straggler``
with the first ``warmup_steps`` steps ``warmup_factor`` times slower, and a straggler being,
with probability ``straggler_p``, a factor 1 + Pareto(1.5) (heavy right tail, infinite
variance). ``position`` is the run's place in the execution queue of N runs: ``blocked``
(every run of one level, then the next level: the old expansion order) or ``interleaved``
(``steady.server.stats.cost.balanced_level_order``: the order the study service now creates runs in).

Derived step times (``line_arrival_times``): what the worker measures for a run that logs no step
times and prints a step line every ``every`` steps, each line reaching the agent after a scheduling
delay drawn from an exponential distribution of mean ``jitter`` seconds (lines keep their order; a
line that arrives with the one before it is timed with the next later one, as
``steady.worker.agent.stepclock.StepClock`` does).
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache, partial

import numpy as np
import scipy

from steady.server.stats.calibration import Rule, Scenario
from steady.server.stats.cost import balanced_level_order, cost_ratio
from steady.server.stats.intervals import std_confidence_bounds
from steady.server.stats.planning import seeds_for_equivalence, seeds_for_std_claim

__all__ = ["RULES", "simulate_step_times", "queue_positions", "line_arrival_times"]

LEVELS = ("seeded", "strict")


def queue_positions(levels: Sequence[str], n_per_level: int, order: str) -> dict[str, list[int]]:
    """Each level's runs' positions in a single worker's execution queue."""
    if order == "blocked":
        seq = [lv for lv in levels for _ in range(n_per_level)]
    elif order == "interleaved":
        seq = [lv for block in balanced_level_order(levels, n_per_level) for lv in block]
    else:
        raise ValueError(f"order must be 'blocked' or 'interleaved', got {order!r}")
    out: dict[str, list[int]] = {lv: [] for lv in levels}
    for pos, lv in enumerate(seq):
        out[lv].append(pos)
    return out


def simulate_step_times(rng: np.random.Generator, *, n_per_level: int, ratio: float = 1.0, order: str = "interleaved",
                        drift: float = 0.15, run_sd: float = 0.05, step_sd: float = 0.05, steps: int = 120,
                        warmup_steps: int = 6, warmup_factor: float = 4.0, straggler_p: float = 0.03,
                        base: float = 0.02, levels: Sequence[str] = LEVELS) -> dict[str, list[np.ndarray]]:
    """Step times of ``n_per_level`` runs at each level; the last level is ``ratio`` times slower."""
    pos = queue_positions(levels, n_per_level, order)
    n_total = len(levels) * n_per_level
    out: dict[str, list[np.ndarray]] = {}
    for i, lv in enumerate(levels):
        factor = ratio if i == len(levels) - 1 else 1.0
        runs = []
        for p in pos[lv]:
            load = 1.0 + drift * p / max(n_total - 1, 1)
            run = base * factor * load * float(np.exp(run_sd * rng.standard_normal()))
            t = run * np.exp(step_sd * rng.standard_normal(steps))
            hit = rng.random(steps) < straggler_p
            t[hit] *= 1.0 + rng.pareto(1.5, int(hit.sum()))
            t[:warmup_steps] *= warmup_factor
            runs.append(t)
        out[lv] = runs
    return out


def line_arrival_times(rng: np.random.Generator, step_times: np.ndarray, *, every: int, jitter: float) -> np.ndarray:
    """The step times the worker derives from step lines printed after every ``every``-th step of a run
    whose true step times are ``step_times``: the time between two lines' arrivals over the steps between."""
    steps = np.arange(every - 1, step_times.size, every)
    arrivals = np.maximum.accumulate(np.cumsum(step_times)[steps] + rng.exponential(jitter, steps.size))
    later = np.concatenate([[True], np.diff(arrivals) > 0])
    return np.diff(arrivals[later]) / np.diff(steps[later])


def _ratio_ci_excludes_one(rng: np.random.Generator, *, ratio: float, paired: bool = False,
                           every: int | None = None, jitter: float = 0.0, **kw) -> bool:
    t = simulate_step_times(rng, ratio=ratio, **kw)
    if every is not None:
        t = {lv: [line_arrival_times(rng, r, every=every, jitter=jitter) for r in runs] for lv, runs in t.items()}
    cr = cost_ratio(t["strict"], t["seeded"], numerator="strict", denominator="seeded", paired=paired)
    return cr.ci_low is not None and cr.ci_high is not None and not (cr.ci_low <= 1.0 <= cr.ci_high)


def _verdict_is(rng: np.random.Generator, *, verdict: str, ratio: float, budget: float, **kw) -> bool:
    t = simulate_step_times(rng, ratio=ratio, **kw)
    cr = cost_ratio(t["strict"], t["seeded"], numerator="strict", denominator="seeded", budget=budget)
    return cr.verdict == verdict


_std_plan = lru_cache(maxsize=None)(seeds_for_std_claim)
_equivalence_plan = lru_cache(maxsize=None)(seeds_for_equivalence)


def _std_claim_stable(rng: np.random.Generator, *, sigma_over_limit: float, alpha: float = 0.05,
                      alternative: float = 0.8) -> bool:
    plan = _std_plan(alternative, 1.0, alpha=alpha)
    x = rng.normal(0.0, sigma_over_limit, plan.n)
    return std_confidence_bounds(x, alpha=alpha).upper < 1.0


def _tost_equivalent(rng: np.random.Generator, *, true_diff: float, sigma: float = 1.0, margin: float = 0.5,
                     alpha: float = 0.05) -> bool:
    plan = _equivalence_plan(0.0, sigma, margin, alpha=alpha)
    n = plan.n
    assert n is not None  # the calibrated designs are all within MAX_SEEDS
    a = rng.normal(0.0, sigma, n)
    b = rng.normal(true_diff, sigma, n)
    d = b.mean() - a.mean()
    se = np.sqrt(a.var(ddof=1) / n + b.var(ddof=1) / n)
    df = 2 * n - 2
    p_low = scipy.stats.t.sf((d + margin) / se, df)
    p_high = scipy.stats.t.cdf((d - margin) / se, df)
    return max(p_low, p_high) < alpha


def _s(name, kind, description, trial, **kw) -> Scenario:
    return Scenario(name=name, kind=kind, description=description, trial=partial(trial, **kw))


RULES: list[Rule] = [
    Rule(
        name="cost.ratio_ci",
        nominal=0.05,
        guarantee="95% CI on the step-time ratio: excludes the true ratio ≤ 5% of the time",
        scenarios=(
            _s("identical_3_interleaved_drift", "healthy",
               "identical levels, 3 runs each, interleaved, 15% load drift, heavy-tailed steps",
               _ratio_ci_excludes_one, ratio=1.0, n_per_level=3),
            _s("identical_2_interleaved_drift", "healthy", "identical levels, 2 runs each, interleaved, 15% drift",
               _ratio_ci_excludes_one, ratio=1.0, n_per_level=2),
            _s("identical_5_interleaved_drift", "healthy", "identical levels, 5 runs each, interleaved, 15% drift",
               _ratio_ci_excludes_one, ratio=1.0, n_per_level=5),
            _s("identical_3_paired_drift", "healthy",
               "identical levels, 3 pairs, interleaved, 15% drift, paired t on log ratios",
               _ratio_ci_excludes_one, ratio=1.0, n_per_level=3, paired=True),
            _s("identical_3_no_drift", "healthy", "identical levels, 3 runs each, 5% run-to-run sd, no drift",
               _ratio_ci_excludes_one, ratio=1.0, n_per_level=3, drift=0.0),
            _s("identical_3_noisy_runs", "healthy", "identical levels, 3 runs each, 20% run-to-run sd, no drift",
               _ratio_ci_excludes_one, ratio=1.0, n_per_level=3, drift=0.0, run_sd=0.2),
            _s("identical_3_line_arrival_every_step", "healthy",
               "identical levels, 3 runs each, interleaved, 15% drift; times from a line per step arriving "
               "after an exponential delay of mean 5 ms (a quarter of the 20 ms step)",
               _ratio_ci_excludes_one, ratio=1.0, n_per_level=3, every=1, jitter=0.005),
            _s("identical_3_line_arrival_no_drift", "healthy",
               "identical levels, 3 runs each, 5% run-to-run sd, no drift; times from a line per step arriving "
               "after an exponential delay of mean 5 ms",
               _ratio_ci_excludes_one, ratio=1.0, n_per_level=3, drift=0.0, every=1, jitter=0.005),
            _s("identical_3_line_arrival_every_10", "healthy",
               "identical levels, 3 runs each, interleaved, 15% drift; times from a line every 10th step, "
               "arriving after an exponential delay of mean 5 ms",
               _ratio_ci_excludes_one, ratio=1.0, n_per_level=3, every=10, jitter=0.005),
            _s("strict_1.3x_3_interleaved", "planted", "strict 1.3× slower, 3 runs each, interleaved, 15% drift",
               _ratio_ci_excludes_one, ratio=1.3, n_per_level=3),
            _s("strict_1.3x_3_line_arrival_every_10", "planted",
               "strict 1.3× slower, 3 runs each, interleaved, 15% drift; times from a line every 10th step",
               _ratio_ci_excludes_one, ratio=1.3, n_per_level=3, every=10, jitter=0.005),
            _s("strict_1.1x_5_interleaved", "planted", "strict 1.1× slower, 5 runs each, interleaved, 15% drift",
               _ratio_ci_excludes_one, ratio=1.1, n_per_level=5),
        ),
    ),
    Rule(
        name="cost.budget_fail",
        nominal=0.025,
        guarantee="false 'fail' ≤ 2.5% (95% CI against the budget)",
        scenarios=(
            _s("at_budget_3_interleaved", "healthy", "strict costs exactly the 1.5× budget, 3 runs each",
               _verdict_is, verdict="fail", ratio=1.5, budget=1.5, n_per_level=3),
            _s("at_budget_5_interleaved", "healthy", "strict costs exactly the 1.5× budget, 5 runs each",
               _verdict_is, verdict="fail", ratio=1.5, budget=1.5, n_per_level=5),
            _s("twice_budget_3", "planted", "strict costs 2× against a 1.5× budget, 3 runs each",
               _verdict_is, verdict="fail", ratio=2.0, budget=1.5, n_per_level=3),
        ),
    ),
    Rule(
        name="cost.budget_pass",
        nominal=0.025,
        guarantee="false 'pass' ≤ 2.5% (95% CI against the budget)",
        scenarios=(
            _s("at_budget_3_interleaved", "healthy", "strict costs exactly the 1.5× budget, 3 runs each",
               _verdict_is, verdict="pass", ratio=1.5, budget=1.5, n_per_level=3),
            _s("free_3", "planted", "strict costs nothing against a 1.5× budget, 3 runs each",
               _verdict_is, verdict="pass", ratio=1.0, budget=1.5, n_per_level=3),
        ),
    ),
    Rule(
        name="planning.std_claim",
        nominal=0.05,
        guarantee="planned for σ = 0.8·max_std with power 80%; false 'stable' ≤ 5%",
        scenarios=(
            _s("sigma_at_limit", "healthy", "σ = max_std, seeds as planned for σ = 0.8·max_std",
               _std_claim_stable, sigma_over_limit=1.0),
            _s("sigma_at_alternative", "planted", "σ = 0.8·max_std (the planned alternative): power",
               _std_claim_stable, sigma_over_limit=0.8),
        ),
    ),
    Rule(
        name="planning.equivalence",
        nominal=0.05,
        guarantee="planned for a true difference 0 with power 80%; false 'equivalent' ≤ 5%",
        scenarios=(
            _s("diff_at_margin", "healthy", "true difference = margin (0.5σ), seeds as planned for difference 0",
               _tost_equivalent, true_diff=0.5),
            _s("diff_zero", "planted", "true difference 0 (the planned alternative): power",
               _tost_equivalent, true_diff=0.0),
        ),
    ),
]
