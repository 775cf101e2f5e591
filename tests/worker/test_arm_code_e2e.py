"""Arms that differ by code, end to end: ``steady submit`` packs each arm's folder, a real worker runs
each arm's own code (and the study's code for an arm without any), and the report names the code
difference. And ``steady check SPEC`` ships a command workload's code as ``submit`` does."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from steady.server.reports.models import Report
from steady.server.cli.render import render_report
from tests.worker.test_worker_agent_e2e import runs, series, workers  # noqa: F401 - workers is a fixture

pytestmark = pytest.mark.slow

TRAIN = """
    import argparse
    from steady import sdk

    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int)
    p.parse_args()
    for step in range(3):
        sdk.log(step=step, loss={base} + step / 4)
"""

SPEC = """
    name: {name}
    workload:
      framework: python  # the code imports no framework: the shim seeds Python and NumPy
      command: ["python", "train.py", "--seed", "{{seed}}"]
    seeds: [0]
    determinism: [seeded]
    max_attempts: 1
    metrics: [{{name: loss, margin: 0.1}}]
"""


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())


def _steady(server, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEADY_")}
    env.update(XDG_CONFIG_HOME=str(cwd / ".config"), NO_COLOR="1")
    return subprocess.run([sys.executable, "-m", "steady.server.cli", *args, "--server", server.url,
                           "--token", server.tokens["user"]],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)


def _git(root: Path) -> str:
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "arms"], cwd=root, check=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                          check=True).stdout.strip()


def _study_id(out: str, proc: subprocess.CompletedProcess) -> int:
    assert "submitted study " in out, proc.stdout + proc.stderr
    return int(out.split("submitted study ")[1].split()[0])


def test_each_arm_runs_its_own_code(live_server, workers, tmp_path):  # noqa: F811 - the fixture
    proj = tmp_path / "proj"
    _write(proj / "exp" / "arm_a" / "train.py", TRAIN.format(base=1.0))
    _write(proj / "exp" / "arm_b" / "train.py", TRAIN.format(base=2.0))
    _write(proj / "exp" / "train.py", TRAIN.format(base=3.0))  # the study's code, for arm c
    _write(proj / "exp" / "spec.yaml", textwrap.dedent(SPEC.format(name="code arms")) + textwrap.dedent("""
        arms:
          - {name: a, code: arm_a}
          - {name: b, code: arm_b}
          - {name: c, params: {note: study code}}
    """))
    head = _git(proj)
    (tmp_path / "worker-home").mkdir()
    w = workers(live_server, "w1", cwd=tmp_path / "worker-home")

    done = _steady(live_server, proj / "exp", "submit", "spec.yaml", "--wait")
    sid = _study_id(done.stdout, done)
    assert "arm a code " in done.stdout and "arm b code " in done.stdout, done.stdout
    http = live_server.client()
    study = http.get(f"/api/v1/studies/{sid}").json()
    assert study["status"] == "completed", done.stdout + done.stderr + w.log()
    arm_code = {a["name"]: a.get("code") for a in study["spec"]["arms"]}
    a, b = arm_code["a"]["sha256"], arm_code["b"]["sha256"]
    assert a != b and arm_code["a"]["git_commit"] == head and arm_code["c"] is None
    assert study["code_sha256"] not in (a, b) and study["spec"]["code"]["workdir"] == "exp"

    # each arm's run logged its own code's values: the worker ran the arm's archive
    finals = {r["stack"]: series(http, r["id"], "loss") for r in runs(http, sid)}
    assert finals == {"a": ([0, 1, 2], [1.0, 1.25, 1.5]), "b": ([0, 1, 2], [2.0, 2.25, 2.5]),
                      "c": ([0, 1, 2], [3.0, 3.25, 3.5])}, w.log()

    report = http.get(f"/api/v1/studies/{sid}/report").json()
    differ = {v["group"]["candidate_stack"]: v["group"]["differ_by"] for v in report["verdicts"]
              if v["level"] == "stack_portability"}
    git = f"(git {head[:10]})"
    assert differ["b"] == [f"code (sha256:{a[:12]}… {git} vs sha256:{b[:12]}… {git})"], differ
    assert differ["c"][-1] == f"code (sha256:{a[:12]}… {git} vs sha256:{study['code_sha256'][:12]}… {git})", differ
    assert f"arms differ by: code (sha256:{a[:12]}" in render_report(Report.model_validate(report))


def test_check_ships_the_code_of_a_command_spec(live_server, workers, tmp_path):  # noqa: F811 - the fixture
    _write(tmp_path / "chk" / "train.py", TRAIN.format(base=5.0))
    _write(tmp_path / "chk" / "spec.yaml", SPEC.format(name="checked code"))
    (tmp_path / "worker-home").mkdir()
    w = workers(live_server, "w1", cwd=tmp_path / "worker-home")

    checked = _steady(live_server, tmp_path / "chk", "check", "spec.yaml", "--max-code-mb", "1")
    assert checked.returncode in (0, 2), checked.stdout + checked.stderr + w.log()  # 2: one seed is inconclusive
    assert "code " in checked.stderr and "submitted study" in checked.stderr, checked.stderr
    http = live_server.client()
    sid = _study_id(checked.stderr, checked)
    study = http.get(f"/api/v1/studies/{sid}").json()
    assert study["status"] == "completed" and len(study["code_sha256"]) == 64, study
    (run,) = runs(http, sid)
    assert series(http, run["id"], "loss") == ([0, 1, 2], [5.0, 5.25, 5.5])
