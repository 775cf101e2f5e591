"""The run's stored usage (runs.stored_points, runs.stored_keys): equal, after every write, retry, refusal,
requeue and cancellation, to the points and distinct keys of the chunks its current attempt holds; the
limits a metric batch is checked against read it, and accept and refuse the batches a model of the chunks does."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest
from sqlalchemy import distinct, func, inspect, select, text

from steady.server.kit.db import Database
from steady.server.metrics import repository as metrics_repo
from steady.server.models import MetricChunk, Run
from steady.worker.contract.protocol import Series
from tests.api.helpers import register, result, spec
from tests.conftest import POSTGRES_ONLY, database_with_one_run, wait_until

KEYS = ("loss", "acc", "lr", "grad", "time", "mem", "tput")
MAX_KEYS, MAX_POINTS = 5, 600


def chunk_usage(session, run_id: int) -> tuple[int, int]:
    """Points and distinct keys of the run's current attempt, summed from its chunks."""
    attempt = select(Run.attempt).where(Run.id == run_id).scalar_subquery()
    current = (MetricChunk.run_id == run_id) & (MetricChunk.attempt == attempt)
    points = session.scalar(select(func.coalesce(func.sum(MetricChunk.n), 0)).where(current))
    keys = session.scalar(select(func.count(distinct(MetricChunk.key))).where(current))
    return int(points), int(keys)


def _counter(session, run_id: int) -> tuple[int, int]:
    points, keys = session.execute(select(Run.stored_points, Run.stored_keys).where(Run.id == run_id)).one()
    return int(points), int(keys)


def _check(api, run_id: int) -> tuple[int, int]:
    with api.app.state.database.read() as s:
        usage = chunk_usage(s, run_id)
        assert _counter(s, run_id) == usage
    return usage


def _body(lease_id: str, seq: int, series: dict[str, list[int]]) -> dict:
    return {"lease_id": lease_id, "seq": seq,
            "series": [Series.packed(k, steps, [0.5] * len(steps)).model_dump(exclude_none=True)
                       for k, steps in series.items()]}


@pytest.mark.parametrize("seed", range(4))
def test_stored_usage_equals_the_chunks_after_random_writes_retries_requeues_and_cancels(make_api, seed):
    rng = random.Random(seed)
    api = make_api(max_keys_per_run=MAX_KEYS, max_points_per_run=MAX_POINTS)
    study = api.post("/api/v1/studies", json=spec(seeds=[0], repeats=1, determinism=["strict"])).json()["id"]
    wid = register(api)

    def new_lease() -> tuple[int, str]:
        r = api.post(f"/api/v1/workers/{wid}/lease", role="worker", json={"worker_id": wid})
        assert r.status_code == 200, r.text
        return r.json()["run_id"], r.json()["lease_id"]

    run_id, lid = new_lease()
    model: dict[str, int] = {}  # the current attempt's points per key, as the batches accepted add them
    sent: list[dict] = []  # bodies acknowledged under the current lease
    seq = 0
    counts = {"stored": 0, "refused": 0, "retried": 0, "requeued": 0}
    for _ in range(60):
        op = rng.random()
        if op < 0.65 or not sent:
            keys = rng.sample(KEYS, rng.randint(1, 3))
            series = {k: list(range(seq * 100, seq * 100 + rng.randint(1, 60))) for k in keys}
            body = _body(lid, seq, series)
            seq += 1
            points = sum(len(s) for s in series.values())
            over = (len(set(model) | set(keys)) > MAX_KEYS) or (sum(model.values()) + points > MAX_POINTS)
            r = api.post(f"/api/v1/runs/{run_id}/metrics", role="worker", json=body)
            if over:
                assert r.status_code == 422, r.text
                assert ("STEADY_MAX_KEYS_PER_RUN" in r.text) == (len(set(model) | set(keys)) > MAX_KEYS)
                counts["refused"] += 1
            else:
                assert r.status_code == 200 and r.json()["duplicate"] is False, r.text
                for k, steps in series.items():
                    model[k] = model.get(k, 0) + len(steps)
                sent.append(body)
                counts["stored"] += 1
        elif op < 0.85:
            r = api.post(f"/api/v1/runs/{run_id}/metrics", role="worker", json=rng.choice(sent))
            assert r.status_code == 200 and r.json()["duplicate"] is True, r.text
            counts["retried"] += 1
        else:  # requeue: the attempt is given back, its points dropped; the next lease starts from none
            r = api.post(f"/api/v1/runs/{run_id}/release", role="worker", json={"lease_id": lid})
            assert r.status_code == 200, r.text
            assert _check(api, run_id) == (0, 0)
            run_id, lid = new_lease()
            model, sent = {}, []
            counts["requeued"] += 1
        assert _check(api, run_id) == (sum(model.values()), len(model))
    assert min(counts.values()) > 0, counts  # every kind of step was taken
    # a cancelled study's running run given back ends cancelled and its attempt's points are dropped
    assert api.post(f"/api/v1/studies/{study}/cancel").status_code == 200
    assert api.post(f"/api/v1/runs/{run_id}/release", role="worker", json={"lease_id": lid}).status_code == 200
    assert _check(api, run_id) == (0, 0)


def test_a_completed_run_keeps_its_attempts_usage(make_api):
    api = make_api()
    api.post("/api/v1/studies", json=spec(seeds=[0], repeats=1, determinism=["strict"]))
    wid = register(api)
    leased = api.post(f"/api/v1/workers/{wid}/lease", role="worker", json={"worker_id": wid}).json()
    run_id, lid = leased["run_id"], leased["lease_id"]
    for seq in range(3):
        body = _body(lid, seq, {"loss": list(range(seq * 10, seq * 10 + 10)), f"k{seq}": [0, 1]})
        assert api.post(f"/api/v1/runs/{run_id}/metrics", role="worker", json=body).status_code == 200
    assert api.post(f"/api/v1/runs/{run_id}/complete", role="worker", json=result(lid)).status_code == 200
    assert _check(api, run_id) == (36, 4)


def test_mlflow_writes_count_in_the_stored_usage(make_api):
    api = make_api(max_points_per_run=5)
    mlflow = "/mlflow/api/2.0/mlflow"
    exp = api.post(f"{mlflow}/experiments/create", json={"name": "usage"})
    assert exp.status_code == 200, exp.text
    run = api.post(f"{mlflow}/runs/create", json={"experiment_id": exp.json()["experiment_id"]})
    assert run.status_code == 200, run.text
    run_id = run.json()["run"]["info"]["run_id"]

    def log(key: str, steps: range):
        metrics = [{"key": key, "value": 1.0, "timestamp": 1, "step": s} for s in steps]
        return api.post(f"{mlflow}/runs/log-batch", json={"run_id": run_id, "metrics": metrics})

    assert log("a", range(3)).status_code == 200
    assert log("b", range(2)).status_code == 200
    assert log("b", range(2)).status_code == 200  # a retry: stored once
    assert _check(api, int(run_id)) == (5, 2)
    refused = log("a", range(3, 4))
    assert refused.status_code >= 400 and "STEADY_MAX_POINTS_PER_RUN" in refused.text, refused.text
    assert _check(api, int(run_id)) == (5, 2)


@POSTGRES_ONLY
def test_two_batches_of_one_attempt_committed_at_once_lose_no_increment(db_url):
    """Two processes store a batch of one attempt at once, both with a key new to it: the second waits for the
    first's commit (the run's row is locked), then counts its points and not the key a second time."""
    db, run_id = database_with_one_run(db_url, status="running")
    other = Database(db_url)
    inserted, go_on = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def rows(seq: int) -> list[dict]:
        steps = np.arange(seq * 10, seq * 10 + 10)
        return metrics_repo.chunk_rows([("loss", steps, steps * 0.5), (f"only{seq}", steps[:3], steps[:3] * 1.0)])

    def first() -> None:
        try:
            with db.write() as s:
                metrics_repo.insert_rows(s, run_id, 1, 0, rows(0))
                inserted.set()
                assert go_on.wait(30)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
            inserted.set()

    def second() -> None:
        try:
            with other.write() as s:
                metrics_repo.insert_rows(s, run_id, 1, 1, rows(1))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    t1 = threading.Thread(target=first)
    t1.start()
    assert inserted.wait(30)
    t2 = threading.Thread(target=second)
    t2.start()
    def waiting() -> int:
        with db.engine.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                     "AND datname = current_database()")).scalar()

    try:
        wait_until(waiting, timeout=30, what="the second batch waiting for the run's row")
    finally:
        go_on.set()
        t1.join(30)
        t2.join(30)
    assert not errors, errors
    with db.read() as s:
        assert chunk_usage(s, run_id) == (26, 3)
        assert _counter(s, run_id) == (26, 3)
    other.dispose()
    db.dispose()


def test_migration_0022_fills_the_usage_from_the_chunks_stored(db_url):
    """Chunks stored before the columns existed: the upgrade counts those of each run's current attempt."""
    from alembic import command

    from steady.server.kit import migrate

    db, run_id = database_with_one_run(db_url, status="running")
    _, empty_run = database_with_one_run(db_url, status="queued")
    with db.write() as s:
        metrics_repo.insert_chunks(s, run_id, 1, 0, [("loss", np.arange(7), np.zeros(7)), ("acc", np.arange(2), np.ones(2))])
        metrics_repo.insert_chunks(s, run_id, 1, 1, [("loss", np.arange(7, 10), np.zeros(3))])
        metrics_repo.insert_chunks(s, run_id, 0, 0, [("old", np.arange(50), np.zeros(50))])  # not the current attempt
    cfg = migrate.alembic_config()
    with db.engine.connect() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0021_lease_indexes")
        conn.commit()
        assert "stored_points" not in {c["name"] for c in inspect(conn).get_columns("runs")}
        command.upgrade(cfg, "head")
        conn.commit()
    with db.read() as s:
        assert chunk_usage(s, run_id) == (12, 2)
        assert _counter(s, run_id) == (12, 2)
        assert _counter(s, empty_run) == (0, 0)
    db.dispose()
