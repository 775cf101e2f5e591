"""Stack portability at 3–5 seeds per stack: unequal spreads, skewed or outlier finals. The Welch TOST gave
a false 'equivalent' 6–9% of the time at the nominal 5% on these shapes; the small-sample rule
(``portability.small_sample_quantile``) holds the level, and the reason says it was used."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from scipy import stats

from steady.server.stats.calibration import Rate, clopper_pearson, exceeds_nominal
from steady.server.stats.calibration import generators as gen
from steady.server.stats.calibration.rules_seeds import SMALL_DISTS, SMALL_UNEQUAL
from steady.server.stats.portability import small_sample_quantile, tost
from steady.server.stats.report import MetricSpec, RunData, build_report
from steady.server.stats.sequential_tost import sequential_tost_decision

ALPHA = 0.05
SIMS = 4000


def _draw(rng, n_ref, n_cand, var_ratio, dist, sims):
    sd_c = float(np.sqrt(var_ratio))
    se = float(np.sqrt(1.0 / n_ref + var_ratio / n_cand))
    margin = 4.0 * se
    ref = gen.final_values(rng, n_ref * sims, sd=1.0, dist=dist).reshape(sims, n_ref)
    cand = gen.final_values(rng, n_cand * sims, sd=sd_c, dist=dist, mean=margin).reshape(sims, n_cand)
    return ref, cand, margin


def _welch_equivalent(ref, cand, margin) -> np.ndarray:
    """The Welch TOST's 'equivalent', vectorised (statsmodels' ttost_ind, unequal variances)."""
    va, vb = ref.var(1, ddof=1) / ref.shape[1], cand.var(1, ddof=1) / cand.shape[1]
    se = np.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (ref.shape[1] - 1) + vb**2 / (cand.shape[1] - 1))
    d = cand.mean(1) - ref.mean(1)
    p = np.maximum(stats.t.sf((d + margin) / se, df), stats.t.sf((margin - d) / se, df))
    return p < ALPHA


def _false_equivalent(ref, cand, margin) -> tuple[int, int]:
    """(false 'equivalent' now, by the Welch TOST): the rule's 'equivalent' is a subset of the Welch TOST's
    (df min(n) − 1 ≤ the Welch df, and the skew allowance ≥ 0), so only the Welch TOST's are re-judged."""
    welch = _welch_equivalent(ref, cand, margin)
    now = 0
    for i in np.flatnonzero(welch):
        t = tost(ref[i], cand[i], margin=margin)
        now += bool(t.p_value < ALPHA and t.withheld is None)
    return now, int(welch.sum())


SHAPES = [(name, nr, nc, vr, dist) for name, nr, nc, vr in SMALL_UNEQUAL for dist in SMALL_DISTS]


def _passes(n: int, p: float) -> float:
    """P(the check below passes) when the true rate is p: exact, over the binomial count (the Clopper–Pearson
    upper bound vectorised: the beta quantile, 1 at k = n)."""
    k = np.arange(n + 1)
    upper = np.where(k < n, stats.beta.ppf(0.975, k + 1, np.maximum(n - k, 1)), 1.0)
    ok = (upper < 2 * ALPHA) & (stats.binom.sf(k - 1, n, ALPHA) >= 0.01)
    return float(stats.binom.pmf(k, n, p)[ok].sum())


def test_the_check_catches_the_rates_that_were_measured():
    """At SIMS studies per shape the check below fails a rule at 7% (the Welch TOST measured 6–9%) at
    least 95% of the time, and passes one at 4% nearly always."""
    assert _passes(SIMS, 0.07) < 0.05
    assert _passes(SIMS, 0.04) > 0.95


@pytest.mark.parametrize("name,n_ref,n_cand,var_ratio,dist", SHAPES, ids=[f"{s[4]}-{s[0]}" for s in SHAPES])
def test_small_unequal_stacks_keep_the_level(name, n_ref, n_cand, var_ratio, dist):
    rng = np.random.default_rng(zlib.crc32(f"small-tost/{name}/{dist}".encode()))
    ref, cand, margin = _draw(rng, n_ref, n_cand, var_ratio, dist, SIMS)
    k, welch = _false_equivalent(ref, cand, margin)
    rate = Rate("stack_portability:equivalent", name, "healthy", k, SIMS, *clopper_pearson(k, SIMS), ALPHA)
    assert not exceeds_nominal(rate) and rate.high < 2 * ALPHA, f"{dist} {name}: {k}/{SIMS} (Welch TOST {welch})"


def test_the_welch_tost_did_not_hold_there():
    """The regression: on the gamma 4 vs 4 shape the Welch TOST alone (with the skew guard) is above 5%."""
    rng = np.random.default_rng(7)
    ref, cand, margin = _draw(rng, 4, 4, 6.0, "gamma", SIMS)
    welch = _welch_equivalent(ref, cand, margin)
    from steady.server.stats.portability import skew_guard

    k = sum(skew_guard(ref[i], cand[i]) is None for i in np.flatnonzero(welch))
    assert clopper_pearson(int(k), SIMS)[0] > ALPHA, f"{k}/{SIMS}"


def test_the_small_sample_quantile_by_hand():
    """Student t at the smaller stack's df plus the Cornish–Fisher skew term; the p-value inverts it."""
    q = small_sample_quantile(0.05, 3.0, 0.4)
    t = stats.t.isf(0.05, 3)
    assert q == pytest.approx(t + 0.4 * (2 * t * t + 1) / 6)
    assert small_sample_quantile(0.05, 3.0, 0.0) == pytest.approx(t)
    # the p-value of a statistic equal to the critical value is the level
    ref, cand = np.array([0.0, 0.1, 0.3, 0.2]), np.array([0.5, 1.4, 0.9, 0.2])
    res = tost(ref, cand, margin=2.0)
    sa, sb = ref.std(ddof=1), cand.std(ddof=1)
    se = np.sqrt(sa**2 / 4 + sb**2 / 4)
    skew = 0.5 * 1.75 * abs(sb**3 - sa**3) / 16 / se**3
    stat = (2.0 - (cand.mean() - ref.mean())) / se
    assert res.df == 3.0 and res.small_sample and "df 3" in res.small_sample
    assert small_sample_quantile(res.p_upper, 3.0, skew) == pytest.approx(stat, rel=1e-9)


def test_larger_stacks_keep_the_welch_tost():
    """Above 5 seeds on both stacks nothing changes: statsmodels' ttost_ind."""
    from statsmodels.stats.weightstats import ttost_ind

    rng = np.random.default_rng(2)
    for n_ref, n_cand in ((6, 7), (2, 4)):  # above 5 seeds, and 2 seeds (outside the rule's calibrated 3–5)
        ref, cand = rng.normal(0, 1, n_ref), rng.normal(0.2, 2, n_cand)
        res = tost(ref, cand, margin=2.0)
        assert res.small_sample is None and res.p_value == pytest.approx(ttost_ind(cand, ref, -2.0, 2.0,
                                                                                   usevar="unequal")[0])


def test_the_report_says_the_small_sample_rule_beside_the_verdict():
    runs = [RunData(run_id=k * 4 + i, seed=i, repeat=0, determinism="seeded", stack=s,
                    series={"acc": (np.array([0, 1]), np.array([0.0, v + 0.01 * i]))})
            for k, (s, v) in enumerate((("ref", 0.9), ("cand", 0.9))) for i in range(4)]
    rep = build_report(runs, [MetricSpec("acc", margin=0.05)], rng=np.random.default_rng(0), reference_stack="ref")
    (v,) = [v for v in rep.verdicts if v.level == "stack_portability"]
    assert v.verdict == "equivalent" and "small-sample rule" in v.reason and "df 3" in v.reason
    from steady.server.stats import guarantees

    assert "3–5 seeds on a stack" in guarantees.stack_portability() and "3–5" in guarantees.stack_portability(
        sequential=True)


def test_a_sequential_look_at_five_seeds_uses_the_same_rule():
    """One stage of 5 + 5 seeds: the sequential verdict is the fixed rule's (its 'equivalent' ⇔ TOST p < α)."""
    rng = np.random.default_rng(13)
    for _ in range(40):
        ref, cand = rng.normal(0, 1, 5), rng.normal(rng.uniform(-1, 1), rng.uniform(0.5, 2.5), 5)
        d = sequential_tost_decision([ref], [cand], margin=2.0, max_seeds=5, last_stage=1)
        t = tost(ref, cand, margin=2.0)
        if d.skew_withheld:
            continue
        assert (d.verdict == "equivalent") == (t.p_value < ALPHA)
