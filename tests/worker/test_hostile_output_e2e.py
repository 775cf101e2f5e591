"""One run cannot stall the agent (#27's first "done when"): one agent (``--concurrency 2``, leases of 5 s,
heartbeats every 1 s) runs a normal run while, on its other slot, a bomb and a hostile run come and go.

- the bomb: a study whose code archive unpacks past the agent's ``STEADY_MAX_CODE_UNPACKED_BYTES``
  (within the server's limits, so the server stored it: the worker's limit is its own); it fails naming
  the limit, and nothing of it lands on the worker's disk;
- the hostile run: 64 KiB lines (the default pattern took 14.6 s each on a backtracking engine), a
  catastrophic pattern of its own (``(a+)+x``: forever), a 600 MB event line (written sparse, so it costs
  the run nothing and the agent a read of 600 MB), a step of 2^64, a double-forked ``setsid`` daemon, and
  a FIFO put in the worker's code cache in place of the normal study's archive (no ``--run-as``: the run
  is the agent's own user and finds the cache next to its own directory).

The normal run keeps its lease, its heartbeats stay on time and it completes; the hostile run completes
with its valid points and a warning per thing it cost itself; its daemon ends with it; the agent
leases again afterwards: a run of the normal study's code, whose cache entry is now the FIFO, completes
(that entry costs one download, never a hang); and a SIGTERM then stops the agent at once. The pieces
are tested alone too: tests/worker/test_capture_bounds.py, test_run_owns_processes.py, test_codepack.py,
test_codecache.py."""

from __future__ import annotations

import os
import stat
import textwrap
import time
from datetime import datetime

import pytest

from steady.worker.contract import codepack
from steady.worker.contract.events import MAX_EVENT_LINE_BYTES
from steady.worker.contract.protocol import DEFAULT_CAPTURE_PATTERN
from tests import archives
from tests.conftest import alive
from tests.worker.test_worker_agent_e2e import runs, series, submit, wait_for, workers  # noqa: F401

pytestmark = pytest.mark.slow

LONG_LINE_BYTES = 600 * 1024 * 1024
WORKER_UNPACK_LIMIT = 4 << 20  # the agent's STEADY_MAX_CODE_UNPACKED_BYTES; the server keeps its 1 GiB

HOSTILE = textwrap.dedent("""
    import json, os, sys, time
    started, done, pidfile, victim = sys.argv[1:5]
    deadline = time.monotonic() + 60
    while not os.path.exists(started) and time.monotonic() < deadline:  # the normal run goes first
        time.sleep(0.05)
    if os.fork() == 0:  # a daemon: double fork, its own session, out of the run's process group
        os.setsid()
        if os.fork() == 0:
            open(pidfile + ".tmp", "w").write(str(os.getpid()))
            os.rename(pidfile + ".tmp", pidfile)
            while True:
                time.sleep(0.2)
        os._exit(0)
    # the code cache is next to this run's own directory: put a FIFO in place of the normal study's archive
    entry = os.path.join(os.path.dirname(os.getcwd()), "code-cache", victim + ".tar.gz")
    os.unlink(entry)
    os.mkfifo(entry)
    line = 64 * 1024
    for _ in range(6):  # 14.6 s each for the default pattern on a backtracking engine; (a+)+x: forever
        print("it 1 " * (line // 5), flush=True)
        print("1" + "a" * (line - 1), flush=True)
    time.sleep(1.5)  # the agent's capture reads those lines (passes every 0.5 s) before the events below
    events = os.environ["STEADY_EVENTS_FILE"]
    with open(events, "a") as f:
        f.write(json.dumps({"e": "m", "s": 0, "v": {"loss": 1.0}}) + "\\n")
    fd = os.open(events, os.O_WRONLY)  # an unterminated line of LONG bytes, then its end: a hole, read as NULs
    os.pwrite(fd, b"\\n", os.fstat(fd).st_size + LONG)
    os.close(fd)
    with open(events, "a") as f:
        f.write(json.dumps({"e": "m", "s": 2 ** 64, "v": {"loss": 9.0}}) + "\\n")  # OverflowError in the agent
        f.write(json.dumps({"e": "m", "s": 1, "v": {"loss": 0.5}}) + "\\n")
    open(done, "w").close()
    time.sleep(1)
""").replace("LONG", str(LONG_LINE_BYTES))

NORMAL = textwrap.dedent("""
    import os, sys, time
    started, done = sys.argv[1], sys.argv[2]
    open(started, "w").close()
    end = time.monotonic() + 90
    step = 0
    while time.monotonic() < end:  # until 4 s (four heartbeats) after the hostile run wrote everything
        print(f"step {step} loss {1 / (step + 1)}", flush=True)
        step += 1
        if os.path.exists(done):
            end = min(end, time.monotonic() + 4)
        time.sleep(0.1)
""")


def _command_study(http, name: str, command: list[str], *, code: str | None = None,
                   capture: dict | None = None) -> int:
    workload: dict = {"framework": "torch", "command": ["python", "-S", *command]}  # -S: no shim, no torch
    if capture is not None:
        workload["capture"] = capture
    extra = {"code": {"sha256": code, "workdir": "."}} if code else {}
    return submit(http, name=name, workload=workload, seeds=[0], determinism=["none"], max_attempts=1, **extra)


def _upload(http, data: bytes) -> str:
    sha = codepack.sha256_of(data)
    r = http.put(f"/api/v1/code/{sha}", content=data, headers={"Content-Type": "application/gzip"})
    assert r.status_code == 200, r.text
    return sha


def _ended(http, study: int) -> dict:
    run = runs(http, study)[0]
    return run if run["status"] not in ("queued", "leased", "running") else {}


def test_a_hostile_run_cannot_stall_a_normal_run_beside_it(live_server, workers, tmp_path, monkeypatch):  # noqa: F811
    http = live_server.client()
    (tmp_path / "normal").mkdir()
    (tmp_path / "normal" / "normal.py").write_text(NORMAL)
    normal_code = _upload(http, codepack.pack(str(tmp_path / "normal")).data)
    bomb = archives.gzip_of_zeros(3 * WORKER_UNPACK_LIMIT, name="bomb.py")  # 12 kB, 12 MiB of zeros
    bomb_code = _upload(http, bomb)  # within the server's limits (under its ratio floor of 16 MiB)
    hostile = tmp_path / "hostile.py"
    hostile.write_text(HOSTILE)
    started, done, daemon = tmp_path / "started", tmp_path / "done", tmp_path / "daemon.pid"
    monkeypatch.setenv("STEADY_MAX_CODE_UNPACKED_BYTES", str(WORKER_UNPACK_LIMIT))  # the agent's own limit
    w = workers(live_server, "w1", "--concurrency", "2")
    cache_entry = tmp_path / "w1" / "code-cache" / f"{normal_code}.tar.gz"

    good = _command_study(http, "normal", ["normal.py", str(started), str(done)], code=normal_code)
    wait_for(started.exists, 60, f"the normal run to start\n{w.log()}")
    renewals: list[tuple[float, str]] = []  # (when seen, lease expiry): each new expiry is a heartbeat

    def normal_ended() -> dict:
        run = runs(http, good)[0]
        if run["lease_expires_at"] and (not renewals or renewals[-1][1] != run["lease_expires_at"]):
            renewals.append((time.monotonic(), run["lease_expires_at"]))
        return run if run["status"] not in ("queued", "leased", "running") else {}

    bombed = _command_study(http, "bomb", ["bomb.py"], code=bomb_code)
    bomb_run = wait_for(lambda: normal_ended() or _ended(http, bombed), 60, f"the bomb's run to end\n{w.log()}",
                        every=0.25)
    assert bomb_run["study_id"] == bombed, ("the normal run ended before the bomb's", bomb_run)
    assert bomb_run["status"] == "failed" and "STEADY_MAX_CODE_UNPACKED_BYTES" in bomb_run["error"], bomb_run
    assert "compression bomb" in bomb_run["error"]
    assert not any((tmp_path / "w1").glob("run-*/code/bomb.py"))  # nothing of it unpacked

    bad = _command_study(http, "hostile", [str(hostile), str(started), str(done), str(daemon), normal_code], capture={
        "tensorboard": False, "patterns": [DEFAULT_CAPTURE_PATTERN, r"(?P<step>\d+)(?P<loss>(a+)+)x"]})
    wait_for(normal_ended, 120, f"the normal run to end\n{w.log()}", every=0.25)
    run = runs(http, good)[0]
    assert run["status"] == "completed" and run["attempt"] == 1, (run, w.log())
    assert done.exists(), "the hostile run wrote everything while the normal one ran"
    # Heartbeats every ~1 s, leases of 5 s. The server's own clock, not this test's polling, times them: each
    # new expiry is a heartbeat's time plus 5 s, so a step of 5 s or more between two is a lease that lapsed.
    expiries = [datetime.fromisoformat(e) for _, e in renewals]
    gaps = [(b - a).total_seconds() for a, b in zip(expiries, expiries[1:])]
    assert len(renewals) >= 4 and expiries == sorted(expiries) and max(gaps) < 5.0, (gaps, w.log())

    hostile_run = wait_for(lambda: _ended(http, bad), 90, f"the hostile run to end\n{w.log()}")
    assert hostile_run["status"] == "completed", (hostile_run, w.log())
    assert series(http, hostile_run["id"], "loss") == ([0, 1], [1.0, 0.5])  # its valid points kept
    tail = http.get(f"/api/v1/runs/{hostile_run['id']}").json()["stderr_tail"]  # the list leaves it out
    assert f"[steady] skipped 1 line(s) of events.jsonl over {MAX_EVENT_LINE_BYTES} bytes" in tail, tail[-2000:]
    assert "[steady] skipped 1 event(s)" in tail
    pid = int(daemon.read_text())  # written before the run printed anything hostile
    wait_for(lambda: not alive(pid), 30, f"the hostile run's daemon {pid} to end with its run")
    assert stat.S_ISFIFO(os.lstat(cache_entry).st_mode), "the hostile run put its FIFO in the code cache"

    again = _command_study(http, "again", ["normal.py", str(tmp_path / "started-again"), str(done)], code=normal_code)
    wait_for(lambda: runs(http, again)[0]["status"] == "completed", 60, f"the agent to lease again\n{w.log()}")
    assert stat.S_ISREG(os.lstat(cache_entry).st_mode)  # the FIFO was removed and the archive fetched again
    assert w.proc.poll() is None
    t0 = time.monotonic()
    assert w.stop() == 0, w.log()  # SIGTERM is heard (a backtracking match or a FIFO once held the agent past it)
    assert time.monotonic() - t0 < 15, w.log()
