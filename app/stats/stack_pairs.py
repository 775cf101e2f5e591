"""Same seed on two stacks: which source made them differ, where, and by how much.

The stack-portability verdict compares the *distributions* of final values across seeds;
this compares each seed with itself on the other stack, step by step, with the
repeatability comparison (``steady.server.stats.repeatability``). Its source names the first cause in
the same order: ``stack`` when the run fingerprints differ (a library version, the thread
count, the GPU…), otherwise ``seeding`` / ``data_order`` / ``numerics`` from the digests
(two stack labels that in fact ran on one stack).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from steady.server.stats.repeatability import VERDICT_ORDER, RepeatRun, repeatability
from steady.server.stats.resolution import identical_words

__all__ = ["StackPairs", "stack_pairs"]


@dataclass(frozen=True)
class StackPairs:
    n_pairs: int  # seeds run on both stacks
    verdict: str  # identical | within_tolerance | out_of_tolerance | inconclusive (no common seed)
    source: str | None  # of the worst pair; None when every pair is identical
    worst_seed: int | None
    first_divergent_step: int | None  # of the worst pair
    max_abs_delta: float  # over all pairs and steps
    max_rel_delta: float
    max_ulps: int | None  # None when a pair's values were parsed from text (see ``resolution``)
    reason: str
    resolution: float | None = None  # values parsed from text: the coarsest last printed digit of the pairs


def stack_pairs(pairs: Mapping[int, tuple[RepeatRun, RepeatRun]], *, atol: float = 0.0,
                rtol: float = 0.0) -> StackPairs:
    """``pairs``: seed -> (run on the reference stack, run on the candidate stack), each the
    metric's series with its fingerprint and digests. The worst pair (verdict, then max |Δ|)
    gives the verdict, the source and the first divergent step; deltas are maxima over pairs."""
    if not pairs:
        nan = float("nan")
        return StackPairs(0, "inconclusive", None, None, None, nan, nan, 0, "no seed ran on both stacks")
    results = {seed: repeatability(list(pair), atol=atol, rtol=rtol) for seed, pair in sorted(pairs.items())}
    worst = max(results, key=lambda s: (VERDICT_ORDER[results[s].verdict], results[s].max_abs_delta, -s))
    w = results[worst]
    n = len(results)
    resolution = max((r.resolution for r in results.values() if r.resolution is not None), default=None)
    if w.verdict == "identical":
        reason = f"{identical_words(resolution)} on both stacks for {n} seed(s)"
    else:
        reason = f"same seed on both stacks, seed {worst} (worst of {n}): {w.reason}"
    ulps = [r.max_ulps for r in results.values()]
    return StackPairs(n, w.verdict, w.source, worst, w.first_divergent_step,
                      max(r.max_abs_delta for r in results.values()), max(r.max_rel_delta for r in results.values()),
                      None if None in ulps else max(u for u in ulps if u is not None), reason, resolution)
