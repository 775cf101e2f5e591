"""``GET /metrics``: Prometheus text built per request from the database.

Each scrape builds a fresh ``CollectorRegistry`` with one collector holding a snapshot read
in that request, so any API process answers with the same numbers: no process-global
counters that would disagree between processes or reset on restart. Per-study gauges come
from the latest stored evaluation of the most recent ``STEADY_ALERT_METRICS_MAX_STUDIES``
studies (the report is not recomputed on a scrape).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy.orm import Session

from steady.server.alerts import quarantine, repository
from steady.server.alerts.settings import AlertSettings
from steady.server.kit.config import Settings
from steady.server.models import utcnow
from steady.server.reports.summary import ReportSummary
from steady.server.stats import vocabulary
from steady.worker.contract.protocol import RunStatus

RUN_STATUSES = tuple(s.value for s in RunStatus)


class SnapshotCollector:
    def __init__(self, snapshot: dict[str, Any]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot
        study_labels = ["study_id", "study", "suite"]
        group_labels = [*study_labels, "metric", "determinism", "stack"]
        std = GaugeMetricFamily("steady_seed_band_std", "Std of the final metric over seeds (latest evaluation)",
                                labels=group_labels)
        width = GaugeMetricFamily("steady_seed_band_ti_width",
                                  "Width of the normal tolerance interval of the final metric over seeds",
                                  labels=group_labels)
        verdict = GaugeMetricFamily(
            "steady_verdict",
            "Verdict as a number: 0 identical/stable/equivalent, 1 within_tolerance, 2 inconclusive, "
            "3 out_of_tolerance/unstable/seed_has_no_effect/not_equivalent",
            labels=[*study_labels, "level", "metric", "group"],
        )
        outcome = GaugeMetricFamily(
            "steady_study_outcome",
            "The study's outcome as steady report/check judge it: 0 pass, 1 fail, 2 inconclusive "
            "(latest evaluation)", labels=study_labels)
        for study, summary in snap["evaluations"]:
            base = [str(study["id"]), study["name"], study["suite"] or ""]
            if summary.outcome is not None:
                outcome.add_metric(base, {"pass": 0, "fail": 1, "inconclusive": 2}[summary.outcome])
            for v in summary.verdicts:
                verdict.add_metric([*base, v.level, v.metric, v.group_label], vocabulary.severity(v.verdict))
                if v.level == "seed_stability":
                    labels = [*base, v.metric, str(v.group.get("determinism", "")), str(v.group.get("stack", ""))]
                    if v.std is not None:
                        std.add_metric(labels, v.std)
                    if v.ti_width is not None:
                        width.add_metric(labels, v.ti_width)
        yield from (std, width, verdict, outcome)

        runs = GaugeMetricFamily("steady_study_runs", "Runs of a study by status", labels=[*study_labels, "status"])
        for study, counts in snap["study_runs"]:
            for status in RUN_STATUSES:
                runs.add_metric([str(study["id"]), study["name"], study["suite"] or "", status],
                                counts.get(status, 0))
        yield runs

        totals = GaugeMetricFamily("steady_runs", "Runs by status, all studies", labels=["status"])
        for status in RUN_STATUSES:
            totals.add_metric([status], snap["run_totals"].get(status, 0))
        yield totals
        yield GaugeMetricFamily("steady_queue_depth", "Runs waiting for a worker", value=snap["run_totals"].get(RunStatus.queued.value, 0))

        workers = GaugeMetricFamily("steady_workers", "Registered workers; active = seen within two lease periods",
                                    labels=["state"])
        workers.add_metric(["registered"], snap["workers"][0])
        workers.add_metric(["active"], snap["workers"][1])
        yield workers
        yield GaugeMetricFamily("steady_workers_quarantined",
                                "Workers in quarantine: they lease no run of a study that respects quarantine",
                                value=snap["quarantined"])

        firing = GaugeMetricFamily("steady_alerts_firing", "Alerts in state firing", labels=["kind", "severity"])
        for kind, severity, count in snap["firing"]:
            firing.add_metric([kind, severity], count)
        yield firing

        outbox = GaugeMetricFamily("steady_webhook_deliveries", "Webhook outbox rows by status", labels=["status"])
        for status in ("pending", "delivered", "dead"):
            outbox.add_metric([status], snap["outbox"].get(status, 0))
        yield outbox


def snapshot(session: Session, settings: Settings, cfg: AlertSettings) -> dict[str, Any]:
    evaluations = []
    for ev, study in repository.latest_evaluations(session, cfg.metrics_max_studies):
        evaluations.append(({"id": study.id, "name": study.name, "suite": study.suite}, ReportSummary.read(ev.summary)))
    studies = {s.id: {"id": s.id, "name": s.name, "suite": s.suite}
               for s in repository.recent_studies(session, cfg.metrics_max_studies)}
    counts: dict[int, dict[str, int]] = {}
    for study_id, status, count in repository.run_counts(session, list(studies)):
        counts.setdefault(study_id, {})[status] = count
    active_since = utcnow() - timedelta(seconds=2 * settings.lease_seconds)
    return {
        "evaluations": evaluations,
        "study_runs": [(studies[sid], counts.get(sid, {})) for sid in studies],
        "run_totals": repository.run_status_totals(session),
        "workers": repository.worker_counts(session, active_since),
        "quarantined": quarantine.quarantined_count(session),
        "firing": repository.firing_counts(session),
        "outbox": repository.outbox_counts(session),
    }


def render(session: Session, settings: Settings, cfg: AlertSettings) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot(session, settings, cfg)))
    return generate_latest(registry)
