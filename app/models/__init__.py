"""ORM models. Migrations (``migrations/``) are the single source of the schema."""

from app.models.alerts import (
    Alert,
    AlertDelivery,
    AlertRule,
    BaselineSnapshot,
    StudyEvaluation,
    SuiteBaseline,
    Webhook,
)
from app.models.base import Base, UTCDateTime, utcnow
from app.models.core import (
    ApiToken,
    CodeArchive,
    CodeChunk,
    DashboardSession,
    Launch,
    MetricChunk,
    Run,
    Study,
    StudyReport,
    StudyStage,
    Worker,
)

__all__ = ["Base", "UTCDateTime", "utcnow", "ApiToken", "CodeArchive", "CodeChunk", "DashboardSession", "Launch",
           "MetricChunk", "Run", "Study", "StudyReport", "StudyStage", "Worker", "Alert", "AlertDelivery", "AlertRule",
           "BaselineSnapshot", "StudyEvaluation", "SuiteBaseline",
           "Webhook"]
