"""Concurrent lease requests against real server processes: every run is leased exactly once.

Threads and processes race for runs on SQLite and PostgreSQL, against one API process,
one API process with ``--workers 2``, and two API processes on one PostgreSQL database.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.scale.conftest import SharedServers, all_runs, create_study, fake_worker_cmd, spawn
from tests.scale.fakeworker import FakeWorker

RUNS = 48
# the tests on one ``--workers 2`` API per backend (``two_process_api``) run on one xdist worker, which starts it once
TWO_PROCESS_API = pytest.mark.xdist_group("concurrency-two-process-api")


@pytest.fixture(scope="module")
def two_process_api(tmp_path_factory, sqlite_template):
    """One ``--workers 2`` API per backend (a --workers 2 API costs three interpreters' start), shared by this
    module's tests on that backend (``SharedServers``)."""
    servers = SharedServers(tmp_path_factory, sqlite_template, "api", workers=2)
    yield servers
    servers.close()


def _race_threads(urls: list[str], token: str, n_threads: int, leases_each: int) -> list[int | None]:
    """n_threads workers, each registered, released together by a barrier; each leases leases_each times."""
    workers = [FakeWorker(urls[i % len(urls)], token, f"t{i}", deadline_s=60) for i in range(n_threads)]
    for w in workers:
        w.register()
    barrier = threading.Barrier(n_threads)

    def go(w: FakeWorker) -> list[int | None]:
        barrier.wait(timeout=30)
        out = []
        for _ in range(leases_each):
            got = w.lease()
            out.append(None if got is None else got["run_id"])
        return out

    with ThreadPoolExecutor(n_threads) as pool:
        results = list(pool.map(go, workers, timeout=90))
    statuses = {code for w in workers for code in w.stats.statuses}
    assert statuses <= {200, 204}, f"unexpected answers to lease requests: {statuses}"
    return [r for rs in results for r in rs]


def _assert_exactly_once(server, study_id: int, leased: list[int | None], runs: int) -> None:
    got = [r for r in leased if r is not None]
    assert len(got) == len(set(got)), f"a run was leased twice: {sorted(got)}"
    assert len(got) == runs, f"{len(got)} of {runs} runs leased; {leased.count(None)} requests found nothing"
    rows = all_runs(server, study_id)
    assert {r["id"] for r in rows} == set(got)
    assert all(r["status"] == "running" and r["attempt"] == 1 for r in rows)


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=TWO_PROCESS_API)], ids=["1proc", "workers2"])
def test_threads_race_for_leases(cluster, backend_url, workers, two_process_api, request):
    if workers == 1:
        (server,) = cluster(backend_url)
    else:
        server, _ = two_process_api.get(backend_url, request)
    sid = create_study(server, RUNS)
    # 16 agents × 3 requests = exactly as many requests as runs; none may come back empty
    leased = _race_threads([server.url], server.tokens["worker"], 16, RUNS // 16)
    _assert_exactly_once(server, sid, leased, RUNS)
    with server.client("worker") as c:  # the queue is empty now
        wid = c.post("/api/v1/workers/register", json={"name": "late"}).json()["worker_id"]
        assert c.post(f"/api/v1/workers/{wid}/lease", json={"worker_id": wid}).status_code == 204


@pytest.mark.postgres
def test_two_api_processes_one_postgres(cluster, pg_database, tmp_path):
    """Threads and separate worker processes against two API processes on one database. One uvicorn process
    each: the race between processes is the two APIs'; --workers 2 on PostgreSQL is
    test_threads_race_for_leases[postgres-workers2]'s."""
    a, b = cluster(pg_database, n=2)
    sid = create_study(a, RUNS)
    # 4 agent processes, released at the same instant, 6 leases each, alternating API processes
    start_at = time.time() + 4
    procs = [
        spawn(fake_worker_cmd((a, b)[i % 2], f"p{i}", lease_only=True, max_runs=6, start_at=start_at), tmp_path / f"p{i}.log")
        for i in range(4)
    ]
    leased: list[int | None] = []
    # ... while 12 threads race for the other 24 through both API processes
    leased += _race_threads([a.url, b.url], a.tokens["worker"], 12, 2)
    for i, p in enumerate(procs):
        assert p.wait(timeout=60) == 0, (tmp_path / f"p{i}.log").read_text()
        lines = [json.loads(x) for x in (tmp_path / f"p{i}.log").read_text().splitlines() if x.startswith("{")]
        leased += next(x["runs"] for x in lines if x["event"] == "leased")
    _assert_exactly_once(a, sid, leased, RUNS)


@TWO_PROCESS_API
def test_sqlite_api_and_cli_writers_never_see_locked(two_process_api):
    """SQLite: API writers (leases, batches) and CLI writers (token create) at once: no 'database is locked'."""
    server, _ = two_process_api.get("sqlite")
    sid = create_study(server, 16)
    stop = time.monotonic() + 8
    errors: list[str] = []

    def cli_writer() -> None:
        from tests.conftest import create_token_cli

        while time.monotonic() < stop:
            try:
                create_token_cli(server.env, "user")
            except subprocess.CalledProcessError as exc:
                errors.append(exc.stderr)

    def api_writer(i: int) -> None:
        w = FakeWorker(server.url, server.tokens["worker"], f"s{i}", deadline_s=30)
        w.register()
        w.work(steps=200, batch=10, idle_exit_s=0.5)
        bad = {k: v for k, v in w.stats.statuses.items() if k >= 300 and k != 409}
        if bad:
            errors.append(f"worker {i}: {bad}")

    threads = [threading.Thread(target=cli_writer)] + [threading.Thread(target=api_writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert "locked" not in server.log_path.read_text()
    with httpx.Client(base_url=server.url, headers=server.headers("user")) as c:
        runs = c.get(f"/api/v1/studies/{sid}/runs", params={"limit": 500}).json()["items"]
    assert len(runs) == 16 and all(r["status"] == "completed" for r in runs), [r["status"] for r in runs]


@TWO_PROCESS_API
def test_simultaneous_completions_finish_the_study(backend_url, two_process_api, request):
    """The last runs of a study completing at the same instant (one per worker) still finish the study."""
    server, _ = two_process_api.get(backend_url, request)
    sid = create_study(server, 12)
    workers = [FakeWorker(server.url, server.tokens["worker"], f"c{i}", deadline_s=60) for i in range(12)]
    leases = []
    for w in workers:
        w.register()
        leases.append(w.lease())
    barrier = threading.Barrier(len(workers))

    def finish(pair) -> int:
        w, lease = pair
        barrier.wait(timeout=30)
        return w.complete(lease["run_id"], {"lease_id": lease["lease_id"]}).status_code

    with ThreadPoolExecutor(len(workers)) as pool:
        assert set(pool.map(finish, zip(workers, leases), timeout=60)) == {200}
    with server.client("user") as c:
        study = c.get(f"/api/v1/studies/{sid}").json()
    # Every run completed, so the study settled (the last completion closed it). These runs logged no
    # metric, so it settles as failed with that reason rather than as a completed study with no data.
    assert study["progress"]["completed"] == 12, study["progress"]
    assert study["status"] == "failed" and "no run logged any" in (study["status_reason"] or ""), study
