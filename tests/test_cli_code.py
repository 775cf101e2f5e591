"""``steady submit``'s code shipping as a user drives it, against a real server: ``--code DIR``
ships that folder instead of the git tree, ``--max-code-mb`` refuses an oversize tree before
anything is uploaded, and the server's own limit (STEADY_MAX_CODE_BYTES) comes back as one line."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

from steady.worker.contract import codepack
from tests.conftest import CliResult, run_cli_in_process

SPEC = "name: byoc\nworkload: {framework: torch, entrypoint: train.py}\nseeds: [0]\ndeterminism: [seeded]\n"


def _submit(server, spec: Path, *extra: str) -> CliResult:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEADY_")}
    env.update(XDG_CONFIG_HOME=str(spec.parent / ".config"), NO_COLOR="1")
    return run_cli_in_process("submit", spec.name, "--server", server.url, "--token", server.tokens["user"], *extra,
                              env=env, cwd=spec.parent)


def _git_repo_with_spec(root: Path) -> Path:
    """A git repository holding the spec and a file of its own, but not the spec's train.py."""
    root.mkdir()
    (root / "study.yaml").write_text(SPEC)
    (root / "in_git.py").write_text("print('from the git tree')\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "spec"], cwd=root, check=True)
    return root / "study.yaml"


def _members(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return sorted(tar.getnames())


def test_code_dir_ships_that_folder_instead_of_the_git_tree(live_server, tmp_path):
    spec = _git_repo_with_spec(tmp_path / "repo")
    shipped = tmp_path / "shipped"
    (shipped / "lib").mkdir(parents=True)
    (shipped / "train.py").write_text("def main(ctx):\n    ctx.log(step=0, loss=1.0)\n")
    (shipped / "lib" / "util.py").write_text("X = 1\n")

    from_git = _submit(live_server, spec)  # the git tree has no train.py: refused, naming where it looked
    assert from_git.returncode == 3, from_git.stdout + from_git.stderr  # a gate: could not judge
    assert f"train.py is not in the code packed from {os.path.realpath(tmp_path / 'repo')}" in from_git.stderr

    before = live_server.study_ids()
    r = _submit(live_server, spec, "--code", str(shipped))
    assert r.returncode == 0, r.stdout + r.stderr
    (sid,) = live_server.study_ids() - before
    with live_server.client() as c:
        study = c.get(f"/api/v1/studies/{sid}").json()
        assert study["code_sha256"] == codepack.pack(str(shipped)).sha256
        assert study["code_git_commit"] is None  # not the git tree's commit: the folder is not in git
        assert study["spec"]["code"]["workdir"] == "."  # the spec is outside the folder: runs start at its top
        archive = c.get(f"/api/v1/code/{study['code_sha256']}")
    assert archive.status_code == 200 and _members(archive.content) == ["lib/util.py", "train.py"]


def test_max_code_mb_refuses_an_oversize_tree_naming_the_option(live_server, tmp_path):
    spec = _git_repo_with_spec(tmp_path / "repo")
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / "train.py").write_text("def main(ctx):\n    ctx.log(step=0, loss=1.0)\n")
    (shipped / "weights.bin").write_bytes(os.urandom(300 * 1024))

    before = live_server.study_ids()
    code_before = sorted((live_server.data_dir / "code").rglob("*.tar.gz"))
    r = _submit(live_server, spec, "--code", str(shipped), "--max-code-mb", "0.25")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "is over the limit of 0.25 MB" in r.stderr and "--max-code-mb for submit" in r.stderr, r.stderr
    assert "at weights.bin" in r.stderr and "Traceback" not in r.stderr
    assert live_server.study_ids() == before  # refused before anything was uploaded or queued
    assert sorted((live_server.data_dir / "code").rglob("*.tar.gz")) == code_before


def test_the_servers_code_limit_reaches_the_user_as_one_line(live_server_factory, tmp_path):
    server = live_server_factory(max_code_bytes=64 * 1024)
    spec = _git_repo_with_spec(tmp_path / "repo")
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / "train.py").write_text("def main(ctx):\n    ctx.log(step=0, loss=1.0)\n")
    (shipped / "weights.bin").write_bytes(os.urandom(100 * 1024))

    r = _submit(server, spec, "--code", str(shipped))  # under submit's 50 MB, over the server's 64 KiB
    assert r.returncode != 0, r.stdout + r.stderr
    assert "413" in r.stderr and "STEADY_MAX_CODE_BYTES" in r.stderr and "Traceback" not in r.stderr, r.stderr
    with server.client() as c:
        assert c.get("/api/v1/studies").json()["items"] == []
