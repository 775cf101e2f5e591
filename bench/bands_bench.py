"""Benchmark: seed bands of 100 runs × 100,000 steps, loaded from the database.

Steady's path: columnar chunks (``steady.server.metrics.repository.load_series``) → one
runs × steps matrix → ``steady.server.stats.report.compute_bands``. The naive baseline, measured in
the same run on the same data: one row per point (run, step, value), loaded row by row per
run, then the same band computation. Writes ``bench/results/bands.json``.

    .venv/bin/python bench/bands_bench.py [--runs 100] [--steps 100000] [--database-url URL]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from sqlalchemy import text

from steady.server.kit import migrate
from steady.server.kit.db import Database
from steady.server.metrics import repository as metrics_repo
from steady.server.models import Run, Study, utcnow
from steady.server.stats.report import RunData, compute_bands

CHUNK = 10_000  # points per stored batch, as a worker streams them


def populate(db: Database, runs: int, steps: int, rng: np.random.Generator) -> list[int]:
    with db.write() as s:
        study = Study(name="bench", kind="external", status="open", spec={"metrics": [{"name": "loss"}]})
        s.add(study)
        s.flush()
        ids = []
        for i in range(runs):
            run = Run(study_id=study.id, seed=i, repeat=0, determinism="seeded", stack="default",
                      framework="torch", required_labels=[], status="completed", attempt=1, max_attempts=1,
                      fingerprint={}, digests={}, determinism_applied={}, timings={}, final_metrics={},
                      created_at=utcnow())
            s.add(run)
            s.flush()
            ids.append(run.id)
        s.execute(text("CREATE TABLE IF NOT EXISTS naive_points (run_id INTEGER, step BIGINT, value DOUBLE PRECISION)"))
    x = np.arange(steps, dtype=np.int64)
    all_values = {}
    for run_id in ids:
        values = all_values[run_id] = np.exp(-x / (steps / 5)) + rng.normal(0, 0.01, steps)
        with db.write() as s:
            for seq, start in enumerate(range(0, steps, CHUNK)):
                sl = slice(start, start + CHUNK)
                metrics_repo.insert_chunks(s, run_id, 1, seq, [("loss", x[sl], values[sl])])
    for run_id, values in all_values.items():
        with db.write() as s:
            s.execute(text("INSERT INTO naive_points (run_id, step, value) VALUES (:r, :s, :v)"),
                      [{"r": run_id, "s": int(a), "v": float(b)} for a, b in zip(x, values)])
    with db.write() as s:
        s.execute(text("CREATE INDEX IF NOT EXISTS ix_naive_points_run ON naive_points (run_id, step)"))
    return ids


def steady_path(db: Database, ids: list[int]) -> tuple:
    with db.read() as s:
        series = metrics_repo.load_series(s, ids, ["loss"])
    data = [RunData(run_id=i, seed=i, repeat=0, determinism="seeded", stack="default",
                    series={"loss": series[(i, "loss")]}) for i in ids]
    return compute_bands(data, metric="loss")


def naive_path(db: Database, ids: list[int]) -> tuple:
    data = []
    with db.read() as s:
        for i in ids:
            steps, values = [], []
            for step, value in s.execute(text("SELECT step, value FROM naive_points WHERE run_id = :r ORDER BY step"),
                                         {"r": i}):
                steps.append(step)
                values.append(value)
            data.append(RunData(run_id=i, seed=i, repeat=0, determinism="seeded", stack="default",
                                series={"loss": (np.array(steps, dtype=np.int64), np.array(values))}))
    return compute_bands(data, metric="loss")


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--database-url", default="")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default="bench/results/bands.json")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="steady-bench-")
    url = args.database_url or f"sqlite:///{tmp}/bench.db"
    db = Database(url)
    migrate.upgrade(db.engine)
    t0 = time.perf_counter()
    ids = populate(db, args.runs, args.steps, np.random.default_rng(0))
    populate_s = time.perf_counter() - t0
    ours = timed(lambda: steady_path(db, ids), args.repeat)
    naive = timed(lambda: naive_path(db, ids), max(1, args.repeat - 2))
    a, b = steady_path(db, ids)[0].band, naive_path(db, ids)[0].band
    assert np.array_equal(a.mean, b.mean, equal_nan=True), "the two paths must agree"
    result = {
        "benchmark": "bands of runs × steps from the database",
        "runs": args.runs, "steps": args.steps, "backend": db.engine.dialect.name,
        "steady_s": ours, "naive_s": naive,
        "steady_median_s": statistics.median(ours), "naive_median_s": statistics.median(naive),
        "speedup": statistics.median(naive) / statistics.median(ours),
        "populate_s": populate_s, "machine": platform.platform(), "python": platform.python_version(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"bands of {args.runs} runs × {args.steps} steps on {result['backend']}: "
          f"steady {result['steady_median_s']:.3f} s, naive row-by-row {result['naive_median_s']:.3f} s, "
          f"speedup ×{result['speedup']:.1f}  → {args.out}")
    db.dispose()


if __name__ == "__main__":
    main()
