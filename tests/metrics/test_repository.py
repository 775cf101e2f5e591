"""Columnar chunk storage: exact round trips whatever the step layout."""

from __future__ import annotations

import queue

import numpy as np
import pytest

from steady.server.kit.db import Database
from steady.server.metrics import repository as repo
from steady.server.models import Run, Study, utcnow
from tests.conftest import database_with_one_run


@pytest.fixture
def run_id(db_url):
    db, rid = database_with_one_run(db_url, status="completed")
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
        [[0, 1, 2], [2, 3]],  # step 2 logged twice: the first batch's value is kept
        [[5, 6], [0, 5]],  # a later batch that starts lower repeats step 5: still the first value kept
        [[0, 1, 1, 2]],  # step 1 twice in one batch: its first value kept
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
            for step, value in zip(steps, values):
                expected.setdefault(step, value)  # a value is never replaced by a later one
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


def test_shared_load_matches_load_series_bit_for_bit(db_url):
    """One matrix per key (row views on a shared grid) gives exactly ``load_series``'s series:
    full runs, runs with gaps or a later start, irregular steps, a re-logged step, NaN payloads."""
    db = Database(db_url)
    layouts = [
        [np.arange(0, 50), np.arange(50, 100)],  # the usual: full, evenly spaced
        [np.arange(50, 100), np.arange(0, 50)],  # batches stored out of order
        [np.arange(0, 30)],  # stopped early
        [np.arange(10, 100, 2)],  # logged every other step, later start
        [np.array([0, 5, 7, 99])],  # irregular: steps stored explicitly
        [np.arange(0, 60), np.arange(59, 100)],  # step 59 logged twice: the first value is kept
        [np.array([7])],  # a single point
    ]
    rng = np.random.default_rng(5)
    payload_nan = np.array([0x7FF8000000000ABC], dtype=np.uint64).view(np.float64)[0]

    def series(seq, steps):
        values = rng.standard_normal(steps.size)
        values[0] = [np.nan, payload_nan, np.inf, -0.0][seq % 4]
        return [("loss", steps, values), ("acc", steps, values * 2)]

    ids = _runs_with_chunks(db, layouts, series=series)
    with db.read() as s:
        want = repo.load_series(s, ids, ["loss", "acc"])
        got = repo.load_series_shared(s, ids, ["loss", "acc", "absent"])
    db.dispose()
    assert got.keys() == want.keys()
    for k, (steps, values) in want.items():
        assert np.array_equal(got[k][0], steps), k
        assert got[k][0].dtype == np.int64 and got[k][1].dtype == np.float64
        assert got[k][1].tobytes() == values.tobytes(), k
    full = [got[(i, "loss")] for i in ids[:2]]
    assert full[0][0] is full[1][0]  # one grid shared by the full runs
    assert full[0][1].base is not None and full[0][1].base is full[1][1].base  # rows of one matrix


def _runs_with_chunks(db, layouts, *, series=None):
    """One completed run per layout (a list of step arrays, one per batch), each batch's series
    ``series(seq, steps)`` (default: ``loss``, standard normal values)."""
    rng = np.random.default_rng(9)
    series = series or (lambda seq, steps: [("loss", steps, rng.standard_normal(steps.size))])
    with db.write() as s:
        study = Study(name="s", kind="external", status="open", spec={})
        s.add(study)
        s.flush()
        ids = []
        for i, chunks in enumerate(layouts):
            run = Run(study_id=study.id, seed=i, repeat=0, determinism="seeded", stack="x", framework="torch",
                      required_labels=[], status="completed", attempt=1, max_attempts=1, fingerprint={},
                      digests={}, determinism_applied={}, timings={}, final_metrics={}, created_at=utcnow())
            s.add(run)
            s.flush()
            ids.append(run.id)
            for seq, steps in enumerate(chunks):
                repo.insert_chunks(s, run.id, 1, seq, series(seq, steps))
    return ids


def test_grid_columns_read_the_shared_matrix_block_by_block(db_url):
    """Runs logged in the same evenly spaced chunks: the blocks, in any width, put side by side are
    the rows ``load_series_shared`` reads, bit for bit, in the order the runs were asked in."""
    db = Database(db_url)
    chunks = [np.arange(0, 70, 2), np.arange(70, 100), np.arange(100, 101), np.arange(110, 150, 10)]
    ids = _runs_with_chunks(db, [chunks[::-1], chunks, chunks[1:] + chunks[:1], chunks])
    order = [ids[2], ids[0], ids[3], ids[1]]
    with db.read() as s:
        want = repo.load_series_shared(s, order, ["loss"])
        columns = repo.grid_columns(s, order, "loss")
        assert columns is not None
        assert np.array_equal(columns.steps, want[(order[0], "loss")][0])
        matrix = np.vstack([want[(r, "loss")][1] for r in order])
        for width in (1, 3, 34, 35, 36, 70, 1000):
            firsts, blocks = zip(*columns.blocks(s, width))
            assert firsts == tuple(range(0, matrix.shape[1], width)), width
            assert all(b.flags.c_contiguous and b.shape[1] == width for b in blocks[:-1]), width
            assert 0 < blocks[-1].shape[1] <= width
            assert np.hstack(blocks).tobytes() == matrix.tobytes(), width
        # blocks put back, done with, are filled again: the same arrays, the same values
        spare, copies, seen = queue.SimpleQueue(), [], set()
        for _, block in columns.blocks(s, 3, spare=spare):
            copies.append(block.copy())
            seen.add(id(block))
            block[:] = np.nan  # what a consumer leaves in it must not reach a later block
            spare.put(block)
        assert np.hstack(copies).tobytes() == matrix.tobytes()
        assert len(seen) < len(copies)
        assert columns.not_finite == set()
        some = columns.subset([order[3], order[1]])  # the same grid over some runs, rows in the order asked
        assert np.hstack([b for _, b in some.blocks(s, 7)]).tobytes() == matrix[[3, 1]].tobytes()
    db.dispose()


@pytest.mark.parametrize("other, alone", [
    ([np.arange(0, 50)], True),  # stopped early: a shorter grid
    ([np.arange(0, 50), np.arange(52, 100)], True),  # a gap
    ([np.arange(0, 50), np.arange(50, 101, 2)], True),  # other extents over the same steps' range
    ([np.array([0, 1, 3]), np.arange(4, 100)], False),  # steps stored explicitly
    ([np.arange(0, 51), np.arange(50, 100)], False),  # step 50 logged twice
])
def test_grid_columns_refuse_what_is_not_one_gapless_grid(db_url, other, alone):
    """Runs on different grids, or one run whose own chunks are not one evenly spaced grid without
    overlap (``load_series_shared`` reads those)."""
    db = Database(db_url)
    full = [np.arange(0, 50), np.arange(50, 100)]
    ids = _runs_with_chunks(db, [full, other])
    with db.write() as s:  # a NaN in the first run's second batch
        repo.insert_chunks(s, ids[0], 1, 2, [("acc", np.arange(3), np.array([0.0, np.nan, 1.0]))])
    with db.read() as s:
        columns = repo.grid_columns(s, ids[:1], "acc")
        assert columns is not None and not columns.not_finite
        list(columns.blocks(s, 2))
        assert columns.not_finite == {ids[0]}
        assert repo.grid_columns(s, ids[:1], "loss") is not None
        assert (repo.grid_columns(s, ids[1:], "loss") is not None) is alone
        assert repo.grid_columns(s, ids, "loss") is None
        assert repo.grid_columns(s, ids[1:], "acc") is None  # not logged
    db.dispose()
