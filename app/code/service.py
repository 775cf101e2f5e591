"""Code archives: store once by digest (verified), hand out to workers, check specs against them.

An upload is spooled to a temporary file (``.upload-*`` in ``<data_dir>/code``) as it streams in,
hashed and size-checked on the way, then read once more as a stream with the archive limits
enforced while it inflates (``codepack.scan``). None of that holds a database session: only the
final insert of the archive's row (and, with the database store, its chunks) is a transaction,
so a compression bomb costs its own request a bounded amount of CPU and never blocks a writer.
With the filesystem store the file and its directory are fsynced before the row commits, and a
re-upload of a digest whose file went missing puts the file back.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import logging
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

import steady.worker.contract.codepack as codepack  # noqa: PLR0402 - test_architecture allows the module, not the package
from steady.server.code import repository
from steady.server.kit.config import Settings
from steady.server.kit.db import Database
from steady.server.kit.errors import Forbidden, InsufficientStorage, Invalid, NotFound, TooLarge, Unavailable
from steady.server.models import CodeArchive

log = logging.getLogger("steady")

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
UPLOAD_PREFIX = ".upload-"
_COPY_CHUNK = 1024 * 1024


def _root(settings: Settings) -> Path:
    return settings.data_dir / "code"


def _path(settings: Settings, sha256: str) -> Path:
    return _root(settings) / sha256[:2] / f"{sha256}.tar.gz"


def limits(settings: Settings) -> codepack.Limits:
    return codepack.Limits(settings.max_code_unpacked_bytes, settings.max_code_files, settings.max_code_ratio)


def too_large(settings: Settings, size: int | None) -> TooLarge:
    what = f"code archive of {size} bytes" if size is not None else "code archive"
    return TooLarge(f"{what} is over the limit of {settings.max_code_bytes} bytes (STEADY_MAX_CODE_BYTES)")


def _disk_error(exc: OSError, where: Path) -> Exception:
    """A failed write to the code directory as an answer: 507 for a full disk, 503 otherwise."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return InsufficientStorage(f"no space left for the code archive in {where} (STEADY_DATA_DIR): "
                                   "nothing was stored; free disk space on the server and upload again")
    return Unavailable(f"the code archive could not be written to {where} (STEADY_DATA_DIR): "
                       f"{exc.strerror or exc}; nothing was stored")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Spool:
    """An upload on its way to disk: a ``.upload-*`` file, hashed and counted as chunks arrive.

    The file is locked (``flock``) while it lives, so a sweep at start (:func:`sweep_uploads`) of
    another API process on the same directory never takes an upload in flight; it is removed when
    the upload fails or once it was moved into place (:meth:`close`, always called).
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.size = 0
        self._hash = hashlib.sha256()
        root = _root(settings)
        try:
            root.mkdir(parents=True, exist_ok=True)
            fd, path = tempfile.mkstemp(dir=root, prefix=UPLOAD_PREFIX)
        except OSError as exc:
            raise _disk_error(exc, root) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            log.warning("code uploads: no flock on %s; a sweep at start cannot tell this upload is live", root)
        self.path: Path | None = Path(path)
        self.file: BinaryIO = self._open(fd)

    @staticmethod
    def _open(fd: int) -> BinaryIO:
        return os.fdopen(fd, "w+b")

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.settings.max_code_bytes:
            raise too_large(self.settings, None)
        self._hash.update(chunk)
        try:
            self.file.write(chunk)
        except OSError as exc:
            raise _disk_error(exc, _root(self.settings)) from None

    def finish(self, sha256: str) -> None:
        """Check the digest and make the bytes durable (flush and fsync)."""
        actual = self._hash.hexdigest()
        if actual != sha256:
            raise Invalid(("path", "sha256"), f"the body's SHA-256 is {actual}, not {sha256}: the upload was "
                          "corrupted or the digest is wrong")
        try:
            self.file.flush()
            os.fsync(self.file.fileno())
        except OSError as exc:
            raise _disk_error(exc, _root(self.settings)) from None
        self.file.seek(0)

    def place(self, target: Path) -> None:
        """Move the spooled file to ``target`` (same bytes under the same name: a concurrent upload
        of the digest is harmless), then fsync the directories so the name survives a crash."""
        assert self.path is not None
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(self.path, 0o644)
            os.replace(self.path, target)
            self.path = None
            _fsync_dir(target.parent)
            _fsync_dir(target.parent.parent)
        except OSError as exc:
            raise _disk_error(exc, target.parent) from None

    def chunks(self) -> Iterator[bytes]:
        self.file.seek(0)
        while chunk := self.file.read(repository.CHUNK_BYTES):
            yield chunk

    def close(self) -> None:
        try:
            self.file.close()
        except OSError:
            pass  # buffered bytes of a failed upload could not be written (a full disk): removed below
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self.path = None


def sweep_uploads(settings: Settings) -> int:
    """Remove ``.upload-*`` files no live upload holds (left by a crash or a kill -9): at start."""
    removed = 0
    root = _root(settings)
    for path in [*root.glob(UPLOAD_PREFIX + "*"), *root.glob(f"*/{UPLOAD_PREFIX}*")]:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # an upload of another process, in flight
        finally:
            os.close(fd)
        path.unlink(missing_ok=True)
        removed += 1
    if removed:
        log.info("removed %d unfinished code upload(s) from %s", removed, root)
    return removed


def _file_intact(path: Path, size: int) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == size


@dataclass(frozen=True)
class Stored:
    """What an upload answers: the archive's record, read out of its (closed) session."""

    sha256: str
    size: int
    files: int
    store: str

    @classmethod
    def of(cls, row: CodeArchive) -> Stored:
        return cls(row.sha256, row.size, len(row.files), row.store)


def _stored(database: Database, sha256: str) -> Stored | None:
    with database.read() as session:
        row = repository.get(session, sha256)
        return Stored.of(row) if row is not None else None


def store(database: Database, sha256: str, spool: Spool, settings: Settings) -> tuple[Stored, bool]:
    """Store a spooled upload under its digest; (row, created). Idempotent: a known digest is not
    checked or stored again, but a missing file of it is put back. Runs in one thread; the only
    transaction is the row's insert, after every check and after the file is durable."""
    spool.finish(sha256)
    existing = _stored(database, sha256)
    if existing is not None:
        if existing.store == "filesystem" and not _file_intact(_path(settings, sha256), existing.size):
            log.warning("code archive %s: its file was missing; restored from a re-upload", sha256)
            spool.place(_path(settings, sha256))
        return existing, False
    try:
        files = codepack.scan(spool.file, spool.size, limits(settings))
    except codepack.CodeError as exc:
        raise Invalid(("body",), str(exc)) from None
    if settings.code_store == "filesystem":
        spool.place(_path(settings, sha256))
    try:
        with database.write(queue=True) as session:
            stored = Stored.of(repository.add(session, sha256, spool.size, files, settings.code_store))
            if settings.code_store == "database":
                repository.put_chunks(session, sha256, spool.chunks())
        return stored, True
    except IntegrityError:  # a concurrent upload of the same digest committed first
        existing = _stored(database, sha256)
        if existing is None:
            raise
        return existing, False


def get(session: Session, sha256: str) -> CodeArchive:
    row = repository.get(session, sha256) if SHA256_RE.match(sha256) else None
    if row is None:
        raise NotFound(f"no code archive {sha256}")
    return row


def check_worker_may_read(session: Session, sha256: str, token_id: int) -> None:
    """A worker token reads only the code of runs its workers hold a lease on."""
    if sha256 not in repository.leased_code(session, token_id):
        raise Forbidden(f"a worker token fetches only the code of runs its workers lease; no run leased with "
                        f"this token runs code {sha256}")


def file_path(settings: Settings, row: CodeArchive) -> Path:
    """The archive's file (filesystem store), or 404 naming where it should be."""
    path = _path(settings, row.sha256)
    if not _file_intact(path, row.size):
        raise NotFound(f"code archive {row.sha256} is recorded but its file is missing from "
                       f"{path.parent} (STEADY_DATA_DIR); uploading it again restores it")
    return path


def stream_chunks(database: Database, sha256: str) -> tuple[list[int], Iterator[bytes]]:
    """The archive's chunks (database store) read one at a time, each in a short read session,
    so a download holds neither the whole archive in memory nor a transaction while it is sent."""
    with database.read() as session:
        indexes = repository.chunk_indexes(session, sha256)

    def chunks() -> Iterator[bytes]:
        for idx in indexes:
            with database.read() as session:
                yield repository.read_chunk(session, sha256, idx)

    return indexes, chunks()


@contextlib.contextmanager
def open_archive(session: Session, sha256: str, settings: Settings) -> Iterator[tuple[BinaryIO, int]]:
    """The archive as a file read a chunk at a time, and its size (for the comparison of two archives'
    files; downloads stream their own way): never the whole archive in memory."""
    row = get(session, sha256)
    if row.store == "database":
        chunks = (repository.read_chunk(session, sha256, i) for i in repository.chunk_indexes(session, sha256))
        with io.BufferedReader(codepack.ChunkReader(chunks)) as f:
            yield f, row.size
        return
    with file_path(settings, row).open("rb") as f:
        yield f, row.size


MAX_UNPACKED_FOR_DIGESTS = 512 * 1024 * 1024
SPEC_SUFFIXES = (".yaml", ".yml", ".json")
SPEC_KEEP_BYTES = 64 * 1024


def file_digests(session: Session, sha256: str, settings: Settings, *,
                 keep_max: int = SPEC_KEEP_BYTES) -> tuple[dict[str, str], dict[str, bytes]]:
    """Each file's SHA-256 in the archive ``sha256``, and the bytes of its YAML/JSON files of at most
    ``keep_max`` bytes (a spec among them is told apart from the code). Reads the archive once, a chunk
    at a time; keeps nothing: the caller keeps what it derives (``steady.server.reports.compare`` keeps
    small results per archive, never file bytes). Raises ``NotFound`` or ``codepack.CodeError``."""
    with open_archive(session, sha256, settings) as (f, size):
        return codepack.file_digests(f, size, max_unpacked=MAX_UNPACKED_FOR_DIGESTS, keep=SPEC_SUFFIXES,
                                     keep_max=keep_max)
