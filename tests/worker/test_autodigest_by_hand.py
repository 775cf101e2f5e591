"""Weight digests of scripts that step their weights by hand: no optimizer hook fires, so the model is the
module the code first calls (torch) or calls, eagerly or traced by tf.function (Keras custom loop), or a model
found when the run ends; weights in plain tensors get no digest, and the run says which and why. A Keras run
has no data-order digest (tf.data draws the order inside TensorFlow) and says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from steady.worker.agent.local import run_local
from steady.worker.inrun import autodigest

pytestmark = pytest.mark.slow
FIXTURES = Path(__file__).parent / "fixtures"
SPEC = {"seed": 1, "determinism": "none", "threads": 1, "time_limit_s": 300}


def _run(script: str, framework: str, *args: str):
    r = run_local({**SPEC, "framework": framework, "command": ["python", str(FIXTURES / script), *args]})
    assert r.ok, r.stderr_tail
    return r


def test_hand_written_updates_get_weight_digests_from_the_module_called():
    a, b = _run("torch_hand_update.py", "torch", "--seed", "3"), _run("torch_hand_update.py", "torch", "--seed", "3")
    c = _run("torch_hand_update.py", "torch", "--seed", "4")
    for r in (a, b, c):
        assert len(r.digests["initial_weights"]) == 64 and len(r.digests["final_weights"]) == 64
        assert r.digests["initial_weights"] != r.digests["final_weights"]  # taken before the first update
        assert r.determinism_applied["initial_weights_digest_source"] == "automatic (module)"
        assert "digests_missing" not in r.determinism_applied
        assert r.series["loss"][1][0] == round(r.series["loss"][1][0], 2)  # printed with two decimals
    # the script seeds itself: the same seed gives the same weights bitwise, another seed other weights
    assert (a.digests["initial_weights"], a.digests["final_weights"]) == (b.digests["initial_weights"],
                                                                          b.digests["final_weights"])
    assert a.digests["initial_weights"] != c.digests["initial_weights"]


def test_weights_in_plain_tensors_say_which_digest_is_missing_and_why():
    r = _run("torch_hand_update.py", "torch", "--seed", "3", "--bare")
    assert r.digests["initial_weights"] is None and r.digests["final_weights"] is None
    missing = r.determinism_applied["digests_missing"]
    assert set(missing) == {"initial_weights", "final_weights"}
    assert "no torch.optim optimizer stepped" in missing["final_weights"] and "nn.Module" in missing["final_weights"]


def test_a_keras_custom_loop_gets_weight_digests_from_the_model_it_calls():
    r = _run("keras_custom_loop.py", "tensorflow", "--seed", "3")
    assert len(r.digests["initial_weights"]) == 64 and len(r.digests["final_weights"]) == 64
    assert r.digests["initial_weights"] != r.digests["final_weights"]
    assert r.determinism_applied["final_weights_digest_source"] == "automatic (model)"
    assert r.determinism_applied["digests_missing"] == {"data_order": autodigest.NO_KERAS_ORDER}


def test_a_tf_function_loop_stepping_by_hand_is_digested_before_its_first_update(tmp_path):
    """The model is first called inside a tf.function trace: its weights are read then, before the function
    first runs; they equal the script's own digest before training, and the final ones its digest after. The
    model is built around an inner model (called while it is built, and inside every call of the outer one):
    it is digested whole (the outermost call on real inputs), not as the inner one. The plain model of the
    same loop is the Keras e2e test's (tests/reports/test_keras_loop_e2e.py)."""
    dump = tmp_path / "digests.json"
    r = _run("keras_tf_function_loop.py", "tensorflow", "--seed", "3", "--dump", str(dump), "--nested")
    own = json.loads(dump.read_text())
    assert r.digests["initial_weights"] == own["initial"] and r.digests["final_weights"] == own["final"]
    assert own["initial"] != own["final"]
    assert r.determinism_applied["initial_weights_digest_source"] == "automatic (model)"
    assert r.determinism_applied["digests_missing"] == {"data_order": autodigest.NO_KERAS_ORDER}
    assert r.digests["data_order"] == []


def test_weights_in_a_tf_module_of_its_own_are_found_at_exit_and_the_initial_digest_is_said_missing():
    r = _run("keras_tf_function_loop.py", "tensorflow", "--seed", "3", "--module")
    assert r.digests["initial_weights"] is None and len(r.digests["final_weights"]) == 64
    assert r.determinism_applied["final_weights_digest_source"] == "automatic (model found at exit)"
    assert r.determinism_applied["digests_missing"] == {"data_order": autodigest.NO_KERAS_ORDER,
                                                       "initial_weights": autodigest.NO_KERAS_CALL}
