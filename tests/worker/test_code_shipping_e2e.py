"""Bring your own code: `steady submit` ships a git repo's code; a worker elsewhere runs it.

A real ``steady serve`` and ``steady worker``, each in its own temporary directory, and a fresh
git repository in a third: relative entrypoints, ``def main(ctx)``, a command workload that logs
through the SDK, a missing file refused at submit, a failing run and a misspelt metric explained.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.worker.test_worker_agent_e2e import runs, series, workers  # noqa: F401 - workers is a fixture

pytestmark = pytest.mark.slow

FILES = {
    "exp/helper.py": "def scale(x):\n    return x / 2\n",
    "exp/train.py": """
        import numpy as np
        from helper import scale

        def main(ctx):
            rng = ctx.numpy_rng()
            for step in range(5):
                ctx.log(step=step, loss=scale(float(rng.random())), acc=step / 5)
    """,
    "exp/cmd_train.py": """
        import argparse, os
        from steady import sdk

        p = argparse.ArgumentParser()
        p.add_argument("--seed", type=int)
        p.add_argument("--device")
        a = p.parse_args()
        assert os.path.exists("helper.py"), os.getcwd()
        for step in range(3):
            sdk.log(step=step, loss=a.seed + step * 0.5)
    """,
    "exp/los.py": "def main(ctx):\n    ctx.log(step=0, los=1.0, acc=0.5)\n",
    "exp/boom.py": "def main(ctx):\n    raise RuntimeError('boom from user code')\n",
}


def _spec(path: Path, name: str, workload: str) -> Path:
    path.write_text(textwrap.dedent(f"""
        name: {name}
        workload:
          framework: python  # the code imports no framework: the shim seeds Python and NumPy
          {workload}
        seeds: [3]
        determinism: [seeded]
        max_attempts: 1
        metrics: [loss]
    """))
    return path


SPECS = {
    "missing": "entrypoint: nope.py",
    "main": "entrypoint: train.py",
    "cmd": 'command: ["python", "cmd_train.py", "--seed", "{seed}", "--device", "{device}"]',
    "boom": "entrypoint: boom.py",
    "los": "entrypoint: los.py",
}


def _git_repo(root: Path) -> Path:
    for name, text in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text).lstrip())
    for name, workload in SPECS.items():
        _spec(root / "exp" / f"{name}.yaml", name, workload)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "study code"], cwd=root, check=True)
    return root / "exp"


def _submit(server, spec: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEADY_")}
    env.update(XDG_CONFIG_HOME=str(spec.parent / ".config"))
    return subprocess.run(
        [sys.executable, "-m", "steady.server.cli", "submit", str(spec.name), "--server", server.url,
         "--token", server.tokens["user"], *extra],
        cwd=spec.parent, env=env, capture_output=True, text=True, timeout=300, check=False,
    )


def test_shipped_code_runs_on_a_worker_elsewhere(live_server, workers, tmp_path):  # noqa: F811 - the fixture
    http = live_server.client()
    (tmp_path / "proj").mkdir()
    exp = _git_repo(tmp_path / "proj")
    (tmp_path / "worker-home").mkdir()
    w = workers(live_server, "w1", cwd=tmp_path / "worker-home")

    # a missing file is refused before anything is uploaded or queued
    missing = _submit(live_server, exp / "missing.yaml")
    assert missing.returncode == 3 and "nope.py is not in the code" in missing.stderr, missing.stderr

    # bare train.py defining main(ctx), with a sibling import, relative to the spec's folder
    done = _submit(live_server, exp / "main.yaml", "--wait")
    assert done.returncode in (0, 2), done.stdout + done.stderr + w.log()
    sid = int(done.stdout.split("submitted study ")[1].split()[0])
    study = http.get(f"/api/v1/studies/{sid}").json()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=exp, capture_output=True, text=True, check=True).stdout.strip()
    assert study["code_git_commit"] == head and study["code_dirty"] is False and len(study["code_sha256"]) == 64
    assert study["spec"]["code"]["workdir"] == "exp"
    run = runs(http, sid)[0]
    steps, values = series(http, run["id"], "loss")
    assert steps == [0, 1, 2, 3, 4] and all(0 <= v < 0.5 for v in values)

    # a command workload using the SDK; the determinism shim ran in-process
    cmd = _submit(live_server, exp / "cmd.yaml", "--wait")
    assert cmd.returncode in (0, 2), cmd.stdout + cmd.stderr + w.log()
    cid = int(cmd.stdout.split("submitted study ")[1].split()[0])
    run = runs(http, cid)[0]
    assert series(http, run["id"], "loss") == ([0, 1, 2], [3.0, 3.5, 4.0])
    assert run["final_metrics"]["loss"] == 4.0
    assert run["determinism_applied"]["seed"] == 3 and run["determinism_applied"]["numpy_seeded"]
    assert run["fingerprint"], "the shim records the fingerprint"
    assert http.get(f"/api/v1/studies/{cid}").json()["code_sha256"] == study["code_sha256"]  # uploaded once, reused
    compare = http.get("/api/v1/compare", params={"baseline": sid, "candidate": cid}).json()
    assert compare["code"]["differs"] is False

    # a failing run: --wait names its error, the dashboard, and `steady logs` shows the traceback
    boom = _submit(live_server, exp / "boom.yaml", "--wait")
    assert boom.returncode == 1
    assert "boom from user code" in boom.stderr and f"{live_server.url}/studies/" in boom.stderr, boom.stderr
    bid = int(boom.stdout.split("submitted study ")[1].split()[0])
    run_id = runs(http, bid)[0]["id"]
    env = {**os.environ}
    base = ["--server", live_server.url, "--token", live_server.tokens["user"]]
    logs = subprocess.run([sys.executable, "-m", "steady.server.cli", "logs", str(run_id), *base], env=env,
                          capture_output=True, text=True, cwd=tmp_path, check=False)
    assert "Traceback" in logs.stdout and "RuntimeError: boom from user code" in logs.stdout, logs.stdout
    table = subprocess.run([sys.executable, "-m", "steady.server.cli", "runs", str(bid), *base], env=env,
                           capture_output=True, text=True, cwd=tmp_path, check=False)
    assert f"{run_id}" in table.stdout and "failed" in table.stdout and "RuntimeError: boom" in table.stdout

    # a misspelt metric: the study fails, naming what was logged instead
    (exp / "helper.py").write_text(FILES["exp/helper.py"] + "# edited\n")  # other code: a dirty tree
    los = _submit(live_server, exp / "los.yaml", "--wait")
    assert los.returncode == 1
    lid = int(los.stdout.split("submitted study ")[1].split()[0])
    study = http.get(f"/api/v1/studies/{lid}").json()
    assert study["status"] == "failed"
    assert "metric 'los' was logged where the spec names 'loss'; runs logged: acc, los" in study["status_reason"]
    assert "'los'" in los.stderr
    assert study["code_dirty"] is True and study["code_sha256"] != http.get(f"/api/v1/studies/{sid}").json()["code_sha256"]
    compare = http.get("/api/v1/compare", params={"baseline": sid, "candidate": lid}).json()
    # named file by file: the one edited file, not "code differs"
    assert compare["code"]["differs"] and compare["code"]["changed_files"] == ["exp/helper.py"], compare["code"]
    assert compare["code"]["note"] == "code differs in 1 file(s): exp/helper.py"
