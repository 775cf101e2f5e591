"""The calibration harness: how often each of Steady's decision rules cries wolf, and how often it
catches a planted problem, measured by simulation on realistic training curves.

Every decision Steady makes for a user (a verdict, a flag, an alert) is registered here as a
``Rule``: a name, its nominal false-alarm level, a generator of *healthy* trials (the rule
should stay quiet) and of *planted* trials (the rule should fire). ``measure`` runs a rule
``n`` times per scenario with an explicit ``numpy.random.Generator`` and returns the rate with
an exact (Clopper–Pearson) binomial confidence interval.

Pure: numpy/scipy and ``steady.server.stats`` only. ``steady calibrate`` prints and writes the table;
the tests run every rule with bounded simulation counts; ``bench/calibration_bench.py``
writes the full-size table to ``bench/results/calibration.json``.

Modules:
* ``generators`` — healthy and planted curves/final values (AR(1) noise, seed offsets,
  heavy tails, lognormal/contaminated finals, unequal lengths, diverged runs).
* ``rules`` — the registry: one ``Rule`` per decision, each scenario a function
  ``trial(rng) -> bool`` (True = the rule fired).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import scipy

__all__ = ["Scenario", "Rule", "Rate", "clopper_pearson", "measure", "measure_rule", "exceeds_nominal"]


@dataclass(frozen=True)
class Scenario:
    """One simulated setting of a rule. ``trial(rng)`` returns True when the rule fired.

    ``kind`` is "healthy" (firing is a false alarm) or "planted" (firing is a detection), or
    "stress": a study outside the rule's stated assumptions, measured and published (so the limit
    of the guarantee is visible) but not asserted; ``measure_rule`` skips it by default.
    ``description`` says what is simulated in one short line (it goes in the docs' table)."""

    name: str
    kind: str  # "healthy" | "planted" | "stress"
    description: str
    trial: Callable[[np.random.Generator], bool]


@dataclass(frozen=True)
class Rule:
    """A decision rule with its stated false-alarm level and the scenarios it is measured on.

    ``guarantee`` is the short phrase users see beside the verdict (e.g.
    "false alarm ≤ 1% per study")."""

    name: str
    nominal: float
    guarantee: str
    scenarios: Sequence[Scenario] = field(default_factory=tuple)


@dataclass(frozen=True)
class Rate:
    """``k`` firings in ``n`` trials; ``low``/``high`` the exact two-sided binomial CI."""

    rule: str
    scenario: str
    kind: str
    k: int
    n: int
    low: float
    high: float
    nominal: float

    @property
    def rate(self) -> float:
        return self.k / self.n if self.n else float("nan")


def clopper_pearson(k: int, n: int, *, confidence: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper–Pearson 1934) two-sided binomial confidence interval for k successes in n."""
    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    a = 1.0 - confidence
    low = 0.0 if k == 0 else float(scipy.stats.beta.ppf(a / 2, k, n - k + 1))
    high = 1.0 if k == n else float(scipy.stats.beta.ppf(1 - a / 2, k + 1, n - k))
    return low, high


def measure(rule: Rule, scenario: Scenario, *, n: int, rng: np.random.Generator,
            confidence: float = 0.95) -> Rate:
    """Run ``scenario`` ``n`` times and count how often ``rule`` fired."""
    if not isinstance(rng, np.random.Generator):
        raise ValueError("rng must be a numpy.random.Generator")
    k = sum(bool(scenario.trial(rng)) for _ in range(n))
    low, high = clopper_pearson(k, n, confidence=confidence)
    return Rate(rule=rule.name, scenario=scenario.name, kind=scenario.kind, k=k, n=n, low=low, high=high,
                nominal=rule.nominal)


def measure_rule(rule: Rule, *, n: int, rng: np.random.Generator, kinds: Sequence[str] = ("healthy", "planted"),
                 ) -> list[Rate]:
    """Every scenario of ``rule`` whose kind is in ``kinds``, ``n`` trials each."""
    return [measure(rule, s, n=n, rng=rng) for s in rule.scenarios if s.kind in kinds]


def exceeds_nominal(rate: Rate, *, confidence: float = 0.99) -> bool:
    """True when a healthy scenario's false-alarm rate is above the nominal level beyond
    simulation error: the one-sided exact binomial test of H0: rate <= nominal rejects at
    ``1 - confidence``. This is what the tests assert is False for every healthy scenario."""
    if rate.kind != "healthy":
        raise ValueError("exceeds_nominal applies to healthy scenarios")
    p = float(scipy.stats.binom.sf(rate.k - 1, rate.n, rate.nominal))  # P(K >= k | nominal)
    return p < 1.0 - confidence
