"""Request dependencies: database sessions and the caller's identity."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from steady.server.kit.tokencache import TokenCache
from steady.server.kit.auth import GRANTS, Role, authenticate, hash_token, session_token
from steady.server.kit.config import Settings
from steady.server.kit.db import Database, ReadSession, WriteSession
from steady.server.models import ApiToken

SESSION_COOKIE = "steady_session"
_bearer = HTTPBearer(auto_error=False)


# async: FastAPI runs a plain ``def`` dependency in the thread pool, a hop per dependency per request.
async def get_database(request: Request) -> Database:
    return request.app.state.database


async def get_app_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_read_session(db: Annotated[Database, Depends(get_database)]) -> Iterator[ReadSession]:
    with db.read() as session:
        yield session


def get_write_session(db: Annotated[Database, Depends(get_database)]) -> Iterator[WriteSession]:
    with db.write() as session:
        yield session


ReadDB = Annotated[ReadSession, Depends(get_read_session)]
# scope="function": commit before the response is sent. FastAPI's default ("request") runs the
# teardown after the response, so a client could get a 2xx for a write that was not yet
# committed, or never was (process killed, database down at commit), and a worker's next
# request to another API process did not see its own registration.
WriteDB = Annotated[WriteSession, Depends(get_write_session, scope="function")]
AppSettings = Annotated[Settings, Depends(get_app_settings)]


@dataclass(frozen=True)
class Principal:
    token_id: int
    name: str
    role: Role


def _credentials(request: Request, creds: HTTPAuthorizationCredentials | None) -> tuple[str, str] | None:
    """("bearer", token) or ("session", session id), or None when the request carries neither."""
    if creds is not None and creds.scheme.lower() == "bearer":
        return "bearer", creds.credentials
    # The dashboard's session cookie authenticates reads only: a state-changing request must
    # carry a bearer token, so no page on another port or site can make a browser write.
    if request.method in ("GET", "HEAD"):
        sid = request.cookies.get(SESSION_COOKIE)
        if sid:
            return "session", sid
    return None


def caller_token(session: Session, request: Request, creds: HTTPAuthorizationCredentials | None) -> ApiToken | None:
    """The live token behind the request's bearer token or dashboard session, if any."""
    found = _credentials(request, creds)
    if found is None:
        return None
    kind, secret = found
    return authenticate(session, secret) if kind == "bearer" else session_token(session, secret)


def _unauthorized() -> HTTPException:
    return HTTPException(
        status.HTTP_401_UNAUTHORIZED, "invalid, expired or revoked token or session", headers={"WWW-Authenticate": "Bearer"}
    )


def get_principal(
    request: Request,
    db: Annotated[Database, Depends(get_database)],
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The caller, looked up in the database (blocking; see ``current_principal`` for the dependency)."""
    if _credentials(request, creds) is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "missing bearer token", headers={"WWW-Authenticate": "Bearer"}
        )
    with db.read() as session:
        row = caller_token(session, request, creds)
        if row is None:
            raise _unauthorized()
        return Principal(token_id=row.id, name=row.name, role=Role(row.role))


def token_cache(request: Request) -> TokenCache[Principal]:
    return request.app.state.token_cache


def forget_tokens(request: Request) -> None:
    """After a token was revoked (and committed): no request of this process accepts it any more."""
    token_cache(request).invalidate()


async def _principal(request: Request, creds: HTTPAuthorizationCredentials | None, *, protocol: bool) -> Principal:
    found = _credentials(request, creds)
    if found is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "missing bearer token", headers={"WWW-Authenticate": "Bearer"}
        )

    async def look_up() -> Principal:
        if protocol:  # the worker protocol's own thread and connection (steady.server.kit.capacity)
            lane = request.app.state.protocol
            return await lane.run(get_principal, request, lane.database, creds)
        return await run_in_threadpool(get_principal, request, request.app.state.database, creds)

    if found[0] != "bearer":
        return await look_up()
    cache = token_cache(request)
    digest = hash_token(found[1])
    # a protocol request never waits on a lookup queued behind user requests on the shared pool
    return cache.get(digest) or await cache.once(digest, look_up, lane="protocol" if protocol else "shared")


def bearer_principal(db: Database, secret: str) -> Principal | None:
    """The caller of a bearer token, looked up in the database (blocking), or None when it is not valid."""
    with db.read() as session:
        row = authenticate(session, secret)
        return None if row is None else Principal(token_id=row.id, name=row.name, role=Role(row.role))


async def cached_protocol_bearer(app: Any, secret: str) -> Principal | None:
    """A worker-protocol caller's principal from the token cache, or looked up once for all the requests
    that carry the token meanwhile (on the protocol's own thread and connection); None when the token
    is not valid (the route then answers 401)."""
    cache: TokenCache[Principal] = app.state.token_cache
    digest = hash_token(secret)
    principal = cache.get(digest)
    if principal is not None:
        return principal
    lane = app.state.protocol

    async def look_up() -> Principal:
        found = await lane.run(bearer_principal, lane.database, secret)
        if found is None:
            raise _unauthorized()
        return found

    try:
        return await cache.once(digest, look_up, lane="protocol")
    except HTTPException:
        return None


async def current_principal(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The caller. A bearer token checked less than STEADY_TOKEN_CACHE_SECONDS ago in this process is
    not looked up again (no database query, no thread-pool hop); see app/kit/tokencache.py for revocation."""
    return await _principal(request, creds, protocol=False)


async def protocol_principal(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The caller of a worker-protocol route: as ``current_principal``, but a token not in the cache is
    looked up on the protocol's own thread and connection, never the shared pools."""
    return await _principal(request, creds, protocol=True)


async def optional_principal(
    request: Request,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal | None:
    """The caller, or None when the request carries no token or session, or one that is not valid:
    for pages that decide themselves what an anonymous reader sees (the public dashboard)."""
    if _credentials(request, creds) is None:
        return None
    try:
        return await current_principal(request, creds)
    except HTTPException as exc:
        if exc.status_code == status.HTTP_401_UNAUTHORIZED:
            return None
        raise


def require(*roles: Role, protocol: bool = False):
    allowed = frozenset().union(*(GRANTS[r] for r in roles))
    who = protocol_principal if protocol else current_principal

    # a default, not an Annotated[...] hint: hints are strings here, resolved in this module's globals
    async def _check(principal: Principal = Depends(who)) -> Principal:  # noqa: B008 - FastAPI's dependency idiom
        if principal.role not in allowed:
            raise HTTPException(
                status.HTTP_403_FORBIDDEN, f"a {principal.role.value} token cannot do this; it needs role "
                + " or ".join(r.value for r in roles)
            )
        return principal

    return _check


_user = require(Role.user)


async def heavy_reader(request: Request, principal: Annotated[Principal, Depends(_user)]) -> AsyncIterator[Principal]:
    """A user's heavy read (report, bands, compare, a series), admitted by the process's ``HeavyGate``
    (429 with Retry-After past its per-token or total limit) and counted while its route computes it."""
    gate = request.app.state.heavy_gate
    started = gate.enter(principal.token_id)
    try:
        yield principal
    finally:
        gate.leave(principal.token_id, started)


OptionalCaller = Annotated[Principal | None, Depends(optional_principal)]
AdminCaller = Annotated[Principal, Depends(require(Role.admin))]
UserCaller = Annotated[Principal, Depends(_user)]
# A heavy read: declare it first among a route's parameters, so a refused request takes no thread.
# scope="function": it leaves the gate when the route returns, before the answer is sent; counted until
# sent, a client that asks again on receipt could find its own finished read still counted and be refused.
HeavyReader = Annotated[Principal, Depends(heavy_reader, scope="function")]
# The worker protocol's routes: a token lookup on the protocol's own capacity.
ProtocolCaller = Annotated[Principal, Depends(require(Role.worker, protocol=True))]
# Code archives: users upload and read them, workers fetch them.
CodeReader = Annotated[Principal, Depends(require(Role.user, Role.worker))]
