"""create_app(): the FastAPI application; its lifespan owns the database and background loops."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy import select
from starlette.types import ASGIApp, Receive, Scope, Send

from steady.server import __version__
from steady.server.web import apidocs, boundary
from steady.server.web.fastpath import HeartbeatFastPath, MetricsFastPath
from steady.server.kit import migrate
from steady.server.alerts.dispatcher import Dispatcher
from steady.server.alerts.router import metrics_router
from steady.server.alerts.router import router as alerts_router
from steady.server.alerts.settings import AlertSettings
from steady.server.kit.tokencache import TokenCache
from steady.server.auth.router import router as tokens_router
from steady.server.kit.background import BackgroundLoop
from steady.server.kit.capacity import HeavyGate, ProtocolLane
from steady.server.code import service as code_service
from steady.server.code.router import router as code_router
from steady.server.kit.config import Settings, get_settings
from steady.server.dashboard.feeds import GZipFeeds
from steady.server.dashboard.router import router as dashboard_router
from steady.server.kit.db import Database
from steady.server.kit.errors import ERROR_RESPONSES, error_body
from steady.server.launches.router import router as launches_router
from steady.server.mlflow.router import router as mlflow_router
from steady.server.lifecycle.committer import GroupCommitter
from steady.server.reports import service as reports_service
from steady.server.reports.background import ReportCacher
from steady.server.reports.router import router as reports_router
from steady.server.lifecycle import leasing, localizing
from steady.server.lifecycle.localize_router import router as localize_router
from steady.server.runs import settled
from steady.server.stats import load_libraries
from steady.server.models import Run
from steady.worker.contract.protocol import RunStatus
from steady.server.lifecycle.router import router as runs_router
from steady.server.studies.router import router as studies_router
from steady.server.studies import schedules
from steady.server.studies.schedules_router import router as schedules_router
from steady.server.workers.router import router as workers_router

log = logging.getLogger("steady")


# The dashboard and /docs run with no inline script or style: everything comes from /static
# (Swagger UI and ReDoc ship in the package, app/web/apidocs.py). /redoc alone also allows the <style>
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

        async def send_with_headers(message) -> None:
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
        limit, setting = self.limit, "STEADY_MAX_BODY_BYTES"
        if self.code_limit is not None and scope["path"].startswith("/api/v1/code/") and self.code_limit > limit:
            # code archives have their own limit; the answer names the setting that refused it
            limit, setting = self.code_limit, "STEADY_MAX_CODE_BYTES"
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                await _too_large(limit, setting, send)
                return
        seen = 0
        started = over = False

        async def limited_receive():
            nonlocal seen, over
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    over = True
                    raise _BodyTooLarge
            return message

        async def tracking_send(message):
            nonlocal started
            if over:
                # FastAPI turns an exception while reading the body into its own 400
                # ("error parsing the body"): answer 413 naming the limit instead.
                if message["type"] == "http.response.start" and not started:
                    started = True
                    await _too_large(limit, setting, send)
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _BodyTooLarge:
            if not started:
                await _too_large(limit, setting, send)


class _BodyTooLarge(Exception):
    pass


async def _too_large(limit: int, setting: str, send: Send) -> None:
    body = orjson.dumps(error_body(f"request body over the limit of {limit} bytes ({setting})", 413))
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def reaper(database: Database, interval: float) -> BackgroundLoop:
    """Re-queues expired leases every few seconds; every API process runs one, safely."""

    def reap() -> None:
        with database.write(queue=True) as session:  # in line with the protocol's writes
            leasing.reap_expired(session)
            localizing.reap_expired(session)

    return BackgroundLoop("lease reaper", reap, interval=interval)


SUPERVISOR_PID_ENV = "STEADY_SUPERVISOR_PID"
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


def _holds_results(database: Database) -> bool:
    """Whether a run has completed: something a report, band or comparison could be asked of. A server
    on an empty database leaves scipy's statistics to the first request that needs them."""
    with database.read() as session:
        return session.scalar(select(Run.id).where(Run.status == RunStatus.completed.value).limit(1)) is not None


def create_app(settings: Settings | None = None, alert_settings: AlertSettings | None = None) -> FastAPI:
    """The application. Settings are read once, here (or passed in), and reach routes through
    ``app.state`` (the ``AppSettings`` / ``AlertConfig`` dependencies)."""
    settings = settings or get_settings()
    alert_settings = alert_settings or AlertSettings()
    _die_with_supervisor()
    settled.subscribe(reports_service.run_settled)  # a run settled: the study's status, a stage judged

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        database = Database(settings.resolved_database_url, sqlite_synchronous=settings.sqlite_synchronous)
        if database.check_integrity():
            log.error("database failed its integrity check, writes refused: %s", database.corruption)
        else:
            migrate.upgrade(database.engine)
            migrate.verify(database.engine)
            if _holds_results(database):  # scipy's statistics load now, not in the first request that judges them
                load_libraries()
        app.state.database = database
        # the worker protocol's own threads and connections; the committer and the reaper use them too
        protocol = app.state.protocol = ProtocolLane(database, settings.protocol_threads)
        app.state.heavy_gate = HeavyGate(settings.heavy_per_user, settings.heavy_total)
        code_service.sweep_uploads(settings)  # uploads a crash or kill -9 cut short
        app.state.committer = GroupCommitter(protocol.database)
        background: list[BackgroundLoop | Dispatcher | ReportCacher | GroupCommitter] = [
            app.state.committer, reaper(protocol.database, settings.reaper_interval_seconds),
            Dispatcher(database, settings, alert_settings), ReportCacher(database, settings.report_cache_interval_seconds),
            schedules.scheduler(database, settings)]
        for task in background:
            task.start()
        try:
            yield
        finally:
            for task in background:
                task.stop()
            protocol.dispose()
            database.dispose()

    app = FastAPI(
        title="Steady",
        version=__version__,
        summary="Is my training stable? Repeated runs, stability statistics and verdicts.",
        description=apidocs.CONVENTIONS,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    apidocs.install(app)
    app.state.settings = settings
    app.state.alert_settings = alert_settings
    app.state.token_cache = TokenCache(settings.token_cache_seconds)

    boundary.install(app)

    @app.get("/healthz", tags=["health"])
    async def healthz(request: Request) -> JSONResponse:
        """Whether this process can serve the worker protocol: its database answers on the protocol's own
        thread and connection (steady.server.kit.capacity), so user requests cannot make it slow."""
        corruption = request.app.state.database.corruption
        if corruption:
            return JSONResponse({"status": "database corrupt", **error_body(corruption, 503, type="database_corrupt")},
                                status_code=503)
        protocol = request.app.state.protocol
        try:
            await protocol.run(protocol.database.ping)
        except Exception as exc:  # noqa: BLE001 - any failure to reach the database is "unavailable"
            log.warning("health check: database unavailable: %s", exc)
            return JSONResponse({"status": "database unavailable", **error_body("database unavailable", 503)},
                                status_code=503)
        return JSONResponse({"status": "ok", "version": __version__})

    for router in (studies_router, runs_router, workers_router, tokens_router, reports_router, alerts_router,
                   launches_router, code_router, localize_router, schedules_router):
        app.include_router(router, responses=ERROR_RESPONSES)
    for router in (metrics_router, mlflow_router, dashboard_router):  # text, MLflow's shapes, pages
        app.include_router(router)
    app.add_middleware(GZipFeeds)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes, code_limit=settings.max_code_bytes)
    app.add_middleware(boundary.InternalErrors)
    app.add_middleware(HeartbeatFastPath)  # the commonest request, answered past routing (app/web/fastpath.py)
    app.add_middleware(MetricsFastPath)  # the request with the most bytes, likewise
    app.add_middleware(SecurityHeaders)
    return app
