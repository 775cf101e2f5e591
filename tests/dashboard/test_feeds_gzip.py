"""The dashboard's JSON feeds go through Starlette's GZipMiddleware; nothing else does."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from fastapi.testclient import TestClient

from steady.server.dashboard.feeds import FEEDS_PREFIX, GZipFeeds

BODY = "0123456789" * 500  # 5 kB: over the 1 kB threshold


def _client() -> TestClient:
    app = FastAPI()
    app.add_api_route(FEEDS_PREFIX + "big", lambda: PlainTextResponse(BODY))
    app.add_api_route(FEEDS_PREFIX + "small", lambda: PlainTextResponse("tiny"))
    app.add_api_route("/api/v1/big", lambda: PlainTextResponse(BODY))
    app.add_middleware(GZipFeeds)
    return TestClient(app)


def test_a_large_feed_is_gzipped_when_the_client_accepts_it():
    with _client() as c:
        r = c.get(FEEDS_PREFIX + "big", headers={"Accept-Encoding": "gzip"})
        assert r.headers["content-encoding"] == "gzip" and r.text == BODY
        assert int(r.headers["content-length"]) < len(BODY) / 10
        assert "content-encoding" not in c.get(FEEDS_PREFIX + "big", headers={"Accept-Encoding": "identity"}).headers


def test_small_feeds_and_api_routes_are_not_compressed():
    with _client() as c:
        assert "content-encoding" not in c.get(FEEDS_PREFIX + "small", headers={"Accept-Encoding": "gzip"}).headers
        r = c.get("/api/v1/big", headers={"Accept-Encoding": "gzip"})
        assert "content-encoding" not in r.headers and r.text == BODY
