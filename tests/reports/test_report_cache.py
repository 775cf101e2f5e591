"""The report of a settled study is computed once in the background and served by study version."""

from __future__ import annotations

import json
import zlib

from sqlalchemy import update

from steady.server.models import StudyReport
from steady.server.reports import repository, service
from steady.server.studies import repository as studies_repo
from tests.conftest import wait_until


def _external_study(api, runs: int = 3) -> int:
    sid = api.post("/api/v1/studies", json={"name": "imported", "kind": "external", "metrics": ["acc"]}).json()["id"]
    for seed in range(runs):
        _upload(api, sid, seed)
    return sid


def _upload(api, sid: int, seed: int) -> None:
    run = {"seed": seed, "determinism": "seeded", "stack": {"name": "a100"},
           "metrics": {"acc": {"steps": [0, 1, 2], "values": [0.1, 0.5 + seed / 100, 0.9 + seed / 1000]}}}
    r = api.post(f"/api/v1/studies/{sid}/runs", json=run)
    assert r.status_code == 201, r.text


def _refresh(api) -> list[int]:
    with api.app.state.database.write() as session:
        return service.refresh_cached_reports(session)


def _marked(api, sid: int, report: dict) -> dict:
    """Mark the cached body, keeping its version: reads that return the mark came from the cache."""
    marked = {**report, "n_runs_judged": 999}
    with api.app.state.database.write() as session:
        session.execute(update(StudyReport).where(StudyReport.study_id == sid)
                        .values(body=zlib.compress(json.dumps(marked).encode())))
    return marked


def test_cached_once_served_by_version_and_recomputed_after_new_data(make_api):
    api = make_api(report_cache_interval_seconds=0)  # driven by hand here
    sid = _external_study(api)
    fresh = api.get(f"/api/v1/studies/{sid}/report").json()
    assert _refresh(api) == [sid]
    assert _refresh(api) == []  # computed once: nothing changed since
    assert api.get(f"/api/v1/studies/{sid}/report").json() == fresh

    marked = _marked(api, sid, fresh)
    assert api.get(f"/api/v1/studies/{sid}/report").json() == marked
    page = api.get(f"/studies/{sid}")  # the dashboard reads the same cache
    assert page.status_code == 200 and "Judged on 999 completed run(s)" in page.text

    _upload(api, sid, 7)  # new data: the version moves, readers compute afresh until it is cached again
    again = api.get(f"/api/v1/studies/{sid}/report").json()
    assert again["n_runs_judged"] == 4
    assert _refresh(api) == [sid]
    with api.app.state.database.read() as session:
        row = repository.get(session, sid)
        assert json.loads(zlib.decompress(row.body)) == again
        assert row.version == repository.study_version(session, studies_repo.get_study(session, sid))


def test_a_study_with_nothing_to_report_is_not_retried(make_api):
    api = make_api(report_cache_interval_seconds=0)
    sid = api.post("/api/v1/studies", json={"name": "empty", "kind": "external", "metrics": ["acc"]}).json()["id"]
    assert _refresh(api) == [sid]
    assert _refresh(api) == []
    with api.app.state.database.read() as session:
        assert repository.get(session, sid).body is None


def test_the_background_task_caches_a_settled_study(make_api):
    api = make_api(report_cache_interval_seconds=0.1)
    sid = _external_study(api, runs=2)

    def cached() -> bool:
        with api.app.state.database.read() as session:
            row = repository.get(session, sid)
            return row is not None and row.body is not None

    wait_until(cached, 30, 0.1, "the background task to cache the report")


def test_a_cached_body_in_an_older_shape_is_computed_again(make_api):
    api = make_api(report_cache_interval_seconds=0)
    sid = _external_study(api)
    assert _refresh(api) == [sid]
    fresh = api.get(f"/api/v1/studies/{sid}/report").json()
    old = {**fresh, "n_runs_judged": 999}
    del old["arms"]  # a field the older shape did not have
    old["verdicts"] = [{**v, "spread": {**v["spread"], "mean": "not a number"}} if v["level"] == "seed_stability"
                       else v for v in old["verdicts"]]
    with api.app.state.database.write() as session:
        session.execute(update(StudyReport).where(StudyReport.study_id == sid)
                        .values(body=zlib.compress(json.dumps(old).encode())))
    r = api.get(f"/api/v1/studies/{sid}/report")
    assert r.status_code == 200 and r.json() == fresh  # computed again, not the stale body, not a 500


def test_a_report_cached_in_an_older_json_format_is_stale(make_api):
    """Reports cached before the one spelling of non-finite floats (null / "inf") are not served,
    and the background recomputes them."""
    api = make_api(report_cache_interval_seconds=0)
    sid = _external_study(api)
    fresh = api.get(f"/api/v1/studies/{sid}/report").json()
    assert _refresh(api) == [sid]
    with api.app.state.database.write() as session:
        old_version = repository.study_version(session, studies_repo.get_study(session, sid)).split("|", 1)[1]
        session.execute(update(StudyReport).where(StudyReport.study_id == sid).values(version=old_version))
    _marked(api, sid, fresh)
    assert api.get(f"/api/v1/studies/{sid}/report").json() == fresh  # computed afresh, not the old cache
    assert _refresh(api) == [sid]
    assert _refresh(api) == []
    with api.app.state.database.read() as session:
        assert repository.get(session, sid).version.startswith(repository.REPORT_FORMAT + "|")
