"""The agent against a real ``steady serve`` (SQLite, leases of 5 s, heartbeats every 1 s)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import alive, wait_until
from steady.worker.contract.protocol import Series

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


class Worker:
    def __init__(self, server, tmp_path: Path, name: str, *extra: str, cwd: Path = REPO) -> None:
        self.log_path = tmp_path / f"{name}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "steady.worker", "--server", server.url,
             "--name", name, "--poll-max", "0.5", "--grace", "5", "--work-dir", str(tmp_path / name), *extra],
            cwd=cwd, stdout=open(self.log_path, "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
            env={**os.environ, "STEADY_TOKEN": server.tokens["worker"]},
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


@pytest.fixture
def workers(tmp_path):
    started: list[Worker] = []

    def start(server, name: str = "w1", *extra: str, cwd: Path = REPO) -> Worker:
        w = Worker(server, tmp_path, name, *extra, cwd=cwd)
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()


def wait_for(predicate, timeout: float, what: str, every: float = 0.2):
    return wait_until(predicate, timeout, every, what)


def submit(http, **spec) -> int:
    r = http.post("/api/v1/studies", json={"metrics": ["loss"], **spec})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def runs(http, study_id: int) -> list[dict]:
    r = http.get(f"/api/v1/studies/{study_id}/runs")
    assert r.status_code == 200, r.text
    return r.json()["items"]


def series(http, run_id: int, key: str) -> tuple[list[int], list[float]]:
    r = http.get(f"/api/v1/runs/{run_id}/metrics/{key}", params={"format": "packed"})
    assert r.status_code == 200, r.text
    body = r.json()
    return Series(key=key, steps_b64=body["steps_b64"], values_b64=body["values_b64"]).unpacked()


def study_status(http, study_id: int) -> str:
    return http.get(f"/api/v1/studies/{study_id}").json()["status"]


def test_a_full_study_completes(live_server, workers):
    http = live_server.client()
    study = submit(http, name="e2e", workload={"framework": "torch", "name": "torch_mlp", "params": {"epochs": 1}},
                   seeds=[0], repeats=2, determinism=["strict"], threads=1)
    w = workers(live_server, "w1", "--labels", "e2e,rack-1")
    wait_for(lambda: study_status(http, study) == "completed", 120, f"study completion\n{w.log()}")
    items = runs(http, study)
    assert len(items) == 2 and all(r["status"] == "completed" and r["attempt"] == 1 for r in items)
    losses = [series(http, r["id"], "loss") for r in items]
    for steps, _ in losses:
        assert steps == list(range(len(steps))) and len(steps) == 23
    assert losses[0] == losses[1]  # strict: bitwise identical through the server
    assert series(http, items[0]["id"], "step_time")[0] == losses[0][0]
    for r in items:
        assert r["digests"]["initial_weights"] == items[0]["digests"]["initial_weights"]
        assert len(r["digests"]["data_order"]) == 1
        assert r["determinism_applied"]["level"] == "strict"
        assert r["fingerprint"]["torch_version"].startswith("2.")
        assert r["final_metrics"]["loss"] == losses[0][1][-1]
        assert r["timings"]["wall_s"] > 0
    listed = http.get("/api/v1/workers").json()["items"]
    mine = [x for x in listed if x["name"] == "w1"]  # the shared server may list other tests' w1 too
    assert any({"e2e", "rack-1", "torch", "cpu"} <= set(x["labels"]) for x in mine), mine
    assert w.stop() == 0


# The run logs STEPS steps; its first attempt stops at HOLD and waits for a file the test writes only after
# killing that attempt's agent, so the kill lands mid-run on any machine without a long workload.
STEPS, HOLD = 400, 150


def test_sigkilled_worker_run_is_requeued_and_completed_by_another(live_server, workers, tmp_path):
    http = live_server.client()
    go = tmp_path / "go"
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(f"""
        import os, time
        from steady import sdk

        for step in range({STEPS}):
            sdk.log(step=step, loss=1.0 / (step + 1))
            while step == {HOLD} and not os.path.exists({str(go)!r}):
                time.sleep(0.05)
    """))
    study = submit(http, name="kill", workload={"framework": "python", "entrypoint": str(script)},
                   seeds=[1], repeats=1, determinism=["seeded"], max_attempts=3)
    a = workers(live_server, "wa")
    run_id = wait_for(lambda: [r["id"] for r in runs(http, study) if r["status"] == "running" and r["progress_step"]],
                      90, f"the run to make progress\n{a.log()}")[0]
    wait_for(lambda: "loss" in (http.get(f"/api/v1/runs/{run_id}").json().get("metric_keys") or []), 30, "first metrics")
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait()
    # The premise: the kill lands mid-run (the first attempt cannot pass HOLD before `go` exists).
    assert http.get(f"/api/v1/runs/{run_id}").json()["status"] == "running"
    go.touch()
    b = workers(live_server, "wb")
    wait_for(lambda: study_status(http, study) == "completed", 300, f"completion by the second worker\n{b.log()}")
    run = http.get(f"/api/v1/runs/{run_id}").json()
    assert run["status"] == "completed" and run["attempt"] >= 2
    steps, values = series(http, run_id, "loss")
    assert steps == list(range(STEPS)), "missing or duplicate steps"
    assert values == [1.0 / (s + 1) for s in steps]
    assert run["final_metrics"]["loss"] == values[-1]


def test_cancelled_study_kills_the_running_run_and_user_errors_are_reported(live_server, workers, tmp_path):
    http = live_server.client()
    failing = tmp_path / "failing.py"
    failing.write_text(textwrap.dedent("""
        from steady import sdk
        sdk.log(step=0, loss=1.0)
        raise RuntimeError("user code exploded")
    """))
    pidfile = tmp_path / "slow.pid"
    slow = tmp_path / "slow.py"
    slow.write_text(textwrap.dedent(f"""
        import os, time
        from steady import sdk
        open({str(pidfile)!r}, "w").write(str(os.getpid()))
        for step in range(100000):
            sdk.log(step=step, loss=1.0 / (step + 1))
            time.sleep(0.02)
    """))
    w = workers(live_server, "w1")

    # an exception in user code: failed, with the traceback in the stderr tail
    bad = submit(http, name="bad", workload={"framework": "python", "entrypoint": str(failing)},
                 seeds=[0], determinism=["seeded"], max_attempts=1)
    wait_for(lambda: study_status(http, bad) in ("failed", "completed"), 60, f"the failing study\n{w.log()}")
    run = runs(http, bad)[0]
    assert run["status"] == "failed" and run["failure_kind"] == "error"
    assert "user code exploded" in run["error"]
    assert "Traceback" in run["stderr_tail"] and "RuntimeError: user code exploded" in run["stderr_tail"]
    assert series(http, run["id"], "loss") == ([0], [1.0])

    # cancel a study while its run executes: the run process is killed, the worker carries on
    study = submit(http, name="cancel", workload={"framework": "python", "entrypoint": str(slow)},
                   seeds=[0], determinism=["none"])
    wait_for(pidfile.exists, 60, f"the slow run to start\n{w.log()}")
    pid = int(pidfile.read_text())
    wait_for(lambda: runs(http, study)[0]["progress_step"], 30, "a heartbeat with progress")
    r = http.post(f"/api/v1/studies/{study}/cancel")
    assert r.status_code == 200, r.text
    wait_for(lambda: not alive(pid), 20, f"the run process to be killed\n{w.log()}")
    wait_for(lambda: runs(http, study)[0]["status"] == "cancelled", 20, f"the run to be reported cancelled\n{w.log()}")
    assert study_status(http, study) == "cancelled"
    assert w.proc.poll() is None, "the worker must carry on after a cancelled run"

    # SIGTERM while a run executes: past the grace period it is killed and released to the queue
    pidfile.unlink()
    again = submit(http, name="release", workload={"framework": "python", "entrypoint": str(slow)},
                   seeds=[0], determinism=["none"])
    wait_for(pidfile.exists, 60, f"the run to start\n{w.log()}")
    pid = int(pidfile.read_text())
    t0 = time.monotonic()
    assert w.stop() == 0
    assert time.monotonic() - t0 < 15
    assert not alive(pid)
    run = runs(http, again)[0]
    assert run["status"] == "queued", run
    assert "released back to the queue" in w.log()
