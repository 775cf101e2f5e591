"""The worker's code cache against a real HTTP server and the worker's real client: one download
per digest however many runs ask, a download that does not match its digest is refused, and a
cache file damaged on disk is fetched again."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from steady.worker.agent import codecache
from steady.worker.contract import codepack
from steady.worker.agent.client import SteadyClient

PREFIX = "/api/v1/code/"


class CodeServer:
    """Serves ``archives[sha]`` at ``GET /api/v1/code/{sha}`` and counts the downloads."""

    def __init__(self) -> None:
        self.archives: dict[str, bytes] = {}
        self.gets: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # the http.server API names it
                sha = self.path.removeprefix(PREFIX)
                server.gets.append(sha)
                body = server.archives.get(sha)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


@pytest.fixture
def code_server() -> Iterator[CodeServer]:
    s = CodeServer()
    t = threading.Thread(target=s.httpd.serve_forever, daemon=True)
    t.start()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()
    t.join(10)


def _pack(tmp_path: Path, name: str, text: str) -> codepack.Packed:
    src = tmp_path / name
    src.mkdir()
    (src / "train.py").write_text(text)
    return codepack.pack(str(src))


def _client(server: CodeServer) -> SteadyClient:
    return SteadyClient(server.url, "worker-token", retry_deadline_s=2.0, backoff_base_s=0.05)


def test_two_runs_download_a_digest_once(tmp_path, code_server):
    packed = _pack(tmp_path, "src", "print('one')\n")
    code_server.archives[packed.sha256] = packed.data
    client, cache = _client(code_server), str(tmp_path / "cache")
    dirs: dict[int, str] = {}

    def run(i: int) -> None:
        dirs[i] = codecache.unpack_for_run(cache, packed.sha256, str(tmp_path / f"run{i}"), client.fetch_code)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]  # two runs of one agent at once
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert code_server.gets == [packed.sha256]
    for i in range(2):  # each run has its own fresh copy
        assert dirs[i] == str(tmp_path / f"run{i}" / "code")
        assert (Path(dirs[i]) / "train.py").read_text() == "print('one')\n"
    run(2)  # a later run: still from the cache
    assert code_server.gets == [packed.sha256]


def test_a_download_that_does_not_match_its_digest_is_refused(tmp_path, code_server):
    wanted, other = _pack(tmp_path, "a", "print('a')\n"), _pack(tmp_path, "b", "print('b')\n")
    code_server.archives[wanted.sha256] = other.data  # a tampered or mixed-up answer
    cache = tmp_path / "cache"
    with pytest.raises(codepack.CodeError, match=f"code archive {wanted.sha256} downloaded with digest "
                                                 f"{other.sha256}: refused"):
        codecache.unpack_for_run(str(cache), wanted.sha256, str(tmp_path / "run"), _client(code_server).fetch_code)
    assert not (tmp_path / "run" / "code").exists()
    assert not cache.exists() or not any(cache.iterdir())  # nothing cached, not even a partial file
    code_server.archives[wanted.sha256] = wanted.data  # once the server answers right, it is taken
    got = codecache.unpack_for_run(str(cache), wanted.sha256, str(tmp_path / "run"), _client(code_server).fetch_code)
    assert (Path(got) / "train.py").read_text() == "print('a')\n"


def test_a_corrupted_cache_entry_is_fetched_again(tmp_path, code_server):
    packed = _pack(tmp_path, "src", "print('intact')\n")
    code_server.archives[packed.sha256] = packed.data
    client, cache = _client(code_server), tmp_path / "cache"
    codecache.unpack_for_run(str(cache), packed.sha256, str(tmp_path / "run0"), client.fetch_code)
    entry = cache / f"{packed.sha256}.tar.gz"
    entry.write_bytes(packed.data[:-7] + b"garbage")  # disk damage: same name, other bytes
    got = codecache.unpack_for_run(str(cache), packed.sha256, str(tmp_path / "run1"), client.fetch_code)
    assert code_server.gets == [packed.sha256, packed.sha256]
    assert entry.read_bytes() == packed.data  # the cache is repaired
    assert (Path(got) / "train.py").read_text() == "print('intact')\n"


def _unpack_within(seconds: float, *args) -> str:
    """unpack_for_run in a thread that must finish in ``seconds`` (a FIFO must not hang it)."""
    result: dict[str, object] = {}

    def target() -> None:
        try:
            result["dir"] = codecache.unpack_for_run(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            result["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "unpacking hung on the poisoned cache entry"
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    return str(result["dir"])


@pytest.mark.parametrize("poison", ["fifo", "symlink", "directory", "other-archive"])
def test_a_run_that_poisons_the_cache_costs_one_download(tmp_path, code_server, poison):
    """Without --run-as a run is the agent's own user and can write in the cache: whatever it puts
    in place of another study's archive is seen at the next use, removed and fetched again."""
    import os

    victim, attacker = _pack(tmp_path, "a", "print('victim')\n"), _pack(tmp_path, "b", "print('attacker')\n")
    code_server.archives[victim.sha256] = victim.data
    client, cache = _client(code_server), tmp_path / "cache"
    codecache.unpack_for_run(str(cache), victim.sha256, str(tmp_path / "run0"), client.fetch_code)
    assert oct((cache.stat().st_mode) & 0o777) == "0o700"  # with --run-as, out of a run's reach
    entry = cache / f"{victim.sha256}.tar.gz"
    entry.unlink()
    if poison == "fifo":
        os.mkfifo(entry)
    elif poison == "symlink":
        (tmp_path / "evil.tar.gz").write_bytes(attacker.data)
        entry.symlink_to(tmp_path / "evil.tar.gz")
    elif poison == "directory":
        entry.mkdir()
        (entry / "x").write_text("x")
    else:
        entry.write_bytes(attacker.data)
    got = _unpack_within(30, str(cache), victim.sha256, str(tmp_path / "run1"), client.fetch_code)
    assert (Path(got) / "train.py").read_text() == "print('victim')\n"
    assert code_server.gets == [victim.sha256, victim.sha256]
    assert entry.is_file() and not entry.is_symlink() and entry.read_bytes() == victim.data
    if poison == "symlink":  # the file the link pointed to is left alone, not overwritten through it
        assert (tmp_path / "evil.tar.gz").read_bytes() == attacker.data


def test_a_cache_directory_replaced_by_a_link_is_not_followed(tmp_path, code_server):
    packed = _pack(tmp_path, "src", "print('one')\n")
    code_server.archives[packed.sha256] = packed.data
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "cache").symlink_to(elsewhere)
    got = codecache.unpack_for_run(str(tmp_path / "cache"), packed.sha256, str(tmp_path / "run"),
                                   _client(code_server).fetch_code)
    assert (Path(got) / "train.py").read_text() == "print('one')\n"
    assert not any(elsewhere.iterdir())  # nothing written through the link
    assert (tmp_path / "cache").is_dir() and not (tmp_path / "cache").is_symlink()


def test_unpacking_for_a_run_stays_within_the_workers_limits(tmp_path, code_server):
    """A sparse member declaring 8 GiB (200 bytes: unpacked, enough to fill a worker's disk) and an archive
    past the agent's STEADY_MAX_CODE_FILES are refused before anything lands in the run's directory."""
    from tests import archives

    many = archives.many_entries(20)
    for data, limits, reason in [(archives.sparse(8 << 30), codepack.DEFAULT_LIMITS, "a sparse file"),
                                 (many, codepack.Limits.from_env({"STEADY_MAX_CODE_FILES": "5"}), "more than 5 entries")]:
        sha = codepack.sha256_of(data)
        code_server.archives[sha] = data
        with pytest.raises(codepack.CodeError, match=reason):
            codecache.unpack_for_run(str(tmp_path / "cache"), sha, str(tmp_path / f"run-{sha[:8]}"),
                                     _client(code_server).fetch_code, limits)
        assert not (tmp_path / f"run-{sha[:8]}" / "code").exists()


def test_unfinished_downloads_are_removed_on_failure_and_swept_at_start(tmp_path, code_server, monkeypatch):
    """A download whose write fails (a full disk) leaves no ``.fetch-*`` file; what an agent killed mid-write
    left is swept when an agent starts on that work dir, but not a download another agent holds, nor an entry."""
    import errno
    import fcntl
    import os

    from steady.worker.agent.loop import Agent, AgentConfig

    packed = _pack(tmp_path, "src", "print('one')\n")
    code_server.archives[packed.sha256] = packed.data
    work = tmp_path / "work"
    cache = work / "code-cache"
    real_replace = os.replace

    def full_disk(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(codecache.os, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        codecache.unpack_for_run(str(cache), packed.sha256, str(tmp_path / "run0"), _client(code_server).fetch_code)
    assert sorted(p.name for p in cache.iterdir()) == []  # the failed download's file is gone
    monkeypatch.setattr(codecache.os, "replace", real_replace)
    codecache.unpack_for_run(str(cache), packed.sha256, str(tmp_path / "run1"), _client(code_server).fetch_code)
    (cache / ".fetch-killed").write_bytes(packed.data[:100])  # what a kill -9 mid-write leaves
    os.mkfifo(cache / ".fetch-fifo")  # or a run of the agent's user: removed without being opened for long
    in_flight = cache / ".fetch-another-agent"
    in_flight.write_bytes(b"still arriving")
    fd = os.open(in_flight, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # an agent on the same work dir writing its download now
    try:
        Agent(AgentConfig(server=code_server.url, token="worker-token", work_dir=str(work)),
              client=_client(code_server))
        assert sorted(p.name for p in cache.iterdir()) == [".fetch-another-agent", f"{packed.sha256}.tar.gz"]
    finally:
        os.close(fd)
