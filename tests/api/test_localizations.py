"""Localizations over the API: kept per pair of repeats, part of their repeatability verdict, refused
(422 naming the field) for runs that are not two repeats of the study; a run's spec for its replay."""

from __future__ import annotations

from tests.api.helpers import error_of, lease, register, spec


def _study(api) -> tuple[int, dict[tuple[int, int], int]]:
    """An external study: seeds 0 and 1, two repeats each, the repeats of seed 0 parting at step 3."""
    sid = api.post("/api/v1/studies", json={"name": "parting", "kind": "external", "metrics": ["loss"]}).json()["id"]
    ids = {}
    for seed in (0, 1):
        for repeat in (0, 1):
            values = [1.0 / (1 + s) + 0.01 * seed for s in range(8)]
            if seed == 0 and repeat == 1:
                values[3:] = [v + 1e-6 for v in values[3:]]
            run = {"seed": seed, "determinism": "strict", "stack": {"name": "cpu"},
                   "metrics": {"loss": {"steps": list(range(8)), "values": values}}}
            r = api.post(f"/api/v1/studies/{sid}/runs", json=run)
            assert r.status_code == 201, r.text
            ids[seed, repeat] = r.json()["id"]
    return sid, ids


ANSWER = {"step": 3, "op": "aten::index_add_", "module": "Net.pool", "phase": "forward", "line": "train.py:42",
          "index": 17, "inputs_identical": True, "cause": "op", "aligned_by": "ops"}
SENTENCE = ("first divergent op: `aten::index_add_` in `Net.pool` (forward) at train.py:42, step 3, "
            "inputs identical → the op itself")


def _body(run_ids, **change):
    return {"run_ids": list(run_ids), "status": "localized", "step": 3, "replays": 2, "answer": ANSWER,
            "sentence": SENTENCE, **change}


def test_a_localization_is_kept_and_shown_in_its_pairs_verdict(api):
    sid, ids = _study(api)
    pair = (ids[0, 0], ids[0, 1])
    r = api.post(f"/api/v1/studies/{sid}/localizations", json=_body(pair))
    assert r.status_code == 200, r.text
    assert r.json()["localized_at"] and r.json()["answer"]["module"] == "Net.pool"

    report = api.get(f"/api/v1/studies/{sid}/report").json()  # the cached report is computed again
    (v,) = [v for v in report["verdicts"] if v["level"] == "repeatability"]
    assert v["verdict"] != "identical"
    assert v["localization"]["sentence"] == SENTENCE and v["localization"]["run_ids"] == list(pair)
    # a second localization of the same pair replaces the first
    again = _body(pair[::-1], status="identical", step=None, answer=None, replays=4,
                  sentence="the divergence did not recur")
    assert api.post(f"/api/v1/studies/{sid}/localizations", json=again).status_code == 200
    kept = api.get(f"/api/v1/studies/{sid}/localizations").json()["items"]
    assert [k["status"] for k in kept] == ["identical"]
    page = api.client.get(f"/runs/{pair[0]}", headers=api.h())
    assert page.status_code == 200 and "data-localization" in page.text and "did not recur" in page.text


def test_a_localization_of_runs_that_are_not_two_repeats_is_422_naming_the_field(api):
    sid, ids = _study(api)
    _, other = _study(api)
    a, b = ids[0, 0], ids[0, 1]
    cases = [
        (_body((a, a)), ["body", "run_ids"]),  # the same run twice
        (_body((a, ids[1, 0])), ["body", "run_ids"]),  # different seeds: not repeats
        (_body((a, other[0, 1])), ["body", "run_ids", 1]),  # another study's run
        (_body((a, b), answer=None), ["body", "answer"]),  # localized, but no answer
        (_body((a, b), step=4), ["body", "step"]),  # not the answer's step
        (_body((a, b, ids[1, 0])), ["body", "run_ids"]),  # three runs
        (_body((a, b), answer={**ANSWER, "phase": "warmup"}), ["body", "answer", "phase"]),
    ]
    for body, field in cases:
        r = api.post(f"/api/v1/studies/{sid}/localizations", json=body)
        assert r.status_code == 422, r.text
        assert error_of(r)["loc"] == field, (body, r.json())
    assert api.get(f"/api/v1/studies/{sid}/localizations").json()["items"] == []


def test_a_runs_spec_is_its_lease_spec_and_carries_the_step_digest_mode(api):
    assert error_of(api.post("/api/v1/studies", json=spec(localize="always")))["loc"] == ["body", "localize"]
    sid = api.post("/api/v1/studies", json=spec(localize="steps", seeds=[0], repeats=1,
                                                 determinism=["strict"])).json()["id"]
    (run,) = api.get(f"/api/v1/studies/{sid}/runs").json()["items"]
    got = api.get(f"/api/v1/runs/{run['id']}/spec")
    assert got.status_code == 200, got.text
    leased = lease(api, register(api))
    assert got.json() == leased["spec"] and got.json()["localize_steps"] is True
    assert "run_token" not in got.json()
