"""A new user's own script, submitted as a command from a fresh git folder, judged as a user meets it.

A tiny argparse script that seeds itself from ``--seed {seed}`` (pure-Python ``random``, ``step N loss X``
on stdout; ``framework: python``) at ``none`` and ``seeded``: every expectation met (at ``none`` Steady fixes nothing and a
correct script seeds itself), never "ignores the seed", and ``submit --wait``, ``report`` and ``check``
all exit 0. A copy with a hard-coded seed: seed stability fails with ``seed_has_no_effect`` and every
gate exits 1 with the same reason. A copy that seeds nothing (Python's global ``random``, as many scripts
do): at ``none`` its repeats differ and the report says that is what ``none`` means for it (expectation
met: Steady fixes nothing there); at ``seeded`` the worker's shim seeds it and its repeats are identical.
A real ``steady serve`` (the shared one) and a real worker: running
the user's command is the point.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from tests.conftest import run_cli_in_process
from tests.worker.test_worker_agent_e2e import Worker
from tests.gitfolder import commit_all, user_env

SCRIPT = """
    import argparse
    import random

    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--steps", type=int, default=4)
    args = p.parse_args()
    rng = random.Random({seed_expr})
    w = 1.0
    for step in range(args.steps):
        w -= 0.2 * (w - rng.gauss(0.0, 0.05))
        print(f"step {{step}} loss {{w * w:.6f}}", flush=True)
"""

SPEC = """
    name: {name}
    workload:
      framework: python
      command: ["python", "train.py", "--seed", "{{seed}}"]
    seeds: [{seeds}]
    repeats: {repeats}
    determinism: [none, seeded]
    threads: 1
    max_attempts: 1
    metrics: [{{name: loss, max_std: 1.0}}]
"""


def _project(root: Path, *, seed_expr: str | None, name: str, seeds: str, repeats: int) -> Path:
    """A fresh git folder holding the script and its spec, committed, as a user keeps them. ``seed_expr``
    None: the script draws from Python's global ``random`` and seeds nothing."""
    root.mkdir()
    script = textwrap.dedent(SCRIPT.format(seed_expr=seed_expr)).lstrip()
    if seed_expr is None:
        script = script.replace("rng = random.Random(None)", "rng = random  # the global generator, never seeded here")
    (root / "train.py").write_text(script)
    (root / "study.yaml").write_text(textwrap.dedent(SPEC.format(name=name, seeds=seeds, repeats=repeats)).lstrip())
    return commit_all(root)


def _gates(server, folder: Path) -> dict:
    """submit --wait, then report and check of the same study: exit codes, outputs and the report."""
    env = user_env(server, folder)
    submit = run_cli_in_process("submit", "study.yaml", "--wait", env=env, cwd=folder)
    found = re.search(r"submitted study (\d+)", submit.stdout + submit.stderr)
    assert found, (submit.stdout, submit.stderr)
    sid = found.group(1)
    report = run_cli_in_process("report", sid, env=env, cwd=folder)
    as_json = run_cli_in_process("report", sid, "--json", env=env, cwd=folder)
    check = run_cli_in_process("check", sid, env=env, cwd=folder)
    from steady.server.reports.models import Report

    return {"submit": submit, "report": report, "check": check, "body": Report.model_validate_json(as_json.stdout)}


def test_own_script_seeding_itself_and_a_copy_with_a_hard_coded_seed(live_server, tmp_path):
    good = _project(tmp_path / "good", seed_expr="args.seed", name="own-script", seeds="1, 2, 3, 4, 5",
                    repeats=2)
    fixed = _project(tmp_path / "fixed", seed_expr="1234", name="own-script-fixed-seed", seeds="1, 2",
                     repeats=1)
    unseeded = _project(tmp_path / "unseeded", seed_expr=None, name="own-script-unseeded", seeds="1", repeats=2)
    (tmp_path / "worker-home").mkdir()
    worker = Worker(live_server, tmp_path, "own-scripts", "--concurrency", "2", cwd=tmp_path / "worker-home")
    try:
        ok = _gates(live_server, good)
        bad = _gates(live_server, fixed)
        loose = _gates(live_server, unseeded)
    finally:
        worker.stop()

    # seeds itself from {seed}: identical at none is what none means for it; every gate passes
    rep = ok["body"]
    assert rep.study.progress.completed == 20, worker.log()
    assert [(h.determinism, h.met) for h in rep.headline] == [("seeded", True), ("none", True)], rep.headline
    assert all(not h.suspicious for h in rep.headline)
    assert {v.group.determinism: v.verdict for v in rep.of_level("repeatability")} == {"none": "identical",
                                                                                       "seeded": "identical"}
    assert {v.verdict for v in rep.of_level("seed_stability")} == {"stable"}
    assert rep.outcome.status == "pass", rep.outcome
    text = ok["report"].stdout + ok["submit"].stderr + ok["check"].stdout
    assert "ignores" not in text and "NOT met" not in text, text
    codes = (ok["submit"].returncode, ok["report"].returncode, ok["check"].returncode)
    assert codes == (0, 0, 0), (ok["check"].stdout, worker.log())

    # the hard-coded seed: runs of different seeds are bitwise identical at both levels, which fails
    rep = bad["body"]
    assert {v.verdict for v in rep.of_level("seed_stability")} == {"seed_has_no_effect"}
    assert rep.outcome.status == "fail"
    reason = rep.outcome.reason
    assert "the seed has no effect" in reason
    codes = (bad["submit"].returncode, bad["report"].returncode, bad["check"].returncode)
    assert codes == (1, 1, 1), bad["check"].stdout
    assert reason in bad["submit"].stderr and f"outcome: FAILED: {reason}" in bad["report"].stdout
    assert f"FAILED (exit 1): {reason}" in bad["check"].stdout
    with live_server.client() as c:  # the dashboard's list shows the same outcome and reason
        got = c.get("/dashboard/data/badges", params={"ids": str(rep.study.id)}).json()["badges"][str(rep.study.id)]
    assert got[0]["level"] == "outcome" and got[0]["tone"] == "bad" and got[0]["hint"] == reason

    # seeds nothing: `none` repeats differ, which is what none allows for such code (met, not a failure);
    # the shim's seeding at `seeded` makes the same code repeatable
    rep = loose["body"]
    assert rep.study.progress.completed == 4, worker.log()
    judged = {v.group.determinism: v for v in rep.of_level("repeatability")}
    assert judged["seeded"].verdict == "identical" and judged["seeded"].met_expectation is True
    none = judged["none"]
    assert none.verdict == "out_of_tolerance" and none.met_expectation is True, none
    assert none.expectation.endswith("something the code does not seed itself varies (Steady fixes nothing at none)")
    assert none.first_divergent_step == 0
    assert "NOT met" not in loose["report"].stdout, loose["report"].stdout

    # the worker's log shows each command as it ran, its placeholders filled
    started = [line for line in worker.log_path.read_text(errors="replace").splitlines() if ": started pid " in line]
    assert started and not [line for line in started if "{seed}" in line], started
    assert any(line.endswith("train.py --seed 5") for line in started), started
