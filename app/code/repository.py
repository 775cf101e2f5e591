"""SQL of code archives: their metadata row and, with the database store, their chunks."""

from __future__ import annotations

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from steady.server.models import CodeArchive, CodeChunk

CHUNK_BYTES = 1024 * 1024


def get(session: Session, sha256: str) -> CodeArchive | None:
    return session.get(CodeArchive, sha256)


def add(session: Session, sha256: str, size: int, files: list[str], store: str) -> CodeArchive:
    row = CodeArchive(sha256=sha256, size=size, files=files, store=store)
    session.add(row)
    session.flush()
    return row


def put_chunks(session: Session, sha256: str, data: bytes) -> None:
    session.execute(
        insert(CodeChunk),
        [{"sha256": sha256, "idx": i, "data": data[off:off + CHUNK_BYTES]}
         for i, off in enumerate(range(0, len(data), CHUNK_BYTES))] or [{"sha256": sha256, "idx": 0, "data": b""}],
    )


def read_chunks(session: Session, sha256: str) -> bytes:
    rows = session.scalars(select(CodeChunk.data).where(CodeChunk.sha256 == sha256).order_by(CodeChunk.idx))
    return b"".join(rows)
