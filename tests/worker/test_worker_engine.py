"""The agent in a batch job: which engine job it runs in, and when it stops by itself."""

from __future__ import annotations

import json

import httpx

from steady.worker.agent.loop import Agent, AgentConfig
from steady.worker.agent.client import SteadyClient
from steady.worker.agent.engine import detect


def test_detects_a_slurm_array_task():
    job = detect({"SLURM_JOB_ID": "4243", "SLURM_ARRAY_JOB_ID": "4242", "SLURM_ARRAY_TASK_ID": "1",
                  "SLURMD_NODENAME": "gpu07", "CUDA_VISIBLE_DEVICES": "2", "SLURM_JOB_PARTITION": "a100"})
    assert job is not None and (job.engine, job.job_id, job.node) == ("slurm", "4242_1", "gpu07")
    assert job.detail == {"job_id": "4243", "array_job_id": "4242", "array_task_id": "1",
                          "partition": "a100", "cuda_visible_devices": "2"}


def test_detects_a_plain_slurm_job_and_a_kubernetes_pod():
    assert detect({"SLURM_JOB_ID": "77", "SLURMD_NODENAME": "n1"}).job_id == "77"
    pod = detect({"STEADY_POD_NAME": "steady-study-3-2-x7k", "STEADY_POD_NAMESPACE": "ml",
                  "STEADY_NODE_NAME": "gke-a100-1", "JOB_COMPLETION_INDEX": "2", "STEADY_JOB_NAME": "steady-study-3"})
    assert (pod.engine, pod.job_id, pod.node) == ("kubernetes", "steady-study-3-2-x7k", "gke-a100-1")
    assert pod.detail == {"namespace": "ml", "completion_index": "2", "job_name": "steady-study-3"}
    assert detect({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "pod-a"}).job_id == "pod-a"
    assert detect({"HOSTNAME": "laptop"}) is None


class Server:
    """Answers registration, then 204 (nothing to lease) with the given pending counts."""

    def __init__(self, pending: list[int]) -> None:
        self.pending = list(pending)
        self.requests: list[tuple[str, dict]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests.append((request.url.path, body))
        if request.url.path.endswith("/register"):
            return httpx.Response(200, json={"worker_id": 5, "name": body["name"], "labels": body["labels"],
                                             "lease_seconds": 60, "heartbeat_seconds": 10})
        return httpx.Response(204, headers={"X-Steady-Pending": str(self.pending.pop(0))})

    def leases(self) -> list[dict]:
        return [b for path, b in self.requests if path.endswith("/lease")]


def _agent(server: Server, tmp_path, **config) -> Agent:
    cfg = AgentConfig(server="http://x", token="t", name="a", work_dir=str(tmp_path), poll_min_s=0.001,
                      poll_max_s=0.002, **config)
    return Agent(cfg, client=SteadyClient("http://x", "t", transport=httpx.MockTransport(server)))


def test_exit_when_idle_waits_while_runs_of_the_study_run_elsewhere(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "8")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    server = Server([2, 1, 1, 0])
    assert _agent(server, tmp_path, study_id=3, exit_when_idle=True).run() == 0
    assert server.pending == []  # polled until nothing was left, and no further
    bodies = server.leases()
    assert all({k: v for k, v in b.items() if k != "request_id"} == {"worker_id": 5, "study_id": 3,
                                                                    "run_credential": True} for b in bodies)
    assert len({b["request_id"] for b in bodies}) == len(bodies)  # each lease call has its own request id
    registration = server.requests[0][1]
    assert registration["engine"]["engine"] == "slurm" and registration["engine"]["job_id"] == "8_1"


def test_once_asks_once(tmp_path):
    server = Server([3, 3])
    assert _agent(server, tmp_path, once=True).run() == 0
    (body,) = server.leases()
    # no study: the field is left out (older servers forbid it); the run credential is asked for
    assert body.keys() == {"worker_id", "request_id", "run_credential"}


def test_exit_when_idle_keeps_polling_an_old_server_that_does_not_say(tmp_path, monkeypatch):
    for name in ("SLURM_JOB_ID", "STEADY_POD_NAME", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)
    answers = iter([None, None, 0])

    class OldServer(Server):
        def __call__(self, request: httpx.Request) -> httpx.Response:
            response = super().__call__(request)
            if request.url.path.endswith("/lease"):
                value = next(answers)
                return httpx.Response(204, headers={} if value is None else {"X-Steady-Pending": str(value)})
            return response

    server = OldServer([9, 9, 9])
    assert _agent(server, tmp_path, exit_when_idle=True).run() == 0
    assert len(server.leases()) == 3
    assert "engine" not in server.requests[0][1]  # not in a batch job: nothing sent
