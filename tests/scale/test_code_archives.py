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


def _writer(url: str, token: str, name: str, latencies: list[float], stop: threading.Event) -> None:
    """A worker registering again and again: one write transaction per request."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120) as c:
        while not stop.is_set():
            t0 = time.monotonic()
            r = c.post("/api/v1/workers/register", json={"name": name, "labels": ["cpu"]})
            latencies.append(time.monotonic() - t0)
            assert r.status_code == 200, r.text


def test_a_bomb_upload_leaves_other_writers_p99_under_a_second(live_server):
    """SQLite: two writers run while a 9 kB bzip2 bomb (3.3 GB unpacked) and a 33 kB gzip one
    (32 MB) are uploaded; every write while the uploads were in flight, and a while after, counts."""
    bombs = [archives.bzip2_bomb(200), archives.gzip_of_zeros(32 << 20)]
    assert len(bombs[0]) < 10_000
    stop = threading.Event()
    latencies: list[list[float]] = [[], []]
    writers = [threading.Thread(target=_writer, args=(live_server.url, live_server.tokens["worker"], f"p99-{i}",
                                                      latencies[i], stop), daemon=True) for i in range(2)]
    for w in writers:
        w.start()
    deadline = time.monotonic() + 60
    while min(len(x) for x in latencies) < 5 and time.monotonic() < deadline:  # both writers going
        time.sleep(0.05)
    marks = [len(x) for x in latencies]
    with httpx.Client(base_url=live_server.url, headers=live_server.headers("user"), timeout=300) as c, \
            ThreadPoolExecutor(len(bombs)) as pool:
        answers = list(pool.map(lambda d: c.put(f"/api/v1/code/{codepack.sha256_of(d)}", content=d), bombs))
    after = [len(x) for x in latencies]
    while (min(len(x) - a for x, a in zip(latencies, after)) < 20  # and a while after: a lock left behind shows
           or sum(len(x) - m for x, m in zip(latencies, marks)) < 200) and time.monotonic() < deadline + 60:
        time.sleep(0.05)  # enough writes that the p99 is not just the slowest one
    stop.set()
    for w in writers:
        w.join(150)
    during = sorted(t for x, m in zip(latencies, marks) for t in x[m:])
    assert len(during) >= 150
    p99 = during[min(len(during) - 1, int(0.99 * len(during)))]
    assert p99 < 1.0, f"p99 {p99:.2f} s over {len(during)} writes (median {statistics.median(during):.3f} s)"
    assert [r.status_code for r in answers] == [422, 422], [r.text for r in answers]
    assert "not a tar.gz archive (bzip2)" in answers[0].text and "STEADY_MAX_CODE_RATIO" in answers[1].text


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
