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
    from steady.server.kit.deps import SESSION_COOKIE

    r = api.client.post("/login", data={"token": api.tokens["admin"]}, follow_redirects=False)
    assert r.status_code == 303 and api.client.cookies.get(SESSION_COOKIE)
    try:
        assert api.client.get("/api/v1/studies").status_code == 200
        r = api.client.post("/api/v1/studies", json=spec())
        assert r.status_code == 401  # a write needs a bearer token, never the cookie alone
    finally:
        api.client.cookies.clear()


def _login(api, role: str = "user") -> str:
    from steady.server.kit.deps import SESSION_COOKIE

    r = api.client.post("/login", data={"token": api.tokens[role]}, follow_redirects=False)
    assert r.status_code == 303, r.text
    sid = r.cookies.get(SESSION_COOKIE)
    assert sid
    return sid


def test_the_cookie_holds_a_session_id_not_the_token(api):
    from steady.server.kit.deps import SESSION_COOKIE
    from steady.server.models import DashboardSession

    r = api.client.post("/login", data={"token": api.tokens["user"]}, follow_redirects=False)
    sid = r.cookies.get(SESSION_COOKIE)
    assert sid and sid != api.tokens["user"] and api.tokens["user"] not in r.headers["set-cookie"]
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=lax" in cookie and "max-age=43200" in cookie
    assert "secure" not in cookie  # plain http, no trusted proxy said https
    with api.app.state.database.read() as s:
        (row,) = s.query(DashboardSession).all()
        assert row.id_hash != sid and sid not in row.id_hash  # stored hashed
    api.client.cookies.clear()


def test_logout_revokes_the_session(api):
    from steady.server.kit.deps import SESSION_COOKIE

    sid = _login(api)
    stolen = {"Cookie": f"{SESSION_COOKIE}={sid}"}
    api.client.cookies.clear()
    assert api.client.get("/api/v1/studies", headers=stolen).status_code == 200
    api.client.cookies.set(SESSION_COOKIE, sid)
    assert api.client.post("/logout", follow_redirects=False).status_code == 303
    api.client.cookies.clear()
    # a copy of the cookie kept from before the logout is dead
    assert api.client.get("/api/v1/studies", headers=stolen).status_code == 401
    assert api.client.get("/studies", headers=stolen, follow_redirects=False).status_code == 303


def test_expired_session_and_revoked_token_need_a_new_login(api):
    from datetime import timedelta

    from steady.server.kit.deps import SESSION_COOKIE
    from steady.server.models import ApiToken, DashboardSession, utcnow

    sid = _login(api)
    api.client.cookies.clear()
    headers = {"Cookie": f"{SESSION_COOKIE}={sid}"}
    with api.app.state.database.write() as s:
        for row in s.query(DashboardSession):
            row.expires_at = utcnow() - timedelta(seconds=1)
    assert api.client.get("/api/v1/studies", headers=headers).status_code == 401
    sid = _login(api)
    api.client.cookies.clear()
    headers = {"Cookie": f"{SESSION_COOKIE}={sid}"}
    assert api.client.get("/api/v1/studies", headers=headers).status_code == 200
    with api.app.state.database.write() as s:
        s.query(ApiToken).filter(ApiToken.name == "test-user").one().revoked_at = utcnow()
    assert api.client.get("/api/v1/studies", headers=headers).status_code == 401


def test_a_raw_token_in_the_cookie_is_not_a_session(api):
    from steady.server.kit.deps import SESSION_COOKIE

    assert api.client.get("/api/v1/studies", headers={"Cookie": f"{SESSION_COOKIE}={api.tokens['admin']}"}).status_code == 401


def test_secure_cookie_and_same_origin_behind_a_trusted_https_proxy(api):
    """Behind a proxy that passes Host with its port and X-Forwarded-Proto (steady.server.cli runs uvicorn
    with proxy headers from STEADY_FORWARDED_ALLOW_IPS; here the scheme is given directly)."""
    from fastapi.testclient import TestClient

    client = TestClient(api.app, base_url="https://steady.example:8443")
    r = client.post("/login", data={"token": api.tokens["user"]}, follow_redirects=False,
                    headers={"Origin": "https://steady.example:8443"})
    assert r.status_code == 303, r.text
    assert "secure" in r.headers["set-cookie"].lower()
    r = client.post("/login", data={"token": api.tokens["user"]}, follow_redirects=False,
                    headers={"Origin": "https://steady.example"})  # port dropped: another origin
    assert r.status_code == 403
    r = client.post("/login", data={"token": api.tokens["user"]}, follow_redirects=False,
                    headers={"Origin": "http://steady.example:8443"})
    assert r.status_code == 403


def test_ended_sessions_are_dropped_as_new_ones_start(api):
    from datetime import timedelta

    from steady.server.models import DashboardSession, utcnow

    _login(api)
    with api.app.state.database.write() as s:
        for row in s.query(DashboardSession):
            row.expires_at = utcnow() - timedelta(seconds=1)
    _login(api)
    api.client.cookies.clear()
    with api.app.state.database.read() as s:
        assert s.query(DashboardSession).count() == 1


# --- the per-process token cache (STEADY_TOKEN_CACHE_SECONDS) ---------------------------------


def test_revocation_is_immediate_here_and_within_the_cache_ttl_in_another_process(make_api):
    """Two apps on one database stand for two API processes; each remembers checked tokens for 1 s. The other
    process's clock is injected: it keeps the revoked token until its TTL ends, to the tick, and not after."""
    from steady.server.kit.tokencache import TokenCache

    here, elsewhere = make_api(token_cache_seconds=1.0), make_api(token_cache_seconds=1.0)
    now = [100.0]
    elsewhere.app.state.token_cache = TokenCache(1.0, clock=lambda: now[0])
    secret = here.post("/api/v1/tokens", role="admin", json={"name": "doomed", "role": "user"}).json()
    headers = {"Authorization": f"Bearer {secret['token']}"}
    for app in (here, elsewhere):  # both processes have now checked (and remembered) the token
        assert app.client.get("/api/v1/studies", headers=headers).status_code == 200
    assert here.delete(f"/api/v1/tokens/{secret['id']}", role="admin").status_code == 200
    assert here.client.get("/api/v1/studies", headers=headers).status_code == 401  # at once where it was revoked
    now[0] = 100.999
    assert elsewhere.client.get("/api/v1/studies", headers=headers).status_code == 200  # remembered, within the TTL
    now[0] = 101.0
    assert elsewhere.client.get("/api/v1/studies", headers=headers).status_code == 401  # the TTL is over: looked up


def test_without_the_cache_every_request_looks_its_token_up(make_api):
    from steady.server.models import ApiToken, utcnow

    api = make_api(token_cache_seconds=0)
    assert api.get("/api/v1/studies").status_code == 200
    with api.app.state.database.write() as s:  # revoked behind the API's back (e.g. by the CLI)
        s.query(ApiToken).filter(ApiToken.name == "test-user").one().revoked_at = utcnow()
    assert api.get("/api/v1/studies").status_code == 401


def test_a_lookup_that_raced_a_revocation_is_not_remembered():
    from steady.server.kit.tokencache import TokenCache

    now = [0.0]
    cache: TokenCache[str] = TokenCache(5.0, clock=lambda: now[0])
    generation = cache.generation  # a lookup starts, reads the token as valid ...
    cache.invalidate()  # ... a revocation commits meanwhile
    cache.put("digest", "principal", generation)
    assert cache.get("digest") is None
    cache.put("digest", "principal", cache.generation)
    assert cache.get("digest") == "principal"
    now[0] = 5.0
    assert cache.get("digest") is None  # expired after the TTL


def test_requests_that_miss_the_cache_together_share_one_lookup():
    """A fleet sharing one token: the requests that miss while its lookup is in progress wait for that
    lookup; its answer is remembered, and a refusal is everyone's then and not remembered."""
    import asyncio
    import concurrent.futures

    from steady.server.kit.tokencache import TokenCache

    cache: TokenCache[str] = TokenCache(5.0)
    lookups: list[str] = []

    async def scenario() -> tuple[list, list]:
        release = asyncio.Event()

        async def valid() -> str:
            lookups.append("valid")
            await release.wait()
            return "principal"

        waiting = [asyncio.ensure_future(cache.once("digest", valid)) for _ in range(50)]
        while not lookups:
            await asyncio.sleep(0)
        release.set()
        answers = await asyncio.gather(*waiting)
        assert cache.get("digest") == "principal"

        async def refused() -> str:
            lookups.append("refused")
            await asyncio.sleep(0)
            raise PermissionError("revoked")

        errors = await asyncio.gather(*(cache.once("other", refused) for _ in range(20)), return_exceptions=True)

        async def in_lane() -> str:
            lookups.append("lane")
            await asyncio.sleep(0)
            return "principal"

        # a lookup on another lane's threads is not waited on (protocol requests never wait on the shared pool)
        await asyncio.gather(*(cache.once("third", in_lane, lane=lane) for lane in ("protocol", "shared") * 5))
        return answers, errors

    # its own thread: a test before it in this process may leave an event loop running on the main thread
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        answers, errors = pool.submit(asyncio.run, scenario()).result()
    assert answers == ["principal"] * 50 and lookups == ["valid", "refused", "lane", "lane"]
    assert all(isinstance(e, PermissionError) for e in errors) and cache.get("other") is None
