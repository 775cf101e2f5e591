"""The group-sequential TOST of adaptive portability verdicts: its boundaries against scipy's
multivariate normal, its stage CIs against statsmodels, its one-stage form against the fixed rule,
and the whole adaptive process against its nominal false-alarm level (bounded simulation counts)."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.weightstats import CompareMeans, DescrStatsW, ttost_ind

from steady.server.stats.calibration import exceeds_nominal, measure
from steady.server.stats.calibration.rules_adaptive_portability import RULES, STATED_POWER
from steady.server.stats.report import MetricSpec, RunData, SeedStages, build_report
from steady.server.stats.sequential import spent_alpha
from steady.server.stats.portability import skew_guard
from steady.server.stats.sequential_tost import (
    SEQUENTIAL_IMBALANCE_LIMIT,
    SEQUENTIAL_VISIBLE_Z,
    sequential_tost_decision,
    tost_information_fraction,
)


def _rng(*names: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32("/".join(names).encode()))


@pytest.mark.parametrize("spending", ["pocock", "obrien_fleming"])
def test_boundaries_spend_alpha_by_scipy_multivariate_normal(spending):
    """Independent reference: with unequal seeds per stack (failed runs), P(no crossing by stage k)
    = P(Z_1 < c_1, …, Z_k < c_k) with corr √(t_i/t_j), by scipy's multivariate normal CDF (Genz),
    equals 1 − α(t_k) for the equivalence claim (α) and the not-equivalent claim (α/2 per side)."""
    rng = np.random.default_rng(3)
    ref_sizes, cand_sizes = (5, 4, 5, 6), (5, 5, 3, 7)  # seeds added per stage, at most 20 per stack
    ref = [100 * rng.standard_normal(n) for n in ref_sizes]  # far too noisy to decide: every stage looks
    cand = [100 * rng.standard_normal(n) for n in cand_sizes]
    d = sequential_tost_decision(ref, cand, margin=1.0, max_seeds=20, last_stage=5, spending=spending)
    assert d.verdict == "inconclusive" and len(d.stages) == 4 and not d.final
    n_r, n_c = np.cumsum(ref_sizes), np.cumsum(cand_sizes)
    t = np.array([look.info_fraction for look in d.stages])
    assert t == pytest.approx(n_r * n_c / (n_r + n_c) / 10.0)  # h / h_max, h_max = 20/2
    corr = np.sqrt(np.minimum.outer(t, t) / np.maximum.outer(t, t))
    for claim, level in (("boundary", 0.05), ("boundary_not_equivalent", 0.025)):
        c = np.array([getattr(look, claim) for look in d.stages])
        for k in range(1, t.size + 1):
            mvn = stats.multivariate_normal(mean=np.zeros(k), cov=corr[:k, :k], abseps=1e-7, releps=1e-7,
                                            maxpts=200_000 * k)
            stay = mvn.cdf(c[:k], rng=np.random.default_rng(1))
            assert 1.0 - stay == pytest.approx(spent_alpha(t[k - 1], alpha=level, spending=spending), abs=2e-4)


def test_stage_ci_is_statsmodels_welch_interval_at_the_stage_level():
    """At each stage the equivalence CI is the Welch interval at confidence 1 − 2a_k (statsmodels)."""
    rng = np.random.default_rng(8)
    ref, cand = rng.normal(0, 1, 15), rng.normal(0.3, 2, 15)
    d = sequential_tost_decision(np.split(ref, [5, 10]), np.split(cand, [5, 10]), margin=5.0, max_seeds=30,
                                 last_stage=6)
    for look in d.stages:
        n = look.n_reference
        cm = CompareMeans(DescrStatsW(cand[:n]), DescrStatsW(ref[:n]))
        low, high = cm.tconfint_diff(alpha=2 * look.nominal_alpha, usevar="unequal")
        if n <= 5:  # the small-sample rule: df n − 1 (Hsu) and the skew allowance, by hand
            sr, sc = ref[:n].std(ddof=1), cand[:n].std(ddof=1)
            se = np.sqrt((sr**2 + sc**2) / n)
            skew = 0.5 * 1.75 * abs(sc**3 - sr**3) / n**2 / se**3
            q = stats.t.isf(look.nominal_alpha, n - 1)
            half = (q + skew * (2 * q * q + 1) / 6) * se
            mid = cand[:n].mean() - ref[:n].mean()
            low, high = mid - half, mid + half
        assert (look.ci_low, look.ci_high) == pytest.approx((low, high), rel=1e-9)
        assert look.nominal_alpha == pytest.approx(stats.norm.sf(look.boundary))


def test_one_stage_is_the_fixed_sample_rule():
    """K = 1: `equivalent` iff statsmodels' TOST p < α (and the look's skew guard, stricter than the fixed
    rule's, does not withhold it); `not_equivalent` iff the (1 − α) Welch CI lies outside the margin —
    the report's fixed-sample rule."""
    rng = np.random.default_rng(21)
    seen = set()
    for i in range(60):
        ref, cand = rng.normal(0, 1, 8), rng.normal(rng.uniform(-3, 3), rng.uniform(0.5, 2), 7)
        d = sequential_tost_decision([ref], [cand], margin=1.0, max_seeds=8, last_stage=1)
        p = ttost_ind(cand, ref, -1.0, 1.0, usevar="unequal")[0]
        low, high = CompareMeans(DescrStatsW(cand), DescrStatsW(ref)).tconfint_diff(alpha=0.05, usevar="unequal")
        withheld = skew_guard(ref, cand, visible_z=SEQUENTIAL_VISIBLE_Z, imbalance_limit=SEQUENTIAL_IMBALANCE_LIMIT)
        expected = ("inconclusive" if p < 0.05 and withheld else "equivalent" if p < 0.05
                    else "not_equivalent" if (low > 1.0 or high < -1.0) else "inconclusive")
        assert d.verdict == expected, i
        assert d.skew_withheld == bool(p < 0.05 and withheld)
        assert d.final and d.stages[0].info_fraction == 1.0 and d.stages[0].cumulative_alpha == pytest.approx(0.05)
        seen.add(expected)
    assert seen == {"equivalent", "not_equivalent", "inconclusive"}


def test_stops_at_the_first_decisive_stage_and_the_last_stage_spends_all():
    rng = np.random.default_rng(4)
    ref, cand = rng.normal(0, 1, 40), rng.normal(0, 1, 40)
    d = sequential_tost_decision(np.split(ref, [5, 10, 15]), np.split(cand, [5, 10, 15]), margin=1.5,
                                 max_seeds=40, last_stage=8)
    assert d.verdict == "equivalent" and d.final and d.decided_at == d.stages[-1].stage < 4
    assert all(look.nominal_alpha < 0.05 for look in d.stages)  # the price of looking more than once
    wide = sequential_tost_decision([ref[:5], ref[5:10]], [cand[:5] * 9, cand[5:10] * 9], margin=0.5, max_seeds=10,
                                    last_stage=2)
    assert wide.verdict == "inconclusive" and wide.final and wide.stages[-1].info_fraction == 1.0
    assert wide.stages[-1].cumulative_alpha == pytest.approx(0.05)
    # a last stage whose runs all failed adds no look: the previous look becomes the final one
    d = sequential_tost_decision([ref[:5], ref[5:10], []], [cand[:5] * 9, cand[5:10] * 9, []], margin=0.5,
                                 max_seeds=15, last_stage=3)
    assert [s.stage for s in d.stages] == [1, 2] and d.stages[-1].info_fraction == 1.0 and d.final
    # one value on a stack: not testable, its error spent unused
    d = sequential_tost_decision([ref[:1]], [cand[:5]], margin=1.0, max_seeds=10, last_stage=2)
    assert d.stages[0].diff is None and d.verdict == "inconclusive" and not d.final
    assert tost_information_fraction(5, 5, 20, last=False) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        sequential_tost_decision([ref[:5]], [cand[:5]], margin=0.0, max_seeds=10, last_stage=2)
    with pytest.raises(ValueError):
        sequential_tost_decision([ref[:5]], [cand[:5], cand[5:]], margin=1.0, max_seeds=10, last_stage=2)


def test_report_judges_portability_in_stages():
    """build_report with stages: the portability verdict is the sequential TOST on the stages' seeds."""
    rng = np.random.default_rng(5)
    steps = np.arange(2, dtype=np.int64)
    finals = {"a": rng.normal(0, 1, 10), "b": rng.normal(0, 1, 10)}
    runs = [RunData(run_id=j * 10 + i, seed=i, repeat=0, determinism="seeded", stack=s,
                    series={"loss": (steps, np.array([1.0, finals[s][i]]))})
            for j, s in enumerate("ab") for i in range(10)]
    stages = SeedStages({i: 1 + i // 5 for i in range(10)}, last_stage=4, max_seeds=20)
    rep = build_report(runs, [MetricSpec("loss", margin=0.3)], rng=rng, stages=stages)
    (v,) = [v for v in rep.verdicts if v.level == "stack_portability"]
    ref = sequential_tost_decision(np.split(finals["a"], [5]), np.split(finals["b"], [5]), margin=0.3, max_seeds=20,
                                   last_stage=4)
    assert v.details["sequential"] == ref and v.verdict == ref.verdict == "inconclusive"
    assert "group-sequential TOST over 2 stage(s) of at most 4" in v.reason and "over all stages" in \
        v.details["guarantee"]
    fixed = build_report(runs, [MetricSpec("loss", margin=0.3)], rng=rng)
    (f,) = [v for v in fixed.verdicts if v.level == "stack_portability"]
    assert f.details["sequential"] is None and "over all stages" not in f.details["guarantee"]


# --------------------------------------------------------------------------- calibration

SIMS = 600  # ~0.3 s per 150 simulated studies; the build_report scenarios are slower
HEALTHY = [(r, s) for r in RULES for s in r.scenarios if s.kind == "healthy"]
PLANTED = [(r, s) for r in RULES for s in r.scenarios if f"{r.name}/{s.name}" in STATED_POWER]


@pytest.mark.parametrize("rule,scenario", HEALTHY, ids=[f"{r.name}/{s.name}" for r, s in HEALTHY])
def test_adaptive_portability_false_alarm_within_nominal_over_all_stages(rule, scenario):
    n = 150 if scenario.name.startswith("report-") else SIMS
    rate = measure(rule, scenario, n=n, rng=_rng(rule.name, scenario.name))
    assert not exceeds_nominal(rate), f"{rule.name}/{scenario.name}: {rate.k}/{rate.n} > nominal {rule.nominal}"


@pytest.mark.parametrize("rule,scenario", PLANTED, ids=[f"{r.name}/{s.name}" for r, s in PLANTED])
def test_adaptive_portability_power_as_stated(rule, scenario):
    rate = measure(rule, scenario, n=200, rng=_rng(rule.name, scenario.name))
    assert rate.high >= STATED_POWER[f"{rule.name}/{scenario.name}"]


def test_without_spending_false_equivalence_grows():
    """The reason for the design: re-judging each of 8 stages with the fixed TOST at α calls a
    difference on the margin `equivalent` more often than α allows."""
    (rule,) = [r for r in RULES if r.name == "stack_portability:adaptive:equivalent"]
    naive = next(s for s in rule.scenarios if s.name == "naive-normal-5+5to40")
    spent = next(s for s in rule.scenarios if s.name == "normal-5+5to40-pocock")
    rate = measure(rule, naive, n=600, rng=_rng("naive-port"))
    assert rate.low > rule.nominal, f"{rate.k}/{rate.n}"
    designed = measure(rule, spent, n=600, rng=_rng("naive-port"))  # the same simulated studies
    assert designed.k < rate.k


def test_adaptive_portability_rules_are_registered_with_healthy_planted_and_a_guarantee():
    from steady.server.stats.calibration.rules import all_rules

    names = {r.name for r in all_rules()}
    assert {"stack_portability:adaptive:equivalent", "stack_portability:adaptive:not_equivalent"} <= names
    for r in RULES:
        assert {"healthy", "planted", "stress"} == {s.kind for s in r.scenarios} and "all stages" in r.guarantee


def test_adaptive_tost_withholds_equivalent_at_a_look_with_skewed_unequal_stacks():
    """A 20-seed right-skewed baseline against a wider 5-seed candidate whose values fall inside the margin:
    the look would say 'equivalent', the skew guard withholds it, and the reason says why."""
    from steady.server.stats.sequential_tost import sequential_tost_reason

    rng = np.random.default_rng(21)
    ref = rng.lognormal(0.0, 0.5, 20)
    cand = np.array([0.6, 0.8, 0.9, 1.0, 3.2])
    stages_ref, stages_cand = [ref, np.zeros(0), np.zeros(0), np.zeros(0)], [cand, [], [], []]
    d = sequential_tost_decision(stages_ref, stages_cand, margin=50.0, max_seeds=20, last_stage=4)
    assert d.verdict == "inconclusive" and d.skew_withheld
    assert "'equivalent' withheld at a look" in sequential_tost_reason(d, last_stage=4, n_comparisons=1)
    sym = sequential_tost_decision([np.linspace(0, 2, 20)], [np.linspace(0.5, 1.5, 5)], margin=50.0, max_seeds=20,
                                   last_stage=4)
    assert sym.verdict == "equivalent" and not sym.skew_withheld  # unequal but symmetric: claimed


# One xdist worker runs the module: its simulations share what the stats core builds once per process (make
# test's -n 4 on this module, the alert calibration and the two sequential ones: 50.3 CPU-s spread, 44.1 grouped).
pytestmark = pytest.mark.xdist_group("sequential_portability")
