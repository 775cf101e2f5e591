"""Convergence against a reference through the REST API: a spec field, a report section, `steady report`."""

from __future__ import annotations

import pytest

from steady.server.reports.models import Report
from steady.server.cli.render import render_report
from steady.server.stats.convergence import ReferencePoint, check_convergence, reference_from_runs
from tests.api.helpers import batch, lease, register, result, spec

RCP = {"mean": 215040, "std": 11976.9, "n": 18}


def _run_all(api, worker_id: int, hit_step) -> None:
    """A fake worker: each run's loss reaches 0.1 at ``hit_step(seed)`` (never when None)."""
    while (got := lease(api, worker_id)) is not None:
        lid, run_id, seed = got["lease_id"], got["run_id"], got["spec"]["seed"]
        s = hit_step(seed)
        steps, values = ([0, s - 1000, s, s + 1000], [1.0, 0.2, 0.1, 0.05]) if s else ([0, 1000], [1.0, 0.5])
        r = api.post(f"/api/v1/runs/{run_id}/metrics", role="worker", json=batch(lid, 0, "loss", steps, values))
        assert r.status_code == 200, r.text
        assert api.post(f"/api/v1/runs/{run_id}/complete", role="worker", json=result(lid)).status_code == 200


def _conv(**reference) -> dict:
    return {"metric": "loss", "target": 0.1, "direction": "min", "reference": reference}


def test_published_reference_point_fail_with_normalisation(api):
    seeds = list(range(10))
    sid = api.post("/api/v1/studies", json=spec(seeds=seeds, repeats=1, determinism=["seeded"],
                                                convergence=_conv(**RCP))).json()["id"]
    hit = {s: 190000 + 1000 * s for s in seeds}
    hit[9] = None  # one run never converges: the slowest, dropped by the trimming
    _run_all(api, register(api), hit.get)
    report = api.get(f"/api/v1/studies/{sid}/report").json()
    (c,) = report["convergence"]
    expected = check_convergence([190000 + 1000 * s for s in seeds[:9]] + [float("inf")], ReferencePoint(**RCP))
    assert c["verdict"] == expected.verdict == "fail"
    assert round(c["min_acceptable_mean"]) == 206333 and round(c["max_speedup"], 4) == 1.0422
    assert c["candidate_mean"] == 194500.0 and c["n_unconverged"] == 1 and c["steps_to_target"][9] == "Infinity"
    assert c["normalization_factor"] == pytest.approx(expected.normalization_factor)
    assert "0.05" in c["guarantee"]
    text = render_report(Report.model_validate(report))
    assert "Convergence against a reference" in text and "fail" in text and "max speed-up ×1.0422" in text
    page = api.client.get(f"/studies/{sid}", headers=api.h())
    assert page.status_code == 200 and "Convergence against a reference" in page.text
    assert "206333" in page.text and "×1.0422" in page.text


def test_reference_from_another_study_passes(api):
    wid = register(api)
    ref_id = api.post("/api/v1/studies", json=spec(name="reference", seeds=list(range(8)), repeats=1,
                                                   determinism=["seeded"])).json()["id"]
    _run_all(api, wid, lambda seed: 20000 + 500 * seed)
    sid = api.post("/api/v1/studies", json=spec(name="candidate", seeds=list(range(6)), repeats=1,
                                                determinism=["seeded"], convergence=_conv(study=ref_id))).json()["id"]
    _run_all(api, wid, lambda seed: 20500 + 500 * seed)
    (c,) = api.get(f"/api/v1/studies/{sid}/report").json()["convergence"]
    assert c["reference"]["source"] == "study" and c["reference"]["n"] == 6 and c["reference"]["mean"] == 21750.0
    assert c["verdict"] == "pass" and c["normalization_factor"] == 1.0, c["reason"]


def test_repeats_of_a_seed_count_once_in_the_candidate_and_the_reference(api):
    """Two repeats per seed are one draw of the seed's steps to target, not two: the t-test's n is
    the number of seeds on both sides (the lowest repeat of each, as the other levels take them)."""
    wid = register(api)
    ref_id = api.post("/api/v1/studies", json=spec(name="reference", seeds=list(range(8)), repeats=2,
                                                   determinism=["seeded"])).json()["id"]
    _run_all(api, wid, lambda seed: 20000 + 500 * seed)
    seeds = list(range(6))
    sid = api.post("/api/v1/studies", json=spec(name="candidate", seeds=seeds, repeats=2, determinism=["seeded"],
                                                convergence=_conv(study=ref_id))).json()["id"]
    _run_all(api, wid, lambda seed: 19000 + 500 * seed)
    assert len(api.get(f"/api/v1/studies/{sid}/runs").json()["items"]) == 2 * len(seeds)
    (c,) = api.get(f"/api/v1/studies/{sid}/report").json()["convergence"]
    assert c["n_candidate_runs"] == len(seeds) and len(c["steps_to_target"]) == len(seeds)
    assert c["n_candidate"] == len(seeds) - 2  # the olympic trimming drops the fastest and the slowest seed
    assert c["reference"]["n_runs"] == 8 and c["reference"]["n"] == c["n_reference"] == 6
    point = reference_from_runs([20000.0 + 500 * s for s in range(8)])
    expected = check_convergence([19000.0 + 500 * s for s in seeds], point)
    assert c["reference"]["std"] == pytest.approx(point.std) and c["p_value"] == pytest.approx(expected.p_value)
    assert c["verdict"] == expected.verdict, c["reason"]


@pytest.mark.parametrize(
    ("conv", "field", "needle"),
    [
        (_conv(mean=1.0, std=1.0), "convergence.reference", "give {mean, std, n}"),
        (_conv(mean=1.0, std=1.0, n=5, study=1), "convergence.reference", "not both"),
        (_conv(study=999), "convergence.reference.study", "study 999 not found"),
        ({**_conv(**RCP), "direction": "down"}, "convergence.direction", "'min' or 'max'"),
        ({**_conv(**RCP), "alpha": 0.9}, "convergence.alpha", "less than or equal"),
    ],
)
def test_bad_convergence_specs_are_422(api, conv, field, needle):
    r = api.post("/api/v1/studies", json=spec(convergence=conv))
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert any(field in ".".join(map(str, d["loc"])) and needle in d["msg"] for d in detail), detail
