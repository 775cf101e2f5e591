"""Files inside a run's directory, opened by the agent without trusting the run.

With ``--run-as`` the run directory belongs to the run's user while the agent that reads it
stays root; without it they share a uid. Either way the run can replace any file there
(``output.log``, ``events.jsonl``, ``*.tfevents``) between two reads: with a symbolic link
to a file only the agent may read (its token file, another study's cached code), a FIFO
(``open`` blocks forever) or a device (``/dev/zero`` never ends). So every file the agent
reads or writes under a run directory is opened here: each directory below the run's is
entered with ``O_NOFOLLOW`` relative to its parent's descriptor (no symlinked folder can
lead outside), the file itself with ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO opens at once), and
only a regular file is kept. Callers bound how many bytes they read per pass.
"""

from __future__ import annotations

import errno
import os
import stat

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_DIR_OPEN = getattr(os, "O_PATH", os.O_RDONLY)  # O_PATH: a folder the caller may pass but not list
_UNSAFE_ERRNOS = {errno.ELOOP, errno.ENOTDIR, errno.ENXIO, errno.EMLINK}


class UnsafeFileError(OSError):
    """A path under the run directory the agent refuses to open; ``reason`` says why."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(errno.EPERM, f"{path}: {reason}")
        self.path, self.reason = path, reason


def _parts(path: str, root: str) -> list[str]:
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
    parts = rel.split(os.sep)
    if rel == os.curdir or os.path.isabs(rel) or os.pardir in parts:
        raise UnsafeFileError(path, "not a file inside the run directory")
    return parts


def _open_parent(path: str, root: str, parts: list[str]) -> int:
    """A descriptor of the leaf's folder, reached from ``root`` without following any symlink."""
    fd = os.open(root, _DIR_OPEN | _DIRECTORY | _CLOEXEC)
    try:
        for part in parts[:-1]:
            try:
                sub = os.open(part, _DIR_OPEN | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=fd)
            except OSError as exc:
                if exc.errno in _UNSAFE_ERRNOS:
                    raise UnsafeFileError(path, f"its folder {part!r} is a symbolic link or not a folder") from None
                raise
            os.close(fd)
            fd = sub
    except BaseException:
        os.close(fd)
        raise
    return fd


def _checked(fd: int, path: str, root: str) -> int:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafeFileError(path, "not a regular file (a FIFO, device or socket)")
    if st.st_nlink > 1 and st.st_uid != os.stat(root).st_uid:
        os.close(fd)  # a hard link to a file the run's user does not own
        raise UnsafeFileError(path, "a hard link to a file the run does not own")
    return fd


def open_fd(path: str, root: str, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """A descriptor of the regular file ``path`` under ``root``, opened with ``flags`` plus
    ``O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC``; :class:`UnsafeFileError` for a symlink (leaf or
    folder), FIFO, device or socket; other OSErrors (``FileNotFoundError``) as they come."""
    parts = _parts(path, root)
    if os.open not in os.supports_dir_fd:  # no openat(): the leaf is still never followed
        if os.path.commonpath([os.path.realpath(os.path.dirname(path)), os.path.realpath(root)]) != os.path.realpath(root):
            raise UnsafeFileError(path, "its folder is a symbolic link out of the run directory")
        return _checked(_leaf(path, None, flags, mode), path, root)
    parent = _open_parent(path, root, parts)
    try:
        return _checked(_leaf(parts[-1], parent, flags, mode, shown=path), path, root)
    finally:
        os.close(parent)


def _leaf(name: str, dir_fd: int | None, flags: int, mode: int, shown: str = "") -> int:
    try:
        return os.open(name, flags | _NOFOLLOW | _NONBLOCK | _CLOEXEC, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _UNSAFE_ERRNOS:
            raise UnsafeFileError(shown or name, "a symbolic link or not a regular file") from None
        raise


def read_at(path: str, root: str, offset: int, max_bytes: int) -> bytes:
    """At most ``max_bytes`` of ``path`` from ``offset`` (b"" past its end)."""
    fd = open_fd(path, root)
    try:
        return os.pread(fd, max(0, max_bytes), max(0, offset))
    finally:
        os.close(fd)


def read_tail(path: str, root: str, max_bytes: int) -> bytes:
    """The last ``max_bytes`` (at most) of ``path``."""
    fd = open_fd(path, root)
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, max_bytes, max(0, size - max_bytes))
    finally:
        os.close(fd)


def size(path: str) -> int:
    """Bytes in ``path`` when it is a regular file (never through a link); 0 otherwise."""
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def write_new(path: str, root: str, data: bytes) -> None:
    """Create or truncate the regular file ``path`` under ``root`` and write ``data`` into it
    (the agent's own files in the run directory: spec, config; a planted symlink is refused)."""
    fd = open_fd(path, root, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
