"""Group commit of metric batches: shared transactions, per-batch answers, durable before the answer."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import numpy as np
import pytest
from sqlalchemy import event, func, select
from sqlalchemy.exc import OperationalError

from steady.server.kit.db import Database, unavailable
from steady.server.kit.errors import Conflict
from steady.server.metrics import repository as metrics_repo
from steady.server.models import MetricChunk
from steady.server.lifecycle.committer import GroupCommitter
from tests.api.helpers import batch, lease, register, spec
from tests.conftest import POSTGRES_ONLY, database_with_one_run, terminate_own_connection, wait_until


@pytest.fixture
def db_run(db_url):
    db, rid = database_with_one_run(db_url, status="running")
    yield db, rid
    db.dispose()


@pytest.fixture
def committer(db_run):
    c = GroupCommitter(db_run[0])
    c.start()
    yield c
    c.stop()


def _rows(seq: int) -> list[dict]:
    steps = np.arange(seq * 10, seq * 10 + 10)
    return metrics_repo.chunk_rows([("loss", steps, steps * 0.5)])


def _stored_seqs(url: str, run_id: int) -> list[int]:
    """Read through a separate engine: what another connection sees is what was committed."""
    other = Database(url)
    try:
        with other.read() as s:
            return sorted(s.scalars(select(MetricChunk.seq).where(MetricChunk.run_id == run_id)))
    finally:
        other.dispose()


def _hold(committer: GroupCommitter) -> threading.Event:
    """Occupy the committer with a transaction that waits for the returned event, so what is submitted
    meanwhile queues up and forms the next group."""
    release, started = threading.Event(), threading.Event()

    def blocker(session):
        started.set()
        assert release.wait(30)

    committer.submit(blocker)
    assert started.wait(30)
    return release


def test_concurrent_batches_share_one_commit_and_are_answered_only_once_durable(committer, db_run):
    db, run_id = db_run
    n = 12
    release = _hold(committer)
    seen_at_answer: dict[int, list[int]] = {}
    futures = {}

    def send(seq: int) -> None:
        future = committer.submit(lambda s: metrics_repo.insert_rows(s, run_id, 1, seq, _rows(seq)))
        # runs when the answer is set: the batch must already be visible to another connection
        future.add_done_callback(lambda f: seen_at_answer.setdefault(seq, _stored_seqs(db.url, run_id)))
        futures[seq] = future

    threads = [threading.Thread(target=send, args=(seq,)) for seq in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wait_until(lambda: committer._queue.qsize() == n, 30, 0.01, "the batches to queue")
    assert not any(f.done() for f in futures.values())  # nothing answered before its commit
    before = committer.transactions
    release.set()
    assert all(f.result(timeout=30) is True for f in futures.values())
    assert committer.transactions == before + 2  # the blocker's transaction, then one for all twelve
    wait_until(lambda: len(seen_at_answer) == n, 30, 0.01, "every answer's callback")  # they run after result()
    for seq in range(n):
        assert seq in seen_at_answer[seq]
    assert _stored_seqs(db.url, run_id) == list(range(n))


def test_a_failing_batch_is_rolled_back_alone(committer, db_run):
    db, run_id = db_run

    def bad(session):
        metrics_repo.insert_rows(session, run_id, 1, 99, _rows(99))  # written, then refused
        raise Conflict("lease lost")

    release = _hold(committer)
    good = [committer.submit(lambda s, q=q: metrics_repo.insert_rows(s, run_id, 1, q, _rows(q))) for q in (0, 1)]
    failing = committer.submit(bad)
    good.append(committer.submit(lambda s: metrics_repo.insert_rows(s, run_id, 1, 2, _rows(2))))
    retried = committer.submit(lambda s: metrics_repo.insert_rows(s, run_id, 1, 0, _rows(0)))  # a retry of seq 0
    wait_until(lambda: committer._queue.qsize() == 5, 30, 0.01, "the batches to queue")
    before = committer.transactions
    release.set()
    with pytest.raises(Conflict):
        failing.result(timeout=30)
    assert [f.result(timeout=30) for f in good] == [True, True, True]
    assert retried.result(timeout=30) is False  # already stored in the same transaction: not twice
    assert _stored_seqs(db.url, run_id) == [0, 1, 2]
    # the blocker's; the group's without savepoints, rolled back at the failing batch; the group with them
    assert committer.transactions == before + 3


def test_a_group_that_does_not_fail_takes_no_savepoint(committer, db_run):
    """Savepoints cost two statements a piece: a group runs without them, and needs them only when one of
    its pieces fails. A lone piece that fails is rolled back with its transaction, which was its own."""
    db, run_id = db_run
    statements: list[str] = []

    def seen(_conn, _cursor, statement, *_args) -> None:
        statements.append(statement.upper())

    def store(seq: int):
        return lambda session: metrics_repo.insert_rows(session, run_id, 1, seq, _rows(seq), savepoint=False)

    def bad(session):
        metrics_repo.insert_rows(session, run_id, 1, 99, _rows(99), savepoint=False)  # written, then refused
        raise Conflict("lease lost")

    event.listen(db.engine, "before_cursor_execute", seen)
    try:
        release = _hold(committer)
        futures = [committer.submit(store(q)) for q in range(4)]
        wait_until(lambda: committer._queue.qsize() == 4, 30, 0.01, "the batches to queue")
        before = committer.transactions
        release.set()
        assert [f.result(timeout=30) for f in futures] == [True] * 4
        assert committer.transactions == before + 2  # the blocker's, then one for the four
        with pytest.raises(Conflict):
            committer.submit(bad).result(timeout=30)
        assert committer.transactions == before + 3
    finally:
        event.remove(db.engine, "before_cursor_execute", seen)
    assert not [s for s in statements if "SAVEPOINT" in s]
    assert _stored_seqs(db.url, run_id) == [0, 1, 2, 3]


def test_a_failed_commit_is_retried_batch_by_batch(committer, db_run, monkeypatch):
    db, run_id = db_run
    real_write, failures = db.write, []

    @contextmanager
    def write_failing_once(*, queue: bool = False):
        with real_write(queue=queue) as session:
            yield session
            if not failures:  # the first group transaction fails as its commit would (rolled back)
                failures.append(1)
                raise OperationalError("COMMIT", {}, Exception("disk I/O error"))

    release = _hold(committer)  # its transaction is already open: the failure hits the next one
    monkeypatch.setattr(db, "write", write_failing_once)
    _assert_failed_group_is_retried_alone(committer, release, db, run_id, [_store(run_id, q) for q in range(4)])
    assert failures == [1]


def _store(run_id: int, seq: int):
    return lambda session: metrics_repo.insert_rows(session, run_id, 1, seq, _rows(seq))


def _assert_failed_group_is_retried_alone(committer, release: threading.Event, db, run_id: int, works: list) -> None:
    """Queue ``works`` (storing seqs 0, 1, …) behind the held transaction, so that they form one
    group, then release it: that group's transaction fails, and each batch is stored alone."""
    futures = [committer.submit(work) for work in works]
    wait_until(lambda: committer._queue.qsize() == len(works), 30, 0.01, "the batches to queue")
    before = committer.transactions
    release.set()
    assert [f.result(timeout=30) for f in futures] == [True] * len(works)
    assert committer.transactions == before + 1 + 1 + len(works)  # blocker, the failed group, each batch alone
    assert _stored_seqs(db.url, run_id) == list(range(len(works)))


def _dies_once(run_id: int, seq: int, died: list[int]):
    """Work whose connection is terminated under it the first time it runs (as an outage or a
    restart of PostgreSQL does mid-transaction), and that stores its batch when run again."""

    def work(session):
        if not died:
            died.append(seq)
            terminate_own_connection(session)
        return metrics_repo.insert_rows(session, run_id, 1, seq, _rows(seq))

    return work


@POSTGRES_ONLY
def test_a_connection_lost_under_a_lone_batch_answers_the_database_error(committer, db_run):
    """The piece's own savepoint cannot catch a lost connection: the transaction is gone. Its answer
    is the database's error (503 at the route), never the PendingRollbackError that committing the
    dead session raises (a 500, seen in CI during a PostgreSQL outage)."""
    db, run_id = db_run
    died: list[int] = []
    future = committer.submit(_dies_once(run_id, 5, died))
    with pytest.raises(OperationalError) as caught:
        future.result(timeout=30)
    assert died == [5] and unavailable(caught.value)
    assert committer.submit(_dies_once(run_id, 5, died)).result(timeout=30) is True  # the client's retry
    assert _stored_seqs(db.url, run_id) == [5]


@POSTGRES_ONLY
def test_a_connection_lost_mid_group_reruns_every_batch_alone(committer, db_run):
    db, run_id = db_run
    died: list[int] = []
    works = [_store(run_id, 0), _store(run_id, 1), _dies_once(run_id, 2, died), _store(run_id, 3)]
    _assert_failed_group_is_retried_alone(committer, _hold(committer), db, run_id, works)
    assert died == [2]


def test_ingestion_route_groups_concurrent_agents_and_refuses_a_lost_lease(api):
    """Through the real route: several agents' batches queued behind one transaction are stored
    together; a batch under a wrong lease is answered 409 and the others are all stored."""
    api.post("/api/v1/studies", json=spec(seeds=[0, 1, 2], repeats=1, determinism=["seeded"]))
    leases = [lease(api, register(api, name=f"w{i}")) for i in range(3)]
    committer: GroupCommitter = api.app.state.committer
    release = _hold(committer)
    answers: dict[tuple[int, int], int] = {}
    jobs = [(lz["run_id"], lz["lease_id"], seq) for lz in leases for seq in range(3)]
    jobs.append((leases[0]["run_id"], "not-the-lease", 7))

    def send(run_id: int, lease_id: str, seq: int) -> None:
        body = batch(lease_id, seq, "loss", list(range(seq * 100, seq * 100 + 100)), [0.25] * 100)
        answers[(run_id, seq)] = api.post(f"/api/v1/runs/{run_id}/metrics", role="worker", json=body).status_code

    threads = [threading.Thread(target=send, args=job) for job in jobs]
    for t in threads:
        t.start()
    wait_until(lambda: committer._queue.qsize() == len(jobs), 60, 0.01, "every request to queue")
    assert answers == {}  # no answer before the commit
    before = committer.transactions
    release.set()
    for t in threads:
        t.join(60)
    # the blocker's; the group's, rolled back at the lost lease; the group again, each batch in a savepoint of its
    # own; the route's own try of the refused batch (the short way past routing leaves refusals to the route)
    assert committer.transactions == before + 4
    assert answers.pop((leases[0]["run_id"], 7)) == 409
    assert set(answers.values()) == {200} and len(answers) == 9
    for lz in leases:
        series = api.get(f"/api/v1/runs/{lz['run_id']}/metrics/loss").json()
        assert series["steps"] == list(range(300))
    with api.app.state.database.read() as s:
        assert s.scalar(select(func.count()).select_from(MetricChunk).where(MetricChunk.seq == 7)) == 0


def test_a_batch_stored_meanwhile_by_another_process_is_answered_as_a_duplicate(api, monkeypatch):
    """The check said "new", but the same batch was committed before this insert (another API
    process on PostgreSQL): the insert fails on the unique key, the retry answers a duplicate."""
    import dataclasses

    from steady.server.runs import repository as runs_repo

    api.post("/api/v1/studies", json=spec(seeds=[0], repeats=1, determinism=["seeded"]))
    lz = lease(api, register(api))
    run_id = lz["run_id"]
    body = batch(lz["lease_id"], 4, "loss", [0, 1, 2], [1.0, 2.0, 3.0])
    assert api.post(f"/api/v1/runs/{run_id}/metrics", role="worker", json=body).json()["duplicate"] is False
    real, stale = runs_repo.batch_context, []

    def stale_once(session, *args):
        ctx = real(session, *args)
        if not stale:  # what a check made just before the other process committed would have seen
            stale.append(ctx)
            return dataclasses.replace(ctx, seq_stored=False)
        return ctx

    monkeypatch.setattr(runs_repo, "batch_context", stale_once)
    again = api.post(f"/api/v1/runs/{run_id}/metrics", role="worker", json=body)
    assert again.status_code == 200 and again.json()["duplicate"] is True
    assert len(stale) == 1 and stale[0].seq_stored is True
    assert api.get(f"/api/v1/runs/{run_id}/metrics/loss").json()["steps"] == [0, 1, 2]


def test_a_group_runs_its_pieces_in_the_order_of_their_key(committer, db_run):
    """Pieces of one group run by their ``order`` key (the run's id for a metric batch), submission order
    among equal keys: the order in which a group takes its runs' row locks."""
    ran: list[str] = []
    release = _hold(committer)
    futures = [committer.submit(lambda s, n=name: ran.append(n), order=key)
               for name, key in (("b7", 7), ("a5", 5), ("c7", 7), ("d3", 3))]
    wait_until(lambda: committer._queue.qsize() == 4, 30, 0.01, "the pieces to queue")
    release.set()
    for f in futures:
        f.result(timeout=30)
    assert ran == ["d3", "a5", "b7", "c7"]


@POSTGRES_ONLY
def test_two_processes_groups_over_the_same_runs_never_deadlock(db_url):
    """Two API processes' committers store batches of the same two runs at once, submitted in opposite
    orders; each batch locks its run's row until commit (``metrics_repo.lock_usage``). Taken in submission
    order, the first pieces lock one run each and the second pieces wait on each other: PostgreSQL ends one
    group with a deadlock and its batches are committed again one by one. In key order both groups lock the
    lower run first, one waits for the other's commit, and each group commits once."""
    db_a, run_1 = database_with_one_run(db_url, status="running")
    db_b, run_2 = database_with_one_run(db_url, status="running")
    committers = [GroupCommitter(db_a), GroupCommitter(db_b)]
    locked = [threading.Event(), threading.Event()]
    for c in committers:
        c.start()
    try:
        def first(me: int, run_id: int):
            def work(session):
                metrics_repo.lock_usage(session, run_id)
                locked[me].set()
                locked[1 - me].wait(3)  # the other group's first lock, if it can take one meanwhile
            return work

        def second(run_id: int):
            return lambda session: metrics_repo.lock_usage(session, run_id)

        holds = [_hold(c) for c in committers]
        futures = [committers[0].submit(first(0, run_2), order=run_2), committers[0].submit(second(run_1), order=run_1),
                   committers[1].submit(first(1, run_1), order=run_1), committers[1].submit(second(run_2), order=run_2)]
        for c in committers:
            wait_until(lambda c=c: c._queue.qsize() == 2, 30, 0.01, "the pieces to queue")
        for h in holds:
            h.set()
        for f in futures:
            f.result(timeout=60)
        assert [c.transactions for c in committers] == [2, 2]  # the hold's group and one group each: no rerun
    finally:
        for c in committers:
            c.stop()
        db_a.dispose()
        db_b.dispose()
