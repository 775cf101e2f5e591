"""Per-level expectations of the headline, and ULPs counted in the logged dtype."""
import numpy as np
import pytest

from steady.server.stats.expectations import (
    BUILTIN,
    SEEDS_IDENTICAL,
    SeedRoute,
    repeatability_expectation,
)
from steady.server.stats.repeatability import RepeatRun, repeatability, ulp_distance
from steady.server.stats.report import MetricSpec, RunData, build_report


@pytest.mark.parametrize("det,verdict,source,met", [
    ("strict", "identical", None, True),
    ("strict", "within_tolerance", "numerics", False),
    ("seeded", "identical", None, True),
    ("seeded", "within_tolerance", "numerics", True),
    ("seeded", "within_tolerance", "data_order", False),
    ("seeded", "out_of_tolerance", "numerics", True),  # the kernel workload at seeded: what strict is for
    ("seeded", "out_of_tolerance", "seeding", False),
    ("none", "out_of_tolerance", "seeding", True),
    ("none", "within_tolerance", "numerics", True),
    ("none", "identical", None, False),
    ("none", "inconclusive", None, None),
])
def test_expectation_per_level(det, verdict, source, met):
    assert repeatability_expectation(det, verdict, source=source).met is met


def test_a_repeat_that_diverged_at_seeded_misses_the_expectation():
    assert repeatability_expectation("seeded", "out_of_tolerance", source="numerics", deltas_finite=False).met is False


def test_identical_repeats_never_claim_the_seed_is_ignored():
    """A built-in fixed a seed at none: the expectation is missed, but nothing says "ignores the seed"."""
    e = repeatability_expectation("none", "identical")
    assert e.met is False and e.suspicious == () and "ignore" not in e.phrase
    e = repeatability_expectation("seeded", "identical", seeds_identical=True)
    assert e.met is True and SEEDS_IDENTICAL in e.suspicious  # noted; the seed-stability row fails it


COMMAND_WITH_SEED, COMMAND_WITHOUT_SEED = SeedRoute("command", True), SeedRoute("command", False)
ENTRYPOINT = SeedRoute("entrypoint", True)


@pytest.mark.parametrize("route", [COMMAND_WITH_SEED, COMMAND_WITHOUT_SEED, ENTRYPOINT])
@pytest.mark.parametrize("verdict", ["identical", "within_tolerance", "out_of_tolerance"])
def test_user_code_at_none_has_no_expectation_a_correct_script_can_miss(route, verdict):
    """A script that seeds itself from {seed} / ctx.seed is identical at none; one that does not varies:
    both are what none means for user code."""
    e = repeatability_expectation("none", verdict, route=route)
    assert e.met is True and e.suspicious == ()
    assert "seeds itself" in e.expected or "fixes its own" in e.expected


@pytest.mark.parametrize("route,det,reaches", [
    (BUILTIN, "none", False), (BUILTIN, "seeded", True), (COMMAND_WITHOUT_SEED, "none", False),
    (COMMAND_WITHOUT_SEED, "strict", True), (COMMAND_WITH_SEED, "none", True), (ENTRYPOINT, "none", True),
])
def test_seeds_identical_is_evidence_only_where_the_seed_reached_the_code(route, det, reaches):
    e = repeatability_expectation(det, "identical", seeds_identical=True, route=route)
    assert (SEEDS_IDENTICAL in e.suspicious) is reaches


def _run(i, seed, repeat, det, values, dtype=None):
    v = np.asarray(values, np.float64)
    return RunData(run_id=i, seed=seed, repeat=repeat, determinism=det, stack="cpu",
                   series={"loss": (np.arange(v.size), v)}, dtypes={"loss": dtype} if dtype else {})


def _study(ignore_seed: bool, route: SeedRoute = BUILTIN):
    """Two seeds × two repeats at each level; `none` varies unless the code ignores the seed."""
    rng = np.random.default_rng(0)
    runs, i = [], 0
    base = {s: np.linspace(2, 1, 20) + 0.1 * s for s in (1, 2)}
    for det in ("none", "seeded", "strict"):
        for seed in (1, 2):
            for rep in (0, 1):
                i += 1
                v = base[1 if ignore_seed else seed].copy()
                if det == "none" and not ignore_seed:
                    v = v + rng.normal(0, 1e-3, v.size)
                runs.append(_run(i, seed, rep, det, v))
    return build_report(runs, [MetricSpec("loss")], rng=np.random.default_rng(1), route=route).to_dict()


def test_demo_like_study_meets_every_expectation():
    rep = _study(ignore_seed=False)
    assert [h["determinism"] for h in rep["headline"]] == ["strict", "seeded", "none"]
    assert all(h["met"] is True and not h["suspicious"] for h in rep["headline"])
    none = next(v for v in rep["variance_by_source"] if v["group"]["determinism"] == "none")
    assert none["between_seed_applies"] is False


def test_code_ignoring_the_seed_fails_seed_stability_not_the_repeats():
    """A command that receives {seed} and ignores it: identical at every level. Its repeats meet every
    expectation (at none the code may seed itself); runs of different seeds being identical is the
    evidence, and the seed-stability row fails with it at every level."""
    rep = _study(ignore_seed=True, route=COMMAND_WITH_SEED)
    by = {h["determinism"]: h for h in rep["headline"]}
    assert all(h["met"] is True for h in by.values())
    assert all(SEEDS_IDENTICAL in h["suspicious"] for h in by.values())
    seeds = {v["group"]["determinism"]: v for v in rep["verdicts"] if v["level"] == "seed_stability"}
    assert {d: v["verdict"] for d, v in seeds.items()} == dict.fromkeys(("none", "seeded", "strict"),
                                                                      "seed_has_no_effect")
    assert all(v["summary"].startswith("the seed has no effect") for v in seeds.values())
    # a built-in at none was not given the seed: the same runs are repeats there, not evidence
    rep = _study(ignore_seed=True)
    seeds = {v["group"]["determinism"]: v for v in rep["verdicts"] if v["level"] == "seed_stability"}
    assert seeds["none"]["verdict"] == "inconclusive" and seeds["seeded"]["verdict"] == "seed_has_no_effect"
    assert "does not reach the code" in seeds["none"]["reason"]


def test_float32_ulps_match_nextafter():
    x = np.float32(0.3)
    up = np.nextafter(x, np.float32(1))
    assert up - x == np.spacing(x)
    assert ulp_distance(float(x), float(up), "float32") == 1
    assert ulp_distance(float(x), float(up)) == 2**29  # the float64 count the issue complained about
    three = np.nextafter(np.nextafter(up, np.float32(1)), np.float32(1))
    assert ulp_distance(float(three), float(x), "float32") == 3
    assert ulp_distance(float(np.float32(-0.0)), 0.0, "float32") == 0
    lo = -np.float32(1e-45)  # across zero: -min subnormal to +min subnormal is 2 ULPs
    assert ulp_distance(float(lo), float(-lo), "float32") == 2


def test_repeatability_counts_ulps_in_the_series_dtype():
    x = np.float32(0.3)
    a = np.array([1.0, float(x)])
    b = np.array([1.0, float(np.nextafter(x, np.float32(1)))])
    runs = [RepeatRun(np.arange(2), a, dtype="float32"), RepeatRun(np.arange(2), b, dtype="float32")]
    r = repeatability(runs)
    assert r.max_ulps == 1 and r.dtype == "float32" and "1 float32 ULPs" in r.reason
    rep = build_report([_run(1, 0, 0, "seeded", a, "float32"), _run(2, 0, 1, "seeded", b, "float32")],
                       [MetricSpec("loss")], rng=np.random.default_rng(0)).to_dict()
    v = rep["verdicts"][0]
    assert v["max_ulps"] == 1 and v["dtype"] == "float32"


def test_nan_case_does_not_claim_zero_ulps():
    runs = [RepeatRun(np.arange(2), np.array([1.0, 2.0])), RepeatRun(np.arange(2), np.array([1.0, np.nan]))]
    r = repeatability(runs)
    assert "non-finite in one repeat" in r.reason and "max |Δ| inf, 0 ULPs" not in r.reason


def test_sdk_records_the_logged_dtype():
    from steady.worker.inrun.sdk import float_dtype

    assert float_dtype(1.0) == "float64" and float_dtype(3) == "float64"
    assert float_dtype(np.float32(1)) == "float32" and float_dtype(np.array(1, np.float16)) == "float16"
    torch = pytest.importorskip("torch")
    assert float_dtype(torch.tensor(1.0)) == "float32"
    assert float_dtype(torch.tensor(1.0, dtype=torch.bfloat16)) == "bfloat16"
