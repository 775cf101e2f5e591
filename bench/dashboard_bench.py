"""Dashboard benchmark: a study of 100 runs × 100,000 steps, its chart payload and first render.

Builds the study in a temporary SQLite database (series written with
``steady.server.metrics.repository.insert_chunks`` directly), starts ``steady serve`` on it, and measures

* the chart payload the study page fetches (bands + run lines of one group, decimated to
  ``max_points``): raw and gzip bytes, and server time cold and cached;
* the time to first render of ``/studies/{id}`` in headless Chromium: from navigation until the
  band chart is drawn (``main[data-charts-ready=true]``), cold (report not cached) and warm.

Writes ``bench/results/dashboard.json``. Run: ``.venv/bin/python bench/dashboard_bench.py``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from steady.server.web.devserver import ServerProcess, free_port, serve_argv  # noqa: E402

CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def build_study(url: str, *, seeds: int, repeats: int, steps: int, chunk: int) -> tuple[int, float]:
    from steady.server.kit import migrate
    from steady.server.kit.config import Settings
    from steady.server.kit.db import Database
    from steady.server.metrics.repository import insert_chunks
    from steady.server.models import Run, utcnow
    from steady.server.studies.schemas import StudySpec
    from steady.server.studies.service import create_study

    db = Database(url)
    migrate.upgrade(db.engine)
    rng = np.random.default_rng(20240601)
    started = time.perf_counter()
    with db.write() as session:
        spec = StudySpec(name="bench: 100 runs × 100k steps", kind="external",
                         metrics=[{"name": "loss", "max_std": 0.05}])
        study = create_study(session, spec, Settings(database_url=url))
        study_id = study.id
    x = np.arange(steps, dtype=np.int64)
    base = np.exp(-x / (steps / 6))
    for seed in range(seeds):
        seed_curve = base + 0.02 * np.sin(x / 900 + seed) * np.exp(-x / steps) + 0.002 * seed
        for rep in range(repeats):
            values = seed_curve + rng.normal(0, 1e-3, steps)  # repeats differ: nondeterministic kernels
            with db.write() as session:
                now = utcnow()
                run = Run(study_id=study_id, seed=seed, repeat=rep, determinism="seeded", stack="a100-cu121",
                          framework="external", required_labels=[], status="completed", attempt=1, max_attempts=1,
                          fingerprint={"name": "a100-cu121"}, digests={"initial_weights": f"{seed:064x}"},
                          final_metrics={"loss": float(values[-1])}, started_at=now, finished_at=now)
                session.add(run)
                session.flush()
                for seq, lo in enumerate(range(0, steps, chunk)):
                    hi = min(steps, lo + chunk)
                    series = [("loss", x[lo:hi], values[lo:hi])]
                    if seq == 0:
                        series.append(("step_time", np.arange(1000), 0.05 + rng.gamma(20, 0.0005, 1000)))
                    insert_chunks(session, run.id, 1, seq, series)
    elapsed = time.perf_counter() - started
    db.dispose()
    return study_id, elapsed


def start_server(port: int, env: dict, log_path: Path) -> ServerProcess:
    """A `steady serve` process, returned once /healthz answers (ServerStartError with its log after 60 s)."""
    return ServerProcess(serve_argv(port), url=f"http://127.0.0.1:{port}", log_path=log_path, env=env,
                         cwd=REPO, stop_timeout=30).start()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--max-points", type=int, default=1000)
    parser.add_argument("--max-lines", type=int, default=40)
    parser.add_argument("--chromium", default=os.environ.get("STEADY_TEST_CHROMIUM", "/usr/bin/chromium"))
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "dashboard.json")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="steady-dash-bench-"))
    url = f"sqlite:///{tmp / 'steady.db'}"
    print(f"building {args.seeds * args.repeats} runs × {args.steps} steps in {tmp} …", flush=True)
    study_id, build_s = build_study(url, seeds=args.seeds, repeats=args.repeats, steps=args.steps, chunk=10_000)
    db_mb = sum(p.stat().st_size for p in tmp.glob("steady.db*")) / 1e6
    print(f"  built in {build_s:.1f} s; database {db_mb:.0f} MB (with its WAL)", flush=True)

    env = {k: v for k, v in os.environ.items() if not k.startswith("STEADY_")}
    env.update(STEADY_DATA_DIR=str(tmp), STEADY_DATABASE_URL=url)
    token = subprocess.run([sys.executable, "-m", "steady.server.cli", "token", "create", "--role", "user", "--quiet"],
                           env=env, cwd=REPO, capture_output=True, text=True, check=True).stdout.split()[-1]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp / "server.log"
    server = start_server(port, env, log)
    results: dict = {}
    try:
        headers = {"Authorization": f"Bearer {token}"}
        params = {"metric": "loss", "determinism": "seeded", "stack": "a100-cu121", "max_points": args.max_points,
                  "max_lines": args.max_lines}
        chart_url = f"{base}/dashboard/data/studies/{study_id}/chart"
        with httpx.Client(headers=headers, timeout=600) as client:
            t0 = time.perf_counter()
            raw = client.get(chart_url, params=params, headers={"Accept-Encoding": "identity"})
            chart_cold = time.perf_counter() - t0
            raw.raise_for_status()
            t0 = time.perf_counter()
            zipped = client.get(chart_url, params=params, headers={"Accept-Encoding": "gzip"})
            chart_warm = time.perf_counter() - t0
            payload = raw.json()
            t0 = time.perf_counter()
            bands = client.get(f"{base}/api/v1/studies/{study_id}/bands",
                               params={"metric": "loss", "max_points": 2000})
            bands_s = time.perf_counter() - t0
            bands.raise_for_status()
        results["chart_payload"] = {
            "bytes": len(raw.content),
            "gzip_bytes": len(gzip.compress(raw.content, 5)),
            "gzip_bytes_on_wire": int(zipped.headers.get("content-length", 0)) or None,
            "points_per_series": payload["points"],
            "total_steps": payload["total_steps"],
            "series": len(payload["y"]) + (len(payload["series"]) if payload["series"] else 0),
            "run_lines": payload["n_lines"],
            "runs_in_group": payload["n_runs"],
            "server_s_cold": round(chart_cold, 3),
            "server_s_cached": round(chart_warm, 3),
        }
        results["api_bands_max_points_2000"] = {"bytes": len(bands.content), "server_s": round(bands_s, 3)}
        print(f"  chart payload {len(raw.content) / 1e3:.0f} kB ({results['chart_payload']['gzip_bytes'] / 1e3:.0f} kB"
              f" gzip), {payload['points']} points × {results['chart_payload']['series']} series; "
              f"cold {chart_cold:.2f} s, cached {chart_warm:.3f} s", flush=True)

        # First render in Chromium: a fresh server process, so the report is not cached.
        server.stop()
        server = start_server(port, env, log)
        from playwright.sync_api import sync_playwright

        renders = []
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS, headless=True)
            context = browser.new_context(viewport={"width": 1280, "height": 720})
            context.add_cookies([{"name": "steady_session", "value": token, "url": base}])
            page = context.new_page()
            page.set_default_timeout(600_000)
            for label in ("cold", "warm"):
                t0 = time.perf_counter()
                page.goto(f"{base}/studies/{study_id}", wait_until="domcontentloaded")
                html_s = time.perf_counter() - t0
                page.wait_for_selector("main[data-charts-ready='true'] figure[data-metric] canvas")
                total_s = time.perf_counter() - t0
                nav = page.evaluate("() => { const n = performance.getEntriesByType('navigation')[0];"
                                    " return {ttfb_ms: n.responseStart - n.requestStart, dom_ms: n.domContentLoadedEventEnd}; }")
                renders.append({"load": label, "html_s": round(html_s, 3), "chart_drawn_s": round(total_s, 3),
                                "ttfb_ms": round(nav["ttfb_ms"], 1)})
                print(f"  first render ({label}): page {html_s:.2f} s, chart drawn {total_s:.2f} s", flush=True)
            shots = REPO / "artifacts" / "screenshots"
            shots.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shots / "bench-study-100x100k.png"))
            browser.close()
        results["first_render"] = renders
    finally:
        server.stop()

    results["study"] = {"runs": args.seeds * args.repeats, "seeds": args.seeds, "repeats": args.repeats,
                        "steps": args.steps, "build_s": round(build_s, 1),
                        "db_mb": round(sum(p.stat().st_size for p in tmp.glob("steady.db*")) / 1e6, 1)}
    results["settings"] = {"max_points": args.max_points, "max_lines": args.max_lines}
    results["machine"] = {"python": platform.python_version(), "platform": platform.platform(),
                          "cpus": os.cpu_count()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
