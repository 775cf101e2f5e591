"""Real training in fresh subprocesses: what each determinism level does and does not fix."""

from __future__ import annotations

import pytest

from steady.worker.agent.local import LocalResult, run_local

pytestmark = pytest.mark.slow


# Bitwise identity of the PyTorch workloads is asserted with one thread. With two threads,
# PyTorch's CPU build rarely gave a 1-ULP loss difference between runs with equal initial
# weights and data order, at `seeded` and even at `strict` (the MLP: 2 runs in 32 in one batch,
# once in a demo, once in a full test run, 0 in 200 in another batch; the hash-seed workload:
# once in a full test run; the cause is not pinned down). Steady reports such runs with source `numerics`, which is its job;
# the tests of the level mechanics should not flake on it. The kernel workload keeps two
# threads on purpose.
ONE_THREAD = 1


def run(workload: str, level: str, seed: int = 7, framework: str = "torch", threads: int = 2,
        **params) -> LocalResult:
    result = run_local({"framework": framework, "workload": workload, "seed": seed, "determinism": level,
                        "threads": threads, "params": params, "time_limit_s": 120})
    assert result.ok, f"{result.failure_kind}: {result.error}\n{result.stderr_tail[-3000:]}"
    return result


def signature(r: LocalResult) -> tuple:
    """Everything that must be bitwise equal for two runs to be identical (not step_time)."""
    series = tuple(sorted((k, tuple(v[0]), tuple(v[1])) for k, v in r.series.items() if k != "step_time"))
    return series, tuple(sorted((k, str(v)) for k, v in r.digests.items()))


def assert_complete(r: LocalResult) -> None:
    steps, losses = r.series["loss"]
    assert steps == list(range(len(steps))) and len(steps) > 10
    assert len(r.series["step_time"][0]) == len(steps)
    assert r.series["val_loss"][0] and r.series["val_acc"][0]
    d = r.digests
    assert all(len(d[k]) == 64 for k in ("initial_weights", "final_weights", "optimizer_state"))
    assert d["data_order"] and all(len(x) == 64 for x in d["data_order"])
    assert r.fingerprint["python"] and r.fingerprint["cpu_model"] and r.fingerprint["numpy_version"]
    assert r.determinism_applied["data_split"]["split_seed"] == 0


@pytest.mark.parametrize("level", ["seeded", "strict"])
def test_torch_mlp_is_bitwise_repeatable(level):
    a, b = run("torch_mlp", level, threads=ONE_THREAD), run("torch_mlp", level, threads=ONE_THREAD)
    assert_complete(a)
    assert signature(a) == signature(b)
    applied = a.determinism_applied
    assert applied["level"] == level and applied["framework_seeded"] and applied["torch_manual_seed"] == 7
    assert applied["deterministic_algorithms"] is (level == "strict")
    assert a.fingerprint["env"]["PYTHONHASHSEED"] == "7"
    assert ("CUBLAS_WORKSPACE_CONFIG" in a.fingerprint["env"]) is (level == "strict")
    assert a.fingerprint["framework_version"].startswith("2.")
    # another seed is another run
    c = run("torch_mlp", level, seed=8, threads=ONE_THREAD)
    assert c.digests["initial_weights"] != a.digests["initial_weights"]


def test_torch_mlp_at_none_fixes_nothing():
    a, b = run("torch_mlp", "none"), run("torch_mlp", "none")
    assert a.digests["initial_weights"] != b.digests["initial_weights"]
    assert a.digests["data_order"][0] != b.digests["data_order"][0]
    assert a.determinism_applied["seed"] is None and not a.determinism_applied["framework_seeded"]
    assert a.fingerprint["env"]["PYTHONHASHSEED"] == "random"


def test_dataloader_workers_are_repeatable_when_seeded():
    a = run("torch_dataloader_workers", "seeded", threads=ONE_THREAD)
    b = run("torch_dataloader_workers", "seeded", threads=ONE_THREAD)
    assert_complete(a)
    assert signature(a) == signature(b)


def test_keras_mlp_strict_is_bitwise_repeatable():
    # one epoch (23 steps) shows bitwise identity as well as three; Keras' per-step cost is most of a run
    a = run("keras_mlp", "strict", framework="tensorflow", epochs=1)
    b = run("keras_mlp", "strict", framework="tensorflow", epochs=1)
    assert_complete(a)
    assert signature(a) == signature(b)
    assert a.determinism_applied["tf_op_determinism"] and a.fingerprint["env"]["TF_DETERMINISTIC_OPS"] == "1"
    assert a.fingerprint["tensorflow_version"].startswith("2.")


def test_nondeterministic_kernels_vary_at_seeded_and_not_at_strict():
    """12 steps (of the workload's 40, 0.17 s each on CPU): the seeded runs are told apart by ``param_sum``, the
    float64 sum of every weight, which the accumulation order changes from the first update on (step 0 in 3 of 3
    pairs measured); the float32 loss rounds that away until step 14-25, so a loss-only comparison would need 40.
    12 steps keep ``assert_complete``'s more-than-10 steps and two epochs of data order."""
    def kernels(level: str) -> LocalResult:
        return run("torch_nondeterministic_kernels", level, steps=12)

    def weights(r: LocalResult) -> tuple:
        return tuple(r.values("param_sum"))

    seeded = [kernels("seeded") for _ in range(2)]
    # The variation comes from thread interleaving; on a heavily loaded box the two threads
    # may run back to back more often, so more runs follow until two differ (at most 8).
    while len({weights(r) for r in seeded}) < 2 and len(seeded) < 8:
        seeded.append(kernels("seeded"))
    strict = [kernels("strict") for _ in range(2)]
    assert_complete(seeded[0])
    # same seed, same initial weights and data order: the kernels are the only source
    assert len({r.digests["initial_weights"] for r in seeded + strict}) == 1
    assert len({tuple(r.digests["data_order"]) for r in seeded + strict}) == 1
    distinct_seeded = len({weights(r) for r in seeded})
    distinct_strict = len({signature(r) for r in strict})  # loss, param_sum, val metrics and every digest
    print(f"kernel workload: {distinct_seeded} distinct param_sum series in {len(seeded)} seeded runs, "
          f"{distinct_strict} distinct runs in 2 strict runs")
    assert distinct_seeded >= 2
    assert distinct_strict == 1


def test_hashseed_vocab_depends_on_pythonhashseed():
    none = [run("hashseed_vocab", "none", threads=ONE_THREAD) for _ in range(2)]
    seeded = [run("hashseed_vocab", "seeded", threads=ONE_THREAD) for _ in range(2)]
    assert_complete(seeded[0])
    assert none[0].determinism_applied["vocab_order_sha256"] != none[1].determinism_applied["vocab_order_sha256"]
    assert none[0].values("loss") != none[1].values("loss")
    assert signature(seeded[0]) == signature(seeded[1])
