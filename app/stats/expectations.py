"""What each determinism level is expected to show, and whether a study met it.

The one place that says what "good" means per level, and it depends on who runs the code and
whether the code receives Steady's seed itself (``SeedRoute``):

* a **built-in** workload is Steady's own code: at ``none`` it draws every random stream from fresh
  entropy, so its repeats are expected to differ;
* an **entrypoint** receives the seed as ``ctx.seed`` at every level, and a **command** receives it
  where its argv has the ``{seed}`` placeholder: a correct script that seeds itself from it is
  bitwise identical at ``none`` too (Steady fixes nothing at ``none``; the code may). So at ``none``
  user code has no expectation it could miss: identical repeats say the code fixes its own seeds,
  repeats that differ say something it does not seed (kernels, data loader, hash order) varies;
* a **command without** ``{seed}`` receives no seed at ``none``; at ``seeded``/``strict`` Steady still
  seeds Python's, NumPy's and the framework's global generators in its process.

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
none      built-in: varies                      repeats differ (within or out of tolerance)
none      your code: whatever it fixes itself   always (identical or not: a statement, not a test)
========  ====================================  ==============================================

``inconclusive`` (fewer than two repeats of a seed) neither meets nor misses the expectation.
"The code ignores the seed" is claimed only from evidence that the seed has no effect: runs of
*different* seeds bitwise identical where the seed reached the code (``SeedRoute.reaches``),
never from identical repeats of one seed. That finding fails the seed-stability row
(``seed_has_no_effect``, see ``steady.server.stats.report_levels``); here it is only noted
(``suspicious``) next to the repeats it does not change.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = ["EXPECTED", "SEEDS_IDENTICAL", "BUILTIN", "Expectation", "LevelHeadline", "SeedRoute", "expected",
           "headline", "repeatability_expectation"]

EXPECTED = {
    "strict": "identical",
    "seeded": "identical unless kernels are known to vary",
    "none": "varies",
}
_NONE_USER = {  # what `none` can say about user code: Steady fixes nothing there, the code may
    True: "identical if the code seeds itself from the seed it receives, else varies",
    False: "varies unless the code fixes its own seeds (it receives no seed)",
}
SEEDS_IDENTICAL = ("runs of different seeds are bitwise identical: the seed has no effect "
                   "(the code ignores the seed it is given)")

CodeKind = Literal["builtin", "entrypoint", "command", "external"]  # external: runs uploaded, seeds labelled by the code


@dataclass(frozen=True)
class SeedRoute:
    """Who runs a study's code and whether it receives Steady's seed itself.

    ``receives_seed``: the code is handed the seed at every level, ``none`` included (an entrypoint's
    ``ctx.seed``; a command whose argv has ``{seed}`` or a per-source seed such as ``{init_seed}``). A
    built-in draws from fresh entropy at ``none``. ``pinned``: see ``reaches``."""

    kind: CodeKind = "builtin"
    receives_seed: bool = False
    pinned: frozenset = frozenset()  # arms (stacks) that give every run the same value of each seed the code reads

    def reaches(self, determinism: str, stack: str | None = None) -> bool:
        """Does the seed reach the code at this level (in this arm)? Steady seeds the global generators at
        ``seeded`` and ``strict``; at ``none`` only code that receives the seed itself gets it. In a sources
        study an arm that pins every per-source seed the code reads (``pinned``: the ``none`` arm, or an arm
        varying only sources the code never reads) hands each run the same seeds by design: there the run's
        seed is only a label, whatever the level."""
        if stack is not None and stack in self.pinned:
            return False
        return determinism != "none" or self.receives_seed

    @property
    def user_code(self) -> bool:
        return self.kind != "builtin"


BUILTIN = SeedRoute()


def expected(determinism: str, route: SeedRoute = BUILTIN) -> str:
    """What repeats at ``determinism`` are expected to show for code reached by ``route``."""
    if determinism not in EXPECTED:
        raise ValueError(f"unknown determinism level {determinism!r}")
    if determinism == "none" and route.user_code:
        return _NONE_USER[route.receives_seed]
    return EXPECTED[determinism]


@dataclass(frozen=True)
class Expectation:
    expected: str
    met: bool | None  # None: inconclusive
    phrase: str  # one line for people
    suspicious: tuple = ()


def repeatability_expectation(determinism: str, verdict: str, *, source: str | None = None,
                              seeds_identical: bool | None = None, deltas_finite: bool = True,
                              route: SeedRoute = BUILTIN, stack: str | None = None,
                              same: str = "bitwise identical") -> Expectation:
    """Judge one repeatability verdict (``identical`` / ``within_tolerance`` / ``out_of_tolerance``
    / ``inconclusive``) against the expectation of its determinism level for code reached by ``route``.

    ``source`` is the attributed source of the first difference (``numerics`` = kernels,
    reduction order, threads); ``deltas_finite`` is False when a repeat turned non-finite where
    its reference did not; ``seeds_identical`` is True when runs of two or more different
    seeds are bitwise identical (None when fewer than two seeds were compared): noted as
    suspicious where the seed reached the code (in the group's arm ``stack``: ``SeedRoute.reaches``),
    never a reason to miss the expectation of repeats. ``same``: how the runs of different seeds were found
    equal ("bitwise identical", or "equal at the 2 printed decimals …" for values parsed from text)."""
    exp = expected(determinism, route)
    note = SEEDS_IDENTICAL.replace("bitwise identical", same)  # ``same``: at which resolution they were equal
    suspicious = (note,) if seeds_identical and route.reaches(determinism, stack) else ()
    if verdict == "inconclusive":
        met, phrase = None, "not enough repeats to tell"
    elif determinism == "none" and route.user_code:
        met = True
        if verdict == "identical":
            phrase = ("identical: the code seeds itself from the seed it receives" if route.receives_seed
                      else "identical: the code fixes its own seeds")
        else:
            phrase = (f"{verdict.replace('_', ' ')}: something the code does not seed itself varies "
                      "(Steady fixes nothing at none)")
    elif determinism == "none":
        if verdict == "identical":
            met, phrase = False, "identical, expected to vary: the built-in fixed a seed at none"
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
    return Expectation(exp, met, phrase, suspicious)


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
    ``group.determinism``, ``expected``, ``met_expectation``, ``expectation`` and ``suspicious``."""
    by_level: dict[str, list[Mapping]] = {}
    for e in entries:
        by_level.setdefault(e["group"]["determinism"], []).append(e)
    out = []
    for det in ("strict", "seeded", "none"):
        rows = by_level.get(det)
        if not rows:
            continue
        exp = rows[0].get("expected") or EXPECTED[det]
        mets = [r["met_expectation"] for r in rows]
        suspicious = tuple(dict.fromkeys(s for r in rows for s in r.get("suspicious", ())))
        if any(m is False for m in mets):
            met = False
            phrase = next(r["expectation"] for r in rows if r["met_expectation"] is False)
        elif all(m is None for m in mets):
            met, phrase = None, "not enough repeats to tell"
        else:
            met = True
            phrase = "met: " + exp
        out.append(LevelHeadline(det, exp, met, phrase, len(rows), suspicious))
    return tuple(out)
