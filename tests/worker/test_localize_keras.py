"""Keras localization at layer granularity: planted single-layer faults named by layer and phase
(in process; the full table is `python -m steady.worker.inrun.localize_controls_keras`)."""

from __future__ import annotations

import importlib.util

import pytest

# imported in the test, not at collection: TensorFlow costs every parallel test worker 5 s of CPU otherwise
pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["Adam update of head.kernel"])
def test_planted_layer_fault_is_named_by_layer_and_phase(name):
    import tensorflow as tf

    from steady.worker.inrun import localize_controls_keras as controls

    tf.config.experimental.enable_op_determinism()
    fault = next(f for f in controls.KERAS_FAULTS if f.name == name)
    d = controls.diagnose(fault)
    assert d.replays == 2 and d.step == fault.fire_step
    got = d.answer
    assert got is not None and (got.op, got.module, got.phase) == d.expected, got
    assert got.inputs_identical and got.aligned_by == "ops"
