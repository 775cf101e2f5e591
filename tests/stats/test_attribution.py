"""Source attribution: the same-seed comparison across stacks, and its calibration when sources overlap."""

from __future__ import annotations

import numpy as np
import pytest

from steady.server.stats.calibration import measure
from steady.server.stats.calibration.attribution import (ATTRIBUTION, PRECEDENCE, attribution_rate, expected_source,
                                               simulate_pair)
from steady.server.stats.repeatability import RepeatRun
from steady.server.stats.report import MetricSpec, RunData, build_report
from steady.server.stats.stack_pairs import stack_pairs


def _run(values, fp=None, init="w0", order=("o0",)):
    values = np.asarray(values, dtype=np.float64)
    return RepeatRun(steps=np.arange(values.size), values=values, fingerprint=fp or {}, initial_weights=init,
                     data_order=order)


def test_stack_pairs_names_stack_when_fingerprints_differ_and_gives_the_size():
    a = _run([1.0, 0.5, 0.25], {"numpy_version": "2.4.6"})
    b = _run([1.0, 0.5, 0.25 + 1e-6], {"numpy_version": "2.0.2"})
    p = stack_pairs({0: (a, b), 1: (a, a)})
    assert (p.n_pairs, p.verdict, p.source, p.worst_seed, p.first_divergent_step) == (2, "out_of_tolerance", "stack", 0, 2)
    assert p.max_abs_delta == pytest.approx(1e-6)
    same_stack = stack_pairs({0: (a, _run([1.0, 0.5, 0.3], {"numpy_version": "2.4.6"}, init="w1"))})
    assert same_stack.source == "seeding"  # two labels, one stack: the digests decide
    assert stack_pairs({}).verdict == "inconclusive"
    assert stack_pairs({0: (a, a)}).verdict == "identical"


def test_portability_verdict_carries_the_same_seed_comparison():
    runs = []
    for stack, fp, bump in (("a", {"threads": 1}, 0.0), ("b", {"threads": 2}, 1e-7)):
        for seed in (0, 1, 2):
            v = np.array([2.0, 1.0, 0.5 + seed * 0.01]) + np.array([0, bump, bump])
            runs.append(RunData(run_id=len(runs) + 1, seed=seed, repeat=0, determinism="seeded", stack=stack,
                                fingerprint=fp, digests={"initial_weights": f"w{seed}"},
                                series={"loss": (np.arange(3), v)}))
    rep = build_report(runs, [MetricSpec("loss", margin=0.05)], rng=np.random.default_rng(0)).to_dict()
    (v,) = [x for x in rep["verdicts"] if x["level"] == "stack_portability"]
    assert v["same_seed"]["source"] == "stack" and v["same_seed"]["first_divergent_step"] == 1
    assert v["same_seed"]["n_pairs"] == 3 and v["same_seed"]["max_abs_delta"] == pytest.approx(1e-7, rel=1e-6)
    assert "same seed on both stacks: source stack, first divergence at step 1" in v["reason"]


def test_expected_source_is_the_first_cause():
    assert expected_source(["numerics", "data_order"]) == "data_order"
    assert expected_source(["numerics", "seeding", "stack"]) == "stack"
    assert expected_source([]) is None
    with pytest.raises(ValueError):
        expected_source(["dropout"])


def test_simulated_pairs_differ_only_by_what_was_planted():
    rng = np.random.default_rng(1)
    a, b = simulate_pair(("data_order",), rng)
    assert a.initial_weights == b.initial_weights and a.fingerprint == b.fingerprint
    assert a.data_order != b.data_order
    a, b = simulate_pair((), rng)
    assert np.array_equal(a.values, b.values)


def test_attribution_calibration_alone_and_overlapping():
    rng = np.random.default_rng(2024)
    rates = {s.name: measure(ATTRIBUTION, s, n=40, rng=rng) for s in ATTRIBUTION.scenarios}
    assert len(rates) == 1 + 15  # nothing planted, and every non-empty set of the four sources
    assert rates["nothing planted"].k == 0
    for name, rate in rates.items():
        planted = name.split("+")
        if name == "nothing planted" or planted == ["numerics"]:
            continue
        assert rate.k == rate.n, f"{name}: {rate.k}/{rate.n} named {expected_source(planted)}"
    # a numerical difference alone can round away in float32: most, not all, are caught
    assert 0.5 < rates["numerics"].rate <= 1.0


def test_attribution_rate_of_real_controls():
    rate = attribution_rate([(["seeding"], "seeding"), (["data_order", "numerics"], "data_order"),
                             (["stack"], "numerics")])
    assert (rate.k, rate.n) == (2, 3) and rate.low < 2 / 3 < rate.high
    assert set(PRECEDENCE) == {"stack", "seeding", "data_order", "numerics"}
