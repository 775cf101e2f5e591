"""Rate checks whose own power is computed (CONTRIBUTING.md, "How a rate check is sized").

A simulated rate check counts events in simulated studies: false alarms of a healthy scenario, or misses of
a planted one. It passes when the count rules out the rate it is there to catch, ``bound`` (twice the nominal
false-alarm level, or twice the miss rate a stated power allows), by a one-sided exact binomial test: so a
rule at ``bound`` fails it with probability ≥ 0.95, whatever the simulation count.

The count is taken in stages, so that a rule far from its bound pays only for the first: the first stage
passes at a chance of at most 2.5% under ``bound``, the last spends what is left of 5%. ``pass_probability``
sums the exact binomial distribution of the running count over the stages (no normal approximation, no
simulation), and the tests assert it for every design they use: ≤ 0.05 at ``bound``, and how often a rule
where it should be passes.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np
from scipy import stats

SPEND = (0.025, 0.05)  # cumulative chance of passing a rule at ``bound``, after the first stage and the last


def _pass_probability(p: float, stages: tuple[int, ...], cutoffs: tuple[int, ...]) -> float:
    running = np.array([1.0])  # distribution of the count over the paths still going
    passed, done = 0.0, 0
    for n, cut in zip(stages, cutoffs):
        running = np.convolve(running, stats.binom.pmf(np.arange(n - done + 1), n - done, p))
        if cut >= 0:
            passed += float(running[:cut + 1].sum())
            running[:cut + 1] = 0.0
        done = n
    return passed


@dataclass(frozen=True)
class Design:
    """``stages``: cumulative simulation counts; ``cutoffs``: the largest count each stage passes at
    (−1: that stage cannot pass yet)."""

    bound: float
    stages: tuple[int, ...]
    cutoffs: tuple[int, ...]

    def pass_probability(self, rate: float) -> float:
        """P(the check passes) when the true rate is ``rate``: exact."""
        return _pass_probability(rate, self.stages, self.cutoffs)

    def run(self, count: Callable[[int], int]) -> tuple[bool, int, int]:
        """``count(n)`` simulates ``n`` more studies and returns how many had the event. Returns
        (passed, events, studies)."""
        events = done = 0
        for n, cut in zip(self.stages, self.cutoffs):
            events += count(n - done)
            done = n
            if events <= cut:
                return True, events, done
        return False, events, done


@cache
def design(bound: float, stages: tuple[int, ...]) -> Design:
    """The largest cutoff at each stage that keeps the cumulative chance of passing a rule at ``bound``
    within ``SPEND`` (a bound of 0: any event fails)."""
    if not 0.0 <= bound < 1.0 or not 1 <= len(stages) <= len(SPEND):
        raise ValueError(f"bound {bound} and {len(stages)} stage(s)")
    spend = SPEND[-len(stages):]
    cutoffs: list[int] = []
    for i, budget in enumerate(spend):
        cut = -1
        if bound == 0.0:
            cut = 0 if i == len(stages) - 1 else -1
        else:
            while _pass_probability(bound, stages[:i + 1], (*cutoffs, cut + 1)) <= budget:
                cut += 1
        cutoffs.append(cut)
    return Design(bound, tuple(stages), tuple(cutoffs))
