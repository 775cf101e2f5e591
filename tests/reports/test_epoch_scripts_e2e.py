"""Scripts whose step counter restarts every epoch, and one that stops at a seed-dependent step, submitted as
a user does (a fresh git folder, ``steady submit --wait``, ``steady report``) and judged on the value each run
really ended on.

Three shapes of our own, pure Python (``framework: python``), 3 epochs each where they have epochs:
pytorch/examples' word_language_model lines (``| epoch 2 |    25/   29 batches | ... | loss  6.48 |``: the
batch index within the epoch) read by the ``word_language_model`` preset and by a capture pattern that names
the epoch; pytorch/examples' mnist lines (``Train Epoch: 2 [640/640 (100%)]\\tLoss: 0.123456``) read by the
``mnist`` preset; and a script that trains until its loss is below 1e-3 and prints one line, ``Loss: 0.000584
after 790 batches`` (each seed stops at its own step; at ``none`` it seeds nothing, so its repeats stop apart).
Pure-Python runs, 18 in all (about 2 minutes on a loaded 2-core machine).
The stored series are checked against the script's own output, parsed here with plain string operations.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import run_cli_in_process
from tests.worker.test_worker_agent_e2e import Worker, runs, series
from tests.gitfolder import commit_all, user_env

WLM = """
    import argparse
    import math
    import random

    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, required=True)
    args = p.parse_args()
    rng = random.Random(args.seed)
    loss = 7.0
    for epoch in range(1, 4):
        for batch in range(5, 30, 5):
            loss -= 0.05 + 0.02 * rng.random()
            print(f"| epoch {epoch:3d} | {batch:5d}/{29:5d} batches | lr 20.00 | ms/batch {1.5:5.2f} | "
                  f"loss {loss:5.2f} | ppl {math.exp(loss):8.2f}", flush=True)
        print("-" * 89)
        print(f"| end of epoch {epoch:3d} | time: {0.5:5.2f}s | valid loss {loss + 0.1:5.2f} | "
              f"valid ppl {math.exp(loss + 0.1):8.2f}")
        print("-" * 89)
    print(f"| End of training | test loss {loss + 0.12:5.2f} | test ppl {math.exp(loss + 0.12):8.2f}")
"""

MNIST = """
    import argparse
    import random

    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, required=True)
    args = p.parse_args()
    rng = random.Random(args.seed)
    loss = 2.3
    for epoch in range(1, 4):
        for batch_idx in range(0, 10, 3):
            loss *= 0.8 + 0.1 * rng.random()
            print("Train Epoch: {} [{}/{} ({:.0f}%)]\\tLoss: {:.6f}".format(
                epoch, batch_idx * 64, 640, 100.0 * batch_idx / 10, loss), flush=True)
        correct = 900 + epoch * 20 + rng.randrange(10)
        print("\\nTest set: Average loss: {:.4f}, Accuracy: {}/{} ({:.0f}%)\\n".format(
            loss * 1.1, correct, 1000, 100.0 * correct / 1000))
"""

EARLY = """
    import argparse
    import random

    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, required=True)
    args = p.parse_args()
    loss, n = 1.0, 0
    rate = 0.85 + 0.12 * random.random()  # seeds nothing itself: the worker's shim seeds it at seeded
    while loss >= 1e-3:  # 45 to 230 batches of 5 steps: two unseeded runs rarely stop at the same one
        n += 5
        loss *= rate - 0.02 * random.random()
    print(f"Loss: {loss:.6f} after {n} batches")
"""

SPEC = """
    name: {name}
    workload:
      framework: python
      command: ["python", "train.py", "--seed", "{{seed}}"]
      capture:
    {capture}
    seeds: [{seeds}]
    repeats: {repeats}
    determinism: [{levels}]
    threads: 1
    max_attempts: 1
    metrics: [{{name: loss, max_std: 1.0}}]
"""

EPOCH_PATTERN = r"'\|\s*epoch\s+(?P<epoch>\d+)\s*\|\s*(?P<step>\d+)/[^|]*batches.*\|\s*loss\s+(?P<loss>[-+.\deE]+)'"
EARLY_PATTERN = r"'Loss: (?P<loss>[-+.\deE]+) after (?P<step>\d+) batches'"


def _project(root: Path, script: str, *, name: str, capture: str, seeds: str = "1, 2, 3", repeats: int = 1,
             levels: str = "seeded") -> Path:
    root.mkdir()
    (root / "train.py").write_text(textwrap.dedent(script).lstrip())
    spec = textwrap.dedent(SPEC).lstrip().format(name=name, capture=capture, seeds=seeds, repeats=repeats,
                                                 levels=levels)
    (root / "study.yaml").write_text(spec)
    return commit_all(root)


def _submit(server, folder: Path) -> dict:
    env = user_env(server, folder)
    submit = run_cli_in_process("submit", "study.yaml", "--wait", env=env, cwd=folder)
    found = re.search(r"submitted study (\d+)", submit.stdout + submit.stderr)
    assert found, (submit.stdout, submit.stderr)
    sid = int(found.group(1))
    report = run_cli_in_process("report", str(sid), env=env, cwd=folder)
    as_json = run_cli_in_process("report", str(sid), "--json", env=env, cwd=folder)
    from steady.server.reports.models import Report

    assert as_json.stdout, (as_json.returncode, as_json.stderr, report.stdout, report.stderr)
    return {"id": sid, "report": report, "body": Report.model_validate_json(as_json.stdout)}


def _output(folder: Path, seed: int) -> list[str]:
    """The script's own output for ``seed`` (the seeded scripts print the same in every run)."""
    out = subprocess.run([sys.executable, "train.py", "--seed", str(seed)], cwd=folder, capture_output=True,
                         text=True, check=True)
    return out.stdout.splitlines()


def _field(line: str, name: str) -> float:
    """The number after ``| name`` in a word_language_model line."""
    return float(line.split(f"| {name} ")[1].split("|")[0])


def test_epochs_that_restart_the_step_and_a_run_that_stops_early(live_server, tmp_path):
    wlm = _project(tmp_path / "wlm", WLM, name="wlm-preset", capture="    preset: word_language_model")
    wlm_pattern = _project(tmp_path / "wlm-pattern", WLM, name="wlm-epoch-pattern",
                           capture=f"    patterns:\n      - {EPOCH_PATTERN}")
    mnist = _project(tmp_path / "mnist", MNIST, name="mnist-preset", capture="    preset: mnist")
    early = _project(tmp_path / "early", EARLY, name="early-stop", capture=f"    patterns:\n      - {EARLY_PATTERN}",
                     seeds="1, 2, 3, 4, 5")
    early_none = _project(tmp_path / "early-none", EARLY, name="early-stop-none",
                          capture=f"    patterns:\n      - {EARLY_PATTERN}", seeds="1, 2", repeats=2, levels="none")
    (tmp_path / "worker-home").mkdir()
    worker = Worker(live_server, tmp_path, "epoch-scripts", "--concurrency", "2", cwd=tmp_path / "worker-home")
    try:
        done = {name: _submit(live_server, folder) for name, folder in
                (("wlm", wlm), ("wlm_pattern", wlm_pattern), ("mnist", mnist), ("early", early),
                 ("early_none", early_none))}
    finally:
        worker.stop()
    http = live_server.client()

    # word_language_model, preset and a pattern naming the epoch: every printed value kept, none a conflict,
    # on one global step series; seed stability judges each run's last printed loss (epoch 3)
    for name, place in (("wlm", lambda e, b: (e - 1) * 29 + b),  # the preset: (epoch − 1) × batches per epoch + batch
                        ("wlm_pattern", lambda e, b: b + (e - 1) * 26)):  # the pattern: one past epoch's top step
        rep = done[name]["body"]
        assert rep.study.progress.completed == 3, worker.log()
        finals = {}
        for run in runs(http, done[name]["id"]):
            assert not (run.get("metric_conflicts") or {}).get("count"), run["metric_conflicts"]
            lines = [ln for ln in _output(wlm, run["seed"]) if "batches" in ln]
            want_steps = [place(int(ln.split("|")[1].split()[1]), int(ln.split("|")[2].split("/")[0])) for ln in lines]
            steps, values = series(http, run["id"], "loss")
            assert list(steps) == want_steps and list(values) == [_field(ln, "loss") for ln in lines]
            finals[run["id"]] = _field(lines[-1], "loss")
            if name == "wlm":
                end = [ln for ln in _output(wlm, run["seed"]) if "end of epoch" in ln]
                vsteps, vvalues = series(http, run["id"], "valid_loss")
                assert list(vsteps) == [1, 2, 3] and list(vvalues) == [_field(ln, "valid loss") for ln in end]
                tsteps, tvalues = series(http, run["id"], "test_loss")
                assert list(tsteps) == [3] and len(tvalues) == 1
        (seed,) = rep.of_level("seed_stability")
        assert dict(zip(seed.final_run_ids, seed.final_values)) == finals
        last = place(3, 25)
        assert seed.final_step == last and f"final values at step {last}" in seed.reason, seed.reason
        assert "conflict" not in done[name]["report"].stdout, done[name]["report"].stdout

    # mnist: the loss at the global sample count, the test set's loss and accuracy at each epoch
    rep = done["mnist"]["body"]
    assert rep.study.progress.completed == 3, worker.log()
    for run in runs(http, done["mnist"]["id"]):
        assert not (run.get("metric_conflicts") or {}).get("count"), run["metric_conflicts"]
        out = _output(mnist, run["seed"])
        train = [ln for ln in out if ln.startswith("Train Epoch")]
        steps, values = series(http, run["id"], "loss")
        want = [(int(ln.split()[2]) - 1) * 640 + int(ln.split("[")[1].split("/")[0]) for ln in train]
        assert list(steps) == want and list(values) == [float(ln.split("Loss: ")[1]) for ln in train]
        tests = [ln for ln in out if ln.startswith("Test set")]
        steps, values = series(http, run["id"], "test_accuracy")
        got = [int(ln.split("Accuracy: ")[1].split("/")[0]) / 1000 for ln in tests]
        assert list(steps) == [1, 2, 3] and list(values) == got
        steps, values = series(http, run["id"], "test_loss")
        assert list(values) == [float(ln.split("Average loss: ")[1].split(",")[0]) for ln in tests]

    # the early stopper: each run's one value at its own step; seed stability judges those values and says
    # at which steps they were taken, and no sentence reads as a comparison that did not happen
    rep = done["early"]["body"]
    assert rep.study.progress.completed == 5, worker.log()
    got = {}
    for name in ("early", "early_none"):
        for run in runs(http, done[name]["id"]):
            steps, values = series(http, run["id"], "loss")
            assert len(steps) == 1 and math.isfinite(values[0])
            got[run["id"]] = (run["determinism"], run["seed"], int(steps[0]), float(values[0]))
    (seeded,) = rep.of_level("seed_stability")
    assert seeded.spread.n == 5 and len(seeded.final_values) == 5
    assert seeded.final_values == [got[i][3] for i in seeded.final_run_ids]
    stops = sorted({got[i][2] for i in seeded.final_run_ids})
    if len(stops) > 1:
        assert f"final values at each run's last step, {stops[0]:,}–{stops[-1]:,}" in seeded.reason, seeded.reason
        assert seeded.final_step_spread is not None and seeded.final_step_spread.min == stops[0]
    # judged on each run's own last value: no advice to run more seeds (the runs share no step, and the
    # reason says only that the per-step band test could not run)
    assert "too few seeds" not in seeded.summary and "too few seeds" not in seeded.reason
    # at none it seeds nothing: each seed's two repeats stop at their own steps, and share none
    assert done["early_none"]["body"].study.progress.completed == 4, worker.log()
    (none,) = done["early_none"]["body"].of_level("repeatability")
    apart = [s for s in none.per_seed if len({got[i][2] for i in s.run_ids}) > 1]
    assert apart, "no seed's repeats stopped apart at none"
    for s in apart:
        assert s.steps_compared == 0 and "their values were not compared" in s.reason
    text = done["early"]["report"].stdout + done["early_none"]["report"].stdout
    assert "by up to 0 " not in text and "from step None" not in text, text
    if none.steps_compared == 0:
        assert "no value was compared" in none.summary, none.summary
