"""User code is untrusted: the run never sees the worker's token, runs in its own directory with an
allow-listed environment, optionally as another user; Steady's credentials never reach a record."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

import steady
from steady.worker.agent import cli as worker_cli
from steady.worker.agent.runner import REDACTED, RunAs, run_environment, scrub

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).parent / "fixtures" / "probe_credentials.py"


def test_run_environment_is_an_allow_list(tmp_path):
    base = {"PATH": "/usr/bin", "LANG": "C.UTF-8", "STEADY_TOKEN": "stdy_worker_secret", "AWS_SECRET_ACCESS_KEY": "x",
            "HOME": "/root", "PYTHONPATH": "/opt/user", "HF_HOME": "/data/hf", "CUDA_VISIBLE_DEVICES": "0,1"}
    spec = {"determinism": "strict", "seed": 7, "threads": 1}
    env = run_environment(spec, run_dir=str(tmp_path), device=None, base=base,
                          run_vars={"STEADY_RUN_TOKEN": "stdr_1_abc"})
    assert "STEADY_TOKEN" not in env and "AWS_SECRET_ACCESS_KEY" not in env and "HF_HOME" not in env
    assert env["HOME"] == str(tmp_path) and env["PATH"] == "/usr/bin" and env["LANG"] == "C.UTF-8"
    assert env["PYTHONHASHSEED"] == "7" and env["CUBLAS_WORKSPACE_CONFIG"] and env["OMP_NUM_THREADS"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["STEADY_RUN_TOKEN"] == "stdr_1_abc"
    first, *rest = env["PYTHONPATH"].split(os.pathsep)
    assert rest == ["/opt/user"] and os.getcwd() not in (first, *rest)  # never the agent's cwd
    # the first entry holds the steady package and nothing else: no checkout's app/, worker/ or tests/
    assert os.listdir(first) == ["steady"]
    held = os.path.join(first, "steady")  # links to the installed package's __init__.py and worker folder only
    assert sorted(n for n in os.listdir(held) if n != "__pycache__") == ["__init__.py", "worker"]
    assert os.path.samefile(os.path.join(held, "__init__.py"), steady.__file__)
    assert os.path.samefile(os.path.join(held, "worker"), Path(steady.worker.__file__).parent)
    narrowed = run_environment(spec, run_dir=str(tmp_path), device="cuda:1", base=base, pass_env=["HF_HOME"])
    assert narrowed["CUDA_VISIBLE_DEVICES"] == "1" and narrowed["HF_HOME"] == "/data/hf"


def test_scrub_redacts_credentials():
    text = "Traceback ... token=stdy_abcdefgh12345 and stdr_9_zzzzzzzzzz"
    assert scrub(text, ["stdy_abcdefgh12345", "stdr_9_zzzzzzzzzz"]) == f"Traceback ... token={REDACTED} and {REDACTED}"


def test_worker_refuses_a_token_on_the_command_line(capsys):
    assert worker_cli.main(["--server", "http://127.0.0.1:9", "--token", "stdy_x"]) == 2
    err = capsys.readouterr().err
    assert "--token is no longer accepted" in err and "STEADY_TOKEN" in err and "--token-file" in err


def test_token_file_is_read(tmp_path, monkeypatch):
    monkeypatch.delenv("STEADY_TOKEN", raising=False)
    path = tmp_path / "worker.token"
    path.write_text("stdy_from_file\n")
    assert worker_cli.read_token(str(path)) == "stdy_from_file"
    monkeypatch.setenv("STEADY_TOKEN", "stdy_from_env")
    assert worker_cli.read_token(None) == "stdy_from_env"


@pytest.mark.slow
def test_secrets_are_scrubbed_from_error_and_stderr(tmp_path):
    from steady.worker.agent.local import run_local

    worker_token, run_token = "stdy_" + uuid.uuid4().hex, "stdr_5_" + uuid.uuid4().hex
    path = tmp_path / "leaky.py"
    path.write_text(textwrap.dedent(f"""
        import os, sys
        print("worker token: {worker_token}", file=sys.stderr)
        print("my token:", os.environ["STEADY_RUN_TOKEN"])
        raise RuntimeError("failed with " + os.environ["STEADY_RUN_TOKEN"] + " and {worker_token}")
    """))
    r = run_local({"framework": "python", "entrypoint": str(path), "seed": 1, "determinism": "none", "time_limit_s": 120},
                  run_vars={"STEADY_RUN_TOKEN": run_token}, secrets=(worker_token,))
    assert not r.ok and r.failure_kind == "error"
    for text in (r.error, r.stderr_tail):
        assert worker_token not in text and run_token not in text
    assert r.error == f"RuntimeError: failed with {REDACTED} and {REDACTED}"
    assert f"worker token: {REDACTED}" in r.stderr_tail and f"my token: {REDACTED}" in r.stderr_tail


# --- end to end: a real agent and server --------------------------------------------------------


def _submit_probe(http, agent_files=()) -> int:
    r = http.post("/api/v1/studies", json={
        "name": "probe", "metrics": ["loss"], "seeds": [0], "repeats": 1, "determinism": ["none"], "threads": 1,
        "workload": {"framework": "torch", "entrypoint": str(PROBE), "params": {"agent_files": list(agent_files)}}})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _run_agent(server, work_dir: Path, *extra: str, token_file: Path | None = None):
    env = {**os.environ}
    env.pop("STEADY_TOKEN", None)
    if token_file is None:
        env["STEADY_TOKEN"] = server.tokens["worker"]
    else:
        extra = (*extra, "--token-file", str(token_file))
    log = work_dir.parent / f"{work_dir.name}.log"
    proc = subprocess.run(
        [sys.executable, "-m", "steady.worker", "--server", server.url, "--once", "--keep-run-dirs", "--poll-max", "0.5",
         "--work-dir", str(work_dir), *extra],
        cwd=REPO, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT, timeout=300,  # noqa: SIM115
    )
    return proc.returncode, log.read_text(errors="replace")


def _findings(work_dir: Path) -> dict:
    found = list(work_dir.glob("run-*/findings.json"))
    assert len(found) == 1, list(work_dir.rglob("*"))
    return json.loads(found[0].read_text())


def _assert_nothing_leaks(findings: dict, secret: str, work_dir: Path) -> None:
    blob = json.dumps(findings)
    assert secret not in blob
    assert "STEADY_TOKEN" not in findings["env"]
    assert findings["cwd"] == findings["home"] and findings["cwd"].startswith(str(work_dir))
    assert findings["cwd"] != str(REPO)
    assert set(findings["env"]) <= {
        "PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "CUDA_VISIBLE_DEVICES", "HOME", "TMPDIR", "PYTHONPATH",
        "PYTHONUNBUFFERED", "PYTHONHASHSEED", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
        "OMP_DYNAMIC", "MKL_DYNAMIC", "TF_CPP_MIN_LOG_LEVEL", "STEADY_DEVICE", "STEADY_EVENTS_FILE", "STEADY_RUN_SPEC",
        "STEADY_RUN_ID", "STEADY_SERVER", "STEADY_RUN_TOKEN", "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_TOKEN",
        "MLFLOW_RUN_ID", "KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK",
        "STEADY_CHECKPOINT_DIR"}, sorted(findings["env"])  # its checkpoints' folder: inside the run's own
    assert findings["env"]["STEADY_RUN_TOKEN"].startswith("stdr_")


@pytest.mark.slow
def test_user_code_finds_no_worker_credential(live_server, tmp_path):
    http = live_server.client()
    sid = _submit_probe(http)
    work_dir = tmp_path / "agent"
    rc, log = _run_agent(live_server, work_dir)
    assert rc == 0, log
    run = http.get(f"/api/v1/studies/{sid}/runs").json()["items"][0]
    assert run["status"] == "completed", (run, log)
    _assert_nothing_leaks(_findings(work_dir), live_server.tokens["worker"], work_dir)


# --- --run-as ------------------------------------------------------------------------------------


@pytest.fixture
def throwaway_user():
    if os.geteuid() != 0:
        pytest.skip("--run-as needs root (useradd, setuid)")
    name = f"stdy{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    # The interpreter and the code must be reachable by the run user. Where they sit under a
    # private home (pyenv in /root), open the directories for traversal (o+x) for the test only.
    changed: list[tuple[str, int]] = []
    for target in (os.path.realpath(sys.executable), str(REPO), sys.prefix, os.path.realpath(sys.prefix)):
        path = os.path.dirname(target) if os.path.isfile(target) else target
        while path and path != "/":
            mode = stat.S_IMODE(os.stat(path).st_mode)
            if not mode & stat.S_IXOTH and all(p != path for p, _ in changed):
                os.chmod(path, mode | stat.S_IXOTH)
                changed.append((path, mode))
            path = os.path.dirname(path)
    try:
        yield RunAs.lookup(name)
    finally:
        for path, mode in reversed(changed):
            os.chmod(path, mode)
        subprocess.run(["userdel", name], check=False)


@pytest.mark.slow
@pytest.mark.xdist_group("run_as")  # one xdist worker: useradd locks /etc/passwd, and the o+x
# this fixture grants on the interpreter's folders is taken back when a test ends
def test_run_as_cannot_read_the_agents_files_or_environment(live_server, tmp_path, throwaway_user):
    # the agent's directory must be reachable (traverse only) by the run user: not under pytest's 0700 tmp
    base = Path(tmp_path_public := os.path.join("/tmp", f"steady-runas-{uuid.uuid4().hex[:8]}"))
    base.mkdir(mode=0o711)
    try:
        token_file = base / "worker.token"
        token_file.write_text(live_server.tokens["worker"] + "\n")
        token_file.chmod(0o600)
        http = live_server.client()
        sid = _submit_probe(http, agent_files=[str(token_file)])
        work_dir = base / "agent"
        rc, log = _run_agent(live_server, work_dir, "--run-as", throwaway_user.name, token_file=token_file)
        assert rc == 0, log
        run = http.get(f"/api/v1/studies/{sid}/runs").json()["items"][0]
        assert run["status"] == "completed", (run, log)
        assert stat.S_IMODE(work_dir.stat().st_mode) == 0o711
        findings = _findings(work_dir)
        assert findings["uid"] == throwaway_user.uid
        assert findings["agent_files"][str(token_file)].startswith("<unreadable: PermissionError")
        assert findings["parent_environ"].startswith("<unreadable: PermissionError")
        _assert_nothing_leaks(findings, live_server.tokens["worker"], work_dir)
    finally:
        shutil.rmtree(tmp_path_public, ignore_errors=True)


def test_run_as_refuses_a_token_file_its_runs_could_read(tmp_path, capsys):
    if os.geteuid() != 0:
        pytest.skip("--run-as needs root")
    nobody = RunAs.lookup("nobody")
    token_file = tmp_path / "worker.token"
    token_file.write_text("stdy_secret\n")
    token_file.chmod(0o600)
    assert not nobody.can_read(str(token_file))
    token_file.chmod(0o640)
    os.chown(token_file, 0, nobody.gid)
    assert nobody.can_read(str(token_file))
    os.chown(token_file, 0, 0)
    token_file.chmod(0o644)
    assert nobody.can_read(str(token_file))
    rc = worker_cli.main(["--server", "http://127.0.0.1:9", "--token-file", str(token_file), "--run-as", "nobody"])
    assert rc == 2 and "readable by the run user nobody" in capsys.readouterr().err


LINK_OUTPUT_TO = """
import os
print("training output before the swap", flush=True)
os.remove(os.path.join(os.environ["HOME"], "output.log"))
os.symlink({secret!r}, os.path.join(os.environ["HOME"], "output.log"))
raise SystemExit(3)
"""


@pytest.mark.slow
@pytest.mark.xdist_group("run_as")  # one xdist worker: useradd locks /etc/passwd, and the o+x
# this fixture grants on the interpreter's folders is taken back when a test ends
def test_run_as_cannot_read_a_root_file_through_a_symlinked_output(live_server, tmp_path, throwaway_user):
    """The run owns its directory: it swaps output.log for a link to a file only root reads. The agent
    (root) refuses the link, so the file's content never reaches the run's stderr tail."""
    base = Path(os.path.join("/tmp", f"steady-runas-{uuid.uuid4().hex[:8]}"))
    base.mkdir(mode=0o711)
    try:
        secret = base / "root-only.txt"
        secret.write_text("ROOT-ONLY-" + uuid.uuid4().hex + "\n")
        secret.chmod(0o600)
        script = base / "swap_output.py"
        script.write_text(LINK_OUTPUT_TO.format(secret=str(secret)))
        script.chmod(0o644)
        token_file = base / "worker.token"
        token_file.write_text(live_server.tokens["worker"] + "\n")
        token_file.chmod(0o600)
        http = live_server.client()
        r = http.post("/api/v1/studies", json={
            "name": "swap-output", "metrics": ["loss"], "seeds": [0], "repeats": 1, "determinism": ["none"],
            "threads": 1, "max_attempts": 1, "workload": {"framework": "torch", "entrypoint": str(script)}})
        assert r.status_code == 201, r.text
        rc, log = _run_agent(live_server, base / "agent", "--run-as", throwaway_user.name, token_file=token_file)
        assert rc == 0, log
        run = http.get(f"/api/v1/studies/{r.json()['id']}/runs").json()["items"][0]
        assert run["status"] == "failed", (run, log)
        assert secret.read_text().strip() not in json.dumps(run)
        assert "[steady] skipped output.log" in run["stderr_tail"], run
    finally:
        shutil.rmtree(base, ignore_errors=True)
