"""The heartbeat's short way through the application.

Every worker heartbeats its lease every ``STEADY_HEARTBEAT_SECONDS``; with a thousand workers
that is the request the server answers most. Through FastAPI it costs the event loop far more
than its database work (route matching over every route, dependency solving, four middlewares;
measured in bench/capacity_bench.py), and the event loop is the API process's one core.

``HeartbeatFastPath`` answers ``POST /api/v1/runs/{run_id}/heartbeat`` itself when the request is
the common one: a valid bearer token whose role may heartbeat (looked up once per
``STEADY_TOKEN_CACHE_SECONDS`` for all the requests that carry it, ``TokenCache.once``), a JSON
body that is a valid ``Heartbeat``, and a lease that the conditional UPDATE extends
(``transitions.heartbeat``, on the protocol's own threads and connections). It answers exactly
what the route answers. Heartbeats that arrive while others are being written are written
together, in one thread hop and one transaction (``HeartbeatBatch``): with many workers the hop to
a thread and the commit, not the UPDATE, were most of a heartbeat's cost. Anything else (no or
unknown token, a body that does not validate, a lease that is not the caller's, a database error)
goes on to the application unchanged, body included, so every refusal is the route's own
401/403/404/409/413/422; a refused heartbeat changed nothing (its UPDATE matched no row, or its
transaction was rolled back), so the route repeats it without effect.

``MetricsFastPath`` does the same for ``POST /api/v1/runs/{run_id}/metrics``, the request that carries
the most bytes: the body is validated once from its bytes (``MetricBatch.model_validate_json``), prepared
and stored through the process's group committer exactly as the route stores it (``ingest.prepare``,
``ingest.submit``), and answered after the commit. Anything else (no or unknown token, a body over
``STEADY_MAX_BODY_BYTES`` or one that does not validate, a batch over the points limit, any refusal or
error of the store) goes on to the route, body included: a refused batch wrote nothing (its savepoint
was rolled back, or its transaction), so the route repeats it and answers with its own error.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from steady.server.kit.auth import GRANTS, Role
from steady.server.kit.db import WriteSession
from steady.server.kit.deps import Principal, cached_protocol_bearer
from steady.server.kit.errors import SteadyError
from steady.server.lifecycle import ingest, transitions
from steady.worker.contract.protocol import Heartbeat, MetricBatch

_PATH = re.compile(r"/api/v1/runs/([1-9][0-9]{0,17})/heartbeat")
_METRICS_PATH = re.compile(r"/api/v1/runs/([1-9][0-9]{0,17})/metrics")
# A heartbeat is a lease id and a step; a bigger body is read no further here.
MAX_BODY = 4096


def _beat_all(session: WriteSession, items: list[tuple[int, Heartbeat, Principal]], settings: Any) -> list[Any]:
    """Each heartbeat in one transaction: its acknowledgement, or the refusal it raised (a refused
    heartbeat changed nothing: its UPDATE matched no row). On PostgreSQL the heartbeats of distinct
    runs by worker tokens are one statement first; the others, and any that did not match, one by
    one. A database error ends them all."""
    out: list[Any] = [None] * len(items)
    if session.connection().dialect.name == "postgresql":
        seen: set[int] = set()
        batch = []
        for i, (run_id, _, principal) in enumerate(items):
            if run_id not in seen and principal.role is not Role.admin:
                seen.add(run_id)
                batch.append(i)
        if batch:
            for i, ack in zip(batch, transitions.heartbeat_many(session, [items[i] for i in batch], settings),
                              strict=True):
                out[i] = ack
    for i, (run_id, beat, principal) in enumerate(items):
        if out[i] is None:
            try:
                out[i] = transitions.heartbeat(session, run_id, beat, settings, principal)
            except SteadyError as exc:
                out[i] = exc
    return out


class HeartbeatBatch:
    """Heartbeats queued while a write of earlier ones is in flight, written together next."""

    def __init__(self) -> None:
        self.pending: list[tuple[tuple[int, Heartbeat, Principal], asyncio.Future]] = []
        self.writer: asyncio.Task | None = None

    async def submit(self, app: Any, item: tuple[int, Heartbeat, Principal]) -> Any:
        loop = asyncio.get_running_loop()
        if self.writer is not None and (self.writer.done() or self.writer.get_loop() is not loop):
            self.writer, self.pending = None, []  # an earlier event loop's (in-process test clients)
        future = loop.create_future()
        self.pending.append((item, future))
        if self.writer is None:
            self.writer = asyncio.ensure_future(self._drain(app))
        return await future

    async def _drain(self, app: Any) -> None:
        batch: list[tuple[tuple[int, Heartbeat, Principal], asyncio.Future]] = []
        try:
            while self.pending:
                batch, self.pending = self.pending, []
                try:
                    results = await app.state.protocol.write(_beat_all, [item for item, _ in batch], app.state.settings)
                except Exception as exc:  # noqa: BLE001 - each request's route answers it
                    results = [exc] * len(batch)
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(result)
                batch = []
        finally:
            self.writer = None
            for _, future in batch + self.pending:  # cancelled (shutdown): the routes answer
                if not future.done():
                    future.set_result(None)
            self.pending = []


class _ShortWay:
    """A POST to one path answered past routing when ``_answer`` can (its 200 JSON body), else passed on to
    the application with the request's body as received."""

    path: re.Pattern[str]

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    def max_body(self, scope: Scope) -> int:
        return MAX_BODY

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = None
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("query_string"):
            match = self.path.fullmatch(scope["path"])
        limit = self.max_body(scope) if match is not None else 0
        if match is None or _declared_length(scope) > limit:  # a body over the limit is the application's to refuse
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        size, complete = 0, False
        while size <= limit:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                complete = True
                break
        body = None
        if complete and size <= limit:
            body = messages[0].get("body", b"") if len(messages) == 1 else b"".join(m.get("body", b"") for m in messages)
        answer = await self._answer(scope, int(match[1]), body) if body is not None else None
        if answer is not None:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(answer)).encode())]})
            await send({"type": "http.response.body", "body": answer})
            return

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _answer(self, scope: Scope, run_id: int, body: bytes) -> bytes | None:
        raise NotImplementedError


def _declared_length(scope: Scope) -> int:
    """The request's Content-Length (0 when it sends none, or one that is not a number)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else 0
    return 0


async def _worker_caller(scope: Scope) -> Principal | None:
    """The caller of a JSON request with a bearer token whose role may speak the worker protocol, else None."""
    token = content_type = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            token = value
        elif name == b"content-type":
            content_type = value
    if token is None or content_type is None or content_type.split(b";")[0].strip() != b"application/json":
        return None
    scheme, _, secret = token.decode("latin-1").partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        return None
    try:
        principal = await cached_protocol_bearer(scope["app"], secret.strip())
    except Exception:  # noqa: BLE001 - the database failed the lookup: the route answers
        return None
    if principal is None or principal.role not in GRANTS[Role.worker]:
        return None
    return principal


class HeartbeatFastPath(_ShortWay):
    path = _PATH

    def __init__(self, app: ASGIApp) -> None:
        super().__init__(app)
        self.batch = HeartbeatBatch()

    async def _answer(self, scope: Scope, run_id: int, body: bytes) -> bytes | None:
        """The route's 200 answer, or None to let the route answer."""
        principal = await _worker_caller(scope)
        if principal is None:
            return None
        try:
            beat = Heartbeat.model_validate_json(body)
        except ValidationError:
            return None
        ack = await self.batch.submit(scope["app"], (run_id, beat, principal))
        if ack is None or isinstance(ack, BaseException):
            return None  # the route answers it (it repeats the heartbeat, which changed nothing)
        return ack.model_dump_json().encode()


class MetricsFastPath(_ShortWay):
    path = _METRICS_PATH

    def max_body(self, scope: Scope) -> int:
        return scope["app"].state.settings.max_body_bytes

    async def _answer(self, scope: Scope, run_id: int, body: bytes) -> bytes | None:
        """The route's 200 answer (the batch is committed), or None to let the route answer."""
        principal = await _worker_caller(scope)
        if principal is None:
            return None
        try:
            batch = MetricBatch.model_validate_json(body)
        except ValidationError:
            return None
        app = scope["app"]
        settings = app.state.settings
        try:
            prepared = ingest.prepare(run_id, batch, settings)
        except Exception:  # noqa: BLE001 - over the points limit (413), or any other refusal: the route's
            return None
        try:
            ack = await ingest.submit(app.state.committer, prepared, settings, principal)
        except Exception:  # noqa: BLE001 - refused or failed, nothing of it stored: the route answers
            return None
        return ack.model_dump_json().encode()
