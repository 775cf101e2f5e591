"""The registry of every decision rule Steady applies, each with its calibration scenarios.

One module per family keeps the registry easy to extend: ``seeds`` (seed stability,
out-of-band runs, repeatability, stack portability, planning), ``cost`` (determinism cost),
``alerts`` (alert kinds, suite shift over a lifetime of evaluations), ``adaptive`` (seed-stability
verdicts of studies that add seeds in stages), ``adaptive_portability`` (their portability verdicts),
``convergence`` (MLPerf RCP check), ``sources`` (a sources table's TOST of SDs in stages)."""
from __future__ import annotations

from steady.server.stats.calibration import Rule
from steady.server.stats.calibration import (
    rules_adaptive,
    rules_adaptive_portability,
    rules_alerts,
    rules_convergence,
    rules_cost,
    rules_seeds,
    rules_sources,
)

__all__ = ["all_rules", "rule_by_name"]


def all_rules() -> list[Rule]:
    return [*rules_seeds.RULES, *rules_adaptive.RULES, *rules_adaptive_portability.RULES, *rules_cost.RULES,
            *rules_alerts.RULES, *rules_convergence.RULES, *rules_sources.RULES]


def rule_by_name(name: str) -> Rule:
    for r in all_rules():
        if r.name == name:
            return r
    raise KeyError(f"no rule named {name!r}; known: {', '.join(r.name for r in all_rules())}")
