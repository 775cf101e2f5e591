"""Columnar chunk storage: exact round trips whatever the step layout."""

from __future__ import annotations

import numpy as np
import pytest

from app.db import Database
from app.metrics import repository as repo
from app.models import Run, Study, utcnow


@pytest.fixture
def run_id(db_url):
    db = Database(db_url)
    with db.write() as s:
        study = Study(name="s", kind="external", status="open", spec={})
        s.add(study)
        s.flush()
        run = Run(study_id=study.id, seed=0, repeat=0, determinism="seeded", stack="x", framework="torch",
                  required_labels=[], status="completed", attempt=1, max_attempts=1, fingerprint={}, digests={},
                  determinism_applied={}, timings={}, final_metrics={}, created_at=utcnow())
        s.add(run)
        s.flush()
        rid = run.id
    yield db, rid
    db.dispose()


@pytest.mark.parametrize(
    "chunks",
    [
        [[0, 1, 2, 3]],  # evenly spaced: stored without a steps blob
        [[10, 20, 30], [40, 50]],
        [[7]],  # a single point
        [[0, 5, 7, 100]],  # irregular
        [[5, 6], [0, 1, 2]],  # batches out of order
        [[0, 1, 2], [2, 3]],  # step 2 logged twice: the later batch wins
    ],
)
def test_roundtrip(run_id, chunks):
    db, rid = run_id
    rng = np.random.default_rng(1)
    expected: dict[int, float] = {}
    with db.write() as s:
        for seq, steps in enumerate(chunks):
            values = rng.standard_normal(len(steps))
            values[0] = np.nan if seq == 0 else values[0]
            repo.insert_chunks(s, rid, 1, seq, [("loss", np.array(steps), values)])
            expected.update(zip(steps, values))
    with db.read() as s:
        steps, values = repo.load_series(s, [rid], ["loss"])[(rid, "loss")]
    want_steps = np.array(sorted(expected))
    assert np.array_equal(steps, want_steps)
    want = np.array([expected[k] for k in want_steps])
    assert values.tobytes() == want.tobytes()


def test_evenly_spaced_steps_store_no_blob():
    steps_b, _ = repo.encode(np.arange(0, 1000, 10), np.zeros(100))
    assert steps_b == b""
    steps_b, _ = repo.encode(np.array([0, 10, 21]), np.zeros(3))
    assert len(steps_b) == 24
    assert np.array_equal(repo.decode_steps(b"", 0, 990, 100), np.arange(0, 1000, 10))


def test_series_dtype_is_stored_and_float64_is_implicit(run_id):
    db, rid = run_id
    with db.write() as s:
        repo.insert_chunks(s, rid, 1, 0, [("loss", np.array([0, 1]), np.array([1.0, 2.0]), "float32"),
                                          ("acc", np.array([0, 1]), np.array([0.5, 0.6]), "float64"),
                                          ("lr", np.array([0, 1]), np.array([0.1, 0.1]))])
    with db.read() as s:
        assert repo.load_dtypes(s, [rid]) == {(rid, "loss"): "float32"}
        assert repo.load_dtypes(s, [rid], ["acc"]) == {}
