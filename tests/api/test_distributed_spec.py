"""The distributed option of a study spec: refused with a 422 naming the field, handed to every run (an
arm's own world size to its runs), and the per-rank records the runs report read by the report, which
names the distributed layer. The worker side (real ranks) is tests/worker/test_distributed.py."""

from __future__ import annotations

import pytest

from tests.api.helpers import batch, lease, register, result, spec
from tests.conftest import SQLITE_ONLY

pytestmark = SQLITE_ONLY

COMMAND = {"framework": "torch", "command": ["python", "train.py", "--seed", "{seed}"]}
DISTRIBUTED = {**COMMAND, "distributed": {"nproc": 3}}


@pytest.mark.parametrize(
    ("change", "field", "needle"),
    [
        ({"workload": {**COMMAND, "distributed": {"nproc": 1}}}, "workload.distributed.nproc", "greater than or equal to 2"),
        ({"workload": {**COMMAND, "distributed": {"nproc": 9}}}, "workload.distributed.nproc", "less than or equal to 8"),
        ({"workload": {**COMMAND, "distributed": {"nproc": 3, "backend": "mpi"}}}, "workload.distributed.backend", "'gloo' or 'nccl'"),
        ({"workload": {**COMMAND, "distributed": {"nproc": 3, "nodes": 2}}}, "workload.distributed.nodes", "Extra inputs"),
        ({"workload": {**COMMAND, "command": ["torchrun", "--nnodes", "2", "--nproc-per-node", "2", "t.py"]}},
         "workload.command", "one node"),
        ({"workload": {**COMMAND, "command": ["torchrun", "--rdzv-backend", "c10d", "--nproc-per-node", "2", "t.py"]}},
         "workload.command", "--rdzv-backend is not supported"),
        ({"workload": {**DISTRIBUTED, "command": ["torchrun", "--nproc-per-node", "2", "t.py"]}},
         "workload.distributed", "not both"),
        ({"workload": DISTRIBUTED, "resume": {"at": [3]}}, "resume", "multi-process run"),
    ],
)
def test_bad_distributed_specs_are_422_naming_the_field(api, change, field, needle):
    r = api.post("/api/v1/studies", json=spec(**{"workload": COMMAND, **change}))
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert any(field == ".".join(map(str, d["loc"][1:])) and needle in d["msg"] for d in detail), detail


def _rank_record(reduced: str) -> dict:
    ranks = [{"rank": k, "rc": 0, "fingerprint": "fp", "initial_weights": "i", "final_weights": "f",
              "named_state": "n", "named_final": "n", "model": ["a", "b"], "steps": [[f"l{k}", "r"], [f"m{k}", reduced]]}
             for k in range(3)]
    return {"world_size": 3, "backend": "gloo", "ranks": ranks}


def test_runs_get_their_arms_world_size_and_the_report_names_the_reduction(api):
    body = spec(workload=DISTRIBUTED, seeds=[1], repeats=2, determinism=["seeded"], metrics=[{"name": "loss"}],
                arms=[{"name": "three"}, {"name": "four", "distributed": {"nproc": 4}}])
    r = api.post("/api/v1/studies", json=body)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    worker = register(api)
    seen = []
    while (leased := lease(api, worker)) is not None:
        s = leased["spec"]
        seen.append((s["stack"], s["distributed"]["nproc"], s["distributed"]["backend"]))
        # the two repeats of arm 'three' computed the same gradients and all-reduced them to different ones
        record = _rank_record("r2" if s["repeat"] else "r1")
        last = 0.25 + (1e-7 if s["repeat"] else 0.0)
        r = api.post(f"/api/v1/runs/{leased['run_id']}/metrics", role="worker",
                     json=batch(leased["lease_id"], 0, "loss", [0, 1, 2], [1.0, 0.5, last]))
        assert r.status_code == 200, r.text
        digests = {"initial_weights": "a" * 64, "data_order": ["b" * 64], "distributed": record}
        r = api.post(f"/api/v1/runs/{leased['run_id']}/complete", role="worker",
                     json=result(leased["lease_id"], digests=digests, determinism_applied={"device": "cpu"},
                                 fingerprint={"torch": "2.13.0", "distributed": {"world_size": s["distributed"]["nproc"]}}))
        assert r.status_code == 200, r.text
    assert sorted(seen) == [("four", 4, "gloo")] * 2 + [("three", 3, "gloo")] * 2
    report = api.get(f"/api/v1/studies/{sid}/report").json()
    rep = [v for v in report["verdicts"] if v["level"] == "repeatability" and v["group"]["stack"] == "three"]
    assert rep and rep[0]["source"] == "distributed" and "reduction: at update 2" in rep[0]["reason"], rep
