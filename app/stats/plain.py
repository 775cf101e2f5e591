"""The first line of every verdict: what it means and what to do, in plain words, before the
statistics (the ``reason``) that back it. One number per claim: the line quotes the numbers the
verdict was decided on (the observed std against the limit, the seeds the plan needs), never a
second estimate of the same thing.

The report carries the line as ``summary``; ``steady report``, the study page, the CI gate and
the alerts print it as it is."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from steady.server.stats.expectations import Expectation
from steady.server.stats.resolution import Compared, equal_short
from steady.server.stats.repeatability import stopped_phrase
from steady.server.stats.seed_stability import MIN_SEEDS

__all__ = ["repeatability_line", "seed_line", "portability_line", "times"]

_FIX = {  # what to do about the first difference between repeats, by its source
    "seeding": "seed every random generator from the seed (initial weights differ)",
    "data_order": "seed the data loader's shuffle (the data order differs)",
    "numerics": "run at strict for deterministic kernels (kernels, reduction order or threads differ)",
    "stack": "compare on one stack (the runs' software or hardware differ)",
}


# which digest parts repeats whose logged values are all equal, by the source found
_DIGESTS = {"seeding": "the initial-weight digests", "data_order": "the data-order digests",
            "": "the final-weight or optimizer-state digests"}


def times(value: float, limit: float) -> str:
    """``value`` as a multiple of ``limit``: "2.4×", "0.41×"."""
    r = value / limit
    return f"{r:.2g}×" if r < 10 else f"{r:.0f}×"


def _more(n_needed: int | None, n: int, unit: str = "seeds") -> str:
    if n_needed is None:
        return f"more {unit} will hardly settle it (over the planning limit)"
    return f"run ~{max(n_needed - n, 1)} more {unit} to confirm"


def _confidence(spread: Any) -> str:
    """1 − α of the rule that decided the spread (its bounds' level; the report's default 95%)."""
    bounds = spread.std_bounds or spread.decision_bounds
    alpha = bounds.alpha if bounds is not None else 0.05
    return f"{(1 - alpha) * 100:.3g}%"


def _tie_line(verdict: str, spread: Any, limit: float) -> str:
    """Every seed ended on the same value: what that shows depends on the metric's resolution."""
    q, b = spread.resolution, spread.decision_bounds
    if q is None:
        return (f"cannot tell: all {spread.n} seeds end on the same value and the metric's resolution is unknown, "
                "so the tie says nothing about the spread below it; declare the metric's resolution")
    bound = f"the smallest spread it can show, one seed one step off, is below {b.upper:.3g}" if b else ""
    if verdict == "stable":
        return (f"stable: all {spread.n} seeds end on the same value at resolution {q:.3g}; {bound}, under the "
                f"limit {limit:g} with {_confidence(spread)} confidence")
    more = (f"about {spread.n_needed - spread.n} more tied seeds would show it" if spread.n_needed
            else "more seeds at this resolution cannot show it; log the metric at a finer resolution")
    return (f"cannot tell: all {spread.n} seeds end on the same value, but at resolution {q:.3g} a tie is no "
            f"evidence of a spread below the limit {limit:g}; {more}")


def seed_line(verdict: str, spread: Any, *, n_seeds: int, sequential: Any = None, identical: bool = False,
              same: str = "bitwise identical") -> str:
    """The seed-stability line from ``SeedSpread`` (``steady.server.stats.seed_stability``); ``same``: how runs of
    different seeds that gave the same values were compared (``steady.server.stats.resolution.same_phrase``)."""
    if verdict == "seed_has_no_effect":
        runs = f"{same} runs" if same == "bitwise identical" else f"runs {same}"
        return (f"the seed has no effect: all {n_seeds} seeds gave {runs}; make the code use the "
                "seed it is given (no hard-coded seed) to judge seed stability")
    if identical:
        return (f"cannot judge seeds here: all {n_seeds} runs are identical and the seed does not reach the code at "
                "none; pass {seed} to the command or judge seeds at seeded")
    s, limit = spread.std, spread.max_std
    if spread.n_diverged:
        total = spread.n + spread.n_diverged
        return (f"unstable: {spread.n_diverged} of {total} seeds diverged (non-finite); find what blows up "
                "before judging the spread")
    if s is None:
        return f"too few seeds: {spread.n} with a final value; run at least {max(5 - spread.n, 1)} more"
    if getattr(spread, "tied", False) and limit is not None and verdict != "unstable":
        return _tie_line(verdict, spread, limit)
    if limit is None:
        return f"no limit to judge against: std {s:.3g} over {spread.n} seeds; give the metric a max_std"
    ratio = times(s, limit)
    if verdict == "stable":
        return f"stable: std {s:.3g} is {ratio} the limit {limit:g}, below it with {_confidence(spread)} confidence"
    if verdict == "unstable":
        return (f"unstable: std {s:.3g} is {ratio} the limit {limit:g}, above it with {_confidence(spread)} confidence; "
                "find the source of the spread (or raise max_std if it is acceptable)")
    likely = "likely stable" if s < limit else "likely unstable"
    if sequential is not None and not sequential.final:
        return f"{likely}: std {s:.3g} is {ratio} the limit {limit:g}; the next stage adds seeds to confirm"
    bounds = spread.std_bounds
    if spread.n < MIN_SEEDS and spread.decision_bounds is None and bounds is not None and (
            bounds.upper < limit if s < limit else bounds.lower > limit):
        # only the minimum holds the verdict back: the normal-theory bound over these seeds already clears the
        # limit, so the plan's seeds (for a true std near the limit, in the reason) are not what to do first
        k = MIN_SEEDS - spread.n
        return (f"{likely}: std {s:.3g} is {ratio} the limit {limit:g}; run at least {k} more seed{'s' if k > 1 else ''}"
                f" (a verdict needs {MIN_SEEDS})")
    return f"{likely}: std {s:.3g} is {ratio} the limit {limit:g}; {_more(spread.n_needed, spread.n)}"


def repeatability_line(verdict: str, determinism: str, exp: Expectation, numbers: Mapping,
                       *, n_seeds: int, compared: Compared | None = None) -> str:
    """The repeatability line: what the repeats show and whether that is what the level promises."""
    if verdict == "inconclusive":
        return f"cannot tell: no seed has 2 repeats at {determinism}; run each seed at least twice"
    last_steps = [s for s in numbers.get("last_steps") or [] if s is not None]
    if verdict == "identical":
        what = "identical: every repeat " + equal_short(compared)
    elif numbers.get("steps_compared") == 0:
        # repeats that stopped at different steps, none shared: they differ, but no value was compared
        what = f"repeats differ: they share no logged step, so no value was compared; {stopped_phrase(last_steps)}"
    elif numbers.get("max_abs_delta") == 0 and numbers.get("steps_compared") and len(set(last_steps)) > 1:
        what = (f"repeats differ: equal at the {numbers['steps_compared']:,} step(s) all logged, but "
                f"{stopped_phrase(last_steps)}")
    else:
        delta = numbers.get("max_abs_delta")
        step = numbers.get("first_divergent_step")
        size = f"by up to {delta:.3g}" if delta is not None else ""
        tol = "within tolerance" if verdict == "within_tolerance" else "repeats differ"
        if step is None and not delta:  # no logged value differs, only a digest (kernels moved a weight unseen)
            digests = _DIGESTS.get(numbers.get("source") or "", _DIGESTS[""])
            what = f"{tol}: every logged value {equal_short(compared)}, but {digests} differ"
        else:
            what = f"{tol}: {size} from step {step}".replace(":  ", ": ")
        if len(set(last_steps)) > 1:
            what += f"; {stopped_phrase(last_steps)}"
    if exp.met is False:
        fix = _FIX.get(numbers.get("source") or "", "")
        return f"{what}; not what {determinism} promises ({exp.expected})" + (f": {fix}" if fix else "")
    if verdict == "identical" or determinism != "seeded":
        return f"{what}; as expected at {determinism}"
    return f"{what}; allowed at seeded (kernels), strict should remove it"


def portability_line(verdict: str, details: Mapping) -> str:
    """The stack-portability line from a verdict's details (``result``: ``Portability``)."""
    res, margin = details.get("result"), details.get("margin")
    cand = details.get("n_candidate", 0)
    if res is None:
        return "cannot compare: need at least 2 finite runs on each stack"
    diff = f"means differ by {res.diff:.3g}"
    if verdict == "equivalent":
        return f"equivalent: {diff}, within ±{margin:g}"
    if verdict == "not_equivalent":
        return (f"not equivalent: {diff}, outside ±{margin:g}" if margin is not None
                else f"different: {diff}; give a margin to say whether that matters")
    if margin is None:
        return f"no margin: {diff}; give the metric a margin to claim equivalence"
    return f"not yet equivalent: {diff} against ±{margin:g}; {_more(res.n_needed, cand, 'seeds per stack')}"
