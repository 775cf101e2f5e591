"""Benchmark: freezing a suite baseline (canonical JSON + SHA-256 + zlib) and reading it back.

A baseline study of ``--runs`` runs × ``--steps`` steps of one metric is stored as a worker
streams it (columnar chunks); then we time ``record_snapshot`` (what ``PUT /suites/{s}/baseline``
adds), the snapshot's stored size, and the runs an alert rule reads: from the snapshot (cold,
then decoded-and-kept) against the live rows. Writes ``bench/results/baseline_snapshot.json``.

    .venv/bin/python bench/baseline_snapshot_bench.py [--runs 20] [--steps 10000] [--database-url URL]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from steady.server.kit import migrate
from steady.server.alerts import baselines
from steady.server.kit.db import Database
from steady.server.models import BaselineSnapshot, Study, SuiteBaseline
from bench.bands_bench import populate
from bench.common import RESULTS, machine


class _Caller:
    token_id = None
    name = "bench"


def _timed(fn, repeat: int = 3) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--database-url", default="")
    args = parser.parse_args()
    url = args.database_url or f"sqlite:///{tempfile.mkdtemp(prefix='steady-bench-')}/bench.db"
    db = Database(url)
    migrate.upgrade(db.engine)
    populate(db, args.runs, args.steps, np.random.default_rng(0))
    with db.read() as s:
        study_id = s.query(Study).one().id

    def snapshot() -> tuple[int, int, str]:
        with db.write() as s:
            snap = baselines.record_snapshot(s, "bench", s.get(Study, study_id), None, _Caller(), "bench")
            s.add(SuiteBaseline(suite=f"bench-{snap.version}", study_id=study_id, snapshot_id=snap.id))
            return snap.id, len(snap.body), snap.digest

    set_s, (snap_id, size, digest) = _timed(snapshot)
    with db.read() as s:
        base = s.get(SuiteBaseline, "bench-1")
        baselines._DECODED.clear()
        t0 = time.perf_counter()
        cold = baselines.baseline_runs(s, base, "loss")
        cold_s = time.perf_counter() - t0
        warm_s, _ = _timed(lambda: baselines.baseline_runs(s, base, "loss"))
        base.snapshot_id = None  # the pre-snapshot path: live rows
        live_s, live = _timed(lambda: baselines.baseline_runs(s, base, "loss"))
        s.rollback()
        raw = len(baselines.canonical(baselines.document(s.get(BaselineSnapshot, snap_id))))
    assert [r.series["loss"][1].tobytes() for r in cold] == [r.series["loss"][1].tobytes() for r in live]
    result = {"runs": args.runs, "steps": args.steps, "points": args.runs * args.steps,
              "backend": db.engine.url.get_backend_name(), "set_baseline_seconds": round(set_s, 4),
              "canonical_json_bytes": raw, "stored_bytes": size, "digest": digest,
              "read_snapshot_cold_seconds": round(cold_s, 4), "read_snapshot_kept_seconds": round(warm_s, 6),
              "read_live_rows_seconds": round(live_s, 4), "machine": machine()}
    print(json.dumps(result, indent=2))
    RESULTS.mkdir(parents=True, exist_ok=True)
    Path(RESULTS / "baseline_snapshot.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
