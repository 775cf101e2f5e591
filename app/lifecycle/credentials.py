"""Run-scoped credentials: what a run's own process may use to write to its run, and nothing else.

Issued with each lease (``Lease.run_token``) as ``stdr_<run id>_<random>``; only its SHA-256 is
stored (``runs.run_token_hash``). It authenticates writes to that run alone (the
MLflow-compatible endpoint), only while the run is running under the lease it was issued
with and that lease has not expired. A new lease (a retry, or the same lease re-sent after a
lost answer) issues a new credential, which replaces the old one.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass

from sqlalchemy.orm import Session

from steady.server.kit.auth import hash_token
from steady.server.models import Run, utcnow
from steady.worker.contract.protocol import RunStatus

RUN_TOKEN_PREFIX = "stdr_"


def new(run_id: int) -> tuple[str, str]:
    """A fresh credential for run ``run_id`` and its hash (what ``runs.run_token_hash`` keeps), for a lease
    that writes the hash in its own UPDATE."""
    secret = f"{RUN_TOKEN_PREFIX}{run_id}_{secrets.token_urlsafe(32)}"
    return secret, hash_token(secret)


def issue(run: Run) -> str:
    """A fresh credential for ``run``'s current lease (its hash replaces the previous one)."""
    secret, run.run_token_hash = new(run.id)
    return secret


def is_run_token(secret: str) -> bool:
    return secret.startswith(RUN_TOKEN_PREFIX)


@dataclass(frozen=True)
class RunCredential:
    run_id: int
    study_id: int
    attempt: int
    lease_id: str


def authenticate(session: Session, secret: str) -> RunCredential | None:
    """The run a live run credential belongs to, or None (unknown, stale lease, run not running)."""
    rest = secret[len(RUN_TOKEN_PREFIX):] if is_run_token(secret) else ""
    run_id, _, _ = rest.partition("_")
    # "²" is a digit to str.isdigit, not to int(); past a bigint the token names no run
    if not (run_id.isascii() and run_id.isdigit()) or int(run_id) > 2**63 - 1:
        return None
    run = session.get(Run, int(run_id))
    if run is None or run.run_token_hash is None or not hmac.compare_digest(run.run_token_hash, hash_token(secret)):
        return None
    if run.status != RunStatus.running.value or run.lease_id is None:
        return None
    if run.lease_expires_at is not None and run.lease_expires_at < utcnow():
        return None
    return RunCredential(run_id=run.id, study_id=run.study_id, attempt=run.attempt, lease_id=run.lease_id)
