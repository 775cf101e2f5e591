"""One run cannot stall the agent: with a hostile run and a normal one side by side
(``--concurrency 2``, leases of 5 s, heartbeats every 1 s), the normal run keeps its lease, its
heartbeats stay on time and it completes; the hostile run (64 KiB lines, a backtracking pattern, an
oversized event line, a step of 2^64, a double-forked daemon) completes with its valid points and
warnings, and its daemon ends with it; the agent leases again afterwards. The archive side (bombs,
a FIFO in the code cache) is tested where it is handled: tests/worker/test_codepack.py,
tests/worker/test_codecache.py, tests/worker/test_code_prepare.py."""

from __future__ import annotations

import textwrap
import time
from datetime import datetime

import pytest

from steady.worker.contract.events import MAX_EVENT_LINE_BYTES
from steady.worker.contract.protocol import DEFAULT_CAPTURE_PATTERN
from tests.conftest import alive
from tests.worker.test_worker_agent_e2e import runs, series, submit, wait_for, workers  # noqa: F401

pytestmark = pytest.mark.slow

HOSTILE = textwrap.dedent("""
    import json, os, sys, time
    started, done = sys.argv[1], sys.argv[2]
    deadline = time.monotonic() + 60
    while not os.path.exists(started) and time.monotonic() < deadline:  # the normal run goes first
        time.sleep(0.05)
    if os.fork() == 0:  # a daemon: double fork, its own session, out of the run's process group
        os.setsid()
        if os.fork() == 0:
            open(sys.argv[3] + ".tmp", "w").write(str(os.getpid()))
            os.rename(sys.argv[3] + ".tmp", sys.argv[3])
            while True:
                time.sleep(0.2)
        os._exit(0)
    line = 64 * 1024
    for _ in range(6):  # 14.6 s each for the default pattern on a backtracking engine; (a+)+x: forever
        print("it 1 " * (line // 5), flush=True)
        print("1" + "a" * (line - 1), flush=True)
    time.sleep(1.5)  # the agent's capture reads those lines (passes every 0.5 s) before the events below
    with open(os.environ["STEADY_EVENTS_FILE"], "a") as f:
        f.write(json.dumps({"e": "m", "s": 0, "v": {"loss": 1.0}}) + "\\n")
        f.write("x" * (MAX_LINE + 1) + "\\n")  # just over the event-line bound
        f.write(json.dumps({"e": "m", "s": 2 ** 64, "v": {"loss": 9.0}}) + "\\n")  # OverflowError in the agent
        f.write(json.dumps({"e": "m", "s": 1, "v": {"loss": 0.5}}) + "\\n")
    open(done, "w").close()
    time.sleep(1)
""").replace("MAX_LINE", str(MAX_EVENT_LINE_BYTES))

NORMAL = textwrap.dedent("""
    import os, sys, time
    started, done = sys.argv[1], sys.argv[2]
    open(started, "w").close()
    end = time.monotonic() + 60
    step = 0
    while time.monotonic() < end:  # until 4 s (four heartbeats) after the hostile run printed everything
        print(f"step {step} loss {1 / (step + 1)}", flush=True)
        step += 1
        if os.path.exists(done):
            end = min(end, time.monotonic() + 4)
        time.sleep(0.1)
""")


def _command_study(http, name: str, script, *args: str, capture: dict | None = None) -> int:
    workload = {"framework": "torch", "command": ["python", "-S", str(script), *args]}  # -S: no shim, no torch
    if capture is not None:
        workload["capture"] = capture
    return submit(http, name=name, workload=workload, seeds=[0], determinism=["none"], max_attempts=1)


def test_a_hostile_run_cannot_stall_a_normal_run_beside_it(live_server, workers, tmp_path):  # noqa: F811
    http = live_server.client()
    hostile, normal = tmp_path / "hostile.py", tmp_path / "normal.py"
    hostile.write_text(HOSTILE)
    normal.write_text(NORMAL)
    started, done = tmp_path / "started", tmp_path / "done"
    w = workers(live_server, "w1", "--concurrency", "2")
    good = _command_study(http, "normal", normal, str(started), str(done))
    wait_for(started.exists, 60, f"the normal run to start\n{w.log()}")
    daemon = tmp_path / "daemon.pid"
    bad = _command_study(http, "hostile", hostile, str(started), str(done), str(daemon), capture={
        "tensorboard": False, "patterns": [DEFAULT_CAPTURE_PATTERN, r"(?P<step>\d+)(?P<loss>(a+)+)x"]})

    renewals: list[tuple[float, str]] = []  # (when seen, lease expiry): each new expiry is a heartbeat

    def normal_done() -> bool:
        run = runs(http, good)[0]
        if run["lease_expires_at"] and (not renewals or renewals[-1][1] != run["lease_expires_at"]):
            renewals.append((time.monotonic(), run["lease_expires_at"]))
        return run["status"] not in ("queued", "leased", "running")

    wait_for(normal_done, 90, f"the normal run to end\n{w.log()}", every=0.25)
    run = runs(http, good)[0]
    assert run["status"] == "completed" and run["attempt"] == 1, (run, w.log())
    assert done.exists(), "the hostile run printed everything while the normal one ran"
    gaps = [b[0] - a[0] for a, b in zip(renewals, renewals[1:])]
    assert len(renewals) >= 4 and max(gaps) < 3.5, (gaps, w.log())  # heartbeats every ~1 s; the lease is 5 s
    expiries = [datetime.fromisoformat(e) for _, e in renewals]
    assert expiries == sorted(expiries)

    wait_for(lambda: runs(http, bad)[0]["status"] not in ("queued", "leased", "running"), 60,
             f"the hostile run to end\n{w.log()}")
    hostile_run = runs(http, bad)[0]
    assert hostile_run["status"] == "completed", (hostile_run, w.log())
    assert series(http, hostile_run["id"], "loss") == ([0, 1], [1.0, 0.5])  # its valid points kept
    tail = http.get(f"/api/v1/runs/{hostile_run['id']}").json()["stderr_tail"]  # the list leaves it out
    assert f"[steady] skipped 1 line(s) of events.jsonl over {MAX_EVENT_LINE_BYTES} bytes" in tail, tail[-2000:]
    assert "[steady] skipped 1 event(s)" in tail
    pid = int(daemon.read_text())  # written before the run printed anything hostile
    wait_for(lambda: not alive(pid), 30, f"the hostile run's daemon {pid} to end with its run")

    again = _command_study(http, "again", normal, str(tmp_path / "started-again"), str(done))
    wait_for(lambda: runs(http, again)[0]["status"] == "completed", 60, f"the agent to lease again\n{w.log()}")
    assert w.proc.poll() is None
