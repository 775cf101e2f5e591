"""ORM models. Migrations (``migrations/``) are the single source of the schema."""

from steady.server.models.alerts import (
    Alert,
    AlertDelivery,
    AlertRule,
    BaselineSnapshot,
    StudyEvaluation,
    SuiteBaseline,
    Webhook,
)
from steady.server.models.base import Base, UTCDateTime, utcnow
from steady.server.models.fleet import StudySchedule, WorkerEvent
from steady.server.models.core import (
    ApiToken,
    CodeArchive,
    CodeChunk,
    DashboardSession,
    Launch,
    LocalizationJob,
    MetricChunk,
    Run,
    Study,
    StudyReport,
    StudyStage,
    Worker,
)

__all__ = ["Base", "UTCDateTime", "utcnow", "ApiToken", "CodeArchive", "CodeChunk", "DashboardSession", "Launch", "LocalizationJob",
           "MetricChunk", "Run", "Study", "StudyReport", "StudyStage", "Worker", "Alert", "AlertDelivery", "AlertRule",
           "BaselineSnapshot", "StudyEvaluation", "SuiteBaseline",
           "Webhook", "StudySchedule", "WorkerEvent"]
