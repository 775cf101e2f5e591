"""A study's level (``alpha`` in its spec): validated, and read by the decisions it names."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize
import scipy.stats

from tests.api.helpers import spec
from tests.conftest import SQLITE_ONLY

pytestmark = SQLITE_ONLY  # the level is read from the spec, the same on both backends

MARGIN = 0.5
SEEDS = 8  # per stack: above the TOST's small-sample rule (≤ 5 seeds), so the plain Welch TOST decides


@pytest.mark.parametrize("alpha", [0, -0.01, 0.51, 1.0])
def test_alpha_outside_its_range_is_422_naming_the_field(api, alpha):
    r = api.post("/api/v1/studies", json=spec(alpha=alpha))
    assert r.status_code == 422, r.text
    (d,) = r.json()["detail"]
    assert d["loc"] == ["body", "alpha"], d


def _scipy_tost_p(a: np.ndarray, b: np.ndarray, margin: float) -> float:
    """TOST of mean(b) − mean(a) within ±margin: the larger p of SciPy's two one-sided Welch tests."""
    lower = scipy.stats.ttest_ind(b + margin, a, equal_var=False, alternative="greater").pvalue
    upper = scipy.stats.ttest_ind(b - margin, a, equal_var=False, alternative="less").pvalue
    return float(max(lower, upper))


def _finals() -> tuple[np.ndarray, np.ndarray, float]:
    """Two stacks' final values whose TOST p lies between 1% and 5% (the shift solved with SciPy)."""
    rng = np.random.default_rng(46)
    a = rng.normal(1.0, 0.3, SEEDS)
    b0 = rng.normal(1.0, 0.3, SEEDS)
    b0 = b0 - b0.mean() + a.mean()  # no shift, then the shift that puts SciPy's TOST p at 2.5%
    shift = scipy.optimize.brentq(lambda s: _scipy_tost_p(a, b0 + s, MARGIN) - 0.025, 0.0, MARGIN)
    b = b0 + shift
    return a, b, _scipy_tost_p(a, b, MARGIN)


def _portability(api, alpha: float | None) -> dict:
    a, b, _ = _finals()
    body = {"name": "upgrade", "kind": "external", "stacks": [{"name": "old"}, {"name": "new"}],
            "reference_stack": "old", "metrics": [{"name": "loss", "margin": MARGIN}]}
    if alpha is not None:
        body["alpha"] = alpha
    r = api.post("/api/v1/studies", json=body)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    for stack, values in (("old", a), ("new", b)):
        for seed, final in enumerate(values):
            run = {"seed": seed, "determinism": "seeded", "stack": {"name": stack},
                   "metrics": {"loss": {"steps": [0, 1], "values": [2.0, float(final)]}}}
            assert api.post(f"/api/v1/studies/{sid}/runs", json=run).status_code == 201
    report = api.get(f"/api/v1/studies/{sid}/report").json()
    (v,) = [v for v in report["verdicts"] if v["level"] == "stack_portability"]
    return {"report": report, "verdict": v}


def test_the_level_decides_the_tost(api):
    """The same finals, TOST p between 1% and 5% (SciPy's): equivalent at α = 0.05 (and unset, the default), not
    claimed at α = 0.01, where the Welch CI still overlaps the margin (inconclusive); each guarantee states its level."""
    a, b, p = _finals()
    assert 0.01 < p < 0.05
    at5, at1, unset = _portability(api, 0.05), _portability(api, 0.01), _portability(api, None)
    for got in (at5, at1, unset):
        assert got["verdict"]["result"]["tost"]["p_value"] == pytest.approx(p, rel=1e-9)
    assert at5["verdict"]["verdict"] == unset["verdict"]["verdict"] == "equivalent"
    assert at1["verdict"]["verdict"] == "inconclusive"
    assert at5["report"]["options"]["alpha"] == unset["report"]["options"]["alpha"] == 0.05
    assert at1["report"]["options"]["alpha"] == 0.01
    assert "≤ 1%" in at1["verdict"]["guarantee"] and "≤ 5%" in at5["verdict"]["guarantee"]
    # at 0.01 the (1 − 0.01) Welch CI of the difference, from SciPy's t quantile, reaches past the margin
    d = b.mean() - a.mean()
    se = np.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size)
    df = se**4 / ((a.var(ddof=1) / a.size) ** 2 / (a.size - 1) + (b.var(ddof=1) / b.size) ** 2 / (b.size - 1))
    assert d + scipy.stats.t.ppf(1 - 0.01, df) * se > MARGIN > d + scipy.stats.t.ppf(1 - 0.05, df) * se
    # the reported interval of the difference is the (1 − α) Welch CI at the study's level
    for got, alpha in ((at1, 0.01), (at5, 0.05)):
        r = got["verdict"]["result"]
        assert (r["diff_ci_low"], r["diff_ci_high"]) == pytest.approx(
            (d - scipy.stats.t.ppf(1 - alpha / 2, df) * se, d + scipy.stats.t.ppf(1 - alpha / 2, df) * se), rel=1e-9)


def _step_times() -> dict[str, np.ndarray]:
    """Per-run step times (each run's steps all equal, so its median is that value) of two levels."""
    rng = np.random.default_rng(460)
    return {"seeded": np.exp(rng.normal(0.0, 0.05, SEEDS)), "strict": np.exp(rng.normal(0.25, 0.05, SEEDS))}


def _cost(api, alpha: float | None, budget: float) -> tuple[dict, dict]:
    body = {"name": "cost", "kind": "external", "determinism": ["seeded", "strict"], "cost_budget": budget,
            "metrics": ["loss"]}
    if alpha is not None:
        body["alpha"] = alpha
    r = api.post("/api/v1/studies", json=body)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    for level, times in _step_times().items():
        for seed, t in enumerate(times):
            run = {"seed": seed, "determinism": level, "stack": {"name": "a100"},
                   "metrics": {"loss": {"steps": list(range(10)), "values": [1.0] * 10},
                               "step_time": {"steps": list(range(10)), "values": [float(t)] * 10}}}
            assert api.post(f"/api/v1/studies/{sid}/runs", json=run).status_code == 201
    report = api.get(f"/api/v1/studies/{sid}/report").json()
    (c,) = [c for c in report["determinism_cost"] if (c["numerator"], c["denominator"]) == ("strict", "seeded")]
    return report, c


def test_the_level_decides_the_cost_check(api):
    """The cost check's CI is at 1 − α (unset: at the spec's confidence, 95%): a budget between the 95% and the 99%
    upper ends of SciPy's Welch interval of the log ratio passes at α = 0.05 and is inconclusive at α = 0.01."""
    times = _step_times()
    x, y = np.log(times["strict"]), np.log(times["seeded"])
    ci = {a: scipy.stats.ttest_ind(x, y, equal_var=False).confidence_interval(confidence_level=1 - a)
          for a in (0.05, 0.01)}
    budget = float(np.exp((ci[0.05].high + ci[0.01].high) / 2))
    unset, at5, at1 = _cost(api, None, budget), _cost(api, 0.05, budget), _cost(api, 0.01, budget)
    for (_, c), a in ((unset, 0.05), (at5, 0.05), (at1, 0.01)):
        assert c["confidence"] == pytest.approx(1 - a)
        assert (c["ci_low"], c["ci_high"]) == pytest.approx((np.exp(ci[a].low), np.exp(ci[a].high)), rel=1e-9)
    assert unset[1]["verdict"] == at5[1]["verdict"] == "pass" and at1[1]["verdict"] == "inconclusive"
    assert at1[1]["guarantee"].startswith("99% CI; false 'fail' ≤ 0.5%, false 'pass' ≤ 0.5%")
    assert at5[1]["guarantee"].startswith("95% CI; false 'fail' ≤ 2.5%, false 'pass' ≤ 2.5%")


def _seed_study(api, alpha: float, max_std: float) -> dict:
    r = api.post("/api/v1/studies", json={"name": "seeds", "kind": "external", "alpha": alpha,
                                          "metrics": [{"name": "loss", "max_std": max_std}]})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    for seed, final in enumerate(_seed_finals()):
        run = {"seed": seed, "determinism": "seeded", "stack": {"name": "a100"},
               "metrics": {"loss": {"steps": [0, 1], "values": [2.0, float(final)]}}}
        assert api.post(f"/api/v1/studies/{sid}/runs", json=run).status_code == 201
    (v,) = [v for v in api.get(f"/api/v1/studies/{sid}/report").json()["verdicts"] if v["level"] == "seed_stability"]
    return v


def _seed_finals() -> np.ndarray:
    return 1.0 + np.random.default_rng(4646).standard_normal(12)


def test_the_level_decides_seed_stability(api):
    """The σ bounds are at the study's level (the normal-theory part against SciPy's χ² quantiles), and a limit
    between the decision's lower bounds at 0.05 and at 0.01 is exceeded at 0.05 and not shown at 0.01."""
    x = _seed_finals()
    n, s = x.size, float(x.std(ddof=1))
    bounds = {}
    for alpha in (0.05, 0.01):
        v = _seed_study(api, alpha, 1e-3)
        chi2 = v["spread"]["std_bounds"]
        assert chi2["alpha"] == alpha
        assert chi2["lower"] == pytest.approx(s * np.sqrt((n - 1) / scipy.stats.chi2.ppf(1 - alpha, n - 1)), rel=1e-9)
        assert chi2["upper"] == pytest.approx(s * np.sqrt((n - 1) / scipy.stats.chi2.ppf(alpha, n - 1)), rel=1e-9)
        bounds[alpha] = v["spread"]["decision_bounds"]["lower"]
    assert bounds[0.01] < bounds[0.05]
    limit = (bounds[0.01] + bounds[0.05]) / 2
    at5, at1 = _seed_study(api, 0.05, limit), _seed_study(api, 0.01, limit)
    assert (at5["verdict"], at1["verdict"]) == ("unstable", "inconclusive")
    assert "above it with 95% confidence" in at5["summary"] and "≤ 1%" in at1["guarantee"]
