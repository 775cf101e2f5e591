"""The report is a typed contract: the stats core's real output validates into the response models,
travels as JSON with one spelling of non-finite floats, and every consumer reads the models."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from pydantic import ValidationError

from steady.server.alerts.prometheus import SnapshotCollector
from steady.server.cli.support import failing_verdicts, verdict_exit_code
from steady.server.dashboard.service import badges, cost_scale, first_divergent_step
from steady.server.reports.models import (
    PortabilityVerdict,
    RepeatabilityVerdict,
    Report,
    SeedStabilityVerdict,
    typed_verdicts,
    worst,
)
from steady.server.reports.summary import ReportSummary
from steady.server.stats.report import MetricSpec, SeedStages, build_report
from steady.server.stats.vocabulary import LEVELS
from steady.server.kit.wire import WireFloat, WireModel
from tests.stats.test_report import METRICS, RUNS

STUDY = {"id": 3, "name": "two stacks", "status": "completed"}


@pytest.fixture(scope="module")
def built():
    stages = SeedStages(stage_of_seed={s: 1 + (s >= 4) for s in range(8)}, last_stage=3, max_seeds=12)
    return build_report(RUNS, METRICS, rng=np.random.default_rng(0), cost_budget=1.1, stages=stages)


@pytest.fixture(scope="module")
def report(built) -> Report:
    return Report.assemble(built, study=STUDY, metrics=[m.__dict__ for m in METRICS], n_runs_judged=len(RUNS))


def test_every_verdict_is_its_levels_model(built, report):
    assert len(report.verdicts) == len(built.verdicts)
    kinds = {"repeatability": RepeatabilityVerdict, "seed_stability": SeedStabilityVerdict,
             "stack_portability": PortabilityVerdict}
    for v, raw in zip(report.verdicts, built.verdicts, strict=True):
        assert isinstance(v, kinds[raw.level]) and v.verdict == raw.verdict and v.group.determinism == raw.group["determinism"]
    assert {v.level for v in report.verdicts} == set(LEVELS)
    seed = report.of_level("seed_stability", "loss")
    assert seed and all(v.spread.n == len(v.final_values) for v in seed)
    # sequential where no run diverged; the group with a diverged run is judged unstable outright
    assert all((v.sequential is None) == bool(v.diverged_run_ids) for v in seed) and any(v.diverged_run_ids for v in seed)
    port = report.of_level("stack_portability")
    assert port and all(v.group.candidate_stack == "torch2.4-cu124" and v.same_seed.n_pairs == 8 for v in port)
    assert all(c.verdict in {"pass", "fail", "inconclusive"} for c in report.determinism_cost)


def test_json_spells_non_finite_floats_and_reads_back(report):
    # the diverged run's repeats differ by +inf from step 120: the none/torch2.3 verdict carries it
    (none,) = [v for v in report.of_level("repeatability") if v.group.determinism == "none"
               and v.group.stack == "torch2.3-cu121"]
    assert math.isinf(none.max_abs_delta)
    text = report.model_dump_json()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in the JSON"))  # strict JSON
    data = json.loads(text)
    (wire,) = [v for v in data["verdicts"] if v["level"] == "repeatability" and v["group"] == none.group.as_dict()]
    assert wire["max_abs_delta"] == "Infinity"
    back = Report.model_validate_json(text)
    assert back.model_dump_json() == text
    assert report.options.nonfinite_encoding.startswith('NaN, +Inf, -Inf -> "NaN", "Infinity", "-Infinity"')


def test_wire_float_round_trip():
    class M(WireModel):
        x: list[WireFloat]
        y: WireFloat | None = None

    m = M(x=[1.5, math.nan, math.inf, -math.inf])
    assert m.model_dump(mode="json") == {"x": [1.5, "NaN", "Infinity", "-Infinity"], "y": None}
    back = M.model_validate_json(m.model_dump_json())
    assert back.x[0] == 1.5 and math.isnan(back.x[1]) and back.x[2:] == [math.inf, -math.inf]
    with pytest.raises(ValidationError):
        M.model_validate({"x": ["many"]})


def test_unknown_fields_and_values_do_not_read(report):
    data = report.model_dump(mode="json")
    data["verdicts"][0]["level"] = "vibes"
    with pytest.raises(ValidationError):
        Report.model_validate(data)
    data = report.model_dump(mode="json")
    data["verdicts"][-1]["spread_typo"] = 1
    with pytest.raises(ValidationError, match="spread_typo"):
        Report.model_validate(data)


def test_consumers_read_the_model(report):
    by_level = {b.level: b for b in badges(report)}
    port = report.of_level("stack_portability")
    assert by_level["stack_portability"].verdict == worst([v.verdict for v in port])
    assert by_level["stack_portability"].count == len(port)
    strict = next(v for v in report.of_level("repeatability") if v.group.determinism == "strict")
    assert first_divergent_step(report, "loss", "strict", strict.group.stack) == strict.first_divergent_step
    none = next(v for v in report.of_level("repeatability") if v.group.determinism == "none")
    assert first_divergent_step(report, "loss", "none", none.group.stack) == none.first_divergent_step is not None
    assert cost_scale(report) == pytest.approx(
        max([1.0] + [x for c in report.determinism_cost for x in (c.ratio, c.ci_high) if x is not None]) * 1.15)

    # the exit code follows the report's one outcome: out_of_tolerance at none is what none allows
    failing = [c for c in report.outcome.checks if c.status == "fail"]
    assert {c.kind for c in failing} == {"seed_stability", "determinism_cost"}
    assert failing_verdicts(report) == [(c.name, c.summary) for c in failing]
    assert verdict_exit_code(report) == 1 and report.outcome.status == "fail"


def test_prometheus_reads_the_stored_summary(report):
    stored = json.loads(json.dumps(ReportSummary.of(report).model_dump(mode="json")))  # as the database keeps it
    summary = ReportSummary.read(stored)
    seed = report.of_level("seed_stability")
    rows = [r for r in summary.verdicts if r.level == "seed_stability"]
    assert [r.std for r in rows] == [v.spread.std for v in seed]
    assert [r.ti_width for r in rows] == [v.spread.tolerance.high - v.spread.tolerance.low for v in seed]
    metrics = {m.name: m for m in SnapshotCollector({"evaluations": [(
        {"id": 3, "name": "s", "suite": None}, summary)], "study_runs": [], "run_totals": {}, "workers": (0, 0),
        "quarantined": 0, "firing": [], "outbox": {}}).collect()}
    codes = {(s.labels["level"], s.labels["group"]): s.value for s in metrics["steady_verdict"].samples}
    codes_expected = {0: {"identical", "stable", "equivalent"}, 3: {"out_of_tolerance", "unstable", "not_equivalent"}}
    for v in report.verdicts:
        code = codes[(v.level, ",".join(f"{k}={x}" for k, x in sorted(v.group.as_dict().items())))]
        assert v.verdict in codes_expected.get(code, {v.verdict}), (v.verdict, code)
    assert ReportSummary.read({"verdicts": [{"level": "seed_stability"}]}).verdicts == []  # an older shape


def test_typed_verdicts_of_a_cross_report():
    cross = build_report(RUNS, [MetricSpec("loss", margin=0.02)], rng=np.random.default_rng(1),
                         reference_stack="torch2.3-cu121")
    assert [v.level for v in typed_verdicts(cross)] == [v.level for v in cross.verdicts]


def test_bands_data_is_what_the_bands_model_describes():
    """The /bands route renders plain data (no validation, for speed): it must read as ``Bands``."""
    from steady.server.kit.responses import NumbersJSONResponse
    from steady.server.reports.models import Bands
    from steady.server.stats.report import compute_bands

    groups = compute_bands(RUNS[:3], metric="loss")  # one seed: std and intervals are NaN at every step
    text = NumbersJSONResponse({"study_id": 1, "metric": "loss", "coverage": 0.9, "confidence": 0.95,
                                "groups": [g.to_arrays() for g in groups]}).body  # as the route renders it
    body = json.loads(text)
    assert '"NaN"' in text.decode()
    bands = Bands.model_validate_json(text)
    (g,) = bands.groups
    assert g.n == [1] * len(g.steps) and all(math.isnan(x) for x in g.std)
    assert json.loads(bands.model_dump_json()) == body
