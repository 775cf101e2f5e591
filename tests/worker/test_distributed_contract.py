"""The multi-process contract without processes: torchrun commands the worker plays, the rank environment,
the per-rank record (steady.worker.contract.distributed)."""

from __future__ import annotations

import pytest

from steady.worker.contract.distributed import TorchrunError, rank_env, summarize, torchrun_launch


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["python", "train.py"], None),
        (["torchrun", "--nproc-per-node", "3", "train.py", "--seed", "{seed}"], (3, ["python", "train.py", "--seed", "{seed}"])),
        (["torchrun", "--standalone", "--nnodes=1", "--nproc_per_node=4", "t.py"], (4, ["python", "t.py"])),
        (["python", "-m", "torch.distributed.run", "--nproc-per-node", "2", "t.py"], (2, ["python", "t.py"])),
        (["torchrun", "--nproc-per-node", "2", "--no-python", "./train", "-x"], (2, ["./train", "-x"])),
    ],
)
def test_torchrun_commands_become_ranks_of_one_script(command, expected):
    assert torchrun_launch(command) == expected


@pytest.mark.parametrize(
    ("command", "needle"),
    [
        (["torchrun", "train.py"], "without --nproc-per-node"),
        (["torchrun", "--nproc-per-node", "gpu", "t.py"], "give the number of processes"),
        (["torchrun", "--nproc-per-node", "9", "t.py"], "2 to 8 processes"),
        (["torchrun", "--nnodes", "2", "--nproc-per-node", "2", "t.py"], "one node"),
        (["torchrun", "--master-port", "29500", "--nproc-per-node", "2", "t.py"], "--master-port is not supported"),
        (["torchrun", "--nproc-per-node", "2"], "no script"),
    ],
)
def test_torchrun_options_the_worker_does_not_play_are_refused_by_name(command, needle):
    with pytest.raises(TorchrunError, match=needle):
        torchrun_launch(command)


def test_rank_env_is_what_torchrun_sets():
    env = rank_env(2, 4, 41234, "gloo", "abc")
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("2", "2", "4", "4")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "41234")


def test_summarize_keeps_each_ranks_digests_in_rank_order():
    ranks = [{"rank": 1, "rc": 0, "fingerprint": {"a": 1}, "digests": {"final_weights": "f1", "rank_state": {
        "steps": [["l", "r"]], "model": ["x"], "named_state": "n"}}},
             {"rank": 0, "rc": 0, "fingerprint": {"a": 1}, "digests": {"final_weights": "f0"}}]
    rec = summarize(2, "gloo", ranks)
    assert rec["world_size"] == 2 and [r["rank"] for r in rec["ranks"]] == [0, 1]
    assert rec["ranks"][1]["steps"] == [["l", "r"]] and rec["ranks"][0]["steps"] == []
    assert rec["ranks"][0]["fingerprint"] == rec["ranks"][1]["fingerprint"]
