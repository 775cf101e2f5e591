"""Calibration of source attribution: how often the named source is right, alone and overlapping.

The rule (``steady.server.stats.repeatability``): when runs that should be identical differ, the report
names the *first cause* in the order

    stack  >  seeding  >  data_order  >  numerics

— fingerprints, then the initial-state digest (weights and training RNG state), then the
per-epoch data-order digests, else the kernels / reduction order. An earlier source makes the
later ones unobservable from the logged values (once the initial weights differ every later
value differs anyway), so when several sources are planted at once the right answer is the
earliest planted one; the others are not claimed absent.

``ATTRIBUTION`` is a calibration ``Rule``: its healthy scenario plants nothing (naming any
source is a false alarm), each planted scenario plants a set of sources on simulated training
curves (random first epoch for a data-order change, random first step and size for a
numerical one, which may also be too small to survive float32 rounding on its own) and fires
when the named source is the expected one. ``attribution_rate`` counts the same on real runs
(the planted controls of ``steady demo --controls``) with an exact binomial interval.

Pure: numpy/scipy and ``steady.server.stats`` only. Not registered in ``rules.py``; callers take
``ATTRIBUTION`` from here.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import combinations

import numpy as np

from steady.server.stats.calibration import Rate, Rule, Scenario, clopper_pearson
from steady.server.stats.repeatability import RepeatRun, repeatability

__all__ = ["PRECEDENCE", "expected_source", "simulate_pair", "named_source", "ATTRIBUTION", "attribution_rate"]

PRECEDENCE = ("stack", "seeding", "data_order", "numerics")


def expected_source(planted: Iterable[str]) -> str | None:
    """The source the report must name for a set of planted sources: the first by precedence."""
    planted = set(planted)
    unknown = planted - set(PRECEDENCE)
    if unknown:
        raise ValueError(f"unknown sources {sorted(unknown)}; expected some of {PRECEDENCE}")
    return next((s for s in PRECEDENCE if s in planted), None)


def simulate_pair(planted: Iterable[str], rng: np.random.Generator, *, steps: int = 60,
                  epochs: int = 6) -> tuple[RepeatRun, RepeatRun]:
    """Two repeats of a simulated run (a decaying float32 loss curve with AR(1) noise, as logged)
    that differ by the ``planted`` sources only: ``stack`` changes the fingerprint and perturbs
    every step by a few ULPs; ``seeding`` changes the initial-state digest and the whole curve;
    ``data_order`` changes the order digest from a random epoch on and the curve from that
    epoch's first step; ``numerics`` perturbs the state from a random step by a random relative
    size in [1e-9, 1e-5] that then grows (the digests stay equal)."""
    planted = set(planted)
    expected_source(planted)  # validates
    t = np.arange(steps)
    per_epoch = steps // epochs

    def curve(noise_seed: int) -> np.ndarray:
        g = np.random.default_rng(noise_seed)
        e = np.zeros(steps)
        for i in range(1, steps):
            e[i] = 0.7 * e[i - 1] + g.normal(0, 0.02)
        return 2.3 * np.exp(-t / 25.0) + 0.1 + e

    base_seed = int(rng.integers(2**31))
    a = curve(base_seed)
    b = a.copy()
    fp_a = {"numpy_version": "2.4.6", "threads": 1}
    fp_b = dict(fp_a)
    init_a = init_b = "init-" + str(base_seed)
    order_a = [f"order-{base_seed}-{e}" for e in range(epochs)]
    order_b = list(order_a)
    if "numerics" in planted:
        k = int(rng.integers(0, steps))
        size = 10 ** rng.uniform(-9, -5)
        b[k:] = a[k:] * (1 + size * np.exp((t[k:] - k) / 10.0))
    if "data_order" in planted:
        e0 = int(rng.integers(0, epochs))
        order_b[e0:] = [o + "-other" for o in order_b[e0:]]
        s0 = e0 * per_epoch
        b[s0:] = curve(base_seed + 1)[s0:] * (1 + 1e-3)  # other batches: another trajectory from there
    if "seeding" in planted:
        init_b = "init-other"
        b = curve(base_seed + 2)
    if "stack" in planted:
        fp_b["numpy_version"] = "2.0.2"
        b = b * (1 + rng.choice([-1, 1], size=steps) * 2.0**-21)
    a32, b32 = a.astype(np.float32).astype(np.float64), b.astype(np.float32).astype(np.float64)
    return (RepeatRun(steps=t, values=a32, fingerprint=fp_a, initial_weights=init_a, data_order=tuple(order_a)),
            RepeatRun(steps=t, values=b32, fingerprint=fp_b, initial_weights=init_b, data_order=tuple(order_b)))


def named_source(pair: Sequence[RepeatRun]) -> str | None:
    return repeatability(list(pair)).source


def _planted_scenario(planted: tuple[str, ...]) -> Scenario:
    want = expected_source(planted)

    def trial(rng: np.random.Generator) -> bool:
        pair = simulate_pair(planted, rng)
        got = named_source(pair)
        if got is None and planted == ("numerics",):
            # a numerical difference below float32 resolution leaves the logged values (and
            # the digests, here) identical: nothing to attribute, counted as a miss
            return False
        return got == want

    return Scenario(name="+".join(planted), kind="planted",
                    description=f"planted {' + '.join(planted)}: the report must name {want}", trial=trial)


def _healthy(rng: np.random.Generator) -> bool:
    return named_source(simulate_pair((), rng)) is not None


_SCENARIOS = [Scenario("nothing planted", "healthy", "identical repeats: no source may be named", _healthy)]
for _k in (1, 2, 3, 4):
    _SCENARIOS += [_planted_scenario(c) for c in combinations(PRECEDENCE, _k)]

ATTRIBUTION = Rule(name="attribution", nominal=0.0,
                   guarantee="names the first planted source (stack > seeding > data_order > numerics)",
                   scenarios=tuple(_SCENARIOS))


def attribution_rate(results: Iterable[tuple[Iterable[str], str | None]], *, scenario: str = "real runs",
                     confidence: float = 0.95) -> Rate:
    """``results``: (planted sources, named source) per control. The rate of exact naming,
    with its Clopper–Pearson interval."""
    results = list(results)
    k = sum(expected_source(p) == named for p, named in results)
    n = len(results)
    low, high = clopper_pearson(k, n, confidence=confidence)
    return Rate(rule=ATTRIBUTION.name, scenario=scenario, kind="planted", k=k, n=n, low=low, high=high, nominal=0.0)
