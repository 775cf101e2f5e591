"""Arms that differ by code: each arm names its own uploaded archive, the server checks it exists and
holds the workload's script, each run is leased with its arm's archive, and the report names the
difference by digest and git commit."""

from __future__ import annotations

from pathlib import Path

import pytest

from steady.server.studies.arms import differences, effective_arms
from steady.server.studies.schemas import StudySpec
from tests.api.helpers import batch, lease, register, result, spec
from steady.worker.contract import codepack

COMMAND = ["python", "train.py", "--seed", "{seed}"]


def _archive(root: Path, files: dict[str, str]) -> codepack.Packed:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return codepack.pack(str(root))


@pytest.fixture
def archives(tmp_path) -> dict[str, codepack.Packed]:
    return {
        "study": _archive(tmp_path / "study", {"train.py": "print('study')\n"}),
        "a": _archive(tmp_path / "a", {"train.py": "print('a')\n"}),
        "b": _archive(tmp_path / "b", {"sub/train.py": "print('b')\n"}),
        "other": _archive(tmp_path / "other", {"evaluate.py": "print('no train.py here')\n"}),
    }


def _put(api, packed: codepack.Packed) -> None:
    r = api.client.put(f"/api/v1/code/{packed.sha256}", content=packed.data,
                       headers={**api.h("user"), "Content-Type": "application/gzip"})
    assert r.status_code == 200, r.text


def _body(arms: list[dict], code: dict | None = None) -> dict:
    extra = {"code": code} if code else {}
    return spec(workload={"framework": "torch", "command": COMMAND}, seeds=[0, 1], repeats=1,
                determinism=["seeded"], arms=arms, metrics=[{"name": "loss", "margin": 0.05}], **extra)


def test_an_arm_naming_an_unknown_archive_or_a_label_is_422_naming_its_field(api, archives):
    _put(api, archives["study"])
    code = {"sha256": archives["study"].sha256}
    unknown = "f" * 64
    r = api.post("/api/v1/studies", json=_body([{"name": "a"}, {"name": "b", "code": {"sha256": unknown}}], code))
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "arms", 1, "code"] and f"no code archive {unknown}" in err["msg"], err
    assert "arm 'b'" in err["msg"]

    label = api.post("/api/v1/studies", json=_body([{"name": "a"}, {"name": "b", "code": "git:3f2a1c0"}], code))
    assert label.status_code == 422, label.text
    (err,) = label.json()["detail"]
    assert err["loc"] == ["body", "arms", 1, "code"] and "'git:3f2a1c0' is not an uploaded archive" in err["msg"]

    bad = api.post("/api/v1/studies", json=_body([{"name": "a"}, {"name": "b", "code": {"sha256": "xyz"}}], code))
    assert bad.status_code == 422 and any(d["loc"][:4] == ["body", "arms", 1, "code"] for d in bad.json()["detail"])

    builtin = spec(arms=[{"name": "a"}, {"name": "b", "code": {"sha256": archives["a"].sha256}}])
    r = api.post("/api/v1/studies", json=builtin)
    assert r.status_code == 422 and "built-in workloads ship no code" in r.text, r.text


def test_each_arms_archive_is_checked_for_the_workloads_script(api, archives):
    for packed in archives.values():
        _put(api, packed)
    code = {"sha256": archives["study"].sha256}
    other = {"sha256": archives["other"].sha256}
    r = api.post("/api/v1/studies", json=_body([{"name": "a"}, {"name": "b", "code": other}], code))
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"] == ["body", "arms", 1, "code"], err
    assert "the command's script train.py is not in arm 'b''s code" in err["msg"], err

    # the script is found relative to the arm's workdir
    b = {"sha256": archives["b"].sha256, "workdir": "sub"}
    assert api.post("/api/v1/studies", json=_body([{"name": "a"}, {"name": "b", "code": b}], code)).status_code == 201
    nowhere = api.post("/api/v1/studies", json=_body([{"name": "a"}, {"name": "b", "code": {**b, "workdir": "."}}], code))
    assert nowhere.status_code == 422 and nowhere.json()["detail"][0]["loc"] == ["body", "arms", 1, "code"]

    # every arm runs its own code: the study's archive need not hold the script (it must still exist)
    arms = [{"name": "a", "code": {"sha256": archives["a"].sha256}}, {"name": "b", "code": b}]
    assert api.post("/api/v1/studies", json=_body(arms, other)).status_code == 201
    missing = api.post("/api/v1/studies", json=_body(arms, {"sha256": "e" * 64}))
    assert missing.status_code == 422 and missing.json()["detail"][0]["loc"] == ["body", "code", "sha256"]


def test_each_run_is_leased_with_its_arms_archive_and_the_report_names_the_code(api, archives):
    for packed in archives.values():
        _put(api, packed)
    study_code = {"sha256": archives["study"].sha256, "git_commit": "1" * 40}
    b = {"sha256": archives["b"].sha256, "workdir": "sub", "git_commit": "2" * 40, "dirty": True}
    r = api.post("/api/v1/studies", json=_body([{"name": "a"}, {"name": "b", "code": b}], study_code))
    assert r.status_code == 201, r.text
    sid = r.json()["id"]

    worker_id = register(api)
    leases = []
    while (got := lease(api, worker_id)) is not None:
        leases.append(got)
        lid, run_id, seed = got["lease_id"], got["run_id"], got["spec"]["seed"]
        assert api.post(f"/api/v1/runs/{run_id}/metrics", role="worker",
                        json=batch(lid, 0, "loss", [0], [0.3 + 0.001 * seed])).status_code == 200
        assert api.post(f"/api/v1/runs/{run_id}/complete", role="worker",
                        json=result(lid, final_metrics={"loss": 0.3 + 0.001 * seed})).status_code == 200
    assert len(leases) == 4
    by_arm = {x["spec"]["stack"]: x["spec"] for x in leases}
    assert (by_arm["a"]["code_sha256"], by_arm["a"]["code_workdir"]) == (archives["study"].sha256, ".")
    assert (by_arm["b"]["code_sha256"], by_arm["b"]["code_workdir"]) == (archives["b"].sha256, "sub")
    assert by_arm["b"]["code"] == archives["b"].sha256 and by_arm["a"]["code"] is None

    report = api.get(f"/api/v1/studies/{sid}/report").json()
    (v,) = [v for v in report["verdicts"] if v["level"] == "stack_portability"]
    expected = (f"code (sha256:{archives['study'].sha256[:12]}… (git 1111111111) vs "
                f"sha256:{archives['b'].sha256[:12]}… (git 2222222222, dirty))")
    assert v["group"]["differ_by"] == [expected], v["group"]
    assert report["arms"] == [{"reference": "a", "candidate": "b", "differ_by": [expected]}]


def test_labels_of_older_studies_still_read_as_differences():
    """Studies created before arms ran their own code stored a plain label: their spec still reads
    back (the dashboard and adaptive seeds re-validate it) and the label is still named."""
    stored = spec(seeds=[0], arms=[{"name": "old", "code": "git:3f2a1c0"}, {"name": "new"}])
    assert StudySpec.model_validate(stored).arms[0].code == "git:3f2a1c0"
    stored["workload"]["params"] = {}
    arms = effective_arms(stored)
    assert differences(arms["old"], arms["new"]) == ["code (git:3f2a1c0 vs unset)"]
    same = {"sha256": "a" * 64}
    assert differences({**arms["new"], "code": same}, {**arms["new"], "code": {**same, "git_commit": "b" * 40}}) == []
