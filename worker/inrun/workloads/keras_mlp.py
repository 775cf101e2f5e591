"""A Keras MLP on digits fed by ``tf.data``.

At ``seeded``/``strict`` the shuffle is ``shuffle(n, seed=seed, reshuffle_each_iteration=False)``
(the same order every epoch, as the TensorFlow guide prescribes); at ``none`` it is unseeded
and reshuffles. Batches carry their sample indices so the order actually fed is digested.
Params: epochs=3, batch_size=64, lr=1e-3, hidden=64.
"""

from __future__ import annotations

import time

import numpy as np
import tensorflow as tf

from steady.worker.inrun import sdk
from steady.worker.inrun.frameworks.tensorflow import model_digest, optimizer_digest
from steady.worker.inrun.workloads.data import digits_split

FRAMEWORKS = ("tensorflow",)


def run(ctx: sdk.RunContext) -> dict:
    keras = tf.keras
    split = digits_split(ctx.param("split_seed", 0))
    sdk.emit({"e": "info", "value": {"data_split": split.info}})
    n = len(split.x_train)
    ds = tf.data.Dataset.from_tensor_slices((split.x_train, split.y_train, np.arange(n, dtype=np.int64)))
    if ctx.seeded:
        ds = ds.shuffle(n, seed=ctx.seed, reshuffle_each_iteration=False)
    else:
        ds = ds.shuffle(n)
    ds = ds.batch(ctx.param("batch_size", 64))

    hidden = ctx.param("hidden", 64)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(hidden, activation="relu"), keras.layers.Dense(10)])
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.Adam(ctx.param("lr", 1e-3)), loss=loss_fn)
    sdk.set_digest("initial_weights", model_digest(model))
    step = 0
    for epoch in range(ctx.param("epochs", 3)):
        fed = []
        for xb, yb, ib in ds:
            t0 = time.perf_counter()
            loss = model.train_on_batch(xb, yb)
            value = float(np.asarray(loss).reshape(-1)[0])
            sdk.log(step, loss=value, step_time=time.perf_counter() - t0)
            fed.append(ib.numpy())
            step += 1
        sdk.log_data_order(np.concatenate(fed), epoch=epoch)
        logits = model(split.x_val, training=False)
        val_loss = float(loss_fn(split.y_val, logits).numpy())
        val_acc = float(np.mean(np.argmax(logits.numpy(), axis=1) == split.y_val))
        sdk.log(step - 1, val_loss=val_loss, val_acc=val_acc)
    sdk.set_digest("final_weights", model_digest(model))
    sdk.set_digest("optimizer_state", optimizer_digest(model.optimizer))
    return {"train_steps": float(step)}
