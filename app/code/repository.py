"""SQL of code archives: their metadata row and, with the database store, their chunks."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from steady.server.models import CodeArchive, CodeChunk, Run, Study, Worker
from steady.worker.contract.protocol import RunStatus

CHUNK_BYTES = 1024 * 1024


def get(session: Session, sha256: str) -> CodeArchive | None:
    return session.get(CodeArchive, sha256)


def add(session: Session, sha256: str, size: int, files: list[str], store: str) -> CodeArchive:
    row = CodeArchive(sha256=sha256, size=size, files=files, store=store)
    session.add(row)
    session.flush()
    return row


def put_chunks(session: Session, sha256: str, chunks: Iterable[bytes]) -> None:
    """Insert the archive's chunks, one statement each (an empty archive is one empty chunk)."""
    count = 0
    for idx, data in enumerate(chunks):
        session.execute(insert(CodeChunk), [{"sha256": sha256, "idx": idx, "data": data}])
        count += 1
    if not count:
        session.execute(insert(CodeChunk), [{"sha256": sha256, "idx": 0, "data": b""}])


def chunk_indexes(session: Session, sha256: str) -> list[int]:
    return list(session.scalars(select(CodeChunk.idx).where(CodeChunk.sha256 == sha256).order_by(CodeChunk.idx)))


def read_chunk(session: Session, sha256: str, idx: int) -> bytes:
    data = session.scalar(select(CodeChunk.data).where(CodeChunk.sha256 == sha256, CodeChunk.idx == idx))
    return data or b""


def leased_code(session: Session, token_id: int) -> set[str]:
    """Digests of the code that runs now leased by the workers of ``token_id`` run: the study's
    archive and those of its arms (an arm may ship its own)."""
    studies = session.scalars(
        select(Study).where(Study.id.in_(
            select(Run.study_id).join(Worker, Run.worker_id == Worker.id)
            .where(Worker.token_id == token_id, Run.status == RunStatus.running.value)))
    )
    out: set[str] = set()
    for study in studies:
        if study.code_sha256:
            out.add(study.code_sha256)
        for arm in (study.spec or {}).get("arms") or []:
            code = arm.get("code") if isinstance(arm, dict) else None
            if isinstance(code, dict) and isinstance(code.get("sha256"), str):
                out.add(code["sha256"])
    return out
