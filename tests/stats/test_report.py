import ast
import dataclasses
import json
import pathlib

import numpy as np
import pytest

from steady.server.stats.report import MetricSpec, RunData, build_report, compute_bands

STEPS = np.arange(0, 300, 3, dtype=np.int64)


def _digests(seed, epochs=3):
    return {"initial_weights": f"w{seed}", "data_order": [f"d{seed}-{e}" for e in range(epochs)],
            "final_weights": None, "optimizer_state": None}


def make_runs(seed=0):
    """strict: bitwise repeats; none: numerics noise; two stacks; one diverged run."""
    rng = np.random.default_rng(seed)
    runs, rid = [], 0
    for stack, shift in (("torch2.3-cu121", 0.0), ("torch2.4-cu124", 0.002)):
        for det in ("none", "strict"):
            for s in range(8):
                base = 1.0 / (1 + STEPS / 50) + rng.normal(0, 0.01) + shift
                for rep in range(3):
                    v = base + (rng.normal(0, 1e-7, STEPS.size) if det == "none" else 0.0)
                    if stack.startswith("torch2.3") and det == "none" and s == 7 and rep == 0:
                        v = v.copy()
                        v[40:] = np.inf
                    t = rng.gamma(50, (0.013 if det == "strict" else 0.01) / 50, STEPS.size)
                    runs.append(RunData(run_id=rid, seed=s, repeat=rep, determinism=det, stack=stack,
                                        fingerprint={"cuda": stack[-5:]}, digests=_digests(s), status="succeeded",
                                        series={"loss": (STEPS, np.asarray(v, dtype=np.float64)),
                                                "step_time": (STEPS, t)}))
                    rid += 1
    return runs


RUNS = make_runs()
METRICS = [MetricSpec("loss", atol=1e-5, max_std=0.05, margin=0.02)]


@pytest.fixture(scope="module")
def report():
    return build_report(RUNS, METRICS, rng=np.random.default_rng(0)).to_dict()


def _find(report, level, **group):
    return [v for v in report["verdicts"] if v["level"] == level
            and all(v["group"].get(k) == val for k, val in group.items())]


def test_report_is_json_safe_and_has_required_fields(report):
    json.dumps(report, allow_nan=False)
    for v in report["verdicts"]:
        assert {"level", "metric", "group", "verdict", "n_runs", "reason"} <= set(v)
        assert isinstance(v["reason"], str) and "\n" not in v["reason"]
    assert {"variance_by_source", "determinism_cost", "diverged"} <= set(report)


def test_repeatability_verdicts(report):
    strict = _find(report, "repeatability", determinism="strict", stack="torch2.3-cu121")[0]
    assert strict["verdict"] == "identical" and strict["n_runs"] == 24
    assert len(strict["per_seed"]) == 8
    none = _find(report, "repeatability", determinism="none", stack="torch2.4-cu124")[0]
    assert none["verdict"] == "within_tolerance" and none["source"] == "numerics"
    assert none["first_divergent_step"] == 0 and 0 < none["max_abs_delta"] < 1e-5
    diverged = _find(report, "repeatability", determinism="none", stack="torch2.3-cu121")[0]
    assert diverged["verdict"] == "out_of_tolerance" and diverged["worst_seed"] == 7
    assert diverged["max_abs_delta"] == "Infinity"


def test_seed_stability_and_divergence(report):
    v = _find(report, "seed_stability", determinism="none", stack="torch2.3-cu121")[0]
    # a diverged seed counts against stability (issue #10: diverged runs used to be ignored)
    assert v["verdict"] == "unstable" and v["spread"]["n"] == 7 and v["diverged_run_ids"]
    assert "1 of 8 seeds diverged" in v["reason"] and "one run per seed" in v["reason"]
    assert v["spread"]["n_diverged"] == 1 and v["guarantee"]
    ok = _find(report, "seed_stability", determinism="none", stack="torch2.4-cu124")[0]
    assert ok["verdict"] == "stable" and ok["final_step"] == int(STEPS[-1]) and ok["short_run_ids"] == []
    assert report["diverged"] == [{"run_id": v["diverged_run_ids"][0], "metric": "loss", "step": 120,
                                   "determinism": "none", "stack": "torch2.3-cu121", "seed": 7}]


def test_portability_verdicts_adjusted(report):
    port = _find(report, "stack_portability")
    assert len(port) == 2
    for v in port:
        assert v["group"]["reference_stack"] == "torch2.3-cu121"
        assert v["adjust_method"] == "holm" and v["n_comparisons_tost"] == 2
        assert v["tost_p_adjusted"] >= v["result"]["tost"]["p_value"]
        assert v["verdict"] == "equivalent"
        assert v["band_containment"] == pytest.approx(1.0)


def test_not_equivalent_when_difference_exceeds_margin():
    runs = [r for r in RUNS if r.determinism == "strict"]
    rep = build_report(runs, [MetricSpec("loss", margin=0.0005)], rng=np.random.default_rng(0)).to_dict()
    (v,) = _find(rep, "stack_portability")
    # Δ 0.002 against a seed spread of 0.01, 8 seeds per stack: the CI covers the margin, so neither claim is made
    assert v["verdict"] == "inconclusive", v["reason"]
    assert v["result"]["diff_ci_low"] < 0.0005 < v["result"]["diff_ci_high"]
    shifted = [dataclasses.replace(r, series={**r.series, "loss": (r.series["loss"][0], r.series["loss"][1] + 0.05)})
               if r.stack == "torch2.4-cu124" else r for r in runs]
    far = build_report(shifted, [MetricSpec("loss", margin=0.0005)], rng=np.random.default_rng(0)).to_dict()
    (v,) = _find(far, "stack_portability")
    assert v["verdict"] == "not_equivalent", v["reason"]  # Δ 0.052, 5 seed spreads: the CI is beyond the margin
    assert v["result"]["diff_ci_low"] > 0.0005
    few = build_report([r for r in runs if r.seed < 1], [MetricSpec("loss", margin=0.02)],
                       rng=np.random.default_rng(0)).to_dict()
    assert _find(few, "stack_portability")[0]["verdict"] == "inconclusive"


def test_variance_and_cost_sections(report):
    vs = {(e["group"]["determinism"], e["group"]["stack"]): e for e in report["variance_by_source"]}
    strict = vs[("strict", "torch2.3-cu121")]
    assert strict["available"] and strict["components"]["within"] == 0.0
    assert strict["components"]["share_between"] == pytest.approx(1.0)
    cost = [c for c in report["determinism_cost"] if c["stack"] == "torch2.3-cu121"]
    assert [(c["numerator"], c["denominator"]) for c in cost] == [("strict", "none")]
    assert cost[0]["ci_low"] < 1.3 < cost[0]["ci_high"]


def test_report_rng_controls_output():
    a = build_report(RUNS, METRICS, rng=np.random.default_rng(1)).to_dict()
    b = build_report(RUNS, METRICS, rng=np.random.default_rng(1)).to_dict()
    c = build_report(RUNS, METRICS, rng=np.random.default_rng(2)).to_dict()
    assert a == b and a != c


def test_report_validation():
    with pytest.raises(ValueError, match="Generator"):
        build_report(RUNS, METRICS, rng=None)
    bad = RunData(run_id=0, seed=0, repeat=0, determinism="max", stack="x")
    with pytest.raises(ValueError, match="determinism"):
        build_report([bad], METRICS, rng=np.random.default_rng(0))


def test_compute_bands_downsampled_json():
    bands = compute_bands(RUNS, metric="loss", max_points=20)
    assert len(bands) == 4
    d = bands[0].to_dict()
    json.dumps(d, allow_nan=False)
    assert d["one_run_per_seed"] and d["downsampled"] and len(d["steps"]) <= 20
    assert d["excluded_run_ids"] and all(n == 7 for n in d["n"])
    assert set(d["quantiles"]) == {"0.05", "0.25", "0.5", "0.75", "0.95"}
    full = compute_bands(RUNS, metric="loss")[0].band
    assert min(d["min"]) == pytest.approx(np.min(full.min)) and max(d["max"]) == pytest.approx(np.max(full.max))


ALLOWED = {"numpy", "scipy", "__future__", "dataclasses", "functools", "collections", "math", "typing",
           "hashlib", "json"}  # the standard library's pure parts: no I/O, no clock, no framework


def test_stats_core_imports_only_numpy_scipy_and_itself():
    root = pathlib.Path(__file__).resolve().parents[2] / "app" / "stats"
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            for name in names:
                assert name.split(".")[0] in ALLOWED or name.startswith("steady.server.stats"), f"{path.name} imports {name}"


def _final_runs(values_by_stack):
    runs, rid = [], 0
    for stack, values in values_by_stack.items():
        for seed, v in enumerate(values):
            runs.append(RunData(run_id=rid, seed=seed, repeat=0, determinism="seeded", stack=stack,
                                series={"acc": (np.array([0, 1]), np.array([0.0, v]))}))
            rid += 1
    return runs


def test_portability_rule_not_equivalent_and_no_margin():
    ref = [0.90, 0.91, 0.92, 0.90, 0.91, 0.92]
    far = [0.80, 0.81, 0.82, 0.80, 0.81, 0.82]
    runs = _final_runs({"ref": ref, "cand": far})
    rep = build_report(runs, [MetricSpec("acc", margin=0.02)], rng=np.random.default_rng(0),
                       reference_stack="ref").to_dict()
    (v,) = _find(rep, "stack_portability")
    assert v["verdict"] == "not_equivalent" and "outside ±0.02" in v["reason"]
    rep = build_report(runs, [MetricSpec("acc")], rng=np.random.default_rng(0), reference_stack="ref").to_dict()
    (v,) = _find(rep, "stack_portability")
    assert v["verdict"] == "not_equivalent" and "no margin" in v["reason"]
    same = _final_runs({"ref": ref, "cand": [x + 0.001 for x in ref]})
    rep = build_report(same, [MetricSpec("acc")], rng=np.random.default_rng(0), reference_stack="ref").to_dict()
    assert _find(rep, "stack_portability")[0]["verdict"] == "inconclusive"
    rep = build_report(same, [MetricSpec("acc", margin=0.02)], rng=np.random.default_rng(0),
                       reference_stack="ref", adjust_method="bh").to_dict()
    (v,) = _find(rep, "stack_portability")
    assert v["verdict"] == "equivalent" and v["adjust_method"] == "bh"


def test_bands_pick_first_repeat_that_logged_the_metric_and_handle_empty_input():
    s = np.arange(4)
    runs = [RunData(0, 0, 0, "none", "a", series={"other": (s, np.ones(4))}),
            RunData(1, 0, 1, "none", "a", series={"loss": (s, np.ones(4))}),
            RunData(2, 1, 0, "none", "a", series={"loss": (s, np.full(4, 3.0))})]
    (b,) = compute_bands(runs, metric="loss")
    assert b.run_ids == (1, 2) and not b.one_run_per_seed
    assert b.band.mean.tolist() == [2.0] * 4
    assert build_report([], METRICS, rng=np.random.default_rng(0)).to_dict()["verdicts"] == []
