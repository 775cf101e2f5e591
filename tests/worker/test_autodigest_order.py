"""The automatic data order of PyTorch DataLoaders: it changes no result, it digests exactly the
indices that were fed, and it lets attribution say ``data_order`` for code that never logged one."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import dataloader

from steady.server.stats.repeatability import RepeatRun, repeatability
from steady.worker.inrun.autodigest_order import install_torch
from steady.worker.contract.digests import order_digest
from steady.worker.agent.local import run_local

FIXTURE = Path(__file__).parent / "fixtures" / "torch_loader_order.py"


def _fixture():
    spec = importlib.util.spec_from_file_location("torch_loader_order", FIXTURE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bits(losses: list[float]) -> np.ndarray:
    return np.asarray(losses, np.float64).view(np.int64)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_hook_changes_no_result_and_digests_the_fed_indices(num_workers):
    train = _fixture().train
    plain_losses, plain_fed = train(5, num_workers=num_workers)
    original = dataloader._BaseDataLoaderIter.__dict__["_next_index"]
    recorded: list[list[str]] = []
    finish = install_torch(recorded.append)
    try:
        hooked_losses, hooked_fed = train(5, num_workers=num_workers)
    finally:
        finish()
    assert dataloader._BaseDataLoaderIter.__dict__["_next_index"] is original  # the hook is gone
    # no RNG draw, no extra iteration: bitwise the same losses and the same order
    assert np.array_equal(_bits(plain_losses), _bits(hooked_losses)) and plain_fed == hooked_fed
    assert recorded == [[order_digest(epoch) for epoch in hooked_fed]]
    assert recorded[0][0] != recorded[0][1]  # a reshuffle per epoch


def test_the_loader_that_hands_out_most_indices_is_the_runs_order():
    import torch
    from torch.utils.data import DataLoader

    small = DataLoader(list(range(4)), batch_size=2)
    big = DataLoader(list(range(10)), batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(3))
    recorded: list[list[str]] = []
    finish = install_torch(recorded.append)
    try:
        seen_small = [int(v) for b in small for v in b]  # used first, but smaller
        seen_big = [[int(v) for b in big for v in b] for _ in range(2)]
        list(DataLoader(range(3), batch_size=None))  # no batching: one index per call
    finally:
        finish()
    assert seen_small == [0, 1, 2, 3]
    assert recorded == [[order_digest(e) for e in seen_big]]


def test_a_sampler_of_non_integers_is_left_out():
    from torch.utils.data import DataLoader

    keys = ["a", "b", "c", "d", "e", "f"]
    by_key = DataLoader({k: i for i, k in enumerate(keys)}, sampler=keys, batch_size=2)  # a mapping dataset
    recorded: list[list[str]] = []
    finish = install_torch(recorded.append)
    try:
        assert [int(v) for b in by_key for v in b] == [0, 1, 2, 3, 4, 5]  # the training is undisturbed
    finally:
        finish()
    assert recorded == [[]]  # no order rather than a wrong one


def _run(order_seed: int, **params):
    r = run_local({"framework": "torch", "entrypoint": str(FIXTURE), "seed": 1, "determinism": "none",
                   "threads": 1, "time_limit_s": 300, "params": {"order_seed": order_seed, **params}})
    assert r.ok, r.stderr_tail
    return r


# The entrypoint run of order seed 4, made once for the two tests below (one xdist worker runs both): the first
# compares it with other order seeds and with a repeat of its own, the second with the same script as a command.
SHARED = pytest.mark.xdist_group("autodigest-order-entry-run")


@pytest.fixture(scope="module")
def entry_run_4():
    return _run(4)


@pytest.mark.slow
@SHARED
def test_different_shuffle_seeds_are_attributed_to_data_order_at_none(entry_run_4):
    def repeat(r) -> RepeatRun:
        steps, values = r.series["loss"]
        return RepeatRun(steps=np.asarray(steps, np.int64), values=np.asarray(values, np.float64),
                         initial_weights=r.digests["initial_weights"], data_order=tuple(r.digests["data_order"]))

    a, b, c = entry_run_4, _run(2), _run(4)
    assert a.determinism_applied["data_order_digest_source"] == "automatic"
    assert len(a.digests["data_order"]) == 2  # one per epoch
    assert a.digests["initial_weights"] == b.digests["initial_weights"]  # the script seeds its init itself
    res = repeatability([repeat(a), repeat(b)], determinism="none")
    assert res.source == "data_order" and res.data_order_epoch == 0, res.reason
    # the same shuffle seed: the same order digests, and bitwise the same run
    assert a.digests["data_order"] == c.digests["data_order"]
    assert repeatability([repeat(a), repeat(c)], determinism="none").verdict == "identical"
    # an explicit sdk.log_data_order wins over the automatic one
    d = _run(4, explicit=True)
    assert d.digests["data_order"] == [order_digest(range(24))] * 2
    assert "data_order_digest_source" not in d.determinism_applied


@pytest.mark.slow
@SHARED
def test_a_command_workload_records_the_same_order_through_the_shim(tmp_path, entry_run_4):
    spec = {"framework": "torch", "seed": 1, "determinism": "none", "threads": 1, "time_limit_s": 300}
    cmd = run_local({**spec, "command": ["python", str(FIXTURE), "4"]}, work_dir=str(tmp_path / "cmd"))
    entry = entry_run_4  # the same script and order seed as an entrypoint
    assert cmd.ok, cmd.stderr_tail
    assert cmd.determinism_applied["data_order_digest_source"] == "automatic"
    assert len(cmd.digests["data_order"]) == 2 and cmd.digests["data_order"] == entry.digests["data_order"]
