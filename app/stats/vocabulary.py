"""The verdict vocabulary, spelled once: levels, determinism levels and the verdict values of
each level, as ``Literal`` types (for annotations and the API's response models) and as the
tuples and tables that code iterates over. Plain typing only, so every layer can import it."""

from __future__ import annotations

from typing import Literal, get_args

__all__ = [
    "Level", "Determinism", "RepeatabilityValue", "SeedStabilityValue", "PortabilityValue", "VerdictValue",
    "CheckValue", "LEVELS", "LEVEL_TITLES", "DETERMINISM_LEVELS", "VERDICT_VALUES", "SEVERITY", "severity",
]

Level = Literal["repeatability", "seed_stability", "stack_portability"]
Determinism = Literal["none", "seeded", "strict"]
RepeatabilityValue = Literal["identical", "within_tolerance", "out_of_tolerance", "inconclusive"]
# seed_has_no_effect: runs of different seeds bitwise identical where the seed reached the code (a
# finding that fails, not stability: see steady.server.stats.expectations).
SeedStabilityValue = Literal["stable", "unstable", "seed_has_no_effect", "inconclusive"]
PortabilityValue = Literal["equivalent", "not_equivalent", "inconclusive"]
VerdictValue = Literal[RepeatabilityValue, SeedStabilityValue, PortabilityValue]
# A measurement judged against a limit: the cost of determinism against a budget, convergence.
CheckValue = Literal["pass", "fail", "inconclusive"]

LEVELS: tuple[Level, ...] = get_args(Level)
LEVEL_TITLES: dict[Level, str] = {"repeatability": "Repeatability", "seed_stability": "Seed stability",
                                  "stack_portability": "Stack portability"}
DETERMINISM_LEVELS: tuple[Determinism, ...] = get_args(Determinism)
VERDICT_VALUES: tuple[str, ...] = tuple(dict.fromkeys(get_args(RepeatabilityValue) + get_args(SeedStabilityValue)
                                                      + get_args(PortabilityValue)))

# 0 good, 1 acceptable (within tolerance), 2 inconclusive, 3 bad: a level's summary is its worst.
SEVERITY: dict[str, int] = {
    "identical": 0, "stable": 0, "equivalent": 0, "pass": 0,
    "within_tolerance": 1,
    "inconclusive": 2,
    "out_of_tolerance": 3, "unstable": 3, "seed_has_no_effect": 3, "not_equivalent": 3, "fail": 3,
}


def severity(value: str | None) -> int:
    """The severity of a verdict or check value; unknown values count as inconclusive."""
    return SEVERITY.get(value or "", 2)
