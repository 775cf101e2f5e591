"""Localization inside a Keras (TensorFlow) run, at layer granularity.

The same two modes as :mod:`steady.worker.inrun.localize` (``STEADY_LOCALIZE=steps`` / ``trace``):

* ``steps``: after every training batch of ``Model.fit`` (a callback ``fit`` is given), an
  order-aware digest of the model's weights and the optimizer's variables.
* ``trace`` of step ``k``: ``fit`` runs eagerly (``run_eagerly=True``: the values must reach Python;
  both replays run so, so they compare with each other), and step ``k``'s ``train_step`` records, in
  order: the batch (phase ``data``); every layer call, as it returns (phase ``forward``: the layer's
  class as the "op", its path as the module, hashes of its inputs and outputs); each trainable
  variable's gradient, from the output layer back (``backward``); each variable after the update
  (``optimizer``, its inputs the gradient and the value before). TensorFlow's ops inside a layer are
  not traced: the answer names the layer, not the kernel.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from steady.worker.inrun.localize import HASH_NAME, _hasher, emit_step_digest, user_line


def array_hash(value: Any) -> str:
    """Order-aware hash of a tensor or array: dtype, shape and the raw C-order bytes."""
    import numpy as np

    arr = np.ascontiguousarray(np.asarray(value))
    h = _hasher()
    h.update(f"{arr.dtype.str}|{arr.shape}|".encode())
    raw: Any = arr
    h.update(memoryview(raw).cast("B") if arr.size and arr.dtype.kind in "biufc" else repr(arr.tolist()).encode())
    return h.hexdigest()


def _hash_nested(value: Any) -> str:
    import tensorflow as tf

    parts: list[str] = []
    for leaf in tf.nest.flatten(value):
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            parts.append(array_hash(leaf))
    return hashlib.blake2b("|".join(parts).encode(), digest_size=8).hexdigest() if parts else "-"


def _layer_of(variable: Any) -> str:
    path = str(getattr(variable, "path", None) or getattr(variable, "name", ""))
    return path.rsplit("/", 1)[0] if "/" in path else path


class KerasLocalizer:
    """``mode="steps"``: ``digests`` per batch; ``mode="trace"``: ``trace`` of batch ``step``."""

    def __init__(self, mode: str, *, step: int = 0, out: str | None = None, on_traced: Any = None) -> None:
        if mode not in ("steps", "trace"):
            raise ValueError(f"mode must be 'steps' or 'trace', not {mode!r}")
        self.mode, self.target, self.out, self.on_traced = mode, int(step), out, on_traced
        self.steps_done = 0
        self.digests: list[str] = []
        self.trace: list[dict[str, Any]] = []
        self.traced = False
        self._restore: list[tuple[Any, str, Any]] = []
        self._tracing = False

    def _patch(self, owner: Any, name: str, new: Any) -> Any:
        original = getattr(owner, name)
        self._restore.append((owner, name, original))
        setattr(owner, name, new)
        return original

    def close(self) -> None:
        for owner, name, original in reversed(self._restore):
            setattr(owner, name, original)
        self._restore.clear()

    @staticmethod
    def state_digest(model: Any) -> str:
        h = hashlib.blake2b(f"steady-keras-step-v1-{HASH_NAME}".encode(), digest_size=16)
        for i, w in enumerate(model.weights):
            h.update(f"w{i}:{array_hash(w)}".encode())
        opt = getattr(model, "optimizer", None)
        for i, v in enumerate(getattr(opt, "variables", None) or []):
            h.update(f"o{i}:{array_hash(v)}".encode())
        return h.hexdigest()

    def install(self) -> KerasLocalizer:
        import keras

        me = self
        if self.mode == "steps" and self.out:
            open(self.out, "w", encoding="utf-8").close()  # appended to per batch
        model_cls = keras.Model
        original_fit = model_cls.fit

        class _Digests(keras.callbacks.Callback):
            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                me.digests.append(me.state_digest(self.model))
                emit_step_digest(me.steps_done, me.digests[-1])
                me.steps_done += 1
                if me.out:
                    with open(me.out, "a", encoding="utf-8") as f:
                        f.write(me.digests[-1] + "\n")

        def fit(model: Any, *args: Any, **kwargs: Any) -> Any:
            if me.mode == "steps":
                kwargs["callbacks"] = [*list(kwargs.get("callbacks") or []), _Digests()]
            else:
                model.run_eagerly = True
                model.train_function = None  # made again, eagerly
            return original_fit(model, *args, **kwargs)

        self._patch(model_cls, "fit", fit)
        if self.mode == "trace":
            from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

            original_step = TensorFlowTrainer.train_step

            def train_step(model: Any, data: Any) -> Any:
                k = me.steps_done
                me.steps_done += 1
                if k != me.target or me.traced:
                    return original_step(model, data)
                return me._traced_step(model, data, original_step)

            self._patch(TensorFlowTrainer, "train_step", train_step)
        return self

    def _record(self, op: str, module: str, phase: str, inputs: str, output: str) -> None:
        self.trace.append({"op": op, "module": module, "phase": phase, "line": user_line(1), "inputs": inputs,
                           "output": output, "args": ""})

    def _traced_step(self, model: Any, data: Any, original_step: Any) -> Any:
        import keras

        self._record("batch", "data", "data", "-", _hash_nested(data))
        layer_cls = keras.layers.Layer
        original_call = layer_cls.__call__
        me = self

        def call(layer: Any, *args: Any, **kwargs: Any) -> Any:
            inputs = _hash_nested(args)
            out = original_call(layer, *args, **kwargs)
            me._record(type(layer).__name__, getattr(layer, "path", layer.name), "forward", inputs, _hash_nested(out))
            return out

        opt = model.optimizer
        original_apply = type(opt).apply_gradients
        before: dict[int, tuple[str, str]] = {}

        def apply_gradients(optimizer: Any, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
            pairs = list(grads_and_vars)
            for g, v in reversed(pairs):  # from the output back, as backpropagation runs
                gh = array_hash(g) if g is not None else "none"
                me._record("gradient", _layer_of(v), "backward", "-", gh)
                before[id(v)] = (gh, array_hash(v))
            return original_apply(optimizer, pairs, *args, **kwargs)

        layer_cls.__call__ = call
        type(opt).apply_gradients = apply_gradients
        try:
            out = original_step(model, data)
        finally:
            layer_cls.__call__ = original_call
            type(opt).apply_gradients = original_apply
        for v in model.trainable_variables:
            gh, old = before.get(id(v), ("-", "-"))
            self._record("update", _layer_of(v), "optimizer",
                         hashlib.blake2b(f"{gh}|{old}".encode(), digest_size=8).hexdigest(), array_hash(v))
        self.traced = True
        if self.out:
            with open(self.out, "w", encoding="utf-8") as f:
                json.dump({"step": self.target, "trace": self.trace}, f)
        if self.on_traced is not None:
            self.on_traced(self)
        return out


def install_from_env() -> KerasLocalizer | None:
    """The localizer the environment asks for (``STEADY_LOCALIZE``), installed; None when off."""
    import os
    import sys

    from steady.worker.inrun.localize import MODE_ENV, OUT_ENV, STEP_ENV

    mode = os.environ.get(MODE_ENV)
    if not mode:
        return None

    def done(loc: KerasLocalizer) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    return KerasLocalizer(mode, step=int(os.environ.get(STEP_ENV) or 0), out=os.environ.get(OUT_ENV),
                          on_traced=done).install()
