"""Who receives Steady's seed, and where identical runs of different seeds are evidence that it has no effect.

A command that reads only per-source seeds (``{init_seed}`` …) receives the seed as much as one with
``{seed}``; in a sources study an arm that pins every seed the code reads (``none``, or one varying only a
source the code never reads) gives each run the same seeds by design: its identical runs are repeats, not a
"seed has no effect" failure, and the report says so in a caveat. An arm that varies a seed the code reads
and still gets identical runs is the evidence, and fails. In process, on reports the stats core built.
"""

from __future__ import annotations

import numpy as np

from steady.server.models import Study
from steady.server.reports.models import Report
from steady.server.reports.service import pinned_arms, pinned_caveats, seed_route
from steady.server.stats.expectations import SEEDS_IDENTICAL
from steady.server.stats.report import MetricSpec, RunData, build_report
from steady.server.studies.schemas import StudySpec

COMMAND = ["python", "train.py", "--init-seed", "{init_seed}", "--data-seed", "{data_seed}"]
STEPS = np.arange(5, dtype=np.int64)


def _study(command: list[str] | None = None, *, vary: list[str] | None = None, entrypoint: str | None = None) -> Study:
    workload = {"framework": "python", **({"entrypoint": entrypoint} if entrypoint else {"command": command})}
    spec = {"name": "s", "workload": workload, "seeds": [0, 1, 2, 3, 4], "metrics": ["loss"]}
    if vary is not None:
        spec["sources"] = {"vary": vary}
    return Study(kind="managed", spec=StudySpec.model_validate(spec).model_dump(mode="json"))


def test_a_command_reading_per_source_seeds_receives_the_seed():
    assert seed_route(_study(["python", "t.py", "--seed", "{seed}"])).receives_seed
    assert seed_route(_study(COMMAND)).receives_seed  # {init_seed} follows the run's seed, none included
    assert not seed_route(_study(["python", "t.py", "--ulp", "{ulp_seed}"])).receives_seed  # -1 outside a ulp arm
    assert not seed_route(_study(["python", "t.py"])).receives_seed
    assert seed_route(_study(COMMAND)).pinned == frozenset()  # not a sources study


def test_the_arms_that_pin_every_seed_the_code_reads():
    study = _study(COMMAND, vary=["init", "data", "dropout"])
    assert pinned_arms(study.spec) == {"none", "dropout"}  # the script never reads {dropout_seed}
    assert seed_route(study).pinned == {"none", "dropout"}
    # an entrypoint reads what its runs recorded asking ctx.seed_for; none recorded: nothing pinned
    ep = _study(entrypoint="train.py", vary=["init", "data"])
    ran = [type("R", (), {"determinism_applied": {"sources_exposed": ["init"]}})()]
    assert pinned_arms(ep.spec, ran) == {"none", "data"} and pinned_arms(ep.spec) == frozenset()


def _report(finals: dict[str, list[float]], study: Study) -> tuple[Report, tuple]:
    runs, i = [], 0
    for arm, values in finals.items():
        for seed, f in enumerate(values):
            i += 1
            runs.append(RunData(run_id=i, seed=seed, repeat=0, determinism="seeded", stack=arm,
                                series={"loss": (STEPS, np.linspace(2.0, f, STEPS.size))}))
            runs.append(RunData(run_id=1000 + i, seed=seed, repeat=1, determinism="seeded", stack=arm,
                                series={"loss": (STEPS, np.linspace(2.0, f, STEPS.size))}))
    route = seed_route(study)
    built = build_report(runs, [MetricSpec("loss", max_std=1.0)], rng=np.random.default_rng(0), route=route)
    report = Report.assemble(built, study={"id": 1, "name": "sources", "status": "completed"})
    report.caveats = pinned_caveats(report, route)
    return report, built.bands


def test_pinned_arms_are_repeats_by_design_and_the_study_does_not_fail_for_them():
    varied = [1.0 + 0.01 * s for s in range(5)]
    report, bands = _report({"none": [1.0] * 5, "init": varied, "data": varied, "dropout": [1.0] * 5, "all": varied},
                            _study(COMMAND, vary=["init", "data", "dropout"]))
    seeds = {v.group.stack: v.verdict for v in report.of_level("seed_stability")}
    assert seeds == {"init": "stable", "data": "stable", "all": "stable"}, seeds
    # arms compared without a margin have nothing to judge against: shown, not asked; no check fails, none says
    # the seed has no effect, and the seed stability the spec's max_std asks for decides
    assert report.outcome.status == "pass", report.outcome.reason
    assert {c.status for c in report.outcome.checks if c.kind == "stack_portability"} == {"not_asked"}
    assert all(c.status != "fail" and "no effect" not in c.summary for c in report.outcome.checks)
    assert [(c.kind, c.stack) for c in report.caveats] == [("pinned_arm", "dropout"), ("pinned_arm", "none")]
    assert "repeats by design" in report.caveats[1].message
    rep = {v.group.stack: v for v in report.of_level("repeatability")}
    assert rep["none"].suspicious == [] and rep["none"].met_expectation is True
    # the chart keeps the pinned arms' bands
    assert {b.group["stack"] for b in bands} == {"none", "init", "data", "dropout", "all"}


def test_an_arm_that_varies_a_seed_the_code_reads_and_stays_identical_fails():
    varied = [1.0 + 0.01 * s for s in range(5)]
    report, _ = _report({"none": [1.0] * 5, "init": [1.0] * 5, "data": varied, "all": varied},
                        _study(COMMAND, vary=["init", "data"]))
    (init,) = [v for v in report.of_level("seed_stability") if v.group.stack == "init"]
    assert init.verdict == "seed_has_no_effect"
    assert report.outcome.status == "fail" and "seeded/init: the seed has no effect" in report.outcome.reason
    (rep,) = [v for v in report.of_level("repeatability") if v.group.stack == "init"]
    assert SEEDS_IDENTICAL in rep.suspicious


ULP_COMMAND = [*COMMAND, "--ulp-seed", "{ulp_seed}"]


def test_a_ulp_arm_whose_every_change_was_absorbed_is_said_so_not_failed():
    """``ulp`` is not a seed: the ulp arm pins every seed and moves one weight by one ULP per run. When rounding
    absorbs every change its runs are identical, which says the change never took hold, not that the code ignores a
    seed (the failure an arm varying a real seed gets, above). When the changes take hold it is judged as any arm."""
    study = _study(ULP_COMMAND, vary=["init", "data", "ulp"])
    assert pinned_arms(study.spec) == {"none", "ulp"}
    varied = [1.0 + 0.01 * s for s in range(5)]
    report, _ = _report({"none": [1.0] * 5, "init": varied, "data": varied, "ulp": [1.0] * 5, "all": varied}, study)
    assert all(c.status != "fail" and "no effect" not in c.summary for c in report.outcome.checks)
    ulp = next(c for c in report.caveats if c.stack == "ulp")
    assert "each change was absorbed" in ulp.message and "does read {ulp_seed}" in ulp.message
    report, _ = _report({"none": [1.0] * 5, "init": varied, "data": varied, "ulp": varied, "all": varied}, study)
    assert {v.group.stack: v.verdict for v in report.of_level("seed_stability")}["ulp"] == "stable"
    assert [c.stack for c in report.caveats] == ["none"]
