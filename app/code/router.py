from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Path, Response
from pydantic import BaseModel

from steady.server.code import service
from steady.server.kit.deps import AppSettings, CodeReader, ReadDB, UserCaller, WriteDB

router = APIRouter(prefix="/api/v1/code", tags=["code"])
Sha256 = Annotated[str, Path(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the archive's bytes (lowercase hex)")]


class CodeArchiveOut(BaseModel):
    sha256: str
    size: int
    files: int
    created: bool = False


@router.put("/{sha256}", response_model=CodeArchiveOut)
def put_code(
    sha256: Sha256,
    db: WriteDB,
    caller: UserCaller,
    settings: AppSettings,
    body: Annotated[bytes, Body(media_type="application/gzip", description="the deterministic tar.gz")],
) -> CodeArchiveOut:
    """Upload a study's code once, named by its digest; 422 when the bytes do not match it.

    Idempotent: uploading a digest the server holds returns its record (``created`` false).
    """
    row, created = service.put(db, sha256, body, settings)
    return CodeArchiveOut(sha256=row.sha256, size=row.size, files=len(row.files), created=created)


@router.head("/{sha256}")
def head_code(sha256: Sha256, db: ReadDB, caller: CodeReader) -> Response:
    row = service.get(db, sha256)
    return Response(status_code=200, headers={"Content-Length": str(row.size), "Content-Type": "application/gzip"})


@router.get("/{sha256}", response_class=Response,
            responses={200: {"content": {"application/gzip": {}}, "description": "the archive's bytes"}})
def get_code(sha256: Sha256, db: ReadDB, caller: CodeReader, settings: AppSettings) -> Response:
    """The archive (workers fetch it by digest and verify it before unpacking)."""
    return Response(service.read(db, sha256, settings), media_type="application/gzip",
                    headers={"Cache-Control": "private, max-age=31536000, immutable"})
