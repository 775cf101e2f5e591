"""A database lost while a study's alert rules are evaluated: the evaluation waits, it is not judged.

Before, the lost connection surfaced inside one rule's evaluation, was taken for a broken rule
(an "unknown" finding), or failed the whole evaluation for good (state "error").
"""

from __future__ import annotations

import pytest
from sqlalchemy.exc import OperationalError

from steady.server.alerts import evaluators, jobs
from steady.server.kit.db import unavailable
from steady.server.models import StudyEvaluation
from steady.server.studies import repository as studies_repo
from tests.alerts.conftest import external_study
from tests.conftest import POSTGRES_ONLY, terminate_own_connection

WIDE = [0.2, 0.9, 0.4, 1.3, 0.1, 0.7, 1.1, 0.5]


@POSTGRES_ONLY
def test_a_connection_lost_mid_evaluation_leaves_it_pending_then_it_completes(api, monkeypatch):
    sid = external_study(api.post, finals=WIDE, alerts=[{"kind": "band_width", "metric": "loss", "max": 0.1}])
    database, base_url = api.app.state.database, api.app.state.settings.base_url
    real = evaluators._EVALUATORS["band_width"]

    def connection_terminated(session, *args):  # the server ends this session's backend, as an outage does
        terminate_own_connection(session)
        return real(session, *args)

    monkeypatch.setitem(evaluators._EVALUATORS, "band_width", connection_terminated)
    with database.write() as session:  # requested only now: the app's own dispatcher meets the outage too
        studies_repo.request_evaluation(session, sid)
    with pytest.raises(OperationalError) as caught:  # the dispatcher's loop logs it and backs off
        jobs.run_pending_evaluations(database, base_url=base_url)
    assert unavailable(caught.value)
    with database.read() as session:
        assert session.get(StudyEvaluation, sid).state == "pending"

    monkeypatch.setitem(evaluators._EVALUATORS, "band_width", real)  # the database is back
    jobs.run_pending_evaluations(database, base_url=base_url)  # (or the app's own dispatcher did it)
    with database.read() as session:
        assert session.get(StudyEvaluation, sid).state == "done"
    firing = api.get("/api/v1/alerts", params={"state": "firing"}).json()
    assert firing["total"] == 1 and firing["items"][0]["kind"] == "band_width"
