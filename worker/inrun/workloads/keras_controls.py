"""Planted controls for Keras: the reference training with exactly one source planted.

The Keras counterpart of ``torch_controls``: a two-layer MLP with dropout on digits, fed by
``train_on_batch`` in an order drawn from its own NumPy generator. Every random draw has an
explicit seed derived from the run seed at every level — the initializers'
(``GlorotUniform(seed=...)``), the dropout layer's (``Dropout(seed=...)``) and the order's —
so repeats of one seed are identical on one stack (at ``strict``, which also makes
TensorFlow's kernels deterministic), and ``plant`` makes exactly one of them come from fresh
entropy:

``init``       initializer seeds from fresh entropy -> ``seeding``
``data_order`` the order's generator from fresh entropy -> ``data_order``
``dropout``    the dropout layer's seed from fresh entropy -> ``seeding`` (the initial-weights
               digest covers the weights and the dropout seed: the run's initial state)

TensorFlow has no planted kernel control here: its CPU kernels are deterministic for this
model, and ``strict`` (``enable_op_determinism``) is the level the controls run at.
Params: plant=none, epochs=2, batch_size=128, lr=1e-2, hidden=64, dropout=0.2.
"""

from __future__ import annotations

import os
import time

import numpy as np
import tensorflow as tf

from steady.worker.inrun import sdk
from steady.worker.contract.digests import state_digest
from steady.worker.inrun.frameworks.tensorflow import model_digest, optimizer_digest
from steady.worker.inrun.workloads.data import digits_split

FRAMEWORKS = ("tensorflow",)
PLANTS = ("none", "init", "data_order", "dropout")


def _seed(fixed: int, planted: bool) -> int:
    return int.from_bytes(os.urandom(4), "little") if planted else fixed


def run(ctx: sdk.RunContext) -> dict:
    keras = tf.keras
    plant = ctx.param("plant", "none")
    plants = set(plant.split("+")) - {"none"}
    if plants - set(PLANTS):
        raise ValueError(f"unknown plant {plant!r}; expected one of {PLANTS}, or several joined by '+'")
    split = digits_split(ctx.param("split_seed", 0))
    sdk.emit({"e": "info", "value": {"data_split": split.info, "plant": plant}})
    seed = ctx.seed
    init_seed = _seed(seed, "init" in plants)
    dropout_seed = _seed(seed + 2, "dropout" in plants)
    order_rng = np.random.default_rng(None if "data_order" in plants else seed + 1)

    hidden = ctx.param("hidden", 64)
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(hidden, activation="relu", kernel_initializer=keras.initializers.GlorotUniform(seed=init_seed)),
        keras.layers.Dropout(ctx.param("dropout", 0.2), seed=dropout_seed),
        keras.layers.Dense(10, kernel_initializer=keras.initializers.GlorotUniform(seed=init_seed + 1)),
    ])
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.SGD(ctx.param("lr", 1e-2), momentum=0.9), loss=loss_fn)
    sdk.set_digest("initial_weights", state_digest({"weights": model_digest(model), "rng.dropout": dropout_seed}))
    batch_size, n, step = ctx.param("batch_size", 128), len(split.x_train), 0
    for epoch in range(ctx.param("epochs", 2)):
        order = order_rng.permutation(n)
        for start in range(0, n, batch_size):
            idx = order[start:start + batch_size]
            t0 = time.perf_counter()
            loss = model.train_on_batch(split.x_train[idx], split.y_train[idx])
            value = float(np.asarray(loss).reshape(-1)[0])
            sdk.log(step, loss=value, step_time=time.perf_counter() - t0)
            step += 1
        sdk.log_data_order(order, epoch=epoch)
        logits = model(split.x_val, training=False)
        sdk.log(step - 1, val_loss=float(loss_fn(split.y_val, logits).numpy()),
                val_acc=float(np.mean(np.argmax(logits.numpy(), axis=1) == split.y_val)))
    sdk.set_digest("final_weights", model_digest(model))
    sdk.set_digest("optimizer_state", optimizer_digest(model.optimizer))
    return {"train_steps": float(step)}
