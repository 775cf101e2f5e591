"""The resume option of a study spec: refused with a 422 naming the field, handed to the runs it selects,
and the checks the runs report judged in the study's report (bitwise, or against the seed band at
``none``). The worker side (the launches, the kill, the digests) is in tests/worker/test_resume.py."""

from __future__ import annotations

import pytest

from tests.api.helpers import batch, lease, register, result, spec
from tests.conftest import SQLITE_ONLY

pytestmark = SQLITE_ONLY

COMMAND = {"framework": "torch", "command": ["python", "train.py", "--seed", "{seed}", "--ckpt", "{checkpoint_dir}"]}


@pytest.mark.parametrize(
    ("change", "field", "needle"),
    [
        ({"resume": {"at": []}}, "resume.at", "at least 1"),
        ({"resume": {"at": [0]}}, "resume.at.0", "greater than or equal to 1"),
        ({"resume": {"at": [5, 3]}}, "resume.at", "strictly increasing"),
        ({"resume": {"at": [3], "runs": 3}}, "resume.runs", "only 2 seed(s)"),
        ({"resume": {"at": [3], "every": 2}}, "resume.every", "Extra inputs"),
        ({"resume": {"at": [3], "signal": "hup"}}, "resume.signal", "'kill' or 'term'"),
        ({"resume": {"at": [3]}, "workload": {"framework": "torch", "name": "torch_mlp"}}, "resume", "your own code"),
        ({"resume": {"at": [3]}, "workload": {**COMMAND, "framework": "python"}}, "resume", "framework is python"),
        ({"resume": {"at": [3], "signal": "term"}, "workload": {**COMMAND, "framework": "tensorflow"}}, "resume.signal",
         "'term' is for torch runs"),
        ({"resume": {"at": [3], "micro_batches": 1}, "workload": {**COMMAND, "framework": "tensorflow"}},
         "resume.micro_batches", "torch backward passes"),
        ({"resume": {"at": [3], "micro_batches": 0}}, "resume.micro_batches", "greater than or equal to 1"),
        ({"workload": {**COMMAND, "command": ["python", "t.py", "{checkpoint}"]}}, "workload.command", "unknown placeholder"),
    ],
)
def test_bad_resume_specs_are_422_naming_the_field(api, change, field, needle):
    r = api.post("/api/v1/studies", json=spec(**{"workload": COMMAND, **change}))
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert any(field == ".".join(map(str, d["loc"][1:])) and needle in d["msg"] for d in detail), detail


def _record(verdict: str, missing: list[str], **extra) -> dict:
    return {"at": [3], "verdict": verdict, "missing": missing, "points": [{"step": 3, "differ": missing}],
            "reason": "not restored: " + ", ".join(missing) if missing else "", "steps": {"reference": 6, "resumed": 6},
            **extra}


def _run_study(api, level: str, record: dict, finals: dict[int, float]) -> dict:
    body = spec(workload=COMMAND, seeds=[1, 2, 3], repeats=1, determinism=[level], resume={"at": [3]},
                metrics=[{"name": "loss"}])
    sid = api.post("/api/v1/studies", json=body).json()["id"]
    worker = register(api)
    leased_specs = {}
    while (leased := lease(api, worker)) is not None:
        seed = leased["spec"]["seed"]
        leased_specs[seed] = leased["spec"]
        digests = {"resume": record} if leased["spec"].get("resume") else {}
        r = api.post(f"/api/v1/runs/{leased['run_id']}/metrics", role="worker",
                     json=batch(leased["lease_id"], 0, "loss", [0, 1], [1.0, finals[seed]]))
        assert r.status_code == 200, r.text
        r = api.post(f"/api/v1/runs/{leased['run_id']}/complete", role="worker",
                     json=result(leased["lease_id"], final_metrics={"loss": finals[seed]}, digests=digests,
                                 determinism_applied={"device": "cpu"}))
        assert r.status_code == 200, r.text
    # only the first seed carries the check, with the spec's resume points
    assert {s: (v.get("resume") or {}).get("at") for s, v in leased_specs.items()} == {1: [3], 2: None, 3: None}
    return api.get(f"/api/v1/studies/{sid}/report").json()


def test_the_report_names_what_a_strict_resume_did_not_restore_and_fails_the_study(api):
    report = _run_study(api, "strict", _record("not_restored", ["numpy_rng", "step_counter"]),
                        {1: 0.5, 2: 0.6, 3: 0.7})
    (check,) = report["resume"]
    assert check["verdict"] == "not_restored" and check["missing"] == ["numpy_rng", "step_counter"]
    assert "did not restore the NumPy RNG state (np.random.get_state); step counter" in check["summary"]
    assert report["outcome"]["status"] == "fail" and check["summary"] in report["outcome"]["reason"]


def test_an_identical_strict_resume_passes(api):
    report = _run_study(api, "strict", _record("identical", []), {1: 0.5, 2: 0.6, 3: 0.7})
    (check,) = report["resume"]
    assert check["verdict"] == "identical" and "bitwise" in check["guarantee"]
    assert any(c["kind"] == "resume" and c["status"] == "pass" for c in report["outcome"]["checks"])


@pytest.mark.parametrize(("resumed", "verdict"), [(0.65, "within_seed_band"), (0.9, "outside_seed_band")])
def test_at_none_the_resumed_final_value_is_judged_against_the_seed_band(api, resumed, verdict):
    """At ``none`` the state digests promise nothing (an uninterrupted repeat differs too): the digests'
    'not restored' is not what is judged, the resumed run's final loss against the seeds' range is."""
    record = _record("not_restored", ["parameters", "torch_rng"],
                     final_metrics={"reference": {"loss": 0.5}, "resumed": {"loss": resumed}})
    report = _run_study(api, "none", record, {1: 0.5, 2: 0.6, 3: 0.7})
    (check,) = report["resume"]
    assert check["verdict"] == verdict, check
    assert "seed band [0.5, 0.7] from 3 seeds" in check["reason"]
    assert "2/(n+1) = 0.5" in check["guarantee"]
