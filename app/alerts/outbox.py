"""The outbox: one delivery row per interested webhook on every alert transition, with the body
it will carry; the dispatcher (``steady.server.alerts.dispatcher``) claims and sends them."""

from __future__ import annotations


from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from steady.server.kit import wire
from steady.server.alerts import repository
from steady.server.alerts.schemas import AlertOut
from steady.server.models import Alert, AlertDelivery, utcnow
from steady.server.studies.alert_specs import SEVERITY_ORDER


def alert_out(alert: Alert) -> AlertOut:
    return AlertOut.model_validate(alert, from_attributes=True)


def slack_escape(text: str) -> str:
    """Escape Slack's control characters, so names and summaries cannot write ``<!channel>``,
    ``<@user>`` or ``<https://evil|a link>``: Slack reads ``&amp; &lt; &gt;`` back as text."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def payload(alert: Alert, event: str) -> str:
    """The delivery body. ``text`` is Slack-compatible (escaped); ``alert`` has the raw fields."""
    tag = "FIRING" if event == "firing" else "RESOLVED"
    scope = ([f"suite {alert.suite!r}"] if alert.suite else []) + (
        [f"study {alert.study_id}"] if alert.study_id is not None else [])
    where = f" ({', '.join(scope)})" if scope else ""  # a worker's quarantine may name no study
    text = slack_escape(f"[{tag}] {alert.severity}: {alert.summary}{where} {alert.link}")
    body = {"text": text, "event": event, "alert": alert_out(alert).model_dump(mode="json")}
    return wire.dumps(body, sort_keys=True, separators=(",", ":"), default=str)


def enqueue(session: Session, alert: Alert, event: str) -> int:
    """One outbox row per interested webhook for this transition (idempotent per transition)."""
    transition = alert.fire_count * 2 + (1 if event == "resolved" else 0)
    n = 0
    body = None
    for hook in repository.webhooks(session):
        if event not in hook.events or SEVERITY_ORDER[alert.severity] < SEVERITY_ORDER.get(hook.min_severity, 0):
            continue
        body = body or payload(alert, event)
        try:
            with session.begin_nested():
                session.add(AlertDelivery(webhook_id=hook.id, alert_id=alert.id, event=event, transition=transition,
                                          body=body, status="pending", attempts=0, next_attempt_at=utcnow()))
                session.flush()
            n += 1
        except IntegrityError:
            pass
    return n
