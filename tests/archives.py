"""Hostile code archives for tests, built in a few milliseconds without holding what they unpack
to: compression bombs (gzip and bzip2), a sparse member declaring far more than it stores, and
archives of many entries."""

from __future__ import annotations

import bz2
import io
import os
import struct
import tarfile
import zlib

_BLOCK = 512
_ZEROS = bytes(1 << 20)


def header(name: str, size: int, **pax: str) -> bytes:
    """The tar header (with its pax header when ``pax`` is given) of a regular member."""
    info = tarfile.TarInfo(name)
    info.size, info.pax_headers = size, dict(pax)
    return info.tobuf(tarfile.PAX_FORMAT)


def _pad(size: int) -> bytes:
    return bytes(-size % _BLOCK)


def gzip_of_zeros(size: int, name: str = "zeros.bin") -> bytes:
    """A .tar.gz of one member of ``size`` zero bytes: about a thousandth of ``size``."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [z.compress(header(name, size))]
    left = size
    while left:
        n = min(left, len(_ZEROS))
        out.append(z.compress(_ZEROS[:n]))
        left -= n
    out.append(z.compress(_pad(size) + bytes(2 * _BLOCK)))
    out.append(z.flush())
    return b"".join(out)


def gzip_of_zeros_fast(members: int, member_mib: int, level: int = 1) -> bytes:
    """A .tar.gz of ``members`` files of ``member_mib`` MiB of zeros each, built in a fraction of a second
    per GiB: after a full flush the deflate output of one MiB of zeros is the same bytes every time, so it
    is made once and repeated. At level 1 it is 1/228 of what it holds, just over the default
    STEADY_MAX_CODE_RATIO: each header declares a size within the budget until the sum passes it, so a
    reader inflates close to 200 times the archive before the last header refuses it."""
    c = zlib.compressobj(level, zlib.DEFLATED, -15)
    block = c.compress(_ZEROS) + c.flush(zlib.Z_FULL_FLUSH)
    assert block == c.compress(_ZEROS) + c.flush(zlib.Z_FULL_FLUSH)
    c = zlib.compressobj(level, zlib.DEFLATED, -15)
    out, crc, total = [b"\x1f\x8b\x08\0\0\0\0\0\0\xff"], 0, 0
    for i in range(members):
        head = header(f"zeros{i}.bin", member_mib << 20)
        out += [c.compress(head), c.flush(zlib.Z_FULL_FLUSH), block * member_mib]
        crc = zlib.crc32(head, crc)
        for _ in range(member_mib):
            crc = zlib.crc32(_ZEROS, crc)
        total += len(head) + (member_mib << 20)
    tail = bytes(2 * _BLOCK)
    crc, total = zlib.crc32(tail, crc), total + len(tail)
    return b"".join([*out, c.compress(tail), c.flush(), struct.pack("<II", crc, total & 0xFFFFFFFF)])


def bzip2_bomb(streams: int, stream_bytes: int = 16 << 20) -> bytes:
    """A .tar.bz2 of one member of ``streams * stream_bytes`` zeros: one compressed block of zeros
    repeated (bzip2 streams may be concatenated), about 50 bytes per ``stream_bytes``."""
    zeros = bz2.compress(bytes(stream_bytes))
    size = streams * stream_bytes
    return bz2.compress(header("zeros.bin", size)) + zeros * streams + bz2.compress(_pad(size) + bytes(2 * _BLOCK))


def sparse(declared: int) -> bytes:
    """A .tar.gz whose one member is a GNU sparse file (pax format 1.0) declaring ``declared``
    bytes and storing none of them: what a bomb that fills a disk looks like."""
    pax = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": "big.bin",
           "GNU.sparse.realsize": str(declared)}
    sparse_map = b"1\n0\n0\n".ljust(_BLOCK, b"\0")  # one hole of 0 bytes at 0: all of it a hole
    body = header("GNUSparseFile.0/big.bin", len(sparse_map), **pax) + sparse_map + bytes(2 * _BLOCK)
    return zlib.compress(body, 9, wbits=31)


def many_entries(count: int) -> bytes:
    """A .tar.gz of ``count`` empty files."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for i in range(count):
            tar.addfile(tarfile.TarInfo(f"f/{i}.py"))
    return buf.getvalue()


def incompressible(size: int, name: str = "weights.bin") -> bytes:
    """A .tar.gz of one member of ``size`` random bytes, stored (gzip level 0): as large as what it
    holds, built at memory speed."""
    z = zlib.compressobj(0, zlib.DEFLATED, 31)
    return b"".join([z.compress(header(name, size)), z.compress(os.urandom(size)),
                     z.compress(_pad(size) + bytes(2 * _BLOCK)), z.flush()])
