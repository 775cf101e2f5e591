from __future__ import annotations

from typing import Any

from worker.protocol import Series


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


def register(api, name: str = "w1", labels: tuple[str, ...] = ("torch", "cpu")) -> int:  # noqa: ANN001
    r = api.post("/api/v1/workers/register", role="worker", json={"name": name, "labels": list(labels)})
    assert r.status_code == 200, r.text
    return r.json()["worker_id"]


def lease(api, worker_id: int):  # noqa: ANN001, ANN201
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


def error_of(r) -> dict[str, Any]:  # noqa: ANN001
    """The single error of an error answer, checked against the API's one error shape."""
    body = r.json()
    assert set(body) == {"detail"} and isinstance(body["detail"], list), body
    (err,) = body["detail"]
    assert isinstance(err["loc"], list) and err["msg"] and err["type"], err
    return err


def error_msg(r) -> str:  # noqa: ANN001
    return error_of(r)["msg"]
