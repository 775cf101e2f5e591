"""The resume check inside one launch of a Keras (TensorFlow) run: count updates, digest the state, stop.

The protocol is :mod:`steady.worker.inrun.resumestate`'s (the roles, the stop just before update
``k + 1``, the records); this module supplies Keras' hook and state. An update is one call of a Keras
optimizer's ``apply`` (``apply_gradients`` and ``Model.fit``'s train step both go through it), counted
for the first optimizer that applies; a wrapping optimizer's inner ``apply`` (a ``LossScaleOptimizer``)
is not counted twice. In eager code the hook runs in Python before the update; in a compiled step
(``Model.fit``, a ``tf.function`` loop) it is a ``tf.py_function`` on which every op of the update has a
control dependency (the variables are read before any of them changes), so it runs at every execution of
the step, whatever ``steps_per_execution`` is. (A step compiled with XLA,
``jit_compile=True``, cannot hold a ``py_function``: Keras' ``"auto"`` does not compile with XLA on a
CPU-only machine or under op determinism.)

The components, just before update ``k + 1``:

* ``parameters``: the variables the optimizer updates;
* ``optimizer_state``: the optimizer's other variables (Adam's moments, momentum...), without the
  iterations and the learning-rate variable;
* ``optimizer_iterations``: ``optimizer.iterations``, from which a ``LearningRateSchedule`` and Adam's
  bias correction are computed (a Keras schedule has no state of its own);
* ``lr_scheduler``: the learning rate in effect (a schedule evaluated at the iterations, or the variable a
  callback or the code set);
* ``python_rng``, ``numpy_rng``: the global RNGs;
* ``tf_rng``: every live Keras ``SeedGenerator`` (``Dropout`` keeps one: ``[seed, counter]``, and Keras'
  global one) and every ``tf.random.Generator``, in order of creation. The hidden state of TensorFlow's
  stateful random ops (``tf.random.uniform`` under a global seed) cannot be read: it shows in ``data``
  or as ``unseen``;
* ``data``: the gradients of update ``k + 1``, standing for the batch (the position of a ``tf.data``
  iterator, the epoch and step counters of ``fit``) once everything above them matches.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable
from typing import Any

from steady.worker.inrun.resumestate import Tracker, _sha, launch_args

_ORDER = itertools.count()


def _array_bytes(value: Any) -> bytes:
    import numpy as np

    arr = np.ascontiguousarray(np.asarray(value.numpy() if hasattr(value, "numpy") else value))
    return f"{arr.dtype.str}|{arr.shape}|".encode() + arr.tobytes()


class KerasTracker(Tracker):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.grads: list[Any] = []
        self.generators: list[tuple[int, weakref.ref[Any], Callable[[Any], Any]]] = []
        self.inside = 0
        self.rng_values: list[tuple[str, Any]] | None = None

    def track_generator(self, generator: Any, state: Callable[[Any], Any]) -> None:
        self.generators.append((next(_ORDER), weakref.ref(generator), state))

    def params(self) -> list[Any]:
        return list(getattr(self.optimizer, "_trainable_variables", None) or [])

    def final_digest(self) -> str:
        return _sha(b"".join(_array_bytes(v) for v in self.params()))

    def rng_variables(self) -> list[tuple[str, Any]]:
        """The state variables of the live generators: Keras' global one first, then in order of creation."""
        import gc

        gc.collect()  # the live generators, whenever the collector would have run: a dead one is not state
        out: list[tuple[str, Any]] = []
        try:
            from keras.src.backend.common import global_state
            from keras.src.random import seed_generator

            glob = global_state.get_global_attribute(seed_generator.GLOBAL_SEED_GENERATOR)
            if glob is not None:
                out.append(("global:", glob.state))
        except ImportError:
            pass
        for _, ref, state in sorted(self.generators, key=lambda g: g[0]):
            generator = ref()
            if generator is not None:
                out.append(("", state(generator)))
        return out

    def _rng_states(self) -> list[bytes]:
        if self.rng_values is not None:  # read by the compiled step, in its order of ops
            return [label.encode() + _array_bytes(v) for label, v in self.rng_values]
        return [label.encode() + _array_bytes(v) for label, v in self.rng_variables()]

    def components(self, grads_key: str = "data") -> dict[str, str]:
        import pickle
        import random

        import numpy as np

        opt = self.optimizer
        out: dict[str, str] = {}
        out["parameters"] = _sha(b"".join(_array_bytes(v) for v in self.params()))
        iterations = getattr(opt, "_iterations", None)
        lr_var = getattr(opt, "_learning_rate", None)
        moments = [v for v in opt.variables if v is not iterations and v is not lr_var]
        out["optimizer_state"] = _sha(b"".join(_array_bytes(v) for v in moments))
        if iterations is not None:
            out["optimizer_iterations"] = _sha(_array_bytes(iterations))
        out["lr_scheduler"] = _sha(_array_bytes(opt.learning_rate))
        out["python_rng"] = _sha(pickle.dumps(random.getstate(), protocol=4))
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        out["numpy_rng"] = _sha(str(kind).encode() + np.asarray(keys).tobytes() + str((pos, has_gauss, cached)).encode())
        out["tf_rng"] = _sha(b"|".join(self._rng_states()))
        out[grads_key] = _sha(b"".join(_array_bytes(g) for g in self.grads))
        return out

    def before_update(self, optimizer: Any, grads: Any, rng_values: list[tuple[str, Any]] | None = None) -> None:
        if self.optimizer is None:
            self.optimizer = optimizer
        if optimizer is self.optimizer:
            self.grads = list(grads)
            self.rng_values = rng_values
        self.pre(optimizer, (), {})


def _install(tracker: KerasTracker) -> None:
    import tensorflow as tf
    from keras.src import backend
    from keras.src.optimizers import base_optimizer
    from keras.src.random import seed_generator
    from tensorflow.python.ops import stateful_random_ops

    original_apply = base_optimizer.BaseOptimizer.apply

    def apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
        if tracker.inside or not len(grads):  # a wrapped optimizer's own apply; an empty apply is no update
            return original_apply(self, grads, trainable_variables)
        tracker.inside += 1
        try:
            present = [tf.convert_to_tensor(g) for g in grads if g is not None]
            if tf.executing_eagerly():
                if not self.built and trainable_variables is not None:  # as apply() would: its state exists now
                    with backend.name_scope(self.name, caller=self):
                        self.build(list(trainable_variables))
                    self.built = True
                tracker.before_update(self, present)
            else:  # a compiled step: the hook runs each time the step does, and every op of the update waits for it
                # the generators' states are read as ops of the step, so they come after its draws (a Dropout
                # layer's SeedGenerator advances in the forward pass: a read from Python could race with it)
                pairs = tracker.rng_variables()
                labels = [label for label, _ in pairs]
                rng_reads = [tf.identity(tf.convert_to_tensor(v)) for _, v in pairs]

                def hook(*values: Any) -> Any:
                    n = len(present)
                    tracker.before_update(self, values[:n], list(zip(labels, values[n:])))
                    return 0

                token = tf.py_function(hook, [*present, *rng_reads], tf.int32)
                with tf.control_dependencies([token]):
                    grads = [g if g is None else tf.identity(g) for g in grads]
                    return original_apply(self, grads, trainable_variables)
            return original_apply(self, grads, trainable_variables)
        finally:
            tracker.inside -= 1

    base_optimizer.BaseOptimizer.apply = apply

    original_sg_init = seed_generator.SeedGenerator.__init__

    def sg_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_sg_init(self, *args, **kwargs)
        tracker.track_generator(self, lambda g: g.state)

    seed_generator.SeedGenerator.__init__ = sg_init
    original_gen_init = stateful_random_ops.Generator.__init__

    def gen_init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_gen_init(self, *args, **kwargs)
        tracker.track_generator(self, lambda g: g.state)

    stateful_random_ops.Generator.__init__ = gen_init


def install_from_env(framework: str) -> Callable[[], None]:
    """The resume check's hooks for a Keras launch of it (:func:`steady.worker.inrun.resumestate.install` for
    torch); returns the function that writes the launch's end record."""
    args = launch_args()
    if args is None or framework != "tensorflow":
        return lambda: None
    tracker = KerasTracker(*args)
    _install(tracker)
    return tracker.finish
