"""Capacity of the control plane: how many agents one PostgreSQL and N API processes hold.

Simulated agents (asyncio + httpx, in client processes) speak the real wire protocol to real
``steady serve`` processes on a throwaway PostgreSQL database. Each agent behaves like a
worker in a batch job with a steady training run: it leases a run, sends a metric batch of
``--points`` points every ``--batch-s`` seconds, heartbeats every ``--heartbeat-s`` seconds
(the server's default), completes the run after ``--batches`` batches and leases the next.
Agents start spread over ``--ramp-s`` seconds; latencies are recorded over the following
``--duration-s`` seconds only, so every configuration runs for a bounded time.

For each (API processes, agents) it reports lease, heartbeat and batch latency p50/p99,
the offered and achieved request rates, lost leases and errors; a configuration is
*saturated* when it serves less than 90 % of the offered rate or its heartbeat p99 exceeds
``--saturation-ms``.

    .venv/bin/python bench/capacity_bench.py            # writes bench/results/capacity.json
    .venv/bin/python bench/capacity_bench.py --agents 100,300 --api 1,2 --duration-s 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bench.common import Server, percentile, postgres_database, run_clients, write_result
from steady.worker.contract.protocol import Series


def _ms(values: list[float], q: float) -> float | None:
    p = percentile(values, q)
    return None if p is None else round(1000 * p, 1)


async def _agent(c: httpx.AsyncClient, a: argparse.Namespace, measure_from: float, end: float, out: dict) -> None:
    def record(kind: str, t0: float, status: int) -> None:
        if t0 >= measure_from:
            out[kind].append(time.time() - t0)
            out["requests"] += 1
        if status >= 400 and status != 409:
            out["errors"].append(f"{kind} {status}")

    async def post(kind: str, path: str, body: dict) -> httpx.Response | None:
        t0 = time.time()
        try:
            r = await c.post(path, json=body)
        except httpx.HTTPError as exc:
            out["errors"].append(f"{kind} {type(exc).__name__}")
            return None
        record(kind, t0, r.status_code)
        return r

    await asyncio.sleep(random.uniform(0, a.ramp_s))
    r = await post("register", "/api/v1/workers/register", {"name": f"sim-{uuid.uuid4().hex[:12]}", "labels": ["torch"]})
    if r is None or r.status_code != 200:
        return
    wid = r.json()["worker_id"]
    steps = list(range(a.points))
    while time.time() < end:
        r = await post("lease", f"/api/v1/workers/{wid}/lease", {"worker_id": wid})
        if r is None or r.status_code != 200:
            await asyncio.sleep(1.0)
            continue
        lease = r.json()
        run_id, lid = lease["run_id"], lease["lease_id"]
        next_hb = time.time() + a.heartbeat_s * random.uniform(0.8, 1.0)
        lost = False
        for seq in range(a.batches):
            await asyncio.sleep(a.batch_s * random.uniform(0.8, 1.2))
            if time.time() >= end:
                return
            series = Series.packed("loss", [seq * a.points + s for s in steps], [1.0 / (seq * a.points + s + 1) for s in steps])
            r = await post("batch", f"/api/v1/runs/{run_id}/metrics",
                           {"lease_id": lid, "seq": seq, "series": [series.model_dump(exclude_none=True)]})
            if r is not None and r.status_code == 409:
                lost = True
                break
            if time.time() >= next_hb:
                r = await post("heartbeat", f"/api/v1/runs/{run_id}/heartbeat", {"lease_id": lid, "step": seq})
                next_hb += a.heartbeat_s
                if r is not None and r.status_code == 409:
                    lost = True
                    break
        if lost:
            out["lost"] += 1
            continue
        await post("complete", f"/api/v1/runs/{run_id}/complete", {"lease_id": lid, "final_metrics": {"loss": 0.5}})


def client_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    for name in ("--url", "--token"):
        p.add_argument(name)
    p.add_argument("--agents", type=int)
    for name in ("--start-at", "--ramp-s", "--duration-s", "--batch-s", "--heartbeat-s"):
        p.add_argument(name, type=float)
    p.add_argument("--batches", type=int)
    p.add_argument("--points", type=int)
    a = p.parse_args(argv)
    out: dict = {"lease": [], "heartbeat": [], "batch": [], "complete": [], "register": [], "errors": [],
                 "lost": 0, "requests": 0}

    async def run() -> None:
        limits = httpx.Limits(max_connections=a.agents, max_keepalive_connections=a.agents)
        async with httpx.AsyncClient(base_url=a.url, headers={"Authorization": f"Bearer {a.token}"},
                                     timeout=120, limits=limits) as c:
            await asyncio.sleep(max(0.0, a.start_at - time.time()))
            measure_from = a.start_at + a.ramp_s
            end = measure_from + a.duration_s
            await asyncio.gather(*(_agent(c, a, measure_from, end, out) for _ in range(a.agents)))

    asyncio.run(run())
    out["errors"] = out["errors"][:20]
    print(json.dumps(out))


def measure(url_db: str, tmp: Path, api: int, agents: int, a: argparse.Namespace) -> dict:
    # One client process per 250 agents (at least one); asyncio keeps each agent a coroutine.
    n_procs = max(1, min(4, (agents + 249) // 250))
    with Server(url_db, tmp / f"api{api}-{agents}", workers=api, max_runs_per_study=100_000) as server:
        runs_needed = int(agents * (1 + (a.ramp_s + a.duration_s) / (a.batches * a.batch_s)) * 1.5) + 10
        study = server.create_study(runs_needed)
        per = [agents // n_procs + (1 if i < agents % n_procs else 0) for i in range(n_procs)]
        start_at = time.time() + 3
        args = [["--url", server.url, "--token", server.tokens["worker"], "--agents", str(n), "--start-at", str(start_at),
                 "--ramp-s", str(a.ramp_s), "--duration-s", str(a.duration_s), "--batch-s", str(a.batch_s),
                 "--heartbeat-s", str(a.heartbeat_s), "--batches", str(a.batches), "--points", str(a.points)]
                for n in per]
        out = run_clients(Path(__file__), n_procs, args, timeout=a.ramp_s + a.duration_s + 300)
        httpx.post(f"{server.url}/api/v1/studies/{study}/cancel",
                   headers={"Authorization": f"Bearer {server.tokens['user']}"}, timeout=120)
    merged = {k: [x for o in out for x in o[k]] for k in ("lease", "heartbeat", "batch", "complete", "errors")}
    requests = sum(o["requests"] for o in out)
    per_agent_rps = 1 / a.batch_s + 1 / a.heartbeat_s + 2 / (a.batches * a.batch_s)
    offered = agents * per_agent_rps
    achieved = requests / a.duration_s
    hb_p99 = _ms(merged["heartbeat"], 99)
    return {
        "api_processes": api, "agents": agents, "client_processes": n_procs,
        "offered_rps": round(offered, 1), "achieved_rps": round(achieved, 1),
        "lease_p50_ms": _ms(merged["lease"], 50), "lease_p99_ms": _ms(merged["lease"], 99),
        "heartbeat_p50_ms": _ms(merged["heartbeat"], 50), "heartbeat_p99_ms": hb_p99,
        "batch_p50_ms": _ms(merged["batch"], 50), "batch_p99_ms": _ms(merged["batch"], 99),
        "samples": {k: len(merged[k]) for k in ("lease", "heartbeat", "batch")},
        "lost_leases": sum(o["lost"] for o in out), "errors": len(merged["errors"]), "error_examples": merged["errors"][:5],
        "saturated": achieved < 0.9 * offered or (hb_p99 is not None and hb_p99 > a.saturation_ms),
    }


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_client":
        client_main(sys.argv[2:])
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agents", default="25,50,100,300,1000", help="comma-separated agent counts")
    p.add_argument("--api", default="1,2", help="comma-separated numbers of API processes")
    p.add_argument("--ramp-s", type=float, default=10.0)
    p.add_argument("--duration-s", type=float, default=30.0)
    p.add_argument("--batch-s", type=float, default=2.0)
    p.add_argument("--heartbeat-s", type=float, default=10.0)
    p.add_argument("--batches", type=int, default=10, help="batches per run before it completes")
    p.add_argument("--points", type=int, default=200, help="points per batch")
    p.add_argument("--saturation-ms", type=float, default=1000.0, help="heartbeat p99 above this: saturated")
    p.add_argument("--out", default="capacity")
    a = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for api in [int(x) for x in a.api.split(",")]:
            for agents in [int(x) for x in a.agents.split(",")]:
                with postgres_database() as url:
                    t0, load_before = time.time(), os.getloadavg()[0]
                    row = measure(url, Path(tmp), api, agents, a)
                    row["wall_s"] = round(time.time() - t0, 1)
                    # Other work on the machine shifts every figure: record how busy it was.
                    row["load_average_1m"] = [round(load_before, 1), round(os.getloadavg()[0], 1)]
                print(json.dumps(row), flush=True)
                rows.append(row)
    result = {
        "backend": "postgresql", "profile": {k: getattr(a, k) for k in ("ramp_s", "duration_s", "batch_s", "heartbeat_s",
                                                                         "batches", "points", "saturation_ms")},
        "note": "simulated agents and the API share this machine's CPUs; the rates are for this machine",
        "rows": rows,
    }
    path = write_result(a.out, result)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
