"""`steady fleet check` against a live server and real worker agents: four healthy workers and one worker per
planted fault (STEADY_FAULT: a bit flip now and then, a wrong kernel, another reduction order, a slow device),
the built-in canary run twice on each. Every numerics fault is named under its stack group, with the step its
runs part at; the slow worker is named under step time only, not as a numerics fault; no healthy worker is
named; the command exits 1 (a check failed), as `steady check` would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from steady.server.reports.models import Report
from tests.conftest import REPO, run_cli_in_process, wait_until
from tests.gitfolder import user_env

pytestmark = pytest.mark.slow

# The bit flip at p = 0.3 per layer call: a flip in the hidden layer changes nothing when ReLU zeroes its element, so
# at p = 0.1 one run in about 40 of the canary's 24 steps met no flip that counts and agreed with the majority
# ((1 - 0.05)(1 - 0.1))^24 = 0.023; at 0.3, ((1 - 0.15)(1 - 0.3))^24 < 1e-5, and every flip run differs.
FAULTS = {"flip": "bitflip:p=0.3", "kernel": "wrong_kernel", "order": "reduction_order", "slow": "slow:s=0.05"}


@pytest.fixture
def agents(tmp_path):
    started: list[subprocess.Popen] = []

    def start(server, name: str, fault: str | None = None) -> None:
        env = {**os.environ, "STEADY_TOKEN": server.tokens["worker"]}
        env.pop("STEADY_FAULT", None)
        if fault:
            env["STEADY_FAULT"] = fault
        log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 - the agent's whole life
        started.append(subprocess.Popen(
            [sys.executable, "-m", "steady.worker", "--server", server.url, "--name", name, "--device", "cpu",
             "--poll-max", "0.5", "--grace", "5", "--work-dir", str(tmp_path / name)],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env))

    yield start
    for p in started:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in started:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_fleet_check_names_each_planted_fault_and_no_healthy_worker(live_server, agents, tmp_path: Path):
    tag = uuid.uuid4().hex[:6]
    healthy = [f"ok{i}-{tag}" for i in range(4)]
    faulty = {kind: f"{kind}-{tag}" for kind in FAULTS}
    for name in healthy:
        agents(live_server, name)
    for kind, name in faulty.items():
        agents(live_server, name, FAULTS[kind])
    names = set(healthy) | set(faulty.values())
    with live_server.client("admin") as http:
        wait_until(lambda: names <= {w["name"] for w in http.get("/api/v1/workers", params={"limit": 500})
                                     .json()["items"]}, 120, 0.5, "the agents to register")

    result = run_cli_in_process("fleet", "check", "--repeats", "2", "--workers", *sorted(names),
                                env=user_env(live_server, tmp_path))
    assert result.returncode == 1, result.stdout + result.stderr
    sid = int(result.stdout.split()[2].rstrip(":"))
    with live_server.client() as http:
        report = Report.model_validate(http.get(f"/api/v1/studies/{sid}/report").json())
    fleet = report.fleet
    assert fleet is not None and not fleet.missing
    (group,) = fleet.groups  # one machine: one stack fingerprint
    named = {f.worker: f for f in group.findings}
    assert set(named) == {faulty["flip"], faulty["kernel"], faulty["order"]}, result.stdout
    assert named[faulty["kernel"]].kind == "consistent" and named[faulty["order"]].kind == "consistent"
    assert named[faulty["kernel"]].first_step == 0  # the first forward pass is already wrong
    assert [s.worker for s in fleet.slow] == [faulty["slow"]]
    assert group.majority_runs == 2 * (len(healthy) + 1)  # the slow worker's numbers agree with the healthy ones
    for name in healthy:  # listed among the group's workers, never named
        assert f"worker {name}" not in result.stdout and f"{name}:" not in result.stdout
    assert f"worker {faulty['slow']} is slow, not wrong" in result.stdout
    assert "What it could miss" in result.stdout
