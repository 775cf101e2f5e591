"""Calibration scenarios: convergence against a reference (``steady.server.stats.convergence``, MLPerf RCP).

Rule ``convergence.rcp_fail`` — the check's verdict is ``fail`` (the candidate converges
significantly faster than the reference). Healthy: the candidate's runs are drawn from the
reference's own distribution of steps to target, so a ``fail`` is a false alarm; nominal α = 5%.
The reference is formed from 20 runs (``reference_from_runs``, Yuen's σ), the candidate has 10
(or 5) runs; steps to target are normal, lognormal, heavy-tailed (Student t, 3 and 2 degrees of
freedom) or quantised to an evaluation every 50 steps. Stress (published, not asserted): the
checker's own σ (``std_method="mlperf"``: numpy.std of the trimmed runs), and runs that each
fail to converge with probability 5%. Planted: the candidate is 8% faster (power).
"""
from __future__ import annotations

import math
from functools import partial

import numpy as np

from steady.server.stats.calibration import Rule, Scenario
from steady.server.stats.convergence import (
    check_convergence,
    convergence_guarantee,
    reference_from_runs,
)

__all__ = ["RULES", "draw_steps"]

MEAN, SD = 20_000.0, 1_000.0  # steps to target: a 5% run-to-run spread


def draw_steps(rng: np.random.Generator, n: int, *, shape: str, speed: float = 1.0,
               never_p: float = 0.0) -> np.ndarray:
    """``n`` runs' steps to target with mean ≈ ``MEAN / speed`` and spread ≈ ``SD / speed``."""
    if shape == "normal":
        x = MEAN + SD * rng.standard_normal(n)
    elif shape == "lognormal":
        x = MEAN * np.exp(SD / MEAN * rng.standard_normal(n))
    elif shape in ("t3", "t2"):
        x = MEAN + SD / math.sqrt(3.0) * rng.standard_t(int(shape[1]), n)
    elif shape == "quantised":
        x = np.ceil((MEAN + SD * rng.standard_normal(n)) / 50.0) * 50.0  # an evaluation every 50 steps
    else:
        raise ValueError(f"unknown shape {shape!r}")
    x = np.maximum(x, 1.0) / speed
    if never_p:
        x[rng.random(n) < never_p] = math.inf
    return x


def _fails(rng: np.random.Generator, *, shape: str, n_ref: int = 20, n_cand: int = 10, speed: float = 1.0,
           std_method: str = "yuen", never_p: float = 0.0) -> bool:
    ref = draw_steps(rng, n_ref, shape=shape)  # a reference whose runs all converged
    point = reference_from_runs(ref, std_method=std_method)
    cand = draw_steps(rng, n_cand, shape=shape, speed=speed, never_p=never_p)
    return check_convergence(cand, point).verdict == "fail"


def _s(name, kind, description, **kw) -> Scenario:
    return Scenario(name=name, kind=kind, description=description, trial=partial(_fails, **kw))


RULES: list[Rule] = [
    Rule(
        name="convergence.rcp_fail",
        nominal=0.05,
        guarantee=convergence_guarantee(0.05),
        scenarios=(
            _s("same_normal_20v10", "healthy", "candidate from the reference's distribution (normal), 20 vs 10 runs",
               shape="normal"),
            _s("same_lognormal_20v10", "healthy", "same, lognormal steps to target", shape="lognormal"),
            _s("same_t3_20v10", "healthy", "same, heavy tails (Student t, 3 df)", shape="t3"),
            _s("same_t2_20v10", "healthy", "same, heavier tails (Student t, 2 df: infinite variance)", shape="t2"),
            _s("same_quantised_20v10", "healthy", "same, evaluated every 50 steps (ties)", shape="quantised"),
            _s("same_normal_20v5", "healthy", "same (normal), only 5 candidate runs", shape="normal", n_cand=5),
            _s("mlperf_sigma_20v10", "stress", "the checker's own σ (numpy.std of the trimmed runs) from 20 runs",
               shape="normal", std_method="mlperf"),
            _s("never_converges_5pct", "stress", "each candidate run never converges with probability 5%",
               shape="normal", never_p=0.05),
            _s("faster_8pct_20v10", "planted", "candidate 8% faster than the reference, 20 vs 10 runs",
               shape="normal", speed=1.08),
        ),
    ),
]
