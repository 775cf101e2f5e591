"""The compact verdict numbers kept per study with its latest alert evaluation, which the
Prometheus exporter reads (the report is not recomputed on a scrape)."""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import ValidationError

from steady.server.reports.models import Report
from steady.server.reports.parts import Part
from steady.server.stats.vocabulary import Level, VerdictValue
from steady.server.kit.wire import WireFloat

log = logging.getLogger("steady.reports")


class VerdictSummary(Part):
    level: Level
    metric: str
    group: dict[str, str | list[str]]
    verdict: VerdictValue
    n_runs: int
    std: WireFloat | None = None  # seed stability: std of the final value over seeds
    ti_width: WireFloat | None = None  # seed stability: width of the normal tolerance interval

    @property
    def group_label(self) -> str:
        return ",".join(f"{k}={self.group[k]}" for k in sorted(self.group))


class ReportSummary(Part):
    verdicts: list[VerdictSummary] = []
    outcome: Literal["pass", "fail", "inconclusive"] | None = None  # the report's outcome (None: stored before it)
    outcome_reason: str | None = None

    @classmethod
    def of(cls, report: Report) -> ReportSummary:
        rows = []
        for v in report.verdicts:
            row = VerdictSummary(level=v.level, metric=v.metric, group=v.group.as_dict(), verdict=v.verdict,
                                 n_runs=v.n_runs)
            if v.level == "seed_stability":
                ti = v.spread.tolerance
                row.std = v.spread.std
                row.ti_width = None if ti is None else ti.high - ti.low
            rows.append(row)
        return cls(verdicts=rows, outcome=report.outcome.status, outcome_reason=report.outcome.reason)

    @classmethod
    def read(cls, stored: dict[str, Any] | None) -> ReportSummary:
        """A stored summary; one that no longer reads (an older shape) counts as empty until re-evaluated."""
        try:
            return cls.model_validate(stored or {})
        except ValidationError as exc:
            log.info("stored report summary in an older shape (%d error(s)): ignored", exc.error_count())
            return cls()
