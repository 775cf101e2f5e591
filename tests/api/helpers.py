from __future__ import annotations

import json
from typing import Any

from steady.worker.contract.protocol import Series


def spec(**overrides: Any) -> dict[str, Any]:
    base = {
        "name": "mlp stability",
        "workload": {"framework": "torch", "name": "torch_mlp", "params": {"epochs": 1}},
        "seeds": [0, 1],
        "repeats": 2,
        "determinism": ["seeded", "strict"],
        "metrics": [{"name": "loss", "atol": 0.0}],
    }
    base.update(overrides)
    return base


def register(api, name: str = "w1", labels: tuple[str, ...] = ("torch", "cpu")) -> int:
    r = api.post("/api/v1/workers/register", role="worker", json={"name": name, "labels": list(labels)})
    assert r.status_code == 200, r.text
    return r.json()["worker_id"]


def lease(api, worker_id: int):
    r = api.post(f"/api/v1/workers/{worker_id}/lease", role="worker", json={"worker_id": worker_id, "run_credential": True})
    assert r.status_code in (200, 204), r.text
    return r.json() if r.status_code == 200 else None


def batch(lease_id: str, seq: int, key: str, steps: list[int], values: list[float], packed: bool = True) -> dict:
    s = Series.packed(key, steps, values) if packed else Series(key=key, steps=steps, values=values)
    return {"lease_id": lease_id, "seq": seq, "series": [s.model_dump(exclude_none=True)]}


def result(lease_id: str, **overrides: Any) -> dict[str, Any]:
    body = {
        "lease_id": lease_id,
        "final_metrics": {"loss": 0.5},
        "digests": {"initial_weights": "a" * 64, "data_order": ["b" * 64], "final_weights": "c" * 64},
        "fingerprint": {"torch": "2.13.0"},
        "determinism_applied": {"level": "seeded"},
        "timings": {"wall_s": 1.0},
    }
    body.update(overrides)
    return body


def bare_constant(name: str) -> None:
    raise AssertionError(f"bare {name} token in a response: not JSON")


def strict(r) -> Any:
    """A successful response's body parsed as strict JSON: a bare NaN or Infinity token fails the test."""
    assert r.status_code < 300, r.text
    return json.loads(r.text, parse_constant=bare_constant)


def error_of(r) -> dict[str, Any]:
    """The single error of an error answer, checked against the API's one error shape."""
    body = r.json()
    assert set(body) == {"detail"} and isinstance(body["detail"], list), body
    (err,) = body["detail"]
    assert isinstance(err["loc"], list) and err["msg"] and err["type"], err
    return err


def error_msg(r) -> str:
    return error_of(r)["msg"]
