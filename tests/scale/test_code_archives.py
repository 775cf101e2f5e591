"""Code archives under load on a real server: a compression bomb upload does not hold other writers
up, and downloads stream (the server's memory does not grow with the archive times the downloads)."""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from steady.worker.contract import codepack
from tests import archives


def _writer(url: str, token: str, name: str, writes: list[tuple[float, float, int]], stop: threading.Event) -> None:
    """A worker registering again and again: one write transaction per request, (start, end, status) each."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120) as c:
        while not stop.is_set():
            t0 = time.monotonic()
            r = c.post("/api/v1/workers/register", json={"name": name, "labels": ["cpu"]})
            writes.append((t0, time.monotonic(), r.status_code))


def _p99(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def test_a_bomb_upload_leaves_other_writers_p99_under_a_second(live_server_factory):
    """SQLite: two writers register again and again while three bombs are uploaded, one after another:
    a 9 kB bzip2 one declaring 3.3 GB and a 33 kB gzip one of 32 MB (the issue's 10 kB bombs, refused in
    milliseconds: the first by its format, the second at the ratio), then a 19 MB gzip of four files of
    1 GiB of zeros, of which the server inflates three (3 GiB, seconds of its CPU) before the fourth header
    passes 200 times the upload and the ratio refuses it (STEADY_MAX_CODE_UNPACKED_BYTES raised to 4 GiB,
    as for a team that ships large code: the default 1 GiB would stop it after one file).

    The property is that no check of an upload holds the database's write lock. Writes that start while
    a bomb is checked must finish in the usual time, where one takes milliseconds on a quiet machine: p99
    under half the time the big bomb's check took (at least 1 s). The lock held through that check would
    keep every write that starts meanwhile waiting for the rest of it, the first for all of it; a bound
    relative to the check's own time holds on a loaded 2-core machine, where the inflation competes with
    the writers for the CPU and both slow down together. Every write, during the uploads and a while after, must answer 200 (a 503 after
    61 s was the finding) and the p99 over all of them must be under 1 s too."""
    server = live_server_factory(max_code_unpacked_bytes=4 << 30)
    big = archives.gzip_of_zeros_fast(4, 1024)
    bombs = [archives.bzip2_bomb(200), archives.gzip_of_zeros(32 << 20), big]
    assert len(bombs[0]) < 10_000 and len(bombs[1]) < 40_000 and len(big) < 20 << 20
    stop = threading.Event()
    writes: list[list[tuple[float, float, int]]] = [[], []]
    writers = [threading.Thread(target=_writer, args=(server.url, server.tokens["worker"], f"p99-{i}", writes[i], stop),
                                daemon=True) for i in range(2)]
    for w in writers:
        w.start()
    deadline = time.monotonic() + 60
    while min(len(x) for x in writes) < 5 and time.monotonic() < deadline:  # both writers going
        time.sleep(0.05)
    marks = [len(x) for x in writes]
    windows, answers = [], []
    try:
        with httpx.Client(base_url=server.url, headers=server.headers("user"), timeout=300) as c:
            for data in bombs:
                t0 = time.monotonic()
                answers.append(c.put(f"/api/v1/code/{codepack.sha256_of(data)}", content=data))
                windows.append((t0, time.monotonic()))
        after = [len(x) for x in writes]
        while (min(len(x) - a for x, a in zip(writes, after)) < 20  # and a while after: a lock left behind shows
               or sum(len(x) - m for x, m in zip(writes, marks)) < 200) and time.monotonic() < deadline + 120:
            time.sleep(0.05)  # enough writes that the p99 is not just the slowest one
    finally:
        stop.set()
        for w in writers:
            w.join(150)
    during = [w for x, m in zip(writes, marks) for w in x[m:]]
    assert len(during) >= 150 and all(status == 200 for _, _, status in during), \
        sorted({status for _, _, status in during})
    checked = [end - start for start, end, _ in during if windows[2][0] <= start <= windows[2][1]]
    took = windows[2][1] - windows[2][0]
    assert len(checked) >= 10, f"{len(checked)} writes started during the {took:.1f} s the big bomb took"
    p99_checked, p99_all = _p99(checked), _p99([end - start for start, end, _ in during])
    # A write lock held through the check would keep the first write that starts in the window waiting for all
    # of it: p99 ≈ the time the big bomb took. Half of that time (at least 1 s) separates the two however slow
    # the machine is, since the inflation slows down with it.
    bound = max(1.0, 0.5 * took)
    assert p99_checked < bound, (f"p99 {p99_checked:.2f} s over the {len(checked)} writes that started during the "
                                 f"{took:.1f} s the big bomb took (median {statistics.median(checked):.3f} s)")
    assert p99_all < bound, f"p99 {p99_all:.2f} s over {len(during)} writes (bound {bound:.2f} s)"
    assert [r.status_code for r in answers] == [422, 422, 422], [r.text for r in answers]
    assert "not a tar.gz archive (bzip2)" in answers[0].text and "STEADY_MAX_CODE_RATIO" in answers[1].text
    assert "200 times" in answers[2].text and "STEADY_MAX_CODE_RATIO" in answers[2].text, answers[2].text


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_downloads_stream_instead_of_reading_the_archive_into_memory(live_server):
    """Six slow readers of an 8 MiB archive at once: the server's resident memory, sampled while they
    read, stays far below six copies of it (each request read the whole file into memory before)."""
    data = archives.incompressible(8 << 20)
    sha = codepack.sha256_of(data)
    pid = live_server.proc.pid
    with httpx.Client(base_url=live_server.url, headers=live_server.headers("user"), timeout=120) as c:
        assert c.put(f"/api/v1/code/{sha}", content=data).status_code == 200
        baseline = _rss_kib(pid)
        peak = [baseline]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], _rss_kib(pid))
                time.sleep(0.005)

        def download(_: int) -> int:
            got = 0
            with c.stream("GET", f"/api/v1/code/{sha}") as r:
                assert r.status_code == 200
                for chunk in r.iter_bytes():
                    got += len(chunk)
                    time.sleep(0.002)  # a slow reader: the server must not buffer ahead of it
            return got

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            with ThreadPoolExecutor(6) as pool:
                assert list(pool.map(download, range(6))) == [len(data)] * 6
        finally:
            done.set()
            sampler.join(10)
    grown_mib = (peak[0] - baseline) / 1024
    assert grown_mib < 24, f"the server's memory grew {grown_mib:.0f} MiB for 6 downloads of 8 MiB"
