"""A study's code as a content-addressed archive: pack (CLI), list and safely unpack (server, worker).

The archive is a gzip-compressed tar built deterministically: names sorted, every member a
regular file with mtime 0, uid/gid 0, no user/group names, mode 0644 (0755 when executable),
and a gzip header without timestamp or file name. The same tree therefore always gives the
same bytes, and their SHA-256 is the archive's name (``PUT /api/v1/code/{sha256}``).

Reading (the server's check of an upload, the worker's unpacking) accepts that format only, and
checks it while it inflates, never after: limits on unpacked bytes, entries and compression
ratio (:class:`Limits`) stop a compression bomb within its budget, sparse members are refused
by their header, and unpacking refuses anything that could write outside the target directory:
absolute names, ``..`` components, links, devices, FIFOs. Needs the standard library only (the worker and the
CLI both use it; the server imports it as ``app -> worker``).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import posixpath
import shutil
import stat
import subprocess
import tarfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

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


# --- reading: a stream checked while it inflates -------------------------------------------------

DEFAULT_MAX_UNPACKED_BYTES = 1024 * 1024 * 1024
DEFAULT_MAX_FILES = 100_000
DEFAULT_MAX_RATIO = 200
# The ratio limit starts above this many unpacked bytes: a small archive of one repetitive file
# (a config of zeros, a generated table) compresses far better than code, and costs nothing.
RATIO_FLOOR_BYTES = 16 * 1024 * 1024
_MAX_PAX_BYTES = 64 * 1024  # a path is the only extended header the CLI writes
_BLOCK = 512
_INFLATE_CHUNK = 256 * 1024
_PAX_KEYS_IGNORED = frozenset({"mtime", "atime", "ctime", "uid", "gid", "uname", "gname", "comment"})
_SPECIAL = {b"3": "character device", b"4": "block device", b"6": "FIFO", b"7": "contiguous file"}


@dataclass(frozen=True)
class Limits:
    """What one archive may unpack to, enforced while it inflates (never after): bytes of the tar
    stream, entries, and bytes per byte of archive above :data:`RATIO_FLOOR_BYTES`. The server
    reads them from its settings, the worker from the environment (:meth:`from_env`): the same
    ``STEADY_MAX_CODE_*`` names on both sides."""

    max_unpacked_bytes: int = DEFAULT_MAX_UNPACKED_BYTES
    max_files: int = DEFAULT_MAX_FILES
    max_ratio: float = DEFAULT_MAX_RATIO

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Limits:
        def number(name: str, default: float, kind: type) -> Any:
            raw = environ.get(name, "").strip()
            if not raw:
                return default
            try:
                value = kind(raw)
            except ValueError:
                raise CodeError(f"{name}={raw!r} is not a number") from None
            if value <= 0:
                raise CodeError(f"{name}={raw!r} must be positive")
            return value

        return cls(number("STEADY_MAX_CODE_UNPACKED_BYTES", DEFAULT_MAX_UNPACKED_BYTES, int),
                   number("STEADY_MAX_CODE_FILES", DEFAULT_MAX_FILES, int),
                   number("STEADY_MAX_CODE_RATIO", DEFAULT_MAX_RATIO, float))

    def budget(self, packed_bytes: int) -> int:
        """Unpacked bytes allowed for an archive of ``packed_bytes``."""
        return min(self.max_unpacked_bytes, max(RATIO_FLOOR_BYTES, int(self.max_ratio * packed_bytes)))

    def over_budget(self, packed_bytes: int) -> str:
        if self.budget(packed_bytes) == self.max_unpacked_bytes:
            return (f"it unpacks to more than {self.max_unpacked_bytes} bytes "
                    "(STEADY_MAX_CODE_UNPACKED_BYTES): refused as a compression bomb")
        return (f"it unpacks to more than {self.max_ratio:g} times its {packed_bytes} bytes "
                "(STEADY_MAX_CODE_RATIO): refused as a compression bomb")


DEFAULT_LIMITS = Limits()


class _Inflater:
    """The gzip stream of ``raw`` inflated on demand, never past ``budget`` bytes in all."""

    def __init__(self, raw: BinaryIO, budget: int, over: str) -> None:
        head = raw.read(3)
        if head[:2] != b"\x1f\x8b" or head[2:3] != b"\x08":
            kind = ("bzip2" if head.startswith(b"BZh") else "xz" if head.startswith(b"\xfd7z")
                    else "zstd" if head.startswith(b"\x28\xb5") else "not gzip")
            raise CodeError(f"not a tar.gz archive ({kind}): only the gzip-compressed tar that "
                            "steady submit writes is accepted")
        self._raw, self._budget, self._over = raw, budget, over
        self._z = zlib.decompressobj(wbits=31)
        self._pending = self._z.decompress(head)
        self._pos = 0  # what of _pending was handed out (slicing it off would copy the rest each read)
        self.inflated = len(self._pending)

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes (at least one unless the stream ended)."""
        while self._pos >= len(self._pending):
            if self._z.eof:
                return b""
            src = self._z.unconsumed_tail or self._raw.read(_INFLATE_CHUNK)
            if not src:
                raise CodeError("not a tar.gz archive: the gzip stream is truncated")
            self._pending, self._pos = self._z.decompress(src, _INFLATE_CHUNK), 0
            self.inflated += len(self._pending)
            if self.inflated > self._budget:
                raise CodeError(f"code archive refused: {self._over}")
        out = self._pending[self._pos:self._pos + n]
        self._pos += len(out)
        return out

    def read_exact(self, n: int) -> bytes:
        parts, got = [], 0
        while got < n:
            part = self.read(min(n - got, _INFLATE_CHUNK))
            if not part:
                raise CodeError("not a tar.gz archive: the tar stream ends inside a member")
            parts.append(part)
            got += len(part)
        return b"".join(parts)


@dataclass(frozen=True)
class _Member:
    name: str
    size: int
    mode: int
    kind: bytes


def _octal(field: bytes, what: str) -> int:
    text = field.rstrip(b"\0 ").lstrip(b" ")
    try:
        return int(text or b"0", 8)
    except ValueError:
        raise CodeError(f"not a tar.gz archive: the {what} field of a header is not octal") from None


def _pax(data: bytes) -> dict[str, str]:
    """Records ``"<len> <key>=<value>\\n"`` of a POSIX extended header."""
    out, pos = {}, 0
    while pos < len(data) and data[pos:pos + 1] != b"\0":
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space])
        except ValueError:
            raise CodeError("not a tar.gz archive: a damaged extended header") from None
        record = data[space + 1:pos + length]
        if length <= 0 or not record.endswith(b"\n") or b"=" not in record:
            raise CodeError("not a tar.gz archive: a damaged extended header")
        key, _, value = record[:-1].partition(b"=")
        try:
            out[key.decode("utf-8")] = value.decode("utf-8")
        except UnicodeDecodeError:
            raise CodeError("not a tar.gz archive: an extended header that is not UTF-8") from None
        pos += length
    return out


class _TarStream:
    """The members of the tar stream the CLI writes (POSIX ustar or pax headers, regular files),
    read once, in order. Counts entries and declared sizes against the limits before any data is
    read, and refuses every other kind of member by its header alone."""

    def __init__(self, source: _Inflater, limits: Limits, budget: int, over: str) -> None:
        self._src, self._limits, self._budget, self._over = source, limits, budget, over
        self._entries = 0
        self._declared = 0
        self._unread = 0  # data (and padding) of the last member not consumed yet
        self._names: set[str] = set()

    def _count(self) -> None:
        self._entries += 1
        if self._entries > self._limits.max_files:
            raise CodeError(f"code archive refused: it holds more than {self._limits.max_files} entries "
                            "(STEADY_MAX_CODE_FILES)")

    def _skip(self, n: int) -> None:
        while n > 0:
            got = self._src.read(min(n, _INFLATE_CHUNK))
            if not got:
                raise CodeError("not a tar.gz archive: the tar stream ends inside a member")
            n -= len(got)

    def _header(self) -> bytes | None:
        block = self._src.read_exact(_BLOCK)
        if block == bytes(_BLOCK):
            return None  # the end-of-archive marker: what follows is never read
        stored = _octal(block[148:156], "checksum")
        if stored != sum(block[:148]) + 8 * 32 + sum(block[156:]):
            raise CodeError("not a tar.gz archive: a header fails its checksum")
        if block[257:263] != b"ustar\0":
            raise CodeError("not a tar.gz archive: a header is not POSIX ustar/pax, the format steady "
                            "submit writes (GNU and v7 tar headers are refused)")
        return block

    def next(self) -> _Member | None:
        """The next regular file (directories are skipped: they are made as their files need
        them), or None at the end of the archive."""
        while True:
            self._skip(self._unread)
            self._unread = 0
            member = self._one()
            if member is None or member.kind != b"5":
                return member

    def _one(self) -> _Member | None:
        pax: dict[str, str] = {}
        while True:
            block = self._header()
            if block is None:
                return None
            self._count()
            kind = block[156:157]
            size = _octal(block[124:136], "size")
            if kind != b"x":
                break
            if size > _MAX_PAX_BYTES:
                raise CodeError(f"code archive refused: an extended header of {size} bytes")
            pax.update(_pax(self._src.read_exact(size)))
            self._skip(-size % _BLOCK)
        prefix, base = block[345:500].split(b"\0", 1)[0], block[:100].split(b"\0", 1)[0]
        try:
            name = pax.get("path") or (prefix + b"/" + base if prefix else base).decode("utf-8")
        except UnicodeDecodeError:
            raise CodeError(f"unsafe archive member {base!r}: a name that is not UTF-8") from None
        if any(k.startswith("GNU.sparse") for k in pax) or kind == b"S":
            raise CodeError(f"unsafe archive member {name!r}: a sparse file (only regular files are allowed)")
        unknown = sorted(set(pax) - _PAX_KEYS_IGNORED - {"path", "size"})
        if unknown:
            raise CodeError(f"unsafe archive member {name!r}: extended header keys {unknown} that steady "
                            "submit never writes")
        if "size" in pax:
            try:
                size = int(pax["size"])
            except ValueError:
                raise CodeError(f"unsafe archive member {name!r}: a size that is not a number") from None
        check_name(name)
        if kind in (b"1", b"2"):
            raise CodeError(f"unsafe archive member {name!r}: a link (only regular files are allowed)")
        if kind not in (b"0", b"\0", b"5"):
            what = _SPECIAL.get(kind, f"member of type {kind!r}")
            raise CodeError(f"unsafe archive member {name!r}: a device or special file ({what}; only "
                            "regular files are allowed)")
        self._declared += size
        if self._declared > self._budget:
            raise CodeError(f"code archive refused at {name!r}: {self._over}")
        self._unread = size + (-size % _BLOCK)
        name = posixpath.normpath(name)
        if kind != b"5":
            if name in self._names:
                raise CodeError(f"unsafe archive member {name!r}: it appears twice")
            self._names.add(name)
        return _Member(name, size, _octal(block[100:108], "mode"), kind)

    def data(self, member: _Member) -> Iterator[bytes]:
        """The member's bytes, in chunks (call once, right after :meth:`next` returned it)."""
        left = member.size
        while left:
            chunk = self._src.read(min(left, _INFLATE_CHUNK))
            if not chunk:
                raise CodeError("not a tar.gz archive: the tar stream ends inside a member")
            left -= len(chunk)
            self._unread -= len(chunk)
            yield chunk


def _members(raw: BinaryIO, packed_bytes: int, limits: Limits) -> _TarStream:
    budget, over = limits.budget(packed_bytes), limits.over_budget(packed_bytes)
    return _TarStream(_Inflater(raw, budget, over), limits, budget, over)


def scan(raw: BinaryIO, packed_bytes: int, limits: Limits = DEFAULT_LIMITS) -> list[str]:
    """Names of the regular files of an archive of ``packed_bytes`` read from ``raw``, every member
    checked and the limits enforced while it inflates (the server's check of an upload)."""
    names = []
    try:
        tar = _members(raw, packed_bytes, limits)
        while (m := tar.next()) is not None:
            names.append(m.name)
    except zlib.error as exc:
        raise CodeError(f"not a tar.gz archive: {exc}") from None
    return sorted(names)


def file_list(data: bytes, limits: Limits = DEFAULT_LIMITS) -> list[str]:
    """Names of the regular files in an archive, after checking every member is safe."""
    return scan(io.BytesIO(data), len(data), limits)


def extract(data: bytes, dest: str, limits: Limits = DEFAULT_LIMITS,
            stop: Callable[[], str | None] | None = None) -> list[str]:
    """Unpack into the new directory ``dest``: regular files only, each checked to land inside it,
    the limits enforced while it inflates. ``stop()``, asked between files, may name a reason to
    give up (the lease was lost). Nothing is left in ``dest`` when it fails."""
    dest = os.path.realpath(dest)
    os.makedirs(dest, exist_ok=False)
    try:
        return _extract(data, dest, limits, stop)
    except zlib.error as exc:
        shutil.rmtree(dest, ignore_errors=True)
        raise CodeError(f"not a tar.gz archive: {exc}") from None
    except (FileExistsError, NotADirectoryError, IsADirectoryError) as exc:
        shutil.rmtree(dest, ignore_errors=True)
        raise CodeError(f"unsafe archive: a file and a directory share the name {exc.filename!r}") from None
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise


def _extract(data: bytes, dest: str, limits: Limits, stop: Callable[[], str | None] | None) -> list[str]:
    names = []
    tar = _members(io.BytesIO(data), len(data), limits)
    while (m := tar.next()) is not None:
        reason = stop() if stop is not None else None
        if reason:
            raise CodeError(f"unpacking stopped: {reason}")
        target = os.path.realpath(os.path.join(dest, *m.name.split("/")))
        if os.path.commonpath([target, dest]) != dest:
            raise CodeError(f"unsafe archive member {m.name!r}: lands outside {dest}")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755 if m.mode & 0o111 else 0o644)
        with os.fdopen(fd, "wb") as out:
            for chunk in tar.data(m):
                out.write(chunk)
        names.append(m.name)
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


def file_digests(raw: BinaryIO, packed_bytes: int, *, max_unpacked: int, keep: tuple[str, ...] = (),
                 keep_max: int = 256 * 1024) -> tuple[dict[str, str], dict[str, bytes]]:
    """The SHA-256 of each regular file's bytes ({name: hex}) in the archive of ``packed_bytes`` read from
    ``raw``, so two archives can be compared file by file; and the bytes of the files whose name ends with
    one of ``keep`` (at most ``keep_max`` each). Reads through the same checked stream as an upload, one
    chunk at a time, with at most ``max_unpacked`` bytes unpacked (an archive small when packed may unpack
    to far more): a larger one raises ``CodeError``."""
    digests: dict[str, str] = {}
    kept: dict[str, bytes] = {}
    limits = Limits(max_unpacked_bytes=max_unpacked, max_files=DEFAULT_MAX_FILES,
                    max_ratio=max(DEFAULT_MAX_RATIO, max_unpacked / max(packed_bytes, 1)))
    try:
        tar = _members(raw, packed_bytes, limits)
        while (m := tar.next()) is not None:
            h = hashlib.sha256()
            small = m.name.endswith(keep) if keep else False
            buf = bytearray()
            for chunk in tar.data(m):
                h.update(chunk)
                if small and len(buf) <= keep_max:
                    buf += chunk
            digests[m.name] = h.hexdigest()
            if small and len(buf) <= keep_max:
                kept[m.name] = bytes(buf)
    except zlib.error as exc:
        raise CodeError(f"not a tar.gz archive: {exc}") from None
    return digests, kept


class ChunkReader(io.RawIOBase):
    """A read-only file over an iterator of byte chunks (an archive read from the database a chunk at a
    time), so a check that reads a file never holds more than one chunk."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._rest = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._rest:
            try:
                self._rest = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(buffer), len(self._rest))
        buffer[:n] = self._rest[:n]
        self._rest = self._rest[n:]
        return n
