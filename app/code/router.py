from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, Path, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, StreamingResponse
from pydantic import BaseModel

from steady.server.code import service
from steady.server.kit.auth import Role
from steady.server.kit.db import Database
from steady.server.kit.deps import AppSettings, CodeReader, Principal, ReadDB, UserCaller, get_database
from steady.server.kit.errors import RequestTimeout

router = APIRouter(prefix="/api/v1/code", tags=["code"])
Sha256 = Annotated[str, Path(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the archive's bytes (lowercase hex)")]
_SPOOL_BYTES = 1024 * 1024  # what the request's chunks gather into before one write to the spool file
_IMMUTABLE = {"Cache-Control": "private, max-age=31536000, immutable"}


class CodeArchiveOut(BaseModel):
    sha256: str
    size: int
    files: int
    created: bool = False


_BODY = {"requestBody": {"required": True, "description": "the deterministic tar.gz that steady submit writes",
                         "content": {"application/gzip": {"schema": {"type": "string", "format": "binary"}}}}}


@router.put("/{sha256}", response_model=CodeArchiveOut, openapi_extra=_BODY)
async def put_code(
    sha256: Sha256,
    request: Request,
    caller: UserCaller,
    settings: AppSettings,
    database: Annotated[Database, Depends(get_database)],
) -> CodeArchiveOut:
    """Upload a study's code once, named by its digest; 422 when the bytes do not match it or the
    archive is not the format ``steady submit`` writes, unsafe, or unpacks past the limits
    (``STEADY_MAX_CODE_UNPACKED_BYTES``, ``STEADY_MAX_CODE_FILES``, ``STEADY_MAX_CODE_RATIO``,
    enforced while it inflates); 413 over ``STEADY_MAX_CODE_BYTES``; 507 on a full disk.

    Idempotent: uploading a digest the server holds returns its record (``created`` false), and
    puts its file back if it went missing. The body streams to disk; no database transaction is
    open until every check passed.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > settings.max_code_bytes:
        raise service.too_large(settings, int(declared))
    spool = await run_in_threadpool(service.Spool, settings)
    try:
        pending: list[bytes] = []
        size = 0
        async for chunk in _until_stalled(request, settings.upload_stall_seconds):
            pending.append(chunk)
            size += len(chunk)
            if size >= _SPOOL_BYTES:
                await run_in_threadpool(spool.write, b"".join(pending))
                pending, size = [], 0
        await run_in_threadpool(spool.write, b"".join(pending))
        row, created = await run_in_threadpool(service.store, database, sha256, spool, settings)
    finally:
        await run_in_threadpool(spool.close)
    return CodeArchiveOut(sha256=row.sha256, size=row.size, files=row.files, created=created)


async def _until_stalled(request: Request, stall_s: float) -> AsyncIterator[bytes]:
    """The request's body, chunk by chunk; 408 when no chunk came for ``stall_s`` seconds (a client that
    stopped sending must not hold its spool file and a connection open for ever)."""
    chunks = request.stream().__aiter__()
    while True:
        try:
            with anyio.fail_after(stall_s):
                chunk = await chunks.__anext__()
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise RequestTimeout(f"the upload stalled: nothing was received for {stall_s:g} s "
                                 "(STEADY_UPLOAD_STALL_SECONDS); nothing was stored") from None
        yield chunk


def _readable(db: ReadDB, sha256: str, caller: Principal):
    row = service.get(db, sha256)
    if caller.role == Role.worker:
        service.check_worker_may_read(db, sha256, caller.token_id)
    return row


@router.head("/{sha256}")
def head_code(sha256: Sha256, db: ReadDB, caller: CodeReader, settings: AppSettings) -> Response:
    """200 when the archive can be fetched: recorded and, in the filesystem store, its file in place (404
    otherwise, so `steady submit` uploads it again, which puts a missing file back)."""
    row = _readable(db, sha256, caller)
    if row.store == "filesystem":
        service.file_path(settings, row)  # 404 naming where the file should be
    return Response(status_code=200, headers={"Content-Length": str(row.size), "Content-Type": "application/gzip"})


@router.get("/{sha256}", response_class=Response,
            responses={200: {"content": {"application/gzip": {}}, "description": "the archive's bytes"}})
def get_code(sha256: Sha256, db: ReadDB, caller: CodeReader, settings: AppSettings,
             database: Annotated[Database, Depends(get_database)]) -> Response:
    """The archive, streamed (workers fetch it by digest and verify it before unpacking). A worker
    token fetches only the code of runs its workers hold a lease on (403 otherwise)."""
    row = _readable(db, sha256, caller)
    if row.store == "filesystem":
        return FileResponse(service.file_path(settings, row), media_type="application/gzip", headers=_IMMUTABLE)
    _, chunks = service.stream_chunks(database, sha256)
    return StreamingResponse(chunks, media_type="application/gzip",
                             headers={**_IMMUTABLE, "Content-Length": str(row.size)})
