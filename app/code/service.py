"""Code archives: store once by digest (verified), hand out to workers, check specs against them."""

from __future__ import annotations

import os
import re
import tempfile
import threading
from pathlib import Path

from sqlalchemy.orm import Session

import steady.worker.contract.codepack as codepack  # noqa: PLR0402 - test_architecture allows the module, not the package
from steady.server.code import repository
from steady.server.kit.config import Settings
from steady.server.kit.errors import Invalid, NotFound, TooLarge
from steady.server.models import CodeArchive

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def _path(settings: Settings, sha256: str) -> Path:
    return settings.data_dir / "code" / sha256[:2] / f"{sha256}.tar.gz"


def put(session: Session, sha256: str, data: bytes, settings: Settings) -> tuple[CodeArchive, bool]:
    """Store an archive under its digest; (row, created). Idempotent: a known digest is not stored again."""
    if len(data) > settings.max_code_bytes:
        raise TooLarge(f"code archive of {len(data)} bytes is over the limit of {settings.max_code_bytes} "
                       "bytes (STEADY_MAX_CODE_BYTES)")
    actual = codepack.sha256_of(data)
    if actual != sha256:
        raise Invalid(("path", "sha256"), f"the body's SHA-256 is {actual}, not {sha256}: the upload was "
                      "corrupted or the digest is wrong")
    existing = repository.get(session, sha256)
    if existing is not None:
        return existing, False
    try:
        files = codepack.file_list(data)
    except codepack.CodeError as exc:
        raise Invalid(("body",), str(exc)) from None
    if settings.code_store == "database":
        row = repository.add(session, sha256, len(data), files, "database")
        repository.put_chunks(session, sha256, data)
        return row, True
    path = _path(settings, sha256)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".upload-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)  # same digest, same bytes: a concurrent upload of it is harmless
    return repository.add(session, sha256, len(data), files, "filesystem"), True


def get(session: Session, sha256: str) -> CodeArchive:
    row = repository.get(session, sha256) if SHA256_RE.match(sha256) else None
    if row is None:
        raise NotFound(f"no code archive {sha256}")
    return row


def read(session: Session, sha256: str, settings: Settings) -> bytes:
    row = get(session, sha256)
    if row.store == "database":
        return repository.read_chunks(session, sha256)
    try:
        return _path(settings, sha256).read_bytes()
    except FileNotFoundError:
        raise NotFound(f"code archive {sha256} is recorded but its file is missing from "
                       f"{_path(settings, sha256).parent} (STEADY_DATA_DIR)") from None


MAX_UNPACKED_FOR_DIGESTS = 512 * 1024 * 1024
SPEC_SUFFIXES = (".yaml", ".yml", ".json")
_digest_cache: dict[str, tuple[dict[str, str], dict[str, bytes]]] = {}
_DIGEST_CACHE_SIZE = 32
_digest_lock = threading.Lock()


def file_digests(session: Session, sha256: str, settings: Settings) -> tuple[dict[str, str], dict[str, bytes]]:
    """Each file's SHA-256 in the archive ``sha256``, and the bytes of its small YAML/JSON files (a
    spec among them is told apart from the code). An archive never changes under its digest, so the
    answer is kept for the next comparison. Raises ``NotFound`` or ``codepack.CodeError``."""
    with _digest_lock:
        found = _digest_cache.get(sha256)
    if found is None:
        found = codepack.file_digests(read(session, sha256, settings), max_unpacked=MAX_UNPACKED_FOR_DIGESTS,
                                      keep=SPEC_SUFFIXES)
        with _digest_lock:
            while len(_digest_cache) >= _DIGEST_CACHE_SIZE:
                _digest_cache.pop(next(iter(_digest_cache)))
            _digest_cache[sha256] = found
    return found
