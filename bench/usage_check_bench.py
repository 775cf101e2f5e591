"""The cost of a metric batch's limits check as a run grows, in process.

``runs_repo.batch_context`` (the lease, the run's stored usage, the batch's keys and seq) is timed on one run
holding 500, 2,000 and 8,000 stored batches of 5,000 points (5 keys × 1,000 steps), median of 200 checks,
on SQLite and PostgreSQL; each figure also as a ratio to the check at 500 batches in the same run (flat: 1).
Every stored batch adds to the run's row (runs.stored_points), so on PostgreSQL the row has a new version per
batch until VACUUM (autovacuum, on a live server) clears the old ones: PostgreSQL is measured as the row is,
then again right after ``VACUUM runs``.

    .venv/bin/python bench/usage_check_bench.py             # writes bench/results/usage_check.json
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
from sqlalchemy import text

from bench.common import postgres_database, write_result
from steady.server.kit import migrate
from steady.server.kit.db import Database
from steady.server.metrics import repository as metrics_repo
from steady.server.models import Run, Study, utcnow
from steady.server.runs import repository as runs_repo

KEYS = ["loss", "acc", "lr", "grad_norm", "step_time"]
SIZES = (500, 2000, 8000)


def _one_run(db: Database) -> int:
    with db.write() as s:
        study = Study(name="bench", kind="external", status="open", spec={})
        s.add(study)
        s.flush()
        run = Run(study_id=study.id, seed=0, repeat=0, determinism="seeded", stack="x", framework="torch",
                  required_labels=[], status="running", attempt=1, max_attempts=1, fingerprint={}, digests={},
                  determinism_applied={}, timings={}, final_metrics={}, created_at=utcnow())
        s.add(run)
        s.flush()
        return run.id


def _median_check_ms(db: Database, run_id: int, stored: int) -> float:
    times = []
    with db.write() as s:
        for i in range(200):
            t = time.perf_counter()
            runs_repo.batch_context(s, run_id, stored + i, KEYS)
            times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def measure(url: str) -> dict:
    db = Database(url)
    try:
        migrate.upgrade(db.engine)
        run_id = _one_run(db)
        steps = np.arange(1000)
        rows = metrics_repo.chunk_rows([(k, steps, steps * 0.5) for k in KEYS])
        stored, out = 0, {}
        for target in SIZES:
            while stored < target:  # a transaction per batch, as the server's commits of a lone agent
                with db.write() as s:
                    ctx = runs_repo.batch_context(s, run_id, stored, KEYS)
                    metrics_repo.insert_rows(s, run_id, 1, stored, rows, savepoint=False, known=ctx.known)
                stored += 1
            out[target] = _median_check_ms(db, run_id, stored)
            if db.engine.dialect.name == "postgresql":
                with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
                    c.execute(text("VACUUM runs"))
                out[f"{target} (then VACUUM runs)"] = _median_check_ms(db, run_id, stored)
        return out
    finally:
        db.dispose()


def main() -> None:
    results = {"sqlite": measure(f"sqlite:///{tempfile.mkdtemp()}/usage.db")}
    with postgres_database() as url:
        results["postgresql"] = measure(url)
    for backend, ms in results.items():
        print(backend + ": " + ", ".join(f"{n} stored batches {v:.3f} ms (×{v / ms[SIZES[0]]:.2f})" for n, v in ms.items()))
    print(write_result("usage_check", {"median_ms": results}))


if __name__ == "__main__":
    main()
