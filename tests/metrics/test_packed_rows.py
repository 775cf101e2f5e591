"""A packed series' chunk row made from its bytes (``packed_chunk_row``, what ingestion stores) is the row the
general path makes from arrays (``chunk_rows``), and stores and reads back the same bits on every backend."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from steady.server.metrics import repository as repo
from steady.server.models import MetricChunk
from steady.worker.contract.protocol import FLOAT_DTYPES
from tests.conftest import database_with_one_run

INT64 = st.integers(min_value=-2**63, max_value=2**63 - 1)
EDGES = [[0], [-2**63], [2**63 - 1], [-2**63, 2**63 - 1], [-2**62, 0, 2**62], [-2**63, -1, 2**63 - 2],
         [3, 1, 2], [1, 1], [0, 2, 3], [5, 4], [0, 3, 6, 9, 12]]


@st.composite
def steps_lists(draw) -> list[int]:
    kind = draw(st.sampled_from(["even", "any", "edge", "near"]))
    if kind == "edge":
        return draw(st.sampled_from(EDGES))
    n = draw(st.integers(min_value=1, max_value=60))
    if kind == "any":
        return draw(st.lists(INT64, min_size=n, max_size=n))
    first = draw(st.integers(min_value=-2**62, max_value=2**62))
    stride = draw(st.integers(min_value=-3, max_value=2**62 // max(1, n)))
    steps = [first + stride * i for i in range(n)]
    if kind == "near" and n > 2:  # evenly spaced but for one step
        i = draw(st.integers(min_value=1, max_value=n - 2))
        steps[i] += draw(st.sampled_from([-1, 1]))
    return steps


BITS = st.integers(min_value=0, max_value=2**64 - 1)
SERIES = st.tuples(steps_lists(), st.sampled_from((None, *FLOAT_DTYPES)), st.sampled_from((None, 1e-4)),
                   st.randoms(use_true_random=False))


def _packed(steps: list[int], rng) -> tuple[bytes, bytes]:
    values = [rng.getrandbits(64) for _ in steps]  # any bit pattern: NaN payloads, ±Inf, -0.0, subnormals
    return struct.pack(f"<{len(steps)}q", *steps), struct.pack(f"<{len(steps)}Q", *values)


@settings(max_examples=400, deadline=None)
@given(series=SERIES)
def test_the_row_from_bytes_is_the_row_from_arrays(series):
    steps, dtype, resolution, rng = series
    steps_b, values_b = _packed(steps, rng)
    general = repo.chunk_rows([("loss", np.frombuffer(steps_b, "<i8"), np.frombuffer(values_b, "<f8"), dtype,
                                resolution)])
    assert [repo.packed_chunk_row("loss", steps_b, values_b, dtype, resolution)] == general
    assert repo.packed_chunk_row("loss", b"", b"") is None and repo.chunk_rows([("loss", np.zeros(0, "<i8"),
                                                                                  np.zeros(0))]) == []


def test_steps_too_far_apart_for_a_stride_are_stored_as_they_are():
    """Two steps further apart than an int64 reaches: no stride can rebuild them (the general path raised
    OverflowError on them), so their bytes are stored."""
    steps = np.array([-2**63, 2**63 - 1], dtype=np.int64)
    row = repo.packed_chunk_row("loss", steps.tobytes(), np.zeros(2).tobytes())
    assert row is not None and row["steps"] == steps.tobytes()
    assert repo.chunk_rows([("loss", steps, np.zeros(2))]) == [row]


@pytest.fixture
def one_run(db_url):
    db, rid = database_with_one_run(db_url, status="running")
    yield db, rid
    db.dispose()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(SERIES, min_size=1, max_size=3))
def test_both_paths_store_and_read_back_the_same_bits(one_run, batch):
    """On SQLite and PostgreSQL: a batch stored from bytes and the same batch stored from arrays leave the same
    chunk rows, and every series reads back bit for bit (a step logged twice in one batch reads its first value)."""
    db, rid = one_run
    keys = [f"k{i}" for i in range(len(batch))]
    packed = [(key, *_packed(steps, rng), dtype, res) for key, (steps, dtype, res, rng) in zip(keys, batch)]
    with db.write() as s:
        seq = (s.scalar(select(MetricChunk.seq).order_by(MetricChunk.seq.desc()).limit(1)) or 0) + 1
        from_bytes = [row for p in packed if (row := repo.packed_chunk_row(*p)) is not None]
        repo.insert_rows(s, rid, 1, seq, from_bytes)
        from_arrays = [(key, np.frombuffer(sb, "<i8"), np.frombuffer(vb, "<f8"), dtype, res)
                       for key, sb, vb, dtype, res in packed]
        repo.insert_chunks(s, rid, 1, seq + 1, from_arrays)
    t = MetricChunk.__table__
    columns = (t.c.key, t.c.n, t.c.step_min, t.c.step_max, t.c.steps, t.c["values"], t.c.dtype, t.c.resolution)
    with db.read() as s:
        stored = {q: [tuple(r) for r in s.execute(select(*columns).where(t.c.run_id == rid, t.c.seq == q)
                                                 .order_by(t.c.key))] for q in (seq, seq + 1)}
        assert stored[seq] == stored[seq + 1] != []
        for key, sb, vb, _, _ in packed:
            row = next(r for r in stored[seq] if r[0] == key)
            steps = repo.decode_steps(row[4], row[2], row[3], row[1])
            assert steps.astype("<i8").tobytes() == sb and row[5] == vb
