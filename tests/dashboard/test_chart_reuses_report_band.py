"""The chart of a settled study draws the report's band: same payload as computing it from every
series, with only the lines' series loaded."""

from __future__ import annotations

import numpy as np
from sqlalchemy import select

from steady.server.dashboard import charts
from steady.server.dashboard import service as dashboard
from steady.server.kit.db import Database
from steady.server.kit.responses import NumbersJSONResponse
from steady.server.metrics import repository as metrics_repo
from steady.server.models import Run, Study, utcnow
from steady.server.reports import service as reports


def _study(db: Database) -> int:
    rng = np.random.default_rng(11)
    x = np.arange(3000, dtype=np.int64)
    with db.write() as s:
        study = Study(name="chart", kind="external", status="open",
                      spec={"metrics": [{"name": "loss"}], "coverage": 0.8, "confidence": 0.9})
        s.add(study)
        s.flush()
        layout = [(seed, 0) for seed in range(7)] + [(0, 1), (3, 1)]  # two seeds repeated
        for i, (seed, rep) in enumerate(layout):
            run = Run(study_id=study.id, seed=seed, repeat=rep, determinism="seeded", stack="a",
                      framework="external", required_labels=[], status="completed", attempt=1, max_attempts=1,
                      fingerprint={}, digests={}, determinism_applied={}, timings={}, final_metrics={},
                      created_at=utcnow(), started_at=utcnow(), finished_at=utcnow())
            s.add(run)
            s.flush()
            values = np.exp(-x / 900) + rng.normal(0, 0.01, x.size)
            if i == 5:
                values[2000:] = np.inf  # diverged: left out of the band, still drawn
            for seq, lo in enumerate(range(0, x.size, 1000)):
                metrics_repo.insert_chunks(s, run.id, 1, seq, [("loss", x[lo:lo + 1000], values[lo:lo + 1000])])
        return study.id


def test_chart_from_the_reports_band_equals_the_chart_from_every_series(db_url):
    db = Database(db_url)
    study_id = _study(db)
    try:
        with db.read() as s:
            study = s.get(Study, study_id)
            runs = list(s.scalars(select(Run).where(Run.study_id == study_id).order_by(Run.id)))
            every = {rid: sv for (rid, _), sv in metrics_repo.load_series(s, [r.id for r in runs], ["loss"]).items()}
            assert reports.report_band(s, study_id, metric="loss", determinism="seeded", stack="a") is None
            version = dashboard.study_versions(s, [study])[study_id]
            got = dashboard.group_chart(s, study, version, "test-db", metric="loss", determinism="seeded", stack="a",
                                        max_points=400, max_lines=4)
            band = reports.report_band(s, study_id, metric="loss", determinism="seeded", stack="a")
            assert band is not None and len(band.run_ids) == 6 and len(band.excluded_run_ids) == 1
            rep = dashboard.report(s, study, version, "test-db")
            want = charts.group_chart(runs, every, metric="loss", coverage=0.8, confidence=0.9, max_points=400,
                                      max_lines=4, first_divergent_step=dashboard.first_divergent_step(
                                          rep, "loss", "seeded", "a"))
        assert got == want
    finally:
        db.dispose()


def test_bands_after_a_report_are_the_reports_and_equal_computed_ones(db_url):
    db = Database(db_url)
    study_id = _study(db)
    try:
        with db.read() as s:
            fresh = {mp: NumbersJSONResponse(reports.study_bands(s, study_id, metric="loss", coverage=0.8,
                                                                 confidence=0.9, max_points=mp)).body
                     for mp in (None, 100)}
            reports.compute_report(s, study_id)
            assert reports.report_band(s, study_id, metric="loss", determinism="seeded", stack="a") is not None
            for mp in (None, 100):
                assert NumbersJSONResponse(reports.study_bands(s, study_id, metric="loss", coverage=0.8,
                                                               confidence=0.9, max_points=mp)).body == fresh[mp]
            other = reports.study_bands(s, study_id, metric="loss", coverage=0.9, confidence=0.9, max_points=None)
            assert other["groups"][0]["coverage"] == 0.9  # not the report's: computed
    finally:
        db.dispose()
