"""`steady bisect --property convergence` end to end: a git history of 8 commits of a tiny script whose loss
decays to the spec's convergence target (steps to target against a reference of numbers, the MLPerf rule the
study report applies). Commit 4 retunes the rate a little (still converges like the reference: judged good, the
change's parent); commit 5 lowers it so that no run reaches the target in its 12 steps (the check fails): the bisect names
commit 5, each point a study of 3 seeds judged by the report's convergence check at the plan's level."""

from __future__ import annotations

import re
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.conftest import run_cli_in_process
from tests.gitfolder import commit_next, user_env
from tests.worker.test_worker_agent_e2e import Worker

TRAIN = """
    import argparse
    import math
    import random

    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, required=True)
    seed = p.parse_args().seed
    LR = {lr}  # edit {edit}
    rate = LR * (1 + 0.1 * random.Random(seed).gauss(0.0, 1.0))
    for step in range(12):
        print(f"step {{step}} loss {{math.exp(-rate * (step + 1))!r}}", flush=True)
"""

SPEC = """
    name: decay
    workload:
      framework: python
      command: ["python", "train.py", "--seed", "{seed}"]
    seeds: [0, 1, 2]
    determinism: [seeded]
    threads: 1
    max_attempts: 1
    metrics: [loss]
    convergence:
      metric: loss
      target: 0.1
      direction: min
      reference: {mean: 4.0, std: 1.0, n: 10}
      trim: 0
"""

RETUNE, BREAK, LAST = 4, 5, 7


def _history(root: Path) -> list[str]:
    root.mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    (root / "study.yaml").write_text(textwrap.dedent(SPEC).lstrip())
    shas = []
    for i in range(LAST + 1):
        lr = 0.02 if i >= BREAK else 0.55 if i >= RETUNE else 0.5
        (root / "train.py").write_text(textwrap.dedent(TRAIN).lstrip().format(lr=lr, edit=i))
        message = {RETUNE: "retune the rate", BREAK: "lower the rate"}.get(i, f"edit {i}")
        shas.append(commit_next(root, message))
    return shas


@pytest.mark.slow
def test_the_commit_that_stops_convergence_is_named(live_server, tmp_path):
    folder = tmp_path / "project"
    shas = _history(folder)
    env = user_env(live_server, folder)
    (tmp_path / "worker-home").mkdir()
    worker = Worker(live_server, tmp_path, "conv", "--concurrency", "3", cwd=tmp_path / "worker-home")
    try:
        got = run_cli_in_process("bisect", shas[0], shas[-1], "--property", "convergence", "--budget-runs", "60",
                                 "--poll", "0.3", "--", "study.yaml", env=env, cwd=folder)
    finally:
        worker.stop()
    out, err = got.stdout, got.stderr
    assert got.returncode == 0, (out, err, worker.log())
    assert "each point's claim at level 1% (5% over the 5 points the search decides" in err, err
    assert f"first commit where convergence changed: {shas[BREAK][:10]} lower the rate" in out, out
    parent = re.search(rf"at its parent {shas[BREAK - 1][:10]}: good: pass: olympic mean \S+ steps ≥ minimum "
                       r"acceptable .*\(study (\d+), 3 runs\)", out)
    at = re.search(rf"at {shas[BREAK][:10]}: +bad: fail: 3 of 3 runs never reached the target; at most 0 may .*"
                   r"\(study (\d+), 3 runs\)", out)
    assert parent and at, out
    # the retuned commit converges like the reference: judged good, not named
    assert re.search(rf"point {RETUNE} {shas[RETUNE][:10]}: good \(study \d+, 3 runs\): pass", err), err
    with live_server.client() as c:
        study = c.get(f"/api/v1/studies/{at.group(1)}").json()
        assert study["spec"]["convergence"]["alpha"] == pytest.approx(0.01)  # the plan's level, one group
        page = c.get(f"/bisects/{shas[0][:7]}..{shas[-1][:7]}")
        assert page.status_code == 200, page.text
        assert f"First commit where convergence changed: <strong><code>{shas[BREAK][:10]}</code>" in page.text


def test_a_convergence_point_is_judged_at_its_level_over_its_groups():
    """A point's study makes one convergence check per determinism level and stack: each at α_point over them."""
    from steady.server.stats.bisect import checks_per_point

    spec = {"determinism": ["seeded", "strict"], "stacks": [{"name": "a"}, {"name": "b"}], "convergence": {}}
    assert checks_per_point("convergence", spec) == 4
    assert checks_per_point("convergence", {"convergence": {}}) == 1
