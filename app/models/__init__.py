"""ORM models. Migrations (``migrations/``) are the single source of the schema."""

from app.models.base import Base, UTCDateTime, utcnow
from app.models.alerts import Alert, AlertDelivery, AlertRule, StudyEvaluation, SuiteBaseline, Webhook
from app.models.core import ApiToken, DashboardSession, Launch, MetricChunk, Run, Study, StudyReport, StudyStage, Worker

__all__ = ["Base", "UTCDateTime", "utcnow", "ApiToken", "DashboardSession", "Launch", "MetricChunk", "Run", "Study",
           "StudyReport", "StudyStage", "Worker", "Alert", "AlertDelivery", "AlertRule", "StudyEvaluation", "SuiteBaseline",
           "Webhook"]
