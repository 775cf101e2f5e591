"""Faults on loopback: killed workers, a killed API process, a database outage, stalled workers.

Every scenario is bounded: fixed numbers of runs and batches, deadlines on every wait.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.conftest import wait_until
from tests.scale.conftest import SharedServers, all_runs, create_study, fake_worker_cmd, series, spawn, sql
from tests.scale.fakeworker import FakeWorker, expected_values

pytestmark = pytest.mark.slow
FAST_LEASES = {"lease_seconds": 2, "heartbeat_seconds": 0.5, "reaper_interval_seconds": 0.5}
# the killed-worker and stalled-worker tests of a backend share one fast-lease API (``fast_lease_api``): one xdist
# worker runs them, which starts it once
FAST_LEASE_API = pytest.mark.xdist_group("faults-fast-lease-api")


@pytest.fixture(scope="module")
def fast_lease_api(tmp_path_factory, sqlite_template):
    """One API with 2 s leases per backend, shared by the module's tests that neither kill nor restart it
    (``SharedServers``)."""
    servers = SharedServers(tmp_path_factory, sqlite_template, "fast", **FAST_LEASES)
    yield servers
    servers.close()


def _done(log: Path) -> dict:
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
    return next(x for x in lines if x["event"] == "done")


def _chunks(url: str, run_id: int) -> list[tuple[int, int, int]]:
    """(attempt, seq, n) of every stored chunk of the run, straight from the database."""
    return [tuple(r) for r in sql(url, "SELECT attempt, seq, n FROM metric_chunks WHERE run_id = :r ORDER BY attempt, seq", r=run_id)]


def _assert_series_exact(server, url: str, run_id: int, steps: int, batch: int, study_id: int = 1) -> None:
    s = series(server, run_id)
    assert s["steps"] == list(range(steps)), "every step exactly once"
    assert s["values"] == expected_values(run_id, range(steps))
    run = next(r for r in all_runs(server, study_id) if r["id"] == run_id)
    chunks = _chunks(url, run_id)
    assert [c[1] for c in chunks] == list(range((steps + batch - 1) // batch)), "each batch stored once"
    assert {c[0] for c in chunks} == {run["attempt"]}, "only the final attempt's points are kept"


@FAST_LEASE_API
def test_killed_worker_run_is_requeued_and_completed_elsewhere(fast_lease_api, backend_url, request, tmp_path):
    """kill -9 a worker process mid-run: its run is re-queued and another worker completes it."""
    server, url = fast_lease_api.get(backend_url, request)
    sid = create_study(server, 1, max_attempts=3)
    (run,) = all_runs(server, sid)
    rid = run["id"]
    victim = spawn(fake_worker_cmd(server, "victim", steps=100, batch=10, pause=0.5, deadline=60), tmp_path / "victim.log")
    wait_until(lambda: len(_chunks(url, rid)) >= 2, 30, what="the victim's first batches")
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(timeout=10)
    rescuer = spawn(fake_worker_cmd(server, "rescuer", steps=100, batch=10, deadline=60, idle_exit=8), tmp_path / "rescuer.log")
    assert rescuer.wait(timeout=60) == 0
    assert _done(tmp_path / "rescuer.log")["completed"] == [rid]
    run = all_runs(server, sid)[0]
    assert run["status"] == "completed" and run["attempt"] == 2
    _assert_series_exact(server, url, rid, 100, 10, study_id=sid)


def test_api_killed_during_ingestion_loses_no_acked_batch_and_duplicates_nothing(cluster, backend_url):
    """kill -9 the API process under heavy ingestion, restart it: every 2xx batch is stored, retries are idempotent."""
    (server,) = cluster(backend_url, lease_seconds=60)
    n_runs, steps, batch = 8, 3000, 50  # 60 batches per run, 480 in all
    create_study(server, n_runs)
    acked: set[tuple[int, int]] = set()
    lock = threading.Lock()
    errors: list[BaseException] = []

    def ingest(i: int) -> None:
        try:
            w = FakeWorker(server.url, server.tokens["worker"], f"w{i}", deadline_s=90, timeout=5)
            w.register()
            lease = w.lease()
            run_id, lid = lease["run_id"], lease["lease_id"]
            for seq, start in enumerate(range(0, steps, batch)):
                chunk = range(start, start + batch)
                from steady.worker.contract.protocol import Series

                packed = Series.packed("loss", list(chunk), expected_values(run_id, chunk)).model_dump(exclude_none=True)
                body = {"lease_id": lid, "seq": seq, "series": [packed]}
                r = w.call(f"/api/v1/runs/{run_id}/metrics", body)
                assert r.status_code == 200, r.text
                with lock:
                    acked.add((run_id, seq))
            assert w.complete(run_id, {"lease_id": lid}).status_code == 200
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=ingest, args=(i,)) for i in range(n_runs)]
    for t in threads:
        t.start()
    wait_until(lambda: len(acked) >= 120, 60, interval=0.02, what="a quarter of the batches acknowledged")
    server.kill()
    with lock:
        acked_before_kill = set(acked)
    stored = {(r, s) for r, s in sql(backend_url, "SELECT run_id, seq FROM metric_chunks")}
    missing = acked_before_kill - stored
    assert not missing, f"{len(missing)} acknowledged batches are not in the database"
    # The premise: the kill came mid-ingestion, so the clients retry into the restart.
    assert len(acked_before_kill) < n_runs * steps // batch
    server.restart()
    for t in threads:
        t.join(timeout=90)
    assert not errors, errors
    assert len(acked) == n_runs * steps // batch
    for run_id in range(1, n_runs + 1):
        _assert_series_exact(server, backend_url, run_id, steps, batch)


def _streaming_workers(cluster, url: str, tmp_path: Path, *, pause: float, deadline: float):
    """An API on ``url``, a study of 6 runs of 200 steps, and 3 fake workers streaming them in batches of
    10: (server, worker processes, their logs), once they stream. One uvicorn process: its thread pool serves
    the three workers' requests at once on its pool's connections, which the outage and the killed connections
    hit (each process answers for itself; --workers 2 is tests/scale/test_concurrency.py's)."""
    (server,) = cluster(url, lease_seconds=60)
    create_study(server, 6)
    logs = [tmp_path / f"w{i}.log" for i in range(3)]
    procs = [spawn(fake_worker_cmd(server, f"w{i}", steps=200, batch=10, pause=pause, deadline=deadline, idle_exit=3),
                   logs[i]) for i in range(3)]
    wait_until(lambda: len(_chunks(url, 1)) >= 3, 30, what="workers streaming")
    return server, procs, logs


def _terminate_backends(url: str) -> None:
    """End every connection to the test's database, as a restart of PostgreSQL does."""
    from tests.conftest import PG_URL

    sql(PG_URL, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :d AND pid <> pg_backend_pid()",
        d=make_url(url).database)


def _assert_recovered(server, url: str, procs, logs, timeout: float) -> None:
    """Every worker exits cleanly having been answered 503 at some point and never 500; no traceback
    in the server's log; every run completed with every step stored exactly once."""
    for p, log in zip(procs, logs):
        assert p.wait(timeout=timeout) == 0, log.read_text()
    statuses: dict[str, int] = {}
    for log in logs:
        for code, count in _done(log)["statuses"].items():
            statuses[code] = statuses.get(code, 0) + count
    assert "500" not in statuses and "503" in statuses, statuses
    log_text = server.log_path.read_text()
    assert "Traceback" not in log_text, log_text[log_text.index("Traceback"):][:4000]
    runs = all_runs(server, 1)
    assert all(r["status"] == "completed" for r in runs), [r["status"] for r in runs]
    for r in runs:
        _assert_series_exact(server, url, r["id"], 200, 10)


@pytest.mark.postgres
def test_postgres_outage_answers_503_and_workers_resume(cluster, pg_database, tmp_path):
    """The database goes away under running workers: 503 (never 500) meanwhile, then everything completes.

    The shared PostgreSQL server is not restarted (other tests use it): the outage is this test's
    database refusing connections (ALLOW_CONNECTIONS false) with its backends terminated.
    """
    server, procs, logs = _streaming_workers(cluster, pg_database, tmp_path, pause=0.15, deadline=90)
    dbname = make_url(pg_database).database
    from tests.conftest import PG_URL

    seen: dict[int, int] = {}
    sql(PG_URL, f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS false')
    try:
        _terminate_backends(pg_database)
        end = time.monotonic() + 5
        with server.client("user") as c:
            while time.monotonic() < end:
                for path in ("/healthz", "/api/v1/studies", "/api/v1/studies/1/runs"):
                    code = c.get(path).status_code
                    seen[code] = seen.get(code, 0) + 1
                time.sleep(0.1)
    finally:
        sql(PG_URL, f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')
    assert set(seen) == {503}, f"answers during the outage: {seen}"
    _assert_recovered(server, pg_database, procs, logs, timeout=90)


@pytest.mark.postgres
def test_connections_killed_mid_transaction_answer_503_never_500(cluster, pg_database, tmp_path):
    """Every backend of the database terminated, 40 times at random moments under streaming workers
    (a restart or failover of PostgreSQL, many times over): whatever statement or commit each kill
    lands in, the answer is 503 and the retry completes; no 500, no traceback, every point once.

    The outage test above met this only by chance: a lone batch whose connection died inside its
    savepoint was committed anyway, and PendingRollbackError came back as a 500."""
    server, procs, logs = _streaming_workers(cluster, pg_database, tmp_path, pause=0.05, deadline=120)
    rng = random.Random(7)
    for _ in range(40):
        _terminate_backends(pg_database)
        time.sleep(rng.uniform(0.0, 0.2))
    _assert_recovered(server, pg_database, procs, logs, timeout=120)


@FAST_LEASE_API
def test_stalled_worker_late_results_are_refused(fast_lease_api, backend_url, request, tmp_path):
    """A worker frozen past its lease (SIGSTOP: its clock and network stall) comes back to 409s; the data stays the new attempt's."""
    server, url = fast_lease_api.get(backend_url, request)
    sid = create_study(server, 1)
    (run,) = all_runs(server, sid)
    rid = run["id"]
    slow = spawn(fake_worker_cmd(server, "stalled", steps=100, batch=10, pause=0.3, deadline=60, idle_exit=0.5), tmp_path / "stalled.log")
    wait_until(lambda: len(_chunks(url, rid)) >= 2, 30, what="the stalled worker's first batches")
    os.killpg(slow.pid, signal.SIGSTOP)
    try:
        rescuer = spawn(fake_worker_cmd(server, "rescuer", steps=100, batch=10, pause=0.05, deadline=60, idle_exit=5),
                        tmp_path / "rescuer.log")
        # resume the stalled worker while the rescuer is mid-run: its batches land between the rescuer's
        wait_until(lambda: any(c[0] == 2 for c in _chunks(url, rid)), 30, what="the rescuer's attempt")
    finally:
        os.killpg(slow.pid, signal.SIGCONT)
    assert slow.wait(timeout=60) == 0 and rescuer.wait(timeout=60) == 0
    stalled, rescued = _done(tmp_path / "stalled.log"), _done(tmp_path / "rescuer.log")
    assert stalled["lost"] == [rid] and stalled["completed"] == [] and stalled["statuses"].get("409")
    assert rescued["completed"] == [rid]
    assert all_runs(server, sid)[0]["attempt"] == 2
    _assert_series_exact(server, url, rid, 100, 10, study_id=sid)
