"""API tokens: random secrets shown once, stored as SHA-256 hashes, each with one role."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta
from enum import Enum
from typing import Protocol

from sqlalchemy import delete, or_, select
from sqlalchemy.orm import Session

from steady.server.kit.errors import Forbidden
from steady.server.models import ApiToken, DashboardSession, utcnow
from steady.server.kit.repository import paginate

TOKEN_PREFIX = "stdy_"


class Role(str, Enum):
    admin = "admin"
    user = "user"
    worker = "worker"


# Which token roles may act as which role: admins may do everything.
GRANTS: dict[Role, frozenset[Role]] = {
    Role.admin: frozenset({Role.admin}),
    Role.user: frozenset({Role.user, Role.admin}),
    Role.worker: frozenset({Role.worker, Role.admin}),
}


class Caller(Protocol):
    # read-only, so that a frozen dataclass (steady.server.kit.deps.Principal) is a Caller
    @property
    def token_id(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def role(self) -> Role: ...


def may_change(caller: Caller, owner_token_id: int | None) -> bool:
    """Ownership: a user changes what its token created; an admin changes everything.

    Objects without an owner (created before owners were recorded) are changed by admins only.
    """
    return caller.role == Role.admin or (owner_token_id is not None and owner_token_id == caller.token_id)


def ensure_may_change(caller: Caller, owner_token_id: int | None, what: str) -> None:
    if not may_change(caller, owner_token_id):
        raise Forbidden(
            f"{what} belongs to another user: only the token that created it, or an admin, may change it "
            "(reading stays open to every user)"
        )


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def create_token(session: Session, *, name: str, role: Role) -> tuple[ApiToken, str]:
    """Create a token; the secret is returned once and never stored."""
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken(name=name, role=role.value, token_hash=hash_token(secret), prefix=secret[:12])
    session.add(row)
    session.flush()
    return row, secret


def authenticate(session: Session, secret: str) -> ApiToken | None:
    digest = hash_token(secret)
    row = session.scalars(select(ApiToken).where(ApiToken.token_hash == digest)).first()
    # The lookup is by hash; the constant-time compare guards against any timing leak in it.
    if row is None or not hmac.compare_digest(row.token_hash, digest) or row.revoked_at is not None:
        return None
    return row


def list_tokens(session: Session) -> list[ApiToken]:
    return list(session.scalars(select(ApiToken).order_by(ApiToken.id)))


def tokens_page(session: Session, *, limit: int, offset: int) -> tuple[list[ApiToken], int]:
    return paginate(session, select(ApiToken), limit=limit, offset=offset, order_by=ApiToken.id)


def revoke_token(session: Session, token_id: int) -> ApiToken | None:
    row = session.get(ApiToken, token_id)
    if row is not None and row.revoked_at is None:
        row.revoked_at = utcnow()
        session.flush()
    return row


# --- dashboard sessions: the browser holds a random session id, never the API token ----------

SESSION_PREFIX = "stds_"


def create_session(session: Session, token_id: int, ttl_seconds: float) -> str:
    """A new dashboard session for the token; the id is returned once, only its hash is stored."""
    secret = SESSION_PREFIX + secrets.token_urlsafe(32)
    now = utcnow()
    # ended sessions are of no use to anyone: drop them as new ones start
    session.execute(delete(DashboardSession).where(
        or_(DashboardSession.expires_at < now, DashboardSession.revoked_at < now - timedelta(days=1))
    ))
    session.add(DashboardSession(id_hash=hash_token(secret), token_id=token_id, created_at=now,
                                 expires_at=now + timedelta(seconds=ttl_seconds)))
    session.flush()
    return secret


def session_token(session: Session, secret: str) -> ApiToken | None:
    """The token behind a live session: not expired, not revoked, and its token not revoked."""
    digest = hash_token(secret)
    row = session.scalars(select(DashboardSession).where(DashboardSession.id_hash == digest)).first()
    if row is None or not hmac.compare_digest(row.id_hash, digest):
        return None
    if row.revoked_at is not None or row.expires_at <= utcnow():
        return None
    token = session.get(ApiToken, row.token_id)
    return token if token is not None and token.revoked_at is None else None


def revoke_session(session: Session, secret: str) -> bool:
    row = session.scalars(select(DashboardSession).where(DashboardSession.id_hash == hash_token(secret))).first()
    if row is None or row.revoked_at is not None:
        return False
    row.revoked_at = utcnow()
    session.flush()
    return True
