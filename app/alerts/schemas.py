"""The alerting API's bodies and answers. Rules as users write them (``AlertRuleSpec``) are part of
the study spec's grammar: ``steady.server.studies.alert_specs``."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# defined with the reports' models (the gate reads it)
from steady.server.reports.models import BaselineComparisonOut as BaselineComparisonOut
from steady.server.studies.alert_specs import Name, Severity, StackName
from steady.server.kit.wire import WireModel


class AlertRuleOut(WireModel):
    id: int
    name: str
    kind: str
    metric: str | None
    severity: str
    params: dict[str, Any]
    study_id: int | None
    suite: str | None
    source: str
    created_at: datetime
    owner_token_id: int | None = None


class BaselineIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    study_id: Annotated[int, Field(ge=1)]
    stack: StackName | None = Field(None, description="one stack of the study; default: all its runs")
    reason: Annotated[str, Field(max_length=2000)] | None = Field(
        None, description="why the baseline is set or moved; kept in the baseline's history"
    )


class BaselineVersionOut(WireModel):
    """One version of a suite's baseline: a frozen snapshot of its runs' results (canonical JSON and
    its SHA-256), or the baseline's clearing (who, when, why)."""

    version: int
    action: Literal["set", "cleared"] = Field(description="set: a snapshot; cleared: the suite went without one")
    study_id: int | None
    stack: str | None
    digest: str | None = Field(description="SHA-256 of the snapshot's canonical JSON; null when cleared")
    n_runs: int
    created_at: datetime
    created_by: str | None
    reason: str | None


class BaselineOut(WireModel):
    suite: str
    study_id: int
    stack: str | None
    set_at: datetime
    owner_token_id: int | None = None
    version: int | None = Field(None, description="the snapshot version in force (None: set before snapshots)")
    digest: str | None = Field(None, description="SHA-256 of the snapshot the comparisons read")
    n_runs: int | None = None
    set_by: str | None = None
    reason: str | None = None


class WebhookIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: Annotated[str, Field(min_length=1, max_length=2000)]
    name: Name = "webhook"
    secret: Annotated[str, Field(min_length=16, max_length=200)] | None = Field(
        None, description="HMAC key for X-Steady-Signature; generated (and shown once) when left out"
    )
    events: Annotated[list[Literal["firing", "resolved"]], Field(min_length=1)] = ["firing", "resolved"]
    min_severity: Severity = "info"


class WebhookOut(WireModel):
    id: int
    name: str
    url: str
    events: list[str]
    min_severity: str
    created_at: datetime


class WebhookCreated(WebhookOut):
    secret: str = Field(description="the HMAC key; shown only in this answer, store it now")


class AlertOut(WireModel):
    id: int
    rule_id: int
    kind: str
    severity: str
    state: str
    study_id: int | None
    suite: str | None
    metric: str | None
    group: dict[str, Any]
    summary: str
    details: dict[str, Any]
    link: str
    first_fired_at: datetime
    last_fired_at: datetime
    resolved_at: datetime | None
    evaluated_at: datetime
    fire_count: int
    acked_at: datetime | None
    acked_by: str | None


class DeliveryOut(WireModel):
    id: int
    webhook_id: int
    alert_id: int
    event: str
    status: str
    attempts: int
    next_attempt_at: datetime
    last_status_code: int | None
    last_error: str | None
    created_at: datetime
    delivered_at: datetime | None


class EvaluationOut(WireModel):
    study_id: int
    rules: int
    firing: list[AlertOut]
    resolved: list[AlertOut]
    summary: dict[str, Any]
