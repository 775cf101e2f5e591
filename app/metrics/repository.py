"""Columnar storage of metric series: one row per (run, attempt, batch seq, key).

Steps are little-endian int64 and values little-endian float64 bytes, so a series reads
back bitwise (NaN payloads and ±Inf included) and 100 runs × 10^5 steps load with a
handful of rows per run instead of one ORM object per point.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np
from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.models import MetricChunk, Run

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
    if last <= first or (last - first) % (n - 1):
        return False
    stride = (last - first) // (n - 1)
    return bool(np.array_equal(steps, first + stride * np.arange(n, dtype=np.int64)))


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
) -> bool:
    """Store one batch of (key, steps, values[, dtype]); False when this (run, attempt, seq) was
    already stored (a retry). ``dtype``: the type the values were logged in, None for float64."""
    rows = []
    for key, steps, values, *rest in series:
        dtype = rest[0] if rest and rest[0] != "float64" else None
        if len(steps) == 0:
            continue
        steps_b, values_b = encode(steps, values)
        rows.append(
            {
                "run_id": run_id,
                "attempt": attempt,
                "seq": seq,
                "key": key,
                "n": int(len(steps)),
                "step_min": int(steps.min()),
                "step_max": int(steps.max()),
                "steps": steps_b,
                "values": values_b,
                "dtype": dtype,
            }
        )
    if not rows:
        return True
    try:
        with session.begin_nested():
            session.execute(MetricChunk.__table__.insert(), rows)
    except IntegrityError:
        return False
    return True


def delete_other_attempts(session: Session, run_id: int, keep_attempt: int) -> None:
    session.execute(
        delete(MetricChunk).where(MetricChunk.run_id == run_id, MetricChunk.attempt != keep_attempt)
    )


def delete_attempt(session: Session, run_id: int, attempt: int) -> None:
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


def _assemble(chunks: list[tuple[int, int, np.ndarray, bytes]]) -> tuple[np.ndarray, np.ndarray]:
    chunks.sort(key=lambda c: (c[0], c[1]))  # by first step, then batch seq
    steps = np.concatenate([c[2] for c in chunks]).astype(np.int64, copy=False)
    values = np.frombuffer(b"".join(c[3] for c in chunks), dtype=VALUE_DTYPE).astype(np.float64, copy=False)
    if len(steps) > 1 and not np.all(steps[1:] > steps[:-1]):
        # Out of order or repeated steps (e.g. a step logged twice): sort, keep the last write.
        order = np.argsort(steps, kind="stable")
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
        select(table.c.run_id, table.c.key, table.c.seq, table.c.step_min, table.c.step_max, table.c.n,
               table.c.steps, table.c["values"])
        .join(runs, (runs.c.id == table.c.run_id) & (runs.c.attempt == table.c.attempt))
        .where(table.c.run_id.in_(list(run_ids)))
    )
    if keys is not None:
        stmt = stmt.where(table.c.key.in_(list(keys)))
    parts: dict[tuple[int, str], list[tuple[int, int, np.ndarray, bytes]]] = defaultdict(list)
    for run_id, key, seq, step_min, step_max, n, steps_b, values_b in session.execute(stmt):
        parts[(run_id, key)].append((step_min, seq, decode_steps(steps_b, step_min, step_max, n), values_b))
    return {rk: _assemble(chunks) for rk, chunks in parts.items()}


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


__all__ = [
    "load_dtypes",
    "delete_attempt",
    "delete_other_attempts",
    "encode",
    "insert_chunks",
    "load_series",
    "metric_keys",
]
