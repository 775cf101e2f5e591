"""``GET /api/v1/compare`` in process, with runs a worker reports over the wire: the spec's metric and
margin by default; differences of values parsed from printed text in printed digits, of binary floats in
ULPs; a difference attributed to the stack only when the stack alone differs, and to numerics only when
nothing recorded differs. (A user's script through the CLI: tests/reports/test_compare_e2e.py.)"""

from __future__ import annotations

from typing import Any

from steady.worker.contract.protocol import Series
from tests.api.helpers import lease, register, result
from tests.conftest import BOTH_BACKENDS, SQLITE_ONLY

pytestmark = SQLITE_ONLY

SPEC = {
    "name": "own script",
    "workload": {"framework": "torch", "command": ["python", "train.py", "--seed", "{seed}", "--lr", "0.05"]},
    "seeds": [0, 1],
    "determinism": ["seeded"],
    "max_attempts": 1,
    "metrics": [{"name": "acc", "margin": 0.1}],
}


def _study(api, **overrides: Any) -> int:
    r = api.post("/api/v1/studies", json={**SPEC, **overrides})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _run_all(api, worker: int, values: dict[tuple, list[float]], fingerprint: dict[int, dict]) -> None:
    """Lease every queued run and report it: ``acc`` as stdout-parsed text (4 decimals), ``loss`` as binary
    floats; ``values[(study, seed[, arm])]`` are the acc values, loss is acc / 3."""
    while (leased := lease(api, worker)) is not None:
        run = api.get(f"/api/v1/runs/{leased['run_id']}").json()
        acc = values.get((run["study_id"], run["seed"], run["stack"])) or values[(run["study_id"], run["seed"])]
        text = Series.packed("acc", list(range(len(acc))), acc)
        text = text.model_copy(update={"resolution": 1e-4})
        binary = Series.packed("loss", list(range(len(acc))), [a / 3 for a in acc])
        body = {"lease_id": leased["lease_id"], "seq": 0,
                "series": [s.model_dump(exclude_none=True) for s in (text, binary)]}
        assert api.post(f"/api/v1/runs/{leased['run_id']}/metrics", role="worker", json=body).status_code == 200
        r = api.post(f"/api/v1/runs/{leased['run_id']}/complete", role="worker",
                     json=result(leased["lease_id"], final_metrics={"acc": acc[-1]},
                                 fingerprint=fingerprint[run["study_id"]]))
        assert r.status_code == 200, r.text


@BOTH_BACKENDS
def test_spec_metric_and_margin_by_default_and_text_values_in_printed_digits(api):
    a, b = _study(api), _study(api)
    fp = {"numpy_version": "2.0.0", "threads": {"OMP_NUM_THREADS": "1"}}
    _run_all(api, register(api), {(a, 0): [0.5, 0.8123], (a, 1): [0.5, 0.8311],
                                  (b, 0): [0.5, 0.8125], (b, 1): [0.5, 0.8311]}, {a: fp, b: fp})
    c = api.get("/api/v1/compare", params={"baseline": a, "candidate": b}).json()
    assert [(m["name"], m["margin"], m["margin_from"]) for m in c["metrics"]] == [("acc", 0.1, "spec")]
    assert c["differences"] == [] and "numerics" in c["attribution"]
    (v,) = c["verdicts"]
    pairs = v["same_seed"]
    assert pairs["max_ulps"] is None and pairs["resolution"] == 1e-4 and pairs["source"] == "numerics"
    assert "2 in the last printed digit, 0.0001" in v["reason"] and "ULPs" not in v["reason"], v["reason"]
    assert "same seed in both studies" in v["reason"] and "both stacks" not in v["reason"]
    # the SDK's binary floats (loss here) keep their ULPs
    loss = api.get("/api/v1/compare", params={"baseline": a, "candidate": b, "metric": "loss"}).json()
    assert loss["metrics"][0]["margin_from"] == "none" and loss["verdicts"][0]["same_seed"]["max_ulps"] > 0
    assert "ULPs" in loss["verdicts"][0]["reason"]


def test_only_the_stack_differs_or_the_setup_does(api):
    a, b, c = _study(api), _study(api), _study(api, workload={**SPEC["workload"], "command": [
        "python", "train.py", "--seed", "{seed}", "--lr", "0.1", "--fast"]}, threads=1)
    old, new = {"numpy_version": "1.26.4", "os": "Ubuntu"}, {"numpy_version": "2.0.0", "os": "Ubuntu"}
    _run_all(api, register(api), {(s, seed): [0.5, 0.8 + s / 100 + seed / 10] for s in (a, b, c) for seed in (0, 1)},
             {a: old, b: new, c: old})
    stack = api.get("/api/v1/compare", params={"baseline": a, "candidate": b}).json()
    assert [(d["kind"], d["name"], d["baseline"], d["candidate"]) for d in stack["differences"]] == [
        ("stack", "numpy_version", "1.26.4", "2.0.0")]
    assert stack["attribution"].startswith("only the stack differs (numpy_version)")
    assert stack["verdicts"][0]["same_seed"]["source"] == "stack"
    assert "source: stack (numpy_version)" in stack["verdicts"][0]["reason"]

    setup = api.get("/api/v1/compare", params={"baseline": a, "candidate": c}).json()
    assert [d["note"] for d in setup["differences"]] == ["--lr: 0.05 → 0.1", "--fast: unset → (flag)", "threads: 2 → 1"]
    assert setup["verdicts"][0]["same_seed"]["source"] == "setup" and "numerics" not in setup["verdicts"][0]["reason"]


def test_a_margin_and_a_relative_margin_together_are_refused_naming_the_field(api):
    a, b = _study(api), _study(api)
    r = api.get("/api/v1/compare", params={"baseline": a, "candidate": b, "margin": 0.1, "relative_margin": 0.1})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "relative_margin"], r.text


def test_arms_that_differ_by_a_param_are_not_blamed_on_numerics(api):
    sid = _study(api, arms=[{"name": "slow", "params": {"lr": 0.05}}, {"name": "fast", "params": {"lr": 0.1}}])
    fp = {"numpy_version": "2.0.0"}
    _run_all(api, register(api), {(sid, 0, "slow"): [0.5, 0.8123], (sid, 1, "slow"): [0.5, 0.8311],
                                  (sid, 0, "fast"): [0.5, 0.8201], (sid, 1, "fast"): [0.5, 0.8391]}, {sid: fp})
    # each seed's two arms start alike and differ later, on one stack: the stats alone would say numerics
    (v,) = [v for v in api.get(f"/api/v1/studies/{sid}/report").json()["verdicts"] if v["level"] == "stack_portability"]
    assert v["group"]["differ_by"] == ["params.lr (0.05 vs 0.1)"]
    assert v["same_seed"]["source"] == "setup" and "source setup" in v["reason"] and "numerics" not in v["reason"]


def test_the_comparison_is_judged_at_the_spec_alpha_as_the_report_is(api):
    """The same finals compared at the default 5% and under a spec's ``alpha`` of 0.1%: the TOST that claims
    'equivalent' at 5% does not at 0.1% (before, compare judged every pair at 5%, whatever the specs said)."""
    seeds = list(range(6))
    finals = {0: 0.80, 1: 0.83, 2: 0.78, 3: 0.82, 4: 0.79, 5: 0.81}
    verdicts = {}
    for alpha in (None, 0.001):
        extra = {} if alpha is None else {"alpha": alpha}
        a, b = _study(api, seeds=seeds, **extra), _study(api, seeds=seeds, **extra)
        fp = {"numpy_version": "2.0.0"}
        _run_all(api, register(api), {(s, seed): [0.5, finals[seed] + (0.06 if s == b else 0.0)]
                                      for s in (a, b) for seed in seeds}, {a: fp, b: fp})
        (v,) = api.get("/api/v1/compare", params={"baseline": a, "candidate": b}).json()["verdicts"]
        verdicts[alpha] = v["verdict"]
        assert 0.001 < v["tost_p_adjusted"] < 0.05, v
    assert verdicts == {None: "equivalent", 0.001: "inconclusive"}, verdicts
