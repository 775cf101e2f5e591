"""``steady workers`` and ``steady schedules`` against a live server: an admin quarantines a worker by name,
the list and the history show it, a user may not; a schedule is added from a spec file, listed and deleted."""

from __future__ import annotations

import uuid

import httpx

from tests.conftest import run_cli_in_process
from tests.gitfolder import user_env


def test_an_admin_quarantines_and_releases_a_worker_by_name(live_server, tmp_path):
    name = f"gpu-{uuid.uuid4().hex[:8]}"
    r = httpx.post(f"{live_server.url}/api/v1/workers/register", headers=live_server.headers("worker"),
                   json={"name": name, "labels": ["torch"]})
    assert r.status_code == 200, r.text
    wid = r.json()["worker_id"]
    user = user_env(live_server, tmp_path)
    admin = {**user, "STEADY_TOKEN": live_server.tokens["admin"]}

    refused = run_cli_in_process("workers", "quarantine", name, "--reason", "bit flips", env=user)
    assert refused.returncode == 1 and "403" in refused.stderr
    done = run_cli_in_process("workers", "quarantine", name, "--reason", "bit flips in matmul", env=admin)
    assert done.returncode == 0, done.stderr
    assert f"worker {name} (id {wid}): quarantined since" in done.stdout and "bit flips in matmul" in done.stdout
    listed = run_cli_in_process("workers", "list", env=user)
    line = next(ln for ln in listed.stdout.splitlines() if f" {name} " in ln)
    assert "quarantined since" in line and "bit flips in matmul" in line
    released = run_cli_in_process("workers", "release", str(wid), "--reason", "card replaced", env=admin)
    assert released.returncode == 0 and "released from quarantine" in released.stdout
    again = run_cli_in_process("workers", "release", name, env=admin)
    assert again.returncode == 1 and "is not quarantined" in again.stderr
    history = run_cli_in_process("workers", "history", name, env=user).stdout.splitlines()
    assert history[0].split() == ["at", "(UTC)", "event", "what"]
    assert "released" in history[1] and "card replaced" in history[1]
    assert "quarantined" in history[2] and "bit flips in matmul" in history[2]
    missing = run_cli_in_process("workers", "history", "no-such-worker-name", env=user)
    assert missing.returncode == 1 and "no worker named 'no-such-worker-name'" in missing.stderr


def test_a_schedule_is_added_listed_and_deleted(live_server, tmp_path):
    name = f"nightly-{uuid.uuid4().hex[:8]}"
    spec = tmp_path / "fleet.yaml"
    spec.write_text("name: canary\nworkload: {framework: torch, name: torch_mlp, params: {epochs: 1}}\n"
                    "seeds: [0]\ndeterminism: [strict]\n")
    env = user_env(live_server, tmp_path)
    added = run_cli_in_process("schedules", "add", str(spec), "--daily", "02:30", "--name", name, env=env,
                               cwd=tmp_path)
    assert added.returncode == 0, added.stderr
    assert f"({name}): daily at 02:30 UTC, next at" in added.stdout
    sid = added.stdout.split()[1]
    line = next(ln for ln in run_cli_in_process("schedules", "list", env=env).stdout.splitlines() if name in ln)
    assert line.split()[:2] == [sid, name] and line.endswith("never")
    bad = run_cli_in_process("schedules", "add", str(spec), "--every", "10s", "--name", name + "x", env=env,
                             cwd=tmp_path)
    assert bad.returncode == 1 and "every" in bad.stderr and "shortest interval" in bad.stderr
    assert run_cli_in_process("schedules", "delete", sid, env=env).returncode == 0
    assert name not in run_cli_in_process("schedules", "list", env=env).stdout
