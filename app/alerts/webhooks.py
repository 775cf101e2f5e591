"""Webhooks: the receivers of alert deliveries. Their URL passes the one egress guard
(``steady.server.alerts.egress``) when created, and again at every delivery attempt."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from sqlalchemy.orm import Session

from steady.server.alerts import egress
from steady.server.alerts.schemas import WebhookIn
from steady.server.kit.errors import Invalid, NotFound
from steady.server.models import Webhook


def check_webhook_url(url: str, *, allow_private: bool) -> None:
    """Refuse non-HTTP(S) URLs and, unless allowed, hosts resolving to non-public addresses
    (``steady.server.alerts.egress``, the one guard; the dispatcher checks again at every attempt)."""
    try:
        egress.resolve(url, allow_private=allow_private)
    except egress.RefusedTarget as exc:
        raise Invalid(("body", "url"), str(exc)) from None


def create_webhook(session: Session, body: WebhookIn, *, allow_private: bool) -> tuple[Webhook, str]:
    check_webhook_url(body.url, allow_private=allow_private)
    secret = body.secret or "whsec_" + secrets.token_urlsafe(32)
    hook = Webhook(name=body.name, url=body.url, secret=secret, events=list(dict.fromkeys(body.events)),
                   min_severity=body.min_severity)
    session.add(hook)
    session.flush()
    return hook, secret


def delete_webhook(session: Session, webhook_id: int) -> None:
    hook = session.get(Webhook, webhook_id)
    if hook is None:
        raise NotFound(f"webhook {webhook_id} not found")
    session.delete(hook)
    session.flush()


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
