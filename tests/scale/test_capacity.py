"""No user's requests can cost another user's run its lease (ARCHITECTURE.md: the control plane's hot path
runs on capacity of its own; docs/deploy.md, "Capacity").

One user fires heavy reads at a real ``steady serve`` (48 compares at once, then a compare loop from 8
clients) while a real agent runs another user's study with leases of 4 s renewed every 1 s. Before the
worker protocol had threads and connections of its own, the compares took every thread of the shared
pool for tens of seconds: ``/healthz`` stalled and the other user's run lost its lease and ran again as
attempt 2. Now the heavy reads are admitted two at a time for the user (the rest answered 429 with
Retry-After at once), heartbeats run on the protocol's own threads, and the run completes as attempt 1.
The check is that no lease was lost (a lost lease is a second attempt), not a latency figure; ``/healthz``
is only bounded far above its normal milliseconds.
"""

from __future__ import annotations

import os
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from steady.worker.contract import codepack
from tests.conftest import wait_until
from tests.worker.test_worker_agent_e2e import Worker

pytestmark = pytest.mark.slow

LEASES = {"lease_seconds": 4, "heartbeat_seconds": 1, "reaper_interval_seconds": 0.5}
BURST, CLIENTS, STORM_S = 48, 8, 8.0
HEALTHZ_BOUND_S = 5.0  # a ping on the protocol's own thread and connection: milliseconds when idle

RUN = textwrap.dedent("""
    import os, sys, time
    started, done = sys.argv[1:3]
    open(started, "w").close()
    deadline, step = time.monotonic() + 300, 0
    while not os.path.exists(done) and time.monotonic() < deadline:
        print(f"step {step} loss {1.0 / (step + 1)}", flush=True)
        step += 1
        time.sleep(0.2)
""")


def _spec_like_yaml(i: int) -> str:
    """A flow-style YAML file that names a workload: a spec to tell apart from the code, costly to parse in
    pure Python (what a compare did on every call for every such file of both studies' code)."""
    items = ",".join(f"{{a: {i}, b: [1, 2, 3], c: x{k}}}" for k in range(600))
    return f"workload: {{framework: python, command: [python, t.py]}}\nitems: [{items}]\n"


def _code(tmp_path: Path, i: int) -> codepack.Packed:
    src = tmp_path / f"code{i}"
    src.mkdir()
    (src / "t.py").write_text(f"print({i})\n")
    (src / "study.yaml").write_text(_spec_like_yaml(i))
    return codepack.pack(str(src))


def _study(http: httpx.Client, **spec) -> int:
    r = http.post("/api/v1/studies", json={"seeds": [0], "determinism": ["none"], "metrics": ["loss"],
                                           "max_attempts": 3, **spec})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_heavy_reads_of_one_user_cannot_cost_another_users_run_its_lease(live_server_factory, tmp_path):
    server = live_server_factory(**LEASES)
    heavy = server.client("user")  # the user who fires compares
    other = httpx.Client(base_url=server.url, timeout=30,  # another user, whose run the agent runs
                         headers={"Authorization": f"Bearer {server.new_tokens()['user']}"})
    studies = []
    for i in range(2):
        packed = _code(tmp_path, i)
        assert heavy.put(f"/api/v1/code/{packed.sha256}", content=packed.data).status_code == 200
        studies.append(_study(heavy, name=f"heavy {i}", code={"sha256": packed.sha256},
                              workload={"framework": "python", "command": ["python", "t.py"]}))
    script, started, done = tmp_path / "run.py", tmp_path / "started", tmp_path / "done"
    script.write_text(RUN)
    victim = _study(other, name="victim", workload={
        "framework": "python", "command": [sys.executable, "-S", str(script), str(started), str(done)]})
    agent = Worker(server, tmp_path, "agent", "--study", str(victim))
    try:
        wait_until(started.exists, 120, what="the other user's run to start")
        health: list[tuple[float, int]] = []
        answers: list[int] = []
        retry_after: list[str] = []
        stop = threading.Event()

        def probe() -> None:
            with httpx.Client(base_url=server.url, timeout=120) as c:
                while not stop.is_set():
                    t0 = time.monotonic()
                    status = c.get("/healthz").status_code
                    health.append((time.monotonic() - t0, status))
                    stop.wait(0.5)

        def compare(client: httpx.Client) -> None:
            r = client.get("/api/v1/compare", params={"baseline": studies[0], "candidate": studies[1]})
            answers.append(r.status_code)
            if r.status_code == 429:
                retry_after.append(r.headers.get("retry-after", ""))

        def storm() -> None:
            with server.client("user") as c:
                c.timeout = httpx.Timeout(600)
                while not stop.is_set():
                    compare(c)
                    stop.wait(0.5)

        prober = threading.Thread(target=probe)
        prober.start()
        with ThreadPoolExecutor(BURST + CLIENTS) as pool:
            clients = [server.client("user") for _ in range(BURST)]
            for c in clients:
                c.timeout = httpx.Timeout(600)
            burst = [pool.submit(compare, c) for c in clients]  # all at once
            loops = [pool.submit(storm) for _ in range(CLIENTS)]
            time.sleep(STORM_S)
            stop.set()
            for f in [*burst, *loops]:
                f.result()
            for c in clients:
                c.close()
        prober.join()
        done.touch()

        def ended() -> dict | None:
            run = other.get(f"/api/v1/studies/{victim}/runs").json()["items"][0]
            return run if run["status"] not in ("queued", "leased", "running") else None

        run = wait_until(ended, 120, what="the other user's run to end")
        assert (run["status"], run["attempt"]) == ("completed", 1), f"{run}\n{agent.log()}"
        assert 200 in answers and 429 in answers, sorted(set(answers))
        assert set(answers) <= {200, 429}, sorted(set(answers))
        assert retry_after and all(v.isdigit() and int(v) >= 1 for v in retry_after), retry_after[:5]
        slowest = max(t for t, _ in health)
        assert all(s == 200 for _, s in health) and slowest < HEALTHZ_BOUND_S, (slowest, health)
    finally:
        done.touch()
        agent.stop()
        heavy.close()
        other.close()
        if os.environ.get("STEADY_TEST_KEEP_LOGS"):
            print(agent.log())
