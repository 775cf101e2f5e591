"""Lease benchmark: 32 concurrent agents lease runs from one queue on PostgreSQL.

Each agent loops lease -> complete (an empty result), so the queue drains through the whole
state machine (lease, study status refresh, completion). Reports leases/s and the p50/p99
latency of a lease request, and checks that no run was leased twice.

    .venv/bin/python bench/lease_bench.py                 # writes bench/results/lease.json
    .venv/bin/python bench/lease_bench.py --agents 32 --runs 2000 --api-workers 2
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bench.common import Server, percentile, postgres_database, run_clients, write_result


def client_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url")
    p.add_argument("--token")
    p.add_argument("--threads", type=int)
    p.add_argument("--start-at", type=float)
    p.add_argument("--deadline", type=float)
    a = p.parse_args(argv)
    lats: list[float] = []
    leased: list[int] = []
    errors: list[str] = []
    lock = threading.Lock()

    def agent() -> None:
        with httpx.Client(base_url=a.url, headers={"Authorization": f"Bearer {a.token}"}, timeout=60) as c:
            wid = c.post("/api/v1/workers/register", json={"name": uuid.uuid4().hex, "labels": ["torch"]}).json()["worker_id"]
            time.sleep(max(0.0, a.start_at - time.time()))
            my_lats, mine = [], []
            while time.time() < a.deadline:
                t0 = time.perf_counter()
                r = c.post(f"/api/v1/workers/{wid}/lease", json={"worker_id": wid})
                my_lats.append(time.perf_counter() - t0)
                if r.status_code == 204:
                    break
                if r.status_code != 200:
                    errors.append(f"{r.status_code} {r.text[:200]}")
                    break
                lease = r.json()
                mine.append(lease["run_id"])
                c.post(f"/api/v1/runs/{lease['run_id']}/complete", json={"lease_id": lease["lease_id"]})
        with lock:
            lats.extend(my_lats)
            leased.extend(mine)

    threads = [threading.Thread(target=agent) for _ in range(a.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"latencies": lats, "leased": leased, "errors": errors[:5]}))


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_client":
        client_main(sys.argv[2:])
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agents", type=int, default=32)
    p.add_argument("--runs", type=int, default=2000)
    p.add_argument("--api-workers", type=int, default=2)
    p.add_argument("--max-seconds", type=float, default=120)
    p.add_argument("--out", default="lease")
    a = p.parse_args()
    with (tempfile.TemporaryDirectory() as tmp, postgres_database() as url,
          Server(url, Path(tmp) / "srv", workers=a.api_workers) as server):
        server.create_study(a.runs)
        n_procs = 4
        per = [a.agents // n_procs + (1 if i < a.agents % n_procs else 0) for i in range(n_procs)]
        start_at = time.time() + 4
        args = [["--url", server.url, "--token", server.tokens["worker"], "--threads", str(t), "--start-at", str(start_at),
                 "--deadline", str(start_at + a.max_seconds)] for t in per]
        out = run_clients(Path(__file__), n_procs, args, timeout=a.max_seconds + 60)
    wall = max(time.time(), start_at) - start_at
    lats = [x for o in out for x in o["latencies"]]
    leased = [x for o in out for x in o["leased"]]
    result = {
        "backend": "postgresql", "agents": a.agents, "api_workers": a.api_workers, "runs": a.runs,
        "leased": len(leased), "distinct": len(set(leased)), "leases_per_s": round(len(leased) / wall, 1),
        "lease_p50_ms": round(1000 * percentile(lats, 50), 2), "lease_p99_ms": round(1000 * percentile(lats, 99), 2),
        "wall_s": round(wall, 2), "errors": [e for o in out for e in o["errors"]],
        "note": "each agent loops lease -> complete; wall time includes the completions",
    }
    print(json.dumps(result, indent=2))
    write_result(a.out, result)
    return 0 if result["distinct"] == result["leased"] == a.runs else 1


if __name__ == "__main__":
    sys.exit(main())
