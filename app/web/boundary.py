"""The error boundary: every exception that leaves a route becomes one answer in the API's one
error shape (``steady.server.kit.errors.ErrorResponse``), or MLflow's shape under /mlflow.

Expected errors are translated where they arise (services raise ``steady.server.kit.errors`` types); here
only what no service can foresee is mapped: a database that is busy or down (503 with
Retry-After), a write that clashed with a concurrent one (409), a number beyond the 64-bit
columns (422). Anything else is a bug: 500, with its traceback logged.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from steady.server.kit import wire
from steady.server.kit.bounds import MAX_NESTING, nesting
from steady.server.kit.db import database_message, sqlite_sql_error
from steady.server.kit.errors import SteadyError, error_body
from steady.server.mlflow.service import MlflowError

log = logging.getLogger("steady")

RETRY_AFTER_S = 2  # a busy or restarting database: ask clients to come back this soon
_MLFLOW_CODES = {401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "RESOURCE_DOES_NOT_EXIST",
                 409: "INVALID_STATE", 413: "INVALID_PARAMETER_VALUE", 422: "INVALID_PARAMETER_VALUE",
                 500: "INTERNAL_ERROR", 503: "TEMPORARILY_UNAVAILABLE"}


def _error(request: Request, status_code: int, msg: str, *, type: str | None = None,
           loc: tuple[str | int, ...] = (), headers: Mapping[str, str] | None = None) -> JSONResponse:
    if _is_mlflow(request.url.path):  # MLflow clients read error_code + message
        body: dict = {"error_code": _MLFLOW_CODES.get(status_code, "BAD_REQUEST"), "message": msg}
    else:
        body = error_body(msg, status_code, type=type, loc=loc)
    return JSONResponse(body, status_code=status_code, headers=headers)


def _without_deep_input(error: dict) -> dict:
    if "input" in error and nesting(error["input"]) > MAX_NESTING:
        return {k: v for k, v in error.items() if k != "input"}
    return error


def _is_mlflow(path: str) -> bool:
    return path.startswith("/mlflow/")


def install(app: FastAPI) -> None:
    """Register the exception handlers on ``app`` (``InternalErrors`` is added by create_app,
    outside the body limit, so a refused body is answered 413 and not logged as a bug)."""

    @app.exception_handler(MlflowError)
    async def _mlflow_error(request: Request, exc: MlflowError) -> JSONResponse:
        return JSONResponse({"error_code": exc.error_code, "message": exc.message}, status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        # the errors echo the input, which may hold a bare NaN token an old client sent: answered as "NaN";
        # an input nested past the cap on stored values is not echoed (it was refused for that depth)
        errors = wire.plain(jsonable_encoder([_without_deep_input(e) for e in exc.errors()]))
        if _is_mlflow(request.url.path):
            first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
            where = ".".join(str(p) for p in first.get("loc", ()))
            return JSONResponse({"error_code": "INVALID_PARAMETER_VALUE", "message": f"{where}: {first['msg']}",
                                 "detail": errors}, status_code=422)
        return JSONResponse({"detail": errors}, status_code=422)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> Response:
        if exc.status_code < 400:  # a redirect (the dashboard's login) is not an error
            return await http_exception_handler(request, exc)
        return _error(request, exc.status_code, str(exc.detail), headers=exc.headers)

    @app.exception_handler(SteadyError)
    async def _steady_error(request: Request, exc: SteadyError) -> JSONResponse:
        headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s is not None else None
        return _error(request, exc.status_code, exc.message, type=exc.code, loc=exc.loc, headers=headers)

    @app.exception_handler(DataError)  # PostgreSQL: a value out of range for its column
    @app.exception_handler(OverflowError)  # SQLite: an integer beyond 64 bits
    async def _out_of_range(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, DataError):
            log.info("value refused by the database: %s", database_message(exc))
        return _error(request, 422, "a number is out of range: ids, steps and seeds are 64-bit integers")

    @app.exception_handler(IntegrityError)  # a write that clashed with a concurrent one
    async def _integrity(request: Request, exc: IntegrityError) -> JSONResponse:
        log.info("write refused by a constraint: %s", database_message(exc))
        return _error(request, 409, "the request conflicts with existing data; re-read and retry")

    @app.exception_handler(OperationalError)  # locked, busy, connection refused or lost
    @app.exception_handler(PoolTimeout)  # every pooled connection busy
    async def _database_unavailable(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, DBAPIError) and sqlite_sql_error(exc):
            return _internal_error(request, exc)
        log.warning("database unavailable: %s", database_message(exc))
        return _unavailable(request)

    @app.exception_handler(DBAPIError)  # any other driver error: a bug, unless the connection is gone
    async def _database_error(request: Request, exc: DBAPIError) -> JSONResponse:
        if exc.connection_invalidated:  # the dialect recognised a lost connection (any error class)
            log.warning("database connection lost: %s", database_message(exc))
            return _unavailable(request)
        message = database_message(exc)
        if "malformed" in message:  # SQLite found a corrupt page
            request.app.state.database.mark_corrupt(message)
            log.error("database corrupt: %s", message)
            return _unavailable(request)
        return _internal_error(request, exc)


def _unavailable(request: Request) -> JSONResponse:
    return _error(request, 503, "database busy or unavailable, retry shortly",
                  headers={"Retry-After": str(RETRY_AFTER_S)})


def _internal_error(request: Request, exc: BaseException) -> JSONResponse:
    log.error("%s %s failed: %s", request.method, request.url.path, type(exc).__name__, exc_info=exc)
    return _error(request, 500, "internal error; it is logged on the server")


class InternalErrors:
    """Any exception no handler took: 500 in the error shape, its traceback logged once.

    (Starlette's own last-resort handler would answer but re-raise, so the server logs it a
    second time.) When the answer had already started, nothing can be sent: it is re-raised.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            if started:
                raise
            await _internal_error(Request(scope), exc)(scope, receive, send)
