"""User scripts as people publish them, submitted with ``steady submit`` from their own git folders and run
by a worker: what each gets captured, where a value logged twice shows (``steady logs``, ``steady
report``, the run page, the study page), and the verdict a script that ignores its seed gets (a hard-coded
``random.seed(1)``, a loop that draws nothing random: ``seed_has_no_effect``, a failure). One worker runs the
three studies at once; the Keras script is the one real training.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.conftest import run_cli_in_process
from tests.worker.test_conflicts import EVAL_SCRIPT
from tests.worker.test_worker_agent_e2e import runs, series, wait_for, workers  # noqa: F401 - workers is a fixture

pytestmark = pytest.mark.slow

KERAS_SCRIPT = """
    # Keras' own beginner's example, made tiny: fit() prints one line per epoch (verbose=2).
    import numpy as np
    import keras

    x = np.random.default_rng(0).random((8, 3)).astype("float32")
    y = (x.sum(1) > 1.5).astype("float32")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="sgd", loss="binary_crossentropy", metrics=["accuracy"])
    history = model.fit(x, y, epochs=2, batch_size=4, verbose=2)
    with open("history.txt", "w") as f:
        f.write(repr(history.history["loss"]))
    print("final", history.history["loss"][-1])
"""

TQDM_SCRIPT = """
    # A loop with a tqdm bar whose postfix shows the loss (drawn to stderr, redrawn with \\r).
    from tqdm import tqdm

    w = 4.0
    with tqdm(range(20), mininterval=0, ascii=True) as bar:
        for step in bar:
            w -= 0.2 * w
            bar.set_postfix(loss=w * w)
"""


def _project(root: Path, script: str, workload: str, seeds: str = "[1]") -> Path:
    root.mkdir(parents=True)
    (root / "train.py").write_text(textwrap.dedent(script).lstrip())
    (root / "study.yaml").write_text(textwrap.dedent(f"""
        name: {root.name}
        workload: {workload}
        seeds: {seeds}
        repeats: 1
        determinism: [seeded]
        threads: 1
        max_attempts: 1
        metrics: [loss]
    """).lstrip())
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", root.name], cwd=root, check=True)
    return root


def test_published_script_shapes_are_captured_and_a_repeated_key_is_shown(live_server, workers, tmp_path):  # noqa: F811
    http = live_server.client()
    env = {**live_server.env, "STEADY_SERVER": live_server.url, "STEADY_TOKEN": live_server.tokens["user"],
           "NO_COLOR": "1", "XDG_CONFIG_HOME": str(tmp_path / ".config")}

    def steady(*args: str, cwd: Path = tmp_path):
        return run_cli_in_process(*args, env=env, cwd=cwd)

    # the eval-line script seeds itself with a hard-coded seed and the tqdm loop draws nothing random: two
    # seeds each, whose identical runs are the evidence that the seed has no effect (a failure, not "stable")
    projects = {
        "eval-line": _project(tmp_path / "eval-line", EVAL_SCRIPT, '{framework: python, command: ["python", "train.py"]}',
                              seeds="[1, 2]"),
        "keras": _project(tmp_path / "keras", KERAS_SCRIPT,
                          '{framework: tensorflow, command: ["python", "train.py"], capture: {preset: keras}}',
                          seeds="[1, 2]"),
        "tqdm": _project(tmp_path / "tqdm", TQDM_SCRIPT, '{framework: python, command: ["python", "train.py"]}',
                         seeds="[1, 2]"),
    }
    bad = _project(tmp_path / "bad", TQDM_SCRIPT, '{framework: python, command: ["python", "train.py"], '
                   'capture: {preset: fastai}}')
    refused = steady("submit", "study.yaml", cwd=bad)
    assert refused.returncode == 3 and "422: body.workload.capture.preset: Input should be" in refused.stderr, refused.stderr
    studies = {}
    for name, root in projects.items():
        done = steady("submit", "study.yaml", cwd=root)
        assert done.returncode == 0, done.stderr
        studies[name] = int(done.stdout.split("submitted study ")[1].split()[0])
    (tmp_path / "worker-home").mkdir()
    w = workers(live_server, "w1", "--concurrency", "3", cwd=tmp_path / "worker-home")
    for name, sid in studies.items():
        wait_for(lambda sid=sid: {r["status"] for r in runs(http, sid)} <= {"completed", "failed"}, 240,
                 f"{name} study {sid}\n{w.log()}")
    run, other = sorted(runs(http, studies["eval-line"]), key=lambda r: r["seed"])
    assert run["status"] == other["status"] == "completed", (run, other)
    steps, values = series(http, run["id"], "loss")
    assert steps == list(range(10, 1001, 10))
    conflicts = run["metric_conflicts"]
    assert conflicts["count"] == 2 and [c["step"] for c in conflicts["first"]] == [500, 1000]
    for c in conflicts["first"]:  # the training line's value is kept; the evaluation's is not stored
        assert values[steps.index(c["step"])] == c["kept"]["value"] != c["dropped"]["value"]
        assert c["kept"]["source"].startswith("stdout line") and c["dropped"]["source"].startswith("stdout line")
    logs = steady("logs", str(run["id"]))
    assert logs.returncode == 0 and "capture conflicts: 2 values were logged a second time" in logs.stdout
    assert f"loss at step 500: kept {conflicts['first'][0]['kept']['value']!r}" in logs.stdout, logs.stdout
    report = steady("report", str(studies["eval-line"]))
    assert "Caveats" in report.stdout and f"run {run['id']}: 2 values were logged" in report.stdout, report.stdout
    # random.seed(1) in the script: runs of seeds 1 and 2 are bitwise identical, and every gate fails on it
    assert report.returncode == 1 and "outcome: FAILED: loss seeded/default: the seed has no effect" in report.stdout
    assert "hard-coded seed" in report.stdout, report.stdout
    page = http.get(f"/runs/{run['id']}")
    assert page.status_code == 200 and "Capture conflicts" in page.text and "loss at step 1000" in page.text
    page = http.get(f"/studies/{studies['eval-line']}")
    assert page.status_code == 200 and "<h3>Caveats</h3>" in page.text
    assert f'<a href="/runs/{run["id"]}">run {run["id"]}</a>: 2 values were logged a second time' in page.text

    run, other = sorted(runs(http, studies["keras"]), key=lambda r: r["seed"])
    assert run["status"] == other["status"] == "completed", (run, other)
    steps, values = series(http, run["id"], "loss")
    assert steps == [1, 2] and run["metric_conflicts"] is None
    assert series(http, run["id"], "accuracy")[0] == [1, 2]
    # Keras draws its initial weights from the seed Steady sets for the command: the two seeds differ, so the
    # seed takes effect (never "no effect"); two seeds are too few for a verdict, and every gate says so alike
    assert series(http, other["id"], "loss")[1] != values
    keras_report = steady("report", str(studies["keras"]))
    keras_check = steady("check", str(studies["keras"]))
    assert "no effect" not in keras_report.stdout + keras_check.stdout, keras_report.stdout
    assert "outcome: INCONCLUSIVE" in keras_report.stdout, keras_report.stdout
    assert (keras_report.returncode, keras_check.returncode) == (2, 2), (keras_report.stdout, keras_check.stdout)

    run, _ = sorted(runs(http, studies["tqdm"]), key=lambda r: r["seed"])
    assert run["status"] == "completed", run
    judged = steady("check", str(studies["tqdm"]))  # a loop that draws nothing random: the seed has no effect
    assert judged.returncode == 1 and "the seed has no effect" in judged.stdout, judged.stdout
    steps, values = series(http, run["id"], "loss")
    assert steps == list(range(21)) and run["metric_conflicts"] is None  # 20 iterations and the bar's close
    w_ = [4.0 * 0.8 ** (i + 1) for i in range(20)]
    assert [float(f"{v * v:.3g}") for v in w_] == values[:20]
