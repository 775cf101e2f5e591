"""A user's own argparse script, submitted as a command from its git folder, keeps its story: ``steady logs``
shows a completed run's output tail, its argv as run (placeholders filled), params and code; a crash's own
``RuntimeError`` line is what ``steady runs``, ``steady submit --wait`` and the study page say; and a study at
two levels gets a cost of determinism from the arrival times of its step lines (it never logs ``step_time``).

The script is pure Python (``framework: python``: no ML framework is imported into its runs, as it prints);
its step takes a fixed pause, twice as long at ``strict`` as at ``seeded``, so the measured ratio has a known answer.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

from tests.conftest import CliResult, run_cli_in_process
from tests.worker.test_worker_agent_e2e import runs, workers  # noqa: F401 - workers is a fixture

TRAIN = """
    import argparse
    import sys
    import time

    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--level", required=True)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()

    pause = 0.08 if args.level == "strict" else 0.04  # what determinism costs this "model"
    loss = 1.0 + args.seed / 100
    for step in range(args.steps):
        time.sleep(pause)
        loss *= 1 - args.lr
        print(f"step {step} loss {loss:.6f}", flush=True)
    print("\\x1b[32mtraining done\\x1b[0m")
    print(f"frameworks loaded: torch={'torch' in sys.modules} tensorflow={'tensorflow' in sys.modules}")
"""

CRASH = """
    for step in range(3):
        print(f"step {step} loss {1.0 / (step + 1):.4f}", flush=True)
    raise RuntimeError(f"loss became NaN at step {step + 1}")
"""

SPEC = """
    name: {name}
    workload:
      framework: python
      command: {command}
      params: {{lr: 0.1}}
    seeds: {seeds}
    determinism: {levels}
    threads: 1
    max_attempts: 1
    metrics: [loss]
"""


def _repo(root: Path) -> Path:
    root.mkdir()
    (root / "train.py").write_text(textwrap.dedent(TRAIN).lstrip())
    (root / "crash.py").write_text(textwrap.dedent(CRASH).lstrip())
    (root / "study.yaml").write_text(textwrap.dedent(SPEC).format(
        name="story", seeds="[7]", levels="[seeded, strict]",
        command='["python", "train.py", "--seed", "{seed}", "--level", "{determinism}", "--lr", "0.1"]'))
    (root / "crash.yaml").write_text(textwrap.dedent(SPEC).format(
        name="crash", seeds="[0]", levels="[seeded]", command='["python", "crash.py"]'))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "a user's script"], cwd=root, check=True)
    return root


def _steady(server, repo: Path, *args: str) -> CliResult:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEADY_")}
    env.update(XDG_CONFIG_HOME=str(repo / ".config"), NO_COLOR="1")
    return run_cli_in_process(*args, "--server", server.url, "--token", server.tokens["user"], env=env, cwd=repo)


def _study_id(submitted: CliResult) -> int:
    return int(submitted.stdout.split("submitted study ")[1].split()[0])


def test_a_users_script_keeps_its_story_its_crash_line_and_gets_a_cost(live_server, workers, tmp_path):  # noqa: F811
    repo = _repo(tmp_path / "proj")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    (tmp_path / "worker-home").mkdir()
    w = workers(live_server, "w1", cwd=tmp_path / "worker-home")
    http = live_server.client()

    # a crash: its RuntimeError line, not "exited with status 1", in submit --wait, runs and the study page
    crashed = _steady(live_server, repo, "submit", "crash.yaml", "--wait")
    assert crashed.returncode == 1, crashed.stdout + crashed.stderr + w.log()
    assert "failed (error): RuntimeError: loss became NaN at step 3" in crashed.stderr, crashed.stderr
    crash_sid = _study_id(crashed)
    listed = _steady(live_server, repo, "runs", str(crash_sid))
    assert "RuntimeError: loss became NaN at step 3" in listed.stdout, listed.stdout
    assert "RuntimeError: loss became NaN at step 3" in http.get(f"/studies/{crash_sid}").text

    done = _steady(live_server, repo, "submit", "study.yaml", "--wait")
    assert "submitted study" in done.stdout, done.stdout + done.stderr + w.log()
    sid = _study_id(done)
    items = runs(http, sid)
    assert len(items) == 2 and {r["status"] for r in items} == {"completed"}, (items, w.log())

    # a completed run's story: argv as run, params, code and the tail of its output, escapes stripped
    run = next(r for r in items if r["determinism"] == "strict")
    logs = _steady(live_server, repo, "logs", str(run["id"]))
    assert logs.returncode == 0, logs.stderr
    assert "train.py --seed 7 --level strict --lr 0.1" in logs.stdout, logs.stdout
    assert '"lr": 0.1' in logs.stdout
    study = http.get(f"/api/v1/studies/{sid}").json()
    assert f"code: {study['code_sha256']}, git {commit}" in logs.stdout, logs.stdout
    assert "step 11 loss " in logs.stdout and "training done" in logs.stdout
    # framework: python: the worker's shim imported no ML framework into the run (at strict too)
    assert "frameworks loaded: torch=False tensorflow=False" in logs.stdout, logs.stdout
    assert "\x1b" not in logs.stdout and "[32m" not in logs.stdout
    page = http.get(f"/runs/{run['id']}").text
    assert "--seed 7 --level strict" in page and "step 11 loss" in page and "[32m" not in page

    # the cost of determinism from step-line arrival times: strict pauses twice as long per step
    report = http.get(f"/api/v1/studies/{sid}/report").json()
    (cost,) = [c for c in report["determinism_cost"] if (c["numerator"], c["denominator"]) == ("strict", "seeded")]
    assert cost["source"] == "step_time:stdout" and cost["n_numerator"] == cost["n_denominator"] == 1
    assert 1.5 < cost["ratio"] < 2.6, cost
    shown = _steady(live_server, repo, "report", str(sid))
    assert "strict / seeded (default): ×" in shown.stdout, shown.stdout
    assert "step times from the arrival times of step lines on stdout" in shown.stdout
