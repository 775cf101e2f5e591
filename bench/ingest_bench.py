"""Ingestion benchmark: Steady against MLflow's tracking server, fair by construction.

Both systems are measured in the same invocation, on the same machine, with the same client
harness and the same client counts (default 1, 8 and 32):

* Steady: a real ``steady serve`` with its defaults (one API process), fed the way its own
  agent feeds it: through ``steady.worker.agent.client.SteadyClient.send_metrics`` with batches of the size
  the agent sends in steady state (``AgentConfig.batch_points``, 5,000 points: 5 keys × 1,000
  steps, packed like ``MetricStream`` packs them). Each client registers, leases its own run.
* MLflow (``bench/mlflow_reference.py``, run with a Python that has mlflow): ``mlflow server``
  with its default workers and its own SQLite store, ``MlflowClient.log_batch`` with 1,000
  metrics per request (MLflow's maximum), one run per client.

Every client sends for ``--duration`` seconds; throughput is acknowledged points divided by the
*measured* wall time from the first send to the last acknowledgement over all clients. After
each measurement every point is read back (Steady: GET .../metrics/{key}?format=packed; MLflow:
get_metric_history) and counted; a client error, a thread that did not finish, or a read-back
count that differs from the acknowledged count fails the benchmark (exit status 1). The server
process's CPU time is read from /proc before and after each measurement: ``server_cpu_ms_per_batch``;
Steady's client processes report their own over the same window: ``client_cpu_ms_per_batch``.
The machine's load (os.getloadavg, CPU count) is recorded before and after each measurement.

    .venv/bin/python bench/ingest_bench.py --mlflow-python .venv-mlflow/bin/python
    .venv/bin/python bench/ingest_bench.py --clients 1,8 --duration 5 --backends sqlite --label after
    .venv/bin/python bench/ingest_bench.py --clients 8 --rounds 3   # Steady then MLflow, three times in turn

With ``--rounds``, every round is kept (``rounds``, ``ratios_by_round``, each row with its load) and the round of
the median SQLite ratio at the largest client count stands for the run.

Results go to bench/results/ingest.json under ``runs.<label>`` (other labels in the file are
kept, so a "before" and an "after" run of the same benchmark sit side by side).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    REPO,
    RESULTS,
    Server,
    machine,
    percentile,
    postgres_database,
    run_synced_clients,
)
from bench.procstat import load, process_tree_cpu_s

KEYS = ("loss", "acc", "lr", "grad_norm", "step_time")
MLFLOW_BATCH = 1000  # MLflow's maximum number of metrics per log_batch request


def agent_batch_points() -> int:
    """The number of points per batch the agent sends in steady state (its configured default)."""
    from steady.worker.agent.loop import AgentConfig

    return AgentConfig.__dataclass_fields__["batch_points"].default


def client_main(argv: list[str]) -> None:
    """One client process: ``--threads`` agents, each with its own SteadyClient, worker and run.

    Prints ``ready`` once every agent holds its lease, reads the start time from stdin, sends
    for ``--duration`` seconds from then (at least one batch each), prints one JSON line."""
    from steady.worker.agent.client import SteadyClient
    from steady.worker.contract.protocol import MetricBatch, Series, WorkerRegistration

    p = argparse.ArgumentParser()
    p.add_argument("--url")
    p.add_argument("--token")
    p.add_argument("--threads", type=int)
    p.add_argument("--duration", type=float)
    p.add_argument("--points", type=int, help="points per batch (all keys together)")
    a = p.parse_args(argv)
    per_key = a.points // len(KEYS)
    values = [0.5 + 1e-3 * i for i in range(per_key)]
    results: list[dict] = []
    lock = threading.Lock()
    ready = threading.Barrier(a.threads + 1)
    start: list[float] = []

    def agent() -> None:
        out = {"run_id": None, "points": 0, "batches": 0, "latencies": [], "first_send": None, "last_ack": None,
               "error": None, "done": False}
        try:
            with SteadyClient(a.url, a.token, timeout_s=120, retry_deadline_s=0) as client:
                try:
                    wid = client.register(WorkerRegistration(name=uuid.uuid4().hex, labels=["torch"])).worker_id
                    lease = client.lease(wid)
                    if lease is None:
                        raise RuntimeError("nothing to lease")
                    out["run_id"] = lease.run_id
                finally:
                    ready.wait()  # the process reports ready (or its failure) only when every agent is set up
                    ready.wait()  # the start time is known
                time.sleep(max(0.0, start[0] - time.time()))
                end = start[0] + a.duration
                seq = 0
                while True:
                    steps = list(range(seq * per_key, (seq + 1) * per_key))
                    batch = MetricBatch(lease_id=lease.lease_id, seq=seq,
                                        series=[Series.packed(k, steps, values) for k in KEYS])
                    t0 = time.time()
                    if out["first_send"] is None:
                        out["first_send"] = t0
                    ack = client.send_metrics(lease.run_id, batch, deadline_s=0)
                    t1 = time.time()
                    if ack.duplicate or ack.points != per_key * len(KEYS):
                        raise RuntimeError(f"unexpected ack {ack}")
                    out["last_ack"] = t1
                    out["latencies"].append(t1 - t0)
                    out["points"] += ack.points
                    out["batches"] += 1
                    seq += 1
                    if t1 >= end:
                        break
            out["done"] = True
        except Exception as exc:  # noqa: BLE001 - reported, and it fails the benchmark
            out["error"] = f"{type(exc).__name__}: {exc}"[:500]
        with lock:
            results.append(out)

    threads = [threading.Thread(target=agent) for _ in range(a.threads)]
    for t in threads:
        t.start()
    ready.wait()
    print("ready", flush=True)
    start.append(float(sys.stdin.readline()))
    ready.wait()
    time.sleep(max(0.0, start[0] - time.time()))
    cpu0 = _own_cpu_s()
    for t in threads:
        t.join()
    print(json.dumps({"threads": a.threads, "agents": results, "cpu_s": _own_cpu_s() - cpu0}))


def _own_cpu_s() -> float:
    """This process's CPU time (user and system, all threads), in seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def split(clients: int, max_procs: int = 4) -> list[int]:
    """Client threads per client process (the same split for both systems)."""
    n_procs = min(clients, max_procs)
    return [clients // n_procs + (1 if i < clients % n_procs else 0) for i in range(n_procs)]


def summarize(out: list[dict], clients: int, points_per_batch: int) -> tuple[dict, list[dict]]:
    """Throughput over the measured window; raises when any client failed or did not finish."""
    agents = [ag for o in out for ag in o["agents"]]
    problems = [ag["error"] or "thread did not finish" for ag in agents if not ag["done"] or ag["error"]]
    if len(agents) != clients:
        problems.append(f"{clients - len(agents)} client threads never reported")
    if problems:
        raise RuntimeError(f"{len(problems)} clients failed: {problems[:5]}")
    lat = [x for ag in agents for x in ag["latencies"]]
    client_cpu = sum(o.get("cpu_s", 0.0) for o in out)
    first = min(ag["first_send"] for ag in agents if ag["first_send"] is not None)
    last = max(ag["last_ack"] for ag in agents if ag["last_ack"] is not None)
    points = sum(ag["points"] for ag in agents)
    wall = last - first
    return {
        "clients": clients, "points_per_batch": points_per_batch, "batches": len(lat), "points_acked": points,
        "wall_s": round(wall, 3), "points_per_s": round(points / wall), "batch_p50_ms": round(1000 * percentile(lat, 50), 2),
        "batch_p99_ms": round(1000 * percentile(lat, 99), 2),
        # the client processes' CPU from the start signal to their last acknowledgement (the agent's own client)
        "client_cpu_ms_per_batch": round(1000 * client_cpu / max(1, len(lat)), 3),
    }, agents


def read_back_steady(server: Server, agents: list[dict]) -> int:
    """Every point of every run, read back through the API (packed) and counted; steps checked."""
    import httpx
    import numpy as np

    total = 0
    headers = {"Authorization": f"Bearer {server.tokens['user']}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=120) as c:
        for ag in agents:
            for key in KEYS:
                r = c.get(f"/api/v1/runs/{ag['run_id']}/metrics/{key}", params={"format": "packed"})
                r.raise_for_status()
                body = r.json()
                import base64

                steps = np.frombuffer(base64.b64decode(body["steps_b64"]), dtype="<i8")
                if not np.array_equal(steps, np.arange(ag["points"] // len(KEYS))):
                    raise RuntimeError(f"run {ag['run_id']} {key}: steps read back are not 0..n-1")
                total += body["n"]
    return total


def measure_steady(server: Server, clients: int, duration: float, points: int) -> dict:
    server.create_study(clients)
    cmds = [[sys.executable, str(Path(__file__)), "_client", "--url", server.url, "--token", server.tokens["worker"],
             "--threads", str(t), "--duration", str(duration), "--points", str(points)] for t in split(clients)]
    cpu0: list[float] = []
    load_before = load()
    out = run_synced_clients(cmds, timeout=duration + 300,
                             on_start=lambda: cpu0.append(process_tree_cpu_s(server.proc.pid)))
    cpu1 = process_tree_cpu_s(server.proc.pid)
    row, agents = summarize(out, clients, points)
    # from the start signal (every client registered and leased) to the last acknowledgement
    row["server_cpu_s"] = round(cpu1 - cpu0[0], 3)
    row["server_cpu_ms_per_batch"] = round(1000 * row["server_cpu_s"] / max(1, row["batches"]), 3)
    row["load_before"], row["load_after"] = load_before, load()
    row["points_read_back"] = read_back_steady(server, agents)
    if row["points_read_back"] != row["points_acked"]:
        raise RuntimeError(f"Steady read back {row['points_read_back']} points, acknowledged {row['points_acked']}")
    return row


def measure_mlflow(mlflow_python: str, clients: list[int], duration: float) -> dict:
    out = subprocess.run([mlflow_python, str(REPO / "bench" / "mlflow_reference.py"), "--clients",
                          ",".join(map(str, clients)), "--duration", str(duration), "--per-batch", str(MLFLOW_BATCH)],
                         capture_output=True, text=True, timeout=3600, cwd=REPO)
    if out.returncode != 0:
        raise RuntimeError("MLflow reference failed:\n" + out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def print_row(system: str, backend: str, row: dict) -> None:
    print(f"{system:6} {backend:8} clients={row['clients']:3} {row['points_per_s']:>12,} points/s  "
          f"wall {row['wall_s']} s  p50 {row['batch_p50_ms']} ms  p99 {row['batch_p99_ms']} ms  "
          f"server CPU {row.get('server_cpu_ms_per_batch', '?')} ms/batch  "
          + (f"client CPU {row['client_cpu_ms_per_batch']} ms/batch  " if "client_cpu_ms_per_batch" in row else "")
          + f"read back {row['points_read_back']:,}  "
          f"load {row['load_before']['loadavg_1m']}", flush=True)


def compare(before: dict, after: dict, label: str) -> dict:
    """Steady's throughput and server and client CPU per 5,000-point request, before and after, per backend and
    client count."""
    out: dict = {"after_label": label}
    for backend, rows in after["steady"].items():
        old = {r["clients"]: r for r in before["steady"].get(backend, [])}
        out[backend] = [
            {"clients": r["clients"],
             "points_per_s": [old[r["clients"]]["points_per_s"], r["points_per_s"]],
             "server_cpu_ms_per_request": [old[r["clients"]]["server_cpu_ms_per_batch"], r["server_cpu_ms_per_batch"]],
             "client_cpu_ms_per_request": [old[r["clients"]].get("client_cpu_ms_per_batch"),
                                           r.get("client_cpu_ms_per_batch")],
             "ratio_vs_mlflow_same_run": [before["ratio_vs_mlflow"][backend][str(r["clients"])],
                                          after["ratio_vs_mlflow"][backend][str(r["clients"])]],
             "loadavg_1m": [old[r["clients"]]["load_before"]["loadavg_1m"], r["load_before"]["loadavg_1m"]]}
            for r in rows if r["clients"] in old
        ]
    return out


def measure_round(a: argparse.Namespace, clients: list[int], points: int) -> dict:
    """Steady on each backend, then MLflow, at the same client counts: one round (the load is recorded per row)."""
    one: dict = {"steady": {}}
    for backend in a.backends.split(","):
        rows = []
        with tempfile.TemporaryDirectory() as tmp:
            ctx = postgres_database() if backend == "postgres" else None
            url = ctx.__enter__() if ctx is not None else f"sqlite:///{tmp}/steady.db"
            try:
                with Server(url, Path(tmp) / "srv", workers=1, lease_seconds=600) as server:
                    for n in clients:
                        row = measure_steady(server, n, a.duration, points)
                        print_row("steady", backend, row)
                        rows.append(row)
            finally:
                if ctx is not None:
                    ctx.__exit__(None, None, None)
        one["steady"][backend] = rows
    mlflow_load = load()
    one["mlflow"] = measure_mlflow(a.mlflow_python, clients, a.duration)
    one["mlflow"]["load_before"], one["mlflow"]["load_after"] = mlflow_load, load()
    for row in one["mlflow"]["rows"]:
        print_row("mlflow", "sqlite", {**row, "load_before": row.get("load_before", mlflow_load)})
    by_n = {r["clients"]: r["points_per_s"] for r in one["mlflow"]["rows"]}
    one["ratio_vs_mlflow"] = {
        backend: {str(r["clients"]): round(r["points_per_s"] / by_n[r["clients"]], 1) for r in rows}
        for backend, rows in one["steady"].items()
    }
    return one


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_client":
        client_main(sys.argv[2:])
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", default="sqlite,postgres")
    p.add_argument("--clients", default="1,8,32")
    p.add_argument("--duration", type=float, default=10.0, help="seconds each client sends for")
    p.add_argument("--points", type=int, default=None, help="points per Steady batch (default: the agent's, 5000)")
    p.add_argument("--mlflow-python", default=os.environ.get("MLFLOW_PYTHON", str(REPO / ".venv-mlflow" / "bin" / "python")))
    p.add_argument("--label", default="latest", help="key of this run in the results file (e.g. before, after)")
    p.add_argument("--out", default="ingest")
    p.add_argument("--rounds", type=int, default=1,
                   help="Steady then MLflow, this many times in turn (the machine's load moves; each round is kept)")
    a = p.parse_args()
    points = a.points or agent_batch_points()
    clients = [int(x) for x in a.clients.split(",")]
    if not Path(a.mlflow_python).exists():
        print(f"no MLflow Python at {a.mlflow_python}: make bench installs it in .venv-mlflow", file=sys.stderr)
        return 2
    run: dict = {"when": time.strftime("%Y-%m-%dT%H:%M:%S"), "settings": {**vars(a), "points": points},
                 "machine": machine(), "load_start": load(), "rounds": []}
    for i in range(a.rounds):
        one = measure_round(a, clients, points)
        run["rounds"].append(one)
        print(f"round {i + 1}: Steady / MLflow points/s at equal client counts: {one['ratio_vs_mlflow']}", flush=True)
    # the round of the median SQLite ratio at the most clients stands for the run (its rows, its ratios)
    key = str(clients[-1])
    ranked = sorted(run["rounds"], key=lambda r: r["ratio_vs_mlflow"].get("sqlite", {}).get(key, 0.0))
    run.update({k: ranked[(len(ranked) - 1) // 2][k] for k in ("steady", "mlflow", "ratio_vs_mlflow")})
    run["ratios_by_round"] = [r["ratio_vs_mlflow"] for r in run["rounds"]]
    run["load_end"] = load()
    print(f"Steady / MLflow points/s at equal client counts: {run['ratio_vs_mlflow']}", flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{a.out}.json"
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc.setdefault("runs", {})[a.label] = run
    doc["target"] = "Steady / MLflow >= 200 at 8 clients, agent batch size"
    if "before" in doc["runs"] and a.label != "before":
        doc["before_after"] = compare(doc["runs"]["before"], run, a.label)
    path.write_text(json.dumps(doc, indent=2))
    print(f"wrote {path} (runs.{a.label})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
