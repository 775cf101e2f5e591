"""``steady launch`` as a user drives it, against what a careless or hostile input does: a path with a
newline, a study name with terminal escapes, another user's study."""

from __future__ import annotations

import os
import stat

import httpx
import pytest

from tests.api.helpers import spec
from tests.conftest import run_cli_in_process
from steady.server.cli.launch import launch_lines


@pytest.mark.parametrize("option", [
    ["--output-dir", "/tmp/logs\n#SBATCH --wrap=touch /tmp/pwned"],
    ["--sbatch-option", "--qos=high\nrm -rf ~"],
    ["--agent-command", "steady worker\r\ncurl evil"],
    ["--worker-arg=--labels=a\x1b[2J"],
])
def test_a_control_character_in_a_path_or_option_is_refused_before_any_script(tmp_path, option):
    """A newline in --output-dir once started a line of its own in the batch script (a directive or a command)."""
    r = run_cli_in_process("launch", "slurm", "42", "--server", "http://steady:8080", "--tasks", "2", *option,
                           "--dry-run", env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)}, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == "" and option[0].split("=")[0] in r.stderr and "control characters" in r.stderr


@pytest.fixture
def fake_sbatch(tmp_path):
    """An ``sbatch`` that records each call and answers a job id, first on PATH."""
    bindir, calls = tmp_path / "bin", tmp_path / "sbatch-calls"
    bindir.mkdir()
    script = bindir / "sbatch"
    script.write_text(f'#!/bin/sh\necho "$@" >> {calls}\necho 4242\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{bindir}:{os.environ['PATH']}", "HOME": str(tmp_path)}, calls


def test_launch_asks_the_server_before_sbatch_and_prints_the_study_name_escaped(live_server, tmp_path, fake_sbatch):
    env, calls = fake_sbatch
    with httpx.Client(base_url=live_server.url, headers={"Authorization": f"Bearer {live_server.tokens['user']}"}, timeout=30) as http:
        made = http.post("/api/v1/studies", json=spec(name="evil\x1b]0;owned\x07\x1b[2Jname", seeds=[0], repeats=1,
                                                      determinism=["seeded"]))
        assert made.status_code == 201, made.text
        sid = made.json()["id"]
        assert http.post(f"/api/v1/studies/{sid}/cancel").status_code == 200  # no worker of another test takes it
    common = ("launch", "slurm", str(sid), "--server", live_server.url, "--tasks", "1", "--worker-token", "w" * 20,
              "--output-dir", str(tmp_path / "logs"))

    other = live_server.new_tokens()["user"]
    refused = run_cli_in_process(*common, "--token", other, env=env, cwd=tmp_path)
    assert refused.returncode == 1 and "403" in refused.stderr and "another user" in refused.stderr, refused.stderr
    assert not calls.exists()  # no job was submitted for a launch the server refuses

    owner = run_cli_in_process(*common, "--token", live_server.tokens["user"], env=env, cwd=tmp_path)
    assert owner.returncode == 0, owner.stderr
    assert owner.stdout == "4242\n" and calls.read_text().count("\n") == 1
    assert "evil]0;owned" in owner.stderr and "\x1b" not in owner.stderr and "\x07" not in owner.stderr


def test_status_prints_a_recorded_launch_without_terminal_escapes():
    """A launch's job id and namespace are what its owner recorded; ``steady status`` shows them to everyone."""
    (line,) = launch_lines([{"engine": "slurm", "job_id": "42\x1b[2J\x1b]0;x\x07", "tasks": 2,
                             "detail": {"namespace": "ml\x9b31m"}, "created_at": "2026-12-01T19:00:00"}])
    assert "job 42[2J]0;x  2 agent(s)  ns ml31m" in line and not any(ord(c) < 32 or 0x7f <= ord(c) <= 0x9f for c in line)


def test_launch_k8s_apply_asks_the_server_before_the_kubernetes_api(live_server, tmp_path, monkeypatch):
    """The Kubernetes side of the same rule: another user's ``launch k8s --apply`` creates no Job."""
    from steady.server.engines import kubernetes as k8s

    applied: list[str] = []
    monkeypatch.setattr(k8s, "apply", lambda launch, secret_token=None: applied.append(launch.job_name) or "uid-1")
    with httpx.Client(base_url=live_server.url, headers={"Authorization": f"Bearer {live_server.tokens['user']}"},
                      timeout=30) as http:
        made = http.post("/api/v1/studies", json=spec(name="k8s-bounds", seeds=[0], repeats=1, determinism=["seeded"]))
        assert made.status_code == 201, made.text
        sid = made.json()["id"]
        assert http.post(f"/api/v1/studies/{sid}/cancel").status_code == 200  # no worker of another test takes it
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    common = ("launch", "k8s", str(sid), "--server", live_server.url, "--parallelism", "1", "--image", "steady:x",
              "--apply")
    refused = run_cli_in_process(*common, "--token", live_server.new_tokens()["user"], env=env, cwd=tmp_path)
    assert refused.returncode == 1 and "403" in refused.stderr, refused.stderr
    assert applied == []  # no Job for a launch the server refuses
    owner = run_cli_in_process(*common, "--token", live_server.tokens["user"], env=env, cwd=tmp_path)
    assert owner.returncode == 0, owner.stderr
    assert applied == [f"steady-study-{sid}"] and owner.stdout == f"steady-study-{sid}\n"
