"""A Keras training script with a resume path, and planted omissions in it: the resume check's Keras controls.

``python -m steady.worker.inrun.workloads.resume_controls_keras --checkpoint-dir DIR --seed N [--omit PIECE]``
trains a small Keras MLP (``Dropout``, Adam with an ``ExponentialDecay`` schedule) on a synthetic task
for ``--steps`` updates, ``--batches`` per epoch, from a ``tf.data`` pipeline that reshuffles every epoch,
in a ``tf.function`` train step. Each batch gets noise from Python's ``random``, NumPy's global RNG and a
``tf.random.Generator``; the ``Dropout`` layer draws from its Keras ``SeedGenerator``. After every update
it saves everything a faithful resume needs with one ``tf.train.Checkpoint`` (the weights, the optimizer's
moments and iterations, the TF RNG states, the ``tf.data`` iterator, the step) and the Python and NumPy
RNG states beside it; when the folder holds a checkpoint it resumes from it.

``--omit PIECE`` forgets one piece when resuming (:data:`OMISSIONS`); the resume check must name it.
(``tf.train.Checkpoint(model=model)`` and ``model.save_weights`` save no ``SeedGenerator`` state: a Keras 3
checkpoint of the model alone forgets the dropout RNG, which is why the TF RNG is saved as its own piece.)
"""

from __future__ import annotations

import argparse
import os
import pickle
import random

import numpy as np

# the piece --omit forgets -> the component the resume check must name (steady.worker.contract.resume)
OMISSIONS = {
    "weights": "parameters",
    "optimizer": "optimizer_state",
    "iterations": "optimizer_iterations",
    "step": "step_counter",
    "python_rng": "python_rng",
    "numpy_rng": "numpy_rng",
    "tf_rng": "tf_rng",
    "data_cursor": "data",
}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint-dir", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batches", type=int, default=4, help="batches per epoch")
    p.add_argument("--omit", choices=sorted(OMISSIONS), default=None)
    args = p.parse_args(argv)

    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(args.seed)
    rs = np.random.RandomState(12345)  # the task is fixed; the seed changes the rest
    x = rs.normal(size=(96, 8)).astype("float32")
    y = (x @ rs.normal(size=(8, 1))).astype("float32")
    data = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(96, seed=args.seed, reshuffle_each_iteration=True)
            .batch(96 // args.batches, drop_remainder=True).repeat())
    iterator = iter(data)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dropout(0.2),
                              keras.layers.Dense(1)])
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=4, decay_rate=0.5, staircase=True)
    optimizer = keras.optimizers.Adam(schedule)
    optimizer.build(model.trainable_variables)
    noise = tf.random.Generator.from_seed(args.seed)
    step = tf.Variable(0, dtype=tf.int64)
    pieces = {
        "weights": list(model.weights),
        "moments": [v for v in optimizer.variables if v is not optimizer.iterations],
        "iterations": optimizer.iterations,
        # the SeedGenerator states are model variables but not weights
        "tf_rng": [v for v in model.variables if all(v is not w for w in model.weights)] + [noise.state],
        "iterator": iterator,
        "step": step,
    }
    skip = {"weights": "weights", "optimizer": "moments", "iterations": "iterations", "tf_rng": "tf_rng",
            "data_cursor": "iterator", "step": "step"}.get(args.omit or "")
    path = os.path.join(args.checkpoint_dir, "state")
    rng_path = os.path.join(args.checkpoint_dir, "rng.pkl")  # written last: a checkpoint is there when it is
    if os.path.exists(rng_path):
        tf.train.Checkpoint(**{k: v for k, v in pieces.items() if k != skip}).read(path).expect_partial()
        with open(rng_path, "rb") as f:
            rngs = pickle.load(f)
        if args.omit != "python_rng":
            random.setstate(rngs["python"])
        if args.omit != "numpy_rng":
            np.random.set_state(rngs["numpy"])
    saver = tf.train.Checkpoint(**pieces)

    @tf.function
    def train_step(xb: tf.Tensor, yb: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(xb, training=True) - yb) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    while int(step.numpy()) < args.steps:
        xb, yb = next(iterator)
        xb = (xb * (1.0 + 0.1 * random.random()) + np.random.normal(0.0, 0.01, size=tuple(xb.shape)).astype("float32")
              + 0.01 * noise.normal(tuple(xb.shape)))
        loss = train_step(xb, yb)
        step.assign_add(1)
        print(f"step {int(step.numpy())} loss {float(loss):.6f}", flush=True)
        saver.write(path)
        with open(rng_path + ".tmp", "wb") as out:
            pickle.dump({"python": random.getstate(), "numpy": np.random.get_state()}, out)
        os.replace(rng_path + ".tmp", rng_path)


if __name__ == "__main__":
    main()
