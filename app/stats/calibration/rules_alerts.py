"""Calibration scenarios: alerts family (see steady.server.stats.calibration.rules).

One ``Rule`` per alert kind that makes a statistical decision, each trial calling the same
pure function the alert service calls (``steady.server.stats.alert_rules``,
``steady.server.stats.changepoint.sequential_shift``, ``steady.server.stats.repeatability``,
``steady.server.stats.align``):

* ``alert.suite_shift`` — a suite's lifetime: a history of 30 or 100 study summaries of one
  stack and determinism level, re-evaluated after every study. The service's answer after
  study j is ``sequential_shift(history[:j+1]).detected`` and the alarm is latched, so "fired
  at any of the evaluations" is ``sequential_shift(history).detected`` (tested in
  tests/stats/test_alert_calibration.py). Healthy histories are independent or AR(1)-correlated
  (0.3, 0.5) between consecutive studies. Planted: a shift of 1σ, 2σ, 3σ in the last study or
  k studies back, and a large jump after a short history; ``shift_power`` measures the power of
  the rule and of the rule that scores studies as independent on the same histories.
* ``alert.out_of_baseline`` — final mode: m candidate runs against n baseline runs
  (5 vs 5, 10 vs 10, 50 vs 10), normal and skewed finals.
* ``alert.band_width`` — std mode at the boundary (true std = the limit) and below.
* ``alert.diverged`` and ``alert.repeatability_lost`` — exact checks: healthy data never fires.

Study summaries are means over a few seeds; σ is the std of those summaries between studies.

A third scenario kind, ``stress``, is healthy data *outside* a rule's stated assumption (the
normal-theory intervals meet skewed finals; study summaries more dependent than AR(1) 0.5):
measured and published so users see how far the guarantee bends, but not asserted against the
nominal level (``measure_rule`` skips it unless asked: ``kinds=("healthy", "planted", "stress")``).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from steady.server.stats.alert_rules import NOMINAL, band_check_values, baseline_curve_outliers, baseline_outliers, guarantee
from steady.server.stats.align import align_series
from steady.server.stats.calibration import Rule, Scenario
from steady.server.stats.calibration.generators import healthy_curves
from steady.server.stats.changepoint import sequential_shift
from steady.server.stats.repeatability import RepeatRun, repeatability

__all__ = ["RULES", "SUITE_SHIFT", "OUT_OF_BASELINE", "BAND_WIDTH", "DIVERGED", "REPEATABILITY_LOST",
           "suite_history", "training_finals", "shift_delays", "shift_power", "SHIFT_POWER_SETTINGS"]

# ---------------------------------------------------------------- generators


def training_finals(rng: np.random.Generator, n: int, *, dist: str = "normal", center: float = 0.35,
                    scale: float = 0.02) -> np.ndarray:
    """Final losses of ``n`` seeds: normal, or right-skewed (lognormal, skewness ≈ 0.8; or gamma)."""
    if dist == "normal":
        return center + scale * rng.standard_normal(n)
    if dist == "lognormal":  # log-sd 0.25: skewness 0.78, the long right tail of a few bad seeds
        z = rng.lognormal(0.0, 0.25, n)
        return center + scale * (z - np.exp(0.03125)) / 0.2563
    if dist == "gamma":  # shape 4: skewness 1
        return center + scale * (rng.gamma(4.0, 1.0, n) - 4.0) / 2.0
    raise ValueError(f"unknown dist {dist!r}")


def suite_history(rng: np.random.Generator, n_studies: int, *, seeds: int = 4, dist: str = "normal",
                  study_sd: float = 0.01, shift: float = 0.0, shift_from: int | None = None,
                  ar: float = 0.0, effect_ar: float = 0.0) -> np.ndarray:
    """One summary per study (mean final over ``seeds`` seeds), with a between-study random effect.

    With ``ar`` the summaries of consecutive studies are correlated (they share data, code and
    machines): the deviations from the mean go through an AR(1) filter, x_t = ar·x_{t−1} +
    √(1 − ar²)·e_t, which keeps their variance and gives lag-1 correlation ``ar``.
    With ``effect_ar`` only the between-study effect wanders slowly (AR(1) ``effect_ar``, same variance)
    under independent seed noise: an environment that drifts (data, drivers, machines).
    A ``shift`` (in units of the summary's std) is added to studies ``shift_from`` onwards."""
    seed_sd = 0.02
    effect = study_sd * rng.standard_normal(n_studies)
    if effect_ar:
        for t in range(1, n_studies):
            effect[t] = effect_ar * effect[t - 1] + np.sqrt(1.0 - effect_ar * effect_ar) * effect[t]
    # every study's seeds in one draw: the same values in the same order as one draw per study (each
    # distribution fills its array one value after another), so the same histories, without a call per study
    means = training_finals(rng, n_studies * seeds, dist=dist, scale=seed_sd).reshape(n_studies, seeds).mean(axis=1)
    x = means + effect
    if ar:
        e = x - 0.35
        y = np.empty_like(e)
        y[0] = e[0]
        for t in range(1, n_studies):
            y[t] = ar * y[t - 1] + np.sqrt(1.0 - ar * ar) * e[t]
        x = 0.35 + y
    if shift:
        sd = float(np.sqrt(study_sd ** 2 + seed_sd ** 2 / seeds))
        x[shift_from:] += shift * sd
    return x


# ---------------------------------------------------------------- suite shift

SHIFT_ALPHA = NOMINAL["suite_shift"]
SHIFT_HORIZON = 100


def _shift(n: int, *, silent: bool = False, **kw) -> Callable[[np.random.Generator], bool]:
    """A lifetime of ``n`` studies: True when the alert fired (with ``silent``: fired with no caveat beside it,
    neither ``too_dependent`` nor a history that cannot rule out a slowly wandering environment)."""
    def trial(rng: np.random.Generator) -> bool:
        x = suite_history(rng, n, **kw)
        r = sequential_shift(x, alpha=SHIFT_ALPHA, horizon=SHIFT_HORIZON)
        return r.detected and not (silent and (r.too_dependent or not r.wander_ruled_out))
    return trial


def shift_delays(rng: np.random.Generator, *, n: int, start: int, shift: float, after: int = 40,
                 alpha: float = SHIFT_ALPHA, horizon: int = SHIFT_HORIZON) -> np.ndarray:
    """Detection delay of the suite-shift alert, in studies, over ``n`` simulated histories.

    Each history has ``start`` in-control studies, then ``after`` studies shifted by ``shift``
    (in σ of the study summaries). Delay 1 = the alert fires at the first shifted study; inf =
    not within ``after``; −1 = a false alarm before the shift."""
    out = np.empty(n)
    for i in range(n):
        r = sequential_shift(suite_history(rng, start + after, shift=shift, shift_from=start), alpha=alpha,
                             horizon=horizon)
        out[i] = np.inf if r.alarm_index is None else (-1 if r.alarm_index < start else r.alarm_index - start + 1)
    return out


# (name, what is planted, studies, shifted from, shift in σ, AR(1)): the planted rows' sizes and those of
# docs/alerts-calibration.md's delay table (a persistent shift after 20 or 50 in-control studies, 40 after)
SHIFT_POWER_SETTINGS = (
    ("10_back_2sd", "2σ shift in the last 10 of 30 studies", 30, 20, 2.0, 0.0),
    ("5_back_3sd", "3σ shift in the last 5 of 30 studies", 30, 25, 3.0, 0.0),
    ("10_back_1sd", "1σ shift in the last 10 of 30 studies", 30, 20, 1.0, 0.0),
    ("5_back_2sd", "2σ shift in the last 5 of 30 studies", 30, 25, 2.0, 0.0),
    ("jump_after_6", "20σ jump after 6 studies, 4 on the new level", 10, 6, 20.0, 0.0),
    ("20+40_1sd", "1σ shift after 20 studies, 40 after it", 60, 20, 1.0, 0.0),
    ("20+40_2sd", "2σ shift after 20 studies, 40 after it", 60, 20, 2.0, 0.0),
    ("50+40_1sd", "1σ shift after 50 studies, 40 after it", 90, 50, 1.0, 0.0),
    ("50+40_2sd", "2σ shift after 50 studies, 40 after it", 90, 50, 2.0, 0.0),
    ("50+10_2sd", "2σ shift after 50 studies, 10 after it", 60, 50, 2.0, 0.0),
    ("50+10_3sd", "3σ shift after 50 studies, 10 after it", 60, 50, 3.0, 0.0),
    ("10_back_2sd_ar0.3", "2σ shift in the last 10 of 30 studies, AR(1) 0.3", 30, 20, 2.0, 0.3),
    ("50+10_3sd_ar0.5", "3σ shift after 50 studies, 10 after it, AR(1) 0.5", 60, 50, 3.0, 0.5),
)


def shift_power(rng: np.random.Generator, *, sims: int, n: int, shift_from: int, shift: float, ar: float = 0.0,
                alpha: float = SHIFT_ALPHA, horizon: int = SHIFT_HORIZON) -> tuple[int, int]:
    """(histories flagged by the suite-shift rule, by the rule scoring studies as independent) out of ``sims``.

    Both rules judge the same simulated histories (``suite_history``); an alarm counts when it comes at or
    after the first shifted study (a false alarm before it is not a detection)."""
    now = before = 0
    for _ in range(sims):
        x = suite_history(rng, n, shift=shift, shift_from=shift_from, ar=ar)
        for prewhiten in (True, False):
            r = sequential_shift(x, alpha=alpha, horizon=horizon, prewhiten=prewhiten)
            hit = r.alarm_index is not None and r.alarm_index >= shift_from
            if prewhiten:
                now += hit
            else:
                before += hit
    return now, before


def _jump_after_short_history(rng: np.random.Generator) -> bool:
    x = suite_history(rng, 10, shift=20.0, shift_from=6)
    return sequential_shift(x, alpha=SHIFT_ALPHA, horizon=SHIFT_HORIZON).detected


SUITE_SHIFT = Rule(
    name="alert.suite_shift",
    nominal=SHIFT_ALPHA,
    guarantee=guarantee("suite_shift", alpha=SHIFT_ALPHA, horizon=SHIFT_HORIZON),
    scenarios=(
        Scenario("lifetime_30", "healthy", "30 studies evaluated one by one, normal finals, 4 seeds per study",
                 _shift(30)),
        Scenario("lifetime_100", "healthy", "100 studies evaluated one by one, normal finals", _shift(100)),
        Scenario("lifetime_100_skewed", "healthy", "100 studies, skewed (lognormal) finals of 4 seeds",
                 _shift(100, dist="lognormal")),
        Scenario("lifetime_100_gamma_1seed", "stress", "100 studies, one seed each, gamma finals (skewness 1)",
                 _shift(100, dist="gamma", seeds=1, study_sd=0.0)),
        Scenario("lifetime_100_no_study_effect", "healthy", "100 studies, seed noise only (no between-study effect)",
                 _shift(100, study_sd=0.0)),
        Scenario("lifetime_100_ar0.3", "healthy",
                 "100 studies, consecutive study means correlated (AR(1) 0.3: shared data, code, machines)",
                 _shift(100, ar=0.3)),
        Scenario("lifetime_100_ar0.5", "healthy", "100 studies, consecutive study means correlated (AR(1) 0.5)",
                 _shift(100, ar=0.5)),
        Scenario("lifetime_30_ar0.5", "healthy", "30 studies, consecutive study means correlated (AR(1) 0.5)",
                 _shift(30, ar=0.5)),
        Scenario("lifetime_100_ar0.5_skewed", "healthy", "100 studies, AR(1) 0.5, skewed (lognormal) finals of 4 seeds",
                 _shift(100, ar=0.5, dist="lognormal")),
        *(Scenario(f"lifetime_100_effect_ar{a:g}", "stress",
                   f"100 studies, the study effect wanders slowly (AR(1) {a:g}) under independent seed noise "
                   "(dependence beyond its lag-1 form)", _shift(100, effect_ar=a)) for a in (0.7, 0.9)),
        *(Scenario(f"lifetime_100_effect_ar{a:g}_silent", "stress",
                   "the same, counting only alarms with no caveat beside them (the history before the alarm rules "
                   "out a slow wander)", _shift(100, effect_ar=a, silent=True)) for a in (0.7, 0.9)),
        Scenario("lifetime_100_ar0.7", "stress",
                 "100 studies, AR(1) 0.7: more dependent than the level is checked for (the alarm says so)",
                 _shift(100, ar=0.7)),
        Scenario("lifetime_100_ar0.7_silent", "stress",
                 "the same, counting only alarms with no caveat beside them (neither too dependent nor a slow wander "
                 "left open)", _shift(100, ar=0.7, silent=True)),
        Scenario("last_study_3sd_ar0.5", "planted", "3σ shift in the last of 30 studies, AR(1) 0.5 history",
                 _shift(30, shift=3.0, shift_from=29, ar=0.5)),
        Scenario("10_back_2sd_ar0.3", "planted", "2σ shift in the last 10 of 30 studies, AR(1) 0.3 history",
                 _shift(30, shift=2.0, shift_from=20, ar=0.3)),
        Scenario("last_study_2sd", "planted", "2σ shift in the last of 30 studies", _shift(30, shift=2.0, shift_from=29)),
        Scenario("last_study_3sd", "planted", "3σ shift in the last of 30 studies", _shift(30, shift=3.0, shift_from=29)),
        Scenario("5_back_2sd", "planted", "2σ shift in the last 5 of 30 studies", _shift(30, shift=2.0, shift_from=25)),
        Scenario("10_back_1sd", "planted", "1σ shift in the last 10 of 30 studies",
                 _shift(30, shift=1.0, shift_from=20)),
        Scenario("10_back_2sd", "planted", "2σ shift in the last 10 of 30 studies",
                 _shift(30, shift=2.0, shift_from=20)),
        Scenario("5_back_3sd", "planted", "3σ shift in the last 5 of 30 studies", _shift(30, shift=3.0, shift_from=25)),
        Scenario("jump_after_6", "planted", "20σ jump after 6 studies, 4 studies on the new level",
                 _jump_after_short_history),
    ),
)

# ---------------------------------------------------------------- out of baseline

BASELINE_ALPHA = NOMINAL["out_of_baseline"]


def _baseline(n_base: int, n_cand: int, *, dist: str = "normal", shift: float = 0.0, one_run: bool = False):
    def trial(rng: np.random.Generator) -> bool:
        base = training_finals(rng, n_base, dist=dist)
        cand = training_finals(rng, n_cand, dist=dist)
        if one_run:
            cand[0] += shift * 0.02
        else:
            cand += shift * 0.02
        return baseline_outliers(base, cand, alpha=BASELINE_ALPHA).firing
    return trial


OUT_OF_BASELINE = Rule(
    name="alert.out_of_baseline",
    nominal=BASELINE_ALPHA,
    guarantee=guarantee("out_of_baseline", alpha=BASELINE_ALPHA),
    scenarios=(
        Scenario("5v5", "healthy", "5 candidate runs vs 5 baseline runs, normal finals", _baseline(5, 5)),
        Scenario("10v10", "healthy", "10 vs 10, normal finals", _baseline(10, 10)),
        Scenario("50v10", "healthy", "50 candidate runs vs 10 baseline runs, normal finals", _baseline(10, 50)),
        Scenario("10v10_skewed", "stress", "10 vs 10, skewed (lognormal) finals", _baseline(10, 10, dist="lognormal")),
        Scenario("50v10_skewed", "stress", "50 vs 10, skewed (lognormal) finals", _baseline(10, 50, dist="lognormal")),
        Scenario("10v10_shift_2sd", "planted", "10 vs 10, every candidate 2σ off", _baseline(10, 10, shift=2.0)),
        Scenario("10v10_shift_4sd", "planted", "10 vs 10, every candidate 4σ off", _baseline(10, 10, shift=4.0)),
        Scenario("10v10_one_run_8sd", "planted", "10 vs 10, one candidate run 8σ off",
                 _baseline(10, 10, shift=8.0, one_run=True)),
        Scenario("5v5_shift_4sd", "planted", "5 vs 5, every candidate 4σ off", _baseline(5, 5, shift=4.0)),
    ),
)

def _baseline_curves(n_base: int, n_cand: int, *, shift: float = 0.0, one_run: bool = False, rho: float = 0.9,
                     tails: str = "normal", steps: int = 300):
    def trial(rng: np.random.Generator) -> bool:
        curves = healthy_curves(rng, n_base + n_cand, steps, rho=rho, tails=tails)
        base, cand = curves[:n_base], curves[n_base:].copy()
        if one_run:
            cand[0] += shift * 0.02
        else:
            cand += shift * 0.02
        return baseline_curve_outliers(base, cand, alpha=BASELINE_ALPHA).firing
    return trial


OUT_OF_BASELINE_CURVE = Rule(
    name="alert.out_of_baseline:curve",
    nominal=BASELINE_ALPHA,
    guarantee=guarantee("out_of_baseline", alpha=BASELINE_ALPHA, mode="curve"),
    scenarios=(
        Scenario("5v5_ar0.9", "healthy", "5 vs 5 runs × 300 steps, AR(1) ρ=0.9 noise + seed offsets",
                 _baseline_curves(5, 5)),
        Scenario("10v10_ar0.9", "healthy", "10 vs 10, AR(1) ρ=0.9 + seed offsets", _baseline_curves(10, 10)),
        Scenario("50v10_ar0.9", "healthy", "50 candidate runs vs 10 baseline runs, AR(1) ρ=0.9",
                 _baseline_curves(10, 50)),
        Scenario("10v10_ar0.95_t3", "healthy", "10 vs 10, AR(1) ρ=0.95 with t3 innovations",
                 _baseline_curves(10, 10, rho=0.95, tails="t3")),
        Scenario("10v10_shift_4sd", "planted", "10 vs 10, every candidate curve 4 offset-sd higher",
                 _baseline_curves(10, 10, shift=4.0)),
        Scenario("10v10_one_run_8sd", "planted", "10 vs 10, one candidate curve 8 offset-sd higher",
                 _baseline_curves(10, 10, shift=8.0, one_run=True)),
    ),
)

# ---------------------------------------------------------------- band width

BAND_ALPHA = NOMINAL["band_width"]
BAND_LIMIT = 0.02


def _band(n: int, ratio: float, *, dist: str = "normal"):
    def trial(rng: np.random.Generator) -> bool:
        x = training_finals(rng, n, dist=dist, scale=BAND_LIMIT * ratio)
        return band_check_values(x, limit=BAND_LIMIT, alpha=BAND_ALPHA).firing
    return trial


BAND_WIDTH = Rule(
    name="alert.band_width",
    nominal=BAND_ALPHA,
    guarantee=guarantee("band_width", alpha=BAND_ALPHA),
    scenarios=(
        Scenario("at_limit_n5", "healthy", "true std = the limit, 5 seeds", _band(5, 1.0)),
        Scenario("at_limit_n10", "healthy", "true std = the limit, 10 seeds", _band(10, 1.0)),
        Scenario("at_limit_n30", "healthy", "true std = the limit, 30 seeds", _band(30, 1.0)),
        Scenario("below_limit_n10", "healthy", "true std = 0.8 × the limit, 10 seeds", _band(10, 0.8)),
        Scenario("twice_n10", "planted", "true std = 2 × the limit, 10 seeds", _band(10, 2.0)),
        Scenario("1.5x_n30", "planted", "true std = 1.5 × the limit, 30 seeds", _band(30, 1.5)),
    ),
)

# ---------------------------------------------------------------- exact checks


def _curve(rng: np.random.Generator, steps: int = 200) -> np.ndarray:
    t = np.arange(steps)
    return 0.3 + np.exp(-t / 40.0) + 0.01 * rng.standard_normal(steps)


def _diverged(nan_run: bool):
    def trial(rng: np.random.Generator) -> bool:
        runs = {i: (np.arange(200), _curve(rng)) for i in range(5)}
        if nan_run:
            steps, v = runs[0]
            v[int(rng.integers(1, 200)):] = np.nan
        return bool(align_series(runs).diverged.any())
    return trial


def _repeats(flip: bool):
    def trial(rng: np.random.Generator) -> bool:
        curve = _curve(rng)
        copies = [curve.copy() for _ in range(3)]
        if flip:
            i = int(rng.integers(0, curve.size))
            copies[2][i] = np.nextafter(copies[2][i], np.inf)  # one ULP at one step
        runs = [RepeatRun(steps=np.arange(curve.size), values=c, initial_weights="w", data_order=("d",))
                for c in copies]
        return repeatability(runs).verdict != "identical"
    return trial


DIVERGED = Rule(
    name="alert.diverged", nominal=0.0, guarantee=guarantee("diverged"),
    scenarios=(Scenario("finite", "healthy", "5 finite curves", _diverged(False)),
               Scenario("nan_run", "planted", "one run turns NaN at a random step", _diverged(True))),
)

REPEATABILITY_LOST = Rule(
    name="alert.repeatability_lost", nominal=0.0, guarantee=guarantee("repeatability_lost"),
    scenarios=(Scenario("identical", "healthy", "3 bitwise-identical repeats", _repeats(False)),
               Scenario("one_ulp", "planted", "one repeat differs by one ULP at one step", _repeats(True))),
)

RULES: list[Rule] = [SUITE_SHIFT, OUT_OF_BASELINE, OUT_OF_BASELINE_CURVE, BAND_WIDTH, DIVERGED, REPEATABILITY_LOST]
