"""The distributed layer as a source (steady.server.stats.distributed): per-rank state within a run, the
reduction between repeats, and its place in the repeatability attribution (after data order, before numerics).

Records are built by hand in the shape the worker reports (steady.worker.contract.distributed.summarize); the
worker side, with real ranks, is tests/worker/test_distributed.py."""

from __future__ import annotations

import numpy as np

from steady.server.stats.distributed import PER_RANK_STATE, REDUCTION, distributed_cause, rank_disagreement
from steady.server.stats.repeatability import RepeatRun, repeatability
from steady.worker.contract.distributed import summarize

MODEL = ["inp.weight", "inp.bias", "alpha.weight", "alpha.bias", "beta.weight", "beta.bias"]


def _record(steps_per_rank, *, models=None, named=None, finals=None, world=3):
    ranks = []
    for k in range(world):
        state = {"steps": steps_per_rank[k], "model": (models or [MODEL] * world)[k],
                 "named_state": (named or ["n0"] * world)[k], "named_final": None}
        ranks.append({"rank": k, "rc": 0, "fingerprint": {"world": world},
                      "digests": {"rank_state": state, "final_weights": (finals or ["f"] * world)[k]}})
    return summarize(world, "gloo", ranks)


def _steps(local, reduced):
    """Per rank: steps of (local gradient digest, reduced gradient digest)."""
    return [[[f"{loc}{k}", red] for loc, red in zip(local, reduced)] for k in range(3)]


def test_same_computed_gradients_reduced_differently_is_the_reduction_from_that_update():
    a = _record(_steps("abcd", "WXYZ"))
    b = _record(_steps("abcd", "WXQQ"))  # the third update's all-reduce differs; its inputs were the same
    cause = distributed_cause([a, b])
    assert cause is not None and cause.kind == REDUCTION and cause.step == 3
    assert "3 ranks computed bitwise the same gradients" in cause.detail


def test_computed_gradients_differing_first_is_not_the_reduction():
    a = _record(_steps("abcd", "WXYZ"))
    b = _record(_steps("abed", "WXQZ"))  # update 3: the gradients a rank computed already differ (kernels)
    assert distributed_cause([a, b]) is None
    assert distributed_cause([a, a]) is None  # identical records: nothing to name
    assert distributed_cause([None, None]) is None  # one-process runs
    assert distributed_cause([a, None]) is None  # a run without the record cannot be compared
    # gradients no backward pass accumulated (set by hand): no local digest, no claim about the reduction
    blind_a = _record([[["", red] for red in "WXYZ"] for _ in range(3)])
    blind_b = _record([[["", red] for red in "WXQQ"] for _ in range(3)])
    assert distributed_cause([blind_a, blind_b]) is None


def test_a_rank_with_its_own_layer_order_is_per_rank_state():
    swapped = MODEL[:2] + MODEL[4:] + MODEL[2:4]
    rec = _record(_steps("ab", "WX"), models=[MODEL, swapped, MODEL])
    why = rank_disagreement(rec)
    assert why is not None and "rank 1 registers its parameters in another order" in why and "position 2" in why
    cause = distributed_cause([_record(_steps("ab", "WX")), rec])
    assert cause is not None and cause.kind == PER_RANK_STATE


def test_other_values_under_the_same_names_or_diverged_replicas_are_per_rank_state():
    assert "under the same parameter names" in rank_disagreement(_record(_steps("a", "W"), named=["n0", "n0", "n9"]))
    assert "replicas diverged" in rank_disagreement(_record(_steps("a", "W"), finals=["f", "g", "f"]))
    assert rank_disagreement(_record(_steps("a", "W"))) is None


def _run(values, *, init="w0", order=("o0",), fp=None, dist=None):
    v = np.asarray(values, dtype=np.float64)
    return RepeatRun(steps=np.arange(v.size), values=v, fingerprint=fp or {"distributed": {"world_size": 3}},
                     initial_weights=init, data_order=order, distributed=dist)


def test_repeatability_names_distributed_after_data_order_and_before_numerics():
    a, b = _record(_steps("abcd", "WXYZ")), _record(_steps("abcd", "WXQQ"))
    r = repeatability([_run([1.0, 0.5, 0.25], dist=a), _run([1.0, 0.5, 0.26], dist=b)])
    assert r.source == "distributed" and "reduction: at update 3" in r.reason
    # the same values without the records: kernels / numerics, as before
    assert repeatability([_run([1.0, 0.5, 0.25]), _run([1.0, 0.5, 0.26])]).source == "numerics"
    # a different data order comes first; a different fingerprint (world size 3 vs 4) before everything
    assert repeatability([_run([1.0, 0.5, 0.25], dist=a), _run([1.0, 0.5, 0.26], dist=b, order=("o1",))]
                         ).source == "data_order"
    other_world = {"distributed": {"world_size": 4}}
    assert repeatability([_run([1.0, 0.5, 0.25], dist=a), _run([1.0, 0.5, 0.26], dist=b, fp=other_world)]
                         ).source == "stack"
    # identical repeats name nothing, whatever the records say
    same = repeatability([_run([1.0, 0.5], dist=a), _run([1.0, 0.5], dist=a)])
    assert same.verdict == "identical" and same.source is None


def test_distributed_attribution_calibration_no_false_distributed_and_every_plant_named():
    from steady.server.stats.calibration import measure
    from steady.server.stats.calibration.attribution_distributed import DISTRIBUTED_ATTRIBUTION

    rng = np.random.default_rng(29)
    rates = {s.name: (s.kind, measure(DISTRIBUTED_ATTRIBUTION, s, n=40, rng=rng)) for s in DISTRIBUTED_ATTRIBUTION.scenarios}
    for name, (kind, rate) in rates.items():
        assert rate.k == (0 if kind == "healthy" else rate.n), f"{name} ({kind}): {rate.k}/{rate.n}"
    assert {"nothing", "numerics", "reduction + numerics (the kernels act first)", "reduction", "per_rank",
            "reduction+numerics", "data_order+reduction", "stack+per_rank"} <= set(rates)
