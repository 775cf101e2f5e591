"""A user's own Keras script that backs up its model and optimizer but not the RNG state, submitted with the
resume check as a command from a fresh git folder: the report names the TF RNG state as the piece the
resumed run did not restore, and every gate fails with it.

The script is a Keras tutorial's: ``Model.fit`` with ``keras.callbacks.BackupAndRestore`` (Keras 3 backs up
``model.save_weights``: the weights and the optimizer's variables), a ``Dropout`` layer, one batch an epoch
(so a backup after every epoch is one after every update, and the data position cannot be what differs).
``save_weights`` holds no ``SeedGenerator`` state, so the restarted dropout draws its masks from the start
of its sequence again. A real ``steady serve`` (the shared one) and a real worker: the kill and the restart
of the user's command through the CLI are the point.
"""

from __future__ import annotations

import pytest

from tests.reports.resume_study import run_resume_study

SCRIPT = """
    import argparse

    import keras
    import numpy as np

    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--checkpoints", required=True)
    p.add_argument("--epochs", type=int, default=6)
    args = p.parse_args()
    keras.utils.set_random_seed(args.seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dropout(0.3), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")
    x = np.linspace(-1, 1, 32, dtype="float32").reshape(8, 4)
    y = x.sum(axis=1, keepdims=True)
    log = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: print(f"step {epoch + 1} loss {logs['loss']:.6f}", flush=True))
    model.fit(x, y, batch_size=8, epochs=args.epochs, shuffle=False, verbose=0,
              callbacks=[keras.callbacks.BackupAndRestore(args.checkpoints), log])
"""

SPEC = """
    name: keras-resume-without-rng
    workload:
      framework: tensorflow
      command: ["python", "train.py", "--seed", "{seed}", "--checkpoints", "{checkpoint_dir}"]
    seeds: [1]
    determinism: [strict]
    threads: 1
    max_attempts: 1
    metrics: [loss]
    resume: {at: [3]}
"""


@pytest.mark.slow
def test_a_keras_resume_without_the_rng_state_is_named_in_the_report(live_server, tmp_path):
    study = run_resume_study(live_server, tmp_path, {"train.py": SCRIPT, "study.yaml": SPEC}, "resume-keras-e2e")
    submit, report, body, worker = study.submit, study.report, study.body, study.worker
    assert body.study.progress.completed == 1, worker.log()
    assert body.resume is not None and len(body.resume) == 1, (body.resume, worker.log())
    check = body.resume[0]
    assert check.seed == 1 and check.at == [3]
    assert check.verdict == "not_restored", check
    # weights, optimizer (moments, iterations), the Python and NumPy RNGs and the batch all came back
    assert check.missing == ["tf_rng"], check
    assert check.steps == {"reference": 6, "resumed": 6}
    said = "killed after update 3 and resumed: it did not restore the TF RNG state"
    assert said in report.stdout, report.stdout
    assert submit.returncode == 1 and said in body.outcome.reason
    assert "SeedGenerator" in report.stdout
