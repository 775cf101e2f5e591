"""MLflow's tracking server on this machine, as the reference for bench/ingest_bench.py.

Runs with a Python that has mlflow installed (not a Steady dependency):

    python3 -m venv /tmp/mlflowenv && /tmp/mlflowenv/bin/pip install mlflow
    /tmp/mlflowenv/bin/python bench/mlflow_reference.py --clients 1,8 --duration 10

``mlflow server`` with its own SQLite backend store; each client thread logs to its own run
with ``MlflowClient.log_batch`` and 1000 metrics per request (MLflow's maximum). Prints one
JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(v: list[float], q: float) -> float:
    s = sorted(v)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--clients", default="1,8")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--per-batch", type=int, default=1000)
    a = p.parse_args()
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen(
            [os.path.join(os.path.dirname(sys.executable), "mlflow"), "server", "--backend-store-uri",
             f"sqlite:///{tmp}/mlflow.db", "--default-artifact-root", f"{tmp}/artifacts", "--host", "127.0.0.1",
             "--port", str(port), "--workers", "2"],
            stdout=open(f"{tmp}/server.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            import urllib.request

            deadline = time.monotonic() + 120
            while True:
                try:
                    urllib.request.urlopen(url + "/health", timeout=1)
                    break
                except Exception:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError(open(f"{tmp}/server.log").read()[-2000:]) from None
                    time.sleep(0.3)
            client = MlflowClient(tracking_uri=url)
            exp = client.create_experiment("bench")
            for n in [int(x) for x in a.clients.split(",")]:
                run_ids = [client.create_run(exp).info.run_id for _ in range(n)]
                lats: list[float] = []
                points = [0]
                lock = threading.Lock()

                def agent(run_id: str) -> None:
                    c = MlflowClient(tracking_uri=url)
                    end = time.monotonic() + a.duration
                    step, mine, my = 0, 0, []
                    keys = ("loss", "acc", "lr", "grad_norm", "step_time")
                    while time.monotonic() < end:
                        ts = int(time.time() * 1000)
                        per_key = a.per_batch // len(keys)
                        metrics = [Metric(k, 0.5 + i * 1e-3, ts, step + i) for k in keys for i in range(per_key)]
                        t0 = time.perf_counter()
                        c.log_batch(run_id, metrics=metrics)
                        my.append(time.perf_counter() - t0)
                        mine += len(metrics)
                        step += per_key
                    with lock:
                        lats.extend(my)
                        points[0] += mine

                threads = [threading.Thread(target=agent, args=(r,)) for r in run_ids]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                rows.append({"clients": n, "points_per_batch": a.per_batch, "batches": len(lats), "points": points[0],
                             "points_per_s": round(points[0] / a.duration), "batch_p50_ms": round(1000 * pct(lats, 50), 2),
                             "batch_p99_ms": round(1000 * pct(lats, 99), 2)})
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    import mlflow

    print(json.dumps({"mlflow_version": mlflow.__version__, "backend": "sqlite", "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
