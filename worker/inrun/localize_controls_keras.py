"""Planted single-layer faults in a Keras training, localized at layer granularity.

    python -m steady.worker.inrun.localize_controls_keras            # the Keras table in docs/controls.md

A small Keras MLP (Dense, LayerNormalization, Adam) on a ``PyDataset``, bitwise reproducible on CPU
(``keras.utils.set_random_seed``, ``enable_op_determinism``). A fault is planted with the fault's own
wrapper on one layer's ``call``, on the optimizer's ``apply_gradients`` (one variable's gradient, or
its value after the update) or in the dataset: from step ``fire_step`` on (gated on the optimizer's
iteration counter, so it also holds inside ``fit``'s compiled graph) each element (each feature of a
batch) is scaled by ``1 + k·2⁻²³`` with ``k`` from 1 to 64, or the rows are permuted; ``k`` and the
permutation are drawn per run from the operating system's entropy: different in every run, as a
nondeterministic kernel is.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import sys
import time
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow as tf

from steady.worker.contract.oplocate import OpDivergence, first_divergent_op, first_divergent_step, named_exactly
from steady.worker.inrun import localize
from steady.worker.inrun.localize_keras import KerasLocalizer

localize.USER_FILES.add(os.path.realpath(__file__))
STEPS = 5
BATCH = 16
_entropy = random.SystemRandom()


@dataclass(frozen=True)
class KerasFault:
    name: str
    where: str  # "forward:<layer>", "backward:<layer>.<kernel|bias>", "optimizer:<layer>.<kernel|bias>", "data"
    kind: str = "scale"  # or "permute"
    fire_step: int = 2


KERAS_FAULTS = [
    KerasFault("embed output", "forward:embed"),
    KerasFault("hidden rows permuted", "forward:hidden", kind="permute"),
    KerasFault("layer norm output", "forward:norm"),
    KerasFault("head output", "forward:head"),
    KerasFault("hidden kernel gradient", "backward:hidden.kernel"),
    KerasFault("embed bias gradient", "backward:embed.bias"),
    KerasFault("Adam update of head.kernel", "optimizer:head.kernel"),
    KerasFault("Adam update of norm.gamma", "optimizer:norm.gamma"),
    KerasFault("batch permuted", "data", kind="permute"),
]


class _Batches(keras.utils.PyDataset):
    def __init__(self, x: np.ndarray, y: np.ndarray, fault: KerasFault | None) -> None:
        super().__init__()
        self.x, self.y, self.fault = x, y, fault

    def __len__(self) -> int:
        return len(self.x) // BATCH

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        xb, yb = self.x[i * BATCH:(i + 1) * BATCH], self.y[i * BATCH:(i + 1) * BATCH]
        if self.fault is not None and self.fault.where == "data" and i >= self.fault.fire_step:
            perm = list(range(BATCH))
            while perm == list(range(BATCH)):
                _entropy.shuffle(perm)
            xb = xb[perm]  # the features permuted, the labels not: a batch assembled wrongly
        return xb, yb


def _model() -> keras.Model:
    return keras.Sequential([
        keras.Input((16,)),
        keras.layers.Dense(32, activation="tanh", name="embed"),
        keras.layers.Dense(32, name="hidden"),
        keras.layers.LayerNormalization(name="norm"),
        keras.layers.Dense(4, name="head"),
    ], name="net")


def _plant(fault: KerasFault, model: keras.Model) -> None:
    place, _, target = fault.where.partition(":")
    if place == "data":
        return
    opt = model.optimizer
    rng = np.random.default_rng(_entropy.getrandbits(64))

    def perturb(t: Any) -> Any:
        # the step being trained: the counter, less one once apply_gradients has counted it
        done = 1 if place == "optimizer" else 0
        on = tf.cast(opt.iterations - done >= fault.fire_step, t.dtype)
        if fault.kind == "permute":
            perm = list(range(BATCH))  # every batch holds BATCH rows (the graph does not know it)
            while perm == sorted(perm):
                _entropy.shuffle(perm)
            return on * tf.gather(t, perm) + (1 - on) * t
        # per element (per feature for a batch): 1 to 64 ULPs of 1.0, drawn per run
        shape = t.shape[-1:] if t.shape.rank and t.shape[0] is None else t.shape
        factor = (1 + rng.integers(1, 65, size=tuple(shape)) * 2.0 ** -23).astype("float32")
        return t * (1 + on * (tf.constant(factor) - 1))

    if place == "forward":
        layer = model.get_layer(target)
        original = layer.call

        @functools.wraps(original)
        def call(*args: Any, **kwargs: Any) -> Any:
            return perturb(original(*args, **kwargs))

        layer.call = call
        return
    layer_name, _, var_name = target.partition(".")
    var = next(v for v in model.get_layer(layer_name).weights if v.path.endswith("/" + var_name))

    def apply_gradients(grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        pairs = [(perturb(g) if place == "backward" and v is var else g, v) for g, v in grads_and_vars]
        out = type(opt).apply_gradients(opt, pairs, *args, **kwargs)  # whatever the class holds now
        if place == "optimizer":
            var.assign(perturb(var.value))
        return out

    opt.apply_gradients = apply_gradients


def expected(fault: KerasFault, model: keras.Model) -> tuple[str, str, str]:
    """(op, module, phase) the answer must name, from Keras' own names for the place."""
    place, _, target = fault.where.partition(":")
    if place == "data":
        return "batch", "data", "data"
    layer = model.get_layer(target.partition(".")[0])
    op = {"forward": type(layer).__name__, "backward": "gradient", "optimizer": "update"}[place]
    return op, layer.path, place


def train(fault: KerasFault | None, loc: KerasLocalizer | None) -> keras.Model:
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(STEPS * BATCH, 16)).astype("float32")
    y = ((x[:, :4].sum(1) > 0).astype("int64") + 2 * (x[:, 4:8].sum(1) > 0)).astype("int64")
    model = _model()
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.optimizer.build(model.trainable_variables)
    if fault is not None:
        _plant(fault, model)
    if loc is not None:
        loc.install()
    try:
        model.fit(_Batches(x, y, fault), epochs=1, verbose=0, shuffle=False)
    finally:
        if loc is not None:
            loc.close()
    return model


@dataclass
class Diagnosis:
    parted: bool
    step: int | None
    answer: OpDivergence | None
    replays: int
    seconds: float
    expected: tuple[str, str, str] | None = None


def diagnose(fault: KerasFault | None, *, trace_anyway: int | None = None) -> Diagnosis:
    t0 = time.perf_counter()
    a, b = KerasLocalizer("steps"), KerasLocalizer("steps")
    model = train(fault, a)
    train(fault, b)
    want = expected(fault, model) if fault is not None else None
    k = first_divergent_step(a.digests, b.digests)
    if k is None and trace_anyway is None:
        return Diagnosis(False, None, None, 0, time.perf_counter() - t0, want)
    parted = k is not None
    if k is None:
        assert trace_anyway is not None
        k = trace_anyway
    ta, tb = KerasLocalizer("trace", step=k), KerasLocalizer("trace", step=k)
    train(fault, ta)
    train(fault, tb)
    answer = first_divergent_op(ta.trace, tb.trace, step=k)
    return Diagnosis(parted, k, answer, 2, time.perf_counter() - t0, want)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m steady.worker.inrun.localize_controls_keras",
                                description="planted single-layer faults in a Keras training, localized")
    p.add_argument("--clean", type=int, default=10, help="clean repeat pairs (no fault)")
    args = p.parse_args(argv)
    tf.config.experimental.enable_op_determinism()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    print("| # | planted fault | layer op | layer | phase | fires from step | first divergent step | named | replays |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    hits = 0
    for i, fault in enumerate(KERAS_FAULTS):
        d = diagnose(fault)
        assert d.expected is not None
        op, module, phase = d.expected
        got = d.answer
        ok = named_exactly(got, (op, module, phase), step=d.step, fire_step=fault.fire_step)
        hits += ok
        named = "yes" if ok else f"NO: {got.sentence() if got else 'nothing'}"
        print(f"| {i + 1} | {fault.name}{' (permutation)' if fault.kind == 'permute' else ''} | `{op}` | `{module}` | "
              f"{phase} | {fault.fire_step} | {d.step} | {named} | {d.replays} |", flush=True)
    false = 0
    t0 = time.perf_counter()
    for _ in range(args.clean):
        d = diagnose(None, trace_anyway=STEPS // 2)
        false += d.parted or d.answer is not None
    print(f"\nnamed exactly: {hits}/{len(KERAS_FAULTS)}; false localizations on clean pairs: {false}/{args.clean} "
          f"({time.perf_counter() - t0:.1f} s for the clean pairs)")
    return 0 if hits == len(KERAS_FAULTS) and false == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
