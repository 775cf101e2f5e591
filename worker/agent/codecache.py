"""A worker's cache of study code archives: fetched once per digest, verified, unpacked per run.

Runs never get the cache's path, and with ``--run-as`` they cannot reach it at all (the directory
is the agent's, mode 0700). Without ``--run-as`` a run is the agent's own user, so it *can* write
there: every entry is therefore checked each time it is used, not trusted because it is cached.
It is opened without following a link and without blocking (a FIFO put in its place must not
hang the agent), must be a regular file no larger than an archive may be, and its bytes must
hash to its name; anything else is removed and fetched again. The bytes that were hashed are the
bytes unpacked (read once into memory), so a file swapped after the check changes nothing. The
worst a run can do to the cache is cost another run one download.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable

from steady.worker.contract import codepack

_lock = threading.Lock()
log = logging.getLogger("steady.worker")
FETCH_PREFIX = ".fetch-"


def _private_dir(path: str) -> None:
    """``path`` as a real directory of this user, mode 0700: a link or a file put in its place
    (by a run of this user) is moved aside rather than followed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        os.makedirs(path, mode=0o700, exist_ok=True)  # another agent on this work dir may make it first
        return
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        aside = tempfile.mkdtemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".code-cache-replaced-")
        os.replace(path, os.path.join(aside, "entry"))
        shutil.rmtree(aside, ignore_errors=True)
        os.makedirs(path, mode=0o700, exist_ok=True)
    elif stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)


def _remove(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path, ignore_errors=True)
    else:
        os.unlink(path)


def _cached(path: str, sha256: str, max_bytes: int) -> bytes | None:
    """The entry's bytes when it is a regular file whose bytes hash to ``sha256``, else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EACCES, errno.EISDIR):  # a link, a socket, ...
            return None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(max_bytes + 1)
    finally:
        os.close(fd)
    return data if len(data) <= max_bytes and codepack.sha256_of(data) == sha256 else None


def archive(cache_dir: str, sha256: str, fetch: Callable[[str], bytes],
            max_bytes: int = codepack.DEFAULT_MAX_CODE_BYTES) -> bytes:
    """The archive's bytes from the cache, else fetched (``fetch(sha256)``), checked and cached.

    A download whose digest differs is refused (never cached); a cached entry that is not a
    regular file matching its name (disk damage, or a run of this user that wrote there) is
    removed and fetched again.
    """
    path = os.path.join(cache_dir, f"{sha256}.tar.gz")
    with _lock:  # runs of one agent share the cache: one download per digest
        _private_dir(cache_dir)
        data = _cached(path, sha256, max_bytes)
        if data is not None:
            return data
        _remove(path)
        data = fetch(sha256)
        actual = codepack.sha256_of(data)
        if actual != sha256:
            raise codepack.CodeError(f"code archive {sha256} downloaded with digest {actual}: refused")
        fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=FETCH_PREFIX)
        try:
            with contextlib.suppress(OSError):  # held while it is written: a sweep at start leaves it alone
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return data


def sweep(cache_dir: str) -> int:
    """Remove ``.fetch-*`` files that no download holds (an agent killed mid-write, a full disk): at
    start. Another agent's download in flight on a shared work dir holds its file locked and is kept."""
    removed = 0
    try:
        names = [n for n in os.listdir(cache_dir) if n.startswith(FETCH_PREFIX)]
    except (FileNotFoundError, NotADirectoryError):
        return 0
    for name in names:
        path = os.path.join(cache_dir, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:  # gone already, or a link or FIFO a run put there: removed without opening it
            with contextlib.suppress(OSError):
                _remove(path)
                removed += 1
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a download of another agent, in flight
        finally:
            os.close(fd)
        with contextlib.suppress(OSError):
            _remove(path)
            removed += 1
    if removed:
        log.info("removed %d unfinished code download(s) from %s", removed, cache_dir)
    return removed


def unpack_for_run(cache_dir: str, sha256: str, run_dir: str, fetch: Callable[[str], bytes],
                   limits: codepack.Limits = codepack.DEFAULT_LIMITS,
                   stop: Callable[[], str | None] | None = None) -> str:
    """A fresh copy of the code in ``<run_dir>/code`` (safely extracted, within ``limits``;
    ``stop()`` may give up between files); returns its path."""
    dest = os.path.join(os.path.abspath(run_dir), "code")
    codepack.extract(archive(cache_dir, sha256, fetch), dest, limits, stop)
    return dest
