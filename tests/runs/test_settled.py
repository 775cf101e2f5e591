"""The one hook for "a run settled" (steady.server.runs.settled)."""

from __future__ import annotations

import pytest

from steady.server.runs import settled


def test_listeners_hear_each_settled_run_once_in_order(monkeypatch):
    monkeypatch.setattr(settled, "_listeners", [])
    heard: list[tuple[str, int]] = []

    def first(session, study_id):
        heard.append(("first", study_id))

    def second(session, study_id):
        heard.append(("second", study_id))

    settled.subscribe(first)
    settled.subscribe(second)
    settled.subscribe(first)  # create_app() runs once per app; a second app must not double the refresh
    settled.announce(None, 7)
    assert heard == [("first", 7), ("second", 7)]


def test_an_announcement_nobody_hears_is_an_error(monkeypatch):
    # Without the app's subscription a study would silently keep a stale status: fail loudly instead.
    monkeypatch.setattr(settled, "_listeners", [])
    with pytest.raises(RuntimeError, match="nothing listens"):
        settled.announce(None, 1)


def test_the_app_subscribes_the_reports_refresh(monkeypatch, tmp_path):
    from steady.server.kit.config import Settings
    from steady.server.reports.service import run_settled
    from steady.server.web.main import create_app

    monkeypatch.setattr(settled, "_listeners", [])
    create_app(Settings(data_dir=tmp_path))
    create_app(Settings(data_dir=tmp_path))
    assert settled._listeners == [run_settled]
