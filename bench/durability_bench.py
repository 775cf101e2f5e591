"""Benchmark: the cost of acknowledging only durable metric batches on SQLite.

Ingests the same metric batches, one write transaction per batch as the API does, into a
fresh SQLite database in WAL mode with ``PRAGMA synchronous=FULL`` (every commit fsyncs the
WAL: an acknowledged batch survives power loss) and with ``synchronous=NORMAL`` (the WAL is
fsynced only at checkpoints: an acknowledged batch survives a process crash but the last
commits may be lost on power loss or a kernel panic). Both modes are measured in the same
run, interleaved, on the same disk; the ratio is the price of durability. Writes
``bench/results/durability.json``.

    .venv/bin/python bench/durability_bench.py [--batches 400] [--points 1000] [--keys 4] [--dir PATH]
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

from steady.server.kit import migrate
from steady.server.kit.db import Database
from steady.server.metrics import repository as metrics_repo
from steady.server.models import Run, Study


def _fresh(directory: Path, name: str, round_: int) -> tuple[Database, int]:
    mode = name.rsplit("-", 1)[1]
    db = Database(f"sqlite:///{directory / f'{name.lower()}-{round_}.db'}", sqlite_synchronous=mode)
    migrate.upgrade(db.engine)
    with db.write() as s:
        study = Study(name="bench", kind="external", status="open", spec={"metrics": [{"name": "loss"}]})
        s.add(study)
        s.flush()
        run = Run(study_id=study.id, seed=0, repeat=0, determinism="seeded", stack="default",
                  framework="torch", status="running", attempt=1)
        s.add(run)
        s.flush()
        run_id = run.id
    return db, run_id


def ingest(db: Database, run_id: int, batches: int, points: int, keys: int, rng: np.random.Generator) -> float:
    """Seconds to ingest ``batches`` batches of ``keys`` series × ``points`` points, one commit each."""
    data = [
        [(f"k{k}", np.arange(b * points, (b + 1) * points, dtype=np.int64), rng.standard_normal(points))
         for k in range(keys)]
        for b in range(batches)
    ]
    start = time.perf_counter()
    for seq, arrays in enumerate(data):
        with db.write() as s:
            metrics_repo.insert_chunks(s, run_id, 1, seq, arrays)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--points", type=int, default=1000, help="points per series per batch")
    parser.add_argument("--keys", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="directory on the disk to measure (default: a temp dir)")
    parser.add_argument("--out", default="bench/results/durability.json")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    # The batch the agent sends (its default flush of up to a few thousand points) and a
    # one-point batch, where the fixed cost of a commit dominates.
    shapes = {"agent_batch": (args.keys, args.points), "one_point_batch": (1, 1)}
    cases = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for name, (keys, points) in shapes.items():
            times: dict[str, list[float]] = {"FULL": [], "NORMAL": []}
            for round_ in range(args.rounds):  # interleaved, so drift of the machine hits both modes
                for mode in ("NORMAL", "FULL") if round_ % 2 else ("FULL", "NORMAL"):
                    db, run_id = _fresh(Path(tmp), f"{name}-{mode}", round_)
                    times[mode].append(ingest(db, run_id, args.batches, points, keys, rng))
                    db.engine.dispose()
            per_batch = {m: statistics.median(t) / args.batches for m, t in times.items()}
            cases[name] = {
                "points_per_batch": points * keys,
                "seconds": times,
                "median_ms_per_batch": {m: round(v * 1000, 3) for m, v in per_batch.items()},
                "batches_per_s": {m: round(1 / v, 1) for m, v in per_batch.items()},
                "points_per_s": {m: round(points * keys / v) for m, v in per_batch.items()},
                "full_over_normal_time_ratio": round(per_batch["FULL"] / per_batch["NORMAL"], 2),
            }
    result = {
        "benchmark": "SQLite ingestion, one commit per metric batch: synchronous=FULL vs NORMAL (WAL)",
        "batches": args.batches,
        "rounds": args.rounds,
        "cases": cases,
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "filesystem_dir": args.dir or tempfile.gettempdir()},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for name, case in cases.items():
        print(name, json.dumps({k: case[k] for k in ("median_ms_per_batch", "points_per_s", "full_over_normal_time_ratio")}))


if __name__ == "__main__":
    main()
