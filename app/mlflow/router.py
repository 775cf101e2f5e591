"""MLflow REST API 2.0 under ``/mlflow``: point an unmodified MLflow client at
``MLFLOW_TRACKING_URI=<server>/mlflow`` with ``MLFLOW_TRACKING_TOKEN`` = a run credential (inside
a Steady run: the worker sets both) or a user token. What is supported: docs/mlflow.md."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from steady.server.kit.auth import GRANTS, Role, authenticate
from steady.server.kit.deps import AppSettings, Principal, ReadDB, WriteDB, get_database
from steady.server.kit.db import Database
from steady.server.mlflow import service
from steady.server.mlflow.schemas import (
    MLFLOW_VERSION,
    CreateExperimentIn,
    CreateRunIn,
    Empty,
    LogBatchIn,
    LogMetricIn,
    LogParamIn,
    MlflowErrorOut,
    SetTagIn,
    UpdateRunIn,
)
from steady.server.mlflow.service import MlflowCaller, MlflowError
from steady.server.lifecycle import credentials

PREFIX = "/mlflow/api/2.0/mlflow"
_bearer = HTTPBearer(auto_error=False)
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": MlflowErrorOut, "description": text}
    for code, text in ((400, "invalid request (MLflow error shape)"), (401, "no valid token"),
                       (403, "not this caller's run"), (404, "no such run or experiment"))
}
router = APIRouter(prefix=PREFIX, tags=["mlflow"], responses=_ERRORS)


def mlflow_caller(
    db: Annotated[Database, Depends(get_database)],
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> MlflowCaller:
    """A run credential (``stdr_…``) or a user/admin token; worker tokens are refused."""
    if creds is None or creds.scheme.lower() != "bearer":
        raise MlflowError(401, "UNAUTHENTICATED", "missing bearer token: set MLFLOW_TRACKING_TOKEN")
    with db.read() as session:
        if credentials.is_run_token(creds.credentials):
            run = credentials.authenticate(session, creds.credentials)
            if run is None:
                raise MlflowError(401, "UNAUTHENTICATED",
                                  "run credential not valid: the run's lease ended or the credential is unknown")
            return MlflowCaller(run=run)
        row = authenticate(session, creds.credentials)
        if row is None:
            raise MlflowError(401, "UNAUTHENTICATED", "invalid, expired or revoked token")
        if Role(row.role) not in GRANTS[Role.user]:
            raise MlflowError(403, "PERMISSION_DENIED", f"a {row.role} token cannot use the MLflow API; use a user token")
        return MlflowCaller(principal=Principal(token_id=row.id, name=row.name, role=Role(row.role)))


Caller = Annotated[MlflowCaller, Depends(mlflow_caller)]


@router.post("/runs/log-metric", response_model=Empty)
def log_metric(body: LogMetricIn, db: WriteDB, caller: Caller, settings: AppSettings) -> Empty:
    service.log_batch_parts(db, body.run(), caller, settings, metrics=[body])
    return Empty()


@router.post("/runs/log-batch", response_model=Empty)
def log_batch(body: LogBatchIn, db: WriteDB, caller: Caller, settings: AppSettings) -> Empty:
    service.log_batch(db, body, caller, settings)
    return Empty()


@router.post("/runs/log-parameter", response_model=Empty)
def log_parameter(body: LogParamIn, db: WriteDB, caller: Caller, settings: AppSettings) -> Empty:
    service.log_batch_parts(db, body.run(), caller, settings, params=[body])
    return Empty()


@router.post("/runs/set-tag", response_model=Empty)
def set_tag(body: SetTagIn, db: WriteDB, caller: Caller, settings: AppSettings) -> Empty:
    service.log_batch_parts(db, body.run(), caller, settings, tags=[body])
    return Empty()


@router.get("/runs/get")
def get_run(db: ReadDB, caller: Caller,
            run_id: Annotated[str, Query(pattern=r"^[0-9]+$", max_length=20)] = "",
            run_uuid: Annotated[str, Query(pattern=r"^[0-9]+$", max_length=20)] = "") -> dict[str, Any]:
    if not (run_id or run_uuid):
        raise MlflowError(400, "INVALID_PARAMETER_VALUE", "run_id is required")
    return {"run": service.get_run(db, int(run_id or run_uuid), caller)}


@router.post("/runs/create")
def create_run(body: CreateRunIn, db: WriteDB, caller: Caller) -> dict[str, Any]:
    return {"run": service.create_run(db, body, caller)}


@router.post("/runs/update")
def update_run(body: UpdateRunIn, db: WriteDB, caller: Caller) -> dict[str, Any]:
    return {"run_info": service.update_run(db, body, caller)}


@router.get("/experiments/get-by-name")
def get_experiment_by_name(db: ReadDB, caller: Caller,
                           experiment_name: Annotated[str, Query(min_length=1, max_length=200)]) -> dict[str, Any]:
    return {"experiment": service.get_experiment_by_name(db, experiment_name, caller)}


@router.get("/experiments/get")
def get_experiment(db: ReadDB, caller: Caller,
                   experiment_id: Annotated[str, Query(min_length=1, max_length=20)]) -> dict[str, Any]:
    return {"experiment": service.get_experiment(db, experiment_id, caller)}


@router.post("/experiments/create")
def create_experiment(body: CreateExperimentIn, db: WriteDB, caller: Caller, settings: AppSettings) -> dict[str, Any]:
    return {"experiment_id": service.create_experiment(db, body, caller, settings)}


@router.api_route("/{method:path}", methods=["GET", "POST", "PATCH", "DELETE"], include_in_schema=False)
def unsupported(method: str, request: Request, caller: Caller) -> None:
    raise MlflowError(
        501, "NOT_IMPLEMENTED",
        f"{request.method} /api/2.0/mlflow/{method} is not supported by Steady's MLflow-compatible endpoint "
        f"(checked against MLflow {MLFLOW_VERSION}); supported methods are listed in docs/mlflow.md",
    )
