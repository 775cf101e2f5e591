"""Ingestion benchmark: N concurrent workers push metric batches through the HTTP API.

Real ``steady serve`` subprocesses on SQLite and on PostgreSQL; each client leases its own
run and sends packed batches (the worker's encoding) as fast as the server acknowledges
them. In the same invocation, MLflow's tracking server (its own SQLite backend store,
``MlflowClient.log_batch`` with MLflow's maximum of 1000 metrics per request) is measured on
the same machine as the reference (bench/mlflow_reference.py, run with a Python that has
mlflow installed: --mlflow-python, default $MLFLOW_PYTHON or /tmp/mlflowenv/bin/python).

    .venv/bin/python bench/ingest_bench.py                      # writes bench/results/ingest.json
    .venv/bin/python bench/ingest_bench.py --clients 1,8 --duration 5 --backends sqlite
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
import numpy as np  # noqa: E402

from bench.common import REPO, Server, percentile, postgres_database, run_clients, write_result  # noqa: E402

KEYS = ("loss", "acc", "lr", "grad_norm", "step_time")


def client_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url")
    p.add_argument("--token")
    p.add_argument("--threads", type=int)
    p.add_argument("--duration", type=float)
    p.add_argument("--steps", type=int, help="steps per series per batch")
    p.add_argument("--start-at", type=float)
    a = p.parse_args(argv)
    headers = {"Authorization": f"Bearer {a.token}", "content-type": "application/json"}
    values_b64 = base64.b64encode(np.random.default_rng(0).standard_normal(a.steps).astype("<f8").tobytes()).decode()
    latencies: list[float] = []
    points = [0]
    errors: list[str] = []
    lock = threading.Lock()

    def agent() -> None:
        with httpx.Client(base_url=a.url, headers=headers, timeout=60) as c:
            wid = c.post("/api/v1/workers/register", json={"name": uuid.uuid4().hex, "labels": ["torch"]}).json()["worker_id"]
            lease = c.post(f"/api/v1/workers/{wid}/lease", json={"worker_id": wid}).json()
            run_id, lid = lease["run_id"], lease["lease_id"]
            time.sleep(max(0.0, a.start_at - time.time()))
            end = time.monotonic() + a.duration
            seq, mine, lats = 0, 0, []
            while time.monotonic() < end:
                steps_b64 = base64.b64encode(np.arange(seq * a.steps, (seq + 1) * a.steps, dtype="<i8").tobytes()).decode()
                series = ",".join(f'{{"key":"{k}","steps_b64":"{steps_b64}","values_b64":"{values_b64}"}}' for k in KEYS)
                body = f'{{"lease_id":"{lid}","seq":{seq},"series":[{series}]}}'
                t0 = time.perf_counter()
                r = c.post(f"/api/v1/runs/{run_id}/metrics", content=body)
                lats.append(time.perf_counter() - t0)
                if r.status_code != 200:
                    errors.append(f"{r.status_code} {r.text[:200]}")
                    break
                mine += a.steps * len(KEYS)
                seq += 1
        with lock:
            latencies.extend(lats)
            points[0] += mine

    threads = [threading.Thread(target=agent) for _ in range(a.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"latencies": latencies, "points": points[0], "errors": errors[:5]}))


def measure_steady(server: Server, clients: int, duration: float, steps: int) -> dict:
    server.create_study(clients)
    n_procs = min(clients, 4)
    per = [clients // n_procs + (1 if i < clients % n_procs else 0) for i in range(n_procs)]
    start_at = time.time() + 3 + clients * 0.05
    args = [["--url", server.url, "--token", server.tokens["worker"], "--threads", str(t), "--duration", str(duration),
             "--steps", str(steps), "--start-at", str(start_at)] for t in per]
    out = run_clients(Path(__file__), n_procs, args, timeout=duration + 120)
    lat = [x for o in out for x in o["latencies"]]
    errors = [e for o in out for e in o["errors"]]
    pts = sum(o["points"] for o in out)
    return {
        "clients": clients, "points_per_batch": steps * len(KEYS), "batches": len(lat), "points": pts,
        "points_per_s": round(pts / duration), "batch_p50_ms": round(1000 * percentile(lat, 50), 2),
        "batch_p99_ms": round(1000 * percentile(lat, 99), 2), "errors": errors,
    }


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_client":
        client_main(sys.argv[2:])
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", default="sqlite,postgres")
    p.add_argument("--clients", default="1,8,32")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of sending per measurement")
    p.add_argument("--steps", type=int, default=4000, help="steps per series per batch (5 series per batch)")
    p.add_argument("--api-workers", type=int, default=2, help="steady serve --workers")
    p.add_argument("--mlflow-python", default=os.environ.get("MLFLOW_PYTHON", "/tmp/mlflowenv/bin/python"))
    p.add_argument("--mlflow-clients", default="1,8")
    p.add_argument("--out", default="ingest")
    a = p.parse_args()
    clients = [int(x) for x in a.clients.split(",")]
    results: dict = {"steady": {}, "settings": vars(a)}
    for backend in a.backends.split(","):
        rows = []
        with tempfile.TemporaryDirectory() as tmp:
            if backend == "sqlite":
                ctx = None
                url = f"sqlite:///{tmp}/steady.db"
            else:
                ctx = postgres_database()
                url = ctx.__enter__()
            try:
                with Server(url, Path(tmp) / "srv", workers=a.api_workers, lease_seconds=600) as server:
                    for n in clients:
                        row = measure_steady(server, n, a.duration, a.steps)
                        print(f"steady {backend:8} clients={n:3} {row['points_per_s']:>12,} points/s  "
                              f"p50 {row['batch_p50_ms']} ms  p99 {row['batch_p99_ms']} ms  errors {len(row['errors'])}", flush=True)
                        rows.append(row)
            finally:
                if ctx is not None:
                    ctx.__exit__(None, None, None)
        results["steady"][backend] = rows
    if a.mlflow_python and Path(a.mlflow_python).exists():
        out = subprocess.run([a.mlflow_python, str(REPO / "bench" / "mlflow_reference.py"), "--clients", a.mlflow_clients,
                              "--duration", str(a.duration)], capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            print(out.stderr[-3000:], file=sys.stderr)
            results["mlflow"] = {"error": out.stderr[-2000:]}
        else:
            results["mlflow"] = json.loads(out.stdout.strip().splitlines()[-1])
            for row in results["mlflow"]["rows"]:
                print(f"mlflow   sqlite   clients={row['clients']:3} {row['points_per_s']:>12,} points/s  "
                      f"p50 {row['batch_p50_ms']} ms  p99 {row['batch_p99_ms']} ms", flush=True)
    else:
        results["mlflow"] = {"error": f"no mlflow python at {a.mlflow_python} (see docs/deploy.md, Benchmarks)"}
    if "rows" in results["mlflow"]:
        best_mlflow = max(r["points_per_s"] for r in results["mlflow"]["rows"])
        best = {b: max(r["points_per_s"] for r in rows) for b, rows in results["steady"].items()}
        results["ratio_vs_mlflow"] = {b: round(v / best_mlflow, 1) for b, v in best.items()}
        results["target_ratio"] = 100
        print(f"ratio (best Steady / best MLflow points/s): {results['ratio_vs_mlflow']}  target >= 100", flush=True)
    path = write_result(a.out, results)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
