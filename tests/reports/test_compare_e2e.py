"""``steady compare`` on a user's own script, as a user drives it: a small argparse script in a git
folder (``--seed {seed} --lr X``, prints ``step N loss X`` with four decimals) submitted three times
through the CLI: as it is and with ``--lr`` changed in the spec (both run by a real worker), and with
a change to one code file (compared by what it would run, never run). Compare names the argument and
the file, never blames ``numerics``, never says "code differs" for a changed spec, judges the spec's
metric with the spec's margin, and counts the difference of stdout-parsed values in printed decimals,
not ULPs."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.conftest import run_cli_in_process
from tests.reports.test_report_e2e import _wait_done
from tests.worker.test_worker_agent_e2e import Worker

TRAIN = """
    # Fits w to 3 by noisy gradient steps; seeds itself from --seed. Pure Python.
    import argparse
    import random

    from model import init

    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args()
    rng = random.Random(args.seed)
    w = init(rng)
    for step in range(6):
        w -= args.lr * (2 * (w - 3.0) + rng.gauss(0, 0.5))
        print(f"step {step} loss {(w - 3.0) ** 2:.4f}")
"""

MODEL = """
    def init(rng):
        return rng.uniform(-1.0, 1.0){extra}
"""

SPEC = """
    name: lr {lr}
    workload:
      framework: python
      command: ["python", "train.py", "--seed", "{{seed}}", "--lr", "{lr}"]
    seeds: [0, 1]
    determinism: [seeded]
    max_attempts: 1
    metrics: [{{name: loss, margin: 0.5}}]
"""


def _write(path: Path, text: str) -> None:
    path.write_text(textwrap.dedent(text).lstrip())


def _commit(root: Path, message: str) -> None:
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", message], cwd=root, check=True)


def test_compare_names_the_argument_and_the_file_that_differ(live_server, tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=proj, check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEADY_")}
    env.update(XDG_CONFIG_HOME=str(tmp_path / ".config"), NO_COLOR="1", STEADY_SERVER=live_server.url,
               STEADY_TOKEN=live_server.tokens["user"])

    def submit() -> int:
        _commit(proj, "next")
        done = run_cli_in_process("submit", "study.yaml", env=env, cwd=proj)
        assert done.returncode == 0, done.stdout + done.stderr
        return int(done.stdout.split("submitted study ")[1].split()[0])

    _write(proj / "train.py", TRAIN)
    _write(proj / "model.py", MODEL.format(extra=""))
    _write(proj / "study.yaml", SPEC.format(lr=0.05))
    first = submit()
    _write(proj / "study.yaml", SPEC.format(lr=0.1).replace("lr 0.1", "lr 0.05"))  # only the argument changes
    lr = submit()
    _write(proj / "study.yaml", SPEC.format(lr=0.05))
    _write(proj / "model.py", MODEL.format(extra=" * 2.0"))
    code = submit()  # compared by what it would run: cancelled before any worker runs it
    assert run_cli_in_process("cancel", str(code), env=env, cwd=proj).returncode == 0

    (tmp_path / "worker-home").mkdir()
    worker = Worker(live_server, tmp_path, "compare-worker", cwd=tmp_path / "worker-home")
    try:
        with live_server.client() as http:
            _wait_done(http, [first, lr], timeout=600)
    finally:
        worker.stop()

    out = run_cli_in_process("compare", str(first), str(lr), env=env, cwd=proj)
    assert out.returncode in (0, 1), out.stdout + out.stderr
    text = out.stdout
    assert "--lr: 0.05 → 0.1" in text, text
    assert "spec file study.yaml changed" in text and "code differs" not in text, text
    assert "source: numerics" not in text and "both stacks" not in text, text
    assert "attributed to that, not to numerics" in text, text
    assert "ULPs" not in text and "in the last printed digit, 0.0001" in text, text
    # the spec's metric with the spec's margin (no --metric, no --margin given)
    assert "final loss, margin 0.5 (from the spec)" in text, text

    as_json = run_cli_in_process("compare", str(first), str(lr), "--json", env=env, cwd=proj)
    from steady.server.reports.models import Compare

    c = Compare.model_validate_json(as_json.stdout)
    assert [(d.kind, d.name, d.baseline, d.candidate) for d in c.differences if d.kind != "spec_file"] == [
        ("command", "--lr", "0.05", "0.1")], c.differences
    assert c.code.differs is False and c.code.spec_files == ["study.yaml"]
    assert c.metrics[0].name == "loss" and c.metrics[0].margin == 0.5 and c.metrics[0].margin_from == "spec"
    (v,) = [v for v in c.verdicts if v.metric == "loss"]
    assert v.same_seed.n_pairs == 2 and v.same_seed.source == "setup" and v.same_seed.max_ulps is None
    assert v.same_seed.resolution == pytest.approx(1e-4)

    files = run_cli_in_process("compare", str(first), str(code), env=env, cwd=proj)
    assert "code model.py: sha256:" in files.stdout, files.stdout
    assert "train.py" not in files.stdout and "--lr" not in files.stdout and "spec file" not in files.stdout, files.stdout
    assert "not to numerics" in files.stdout, files.stdout
    files_json = Compare.model_validate_json(
        run_cli_in_process("compare", str(first), str(code), "--json", env=env, cwd=proj).stdout)
    assert files_json.code.changed_files == ["model.py"] and files_json.code.note == "code differs in 1 file(s): model.py"
