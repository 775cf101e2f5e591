"""Alerting endpoints: rules, suite baselines, alerts, webhooks, study evaluation, /metrics.

Auth: rules, baselines, alerts and evaluation need a user token; every user reads them all,
but changes only what it owns (a rule or baseline it created, a study or suite it created;
global rules are an admin's); admins change everything. Webhooks need an admin token (a
webhook sends alert contents to an outside address) and a webhook's secret is shown once,
in the answer to its creation;
``/metrics`` needs a user token unless ``STEADY_PUBLIC_DASHBOARD=true`` (then it is public
and read-only, like the dashboard).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from steady.server.alerts import baselines, jobs, outbox, prometheus, repository, rules, webhooks
from steady.server.alerts import state as alert_state
from steady.server.alerts.settings import AlertSettings
from steady.server.alerts.schemas import (
    AlertOut,
    AlertRuleOut,
    BaselineComparisonOut,
    BaselineIn,
    BaselineOut,
    BaselineVersionOut,
    DeliveryOut,
    EvaluationOut,
    WebhookCreated,
    WebhookIn,
    WebhookOut,
)
from steady.server.kit.auth import GRANTS, Role
from steady.server.kit.db import Database
from steady.server.kit.deps import AdminCaller, AppSettings, ReadDB, UserCaller, WriteDB, get_database, get_principal
from steady.server.kit.errors import Forbidden
from steady.server.models import Alert, AlertRule
from steady.server.kit.pagination import Page, PageQuery
from steady.server.kit.repository import get_or_404
from steady.server.studies import service as studies
from steady.server.studies.alert_specs import AlertRuleSpec



async def get_alert_settings(request: Request) -> AlertSettings:
    return request.app.state.alert_settings


AlertConfig = Annotated[AlertSettings, Depends(get_alert_settings)]  # built once, in create_app

router = APIRouter(prefix="/api/v1", tags=["alerts"])
metrics_router = APIRouter(tags=["health"])

SuiteName = Annotated[str, Query(min_length=1, max_length=200)]

# --- rules -----------------------------------------------------------------------------------


@router.post("/alert-rules", response_model=AlertRuleOut, status_code=status.HTTP_201_CREATED)
def create_rule(body: AlertRuleSpec, db: WriteDB, caller: UserCaller) -> AlertRuleOut:
    return rules.rule_out(rules.create_rule(db, body, caller))


@router.get("/alert-rules", response_model=Page[AlertRuleOut])
def list_rules(
    db: ReadDB,
    caller: UserCaller,
    page: PageQuery,
    study_id: int | None = None,
    suite: Annotated[str | None, Query(max_length=200)] = None,
    kind: Annotated[str | None, Query(max_length=32)] = None,
) -> Page[AlertRuleOut]:
    rows, total = repository.list_rules(db, study_id=study_id, suite=suite, kind=kind, limit=page.limit,
                                        offset=page.offset)
    return Page.of([rules.rule_out(r) for r in rows], total, page)


@router.get("/alert-rules/{rule_id}", response_model=AlertRuleOut)
def get_rule(rule_id: int, db: ReadDB, caller: UserCaller) -> AlertRuleOut:
    return rules.rule_out(get_or_404(db, AlertRule, rule_id, "alert rule"))


@router.delete("/alert-rules/{rule_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_rule(rule_id: int, db: WriteDB, caller: UserCaller) -> Response:
    rules.delete_rule(db, rule_id, caller)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


# --- baselines -------------------------------------------------------------------------------


@router.put("/suites/{suite}/baseline", response_model=BaselineOut)
def set_baseline(suite: str, body: BaselineIn, db: WriteDB, caller: UserCaller) -> BaselineOut:
    """Set or move the suite's baseline: its runs' results are frozen as a new snapshot version
    (canonical JSON and its SHA-256), recorded with who moved it, when and why."""
    return baselines.baseline_out(db, baselines.set_baseline(db, suite, body, caller))


@router.get("/suites/{suite}/baseline", response_model=BaselineOut)
def get_baseline(suite: str, db: ReadDB, caller: UserCaller) -> BaselineOut:
    return baselines.baseline_out(db, baselines.get_baseline(db, suite))


@router.get("/suites/{suite}/baseline/history", response_model=Page[BaselineVersionOut])
def baseline_history(suite: str, db: ReadDB, caller: UserCaller, page: PageQuery) -> Page[BaselineVersionOut]:
    """The versions the suite's baseline has had, newest first."""
    rows, total = baselines.history(db, suite, limit=page.limit, offset=page.offset)
    return Page.of([BaselineVersionOut.model_validate(s, from_attributes=True) for s in rows], total, page)


@router.get("/suites/{suite}/baseline/compare", response_model=BaselineComparisonOut)
def compare_with_baseline(
    suite: str,
    db: ReadDB,
    caller: UserCaller,
    study_id: Annotated[int, Query(ge=1)],
    alpha: Annotated[float, Query(gt=0, lt=1)] = 0.05,
) -> BaselineComparisonOut:
    """Each metric of the study against the suite's baseline snapshot: TOST equivalence of the final
    values within the metric's margin, per determinism level and stack (false-alarm level ``alpha``)."""
    return BaselineComparisonOut(**baselines.compare(db, suite, study_id, alpha=alpha))


@router.delete("/suites/{suite}/baseline", status_code=status.HTTP_204_NO_CONTENT)
def delete_baseline(
    suite: str,
    db: WriteDB,
    caller: UserCaller,
    reason: Annotated[str | None, Query(max_length=2000, description="why; kept in the baseline's history")] = None,
) -> Response:
    """Clear the suite's baseline: recorded in its history as a "cleared" version (who, when, why);
    comparisons with the suite answer 404 until a baseline is set again."""
    baselines.delete_baseline(db, suite, caller, reason)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


# --- evaluation ------------------------------------------------------------------------------


@router.post("/studies/{study_id}/evaluate", response_model=EvaluationOut)
def evaluate_study(study_id: int, db: WriteDB, caller: UserCaller, settings: AppSettings) -> EvaluationOut:
    """Evaluate the study's alert rules now. External studies are evaluated only here (after
    their uploads); managed studies are evaluated automatically when their last run ends."""
    studies.ensure_study_owner(studies.get_study(db, study_id), caller)
    ev, fired, resolved = jobs.evaluate_study(db, study_id, base_url=settings.base_url)
    return EvaluationOut(study_id=study_id, rules=len(ev.rules), firing=[outbox.alert_out(a) for a in fired],
                         resolved=[outbox.alert_out(a) for a in resolved], summary=ev.summary)


# --- alerts ----------------------------------------------------------------------------------


@router.get("/alerts", response_model=Page[AlertOut])
def list_alerts(
    db: ReadDB,
    caller: UserCaller,
    page: PageQuery,
    state: Annotated[str | None, Query(pattern="^(firing|resolved)$")] = None,
    study_id: int | None = None,
    suite: Annotated[str | None, Query(max_length=200)] = None,
    rule_id: int | None = None,
    kind: Annotated[str | None, Query(max_length=32)] = None,
) -> Page[AlertOut]:
    rows, total = repository.list_alerts(db, state=state, study_id=study_id, suite=suite, rule_id=rule_id,
                                         kind=kind, limit=page.limit, offset=page.offset)
    return Page.of([outbox.alert_out(a) for a in rows], total, page)


def _alert(db, alert_id: int) -> Alert:
    return get_or_404(db, Alert, alert_id)


@router.get("/alerts/{alert_id}", response_model=AlertOut)
def get_alert(alert_id: int, db: ReadDB, caller: UserCaller) -> AlertOut:
    return outbox.alert_out(_alert(db, alert_id))


@router.post("/alerts/{alert_id}/ack", response_model=AlertOut)
def ack_alert(alert_id: int, db: WriteDB, caller: UserCaller) -> AlertOut:
    """Acknowledge: recorded on the alert (who, when); cleared when the alert fires again."""
    return outbox.alert_out(alert_state.ack_alert(db, _alert(db, alert_id), caller))


@router.get("/alerts/{alert_id}/deliveries", response_model=Page[DeliveryOut])
def alert_deliveries(alert_id: int, db: ReadDB, caller: UserCaller, page: PageQuery) -> Page[DeliveryOut]:
    _alert(db, alert_id)
    rows, total = repository.deliveries_of(db, alert_id, limit=page.limit, offset=page.offset)
    return Page.of([DeliveryOut.model_validate(d, from_attributes=True) for d in rows], total, page)


# --- webhooks (admin) ------------------------------------------------------------------------


@router.post("/webhooks", response_model=WebhookCreated, status_code=status.HTTP_201_CREATED)
def create_webhook(body: WebhookIn, db: WriteDB, caller: AdminCaller, settings: AppSettings) -> WebhookCreated:
    hook, secret = webhooks.create_webhook(db, body, allow_private=settings.allow_private_webhooks)
    return WebhookCreated(**WebhookOut.model_validate(hook, from_attributes=True).model_dump(), secret=secret)


@router.get("/webhooks", response_model=Page[WebhookOut])
def list_webhooks(db: ReadDB, caller: AdminCaller, page: PageQuery) -> Page[WebhookOut]:
    rows, total = repository.webhooks_page(db, limit=page.limit, offset=page.offset)
    return Page.of([WebhookOut.model_validate(h, from_attributes=True) for h in rows], total, page)


@router.delete("/webhooks/{webhook_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_webhook(webhook_id: int, db: WriteDB, caller: AdminCaller) -> Response:
    webhooks.delete_webhook(db, webhook_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


# --- /metrics --------------------------------------------------------------------------------

_bearer = HTTPBearer(auto_error=False)


def _metrics_access(
    request: Request,
    settings: AppSettings,
    database: Annotated[Database, Depends(get_database)],
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    if settings.public_dashboard:
        return
    principal = get_principal(request, database, creds)
    if principal.role not in GRANTS[Role.user]:
        raise Forbidden("/metrics needs a user or admin token")


@metrics_router.get("/metrics", response_class=Response, dependencies=[Depends(_metrics_access)],
                    responses={200: {"content": {"text/plain": {}}}})
def metrics(db: ReadDB, settings: AppSettings, alert_settings: AlertConfig) -> Response:
    """Prometheus text exposition (format 0.0.4)."""
    body = prometheus.render(db, settings, alert_settings)
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
