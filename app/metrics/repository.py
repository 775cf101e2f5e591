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
    return np.ascontiguousarray(steps, STEP_DTYPE).tobytes(), np.ascontiguousarray(values, VALUE_DTYPE).tobytes()


def batch_exists(session: Session, run_id: int, attempt: int, seq: int) -> bool:
    stmt = select(MetricChunk.id).where(
        MetricChunk.run_id == run_id, MetricChunk.attempt == attempt, MetricChunk.seq == seq
    )
    return session.execute(stmt.limit(1)).first() is not None


def insert_chunks(
    session: Session,
    run_id: int,
    attempt: int,
    seq: int,
    series: Iterable[tuple[str, np.ndarray, np.ndarray]],
) -> bool:
    """Store one batch; False when this (run, attempt, seq) was already stored (a retry)."""
    rows = []
    for key, steps, values in series:
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


def _assemble(step_parts: list[bytes], value_parts: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    steps = np.frombuffer(b"".join(step_parts), dtype=STEP_DTYPE).astype(np.int64, copy=False)
    values = np.frombuffer(b"".join(value_parts), dtype=VALUE_DTYPE).astype(np.float64, copy=False)
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
    stmt = (
        select(table.c.run_id, table.c.key, table.c.steps, table.c["values"])
        .join(runs, (runs.c.id == table.c.run_id) & (runs.c.attempt == table.c.attempt))
        .where(table.c.run_id.in_(list(run_ids)))
        .order_by(table.c.run_id, table.c.key, table.c.step_min, table.c.seq)
    )
    if keys is not None:
        stmt = stmt.where(table.c.key.in_(list(keys)))
    parts: dict[tuple[int, str], tuple[list[bytes], list[bytes]]] = defaultdict(lambda: ([], []))
    for run_id, key, steps_b, values_b in session.execute(stmt):
        s, v = parts[(run_id, key)]
        s.append(bytes(steps_b))
        v.append(bytes(values_b))
    return {rk: _assemble(s, v) for rk, (s, v) in parts.items()}


__all__ = [
    "batch_exists",
    "delete_attempt",
    "delete_other_attempts",
    "encode",
    "insert_chunks",
    "load_series",
    "metric_keys",
]
