"""Report cache benchmark: a cold dashboard of a 100 runs × 100,000 steps study, with and without
the report computed in the background.

Builds the study (as ``bench/dashboard_bench.py`` does) in a temporary SQLite database, then
measures, each time on a fresh ``steady serve`` process (so no per-process cache helps):

* cache off (``STEADY_REPORT_CACHE_INTERVAL_SECONDS=0``): the study page and the report API,
  each computing the report from every series;

(each fresh process first serves the workers page, which reads no report, so that imports and
template compilation are not counted as the report's);
* cache on: the time the background task took to compute and store the report (waited for,
  not slept for), then, on another fresh process, the study page and the report API served
  from the stored report.

Writes ``bench/results/report_cache.json`` with the times and the speedups measured in this run.

    .venv/bin/python bench/report_cache_bench.py [--seeds 50 --repeats 2 --steps 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import write_result  # noqa: E402
from steady.server.web.devserver import free_port  # noqa: E402
from bench.dashboard_bench import build_study, start_server  # noqa: E402


def _timed_get(client: httpx.Client, url: str) -> float:
    t0 = time.perf_counter()
    r = client.get(url)
    elapsed = time.perf_counter() - t0
    r.raise_for_status()
    return elapsed


def _serve_and_measure(env: dict, log: Path, token: str, study_id: int) -> dict:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_server(port, env, log)
    try:
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=600) as c:
            # Warm the process (imports, templates) on a page that reads no report, so the timed
            # requests measure the report, not the process start.
            warm = _timed_get(c, f"{base}/workers")
            page = _timed_get(c, f"{base}/studies/{study_id}")
            api = _timed_get(c, f"{base}/api/v1/studies/{study_id}/report")
            report_bytes = len(c.get(f"{base}/api/v1/studies/{study_id}/report").content)
        return {"study_page_s": round(page, 4), "report_api_s": round(api, 4), "report_bytes": report_bytes,
                "warm_up_page_s": round(warm, 4)}
    finally:
        server.stop()


def _cached_row(url: str, study_id: int) -> dict | None:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.connect() as conn:
        row = conn.execute(text("SELECT compute_seconds, length(body) FROM study_reports WHERE study_id = :s"
                                " AND body IS NOT NULL"), {"s": study_id}).first()
    engine.dispose()
    return None if row is None else {"compute_seconds": round(row[0], 3), "stored_bytes": row[1]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=50)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--out", default="report_cache")
    a = p.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="steady-report-cache-bench-"))
    url = f"sqlite:///{tmp / 'steady.db'}"
    print(f"building {a.seeds * a.repeats} runs × {a.steps} steps in {tmp} …", flush=True)
    study_id, build_s = build_study(url, seeds=a.seeds, repeats=a.repeats, steps=a.steps, chunk=10_000)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEADY_")}
    env.update(STEADY_DATA_DIR=str(tmp), STEADY_DATABASE_URL=url)
    token = subprocess.run([sys.executable, "-m", "steady.server.cli", "token", "create", "--role", "user", "--quiet"],
                           env=env, cwd=REPO, capture_output=True, text=True, check=True).stdout.split()[-1]
    log = tmp / "server.log"

    uncached = _serve_and_measure({**env, "STEADY_REPORT_CACHE_INTERVAL_SECONDS": "0"}, log, token, study_id)
    print(f"  cache off: study page {uncached['study_page_s']:.2f} s, report API {uncached['report_api_s']:.2f} s",
          flush=True)

    # Cache on: a server process computes the report in the background; wait until it is stored.
    port = free_port()
    server = start_server(port, {**env, "STEADY_REPORT_CACHE_INTERVAL_SECONDS": "0.5"}, log)
    t0 = time.perf_counter()
    try:
        deadline = time.monotonic() + 600
        row = None
        while row is None and time.monotonic() < deadline:
            row = _cached_row(url, study_id)
            if row is None:
                time.sleep(0.2)  # polling a condition: the stored report
        if row is None:
            raise RuntimeError("the background task did not cache the report within 600 s")
    finally:
        server.stop()
    row["stored_after_s"] = round(time.perf_counter() - t0, 2)
    cached = _serve_and_measure({**env, "STEADY_REPORT_CACHE_INTERVAL_SECONDS": "0.5"}, log, token, study_id)
    print(f"  cache on: computed in the background in {row['compute_seconds']:.2f} s; cold study page "
          f"{cached['study_page_s']:.3f} s, report API {cached['report_api_s']:.3f} s", flush=True)

    result = {
        "study": {"runs": a.seeds * a.repeats, "steps": a.steps, "build_s": round(build_s, 1), "backend": "sqlite"},
        "cache_off": uncached,
        "background": row,
        "cache_on": cached,
        "speedup_study_page": round(uncached["study_page_s"] / cached["study_page_s"], 1),
        "speedup_report_api": round(uncached["report_api_s"] / cached["report_api_s"], 1),
        "note": "each measurement is the first request for the study to a fresh server process, after a warm-up "
                "request for the workers page (imports, templates)",
    }
    print(json.dumps(result, indent=2))
    print(f"wrote {write_result(a.out, result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
