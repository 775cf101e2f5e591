"""Columnar storage of metric series: one row per (run, attempt, batch seq, key).

Steps are little-endian int64 and values little-endian float64 bytes, so a series reads
back bitwise (NaN payloads and ±Inf included) and 100 runs × 10^5 steps load with a
handful of rows per run instead of one ORM object per point.
"""

from __future__ import annotations

import functools
import queue
import struct
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence

import numpy as np
from sqlalchemy import bindparam, delete, exists, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from steady.server.models import MetricChunk, Run
from steady.worker.contract.protocol import RunStatus

STEP_DTYPE = np.dtype("<i8")
VALUE_DTYPE = np.dtype("<f8")


def encode(steps: np.ndarray, values: np.ndarray) -> tuple[bytes, bytes]:
    """Bytes of a chunk. Evenly spaced steps (the usual case) are stored as an empty blob and
    rebuilt from (step_min, step_max, n), halving what a load has to read."""
    values_b = np.ascontiguousarray(values, VALUE_DTYPE).tobytes()
    if _evenly_spaced(steps):
        return b"", values_b
    return np.ascontiguousarray(steps, STEP_DTYPE).tobytes(), values_b


def _evenly_spaced(steps: np.ndarray) -> bool:
    n = len(steps)
    if n == 1:
        return True
    first, last = int(steps[0]), int(steps[-1])
    stride = _stride(first, last, n)
    return stride is not None and bool(np.array_equal(steps, _grid(first, stride, n)))


_INT64_MAX = 2**63 - 1


def _stride(first: int, last: int, n: int) -> int | None:
    """The stride of ``n`` > 1 increasing, evenly spaced steps from ``first`` to ``last``, when there is one that
    an int64 holds (then ``decode_steps`` rebuilds them); None otherwise."""
    if last <= first or (last - first) % (n - 1):
        return None
    stride = (last - first) // (n - 1)
    return stride if stride <= _INT64_MAX else None


def _grid(first: int, stride: int, n: int) -> np.ndarray:
    # int64 arithmetic wraps, but every true value lies between first and last: each comes out exact
    return first + stride * np.arange(n, dtype=np.int64)


_INT64 = struct.Struct("<q")


def packed_chunk_row(key: str, steps: bytes, values: bytes, dtype: str | None = None,
                     resolution: float | None = None) -> dict | None:
    """``chunk_rows``'s row of one series given as little-endian int64 steps and float64 values of equal length
    (a packed series as it came off the wire), made from the bytes without turning them into arrays and back;
    None when the series is empty."""
    n = len(steps) // 8
    if n == 0:
        return None
    first, last = _INT64.unpack_from(steps)[0], _INT64.unpack_from(steps, 8 * (n - 1))[0]
    stride = 0 if n == 1 else _stride(first, last, n)
    if stride is not None and (n == 1 or _grid(first, stride, n).astype(STEP_DTYPE, copy=False).tobytes() == steps):
        stored, step_min, step_max = b"", first, last
    else:
        array = np.frombuffer(steps, dtype=STEP_DTYPE)
        stored, step_min, step_max = bytes(steps), int(array.min()), int(array.max())
    return {"key": key, "n": n, "step_min": step_min, "step_max": step_max, "steps": stored, "values": bytes(values),
            "dtype": dtype if dtype != "float64" else None, "resolution": resolution}


def decode_steps(blob: bytes, step_min: int, step_max: int, n: int) -> np.ndarray:
    if blob:
        return np.frombuffer(blob, dtype=STEP_DTYPE)
    if n == 1:
        return np.array([step_min], dtype=np.int64)
    return step_min + (step_max - step_min) // (n - 1) * np.arange(n, dtype=np.int64)


def insert_chunks(
    session: Session,
    run_id: int,
    attempt: int,
    seq: int,
    series: Iterable[tuple],
    *,
    known: Collection[str] | None = None,
) -> bool:
    """Store one batch of (key, steps, values[, dtype]); False when this (run, attempt, seq) was
    already stored (a retry). ``dtype``: the type the values were logged in, None for float64. ``known``: as
    ``insert_rows``'s."""
    return insert_rows(session, run_id, attempt, seq, chunk_rows(series), known=known)


def chunk_rows(series: Iterable[tuple]) -> list[dict]:
    """The chunk rows of one batch of (key, steps, values[, dtype[, resolution]]), without their run,
    attempt and seq: the encoding work, which needs no database (``insert_rows`` stores them).
    ``resolution``: values parsed from printed text, the unit of their last printed digit."""
    rows = []
    for key, steps, values, *rest in series:
        dtype = rest[0] if rest and rest[0] != "float64" else None
        resolution = rest[1] if len(rest) > 1 else None
        if len(steps) == 0:
            continue
        steps_b, values_b = encode(steps, values)
        rows.append(
            {
                "key": key,
                "n": int(len(steps)),
                "step_min": int(steps.min()),
                "step_max": int(steps.max()),
                "steps": steps_b,
                "values": values_b,
                "dtype": dtype,
                "resolution": resolution,
            }
        )
    return rows


_INSERT_CHUNKS = MetricChunk.__table__.insert()
_ADD_USAGE = (
    update(Run.__table__)
    .where(Run.__table__.c.id == bindparam("u_run_id"), Run.__table__.c.attempt == bindparam("u_attempt"))
    .values(stored_points=Run.__table__.c.stored_points + bindparam("u_points"),
            stored_keys=Run.__table__.c.stored_keys + bindparam("u_new_keys"))
)


def insert_rows(
    session: Session, run_id: int, attempt: int, seq: int, rows: Sequence[dict], *, savepoint: bool = True,
    known: Collection[str] | None = None,
) -> bool:
    """Store rows made by ``chunk_rows`` as batch ``seq`` of the run's attempt; False when that
    batch was already stored (a retry), and then nothing is written. ``savepoint=False``: for a
    caller that already checked the batch is new and runs in a savepoint of its own; a batch
    stored meanwhile by another process then raises IntegrityError.

    The run's usage (``runs.stored_points``, ``runs.stored_keys``) grows in the same transaction,
    when ``attempt`` is the run's current one. ``known``: the rows' keys the attempt already holds,
    as the caller read them after ``lock_usage`` (else they are read here)."""
    if not rows:
        return True
    ids = {"run_id": run_id, "attempt": attempt, "seq": seq}
    params = [{**row, **ids} for row in rows]
    if not savepoint:
        _insert(session, run_id, attempt, params, known)
        return True
    try:
        with session.begin_nested():
            _insert(session, run_id, attempt, params, known)
    except IntegrityError:
        return False
    return True


def _insert(session: Session, run_id: int, attempt: int, params: list[dict], known: Collection[str] | None) -> None:
    keys = {p["key"] for p in params}
    if known is None:
        lock_usage(session, run_id)
        known = known_keys(session, run_id, attempt, keys)
    conn = session.connection()
    conn.execute(_INSERT_CHUNKS, params)
    conn.execute(_ADD_USAGE, {"u_run_id": run_id, "u_attempt": attempt, "u_points": sum(p["n"] for p in params),
                              "u_new_keys": len(keys.difference(known))})


def lock_usage(session: Session, run_id: int) -> None:
    """On PostgreSQL, lock the run's row until commit, so that two batches of one attempt stored at once by
    two processes do not both count a key new to the attempt. On SQLite one writer runs at a time."""
    if session.get_bind().dialect.name == "postgresql":
        session.connection().execute(_LOCK_RUN, {"run_id": run_id})


_LOCK_RUN = select(Run.__table__.c.id).where(Run.__table__.c.id == bindparam("run_id")).with_for_update()


@functools.lru_cache(maxsize=64)
def known_keys_statement(n: int):
    """One row of ``n`` booleans: whether the attempt holds a chunk of key_0 .. key_{n-1}. A lookup in
    ix_metric_chunks_run_id_key per key, however many chunks the attempt holds."""
    chunks = MetricChunk.__table__
    return select(*(
        exists().where(chunks.c.run_id == bindparam("run_id"), chunks.c.attempt == bindparam("attempt"),
                       chunks.c.key == bindparam(f"key_{i}"))
        for i in range(n)
    ))


def known_keys(session: Session, run_id: int, attempt: int, keys: Collection[str]) -> set[str]:
    """Those of ``keys`` the run's attempt holds chunks of."""
    keys = list(dict.fromkeys(keys))
    if not keys:
        return set()
    params = {"run_id": run_id, "attempt": attempt, **{f"key_{i}": k for i, k in enumerate(keys)}}
    row = session.connection().execute(known_keys_statement(len(keys)), params).one()
    return {k for k, held in zip(keys, row) if held}


def batch_exists(session: Session, run_id: int, attempt: int, seq: int) -> bool:
    stmt = select(MetricChunk.id).where(
        MetricChunk.run_id == run_id, MetricChunk.attempt == attempt, MetricChunk.seq == seq
    )
    return session.execute(stmt.limit(1)).first() is not None


def current_usage(session: Session, run_id: int, keys: Collection[str]) -> tuple[int, int, set[str]]:
    """The points and the number of distinct keys stored for the run's current attempt (kept on the run's row),
    and those of ``keys`` it holds. On PostgreSQL the run's row is locked until commit (``lock_usage``)."""
    lock_usage(session, run_id)
    points, n_keys, attempt = session.execute(
        select(Run.stored_points, Run.stored_keys, Run.attempt).where(Run.id == run_id)
    ).one()
    return int(points), int(n_keys), known_keys(session, run_id, attempt, keys)


def delete_other_attempts(session: Session, run_id: int, keep_attempt: int) -> None:
    """Delete the chunks of the run's attempts but ``keep_attempt``, its current one: its usage is unchanged."""
    session.execute(
        delete(MetricChunk).where(MetricChunk.run_id == run_id, MetricChunk.attempt != keep_attempt)
    )


def delete_attempt(session: Session, run_id: int, attempt: int) -> None:
    """Delete the chunks of one attempt of the run. The caller's UPDATE of the run in the same transaction sets
    its usage (a release: none is left of its current attempt)."""
    session.execute(delete(MetricChunk).where(MetricChunk.run_id == run_id, MetricChunk.attempt == attempt))


def metric_keys(session: Session, run_ids: Sequence[int]) -> dict[int, list[str]]:
    if not run_ids:
        return {}
    stmt = (
        select(MetricChunk.run_id, MetricChunk.key)
        .join(Run, (Run.id == MetricChunk.run_id) & (Run.attempt == MetricChunk.attempt))
        .where(MetricChunk.run_id.in_(run_ids))
        .distinct()
    )
    out: dict[int, list[str]] = defaultdict(list)
    for run_id, key in session.execute(stmt):
        out[run_id].append(key)
    return {k: sorted(v) for k, v in out.items()}


def study_metric_keys(session: Session, study_id: int) -> set[str]:
    """Keys logged by the study's completed runs (their current attempts)."""
    stmt = (
        select(MetricChunk.key)
        .join(Run, (Run.id == MetricChunk.run_id) & (Run.attempt == MetricChunk.attempt))
        .where(Run.study_id == study_id, Run.status == RunStatus.completed.value)
        .distinct()
    )
    return set(session.scalars(stmt))


def _assemble(chunks: list[tuple[int, int, np.ndarray, bytes, int]]) -> tuple[np.ndarray, np.ndarray]:
    """One series from its chunks, given as (step_min, chunk id, steps, value bytes, seq), one value per step.

    A step stored more than once (a step logged twice) is read in the order stored (chunk id, then position).
    Values from the MLflow endpoint (seq < 0) at one step are a history, as MLflow keeps them: the step reads
    its latest one (each request's points are stored in timestamp order). Otherwise a repeated step keeps its
    first value, never a later one (the agent stores no second value for a step: it records a conflict)."""
    chunks.sort(key=lambda c: (c[0], c[1]))  # by first step, then the order stored
    steps = np.concatenate([c[2] for c in chunks]).astype(np.int64, copy=False)
    values = np.frombuffer(b"".join(c[3] for c in chunks), dtype=VALUE_DTYPE).astype(np.float64, copy=False)
    if len(steps) > 1 and not np.all(steps[1:] > steps[:-1]):
        chunks.sort(key=lambda c: (c[1], c[0]))
        steps = np.concatenate([c[2] for c in chunks]).astype(np.int64, copy=False)
        values = np.frombuffer(b"".join(c[3] for c in chunks), dtype=VALUE_DTYPE).astype(np.float64, copy=False)
        mlflow = np.concatenate([np.full(len(c[2]), c[4] < 0) for c in chunks])
        stored = np.arange(len(steps), dtype=np.int64)
        # per step, the last of the sort wins: an MLflow value over any other, the latest MLflow value, or else
        # the first value stored
        order = np.lexsort((np.where(mlflow, stored, -stored), mlflow, steps))
        steps, values = steps[order], values[order]
        last = np.append(steps[1:] != steps[:-1], True)
        steps, values = steps[last], values[last]
    return steps, values


def load_series(
    session: Session, run_ids: Sequence[int], keys: Sequence[str] | None = None
) -> dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]:
    """Load whole series of the runs' current attempts: {(run_id, key): (steps, values)}."""
    if not run_ids:
        return {}
    table = MetricChunk.__table__
    runs = Run.__table__
    # No ORDER BY: sorting in SQL would copy every blob through a temporary b-tree; the few
    # chunks of each series are ordered in Python instead.
    stmt = (
        select(table.c.run_id, table.c.key, table.c.id, table.c.step_min, table.c.step_max, table.c.n,
               table.c.steps, table.c["values"], table.c.seq)
        .join(runs, (runs.c.id == table.c.run_id) & (runs.c.attempt == table.c.attempt))
        .where(table.c.run_id.in_(list(run_ids)))
    )
    if keys is not None:
        stmt = stmt.where(table.c.key.in_(list(keys)))
    parts: dict[tuple[int, str], list[tuple[int, int, np.ndarray, bytes, int]]] = defaultdict(list)
    for run_id, key, chunk_id, step_min, step_max, n, steps_b, values_b, seq in session.execute(stmt):
        parts[(run_id, key)].append((step_min, chunk_id, decode_steps(steps_b, step_min, step_max, n), values_b, seq))
    return {rk: _assemble(chunks) for rk, chunks in parts.items()}


def stored_points(session: Session, run_id: int, attempt: int,
                  ranges: dict[str, tuple[int, int]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """What one attempt of a run already holds for each key between the steps (lo, hi) given, one value
    per step as a series reads it (``_assemble``), read from the chunks that overlap that range only (a write
    checks what it would repeat)."""
    if not ranges:
        return {}
    table = MetricChunk.__table__
    overlap = or_(*[(table.c.key == key) & (table.c.step_max >= lo) & (table.c.step_min <= hi)
                    for key, (lo, hi) in ranges.items()])
    stmt = (
        select(table.c.key, table.c.id, table.c.step_min, table.c.step_max, table.c.n, table.c.steps,
               table.c["values"], table.c.seq)
        .where(table.c.run_id == run_id, table.c.attempt == attempt, overlap)
    )
    parts: dict[str, list[tuple[int, int, np.ndarray, bytes, int]]] = defaultdict(list)
    for key, chunk_id, step_min, step_max, n, steps_b, values_b, seq in session.execute(stmt):
        parts[key].append((step_min, chunk_id, decode_steps(steps_b, step_min, step_max, n), values_b, seq))
    return {key: _assemble(chunks) for key, chunks in parts.items()}


def load_series_shared(
    session: Session, run_ids: Sequence[int], keys: Sequence[str]
) -> dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]:
    """``load_series``, read straight into one ``runs × steps`` matrix per key.

    A first query reads the chunks' extents (no blobs); the step grid of a key is the union of
    its evenly spaced chunks' steps, rebuilt from (step_min, step_max, n) once per distinct
    extent. The values are then copied chunk by chunk into a preallocated matrix, so a load
    holds the data once (plus one chunk) instead of per-run arrays, joined chunks and a stack of
    them. A run that logged every step of the grid gets ``(grid, matrix[i])`` — the one grid array
    shared by all runs and a row *view* of the matrix; a run with gaps gets copies of its logged
    steps. Runs with unevenly spaced or overlapping chunks (a step re-logged) go through
    ``load_series`` (sort, one value per step: ``_assemble``). Same result as ``load_series``, bit for bit.
    """
    if not run_ids:
        return {}
    table, runs = MetricChunk.__table__, Run.__table__
    current = (runs.c.id == table.c.run_id) & (runs.c.attempt == table.c.attempt)
    stmt = (
        select(table.c.run_id, table.c.key, table.c.step_min, table.c.step_max, table.c.n,
               func.length(table.c.steps))
        .join(runs, current)
        .where(table.c.run_id.in_(list(run_ids)), table.c.key.in_(list(keys)))
    )
    extents: dict[str, dict[int, list[tuple[int, int, int]]]] = defaultdict(lambda: defaultdict(list))
    slow: dict[str, list[int]] = defaultdict(list)
    for run_id, key, step_min, step_max, n, steps_len in session.execute(stmt):
        if steps_len:  # steps stored explicitly: not rebuilt from the extent
            slow[key].append(run_id)
        extents[key][run_id].append((step_min, step_max, n))
    out: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = {}
    for key, by_run in extents.items():
        fast = []
        for run_id, ext in by_run.items():
            ext.sort()
            if run_id in slow[key] or any(b[0] <= a[1] for a, b in zip(ext, ext[1:])):
                slow[key].append(run_id)
            else:
                fast.append(run_id)
        fast.sort()
        if fast:
            out.update(_load_matrix(session, fast, key, {r: by_run[r] for r in fast}))
        redo = sorted(set(slow[key]))
        if redo:
            out.update(load_series(session, redo, [key]))
    return out


def _load_matrix(session: Session, run_ids: list[int], key: str,
                 extents: dict[int, list[tuple[int, int, int]]]) -> dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]:
    distinct = sorted({e for ext in extents.values() for e in ext})
    grid = np.unique(np.concatenate([decode_steps(b"", lo, hi, n) for lo, hi, n in distinct]))
    row_of = {r: i for i, r in enumerate(run_ids)}
    full = {r: sum(n for _, _, n in extents[r]) == grid.size for r in run_ids}
    matrix = np.empty((len(run_ids), grid.size), dtype=np.float64)
    gaps = {r: np.zeros(grid.size, dtype=bool) for r in run_ids if not full[r]}
    for r in gaps:
        matrix[row_of[r]] = np.nan
    table, runs = MetricChunk.__table__, Run.__table__
    stmt = (
        select(table.c.run_id, table.c.step_min, table.c.step_max, table.c.n, table.c["values"])
        .join(runs, (runs.c.id == table.c.run_id) & (runs.c.attempt == table.c.attempt))
        .where(table.c.run_id.in_(run_ids), table.c.key == key)
    )
    for run_id, step_min, step_max, n, values_b in session.execute(stmt):
        values = np.frombuffer(values_b, dtype=VALUE_DTYPE)
        i0 = int(np.searchsorted(grid, step_min))
        # The chunk's n evenly spaced steps lie in the grid (the union), so when the grid holds
        # exactly n points from step_min to step_max they are those points: a slice.
        if i0 + n <= grid.size and grid[i0 + n - 1] == step_max:
            where: slice | np.ndarray = slice(i0, i0 + n)
        else:
            where = np.searchsorted(grid, decode_steps(b"", step_min, step_max, n))
        matrix[row_of[run_id], where] = values
        if run_id in gaps:
            gaps[run_id][where] = True
    out = {}
    for r in run_ids:
        row = matrix[row_of[r]]
        if full[r]:
            out[(r, key)] = (grid, row)
        else:
            logged = gaps[r]
            out[(r, key)] = (grid[logged], row[logged])
    return out


class GridColumns:
    """One key of runs whose current attempts all logged it in the same evenly spaced chunks (same
    extents, none overlapping): their series share one step grid with no gap, so the ``runs × steps``
    matrix can be read column block by column block (``blocks``) instead of whole."""

    def __init__(self, run_ids: list[int], extents: list[tuple[int, int, int]], chunk_ids: list[dict[int, int]]):
        self.run_ids, self.extents, self._chunk_ids = run_ids, extents, chunk_ids
        self.steps = (np.concatenate([decode_steps(b"", lo, hi, n) for lo, hi, n in extents]) if extents
                      else np.zeros(0, np.int64))
        self.not_finite: set[int] = set()  # the runs ``blocks`` found a NaN or ±Inf in

    def subset(self, run_ids: Sequence[int]) -> GridColumns:
        """The same grid over some of the runs (rows in the order given)."""
        return GridColumns(list(run_ids), self.extents, [{r: ids[r] for r in run_ids} for ids in self._chunk_ids])

    def blocks(self, session: Session, width: int, *,
               spare: queue.SimpleQueue | None = None) -> Iterable[tuple[int, np.ndarray]]:
        """The matrix (rows in ``run_ids`` order) in consecutive blocks of ``width`` columns (the last
        may be narrower), each with its first column and a C-contiguous array of its own, read chunk
        column by chunk column: a value
        is copied once, into its block, and a block is handed out as soon as its columns are read. Arrays
        put back into ``spare`` by the consumer, done with them, are filled again rather than new ones
        allocated (fresh memory costs a page fault per 4 kB). The runs with a value not finite are added
        to ``not_finite`` as they are read."""
        table = MetricChunk.__table__
        row_of = {r: i for i, r in enumerate(self.run_ids)}
        rows, m = len(self.run_ids), self.steps.size
        stmt = select(table.c.run_id, table.c["values"]).where(table.c.id.in_(bindparam("ids", expanding=True)))
        pending: dict[int, np.ndarray] = {}
        start, emitted = 0, 0  # the chunk column's first matrix column; blocks handed out
        for (_, _, n), ids in zip(self.extents, self._chunk_ids):
            parts = []  # (block, its columns, the chunk's values that go there)
            for b in range(start // width, (start + n - 1) // width + 1):
                if b not in pending:
                    pending[b] = _block_array(spare, (rows, min(width, m - b * width)))
                lo, hi = max(start, b * width), min(start + n, (b + 1) * width)
                parts.append((pending[b], slice(lo - b * width, hi - b * width), slice(lo - start, hi - start)))
            for run_id, values_b in session.execute(stmt, {"ids": list(ids.values())}):
                values, row = np.frombuffer(values_b, dtype=VALUE_DTYPE), row_of[run_id]
                if not np.isfinite(values).all():
                    self.not_finite.add(run_id)
                for block, into, take in parts:
                    block[row, into] = values[take]
            start += n
            while emitted in pending and (emitted + 1) * width <= start or start == m and emitted in pending:
                yield emitted * width, pending.pop(emitted)
                emitted += 1


def _block_array(spare: queue.SimpleQueue | None, shape: tuple[int, int]) -> np.ndarray:
    if spare is not None and shape[1] > 0:
        try:
            block = spare.get_nowait()
        except queue.Empty:
            pass
        else:
            if block.shape == shape:
                return block
    return np.empty(shape, VALUE_DTYPE)


def grid_columns(session: Session, run_ids: Sequence[int], key: str) -> GridColumns | None:
    """``GridColumns`` of ``key`` over ``run_ids`` (rows in that order), or None when a run did not log
    it, logged it with explicit or overlapping steps, or in chunks of other extents than the first run's
    (``load_series_shared`` reads those)."""
    table, runs = MetricChunk.__table__, Run.__table__
    stmt = (
        select(table.c.id, table.c.run_id, table.c.step_min, table.c.step_max, table.c.n, func.length(table.c.steps))
        .join(runs, (runs.c.id == table.c.run_id) & (runs.c.attempt == table.c.attempt))
        .where(table.c.run_id.in_(list(run_ids)), table.c.key == key)
    )
    by_run: dict[int, list[tuple[int, int, int, int]]] = defaultdict(list)
    for chunk_id, run_id, step_min, step_max, n, steps_len in session.execute(stmt):
        if steps_len:
            return None
        by_run[run_id].append((step_min, step_max, n, chunk_id))
    if set(by_run) != set(run_ids):
        return None
    extents: list[tuple[int, int, int]] | None = None
    chunk_ids: list[dict[int, int]] = []
    for run_id in run_ids:
        chunks = sorted(by_run[run_id])
        shape = [c[:3] for c in chunks]
        if extents is None:
            if any(b[0] <= a[1] for a, b in zip(shape, shape[1:])):
                return None
            extents, chunk_ids = shape, [{} for _ in shape]
        elif shape != extents:
            return None
        for ids, chunk in zip(chunk_ids, chunks):
            ids[run_id] = chunk[3]
    return GridColumns(list(run_ids), extents or [], chunk_ids)


def runs_with_key(session: Session, run_ids: Sequence[int], key: str) -> set[int]:
    """The runs whose current attempt logged ``key`` (no blob is read)."""
    if not run_ids:
        return set()
    table, runs = MetricChunk.__table__, Run.__table__
    stmt = (
        select(table.c.run_id).distinct()
        .join(runs, (runs.c.id == table.c.run_id) & (runs.c.attempt == table.c.attempt))
        .where(table.c.run_id.in_(list(run_ids)), table.c.key == key)
    )
    return set(session.scalars(stmt))


def load_dtypes(session: Session, run_ids: Sequence[int], keys: Sequence[str] | None = None) -> dict[tuple[int, str], str]:
    """{(run_id, key): dtype} of the series logged in a type other than float64 (current attempts)."""
    if not run_ids:
        return {}
    table, runs = MetricChunk.__table__, Run.__table__
    stmt = (
        select(table.c.run_id, table.c.key, table.c.dtype).distinct()
        .join(runs, (runs.c.id == table.c.run_id) & (runs.c.attempt == table.c.attempt))
        .where(table.c.run_id.in_(list(run_ids)), table.c.dtype.is_not(None))
    )
    if keys is not None:
        stmt = stmt.where(table.c.key.in_(list(keys)))
    return {(run_id, key): dtype for run_id, key, dtype in session.execute(stmt)}


def load_resolutions(session: Session, run_ids: Sequence[int],
                     keys: Sequence[str] | None = None) -> dict[tuple[int, str], float]:
    """{(run_id, key): unit of the last printed digit} of the series parsed from printed text (current
    attempts; the coarsest of its chunks). A series absent here carries binary floats."""
    if not run_ids:
        return {}
    table, runs = MetricChunk.__table__, Run.__table__
    stmt = (
        select(table.c.run_id, table.c.key, func.max(table.c.resolution))
        .join(runs, (runs.c.id == table.c.run_id) & (runs.c.attempt == table.c.attempt))
        .where(table.c.run_id.in_(list(run_ids)), table.c.resolution.is_not(None))
        .group_by(table.c.run_id, table.c.key)
    )
    if keys is not None:
        stmt = stmt.where(table.c.key.in_(list(keys)))
    return {(run_id, key): float(r) for run_id, key, r in session.execute(stmt)}


__all__ = [
    "load_resolutions",
    "load_dtypes",
    "delete_attempt",
    "delete_other_attempts",
    "encode",
    "chunk_rows",
    "packed_chunk_row",
    "insert_chunks",
    "insert_rows",
    "current_usage",
    "known_keys",
    "lock_usage",
    "load_series",
    "load_series_shared",
    "GridColumns",
    "grid_columns",
    "runs_with_key",
    "metric_keys",
    "stored_points",
]
