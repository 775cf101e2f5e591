from __future__ import annotations

from tests.api.helpers import register, spec


def test_missing_and_bad_tokens_are_401(api):
    assert api.client.get("/api/v1/studies").status_code == 401
    r = api.client.get("/api/v1/studies", headers={"Authorization": "Bearer stdy_nope"})
    assert r.status_code == 401 and "items" not in r.text


def test_roles(api):
    # a worker token cannot read or submit studies
    assert api.get("/api/v1/studies", role="worker").status_code == 403
    assert api.post("/api/v1/studies", role="worker", json=spec()).status_code == 403
    # a user cannot act as a worker or manage tokens
    assert api.post("/api/v1/workers/register", role="user", json={"name": "x"}).status_code == 403
    assert api.get("/api/v1/tokens", role="user").status_code == 403
    # admins can do everything
    assert api.get("/api/v1/studies", role="admin").status_code == 200
    assert api.get("/api/v1/tokens", role="admin").status_code == 200


def test_token_lifecycle_and_hashing(api):
    r = api.post("/api/v1/tokens", role="admin", json={"name": "ci", "role": "user"})
    assert r.status_code == 201
    secret, token_id = r.json()["token"], r.json()["id"]
    assert api.client.get("/api/v1/studies", headers={"Authorization": f"Bearer {secret}"}).status_code == 200
    from sqlalchemy import text

    with api.app.state.database.read() as s:
        stored = [row[0] for row in s.execute(text("SELECT token_hash FROM api_tokens"))]
    assert secret not in stored and all(len(h) == 64 for h in stored)
    assert api.delete(f"/api/v1/tokens/{token_id}", role="admin").status_code == 200
    assert api.client.get("/api/v1/studies", headers={"Authorization": f"Bearer {secret}"}).status_code == 401
    assert api.post("/api/v1/tokens", role="admin", json={"name": "x", "role": "root"}).status_code == 422


def test_worker_cannot_use_another_tokens_worker(api):
    wid = register(api)
    other = api.post("/api/v1/tokens", role="admin", json={"name": "w2", "role": "worker"}).json()["token"]
    r = api.client.post(f"/api/v1/workers/{wid}/lease", json={"worker_id": wid}, headers={"Authorization": f"Bearer {other}"})
    assert r.status_code == 404


def test_session_cookie_reads_but_cannot_write(api):
    from app.deps import SESSION_COOKIE

    api.client.cookies.set(SESSION_COOKIE, api.tokens["admin"])
    try:
        assert api.client.get("/api/v1/studies").status_code == 200
        r = api.client.post("/api/v1/studies", json=spec())
        assert r.status_code == 401  # a write needs a bearer token, never the cookie alone
    finally:
        api.client.cookies.clear()
