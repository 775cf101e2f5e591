"""What evaluating a study yields: one ``Finding`` per (rule, metric, group), firing, not firing or
unknown (too little data to say), gathered in an ``Evaluation``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from steady.server.models import AlertRule, Study


OK, BAD, UNKNOWN = False, True, None


@dataclass
class Finding:
    rule: AlertRule
    metric: str | None
    group: dict[str, Any]
    firing: bool | None  # None: not enough data to say; the alert is left as it is
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    study_id: int | None = None  # the study the alert points at (default: the evaluated one)
    suite_level: bool = False  # a suite-wide finding (shift): keyed by suite even for its rules


@dataclass
class Evaluation:
    study: Study
    rules: list[AlertRule]
    findings: list[Finding]
    summary: dict[str, Any]
    fleet: Any = None  # a fleet check's section of the report (reports.fleet.FleetReport): its workers' results
