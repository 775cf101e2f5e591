"""Code archives over the API: upload by digest (verified), fetch, and specs checked against them."""

from __future__ import annotations

import pytest

from tests.api.helpers import spec
from tests.conftest import SQLITE_ONLY
from steady.worker.contract import codepack
from steady.worker.contract.placeholders import PlaceholderError, fill_command


@pytest.fixture
def archive(tmp_path):
    (tmp_path / "src" / "exp").mkdir(parents=True)
    (tmp_path / "src" / "exp" / "train.py").write_text("def main(ctx):\n    ctx.log(step=0, loss=1.0)\n")
    (tmp_path / "src" / "pkg").mkdir()
    (tmp_path / "src" / "pkg" / "__init__.py").write_text("")
    return codepack.pack(str(tmp_path / "src"))


def _put(api, sha: str, data: bytes, role: str = "user"):
    return api.client.put(f"/api/v1/code/{sha}", content=data,
                          headers={**api.h(role), "Content-Type": "application/gzip"})


@pytest.mark.parametrize("store", ["filesystem", "database"])
def test_upload_is_verified_idempotent_and_fetched_by_workers(make_api, archive, store):
    api = make_api(code_store=store)
    bad = _put(api, "0" * 64, archive.data)
    assert bad.status_code == 422 and "SHA-256" in bad.text and bad.json()["detail"][0]["loc"] == ["path", "sha256"]
    first = _put(api, archive.sha256, archive.data)
    assert first.status_code == 200 and first.json() == {"sha256": archive.sha256, "size": len(archive.data),
                                                         "files": 2, "created": True}
    assert _put(api, archive.sha256, archive.data).json()["created"] is False
    for role in ("worker", "user"):  # a worker token fetches only the code of a run it leases
        assert api.client.get(f"/api/v1/code/{archive.sha256}", headers=api.h(role)).status_code == (
            403 if role == "worker" else 200)
    _lease_a_run_of(api, archive)
    for role in ("worker", "user"):
        head = api.client.head(f"/api/v1/code/{archive.sha256}", headers=api.h(role))
        assert head.status_code == 200 and int(head.headers["content-length"]) == len(archive.data)
        got = api.client.get(f"/api/v1/code/{archive.sha256}", headers=api.h(role))
        assert got.status_code == 200 and got.content == archive.data
    assert api.client.get(f"/api/v1/code/{'1' * 64}", headers=api.h("worker")).status_code == 404
    assert _put(api, archive.sha256, archive.data, role="worker").status_code == 403


def _lease_a_run_of(api, archive: codepack.Packed) -> None:
    from tests.api.helpers import lease, register

    code = {"sha256": archive.sha256, "workdir": "exp"}
    study = api.post("/api/v1/studies", json=spec(workload={"framework": "torch", "entrypoint": "train.py:main"},
                                                  seeds=[0], repeats=1, determinism=["seeded"], code=code))
    assert study.status_code == 201, study.text
    assert lease(api, register(api))["study_id"] == study.json()["id"]


def test_an_unsafe_archive_is_refused(api, tmp_path):
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escape.py")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    data = buf.getvalue()
    r = _put(api, codepack.sha256_of(data), data)
    assert r.status_code == 422 and "'..'" in r.text


def test_a_spec_is_checked_against_its_code(api, archive):
    code = {"sha256": archive.sha256, "workdir": "exp", "git_commit": "a" * 40, "dirty": True}

    def user(**w):
        return spec(workload={"framework": "torch", **w}, seeds=[0], repeats=1, determinism=["seeded"], code=code)

    r = api.post("/api/v1/studies", json=user(entrypoint="train.py:main"))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "code", "sha256"], r.text
    assert _put(api, archive.sha256, archive.data).status_code == 200
    missing = api.post("/api/v1/studies", json=user(entrypoint="missing.py:main"))
    assert missing.status_code == 422, missing.text
    assert missing.json()["detail"][0]["loc"] == ["body", "workload", "entrypoint"]
    assert "missing.py is not in the study's code" in missing.json()["detail"][0]["msg"]
    no_script = api.post("/api/v1/studies", json=user(command=["python", "nope.py", "--seed", "{seed}"]))
    assert no_script.status_code == 422 and no_script.json()["detail"][0]["loc"] == ["body", "workload", "command"]
    ok = api.post("/api/v1/studies", json=user(command=["python", "train.py", "--seed", "{seed}", "--device", "{device}"]))
    assert ok.status_code == 201, ok.text
    body = ok.json()
    assert (body["code_sha256"], body["code_git_commit"], body["code_dirty"]) == (archive.sha256, "a" * 40, True)
    assert api.post("/api/v1/studies", json=user(entrypoint="pkg:main")).status_code == 201  # a module at the top


def test_unknown_placeholder_is_a_422_naming_it(api):
    r = api.post("/api/v1/studies", json=spec(workload={"framework": "torch", "command": ["python", "t.py", "{sed}"]}))
    assert r.status_code == 422
    assert "unknown placeholder 'sed'" in r.text and "{seed}" in r.text


@SQLITE_ONLY  # pydantic, no SQL
@pytest.mark.parametrize("arg", ["{seed:>1000000000}", "--seed={seed:{foo}}", "{seed!r}", "{run_dir!s:>9}"])
def test_a_placeholder_with_a_format_spec_or_conversion_is_a_422_naming_the_argument(api, arg):
    """A spec pads an argument to a gigabyte at the worker, and a nested field slipped past the name check."""
    r = api.post("/api/v1/studies", json=spec(workload={"framework": "torch", "command": ["python", "t.py", arg]}))
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert detail["loc"] == ["body", "workload", "command"]
    assert repr(arg) in detail["msg"] and "names only" in detail["msg"]


def _finish_one(api, sid: int, keys: list[str] | None = None, error: str | None = None) -> None:
    from tests.api.helpers import batch, lease, register, result

    leased = lease(api, register(api))
    assert leased["study_id"] == sid
    lid, run_id = leased["lease_id"], leased["run_id"]
    for seq, key in enumerate(keys or []):
        assert api.post(f"/api/v1/runs/{run_id}/metrics", role="worker", json=batch(lid, seq, key, [0], [1.0])).status_code == 200
    if error is None:
        r = api.post(f"/api/v1/runs/{run_id}/complete", role="worker", json=result(lid))
    else:
        r = api.post(f"/api/v1/runs/{run_id}/fail", role="worker", json={"lease_id": lid, "error": error})
    assert r.status_code == 200, r.text


def test_the_study_says_which_metrics_no_run_logged(api):
    def one(**kw):
        return spec(seeds=[0], repeats=1, determinism=["seeded"], max_attempts=1, **kw)

    sid = api.post("/api/v1/studies", json=one(metrics=["loss", "acc"])).json()["id"]
    _finish_one(api, sid, ["loss", "accuracy"])
    study = api.get(f"/api/v1/studies/{sid}").json()
    assert study["status"] == "completed"  # loss was logged: judged, with a note on acc
    assert study["status_reason"] == "the spec names metric 'acc' but no run logged it; runs logged: accuracy, loss"
    sid = api.post("/api/v1/studies", json=one(name="nothing")).json()["id"]
    _finish_one(api, sid, [])
    study = api.get(f"/api/v1/studies/{sid}").json()
    assert study["status"] == "failed"
    assert study["status_reason"] == ("no run logged any of the study's metrics: the spec names metric 'loss' but no "
                                      "run logged it; runs logged: no metric at all")
    sid = api.post("/api/v1/studies", json=one(name="boom")).json()["id"]
    _finish_one(api, sid, error="RuntimeError: boom\nmore lines")
    study = api.get(f"/api/v1/studies/{sid}").json()
    assert study["status"] == "failed" and study["status_reason"].endswith(": RuntimeError: boom")


def test_a_study_whose_output_capture_did_not_match_fails_in_every_view_with_what_capture_tried(api, capsys):
    """A command that prints `| epoch 1 | 25/ 29 batches | ... | loss 6.71 |` (pytorch/examples'
    word_language_model) with no `capture` key: no metric is captured and the study fails. Its report said
    'INCONCLUSIVE: nothing to judge' (exit 2) while `submit --wait` exited 1; every view now fails it (exit 1)
    with the reason, the patterns capture tried and a line it did not match."""
    from steady.server.cli import gate
    from steady.server.cli.render import render_report
    from steady.server.cli.support import verdict_exit_code
    from steady.server.reports.models import Report
    from tests.api.helpers import lease, register, result

    body = spec(name="wlm", seeds=[0], repeats=1, determinism=["seeded"], max_attempts=1,
                workload={"framework": "torch", "command": ["python", "main.py", "--seed", "{seed}"]})
    sid = api.post("/api/v1/studies", json=body).json()["id"]
    leased = lease(api, register(api))
    output = ("| epoch   1 |    25/   29 batches | lr 20.00 | ms/batch 40.12 | loss  6.71 | ppl   820.91\n"
              "| end of epoch   1 | time:  1.31s | valid loss  6.01 | valid ppl   407.40\n")
    done = api.post(f"/api/v1/runs/{leased['run_id']}/complete", role="worker",
                    json=result(leased["lease_id"], final_metrics={}, stderr_tail=output))
    assert done.status_code == 200, done.text
    study = api.get(f"/api/v1/studies/{sid}").json()
    assert study["status"] == "failed", study
    reason = study["status_reason"]
    assert reason.startswith("no run logged any of the study's metrics: the spec names metric 'loss' but no run "
                             "logged it; runs logged: no metric at all; capture tried its default patterns "
                             "('step N ... loss X' and tqdm's 'N/T [..., loss=X]')"), reason
    assert f"run {leased['run_id']} printed '| end of epoch   1 | time:  1.31s | valid loss  6.01 |" in reason
    assert "workload.capture.patterns" in reason
    report = Report.model_validate(api.get(f"/api/v1/studies/{sid}/report").json())
    assert (report.outcome.status, report.outcome.reason) == ("fail", f"study: {reason}")
    assert verdict_exit_code(report) == 1  # steady report, as submit --wait
    assert f"outcome: FAILED: study: {reason}" in render_report(report)
    items = gate.gate_items(report)  # steady check
    assert gate.exit_code(items) == 1 and gate.outcome_reason(items, report) == report.outcome.reason


def test_capture_patterns_are_checked_at_submit(api):
    def submit(capture):
        return api.post("/api/v1/studies", json=spec(workload={
            "framework": "torch", "name": "torch_mlp", "capture": capture}))

    bad = submit({"patterns": ["step (?P<step>\\d+ loss (?P<loss>\\S+)"]})
    assert bad.status_code == 422, bad.text
    detail = bad.json()["detail"][0]
    assert detail["loc"] == ["body", "workload", "capture", "patterns", 0]
    assert "not a valid regular expression" in detail["msg"]
    no_step = submit({"patterns": ["loss (?P<loss>\\S+)"]})
    assert no_step.status_code == 422 and "named group 'step'" in no_step.text
    assert no_step.json()["detail"][0]["loc"][:5] == ["body", "workload", "capture", "patterns", 0]
    # what the linear-time engine cannot run (a lookaround, a backreference) is refused, naming the pattern
    for unsupported in ("step (?P<step>\\d+)(?= ) loss (?P<loss>\\S+)", "(?P<step>\\d+) (?P<loss>\\S+) \\2"):
        refused = submit({"patterns": ["epoch (?P<step>\\d+) acc (?P<acc>\\S+)", unsupported]})
        assert refused.status_code == 422, refused.text
        detail = refused.json()["detail"][0]
        assert detail["loc"] == ["body", "workload", "capture", "patterns", 1]
        assert "not supported by the linear-time regex engine" in detail["msg"], detail
    catastrophic = submit({"patterns": ["(?P<step>\\d+)(?P<loss>(a+)+)x"]})  # linear on RE2: accepted
    assert catastrophic.status_code == 201, catastrophic.text
    ok = submit({"tensorboard": False, "patterns": ["epoch (?P<step>\\d+) acc (?P<acc>\\S+)"]})
    assert ok.status_code in (200, 201), ok.text
    assert ok.json()["spec"]["workload"]["capture"]["patterns"] == ["epoch (?P<step>\\d+) acc (?P<acc>\\S+)"]
    unknown = submit({"preset": "fastai"})
    assert unknown.status_code == 422 and unknown.json()["detail"][0]["loc"] == ["body", "workload", "capture", "preset"]
    assert "'keras', 'hf', 'lightning', 'tqdm', 'mnist' or 'word_language_model'" in unknown.json()["detail"][0]["msg"]
    keras = submit({"preset": "keras"})
    assert keras.status_code == 201 and keras.json()["spec"]["workload"]["capture"]["preset"] == "keras"


def _random_archive(tmp_path, name: str, size: int) -> codepack.Packed:
    """An archive of about ``size`` bytes (random bytes do not compress)."""
    import os

    (tmp_path / name).mkdir()
    (tmp_path / name / "blob.bin").write_bytes(os.urandom(size))
    return codepack.pack(str(tmp_path / name))


@pytest.mark.parametrize("store", ["filesystem", "database"])
def test_an_archive_over_the_code_limit_is_a_413_naming_the_setting(make_api, tmp_path, store):
    api = make_api(code_store=store, max_code_bytes=8 * 1024)  # under the body limit: the code limit decides
    over, under = _random_archive(tmp_path, "over", 12 * 1024), _random_archive(tmp_path, "under", 4 * 1024)
    r = _put(api, over.sha256, over.data)
    assert r.status_code == 413, r.text
    assert f"code archive of {len(over.data)} bytes is over the limit of 8192 bytes (STEADY_MAX_CODE_BYTES)" in r.text
    assert api.client.head(f"/api/v1/code/{over.sha256}", headers=api.h("worker")).status_code == 404  # not stored
    assert _put(api, under.sha256, under.data).status_code == 200


def test_the_code_limit_replaces_a_smaller_body_limit_for_archives(make_api, tmp_path):
    api = make_api(max_body_bytes=4 * 1024, max_code_bytes=16 * 1024)
    between, over = _random_archive(tmp_path, "between", 8 * 1024), _random_archive(tmp_path, "over", 20 * 1024)
    assert _put(api, between.sha256, between.data).status_code == 200  # over the body limit, under the code limit
    r = _put(api, over.sha256, over.data)
    assert r.status_code == 413 and "16384 bytes (STEADY_MAX_CODE_BYTES)" in r.text, r.text
    big_json = api.post("/api/v1/studies", json={"name": "x" * 8 * 1024})  # other routes keep the body limit
    assert big_json.status_code == 413 and "4096 bytes (STEADY_MAX_BODY_BYTES)" in big_json.text


# --- uploads checked as they stream, outside any transaction ----------------------------------------


def _leftovers(api) -> list[str]:
    root = api.app.state.settings.data_dir / "code"
    return sorted(p.name for p in root.rglob(".upload-*")) if root.exists() else []


@pytest.mark.backends("sqlite")  # refused before any SQL
@pytest.mark.parametrize("store", ["filesystem", "database"])
def test_bombs_are_refused_while_they_inflate_and_leave_no_file(make_api, store):
    from tests import archives

    api = make_api(code_store=store, max_code_unpacked_bytes=4 << 20, max_code_files=50)
    cases = {
        "bzip2": (archives.bzip2_bomb(200), "not a tar.gz archive (bzip2)"),  # 9 kB declaring 3.3 GB
        "gzip": (archives.gzip_of_zeros(8 << 20), "more than 4194304 bytes (STEADY_MAX_CODE_UNPACKED_BYTES)"),
        "sparse": (archives.sparse(8 << 30), "a sparse file"),  # 200 bytes declaring 8 GiB
        "entries": (archives.many_entries(400), "more than 50 entries (STEADY_MAX_CODE_FILES)"),
    }
    for name, (data, reason) in cases.items():
        r = _put(api, codepack.sha256_of(data), data)
        assert r.status_code == 422, (name, r.text)
        assert r.json()["detail"][0]["loc"] == ["body"] and reason in r.json()["detail"][0]["msg"], (name, r.text)
        assert api.client.head(f"/api/v1/code/{codepack.sha256_of(data)}", headers=api.h("user")).status_code == 404
    mismatch = _put(api, "0" * 64, archives.many_entries(3))
    assert mismatch.status_code == 422
    assert _leftovers(api) == []  # every refused upload's spool file is gone


@pytest.mark.backends("sqlite")
def test_a_re_upload_restores_a_missing_file(api, archive):
    assert _put(api, archive.sha256, archive.data).json()["created"] is True
    path = api.app.state.settings.data_dir / "code" / archive.sha256[:2] / f"{archive.sha256}.tar.gz"
    path.unlink()  # lost (a restore from an old backup, an operator's cleanup)
    gone = api.client.get(f"/api/v1/code/{archive.sha256}", headers=api.h("user"))
    assert gone.status_code == 404 and "uploading it again restores it" in gone.text
    again = _put(api, archive.sha256, archive.data)
    assert again.status_code == 200 and again.json()["created"] is False
    assert api.client.get(f"/api/v1/code/{archive.sha256}", headers=api.h("user")).content == archive.data
    assert path.stat().st_mode & 0o777 == 0o644


@pytest.mark.backends("sqlite")
def test_unfinished_uploads_are_swept_at_start_but_not_one_in_flight(make_api, tmp_path):
    import fcntl
    import os

    root = tmp_path / "data" / "code"
    (root / "ab").mkdir(parents=True)
    for stale in (root / ".upload-killed", root / "ab" / ".upload-old-layout"):
        stale.write_bytes(b"half an archive")  # what a kill -9 mid-upload leaves
    in_flight = root / ".upload-another-process"
    in_flight.write_bytes(b"still arriving")
    fd = os.open(in_flight, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # held by a live upload of another API process on this directory
    try:
        make_api()
        assert sorted(p.name for p in root.rglob(".upload-*")) == [".upload-another-process"]
    finally:
        os.close(fd)


@pytest.mark.parametrize("store", ["filesystem", "database"])
def test_concurrent_uploads_of_one_digest_all_succeed(make_api, archive, store):
    from concurrent.futures import ThreadPoolExecutor

    api = make_api(code_store=store)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: _put(api, archive.sha256, archive.data), range(8)))
    assert [r.status_code for r in answers] == [200] * 8, [r.text for r in answers]
    assert sum(r.json()["created"] for r in answers) == 1
    assert api.client.get(f"/api/v1/code/{archive.sha256}", headers=api.h("user")).content == archive.data
    assert _leftovers(api) == []


@pytest.mark.backends("sqlite")
def test_a_full_disk_answers_507_with_the_reason(api, archive, monkeypatch):
    from steady.server.code import service

    def full_disk(fd: int):
        import os

        os.close(fd)
        return open("/dev/full", "w+b")  # every write fails with ENOSPC, as on a full disk

    monkeypatch.setattr(service.Spool, "_open", staticmethod(full_disk))
    r = _put(api, archive.sha256, archive.data)
    assert r.status_code == 507, r.text
    assert "no space left for the code archive" in r.text and "STEADY_DATA_DIR" in r.text
    assert _leftovers(api) == []
    monkeypatch.undo()
    assert _put(api, archive.sha256, archive.data).json()["created"] is True  # nothing half-stored in the way


@pytest.mark.parametrize("store", ["filesystem", "database"])
def test_file_digests_stream_an_archive_of_several_chunks(make_api, tmp_path, store):
    """The per-file digests `steady compare` names code files by read the stored archive a chunk at a time
    (never the whole archive in memory) and agree with each file's own SHA-256, in both stores."""
    import hashlib
    import os

    from steady.server.code import repository
    from steady.server.code import service as code_service

    src = tmp_path / "big"
    src.mkdir()
    files = {"weights.bin": os.urandom(repository.CHUNK_BYTES + 12345), "train.py": b"print('hi')\n",
             "study.yaml": b"name: x\n"}
    for name, data in files.items():
        (src / name).write_bytes(data)
    packed = codepack.pack(str(src))
    assert len(packed.data) > repository.CHUNK_BYTES  # incompressible: more than one chunk in the database
    api = make_api(code_store=store)
    assert _put(api, packed.sha256, packed.data).status_code == 200
    with api.app.state.database.read() as session:
        digests, small = code_service.file_digests(session, packed.sha256, api.app.state.settings)
    assert digests == {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    assert small == {"study.yaml": b"name: x\n"}  # the spec file's bytes, kept to tell it apart from the code


@pytest.mark.backends("sqlite")
def test_the_file_and_its_directories_are_fsynced_before_the_row_commits(api, archive, monkeypatch):
    """An archive whose row committed while its file's name was still only in the page cache vanished in a
    crash, and the server answered 404 for it ever after: the file, then its directory and the one above,
    reach the disk before the row is written (and again when a re-upload puts a lost file back)."""
    import os

    from steady.server.code import repository, service

    events: list[tuple[str, str]] = []
    real_fsync, real_add = os.fsync, repository.add

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def add(*args, **kwargs):
        events.append(("row", ""))
        return real_add(*args, **kwargs)

    monkeypatch.setattr(service.os, "fsync", fsync)
    monkeypatch.setattr(service.repository, "add", add)
    assert _put(api, archive.sha256, archive.data).json()["created"] is True
    root = api.app.state.settings.data_dir.resolve() / "code"
    shard, final = root / archive.sha256[:2], root / archive.sha256[:2] / f"{archive.sha256}.tar.gz"
    spooled = [path for kind, path in events if kind == "fsync" and os.path.basename(path).startswith(".upload-")]
    assert len(spooled) == 1, events  # the bytes, before the file was moved into place
    assert events[events.index(("fsync", spooled[0])):] == [
        ("fsync", spooled[0]), ("fsync", str(shard)), ("fsync", str(root)), ("row", "")], events
    final.unlink()
    events.clear()
    assert _put(api, archive.sha256, archive.data).json()["created"] is False  # restored: durable again
    assert [e for e in events if e[0] == "fsync"][-2:] == [("fsync", str(shard)), ("fsync", str(root))], events
    assert final.read_bytes() == archive.data


@SQLITE_ONLY  # pydantic, no SQL
@pytest.mark.parametrize("arg", ["--name=a\x00b", "\x00", "{seed}\x00"])
def test_a_command_argument_with_a_nul_byte_is_a_422_naming_the_argument(api, arg):
    """No program can receive an argument holding a NUL byte (exec takes C strings): the run would fail
    at the worker, so the spec is refused at submit, naming the argument, its position and the reason."""
    r = api.post("/api/v1/studies", json=spec(workload={"framework": "torch", "command": ["python", "t.py", arg]}))
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert detail["loc"] == ["body", "workload", "command"]
    assert repr(arg) in detail["msg"] and "argument 3" in detail["msg"] and "NUL byte" in detail["msg"], detail
    with pytest.raises(PlaceholderError, match="NUL byte"):  # a worker that was handed one refuses it as well
        fill_command(["python", "t.py", arg], {"seed": 1}, "python")
