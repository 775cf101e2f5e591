"""A study run by a Slurm job array on a real one-node Slurm cluster (slurm-wlm + munge, loopback).

The test starts munged, slurmctld and slurmd itself (see ``slurm_cluster.py``), submits the
array with ``steady launch slurm``, cancels one array task while it executes a run, and checks
that the study still completes with every step stored exactly once. Skipped only where the
Debian packages are not installed (``make setup`` installs them).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.conftest import REPO, create_pg_database, drop_pg_database, pg_url_for, wait_until
from tests.engines.slurm_cluster import SlurmCluster, missing_binaries
from steady.worker.contract.protocol import Series

pytestmark = [pytest.mark.slow, pytest.mark.postgres]
STEPS = 200
# A training script that takes a known time (about 6 s a run), so the test can cancel a task
# while its run is in the middle, whatever the machine's speed. It is pure Python, so the study runs it as
# framework: python: under torch each of its 7 runs would import torch for nothing (about 1 CPU-s a run).
TRAIN = f"""
import time
from steady import sdk
for step in range({STEPS}):
    sdk.log(step=step, loss=1.0 / (step + 1))
    time.sleep(0.03)
"""


@pytest.fixture(scope="session")
def slurm(tmp_path_factory) -> Iterator[SlurmCluster]:
    missing = missing_binaries()
    if missing:
        pytest.skip(f"Slurm is not installed here (missing {', '.join(missing)}): "
                    "apt-get install slurm-wlm munge, or make setup")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except Exception:
        cluster.stop()
        raise
    yield cluster
    cluster.stop()


@pytest.fixture
def pg_database(pg_template) -> Iterator[str]:
    name = create_pg_database(template=pg_template)
    yield pg_url_for(name)
    drop_pg_database(name)


def steady(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "steady.server.cli", *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


def _series(http, run_id: int, key: str) -> tuple[list[int], list[float]]:
    r = http.get(f"/api/v1/runs/{run_id}/metrics/{key}", params={"format": "packed"})
    assert r.status_code == 200, r.text
    body = r.json()
    return Series(key=key, steps_b64=body["steps_b64"], values_b64=body["values_b64"]).unpacked()


def _queue(slurm: SlurmCluster, job_id: str) -> dict[str, str]:
    """Array task id -> state, for the tasks of one array still known to squeue."""
    out = slurm.run("squeue", "-h", "-r", "-j", job_id, "-o", "%i %T", check=False).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def test_study_completes_through_a_job_array_and_survives_a_cancelled_task(
    slurm, live_server_factory, pg_database, tmp_path
):
    server = live_server_factory(pg_database, lease_seconds=5, heartbeat_seconds=1, reaper_interval_seconds=1)
    http = server.client()
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    r = http.post("/api/v1/studies", json={
        "name": "slurm-array", "metrics": ["loss"], "threads": 1,
        "workload": {"framework": "python", "entrypoint": str(script)},
        "seeds": [0, 1, 2], "repeats": 2, "determinism": ["none"], "max_attempts": 3,
    })
    assert r.status_code == 201, r.text
    study = r.json()["id"]

    env = {**slurm.env, "STEADY_SERVER": server.url, "STEADY_TOKEN": server.tokens["user"],
           "STEADY_WORKER_TOKEN": server.tokens["worker"]}
    logs = tmp_path / "slurm-logs"
    launched = steady("launch", "slurm", str(study), "--tasks", "2", "--gpus-per-task", "0", "--cpus-per-task", "1",
                      "--output-dir", str(logs), "--grace", "0", "--worker-arg=--poll-max=1", env=env)
    assert launched.returncode == 0, launched.stderr
    job_id = launched.stdout.strip().splitlines()[-1]
    assert job_id.isdigit(), launched.stdout
    status = steady("status", str(study), env=env)
    assert status.returncode == 0 and f"slurm job {job_id}" in status.stdout, status.stdout + status.stderr

    def task_logs() -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(logs.glob("*.out")))

    def runs() -> list[dict]:
        return http.get(f"/api/v1/studies/{study}/runs", params={"limit": 100}).json()["items"]

    # One array task executes a run that has made progress, far from its end: cancel that task.
    # (--grace 0: its agent releases the run at once instead of letting it finish.)
    victim = wait_until(
        lambda: next((r for r in runs() if r["status"] == "running" and 20 < (r["progress_step"] or 0) < STEPS // 2
                      and (r["engine"] or {}).get("job_id", "").startswith(f"{job_id}_")), None),
        180, 0.2, f"a run executing in an array task\n{task_logs()}\n{slurm.logs()}")
    task = victim["engine"]["job_id"]
    assert victim["engine"]["engine"] == "slurm" and victim["engine"]["node"] == slurm.node
    slurm.run("scancel", task)
    wait_until(lambda: task not in _queue(slurm, job_id), 60, 0.2, f"task {task} to leave the queue")

    wait_until(lambda: http.get(f"/api/v1/studies/{study}").json()["status"] == "completed", 300, 0.5,
               f"the study to complete\n{task_logs()}")
    # The surviving task finds nothing left and exits: the array ends with the study.
    wait_until(lambda: not _queue(slurm, job_id), 60, 0.5, f"the array to finish\n{task_logs()}")

    items = runs()
    assert len(items) == 6 and all(r["status"] == "completed" for r in items), items
    rerun = next(r for r in items if r["id"] == victim["id"])
    assert rerun["engine"]["job_id"] != task, "the cancelled task's run was finished by the other task"
    assert rerun["engine"]["job_id"].startswith(f"{job_id}_")
    for r in items:
        steps, values = _series(http, r["id"], "loss")
        assert steps == list(range(STEPS)), f"run {r['id']}: missing or duplicate steps"
        assert values == [1.0 / (s + 1) for s in steps]
    page = http.get(f"/runs/{victim['id']}")
    assert page.status_code == 200 and f"slurm {rerun['engine']['job_id']}" in page.text
    assert "released back to the queue" in task_logs() or "lease lost" in task_logs()
