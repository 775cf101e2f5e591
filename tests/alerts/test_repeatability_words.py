"""The repeatability_lost alert says what was compared, at which resolution: "no longer bitwise identical"
only where bits were compared (binary values, a digest); repeats read from text printed with 2 decimals are
"no longer equal at the 2 printed decimals". The words come from the resolution facts the report carries."""
from __future__ import annotations

import numpy as np

from steady.server.alerts import evaluators
from steady.server.models import AlertRule
from steady.server.reports.models import Report
from steady.server.stats.report import MetricSpec, RunData, build_report
from steady.server.studies.alert_specs import rule_adapter

STEPS = np.arange(6, dtype=np.int64)


def _finding(*, printed: float | None, differ: bool):
    """Two seeds × two strict repeats; with ``differ`` the second repeat of seed 1 moves at the last step by
    two printed units (or one float64 ULP for binary values)."""
    runs, i = [], 0
    for seed in (1, 2):
        for rep in (0, 1):
            i += 1
            v = np.linspace(2.0, 1.0, STEPS.size) + 0.1 * seed
            if printed is not None:
                v = np.round(v, 2)
                if differ and seed == 1 and rep == 1:
                    v[-1] += 2 * printed
            elif differ and seed == 1 and rep == 1:
                v[-1] = np.nextafter(v[-1], np.inf)
            runs.append(RunData(run_id=i, seed=seed, repeat=rep, determinism="strict", stack="cpu",
                                series={"loss": (STEPS, v)},
                                resolutions={"loss": printed} if printed is not None else {}))
    built = build_report(runs, [MetricSpec("loss")], rng=np.random.default_rng(0))
    report = Report.assemble(built, study={"id": 1, "name": "repeats", "status": "completed"})
    rule = AlertRule(kind="repeatability_lost", metric="loss", params={}, name=None, severity="warning")
    spec = rule_adapter.validate_python({"kind": "repeatability_lost", "metric": "loss"})
    (finding,) = evaluators._eval_repeatability(None, None, rule, spec, report, None)
    return finding


def test_text_printed_at_two_decimals_is_never_called_bitwise():
    lost = _finding(printed=0.01, differ=True)
    assert lost.firing is True
    assert lost.summary.startswith("strict/cpu runs of loss are no longer equal at the 2 printed decimals: "), lost.summary
    assert "bitwise" not in lost.summary.split(": ", 1)[0]
    assert lost.details["compared"]["basis"] == "printed" and lost.details["compared"]["decimals"] == 2
    held = _finding(printed=0.01, differ=False)
    assert held.firing is False and held.summary == "strict/cpu runs of loss are equal at the 2 printed decimals"


def test_binary_values_are_bitwise():
    lost = _finding(printed=None, differ=True)
    assert lost.firing is True
    assert lost.summary.startswith("strict/cpu runs of loss are no longer bitwise identical: "), lost.summary
    assert lost.details["compared"]["basis"] == "binary"
    held = _finding(printed=None, differ=False)
    assert held.firing is False and held.summary == "strict/cpu runs of loss are bitwise identical"
