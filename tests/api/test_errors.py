"""The error boundary (app/web/boundary.py): one error shape; a bug is a logged 500, a busy database a
503 with Retry-After, bad input a 422 naming the field; and the one list shape (app/kit/pagination.py)."""

from __future__ import annotations

import logging
import shutil
import sqlite3

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from steady.server.kit import db as app_db
from steady.server.web.main import create_app
from steady.server.runs import repository as runs_repo
from steady.server.studies import repository as studies_repo
from tests.api.helpers import error_of, register, spec
from tests.conftest import ApiClient, add_tokens, make_settings


def _broken_query(session, **kwargs):
    session.execute(text("SELECT no_such_column FROM studies"))  # a bug: ProgrammingError (SQLite: SQLITE_ERROR)


def test_a_bug_is_a_500_in_the_error_shape_with_its_traceback_logged(api, monkeypatch, caplog):
    monkeypatch.setattr(studies_repo, "list_studies", _broken_query)
    with caplog.at_level(logging.ERROR, logger="steady"):
        r = api.get("/api/v1/studies")
    assert r.status_code == 500, r.text
    err = error_of(r)
    assert err["type"] == "internal_error" and "no_such_column" not in r.text  # SQL stays in the log
    (record,) = [rec for rec in caplog.records if rec.exc_info]
    assert "GET /api/v1/studies" in record.getMessage()
    assert "no_such_column" in caplog.text and "Traceback" in caplog.text and "_broken_query" in caplog.text
    assert api.get("/api/v1/studies/1").status_code == 404  # the app goes on answering


def test_any_unexpected_exception_is_a_logged_500(api, monkeypatch, caplog):
    def boom(*args, **kwargs):
        raise KeyError("oops")

    monkeypatch.setattr(runs_repo, "list_runs", boom)
    study = api.post("/api/v1/studies", json=spec()).json()
    with caplog.at_level(logging.ERROR, logger="steady"):
        r = api.get(f"/api/v1/studies/{study['id']}/runs")
    assert r.status_code == 500 and error_of(r)["type"] == "internal_error"
    assert any(rec.exc_info and rec.exc_info[0] is KeyError for rec in caplog.records)


def test_bad_input_is_a_422_naming_the_field_and_the_reason(api):
    r = api.post("/api/v1/studies", json=spec(seeds=[1, 1]))  # schema validation
    assert r.status_code == 422
    assert any(d["loc"][:2] == ["body", "seeds"] and "distinct" in d["msg"] for d in r.json()["detail"]), r.text
    r = api.get("/api/v1/studies", params={"limit": 0})
    assert r.status_code == 422 and error_of(r)["loc"] == ["query", "limit"]
    r = api.get("/api/v1/compare", params={"baseline": 1, "candidate": 1})  # found by the service
    err = error_of(r)
    assert r.status_code == 422 and err["loc"] == ["query", "candidate"] and "same study" in err["msg"]


def test_not_found_unauthorized_and_forbidden_take_the_one_shape(api):
    r = api.get("/api/v1/studies/424242")
    assert r.status_code == 404 and error_of(r) == {"loc": [], "msg": "study 424242 not found", "type": "not_found"}
    r = api.client.get("/api/v1/studies")
    assert r.status_code == 401 and error_of(r)["type"] == "unauthorized" and r.headers["WWW-Authenticate"] == "Bearer"
    r = api.get("/api/v1/tokens", role="user")
    assert r.status_code == 403 and error_of(r)["type"] == "forbidden"
    r = api.get("/api/v1/no-such-route")
    assert r.status_code == 404 and error_of(r)["type"] == "not_found"


@pytest.fixture
def sqlite_api(sqlite_template, tmp_path, monkeypatch):
    monkeypatch.setattr(app_db, "SQLITE_BUSY_TIMEOUT_MS", 200)  # wait for a lock this long, not a minute
    path = tmp_path / "locked.db"
    shutil.copy(sqlite_template, path)
    app = create_app(make_settings(f"sqlite:///{path}", tmp_path))
    with TestClient(app) as client:
        yield ApiClient(client=client, app=app, tokens=add_tokens(app)), path


def test_a_locked_database_is_a_503_with_retry_after(sqlite_api, caplog):
    api, path = sqlite_api
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
        with caplog.at_level(logging.WARNING, logger="steady"):
            r = api.post("/api/v1/studies", json=spec())
        assert r.status_code == 503, r.text
        assert r.headers["Retry-After"] == "2" and error_of(r)["type"] == "unavailable"
        assert "database unavailable" in caplog.text and "locked" in caplog.text
        assert not [rec for rec in caplog.records if rec.exc_info]  # an outage, not a bug
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert api.post("/api/v1/studies", json=spec()).status_code == 201  # served again once the lock is gone


def test_every_list_is_one_page_shape_with_limit_and_offset(api):
    for name in ("a", "b", "c"):
        register(api, name)
    first = api.get("/api/v1/workers", params={"limit": 2}).json()
    assert first["total"] == 3 and first["limit"] == 2 and first["offset"] == 0
    second = api.get("/api/v1/workers", params={"limit": 2, "offset": 2}).json()
    assert [w["name"] for w in first["items"] + second["items"]] == ["a", "b", "c"]
    for path in ("/api/v1/studies", "/api/v1/alert-rules", "/api/v1/alerts", "/api/v1/launches"):
        page = api.get(path).json()
        assert set(page) == {"items", "total", "limit", "offset"}, (path, page)
    tokens = api.get("/api/v1/tokens", role="admin", params={"offset": 1}).json()
    assert tokens["total"] == 3 and len(tokens["items"]) == 2  # one token per role, first skipped


def test_the_openapi_document_declares_the_error_shape_on_every_api_route(api):
    doc = api.client.get("/openapi.json").json()
    ref = {"$ref": "#/components/schemas/ErrorResponse"}
    for path, ops in doc["paths"].items():
        if not path.startswith("/api/v1/"):
            continue
        for method, op in ops.items():
            for status in ("4XX", "5XX"):
                assert op["responses"][status]["content"]["application/json"]["schema"] == ref, (method, path)
            ok = op["responses"].get("200", {}).get("content", {}).get("application/json", {}).get("schema", {})
            assert ok.get("type") != "array", f"{method} {path} answers a bare list, not a Page"
