"""Request dependencies: database sessions and the caller's identity."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.auth.service import GRANTS, Role, authenticate
from app.config import Settings
from app.db import Database, ReadSession, WriteSession

SESSION_COOKIE = "steady_session"
_bearer = HTTPBearer(auto_error=False)


def get_database(request: Request) -> Database:
    return request.app.state.database


def get_app_settings(request: Request) -> Settings:
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


def _secret_from(request: Request, creds: HTTPAuthorizationCredentials | None) -> str | None:
    if creds is not None and creds.scheme.lower() == "bearer":
        return creds.credentials
    # The dashboard's session cookie authenticates reads only: a state-changing request must
    # carry a bearer token, so no page on another port or site can make a browser write.
    if request.method in ("GET", "HEAD"):
        return request.cookies.get(SESSION_COOKIE)
    return None


def get_principal(
    request: Request,
    db: Annotated[Database, Depends(get_database)],
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    secret = _secret_from(request, creds)
    if not secret:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "missing bearer token", headers={"WWW-Authenticate": "Bearer"}
        )
    with db.read() as session:
        row = authenticate(session, secret)
        if row is None:
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED, "invalid or revoked token", headers={"WWW-Authenticate": "Bearer"}
            )
        return Principal(token_id=row.id, name=row.name, role=Role(row.role))


def require(role: Role):
    allowed = GRANTS[role]

    def _check(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
        if principal.role not in allowed:
            raise HTTPException(
                status.HTTP_403_FORBIDDEN, f"a {principal.role.value} token cannot do this; it needs role {role.value}"
            )
        return principal

    return _check


AdminCaller = Annotated[Principal, Depends(require(Role.admin))]
UserCaller = Annotated[Principal, Depends(require(Role.user))]
WorkerCaller = Annotated[Principal, Depends(require(Role.worker))]
