"""A worker's cache of study code archives: fetched once per digest, verified, unpacked per run."""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable

from steady.worker.contract import codepack

_lock = threading.Lock()


def archive(cache_dir: str, sha256: str, fetch: Callable[[str], bytes]) -> bytes:
    """The archive's bytes from the cache, else fetched (``fetch(sha256)``), checked and cached.

    A download whose digest differs is refused (never cached); a cached file that no longer
    matches its name (disk corruption) is fetched again.
    """
    path = os.path.join(cache_dir, f"{sha256}.tar.gz")
    with _lock:  # runs of one agent share the cache: one download per digest
        try:
            with open(path, "rb") as f:
                data = f.read()
            if codepack.sha256_of(data) == sha256:
                return data
        except FileNotFoundError:
            pass
        data = fetch(sha256)
        actual = codepack.sha256_of(data)
        if actual != sha256:
            raise codepack.CodeError(f"code archive {sha256} downloaded with digest {actual}: refused")
        os.makedirs(cache_dir, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".fetch-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return data


def unpack_for_run(cache_dir: str, sha256: str, run_dir: str, fetch: Callable[[str], bytes]) -> str:
    """A fresh copy of the code in ``<run_dir>/code`` (safely extracted); returns its path."""
    dest = os.path.join(os.path.abspath(run_dir), "code")
    codepack.extract(archive(cache_dir, sha256, fetch), dest)
    return dest
