"""create_app(): the FastAPI application; its lifespan owns the database and background loops."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, OperationalError
from starlette.types import ASGIApp, Receive, Scope, Send

from app import __version__, apidocs, migrate
from app.alerts.dispatcher import Dispatcher
from app.alerts.router import metrics_router
from app.alerts.router import router as alerts_router
from app.auth.cache import TokenCache
from app.auth.router import router as tokens_router
from app.code.router import router as code_router
from app.config import Settings, get_settings
from app.dashboard.router import router as dashboard_router
from app.db import Database
from app.errors import Invalid, SteadyError, TooManyRequests
from app.launches.router import router as launches_router
from app.mlflow.router import PREFIX as _MLFLOW_API
from app.mlflow.router import router as mlflow_router
from app.mlflow.service import MlflowError
from app.runs import service as runs_service
from app.runs.committer import GroupCommitter
from app.reports.background import ReportCacher
from app.reports.router import router as reports_router
from app.runs.router import router as runs_router
from app.studies.router import router as studies_router
from app.workers.router import router as workers_router

log = logging.getLogger("steady")


# The dashboard and /docs run with no inline script or style: everything comes from /static
# (Swagger UI and ReDoc are vendored, app/apidocs.py). /redoc alone also allows the <style>
# elements and blob: worker ReDoc creates at run time (apidocs.REDOC_CSP_EXTRA); no page may
# load anything from another host.
_CSP = {"default-src": "'self'", "script-src": "'self'", "style-src": "'self'", "img-src": "'self' data:",
        "connect-src": "'self'", "object-src": "'none'", "base-uri": "'none'", "form-action": "'self'",
        "frame-ancestors": "'none'"}


def _policy(extra: dict[str, str] | None = None) -> str:
    return "; ".join(f"{k} {v}" for k, v in {**_CSP, **(extra or {})}.items())


CONTENT_SECURITY_POLICY = _policy()
_REDOC_POLICY = _policy(apidocs.REDOC_CSP_EXTRA)


class SecurityHeaders:
    """nosniff, no framing and a same-origin referrer on every answer; the CSP on every page."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        policy = _REDOC_POLICY if scope["path"] == "/redoc" else CONTENT_SECURITY_POLICY

        async def send_with_headers(message) -> None:  # noqa: ANN001
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(b"x-content-type-options", b"nosniff"), (b"x-frame-options", b"DENY"),
                            (b"referrer-policy", b"same-origin")]
                headers.append((b"content-security-policy", policy.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with 413, whether or not Content-Length is sent."""

    def __init__(self, app: ASGIApp, limit: int, code_limit: int | None = None) -> None:
        self.app, self.limit, self.code_limit = app, limit, code_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit
        if self.code_limit is not None and scope["path"].startswith("/api/v1/code/"):
            limit = max(limit, self.code_limit)  # code archives have their own limit (STEADY_MAX_CODE_BYTES)
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                await _too_large(limit, send)
                return
        seen = 0
        started = over = False

        async def limited_receive():  # noqa: ANN202
            nonlocal seen, over
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    over = True
                    raise _BodyTooLarge
            return message

        async def tracking_send(message):  # noqa: ANN001, ANN202
            nonlocal started
            if over:
                # FastAPI turns an exception while reading the body into its own 400
                # ("error parsing the body"): answer 413 naming the limit instead.
                if message["type"] == "http.response.start" and not started:
                    started = True
                    await _too_large(limit, send)
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _BodyTooLarge:
            if not started:
                await _too_large(limit, send)


class _BodyTooLarge(Exception):
    pass


async def _too_large(limit: int, send: Send) -> None:
    body = f'{{"detail":"request body over the limit of {limit} bytes (STEADY_MAX_BODY_BYTES)"}}'.encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


class Reaper:
    """Re-queues expired leases every few seconds; every API process runs one, safely."""

    def __init__(self, database: Database, interval: float) -> None:
        self.database, self.interval = database, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="steady-reaper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                with self.database.write(queue=True) as session:  # in line with the protocol's writes
                    runs_service.reap_expired(session)
            except Exception as exc:  # the database may be down; try again next tick
                log.warning("lease reaper: %s", exc)


SUPERVISOR_PID_ENV = "STEADY_SUPERVISOR_PID"
MLFLOW_PATH = _MLFLOW_API.split("/api/")[0] + "/"  # "/mlflow/": errors there take MLflow's shape
_PR_SET_PDEATHSIG = 1


def _die_with_supervisor() -> None:
    """In a ``serve --workers N`` worker process: ask the kernel for SIGTERM when the supervisor
    dies (SIGKILL included), so no orphaned worker keeps the port and a restart can bind it."""
    supervisor = os.environ.get(SUPERVISOR_PID_ENV)
    if not supervisor or int(supervisor) == os.getpid() or not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
    if os.getppid() != int(supervisor):  # it died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    _die_with_supervisor()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        database = Database(settings.resolved_database_url, sqlite_synchronous=settings.sqlite_synchronous)
        if database.check_integrity():
            log.error("database failed its integrity check, writes refused: %s", database.corruption)
        else:
            migrate.upgrade(database.engine)
            migrate.verify(database.engine)
        app.state.database = database
        app.state.committer = GroupCommitter(database)
        background = [app.state.committer, Reaper(database, settings.reaper_interval_seconds),
                      Dispatcher(database, settings), ReportCacher(database, settings.report_cache_interval_seconds)]
        for task in background:
            task.start()
        try:
            yield
        finally:
            for task in background:
                task.stop()
            database.dispose()

    app = FastAPI(
        title="Steady",
        version=__version__,
        summary="Is my training stable? Repeated runs, stability statistics and verdicts.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    apidocs.install(app)
    app.state.settings = settings
    app.state.token_cache = TokenCache(settings.token_cache_seconds)

    @app.exception_handler(MlflowError)
    async def _mlflow_error(request: Request, exc: MlflowError) -> JSONResponse:
        return JSONResponse({"error_code": exc.error_code, "message": exc.message}, status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        if request.url.path.startswith(MLFLOW_PATH):  # MLflow clients read error_code + message
            first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
            where = ".".join(str(p) for p in first.get("loc", ()))
            return JSONResponse({"error_code": "INVALID_PARAMETER_VALUE", "message": f"{where}: {first['msg']}",
                                 "detail": jsonable_encoder(exc.errors())}, status_code=422)
        return await request_validation_exception_handler(request, exc)

    @app.exception_handler(SteadyError)
    async def _steady_error(request: Request, exc: SteadyError) -> JSONResponse:
        if request.url.path.startswith(MLFLOW_PATH):
            code = {404: "RESOURCE_DOES_NOT_EXIST", 403: "PERMISSION_DENIED", 409: "INVALID_STATE",
                    422: "INVALID_PARAMETER_VALUE", 413: "INVALID_PARAMETER_VALUE"}.get(exc.status_code, "BAD_REQUEST")
            return JSONResponse({"error_code": code, "message": exc.message}, status_code=exc.status_code)
        if isinstance(exc, Invalid):
            detail = [{"loc": list(exc.loc), "msg": exc.message, "type": "value_error"}]
            return JSONResponse({"detail": detail}, status_code=422)
        body: dict[str, object] = {"detail": exc.message}
        if exc.code is not None:
            body["code"] = exc.code
        headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, TooManyRequests) else None
        return JSONResponse(body, status_code=exc.status_code, headers=headers)

    @app.exception_handler(ValueError)
    async def _value_error(request: Request, exc: ValueError) -> JSONResponse:
        # The stats core validates its inputs with ValueError: data it cannot judge is a 422, not a 500.
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(DataError)  # PostgreSQL: a value out of range for its column
    @app.exception_handler(OverflowError)  # SQLite: an integer beyond 64 bits
    async def _out_of_range(request: Request, exc: Exception) -> JSONResponse:
        detail = [{"loc": [], "msg": "a number is out of range: ids, steps and seeds are 64-bit integers",
                   "type": "value_error"}]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.exception_handler(IntegrityError)  # a write that clashed with a concurrent one
    async def _integrity(request: Request, exc: IntegrityError) -> JSONResponse:
        return JSONResponse({"detail": "the request conflicts with existing data; re-read and retry"}, status_code=409)

    @app.exception_handler(OperationalError)
    @app.exception_handler(DBAPIError)
    async def _database_down(request: Request, exc: DBAPIError) -> JSONResponse:
        if "malformed" in str(exc.orig if hasattr(exc, "orig") else exc):  # SQLite found a corrupt page
            request.app.state.database.mark_corrupt(str(getattr(exc, "orig", exc)))
        log.warning("database unavailable: %s", exc.orig if hasattr(exc, "orig") else exc)
        return JSONResponse(
            {"detail": "database unavailable, retry shortly"}, status_code=503, headers={"Retry-After": "2"}
        )

    @app.get("/healthz", tags=["health"])
    def healthz(request: Request) -> JSONResponse:
        corruption = request.app.state.database.corruption
        if corruption:
            return JSONResponse({"status": "database corrupt", "detail": corruption}, status_code=503)
        try:
            request.app.state.database.ping()
        except Exception:
            return JSONResponse({"status": "database unavailable"}, status_code=503)
        return JSONResponse({"status": "ok", "version": __version__})

    for router in (studies_router, runs_router, workers_router, tokens_router, reports_router, alerts_router,
                   metrics_router, launches_router, code_router, mlflow_router):
        app.include_router(router)
    app.include_router(dashboard_router)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes, code_limit=settings.max_code_bytes)
    app.add_middleware(SecurityHeaders)
    return app
