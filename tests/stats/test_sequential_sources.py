"""A sources study in stages (steady.server.stats.sequential_sources): the group-sequential TOST of a source's SD
against the all-sources SD, against the fixed rule, the spending boundaries, and by simulation of the whole
process (steady.server.stats.calibration.rules_sources): false ``equivalent`` and ``not_equivalent`` ≤ 5% over
all stages on normal, heavy-tailed and skewed arms, and a check that fails when the spending is left out."""
from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest
from scipy import stats

from steady.server.stats.calibration import clopper_pearson, exceeds_nominal, measure
from steady.server.stats.calibration.rules_sources import RULES, STATED_POWER
from steady.server.stats.sequential import spending_boundaries, stage_sizes
from steady.server.stats.sequential_sources import (by_stage, sd_ratio_information_fraction,
                                                    sequential_sd_ratio_reason, sequential_sd_ratio_tost)
from steady.server.stats.sources import sd_ratio_tost


def _rng(*names: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32("/".join(names).encode()))


def test_one_stage_is_the_fixed_rule():
    rng = _rng("one-stage")
    for ratio in (1.0, 1.5, 3.0, 0.3):
        x, y = rng.normal(0, ratio, 60), rng.normal(0, 1.0, 60)
        d = sequential_sd_ratio_tost([x], [y], max_runs=60, last_stage=1)
        fixed = sd_ratio_tost(x, y)
        (look,) = d.stages
        assert d.verdict == fixed.verdict and d.final and look.nominal_alpha == pytest.approx(0.05, abs=1e-9)
        assert (look.lower, look.upper) == pytest.approx((fixed.lower, fixed.upper))


def test_looks_use_the_spending_boundaries_of_their_information():
    rng = _rng("looks")
    x, y = rng.normal(0, 1.0, 96), rng.normal(0, 1.0, 96)
    d = sequential_sd_ratio_tost(np.split(x, [32, 64]), np.split(y, [32, 64]), max_runs=256, last_stage=8)
    t = [sd_ratio_information_fraction(n, n, 256, last=False) for n in (32, 64, 96)][:len(d.stages)]
    assert t[0] == pytest.approx((1 / (2 / 31)) / (255 / 2))  # h = 15.5 of h_max = 127.5
    b = spending_boundaries(t, alpha=0.05, spending="pocock")
    assert [look.boundary for look in d.stages] == pytest.approx(list(b.boundaries[:len(d.stages)]))
    for look, n in zip(d.stages, (32, 64, 96)):  # each look is the fixed rule at its nominal level
        fixed = sd_ratio_tost(x[:n], y[:n], alpha=look.nominal_alpha)
        assert (look.ratio, look.lower, look.upper, look.verdict) == pytest.approx(
            (fixed.ratio, fixed.lower, fixed.upper, fixed.verdict))
        assert look.nominal_alpha < 0.05  # stricter than one look at α


def test_the_first_decision_ends_the_test_and_the_last_stage_spends_the_rest():
    rng = _rng("stops")
    x, y = rng.normal(0, 0.1, 64), rng.normal(0, 1.0, 64)  # a source with a tenth of the SD: decided at once
    d = sequential_sd_ratio_tost([x[:32], x[32:]], [y[:32], y[32:]], max_runs=128, last_stage=4)
    assert d.verdict == "not_equivalent" and d.decided_at == 1 and len(d.stages) == 1 and d.final
    assert "not equivalent, wholly outside ×1.5 at stage 1 with 32 + 32 runs" in sequential_sd_ratio_reason(
        d, last_stage=4)
    same = rng.normal(0, 1.0, (2, 40))
    d = sequential_sd_ratio_tost([same[0][:20], same[0][20:]], [same[1][:20], same[1][20:]], max_runs=200,
                                 last_stage=2)
    assert d.stages[-1].info_fraction == 1.0 and d.final
    if d.verdict == "inconclusive":
        assert "budget spent" in sequential_sd_ratio_reason(d, last_stage=2)
    # an arm that stopped adding runs makes no new look; a look with < 5 runs on an arm is not tested
    d = sequential_sd_ratio_tost([same[0][:4], np.zeros(0)], [same[1][:4], same[1][4:8]], max_runs=40, last_stage=5)
    assert all(look.ratio is None and look.verdict == "inconclusive" for look in d.stages) and not d.final


def test_bad_input_is_refused():
    x = np.ones(10)
    with pytest.raises(ValueError, match="margin"):
        sequential_sd_ratio_tost([x], [x], max_runs=10, last_stage=1, margin=1.0)
    with pytest.raises(ValueError, match="same number of stages"):
        sequential_sd_ratio_tost([x, x], [x], max_runs=20, last_stage=2)
    with pytest.raises(ValueError, match="last_stage"):
        sequential_sd_ratio_tost([x, x], [x, x], max_runs=20, last_stage=1)
    with pytest.raises(ValueError, match="align"):
        by_stage([1.0, 2.0], [1], 1)
    assert [a.tolist() for a in by_stage([1.0, 2.0, 3.0], [2, 1, 2], 2)] == [[2.0], [1.0, 3.0]]


# --------------------------------------------------------------------------- calibration

# 400 simulations per healthy scenario: about 2–4 s each on a loaded 2-core machine (24 scenarios).
SIMS = 400
HEALTHY = [(r, s) for r in RULES for s in r.scenarios if s.kind == "healthy"]
PLANTED = [(r, s) for r in RULES for s in r.scenarios if f"{r.name}/{s.name}" in STATED_POWER]


def _within(rate, nominal: float) -> bool:
    """Not above the nominal level beyond simulation error (one-sided exact binomial test at 1%), and the
    95% Clopper–Pearson upper bound below twice the nominal level."""
    return not exceeds_nominal(rate) and rate.high < 2 * nominal


@pytest.mark.parametrize("rule,scenario", HEALTHY, ids=[f"{r.name}/{s.name}" for r, s in HEALTHY])
def test_false_claims_stay_within_nominal_over_all_stages(rule, scenario):
    rate = measure(rule, scenario, n=SIMS, rng=_rng(rule.name, scenario.name))
    assert _within(rate, rule.nominal), f"{rule.name}/{scenario.name}: {rate.k}/{rate.n}, CP upper {rate.high:.3f}"


def test_the_check_fails_without_alpha_spending():
    """The same check on the naive process (each stage judged by the fixed rule at α, 15 looks) fails: the check
    has teeth, and the spending is what keeps the claim at its level."""
    (rule,) = [r for r in RULES if r.name == "sources:adaptive:equivalent"]
    naive = next(s for s in rule.scenarios if s.name.startswith("naive-"))
    rate = dataclasses.replace(measure(rule, naive, n=SIMS, rng=_rng("naive", naive.name)), kind="healthy")
    assert not _within(rate, rule.nominal), f"{rate.k}/{rate.n}"
    # and at this n the check fails a rule at a doubled rate (10%) in more than 95% of runs, passes one at 3% in more than 95%
    def passes(p: float) -> float:
        pmf = stats.binom.pmf(np.arange(SIMS + 1), SIMS, p)
        return float(sum(pmf[k] for k in range(SIMS + 1)
                         if clopper_pearson(k, SIMS)[1] < 0.1 and stats.binom.sf(k - 1, SIMS, 0.05) >= 0.01))

    assert passes(0.10) < 0.05 and passes(0.03) > 0.95


@pytest.mark.parametrize("rule,scenario", PLANTED, ids=[f"{r.name}/{s.name}" for r, s in PLANTED])
def test_power_as_stated(rule, scenario):
    rate = measure(rule, scenario, n=200, rng=_rng(rule.name, scenario.name))
    assert rate.high >= STATED_POWER[f"{rule.name}/{scenario.name}"], f"{rate.k}/{rate.n}"


def test_sources_rules_are_registered_with_healthy_planted_stress_and_a_guarantee():
    from steady.server.stats.calibration.rules import all_rules

    names = {r.name for r in all_rules()}
    assert {"sources:adaptive:equivalent", "sources:adaptive:not_equivalent"} <= names
    for r in RULES:
        assert {"healthy", "planted", "stress"} == {s.kind for s in r.scenarios} and "all stages" in r.guarantee
    assert len(stage_sizes(32, 32, 256)) == 8


def test_a_time_budget_only_drops_looks_in_each_sequential_rule():
    """``stopped`` (the study's time budget ended it before the budget's last stage): the looks taken are those of
    the plan, the verdict is final and says why, and nothing more is spent; true of the three staged rules."""
    from steady.server.stats.sequential import sequential_seed_decision
    from steady.server.stats.sequential_tost import sequential_tost_decision, sequential_tost_reason

    rng = _rng("time-budget")
    x, y = np.split(rng.normal(0, 1.2, 36), 3), np.split(rng.normal(0, 1.0, 36), 3)  # 3 stages of 12: undecided
    runs = {
        "sources": lambda k, **kw: sequential_sd_ratio_tost(x[:k], y[:k], max_runs=224, last_stage=7, **kw),
        "seeds": lambda k, **kw: sequential_seed_decision(x[:k], max_std=1.3, max_seeds=224, last_stage=7, **kw),
        "stacks": lambda k, **kw: sequential_tost_decision(x[:k], y[:k], margin=0.1, max_seeds=224, last_stage=7, **kw),
    }
    for name, run in runs.items():
        going, stopped = run(3), run(3, stopped=True)
        assert going.verdict == stopped.verdict == "inconclusive", name
        assert not going.final and stopped.final and stopped.stopped and not going.stopped, name
        assert stopped.stages == going.stages, name  # the same boundaries and statistics: no error re-spent
    words = sequential_sd_ratio_reason(runs["sources"](3, stopped=True), last_stage=7)
    assert words.endswith("stopped by the study's time budget before the budget's last stage")
    assert "more runs come" in sequential_sd_ratio_reason(runs["sources"](3), last_stage=7)
    assert "stopped by the study's time budget" in sequential_tost_reason(runs["stacks"](3, stopped=True), last_stage=7,
                                                                          n_comparisons=1)
    decided = sequential_sd_ratio_tost([rng.normal(0, 1, 200)], [rng.normal(0, 1, 200)], max_runs=224, last_stage=7,
                                       stopped=True)
    assert decided.verdict == "equivalent" and not decided.stopped  # a decided verdict was not stopped by time


def test_a_time_budget_keeps_false_equivalent_within_nominal():
    """Stopping at a stage the clock picks (not the data) leaves each claim wrong ≤ α: 400 staged studies of t5 arms
    with the source's SD on the margin (1.5 × all), each stopped after a uniformly drawn stage of seven."""
    rng = _rng("time-budget-sims")
    k = 0
    for _ in range(SIMS):
        last = int(rng.integers(1, 8))
        src = [1.5 * rng.standard_t(5, 32) for _ in range(last)]
        ref = [rng.standard_t(5, 32) for _ in range(last)]
        d = sequential_sd_ratio_tost(src, ref, max_runs=224, last_stage=7, stopped=last < 7)
        k += d.verdict == "equivalent"
    lo, hi = clopper_pearson(k, SIMS)
    assert stats.binom.sf(k - 1, SIMS, 0.05) >= 0.01 and hi < 0.1, f"{k}/{SIMS}"


# One xdist worker runs the module: its simulations share what the stats core builds once per process (make
# test's -n 4 on this module, the alert calibration and the two sequential ones: 50.3 CPU-s spread, 44.1 grouped).
pytestmark = pytest.mark.xdist_group("sequential_sources")
