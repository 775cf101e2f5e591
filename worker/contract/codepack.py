"""A study's code as a content-addressed archive: pack (CLI), list and safely unpack (server, worker).

The archive is a gzip-compressed tar built deterministically: names sorted, every member a
regular file with mtime 0, uid/gid 0, no user/group names, mode 0644 (0755 when executable),
and a gzip header without timestamp or file name. The same tree therefore always gives the
same bytes, and their SHA-256 is the archive's name (``PUT /api/v1/code/{sha256}``).

Unpacking refuses anything that could write outside the target directory: absolute names,
``..`` components, links, devices, FIFOs. Needs the standard library only (the worker and the
CLI both use it; the server imports it as ``app -> worker``).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import posixpath
import stat
import subprocess
import tarfile
import zlib
from dataclasses import dataclass

DEFAULT_MAX_CODE_BYTES = 50 * 1024 * 1024
_GZIP_LEVEL = 6


class CodeError(ValueError):
    """The code cannot be packed or an archive is unsafe or malformed; the message says why."""


@dataclass(frozen=True)
class Packed:
    data: bytes
    sha256: str
    files: list[str]
    git_commit: str | None
    dirty: bool


def _git(args: list[str], cwd: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return None
    return out.stdout.decode("utf-8", "surrogateescape")


def git_root(path: str) -> str | None:
    """The top of the git work tree that holds ``path``, or None when it is not in one."""
    out = _git(["rev-parse", "--show-toplevel"], path)
    return out.strip() if out else None


def list_files(root: str) -> tuple[list[str], str | None, bool]:
    """Files to ship from ``root`` (relative POSIX names), its git commit and whether the tree is dirty.

    In a git work tree: tracked plus untracked-not-ignored files (``git ls-files -co
    --exclude-standard``), deleted ones left out. Elsewhere: every regular file under ``root``.
    """
    root = os.path.abspath(root)
    listed = _git(["ls-files", "-z", "-co", "--exclude-standard"], root)
    if listed is not None and git_root(root) is not None:
        names = sorted({n for n in listed.split("\0") if n and os.path.lexists(os.path.join(root, n))})
        head = _git(["rev-parse", "HEAD"], root)
        status = _git(["status", "--porcelain", "--untracked-files=normal", "--", "."], root)
        return names, (head.strip() or None) if head else None, bool(status and status.strip())
    names = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in (".git", "__pycache__"))
        for f in filenames:
            names.append(os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/"))
    return sorted(names), None, False


def pack(root: str, files: list[str] | None = None, *, max_bytes: int = DEFAULT_MAX_CODE_BYTES) -> Packed:
    """The deterministic archive of ``files`` (default :func:`list_files`) under ``root``."""
    root = os.path.realpath(root)
    git_commit, dirty = None, False
    if files is None:
        files, git_commit, dirty = list_files(root)
    buf = io.BytesIO()
    total = 0
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=_GZIP_LEVEL) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(files):
            check_name(name)
            path = os.path.join(root, *name.split("/"))
            real = os.path.realpath(path)
            if os.path.commonpath([real, root]) != root:
                raise CodeError(f"{name} is a link to {real}, outside the code directory {root}")
            st = os.stat(real)
            if not stat.S_ISREG(st.st_mode):
                continue  # a directory symlink or a special file: not code
            total += st.st_size
            if total > max_bytes:
                raise CodeError(
                    f"the code in {root} is over the limit of {max_bytes / (1024 * 1024):g} MB "
                    f"(STEADY_MAX_CODE_BYTES on the server, --max-code-mb for submit) at {name}: "
                    "ship data separately or ignore it in .gitignore"
                )
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.uid, info.gid, info.uname, info.gname = st.st_size, 0, 0, 0, "", ""
            info.mode = 0o755 if st.st_mode & 0o111 else 0o644
            with open(real, "rb") as f:
                tar.addfile(info, f)
    data = buf.getvalue()
    return Packed(data, hashlib.sha256(data).hexdigest(), sorted(files), git_commit, dirty)


def check_name(name: str) -> str:
    """``name`` as a safe relative POSIX path, or CodeError."""
    if not name or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise CodeError(f"unsafe archive member {name!r}: absolute path")
    parts = name.replace("\\", "/").split("/")
    if ".." in parts:
        raise CodeError(f"unsafe archive member {name!r}: '..' leaves the code directory")
    if "\0" in name:
        raise CodeError(f"unsafe archive member {name!r}: NUL in name")
    return posixpath.normpath(name)


def _members(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    members = []
    for m in tar.getmembers():
        check_name(m.name)
        if m.isdir():
            continue
        if not m.isreg():
            kind = "link" if (m.issym() or m.islnk()) else "device or special file"
            raise CodeError(f"unsafe archive member {m.name!r}: a {kind} (only regular files are allowed)")
        members.append(m)
    return members


# What a damaged archive raises while it is read: a corrupt gzip stream raises zlib.error, which
# is none of tarfile's or the OS's errors.
_CORRUPT = (tarfile.TarError, OSError, EOFError, zlib.error)


def _open(data: bytes) -> tarfile.TarFile:
    try:
        return tarfile.open(fileobj=io.BytesIO(data), mode="r:*")
    except _CORRUPT as exc:
        raise CodeError(f"not a tar.gz archive: {exc}") from None


def file_list(data: bytes) -> list[str]:
    """Names of the regular files in an archive, after checking every member is safe."""
    try:
        with _open(data) as tar:
            return sorted(posixpath.normpath(m.name) for m in _members(tar))
    except _CORRUPT as exc:
        raise CodeError(f"not a tar.gz archive: {exc}") from None


def extract(data: bytes, dest: str) -> list[str]:
    """Unpack into the new directory ``dest``: regular files only, each checked to land inside it."""
    dest = os.path.realpath(dest)
    os.makedirs(dest, exist_ok=False)
    try:
        return _extract(data, dest)
    except _CORRUPT as exc:
        if isinstance(exc, OSError) and not isinstance(exc, gzip.BadGzipFile):
            raise  # the disk (full, permissions), not the archive
        raise CodeError(f"not a tar.gz archive: {exc}") from None


def _extract(data: bytes, dest: str) -> list[str]:
    names = []
    with _open(data) as tar:
        for m in _members(tar):
            name = posixpath.normpath(m.name)
            target = os.path.realpath(os.path.join(dest, *name.split("/")))
            if os.path.commonpath([target, dest]) != dest:
                raise CodeError(f"unsafe archive member {m.name!r}: lands outside {dest}")
            os.makedirs(os.path.dirname(target), exist_ok=True)
            src = tar.extractfile(m)
            assert src is not None
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755 if m.mode & 0o111 else 0o644)
            with os.fdopen(fd, "wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
            names.append(name)
    return names


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def script_of(command: list[str]) -> str | None:
    """The first ``*.py`` argument of a command (its script), or None."""
    return next((a for a in command if a.endswith(".py") and "{" not in a), None)


def entrypoint_file(entrypoint: str) -> str:
    """The file an entrypoint lives in: 'path.py[:fn]' -> path.py, 'pkg.mod:fn' -> pkg/mod.py."""
    target, _, _ = entrypoint.partition(":")
    if target.endswith(".py"):
        return target
    return target.replace(".", "/") + ".py"


def present(name: str, files: set[str] | list[str], workdir: str = ".") -> bool:
    """Whether ``name`` (relative to ``workdir`` inside the archive) is a file of the archive;
    for a module, ``pkg/mod.py`` or ``pkg/mod/__init__.py``."""
    files = set(files)
    path = posixpath.normpath(posixpath.join(workdir, name))
    if path in files:
        return True
    return path.endswith(".py") and path[:-3] + "/__init__.py" in files


def file_digests(data: bytes, *, max_unpacked: int, keep: tuple[str, ...] = (),
                 keep_max: int = 256 * 1024) -> tuple[dict[str, str], dict[str, bytes]]:
    """The SHA-256 of each regular file's bytes ({name: hex}), so two archives can be compared file by
    file; and the bytes of the files whose name ends with one of ``keep`` (at most ``keep_max`` each).
    Reads at most ``max_unpacked`` bytes of file content in all: a larger archive raises ``CodeError``
    (an archive small when packed may unpack to far more)."""
    digests: dict[str, str] = {}
    kept: dict[str, bytes] = {}
    left = max_unpacked
    try:
        with _open(data) as tar:
            for m in _members(tar):
                name = posixpath.normpath(m.name)
                src = tar.extractfile(m)
                assert src is not None
                h = hashlib.sha256()
                small = name.endswith(keep) if keep else False
                buf = bytearray()
                while chunk := src.read(1 << 20):
                    left -= len(chunk)
                    if left < 0:
                        raise CodeError(f"the archive unpacks to more than {max_unpacked} bytes")
                    h.update(chunk)
                    if small and len(buf) <= keep_max:
                        buf += chunk
                digests[name] = h.hexdigest()
                if small and len(buf) <= keep_max:
                    kept[name] = bytes(buf)
    except _CORRUPT as exc:
        raise CodeError(f"not a tar.gz archive: {exc}") from None
    return digests, kept
