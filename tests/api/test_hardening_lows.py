"""#51's low findings 7, 8 and 9 (terminal text): HEAD of a code archive whose file is missing is a 404
(so `steady submit` uploads it again and puts the file back); an external study's open runs are not
"still running elsewhere" to an agent that exits when idle; bidirectional and zero-width characters of a
user's name never reach the terminal."""

from __future__ import annotations

from steady.server.code import service as code_service
from steady.server.kit.terminal import printable, printable_output
from steady.worker.contract import codepack
from tests.api.helpers import register
from tests.conftest import SQLITE_ONLY

pytestmark = SQLITE_ONLY


def _put(api, packed):
    return api.client.put(f"/api/v1/code/{packed.sha256}", content=packed.data,
                          headers={**api.h(), "Content-Type": "application/gzip"})


def test_head_of_an_archive_whose_file_is_missing_is_404_until_uploaded_again(api, tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print(1)\n")
    packed = codepack.pack(str(tmp_path / "src"))
    assert _put(api, packed).status_code == 200
    assert api.client.head(f"/api/v1/code/{packed.sha256}", headers=api.h()).status_code == 200
    code_service._path(api.app.state.settings, packed.sha256).unlink()  # lost from the data directory
    assert api.client.head(f"/api/v1/code/{packed.sha256}", headers=api.h()).status_code == 404
    assert _put(api, packed).status_code == 200  # what `steady submit` does on a 404: the file is back
    assert api.client.head(f"/api/v1/code/{packed.sha256}", headers=api.h()).status_code == 200


def test_open_external_runs_are_not_pending_work_for_an_idle_agent(api):
    base = "/mlflow/api/2.0/mlflow"
    exp = api.client.post(f"{base}/experiments/create", headers=api.h(), json={"name": "logged elsewhere"})
    assert exp.status_code == 200, exp.text
    experiment = exp.json()["experiment_id"]
    run = api.client.post(f"{base}/runs/create", headers=api.h(), json={"experiment_id": experiment})
    assert run.status_code == 200, run.text  # open: RUNNING until its client ends it, maybe never
    worker = register(api)
    for scope in ({}, {"study_id": int(experiment)}):
        r = api.post(f"/api/v1/workers/{worker}/lease", role="worker", json={"worker_id": worker, **scope})
        assert r.status_code == 204 and r.headers["X-Steady-Pending"] == "0", (scope, r.headers)


def test_bidirectional_and_zero_width_characters_are_stripped_from_terminal_text():
    name = "evil\u202eexe.txt\u200b\u200d\u2066x\u2069\ufeff\u061c"
    assert printable(name) == "evilexe.txtx"
    assert printable_output("\x1b[31mred\u202e\x1b[0m") == "red"
    assert printable("café ∑ 日本 é") == "café ∑ 日本 é"  # printable text, combining accent included, stays
