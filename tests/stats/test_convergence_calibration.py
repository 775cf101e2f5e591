"""Calibration of the convergence check (steady.server.stats.calibration.rules_convergence): bounded simulation
counts with fixed seeds; each healthy scenario stays within its nominal 5% beyond simulation error
(exact one-sided binomial test at 1%), and the planted one has power."""
from __future__ import annotations

import numpy as np
import pytest

from steady.server.stats.calibration import exceeds_nominal, measure
from steady.server.stats.calibration.rules import rule_by_name

RULE = rule_by_name("convergence.rcp_fail")
HEALTHY = [s for s in RULE.scenarios if s.kind == "healthy"]


@pytest.mark.parametrize("scenario", HEALTHY, ids=[s.name for s in HEALTHY])
def test_healthy_false_fail_rate_within_nominal(scenario):
    rate = measure(RULE, scenario, n=600, rng=np.random.default_rng(20261129))
    assert not exceeds_nominal(rate), f"{scenario.name}: {rate.k}/{rate.n} > nominal {RULE.nominal}"


def test_an_eight_percent_faster_candidate_is_caught():
    (planted,) = [s for s in RULE.scenarios if s.kind == "planted"]
    rate = measure(RULE, planted, n=300, rng=np.random.default_rng(3))
    assert rate.low > 0.8, rate
