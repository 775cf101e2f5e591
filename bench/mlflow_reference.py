"""MLflow's tracking server on this machine, the reference of bench/ingest_bench.py.

Runs with a Python that has mlflow installed (not a Steady dependency; ``make bench`` puts it
in .venv-mlflow):

    .venv-mlflow/bin/python bench/mlflow_reference.py --clients 1,8,32 --duration 10

``mlflow server`` with its defaults (its default number of workers) and its own SQLite backend
store. Clients are spread over processes exactly as ingest_bench.py spreads Steady's (at most
4 processes, threads within them); each client thread logs to its own run with
``MlflowClient.log_batch`` and 1,000 metrics per request (MLflow's maximum): 5 keys × 200
steps. Throughput is acknowledged points over the measured wall time from the first send to
the last acknowledgement; every point is then read back with ``get_metric_history`` and
counted. A failed request or thread fails the run. Prints one JSON line.
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
import urllib.request
import uuid
from pathlib import Path

# run as a script by MLflow's interpreter: bench/ is sys.path[0]
from procstat import load, process_tree_cpu_s

KEYS = ("loss", "acc", "lr", "grad_norm", "step_time")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(v: list[float], q: float) -> float:
    s = sorted(v)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def client_main(argv: list[str]) -> None:
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    p = argparse.ArgumentParser()
    p.add_argument("--url")
    p.add_argument("--runs")
    p.add_argument("--duration", type=float)
    p.add_argument("--per-batch", type=int)
    a = p.parse_args(argv)
    per_key = a.per_batch // len(KEYS)
    results: list[dict] = []
    lock = threading.Lock()
    run_ids = a.runs.split(",")
    ready = threading.Barrier(len(run_ids) + 1)
    start: list[float] = []

    def agent(run_id: str) -> None:
        out = {"run_id": run_id, "points": 0, "batches": 0, "latencies": [], "first_send": None, "last_ack": None,
               "error": None, "done": False}
        try:
            try:
                c = MlflowClient(tracking_uri=a.url)
                # Warm-up outside the measured window, through the same endpoint (a param, not a
                # metric, so the read-back count is unaffected): lazy imports in client and server.
                c.log_batch(run_id, params=[Param("bench_client", uuid.uuid4().hex)])
            finally:
                ready.wait()
                ready.wait()
            time.sleep(max(0.0, start[0] - time.time()))
            end = start[0] + a.duration
            step = 0
            while True:
                ts = int(time.time() * 1000)
                metrics = [Metric(k, 0.5 + i * 1e-3, ts, step + i) for k in KEYS for i in range(per_key)]
                t0 = time.time()
                if out["first_send"] is None:
                    out["first_send"] = t0
                c.log_batch(run_id, metrics=metrics)
                t1 = time.time()
                out["last_ack"] = t1
                out["latencies"].append(t1 - t0)
                out["points"] += len(metrics)
                out["batches"] += 1
                step += per_key
                if t1 >= end:
                    break
            out["done"] = True
        except Exception as exc:  # noqa: BLE001 - reported, and it fails the benchmark
            out["error"] = f"{type(exc).__name__}: {exc}"[:500]
        with lock:
            results.append(out)

    threads = [threading.Thread(target=agent, args=(r,)) for r in run_ids]
    for t in threads:
        t.start()
    ready.wait()
    print("ready", flush=True)
    start.append(float(sys.stdin.readline()))
    ready.wait()
    for t in threads:
        t.join()
    print(json.dumps({"agents": results}))


def split(clients: int, max_procs: int = 4) -> list[int]:
    n_procs = min(clients, max_procs)
    return [clients // n_procs + (1 if i < clients % n_procs else 0) for i in range(n_procs)]


def measure(url: str, server_pid: int, exp: str, n: int, duration: float, per_batch: int) -> dict:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=url)
    run_ids = [client.create_run(exp).info.run_id for _ in range(n)]
    procs, i = [], 0
    for threads in split(n):
        ids = run_ids[i:i + threads]
        i += threads
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "_client", "--url", url, "--runs", ",".join(ids), "--duration", str(duration),
             "--per-batch", str(per_batch)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    load_before = load()
    for proc in procs:  # every client imported mlflow and is ready: start together
        line = proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"MLflow client did not get ready (exit {proc.poll()}): {line[:300]!r}")
    cpu0 = process_tree_cpu_s(server_pid)
    start_at = time.time() + 0.5
    for proc in procs:
        proc.stdin.write(f"{start_at}\n")
        proc.stdin.flush()
    agents = []
    for proc in procs:
        stdout, _ = proc.communicate(timeout=duration + 300)
        if proc.returncode != 0:
            raise RuntimeError(f"MLflow client process exited {proc.returncode}")
        agents.extend(json.loads(stdout.strip().splitlines()[-1])["agents"])
    cpu1 = process_tree_cpu_s(server_pid)
    problems = [ag["error"] or "thread did not finish" for ag in agents if not ag["done"] or ag["error"]]
    if len(agents) != n:
        problems.append(f"{n - len(agents)} client threads never reported")
    if problems:
        raise RuntimeError(f"{len(problems)} MLflow clients failed: {problems[:5]}")
    lat = [x for ag in agents for x in ag["latencies"]]
    first = min(ag["first_send"] for ag in agents)
    last = max(ag["last_ack"] for ag in agents)
    acked = sum(ag["points"] for ag in agents)
    read_back = 0
    for ag in agents:
        for key in KEYS:
            history = client.get_metric_history(ag["run_id"], key)
            if sorted(m.step for m in history) != list(range(ag["points"] // len(KEYS))):
                raise RuntimeError(f"MLflow run {ag['run_id']} {key}: steps read back are not 0..n-1")
            read_back += len(history)
    if read_back != acked:
        raise RuntimeError(f"MLflow read back {read_back} points, acknowledged {acked}")
    wall = last - first
    return {"clients": n, "points_per_batch": per_batch, "batches": len(lat), "points_acked": acked,
            "points_read_back": read_back, "wall_s": round(wall, 3), "points_per_s": round(acked / wall),
            "batch_p50_ms": round(1000 * pct(lat, 50), 2), "batch_p99_ms": round(1000 * pct(lat, 99), 2),
            "server_cpu_s": round(cpu1 - cpu0, 3),
            "server_cpu_ms_per_batch": round(1000 * (cpu1 - cpu0) / max(1, len(lat)), 3),
            "load_before": load_before, "load_after": load()}


def warm_up(url: str, exp: str, per_batch: int) -> None:
    """Metric batches to a run of its own from 8 threads, so every server worker has served log_batch."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=url)
    run_id = client.create_run(exp).info.run_id

    def send(t: int) -> None:
        for b in range(4):
            step = (t * 4 + b) * per_batch
            try:
                client.log_batch(run_id, metrics=[Metric("warmup", 0.0, 0, step + i) for i in range(per_batch)])
            except Exception:  # noqa: BLE001 - a warm-up, not a measurement
                pass

    threads = [threading.Thread(target=send, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_client":
        client_main(sys.argv[2:])
        return 0
    p = argparse.ArgumentParser()
    p.add_argument("--clients", default="1,8,32")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--per-batch", type=int, default=1000)
    a = p.parse_args()
    import mlflow
    from mlflow.tracking import MlflowClient

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        # No --workers: the server's default number of workers.
        proc = subprocess.Popen(
            [os.path.join(os.path.dirname(sys.executable), "mlflow"), "server", "--backend-store-uri",
             f"sqlite:///{tmp}/mlflow.db", "--default-artifact-root", f"{tmp}/artifacts", "--host", "127.0.0.1",
             "--port", str(port)],
            stdout=open(f"{tmp}/server.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True,  # noqa: SIM115
        )
        try:
            deadline = time.monotonic() + 180
            while True:
                try:
                    urllib.request.urlopen(url + "/health", timeout=1)
                    break
                except Exception:  # noqa: BLE001 - not up yet, whatever the error; the deadline bounds it
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError(Path(tmp, "server.log").read_text()[-2000:]) from None
                    time.sleep(0.3)
            exp = MlflowClient(tracking_uri=url).create_experiment("bench")
            warm_up(url, exp, a.per_batch)
            for n in [int(x) for x in a.clients.split(",")]:
                rows.append(measure(url, proc.pid, exp, n, a.duration, a.per_batch))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            server_log = Path(tmp, "server.log").read_text()
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    workers = [line for line in server_log.splitlines() if "worker" in line.lower()][:8]
    print(json.dumps({"mlflow_version": mlflow.__version__, "backend": "sqlite", "server_args": "defaults",
                      "server_log_workers": workers, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
