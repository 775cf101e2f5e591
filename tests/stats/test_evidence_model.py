"""One model of what varied: the repeatability table, its expectations, the plain first lines, the
seed-stability verdicts and the variance by source of one report read the same evidence, so no two of
them contradict each other."""
import numpy as np

from steady.server.stats.expectations import BUILTIN, SeedRoute
from steady.server.stats.report import MetricSpec, RunData, build_report

COMMAND_WITH_SEED = SeedRoute("command", True)


def _runs(*, seeded_by_code: bool, levels=("none", "seeded")):
    """Three seeds × two repeats per level. ``seeded_by_code``: the code draws from the seed it receives,
    so repeats of a seed are bitwise equal and seeds differ; else every run draws fresh noise."""
    fresh = np.random.default_rng(7)
    runs, i = [], 0
    for det in levels:
        for seed in (1, 2, 3):
            for rep in (0, 1):
                i += 1
                rng = np.random.default_rng(seed) if seeded_by_code else fresh
                v = np.linspace(2.0, 1.0, 10) + rng.normal(0, 0.05, 10)
                runs.append(RunData(run_id=i, seed=seed, repeat=rep, determinism=det, stack="cpu",
                                    series={"loss": (np.arange(10), v)}))
    return runs


def _report(runs, route):
    return build_report(runs, [MetricSpec("loss", max_std=1.0)], rng=np.random.default_rng(1), route=route).to_dict()


def _sentences(rep: dict) -> str:
    out = []

    def walk(x):
        if isinstance(x, str):
            out.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
    walk(rep)
    return "\n".join(out)


def test_a_command_with_seed_at_none_whose_repeats_are_identical_within_each_seed():
    """{seed} at none, every repeat bitwise equal within its seed, seeds different: all of the variance is
    between seeds. The variance by source says so; nothing in the report says it is run to run."""
    rep = _report(_runs(seeded_by_code=True), COMMAND_WITH_SEED)
    rows = {v["group"]["determinism"]: v for v in rep["verdicts"] if v["level"] == "repeatability"}
    assert rows["none"]["verdict"] == "identical" and rows["none"]["met_expectation"] is True
    var = {e["group"]["determinism"]: e for e in rep["variance_by_source"]}
    assert var["none"]["between_seed_applies"] is True, var["none"]
    assert var["none"]["components"]["within"] == 0.0 and var["none"]["components"]["share_between"] == 1.0
    assert "note" not in var["none"]
    seeds = {v["group"]["determinism"]: v for v in rep["verdicts"] if v["level"] == "seed_stability"}
    assert seeds["none"]["verdict"] != "seed_has_no_effect", seeds["none"]
    text = _sentences(rep)
    for contradiction in ("run to run", "does not reach", "not applied", "cannot judge seeds", "no effect"):
        assert contradiction not in text, (contradiction, text)


def test_a_built_in_at_none_is_all_run_to_run_and_says_so_once():
    """Where the seed does not reach the code at none, the seed labels are arbitrary: the repeats differ,
    and the variance is run to run, in both sections."""
    rep = _report(_runs(seeded_by_code=False), BUILTIN)
    rows = {v["group"]["determinism"]: v for v in rep["verdicts"] if v["level"] == "repeatability"}
    assert rows["none"]["verdict"] != "identical"
    var = {e["group"]["determinism"]: e for e in rep["variance_by_source"]}
    assert var["none"]["between_seed_applies"] is False and "run to run" in var["none"]["note"]
    assert var["seeded"]["between_seed_applies"] is True
