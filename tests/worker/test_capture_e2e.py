"""Zero-code capture end to end: a training script that knows nothing of Steady (no SDK, no
``--seed``; it logs to TensorBoard and prints ``Epoch N step M loss X``) runs as a command
workload from its own git repository, with ``steady submit --wait`` against a worker elsewhere.
The worker's shim seeds Python/NumPy/torch, so seeded repeats are identical. (``none``, where the repeats of a
script that seeds nothing differ, the report meets that expectation and the optimizer hook's digests blame seeding,
is shown by tests/reports/test_user_scripts_e2e.py and tests/worker/test_autodigest.py;
``strict`` adds deterministic kernels on top of seeded,
which the determinism tests show. Neither adds anything to capture, so they are not run here: each run of
this script imports torch and, through ``torch.utils.tensorboard``, TensorFlow.)
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.worker.test_code_shipping_e2e import _submit
from tests.worker.test_worker_agent_e2e import runs, series, workers  # noqa: F401 - workers is a fixture

pytestmark = pytest.mark.slow

TRAIN = """
    # A plain PyTorch regression script: it knows nothing of Steady.
    import argparse
    import csv

    import torch
    from torch.utils.tensorboard import SummaryWriter

    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--data", default="data/houses.csv")
    args = parser.parse_args()

    with open(args.data) as f:
        rows = [[float(x) for x in row] for row in csv.reader(f) if row and not row[0].startswith("#")]
    data = torch.tensor(rows)
    x, y = data[:, :-1], data[:, -1:]
    x = (x - x.mean(0)) / x.std(0)

    model = torch.nn.Sequential(torch.nn.Linear(x.shape[1], 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    writer = SummaryWriter()  # ./runs/<date>_<host>/ as usual
    step = 0
    for epoch in range(args.epochs):
        for batch in torch.randperm(len(x)).split(8):
            loss = torch.nn.functional.mse_loss(model(x[batch]), y[batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
            writer.add_scalar("Loss/train", loss.item(), step)
            if step % 5 == 0:
                print(f"Epoch {epoch} step {step} loss {loss.item():.6f}")
            step += 1
    writer.close()
    print("done")
"""

SPEC = """
    name: plain script
    workload:
      framework: torch
      command: ["python", "train.py", "--epochs", "3"]
    seeds: [1]
    repeats: 2
    determinism: [seeded]
    threads: 1
    max_attempts: 1
    metrics: [Loss/train, loss]
"""


def _repo(root: Path) -> Path:
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, size=(40, 3))
    y = x @ [3.0, -1.0, 0.5] + 0.1 * rng.normal(size=40)
    (root / "data").mkdir(parents=True)
    lines = ["# rooms,age,distance,price"] + [",".join(f"{v:.4f}" for v in (*a, b)) for a, b in zip(x, y)]
    (root / "data" / "houses.csv").write_text("\n".join(lines) + "\n")
    (root / "train.py").write_text(textwrap.dedent(TRAIN).lstrip())
    (root / "study.yaml").write_text(textwrap.dedent(SPEC).lstrip())
    (root / ".gitignore").write_text("runs/\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "plain script"], cwd=root, check=True)
    return root


def test_a_script_that_logs_only_to_tensorboard_and_stdout_is_judged(live_server, workers, tmp_path):  # noqa: F811
    http = live_server.client()
    repo = _repo(tmp_path / "proj")
    (tmp_path / "worker-home").mkdir()
    w = workers(live_server, "w1", cwd=tmp_path / "worker-home")
    done = _submit(live_server, repo / "study.yaml", "--wait")
    # judged: `none` repeats differ, which `none` allows for a script that fixes no seed itself;
    # seeded is identical. One seed cannot show a seed band, and the spec gives no
    # max_std: seed stability is shown as information, not asked, so the study passes on what it asks (exit 0)
    assert done.returncode == 0, done.stdout + done.stderr + w.log()
    assert ": passed: " in done.stderr and "not asked" in done.stderr, done.stderr
    sid = int(done.stdout.split("submitted study ")[1].split()[0])
    items = runs(http, sid)
    assert len(items) == 2 and {r["status"] for r in items} == {"completed"}
    by_level: dict[str, list] = {}
    for r in items:
        tb, out = series(http, r["id"], "Loss/train"), series(http, r["id"], "loss")
        assert tb[0] == list(range(15)) and out[0] == [0, 5, 10]  # 40 rows, batches of 8, 3 epochs
        assert [round(v, 6) for v in np.float32(tb[1])[[0, 5, 10]].tolist()] == out[1]  # stdout's 6 digits
        assert r["final_metrics"]["Loss/train"] == tb[1][-1]
        by_level.setdefault(r["determinism"], []).append((tb, out))
    a, b = by_level["seeded"]
    assert a == b  # the shim's seeding made the unchanged script repeatable
    report = http.get(f"/api/v1/studies/{sid}/report").json()
    judged = {(v["metric"], v["group"]["determinism"]): v for v in report["verdicts"] if v["level"] == "repeatability"}
    # automatic digests (the worker's optimizer hook, no SDK call) recorded the initial weights: they
    # differ between the unseeded repeats, so the source at `none` is seeding, not kernels
    assert all(r["digests"]["initial_weights"] for r in items)
    for metric, dtype in (("Loss/train", "float32"), ("loss", "float64")):
        seeded = judged[metric, "seeded"]
        assert seeded["verdict"] == "identical" and seeded["met_expectation"] is True
        assert seeded["dtype"] == dtype  # TensorBoard's float32 is judged as float32, stdout's digits as float64
