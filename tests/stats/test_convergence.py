"""Convergence against a reference (MLPerf RCP): a real checker log, scipy's t-test, the rules."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from steady.server.stats.convergence import (
    ReferencePoint,
    check_convergence,
    min_acceptable_mean,
    olympic_trim,
    reference_from_runs,
    steps_to_target,
)


def test_reproduces_a_real_rcp_checker_log():
    # rcp_checker: RCP mean 215040, stdev 11976.9 (18 reference runs after trimming), 8 submission runs
    # after trimming -> "Min Epochs" 206333, "Max Speedup" 1.0422.
    floor, t, df = min_acceptable_mean(215040, 11976.9, 18, 8, alpha=0.05)
    assert round(floor) == 206333
    assert round(215040 / floor, 4) == 1.0422
    assert df == 24
    assert t == pytest.approx(stats.t.ppf(0.05, 24), rel=1e-12)
    assert t == pytest.approx(-1.7109, abs=5e-5)  # t table, one-sided 0.05, 24 df


def test_min_acceptable_mean_is_where_scipys_pooled_t_test_reaches_alpha():
    floor, _, _ = min_acceptable_mean(215040, 11976.9, 18, 8, alpha=0.05)
    p = stats.ttest_ind_from_stats(floor, 11976.9, 8, 215040, 11976.9, 18, equal_var=True, alternative="less").pvalue
    assert p == pytest.approx(0.05, rel=1e-9)
    # and the checker's bisection lands on the same number
    lo, hi = 0.0, 215040.0
    while hi - lo > 1e-4:
        mid = (lo + hi) / 2
        if stats.ttest_ind_from_stats(mid, 11976.9, 8, 215040, 11976.9, 18, alternative="less").pvalue < 0.05:
            lo = mid
        else:
            hi = mid
    assert floor == pytest.approx(hi, abs=1e-3)


def test_steps_to_target_and_olympic_trim():
    assert steps_to_target([0, 10, 20, 30], [1.0, 0.6, 0.4, 0.5], target=0.5, direction="min") == 20
    assert steps_to_target([0, 10, 20], [0.1, 0.7, float("nan")], target=0.7, direction="max") == 10
    assert steps_to_target([0, 10], [1.0, float("nan")], target=0.5, direction="min") == math.inf
    with pytest.raises(ValueError, match="direction"):
        steps_to_target([0], [1.0], target=0.5, direction="down")
    assert olympic_trim([5, math.inf, 1, 3, 2]).tolist() == [2, 3, 5]


def test_reference_from_runs():
    x = [100, 110, 120, 130, 140, math.inf]
    ref = reference_from_runs(x, std_method="mlperf")
    assert (ref.mean, ref.n, ref.n_unconverged) == (125.0, 4, 1)
    assert ref.std == pytest.approx(np.std([110, 120, 130, 140]))
    yuen = reference_from_runs(x)
    w = [110, 110, 120, 130, 140, 140]  # winsorized: the trimmed ends replaced by their neighbours
    assert yuen.std == pytest.approx(np.std(w, ddof=1) / (1 - 2 / 6) * math.sqrt(4 / 6))
    with pytest.raises(ValueError, match="never reached"):
        reference_from_runs([100, 110, 120, math.inf, math.inf])


REF = ReferencePoint(mean=215040, std=11976.9, n=18)


def test_pass_fail_normalisation_and_unconverged_runs():
    slow = [215000 + 1000 * i for i in range(10)]
    r = check_convergence(slow, REF)
    assert r.verdict == "pass" and r.normalization_factor == 1.0 and r.n_candidate == 8
    assert round(r.min_acceptable_mean) == 206333 and round(r.max_speedup, 4) == 1.0422
    fast = [190000 + 1000 * i for i in range(10)]
    r = check_convergence(fast, REF)
    assert r.verdict == "fail" and r.candidate_mean == 194500.0
    assert r.normalization_factor == pytest.approx(215040 / 194500.0)  # the checker's _find_norm_factor
    assert r.p_value < 0.05
    within = [205000 + 1000 * i for i in range(10)]  # mean 209500: faster than 215040, within the speed-up
    r = check_convergence(within, REF)
    assert r.verdict == "pass" and r.normalization_factor == pytest.approx(215040 / 209500)
    assert "normalised by ×1.0264" in r.reason
    one_never = slow[:-1] + [math.inf]  # the slowest run is dropped by the trimming: counted, judged
    r = check_convergence(one_never, REF)
    assert r.verdict == "pass" and r.n_unconverged == 1
    r = check_convergence(slow[:-2] + [math.inf, math.inf], REF)
    assert r.verdict == "fail" and "never reached" in r.reason
    r = check_convergence([200000, 210000, 220000], REF)
    assert r.verdict == "inconclusive" and "at least 4" in r.reason
    assert r.to_dict()["steps_to_target"] == [200000, 210000, 220000]
