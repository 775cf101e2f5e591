"""Malformed input that once escaped as a 500: each gets its 4xx with a field and a reason."""

from __future__ import annotations

import pytest

from tests.worker.test_codepack import _zlib_error_archive
from steady.worker.contract import codepack

MLFLOW = "/mlflow/api/2.0/mlflow"


def test_a_corrupt_gzip_whose_digest_matches_is_422(api):
    data = _zlib_error_archive()
    r = api.client.put(f"/api/v1/code/{codepack.sha256_of(data)}", content=data,
                       headers={**api.h("user"), "Content-Type": "application/gzip"})
    assert r.status_code == 422, r.text
    (detail,) = r.json()["detail"]
    assert detail["loc"] == ["body"] and "not a tar.gz archive" in detail["msg"]


@pytest.mark.parametrize("token", ["stdr_²_x", "stdr_¹³_abc", "stdr_99999999999999999999999_x"])
def test_a_run_token_with_non_ascii_digits_is_401(api, token):
    # sent as latin-1 bytes: the server decodes headers as latin-1, so the digits arrive as "²", "¹³"
    r = api.client.post(f"{MLFLOW}/runs/log-metric", headers={"Authorization": f"Bearer {token}".encode("latin-1")},
                        json={"run_id": "1", "key": "loss", "value": 1.0})
    assert r.status_code == 401 and r.json()["error_code"] == "UNAUTHENTICATED", r.text


@pytest.mark.parametrize("experiment_id, status, code", [
    ("²", 400, "INVALID_PARAMETER_VALUE"),
    ("١٢", 400, "INVALID_PARAMETER_VALUE"),
    ("99999999999999999999", 404, "RESOURCE_DOES_NOT_EXIST"),  # past a bigint: no such study, no overflow
    ("424242", 404, "RESOURCE_DOES_NOT_EXIST"),
])
def test_get_experiment_with_a_malformed_id_answers_like_mlflow(api, experiment_id, status, code):
    r = api.get(f"{MLFLOW}/experiments/get", params={"experiment_id": experiment_id})
    assert r.status_code == status, r.text
    assert r.json()["error_code"] == code and experiment_id in r.json()["message"]
