"""Capacity of the control plane: how many agents one API process holds on PostgreSQL.

Simulated agents are coroutines (a small HTTP/1.1 keep-alive client on asyncio streams, a few
hundred per client process) that speak the real wire protocol to a real ``steady serve`` on a
throwaway PostgreSQL database. For each number of agents (``--agents``, default 10, 100 and
1,000), on a fresh server and database, after every agent has registered and leased a run:

1. *health*: every agent asks ``/healthz`` back to back for ``--phase-s`` seconds: the baseline.
2. *heartbeat*: every agent heartbeats its lease back to back for ``--phase-s`` seconds.
3. *lease* (with ``--lease-phase``): every agent releases its run and leases one again, back to
   back, for ``--phase-s`` seconds: the server's CPU per cycle (a release and a lease) and the
   cycle's latency. Every release and lease of one study settles its status under the study's row
   lock, so this phase measures that lock as much as a lease's work; at 1,000 agents its cycles run
   past the phase into the fleet's.
4. *fleet*: every agent works like a worker with a steady run (``--fleet-s`` seconds): a metric
   batch of ``--points`` points every ``--batch-s`` seconds, a heartbeat every ``--heartbeat-s``
   seconds, the run completed after ``--batches`` batches and the next one leased; one probe per
   client process asks ``/healthz`` every 0.2 s meanwhile, so lease and heartbeat latency have a
   baseline under the same load.

For each phase it reports requests/s, p50/p99 latency and the server's CPU time per request (the
API process and its children, user + system, read from /proc at the phase's start and end), and
the heartbeat's and the lease's figures as ratios to the health check's of the same run. The
clients, PostgreSQL and the server share this machine: read the ratios, not the absolute figures.

    .venv/bin/python bench/capacity_bench.py            # writes bench/results/capacity.json
    .venv/bin/python bench/capacity_bench.py --agents 100 --phase-s 5 --fleet-s 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bench.common import REPO, RESULTS, Server, percentile, postgres_database, run_synced_clients, write_result
from bench.procstat import process_tree_cpu_s
from steady.worker.contract.protocol import Series

PROBE_INTERVAL_S = 0.2


def phase_plan(a: argparse.Namespace) -> tuple[tuple[str, float], ...]:
    """The phases in order, with their lengths."""
    lease = (("lease", a.phase_s),) if a.lease_phase else ()
    return (("health", a.phase_s), ("heartbeat", a.phase_s), *lease, ("fleet", a.fleet_s))


def _ms(values: list[float], q: float) -> float | None:
    p = percentile(values, q)
    return None if p is None else round(1000 * p, 2)


class Conn:
    """One keep-alive HTTP/1.1 connection: a request at a time, answers with a Content-Length."""

    def __init__(self, host: str, port: int, token: str) -> None:
        self.host, self.port = host, port
        self.head = f"Host: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        if self.writer is not None:
            try:
                return await self._request(method, path, body)
            except (ConnectionResetError, asyncio.IncompleteReadError) as exc:
                # the server closes a keep-alive connection idle past its timeout: one new connection
                if isinstance(exc, asyncio.IncompleteReadError) and exc.partial:
                    raise
                self.writer.close()
                self.reader = self.writer = None
        return await self._request(method, path, body)

    async def _request(self, method: str, path: str, body: dict | None) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        data = b"" if body is None else json.dumps(body).encode()
        extra = f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n" if body is not None else ""
        self.writer.write(f"{method} {path} HTTP/1.1\r\n{self.head}{extra}\r\n".encode() + data)
        assert self.reader is not None
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        payload = await self.reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection", "").lower() == "close":
            self.writer.close()
            self.reader = self.writer = None
        return status, payload


class Agent:
    def __init__(self, conn: Conn, out: dict) -> None:
        self.conn, self.out = conn, out
        self.worker_id = self.run_id = self.lease_id = None

    async def call(self, kind: str, method: str, path: str, body: dict | None = None,
                   record: bool = True) -> tuple[int, bytes]:
        t0 = time.perf_counter()
        try:
            status, payload = await self.conn.request(method, path, body)
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            self.out["errors"].append(f"{kind} {type(exc).__name__}")
            self.conn.writer = self.conn.reader = None
            return 0, b""
        if record:
            self.out["lat"].setdefault(kind, []).append(time.perf_counter() - t0)
            self.out["count"][kind] = self.out["count"].get(kind, 0) + 1
        if status >= 400 and status != 409:
            self.out["errors"].append(f"{kind} {status} {payload[:120]!r}")
        return status, payload

    async def lease(self, record: bool) -> bool:
        status, payload = await self.call("lease", "POST", f"/api/v1/workers/{self.worker_id}/lease",
                                          {"worker_id": self.worker_id}, record)
        if status != 200:
            return False
        lease = json.loads(payload)
        self.run_id, self.lease_id = lease["run_id"], lease["lease_id"]
        return True

    async def setup(self) -> None:
        status, payload = await self.call("register", "POST", "/api/v1/workers/register",
                                          {"name": f"sim-{uuid.uuid4().hex[:12]}", "labels": ["torch"]}, False)
        if status != 200:
            raise RuntimeError(f"register answered {status}: {payload[:200]!r}")
        self.worker_id = json.loads(payload)["worker_id"]
        for _ in range(60):  # a busy server may answer a lease late or not at all; set-up is not measured
            if await self.lease(record=False):
                return
            await asyncio.sleep(1.0)
        raise RuntimeError(f"no run leased during set-up: {self.out['errors'][-3:]}")

    async def heartbeat(self, step: int) -> int:
        status, _ = await self.call("heartbeat", "POST", f"/api/v1/runs/{self.run_id}/heartbeat",
                                    {"lease_id": self.lease_id, "step": step})
        return status

    async def closed_loop(self, kind: str, end: float) -> None:
        step = 0
        while time.time() < end:
            if kind == "health":
                await self.call("health", "GET", "/healthz")
            elif kind == "lease":
                # give the run back and lease one again: the run returns to the queue, no attempt is counted
                status, _ = await self.call("release", "POST", f"/api/v1/runs/{self.run_id}/release",
                                            {"lease_id": self.lease_id})
                if status != 200:
                    self.out["lost"] += 1
                while not await self.lease(record=True):
                    if time.time() >= end + 60:  # the fleet phase needs a run: keep trying a while past the end
                        return
                    await asyncio.sleep(0.5)
            else:
                step += 1
                if await self.heartbeat(step) == 409:
                    self.out["lost"] += 1
                    return

    async def fleet(self, a: argparse.Namespace, end: float) -> None:
        steps = list(range(a.points))
        # agents are at different points of their runs, so that completions and leases are spread out
        seq, next_hb = random.randrange(a.batches), time.time() + a.heartbeat_s * random.uniform(0, 1)
        next_batch = time.time() + a.batch_s * random.uniform(0, 1)
        while time.time() < end:
            await asyncio.sleep(max(0.0, min(next_hb, next_batch) - time.time()))
            if time.time() >= end:
                return
            if time.time() >= next_hb:
                next_hb += a.heartbeat_s
                if await self.heartbeat(seq) == 409:
                    self.out["lost"] += 1
                    seq = a.batches  # leased away: take another run
            elif seq < a.batches:
                next_batch += a.batch_s
                base = seq * a.points
                series = Series.packed("loss", [base + s for s in steps], [1.0 / (base + s + 1) for s in steps])
                status, _ = await self.call("batch", "POST", f"/api/v1/runs/{self.run_id}/metrics",
                                            {"lease_id": self.lease_id, "seq": seq,
                                             "series": [series.model_dump(exclude_none=True)]})
                seq = a.batches if status == 409 else seq + 1
            if seq >= a.batches:
                await self.call("complete", "POST", f"/api/v1/runs/{self.run_id}/complete",
                                {"lease_id": self.lease_id, "final_metrics": {"loss": 0.5}})
                while time.time() < end and not await self.lease(record=True):
                    await asyncio.sleep(1.0)
                seq = 0


async def _probe(conn: Conn, out: dict, end: float) -> None:
    probe = Agent(conn, out)
    while time.time() < end:
        await probe.call("health_probe", "GET", "/healthz")
        await asyncio.sleep(PROBE_INTERVAL_S)


def client_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url")
    p.add_argument("--token")
    p.add_argument("--agents", type=int)
    for name in ("--phase-s", "--fleet-s", "--batch-s", "--heartbeat-s", "--gap-s"):
        p.add_argument(name, type=float)
    p.add_argument("--batches", type=int)
    p.add_argument("--points", type=int)
    p.add_argument("--lease-phase", action="store_true")
    a = p.parse_args(argv)
    u = urlsplit(a.url)
    phases: dict[str, dict] = {}

    def fresh() -> dict:
        return {"lat": {}, "count": {}, "errors": [], "lost": 0}

    async def run() -> None:
        setup_out = fresh()
        agents = [Agent(Conn(u.hostname, u.port, a.token), setup_out) for _ in range(a.agents)]
        sem = asyncio.Semaphore(32)  # set-up is not measured: don't flood the server with it

        async def set_up(agent: Agent) -> None:
            async with sem:
                await agent.setup()

        await asyncio.gather(*(set_up(x) for x in agents))
        print("ready", flush=True)
        start_at = float(await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline))
        t = start_at
        for name, length in phase_plan(a):
            await asyncio.sleep(max(0.0, t - time.time()))
            out = phases[name] = fresh()
            for x in agents:
                x.out = out
            end = t + length
            if name == "fleet":
                await asyncio.gather(*(x.fleet(a, end) for x in agents),
                                     _probe(Conn(u.hostname, u.port, a.token), out, end))
            else:
                await asyncio.gather(*(x.closed_loop(name, end) for x in agents))
            t = end + a.gap_s

    asyncio.run(run())
    for out in phases.values():
        out["errors"] = out["errors"][:20]
    print(json.dumps(phases))


def _cpu_sampler(pid: int, times: list[float], cpu: list[float]) -> threading.Thread:
    """Read the server's CPU time at each of ``times`` (epoch seconds), in a thread."""
    def sample() -> None:
        for t in times:
            time.sleep(max(0.0, t - time.time()))
            cpu.append(process_tree_cpu_s(pid))

    th = threading.Thread(target=sample, daemon=True)
    return th


def _profile(py_spy: str, pid: int, window: tuple[float, float], out: Path) -> None:
    """py-spy samples the server during one phase (its middle, off the edges), in the background; the
    collapsed stacks are copied to bench/results/ when it ends."""
    start, end = window
    lead = (end - start) * 0.1

    def record() -> None:
        time.sleep(max(0.0, start + lead - time.time()))
        subprocess.run([py_spy, "record", "--pid", str(pid), "--duration", str(max(1, int(end - start - 2 * lead))),
                        "--format", "raw", "--threads", "--nonblocking", "-o", str(out)], capture_output=True)
        if out.exists():
            (RESULTS / out.name).write_bytes(out.read_bytes())

    threading.Thread(target=record, daemon=True).start()


def measure(url_db: str, tmp: Path, agents: int, a: argparse.Namespace) -> dict:
    n_procs = max(1, min(4, (agents + 249) // 250))  # a few hundred coroutines per client process
    per = [agents // n_procs + (1 if i < agents % n_procs else 0) for i in range(n_procs)]
    # leases long enough to outlast the set-up of 1,000 agents on a busy machine (no heartbeat before the phases)
    with Server(url_db, tmp / f"api-{agents}", workers=1, max_runs_per_study=100_000, lease_seconds=900) as server:
        runs_needed = int(agents * (2 + a.fleet_s / (a.batches * a.batch_s)) * 1.5) + 10
        study = server.create_study(runs_needed)
        cmd = [sys.executable, str(Path(__file__)), "_client", "--url", server.url, "--token", server.tokens["worker"],
               "--phase-s", str(a.phase_s), "--fleet-s", str(a.fleet_s), "--batch-s", str(a.batch_s),
               "--heartbeat-s", str(a.heartbeat_s), "--gap-s", str(a.gap_s), "--batches", str(a.batches),
               "--points", str(a.points), *(["--lease-phase"] if a.lease_phase else [])]
        cpu: list[float] = []
        bounds: list[tuple[str, float, float]] = []
        sampler: list[threading.Thread] = []

        def on_start() -> None:
            # run_synced_clients starts the clients at now + lead_s (0.5 s): the phases follow from there
            t0 = time.time() + 0.5
            for name, length in phase_plan(a):
                bounds.append((name, t0, t0 + length))
                t0 += length + a.gap_s
            th = _cpu_sampler(server.proc.pid, [t for _, s, e in bounds for t in (s, e)], cpu)
            th.start()
            sampler.append(th)
            if a.py_spy:
                _profile(a.py_spy, server.proc.pid, {n: (s, e) for n, s, e in bounds}[a.profile_phase],
                         tmp / f"profile-{agents}-{a.profile_phase}.txt")

        load_before = os.getloadavg()[0]
        out = run_synced_clients([[*cmd, "--agents", str(n)] for n in per], timeout=600 + 3 * a.phase_s + a.fleet_s,
                                 on_start=on_start)
        sampler[0].join(timeout=30)
        httpx.post(f"{server.url}/api/v1/studies/{study}/cancel",
                   headers={"Authorization": f"Bearer {server.tokens['user']}"}, timeout=120)
    row: dict = {"agents": agents, "client_processes": n_procs, "api_processes": 1,
                 "load_average_1m": [round(load_before, 1), round(os.getloadavg()[0], 1)]}
    for i, (name, start, end) in enumerate(bounds):
        phase = [o[name] for o in out]
        lat: dict[str, list[float]] = {}
        for o in phase:
            for k, v in o["lat"].items():
                lat.setdefault(k, []).extend(v)
        count = sum(sum(o["count"].values()) for o in phase)
        cpu_s = cpu[2 * i + 1] - cpu[2 * i]
        errors = [e for o in phase for e in o["errors"]]
        row[name] = {
            "requests": count, "requests_per_s": round(count / (end - start), 1),
            "server_cpu_ms_per_request": round(1000 * cpu_s / count, 3) if count else None,
            "server_cpu_s": round(cpu_s, 3), "server_cpu_busy": round(cpu_s / (end - start), 2),
            "latency_ms": {k: {"p50": _ms(v, 50), "p99": _ms(v, 99), "n": len(v)} for k, v in sorted(lat.items())},
            "lost_leases": sum(o["lost"] for o in phase), "errors": len(errors), "error_examples": errors[:5],
        }
    h, hb, fl = row["health"], row["heartbeat"], row["fleet"]
    ls = row.get("lease")
    if ls is not None:  # a cycle is a release and a lease: the server's CPU per cycle
        leases = ls["latency_ms"].get("lease", {}).get("n", 0)
        ls["server_cpu_ms_per_cycle"] = round(1000 * ls["server_cpu_s"] / leases, 3) if leases else None

    def ratio(x: float | None, y: float | None) -> float | None:
        return None if x is None or not y else round(x / y, 2)

    def lat(phase: dict, kind: str, q: str) -> float | None:
        return phase["latency_ms"].get(kind, {}).get(q)

    row["ratios"] = {
        "heartbeat_cpu_per_request_vs_health": ratio(hb["server_cpu_ms_per_request"], h["server_cpu_ms_per_request"]),
        "heartbeat_requests_per_s_vs_health": ratio(hb["requests_per_s"], h["requests_per_s"]),
        "heartbeat_p50_vs_health": ratio(lat(hb, "heartbeat", "p50"), lat(h, "health", "p50")),
        "heartbeat_p99_vs_health": ratio(lat(hb, "heartbeat", "p99"), lat(h, "health", "p99")),
        "fleet_lease_p50_vs_health_probe": ratio(lat(fl, "lease", "p50"), lat(fl, "health_probe", "p50")),
        "fleet_lease_p99_vs_health_probe": ratio(lat(fl, "lease", "p99"), lat(fl, "health_probe", "p99")),
        "fleet_heartbeat_p50_vs_health_probe": ratio(lat(fl, "heartbeat", "p50"), lat(fl, "health_probe", "p50")),
        "fleet_heartbeat_p99_vs_health_probe": ratio(lat(fl, "heartbeat", "p99"), lat(fl, "health_probe", "p99")),
    }
    if ls is not None:
        row["ratios"]["lease_cycle_cpu_vs_health"] = ratio(ls["server_cpu_ms_per_cycle"], h["server_cpu_ms_per_request"])
        row["ratios"]["lease_p50_vs_health"] = ratio(lat(ls, "lease", "p50"), lat(h, "health", "p50"))
    offered = agents * (1 / a.batch_s + 1 / a.heartbeat_s + 2 / (a.batches * a.batch_s)) + n_procs / PROBE_INTERVAL_S
    fl["offered_requests_per_s"] = round(offered, 1)
    hb_p99 = lat(fl, "heartbeat", "p99")
    fl["saturated"] = fl["requests_per_s"] < 0.9 * offered or (hb_p99 is not None and hb_p99 > a.saturation_ms)
    return row


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_client":
        client_main(sys.argv[2:])
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agents", default="10,100,1000", help="comma-separated agent counts (one fresh server each)")
    p.add_argument("--phase-s", type=float, default=15.0, help="length of the health and heartbeat phases")
    p.add_argument("--fleet-s", type=float, default=40.0, help="length of the fleet phase")
    p.add_argument("--gap-s", type=float, default=2.0, help="pause between phases")
    p.add_argument("--batch-s", type=float, default=10.0, help="fleet: seconds between an agent's metric batches")
    p.add_argument("--heartbeat-s", type=float, default=10.0, help="fleet: seconds between heartbeats (the default)")
    p.add_argument("--batches", type=int, default=3, help="fleet: batches per run before it completes")
    p.add_argument("--points", type=int, default=1000, help="fleet: points per batch")
    p.add_argument("--lease-phase", action="store_true", help="add the lease phase (releases and leases back to back)")
    p.add_argument("--saturation-ms", type=float, default=1000.0, help="fleet heartbeat p99 above this: saturated")
    p.add_argument("--out", default="capacity")
    p.add_argument("--py-spy", help="path of py-spy: sample the server during --profile-phase (bench/results/profile-*)")
    p.add_argument("--profile-phase", default="heartbeat", choices=("health", "heartbeat", "lease", "fleet"))
    a = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for agents in [int(x) for x in a.agents.split(",")]:
            with postgres_database() as url:
                t0 = time.time()
                row = measure(url, Path(tmp), agents, a)
                row["wall_s"] = round(time.time() - t0, 1)
            print(json.dumps(row), flush=True)
            rows.append(row)
    result = {
        "backend": "postgresql", "api_processes": 1,
        "profile": {k: getattr(a, k) for k in ("phase_s", "fleet_s", "gap_s", "batch_s", "heartbeat_s", "batches",
                                               "points", "saturation_ms")},
        "note": "simulated agents, PostgreSQL and the API share this machine's CPUs: compare the ratios, each "
                "measured against the health check in the same run; server CPU is the API process's, not PostgreSQL's",
        "rows": rows,
    }
    path = write_result(a.out, result)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main())
