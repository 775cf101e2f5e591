"""A fleet check through the API, in process: the spec queues runs pinned to the pool's workers, each worker
leases only its own, and the report names the worker whose values part from its group's majority."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import scipy.stats

from steady.server.cli.render import render_report
from steady.server.reports.models import Report
from tests.api.helpers import batch, lease, register, result
from tests.conftest import SQLITE_ONLY

pytestmark = SQLITE_ONLY  # the lease query's pinning runs on both backends in test_pinned_leases.py

STEPS = np.arange(10)
HEALTHY = np.linspace(2.0, 0.5, 10)


def _fleet(api, metrics=("loss",), **fleet) -> dict:
    r = api.post("/api/v1/studies", json={
        "name": "fleet", "workload": {"framework": "torch", "name": "fleet_canary"}, "seeds": [0],
        "determinism": ["strict"], "metrics": list(metrics), "fleet": fleet})
    return r


def _run_all(api, workers: dict[str, int], values_of, cpu_of=lambda name: "test cpu") -> None:
    """Each worker leases until it gets nothing and completes each run with ``values_of(name, n)``'s loss."""
    for name, wid in workers.items():
        n = 0
        while (got := lease(api, wid)) is not None:
            values = values_of(name, n)
            body = batch(got["lease_id"], 0, "loss", STEPS.tolist(), values.tolist())
            assert api.post(f"/api/v1/runs/{got['run_id']}/metrics", role="worker", json=body).status_code == 200
            digest = hashlib.sha256(values.tobytes()).hexdigest()  # the final weights follow the values
            r = api.post(f"/api/v1/runs/{got['run_id']}/complete", role="worker", json=result(
                got["lease_id"], digests={"initial_weights": "a" * 64, "final_weights": digest},
                fingerprint={"framework": "torch", "cpu_model": cpu_of(name)},
                determinism_applied={"level": "strict"}))
            assert r.status_code == 200, r.text
            n += 1


def test_the_worker_that_parts_is_named_with_its_first_step(api):
    workers = {f"w{i}": register(api, f"w{i}") for i in range(5)}
    r = _fleet(api, repeats=3, plan_one_in=1000)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    assert r.json()["progress"]["total"] == 15
    assert [w["name"] for w in r.json()["spec"]["fleet"]["pool"]] == list(workers)

    def values_of(name: str, n: int) -> np.ndarray:
        if name != "w3" or n == 1:  # w3's second run agrees: an intermittent fault
            return HEALTHY
        bad = HEALTHY.copy()
        bad[4 + n] = np.nextafter(bad[4 + n], 10.0)  # one ULP, at a different step in each run
        return bad

    _run_all(api, workers, values_of)
    report = Report.model_validate(api.get(f"/api/v1/studies/{sid}/report").json())
    assert report.outcome.status == "fail"
    (group,) = report.fleet.groups
    (finding,) = group.findings
    assert (finding.worker, finding.parted, finding.runs, finding.first_step, finding.kind) == ("w3", 2, 3, 4,
                                                                                                "intermittent")
    assert group.majority_runs == 13
    sens = report.fleet.sensitivity
    assert sens.steps_per_worker == 30
    # the plan is the fewest repeats whose 10-step runs see a 1-in-1000 fault with probability 0.95 (binomial)
    seen = scipy.stats.binom.sf(0, np.array([sens.plan_repeats - 1, sens.plan_repeats]) * 10, 1e-3)
    assert seen[0] < 0.95 <= seen[1]
    text = render_report(report)
    assert "worker w3: 2 of 3 runs part from step 4 (loss), intermittently" in text
    for healthy in ("w0", "w1", "w2", "w4"):
        assert f"worker {healthy}" not in text


def test_a_pool_without_live_workers_is_refused_and_labels_filter_it(api):
    assert _fleet(api, repeats=2).status_code == 422  # nobody registered
    register(api, "a", labels=("torch", "cpu", "pool=a"))
    register(api, "b", labels=("torch", "cpu", "pool=b"))
    r = _fleet(api, repeats=2, labels={"pool": "b"})
    assert r.status_code == 201, r.text
    assert [w["name"] for w in r.json()["spec"]["fleet"]["pool"]] == ["b"]
    assert r.json()["progress"]["total"] == 2


@pytest.mark.parametrize("extra", [{"seeds": [0, 1]}, {"determinism": ["seeded"]}, {"repeats": 2}])
def test_a_fleet_spec_runs_one_seed_at_strict(api, extra):
    register(api, "w")
    body = {"name": "fleet", "workload": {"framework": "torch", "name": "fleet_canary"}, "seeds": [0],
            "determinism": ["strict"], "metrics": ["loss"], "fleet": {"repeats": 2}, **extra}
    r = api.post("/api/v1/studies", json=body)
    assert r.status_code == 422 and "a fleet check runs one seed at strict" in r.text


@pytest.mark.parametrize("margin, verdict, status", [(0.1, "equivalent", "pass"), (None, "not_asked", "pass")])
def test_workers_on_other_stacks_are_compared_by_tost_not_bits(api, margin, verdict, status):
    workers = {f"w{i}": register(api, f"w{i}") for i in range(4)}
    metric = {"name": "loss", **({"margin": margin} if margin else {})}
    r = _fleet(api, metrics=[metric], repeats=2)
    assert r.status_code == 201, r.text
    other = HEALTHY + 1e-6  # another CPU: other bits, a final value within the margin

    _run_all(api, workers, lambda name, n: other if name in ("w2", "w3") else HEALTHY,
             cpu_of=lambda name: "cpu B" if name in ("w2", "w3") else "cpu A")
    report = Report.model_validate(api.get(f"/api/v1/studies/{r.json()['id']}/report").json())
    assert [len(g.workers) for g in report.fleet.groups] == [2, 2]
    assert not any(g.findings for g in report.fleet.groups)  # a stack of its own is not a fault
    (across,) = report.fleet.across
    assert across.verdict == verdict
    assert report.outcome.status == status, report.outcome.reason
    assert "compared by TOST" in render_report(report)


def test_a_worker_that_left_is_reported_not_waited_for(make_api, clock):
    api = make_api(lease_seconds=3600)
    workers = {f"w{i}": register(api, f"w{i}") for i in range(3)}
    r = _fleet(api, repeats=2, wait_s=600)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    _run_all(api, {k: v for k, v in workers.items() if k != "w2"}, lambda name, n: HEALTHY)  # w2 never polls
    assert api.get(f"/api/v1/studies/{sid}").json()["status"] == "running"
    clock.advance(601)
    assert lease(api, workers["w0"]) is None  # the lease path reaps w2's expired pins
    assert api.get(f"/api/v1/studies/{sid}").json()["status"] not in ("queued", "running")
    report = Report.model_validate(api.get(f"/api/v1/studies/{sid}/report").json())
    (missing,) = report.fleet.missing
    assert (missing.worker, missing.completed, missing.asked) == ("w2", 0, 2)
    assert "pinned to worker w2" in missing.reason and "did not take it by" in missing.reason
    assert report.outcome.status == "inconclusive"
    assert "worker w2 completed 0 of 2 runs: pinned to worker w2" in render_report(report)
