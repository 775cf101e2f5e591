"""Heavy reads of one user against the worker protocol of others (the shape of #51's finding 1).

A real ``steady serve`` (SQLite, one process, leases of ``--lease-s`` renewed every second). Simulated
agents (threads of this process) each hold a leased run of another user's study and heartbeat it every
second, sending a small metric batch with each heartbeat; a probe reads ``/healthz`` twice a second.
Two phases of ``--duration-s`` each, in one run:

- *baseline*: the agents and the probe alone;
- *storm*: the same, while one user (a client process of its own) fires ``--burst`` compares at once,
  then loops compares from ``--clients`` connections: compares of two studies whose code holds spec-like
  YAML files (before #51, each compare parsed every such file again, holding a thread of the shared pool).

Reported: heartbeat, metric batch and ``/healthz`` latency p50/p99 in each phase and their storm/baseline
ratios, leases lost (a heartbeat answered 409) and the compares answered 200 and 429.

    .venv/bin/python bench/heavy_reads_bench.py            # writes bench/results/heavy_reads.json
    .venv/bin/python bench/heavy_reads_bench.py --agents 16 --duration-s 20
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bench.common import REPO, Server, percentile, write_result
from steady.server.web.devserver import ServerProcess, serve_argv
from steady.worker.contract import codepack
from steady.worker.contract.protocol import Series


def _ms(values: list[float], q: float) -> float | None:
    p = percentile(values, q)
    return None if p is None else round(1000 * p, 1)


def _spec_like_yaml(i: int) -> str:
    items = ",".join(f"{{a: {i}, b: [1, 2, 3], c: x{k}}}" for k in range(600))
    return f"workload: {{framework: python, command: [python, t.py]}}\nitems: [{items}]\n"


def storm_main(argv: list[str]) -> None:
    """The heavy user: ``burst`` compares at once, then ``clients`` loops until the deadline."""
    p = argparse.ArgumentParser()
    for name in ("--url", "--token", "--baseline", "--candidate"):
        p.add_argument(name)
    p.add_argument("--burst", type=int)
    p.add_argument("--clients", type=int)
    p.add_argument("--duration-s", type=float)
    a = p.parse_args(argv)
    answers: dict[str, int] = {}
    lock = threading.Lock()

    def compare(c: httpx.Client) -> None:
        try:
            status = str(c.get("/api/v1/compare", params={"baseline": a.baseline, "candidate": a.candidate}).status_code)
        except httpx.HTTPError as exc:
            status = type(exc).__name__
        with lock:
            answers[status] = answers.get(status, 0) + 1

    def loop() -> None:
        with httpx.Client(base_url=a.url, headers={"Authorization": f"Bearer {a.token}"}, timeout=600) as c:
            while time.time() < a.deadline:
                compare(c)
                time.sleep(0.2)

    clients = [httpx.Client(base_url=a.url, headers={"Authorization": f"Bearer {a.token}"}, timeout=600)
               for _ in range(a.burst)]
    print("ready", flush=True)  # set up (imports, clients): the storm phase starts now
    a.deadline = time.time() + a.duration_s
    with ThreadPoolExecutor(a.burst + a.clients) as pool:
        futures = [pool.submit(compare, c) for c in clients] + [pool.submit(loop) for _ in range(a.clients)]
        for f in futures:
            f.result()
    print(json.dumps({"answers": answers}))


class Agents:
    """Threads that each hold one leased run and heartbeat it (with a metric batch) every second."""

    def __init__(self, server: Server, study: int, n: int) -> None:
        self.server, self.study, self.n = server, study, n
        self.stop = threading.Event()
        self.phase = "setup"
        self.lat: dict[str, dict[str, list[float]]] = {}
        self.lost: dict[str, int] = {}
        self.errors: list[str] = []
        self._lock = threading.Lock()

    def _record(self, kind: str, seconds: float) -> None:
        with self._lock:
            self.lat.setdefault(self.phase, {}).setdefault(kind, []).append(seconds)

    def run_one(self) -> None:
        h = {"Authorization": f"Bearer {self.server.tokens['worker']}"}
        with httpx.Client(base_url=self.server.url, headers=h, timeout=120) as c:
            wid = c.post("/api/v1/workers/register", json={"name": uuid.uuid4().hex, "labels": ["torch"]}).json()["worker_id"]
            lease = c.post(f"/api/v1/workers/{wid}/lease", json={"worker_id": wid, "study_id": self.study}).json()
            run, seq = lease["run_id"], 0
            while not self.stop.wait(1.0):
                t0 = time.perf_counter()
                r = c.post(f"/api/v1/runs/{run}/heartbeat", json={"lease_id": lease["lease_id"], "step": seq})
                self._record("heartbeat", time.perf_counter() - t0)
                if r.status_code == 409:
                    with self._lock:
                        self.lost[self.phase] = self.lost.get(self.phase, 0) + 1
                    return
                if r.status_code != 200:
                    self.errors.append(f"heartbeat {r.status_code}")
                series = Series.packed("loss", list(range(seq * 100, seq * 100 + 100)), [1.0] * 100)
                t0 = time.perf_counter()
                r = c.post(f"/api/v1/runs/{run}/metrics", json={"lease_id": lease["lease_id"], "seq": seq,
                                                                "series": [series.model_dump(exclude_none=True)]})
                self._record("batch", time.perf_counter() - t0)
                if r.status_code != 200:
                    self.errors.append(f"batch {r.status_code}")
                seq += 1

    def probe(self) -> None:
        with httpx.Client(base_url=self.server.url, timeout=120) as c:
            while not self.stop.wait(0.5):
                t0 = time.perf_counter()
                status = c.get("/healthz").status_code
                self._record("healthz", time.perf_counter() - t0)
                if status != 200:
                    self.errors.append(f"healthz {status}")


def _setup_heavy_user(server: Server, tmp: Path) -> tuple[int, int]:
    h = {"Authorization": f"Bearer {server.tokens['user']}"}
    ids = []
    for i in range(2):
        src = tmp / f"code{i}"
        src.mkdir()
        (src / "t.py").write_text(f"print({i})\n")
        (src / "study.yaml").write_text(_spec_like_yaml(i))
        packed = codepack.pack(str(src))
        httpx.put(f"{server.url}/api/v1/code/{packed.sha256}", content=packed.data, headers=h, timeout=60).raise_for_status()
        r = httpx.post(f"{server.url}/api/v1/studies", headers=h, timeout=60, json={
            "name": f"heavy {i}", "seeds": [0], "determinism": ["none"], "code": {"sha256": packed.sha256},
            "workload": {"framework": "python", "command": ["python", "t.py"]}})
        r.raise_for_status()
        ids.append(r.json()["id"])
    return ids[0], ids[1]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_storm":
        storm_main(sys.argv[2:])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", type=int, default=8)
    p.add_argument("--duration-s", type=float, default=15.0)
    p.add_argument("--lease-s", type=float, default=5.0)
    p.add_argument("--burst", type=int, default=48)
    p.add_argument("--clients", type=int, default=24)
    p.add_argument("--server-repo", help="run the server from this checkout (e.g. a worktree of the code before a "
                   "change), the clients from this one")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'steady.db'}"
        server = Server(url, Path(tmp) / "server", workers=1, lease_seconds=a.lease_s, heartbeat_seconds=1,
                        reaper_interval_seconds=0.5)
        if a.server_repo:
            server.proc = ServerProcess(serve_argv(server.port), url=server.url, env=server.env,
                                        cwd=Path(a.server_repo), log_path=server.workdir / "server.log")
        with server:
            baseline, candidate = _setup_heavy_user(server, Path(tmp))
            study = server.create_study(a.agents)  # the other user's runs (the same token: a study is not a user)
            agents = Agents(server, study, a.agents)
            threads = [threading.Thread(target=agents.run_one) for _ in range(a.agents)]
            threads.append(threading.Thread(target=agents.probe))
            for t in threads:
                t.start()
            time.sleep(2.0)  # every agent registered and leased
            agents.phase = "baseline"
            time.sleep(a.duration_s)
            agents.phase = "storm setup"
            storm = subprocess.Popen(
                [sys.executable, __file__, "_storm", "--url", server.url, "--token", server.tokens["user"],
                 "--baseline", str(baseline), "--candidate", str(candidate), "--burst", str(a.burst),
                 "--clients", str(a.clients), "--duration-s", str(a.duration_s)],
                cwd=REPO, stdout=subprocess.PIPE, text=True)
            assert storm.stdout is not None and storm.stdout.readline().strip() == "ready"
            agents.phase = "storm"
            storm_started = time.time()
            out, _ = storm.communicate(timeout=a.duration_s + 900)
            storm_done = time.time()
            agents.phase = "after"
            agents.stop.set()
            for t in threads:
                t.join(timeout=120)
    phases = {}
    for phase in ("baseline", "storm"):
        lat = agents.lat.get(phase, {})
        phases[phase] = {f"{k}_ms": {"p50": _ms(v, 50), "p99": _ms(v, 99), "n": len(v)} for k, v in lat.items()}
        phases[phase]["leases_lost"] = agents.lost.get(phase, 0)

    def ratio(kind: str, q: str) -> float | None:
        b, s = phases["baseline"].get(f"{kind}_ms", {}).get(q), phases["storm"].get(f"{kind}_ms", {}).get(q)
        return None if not b or s is None else round(s / b, 2)

    result = {
        "config": vars(a),
        "phases": phases,
        "storm_over_baseline": {f"{k}_{q}": ratio(k, q) for k in ("heartbeat", "batch", "healthz") for q in ("p50", "p99")},
        "compares": json.loads(out.strip().splitlines()[-1])["answers"],
        "storm_wall_s": round(storm_done - storm_started, 1),  # past duration_s: compares admitted late finishing
        "errors": sorted(set(agents.errors))[:20],
    }
    print(json.dumps(result, indent=2))
    print("->", write_result("heavy_reads_before" if a.server_repo else "heavy_reads", result))


if __name__ == "__main__":
    main()
