"""The code archive format: deterministic packing, safe listing and unpacking."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import zlib

import pytest

from steady.worker.contract import codepack


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


def test_same_tree_same_digest_whatever_the_mtimes_and_modes(tmp_path):
    for d in ("a", "b"):
        (tmp_path / d / "pkg").mkdir(parents=True)
        (tmp_path / d / "train.py").write_text("def main(ctx):\n    pass\n")
        (tmp_path / d / "pkg" / "m.py").write_text("X = 1\n")
    os.utime(tmp_path / "b" / "train.py", (1, 1))
    os.chmod(tmp_path / "b" / "pkg" / "m.py", 0o600)
    a, b = codepack.pack(str(tmp_path / "a")), codepack.pack(str(tmp_path / "b"))
    assert a.sha256 == b.sha256 == codepack.sha256_of(a.data)
    assert a.files == ["pkg/m.py", "train.py"] == codepack.file_list(a.data)
    with tarfile.open(fileobj=io.BytesIO(a.data)) as tar:
        assert {(m.mtime, m.uid, m.gid, m.uname, m.mode) for m in tar.getmembers()} == {(0, 0, 0, "", 0o644)}
    (tmp_path / "a" / "train.py").write_text("changed\n")
    assert codepack.pack(str(tmp_path / "a")).sha256 != b.sha256


def test_git_tree_ships_tracked_and_untracked_but_not_ignored(tmp_path):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("data/\n")
    (tmp_path / "train.py").write_text("pass\n")
    subprocess.run([*git, "add", "-A"], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "x"], cwd=tmp_path, check=True)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "big.bin").write_bytes(b"0" * 100)
    (tmp_path / "new.py").write_text("pass\n")
    packed = codepack.pack(str(tmp_path))
    assert packed.files == [".gitignore", "new.py", "train.py"]
    assert packed.git_commit and len(packed.git_commit) == 40 and packed.dirty


def test_size_limit_names_the_setting(tmp_path):
    (tmp_path / "big.bin").write_bytes(b"0" * 5000)
    with pytest.raises(codepack.CodeError, match="over the limit.*STEADY_MAX_CODE_BYTES"):
        codepack.pack(str(tmp_path), max_bytes=4096)


@pytest.mark.parametrize("member, reason", [
    (_file("../evil.py"), "'..'"),
    (_file("a/../../evil.py"), "'..'"),
    (_file("/etc/evil"), "absolute"),
    (_link("link", "/etc/passwd"), "link"),
    (_link("hard", "../x", tarfile.LNKTYPE), "link"),
    (_link("dev", "", tarfile.CHRTYPE), "device"),
    (_link("output.log", "", tarfile.FIFOTYPE), "device or special file"),  # a FIFO would block the agent
])
def test_unsafe_archives_are_refused(tmp_path, member, reason):
    data = _tar([_file("ok.py"), member])
    with pytest.raises(codepack.CodeError, match=reason):
        codepack.file_list(data)
    with pytest.raises(codepack.CodeError, match=reason):
        codepack.extract(data, str(tmp_path / "out"))
    assert not (tmp_path / "evil.py").exists()


def _zlib_error_archive() -> bytes:
    """A .tar.gz whose deflate stream breaks past the first member's header: reading it raises
    zlib.error, which is neither tarfile's error nor the OS's (found by flipping bytes)."""
    text = "".join(f"line {i} value {i * i % 977}\n" for i in range(20000)).encode()
    data = _tar([_file("a.py", text), _file("b.py")])
    for pos in range(1000, len(data), 97):
        bad = data[:pos] + bytes([data[pos] ^ 0x55]) + data[pos + 1:]
        try:
            with tarfile.open(fileobj=io.BytesIO(bad), mode="r:*") as tar:
                tar.getmembers()
        except zlib.error:
            return bad
        except tarfile.TarError:
            continue
    raise AssertionError("no corruption raised zlib.error")


def test_a_corrupt_gzip_stream_is_a_code_error(tmp_path):
    data = _zlib_error_archive()
    with pytest.raises(codepack.CodeError, match="not a tar.gz archive"):
        codepack.file_list(data)
    with pytest.raises(codepack.CodeError, match="not a tar.gz archive"):
        codepack.extract(data, str(tmp_path / "out"))


def test_extract_writes_a_fresh_copy(tmp_path):
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "m.py").write_text("X = 1\n")
    packed = codepack.pack(str(tmp_path / "src"))
    assert codepack.extract(packed.data, str(tmp_path / "run" / "code")) == ["pkg/m.py"]
    assert (tmp_path / "run" / "code" / "pkg" / "m.py").read_text() == "X = 1\n"
    with pytest.raises(FileExistsError):  # one fresh copy per run, never unpacked over another
        codepack.extract(packed.data, str(tmp_path / "run" / "code"))


def test_entrypoint_and_script_lookup():
    files = ["exp/train.py", "pkg/__init__.py", "pkg/mod.py", "pkg2/sub/__init__.py"]
    assert codepack.present(codepack.entrypoint_file("train.py:main"), files, "exp")
    assert not codepack.present(codepack.entrypoint_file("train.py"), files, ".")
    assert codepack.present(codepack.entrypoint_file("pkg.mod:run"), files)
    assert codepack.present(codepack.entrypoint_file("pkg2.sub:run"), files)
    assert codepack.script_of(["python", "train.py", "--seed", "{seed}"]) == "train.py"
    assert codepack.script_of(["bash", "run.sh"]) is None


# --- archives checked while they inflate (tests/archives.py builds the hostile ones) -----------------

from tests import archives  # noqa: E402 - grouped with the tests that use it


def _refused(data: bytes, tmp_path, match: str, limits: codepack.Limits = codepack.DEFAULT_LIMITS) -> None:
    """Refused by the server's check and by the worker's unpacking, which leaves nothing behind."""
    with pytest.raises(codepack.CodeError, match=match):
        codepack.file_list(data, limits)
    with pytest.raises(codepack.CodeError, match=match):
        codepack.extract(data, str(tmp_path / "out"), limits)
    assert not (tmp_path / "out").exists()


def test_only_the_gzip_tar_the_cli_writes_is_read(tmp_path):
    bomb = archives.bzip2_bomb(200)  # 9 kB declaring 3.3 GB: refused by its first bytes, nothing inflated
    assert len(bomb) < 10_000
    _refused(bomb, tmp_path, r"not a tar.gz archive \(bzip2\): only the gzip-compressed tar")
    for mode in ("w:xz", "w"):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode=mode) as tar:
            info, data = _file("a.py")
            tar.addfile(info, io.BytesIO(data))
        _refused(buf.getvalue(), tmp_path, "not a tar.gz archive")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.GNU_FORMAT) as tar:
        info, data = _file("a.py")
        tar.addfile(info, io.BytesIO(data))
    _refused(buf.getvalue(), tmp_path, "not POSIX ustar/pax")


def test_a_gzip_bomb_stops_at_its_budget(tmp_path):
    bomb = archives.gzip_of_zeros(24 << 20)  # 24 kB of archive, 24 MB unpacked
    _refused(bomb, tmp_path, rf"more than 200 times its {len(bomb)} bytes \(STEADY_MAX_CODE_RATIO\)")
    _refused(bomb, tmp_path, r"more than 1048576 bytes \(STEADY_MAX_CODE_UNPACKED_BYTES\)",
             codepack.Limits(max_unpacked_bytes=1 << 20, max_ratio=10_000))
    roomy = codepack.Limits(max_ratio=10_000)
    assert codepack.extract(bomb, str(tmp_path / "ok"), roomy) == ["zeros.bin"]  # within the limits: unpacked
    assert (tmp_path / "ok" / "zeros.bin").stat().st_size == 24 << 20


def test_a_sparse_member_is_refused_by_its_header(tmp_path):
    bomb = archives.sparse(8 << 30)  # 200 bytes declaring 8 GiB: unpacked, it would fill the disk
    assert len(bomb) < 300
    _refused(bomb, tmp_path, "a sparse file")


def test_entries_are_counted_as_they_stream(tmp_path):
    data = archives.many_entries(300)
    _refused(data, tmp_path, r"more than 100 entries \(STEADY_MAX_CODE_FILES\)", codepack.Limits(max_files=100))
    assert len(codepack.file_list(data, codepack.Limits(max_files=300))) == 300


def test_a_declared_size_over_the_budget_is_refused_before_inflating(tmp_path):
    big = archives.header("big.bin", 8 << 30) + b"x" * 512  # claims 8 GiB, holds 512 bytes
    data = zlib.compress(big, 9, wbits=31)
    _refused(data, tmp_path, r"at 'big.bin': it unpacks to more than")


def test_unpacking_stops_when_asked_and_leaves_nothing(tmp_path):
    data = archives.many_entries(50)
    seen = []

    def stop() -> str | None:
        seen.append(1)
        return "the lease was lost" if len(seen) > 3 else None

    with pytest.raises(codepack.CodeError, match="unpacking stopped: the lease was lost"):
        codepack.extract(data, str(tmp_path / "out"), stop=stop)
    assert not (tmp_path / "out").exists() and len(seen) == 4


def test_limits_come_from_the_same_names_on_the_worker():
    limits = codepack.Limits.from_env({"STEADY_MAX_CODE_UNPACKED_BYTES": "4096", "STEADY_MAX_CODE_FILES": "7",
                                       "STEADY_MAX_CODE_RATIO": "12.5"})
    assert limits == codepack.Limits(4096, 7, 12.5)
    assert codepack.Limits.from_env({}) == codepack.Limits()
    with pytest.raises(codepack.CodeError, match="STEADY_MAX_CODE_FILES='many' is not a number"):
        codepack.Limits.from_env({"STEADY_MAX_CODE_FILES": "many"})
