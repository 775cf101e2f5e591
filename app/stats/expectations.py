"""What each determinism level is expected to show, and whether a study met it.

The one place that says what "good" means per level. A repeatability verdict alone is not a
headline: at ``none`` Steady applies no seeds, so repeats that *differ* are the expected
outcome, and repeats that are bitwise identical mean the code seeds itself (it ignores
Steady's seed). The rules:

========  ====================================  ==============================================
level     expected                              met when
========  ====================================  ==============================================
strict    identical                             every repeat bitwise identical
seeded    identical unless kernels vary         identical, or repeats that differ by finite amounts
                                                with the first difference attributed to
                                                ``numerics`` (kernels, reduction order, threads:
                                                what ``strict`` is for); a difference blamed on
                                                seeding or data order, or a non-finite one (a
                                                repeat diverged), misses it
none      varies                                repeats differ (within or out of tolerance)
========  ====================================  ==============================================

``inconclusive`` (fewer than two repeats of a seed) neither meets nor misses the expectation.
Independently of repeats, runs of *different* seeds that are bitwise identical are suspicious
at every level: the code probably ignores Steady's seed.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["EXPECTED", "IGNORES_SEED", "SEEDS_IDENTICAL", "Expectation", "LevelHeadline", "headline",
           "repeatability_expectation"]

EXPECTED = {
    "strict": "identical",
    "seeded": "identical unless kernels are known to vary",
    "none": "varies",
}
IGNORES_SEED = "repeats are identical although Steady applied no seed: the code probably ignores Steady's seed"
SEEDS_IDENTICAL = "runs of different seeds are bitwise identical: the code probably ignores Steady's seed"


@dataclass(frozen=True)
class Expectation:
    expected: str
    met: bool | None  # None: inconclusive
    phrase: str  # one line for people
    suspicious: tuple = ()


def repeatability_expectation(determinism: str, verdict: str, *, source: str | None = None,
                              seeds_identical: bool | None = None, deltas_finite: bool = True) -> Expectation:
    """Judge one repeatability verdict (``identical`` / ``within_tolerance`` / ``out_of_tolerance``
    / ``inconclusive``) against the expectation of its determinism level.

    ``source`` is the attributed source of the first difference (``numerics`` = kernels,
    reduction order, threads); ``deltas_finite`` is False when a repeat turned non-finite where
    its reference did not; ``seeds_identical`` is True when runs of two or more different
    seeds are bitwise identical (None when fewer than two seeds were compared)."""
    if determinism not in EXPECTED:
        raise ValueError(f"unknown determinism level {determinism!r}")
    expected = EXPECTED[determinism]
    suspicious = []
    if seeds_identical:
        suspicious.append(SEEDS_IDENTICAL)
    if verdict == "inconclusive":
        met, phrase = None, "not enough repeats to tell"
    elif determinism == "none":
        if verdict == "identical":
            met, phrase = False, "identical, expected to vary"
            suspicious.insert(0, IGNORES_SEED)
        else:
            met, phrase = True, "varies, as expected"
    elif verdict == "identical":
        met, phrase = True, "identical, as expected"
    elif determinism == "seeded" and source == "numerics" and deltas_finite and verdict in (
            "within_tolerance", "out_of_tolerance"):
        met, phrase = True, "kernels vary (numerics), as allowed at seeded; strict should remove it"
    else:
        met, phrase = False, f"{verdict.replace('_', ' ')}, expected identical" + (
            f" (source: {source})" if source else "")
    if suspicious and met:
        met = False
    return Expectation(expected, met, phrase, tuple(suspicious))


@dataclass(frozen=True)
class LevelHeadline:
    determinism: str
    expected: str
    met: bool | None  # every conclusive verdict met its expectation (None: none was conclusive)
    phrase: str
    n_verdicts: int
    suspicious: tuple


def headline(entries: Iterable[Mapping]) -> tuple:
    """One ``LevelHeadline`` per determinism level from repeatability entries carrying
    ``group.determinism``, ``met_expectation``, ``expectation`` and ``suspicious``."""
    by_level: dict[str, list[Mapping]] = {}
    for e in entries:
        by_level.setdefault(e["group"]["determinism"], []).append(e)
    out = []
    for det in ("strict", "seeded", "none"):
        rows = by_level.get(det)
        if not rows:
            continue
        mets = [r["met_expectation"] for r in rows]
        suspicious = tuple(dict.fromkeys(s for r in rows for s in r.get("suspicious", ())))
        if any(m is False for m in mets):
            met = False
            phrase = next(r["expectation"] for r in rows if r["met_expectation"] is False)
        elif all(m is None for m in mets):
            met, phrase = None, "not enough repeats to tell"
        else:
            met = True
            phrase = "met: " + EXPECTED[det]
        out.append(LevelHeadline(det, EXPECTED[det], met, phrase, len(rows), suspicious))
    return tuple(out)
