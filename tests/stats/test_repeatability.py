import numpy as np
import pytest

from steady.server.stats.repeatability import RepeatRun, repeatability, ulp_distance

S = np.arange(0, 50, 5)


def run(values, **kw):
    return RepeatRun(steps=S, values=np.asarray(values, dtype=np.float64), **kw)


def test_ulp_distance_hand_checked():
    one = 1.0
    assert ulp_distance(np.array([one]), np.array([np.nextafter(one, 2)]))[0] == 1
    assert ulp_distance(np.array([0.0]), np.array([-0.0]))[0] == 0
    tiny = np.nextafter(0.0, 1.0)
    assert ulp_distance(np.array([-tiny]), np.array([tiny]))[0] == 2
    assert ulp_distance(np.array([1.0]), np.array([1.0 + 4 * np.spacing(1.0)]))[0] == 4


def test_identical_including_nan_bits():
    v = np.linspace(1, 2, S.size)
    v[-1] = np.nan
    r = repeatability([run(v), run(v.copy()), run(v.copy())])
    assert r.verdict == "identical" and r.source is None and r.first_divergent_step is None
    assert "bitwise identical across 3" in r.reason


def test_digest_difference_breaks_identity():
    v = np.ones(S.size)
    r = repeatability([run(v, other_digests={"final_weights": "a"}), run(v, other_digests={"final_weights": "b"})])
    assert r.verdict == "within_tolerance" and r.values_identical and not r.digests_identical
    assert r.source == "numerics"


def test_within_and_out_of_tolerance_with_first_step_and_source():
    v = np.linspace(1, 2, S.size)
    w = v.copy()
    w[3] = np.nextafter(w[3], 10)
    w[6] += 1e-3
    r = repeatability([run(v), run(w)], atol=1e-2)
    assert r.verdict == "within_tolerance" and r.first_divergent_step == 15
    assert r.max_abs_delta == pytest.approx(1e-3) and r.source == "numerics"
    r = repeatability([run(v), run(w)], atol=1e-6, rtol=1e-6)
    assert r.verdict == "out_of_tolerance" and r.first_out_of_tolerance_step == 30
    assert r.max_rel_delta == pytest.approx(1e-3 / abs(v[6]))
    assert "first divergence at step 15" in r.reason


def test_rtol_rule_is_relative_to_reference():
    r = repeatability([run(np.full(S.size, 100.0)), run(np.full(S.size, 101.0))], rtol=0.01)
    assert r.verdict == "within_tolerance"  # |101-100| <= 0.01*100


@pytest.mark.parametrize("kw_a,kw_b,source", [
    ({"fingerprint": {"cuda": "12.1"}}, {"fingerprint": {"cuda": "12.4"}}, "stack"),
    ({"initial_weights": "x"}, {"initial_weights": "y"}, "seeding"),
    ({"data_order": ["e0", "e1", "e2"]}, {"data_order": ["e0", "e1", "zz"]}, "data_order"),
])
def test_source_attribution(kw_a, kw_b, source):
    v = np.ones(S.size)
    w = v.copy()
    w[4] = 2.0
    r = repeatability([run(v, **kw_a), run(w, **kw_b)])
    assert r.source == source and r.verdict == "out_of_tolerance" and r.first_divergent_step == 20
    if source == "data_order":
        assert r.data_order_epoch == 2


def test_inconclusive_and_differing_steps():
    assert repeatability([run(np.ones(S.size))]).verdict == "inconclusive"
    short = RepeatRun(steps=S[:-1], values=np.ones(S.size - 1))
    r = repeatability([run(np.ones(S.size)), short], atol=1.0)
    assert r.verdict == "out_of_tolerance" and not r.steps_identical and r.first_divergent_step == 45


def test_nan_against_number_is_out():
    v = np.ones(S.size)
    w = v.copy()
    w[2] = np.nan
    r = repeatability([run(v), run(w)], atol=10.0)
    assert r.verdict == "out_of_tolerance" and r.max_abs_delta == np.inf


def test_validation():
    with pytest.raises(ValueError):
        repeatability([run(np.ones(S.size))] * 2, atol=-1)


def test_unseeded_initialisation_at_none_without_digests_is_seeding():
    """A script that only logs (no digest) at ``none``: different from its first logged step is
    unseeded initialisation, named as such; a later divergence still reads as numerics."""
    steps = np.arange(5)
    a = RepeatRun(steps=steps, values=np.array([1.0, 0.9, 0.8, 0.7, 0.6]))
    b = RepeatRun(steps=steps, values=np.array([1.1, 0.95, 0.82, 0.71, 0.61]))
    res = repeatability([a, b], determinism="none")
    assert res.source == "seeding" and res.first_divergent_step == 0
    assert "no initial-weight digest" in res.reason and "unseeded initialisation" in res.reason
    # same data at seeded (Steady seeded the code) or without the level: kernels, as before
    assert repeatability([a, b], determinism="seeded").source == "numerics"
    assert repeatability([a, b]).source == "numerics"
    # a first difference later on is not initialisation
    late = RepeatRun(steps=steps, values=np.array([1.0, 0.9, 0.8, 0.7, 0.65]))
    assert repeatability([a, late], determinism="none").source == "numerics"
    # with digests to go on, they decide
    same_init = [RepeatRun(steps=steps, values=r.values, initial_weights="d" * 64) for r in (a, b)]
    assert repeatability(same_init, determinism="none").source == "numerics"
