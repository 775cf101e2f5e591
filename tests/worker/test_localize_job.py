"""The agent's side of a localization job, against the real app in process: the driver's answer is posted and
kept; a cancel heard through the heartbeat, or the job's time limit, ends the driver and every process below
it, and the job ends cancelled or failed with its reason. The driver is a stand-in here (a few lines of
Python); the real one, replaying real training, runs in tests/reports/test_localize_e2e.py."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.api.helpers import spec
from tests.conftest import SQLITE_ONLY, wait_until

pytestmark = SQLITE_ONLY

SENTENCE = ("first divergent op: `aten::uniform_` in `Net.pool` (forward) at train.py:16, step 0, "
            "inputs identical → the op itself")
ANSWER = {"status": "localized", "step": 0, "replays": 2, "sentence": SENTENCE, "answer": {
    "step": 0, "op": "aten::uniform_", "module": "Net.pool", "phase": "forward", "line": "train.py:16",
    "index": 3, "inputs_identical": True, "cause": "op", "aligned_by": "ops"}}


def _through(api) -> httpx.MockTransport:
    """The worker's HTTP calls, answered by the app in this process."""
    def handle(request: httpx.Request) -> httpx.Response:
        r = api.client.request(request.method, request.url.path, content=request.content,
                               headers={k: v for k, v in request.headers.items() if k.lower() != "host"})
        return httpx.Response(r.status_code, headers=r.headers, content=r.content)

    return httpx.MockTransport(handle)


@pytest.fixture
def setup(api, tmp_path, monkeypatch):
    """(api, agent, ask) where ask() leases a fresh job of a new study to the agent and returns its lease."""
    from steady.worker.agent.client import SteadyClient
    from steady.worker.agent.loop import Agent, AgentConfig
    from steady.worker.contract.protocol import WorkerRegistration

    client = SteadyClient("http://steady.test", api.tokens["worker"], transport=_through(api), retry_deadline_s=5)
    agent = Agent(AgentConfig(server="http://steady.test", token=api.tokens["worker"], work_dir=str(tmp_path / "w")),
                  client=client)
    agent.registered = client.register(WorkerRegistration(name="w1", labels=["torch", "cpu"]))

    def ask():
        sid = api.post("/api/v1/studies", json=spec(seeds=[0], repeats=2, determinism=["strict"])).json()["id"]
        runs = [r["id"] for r in api.get(f"/api/v1/studies/{sid}/runs").json()["items"]]
        assert api.post(f"/api/v1/studies/{sid}/cancel").status_code == 200
        assert api.post(f"/api/v1/studies/{sid}/localization-jobs", json={"runs": runs}).status_code == 201
        lease = client.lease_localization(agent.registered.worker_id)
        assert lease is not None and lease.run_ids == runs
        return lease

    yield api, agent, ask
    client.close()


def _driver(monkeypatch, code: str) -> None:
    """The job's driver: ``code`` run by this interpreter (it gets the real driver's arguments, unused)."""
    from steady.worker.agent import localize_job

    real = localize_job.driver_argv

    def fake(lease, folder, code_dir, device):
        real(lease, folder, code_dir, device)  # the spec files are written as for the real driver
        assert sorted(os.listdir(folder)) == ["spec-0.json", "spec-1.json"]
        return [sys.executable, "-c", code]

    monkeypatch.setattr(localize_job, "driver_argv", fake)


def _run(agent, lease):
    from steady.worker.agent.localize_job import LocalizationExecution

    execution = LocalizationExecution(agent, lease)
    execution.start()
    assert execution.finished.wait(60), "the job did not end"
    return execution


def _job(api, job_id: int) -> dict:
    return api.get(f"/api/v1/localization-jobs/{job_id}").json()


def test_the_drivers_answer_is_posted_and_kept(setup, monkeypatch):
    api, agent, ask = setup
    lease = ask()
    _driver(monkeypatch, f"import json; print(json.dumps({ANSWER!r}))")
    _run(agent, lease)
    job = _job(api, lease.job_id)
    assert job["status"] == "done" and job["result"]["sentence"] == SENTENCE, job
    (kept,) = api.get(f"/api/v1/studies/{lease.study_id}/localizations").json()["items"]
    assert kept["answer"]["op"] == "aten::uniform_" and kept["run_ids"] == lease.run_ids


def test_a_driver_without_an_answer_fails_the_job_with_its_last_words(setup, monkeypatch):
    api, agent, ask = setup
    lease = ask()
    _driver(monkeypatch, "import sys; sys.stderr.write('ModuleNotFoundError: no module named torch'); sys.exit(3)")
    _run(agent, lease)
    job = _job(api, lease.job_id)
    assert job["status"] == "failed" and "exit 3" in job["error"] and "no module named torch" in job["error"], job


def _sleeper(pid_file: Path) -> str:
    """A driver that starts a child in a session of its own (as the replays are) and waits."""
    return ("import subprocess, sys, time\n"
            f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
            f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
            "time.sleep(120)\n")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("how", ["cancel", "time_limit"])
def test_a_cancel_or_the_time_limit_ends_the_driver_and_its_replays(setup, monkeypatch, tmp_path, how):
    api, agent, ask = setup
    lease = ask().model_copy(update={"heartbeat_seconds": 0.2})
    if how == "time_limit":
        lease = lease.model_copy(update={"time_limit_s": 3.0})
    pid_file = tmp_path / "replay.pid"
    _driver(monkeypatch, _sleeper(pid_file))
    from steady.worker.agent.localize_job import LocalizationExecution

    execution = LocalizationExecution(agent, lease)
    execution.start()
    wait_until(lambda: pid_file.exists() and pid_file.read_text(), 30, 0.05, "the stand-in replay to start")
    replay = int(pid_file.read_text())
    assert _alive(replay)
    if how == "cancel":
        r = api.post(f"/api/v1/localization-jobs/{lease.job_id}/cancel")
        assert r.status_code == 200 and r.json()["cancel_requested"] is True
    started = time.monotonic()
    assert execution.finished.wait(30), "the job did not end"
    assert time.monotonic() - started < 20
    wait_until(lambda: not _alive(replay), 10, 0.05, "the replay below the driver to end")
    job = _job(api, lease.job_id)
    if how == "cancel":
        assert job["status"] == "cancelled", job
    else:
        assert job["status"] == "failed" and "time limit (3 s)" in job["error"], job
    assert json.dumps(job)  # the job's page data stays plain JSON
