"""The CLI as a user drives it, against a real server process: ``steady.server.cli.main`` in this process
(``run_cli_in_process``: its own environment, working folder and stdin), and a few commands as real
processes where the process is the point: the installed ``steady`` entry point, a closed pipe, Ctrl-C,
``submit --wait`` while a worker runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.conftest import REPO, SQLITE_ONLY, CliResult, run_cli_in_process


def steady(server, *args: str, input: str | None = None, check: bool = True) -> CliResult:
    env = {**server.env, "STEADY_SERVER": server.url, "STEADY_TOKEN": server.tokens["user"], "NO_COLOR": "1"}
    result = run_cli_in_process(*args, env=env, cwd=REPO, input=input)
    if check:  # exit 0 only: a gate (report, submit --wait) that may say inconclusive (2) is called with check=False
        assert result.returncode == 0, (args, result.returncode, result.stdout, result.stderr)
    return result


def steady_process(server, *args: str, env_extra: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    """``python -m steady.server.cli ARGS`` as a child process, as the user's shell starts it."""
    env = {**server.env, "STEADY_SERVER": server.url, "STEADY_TOKEN": server.tokens["user"], "NO_COLOR": "1",
           **(env_extra or {})}
    return subprocess.Popen([sys.executable, "-m", "steady.server.cli", *args], env=env, cwd=REPO, text=True, **kw)


def test_submit_status_report(live_server, tmp_path):
    spec = tmp_path / "study.yaml"
    spec.write_text(
        "name: cli study\nworkload: {framework: torch, name: torch_mlp}\nseeds: [0, 1, 2]\n"
        "determinism: [seeded]\nmetrics: [loss]\n"
    )
    out = steady(live_server, "submit", str(spec)).stdout
    assert out.startswith("submitted study ") and "3 runs" in out
    sid = int(out.split()[2])
    status = steady(live_server, "status").stdout
    assert "cli study" in status and "0/3 runs" in status
    assert steady(live_server, "status", str(sid)).stdout.splitlines()[1].split()[:2] == [str(sid), "queued"]

    bad = steady(live_server, "submit", "-", input="name: x\nseeds: []\nworkload: {framework: torch, name: torch_mlp}\n",
                 check=False)
    assert bad.returncode == 3 and "422" in bad.stderr and "at least one seed" in bad.stderr  # a gate: could not judge

    # an external study with uploaded runs gets a readable report
    with live_server.client() as c:
        sid = c.post("/api/v1/studies", json={"name": "imported", "kind": "external",
                                             "metrics": [{"name": "loss", "max_std": 0.5}]}).json()["id"]
        rng = np.random.default_rng(0)
        for seed in range(6):
            for repeat in range(2):
                values = (np.linspace(1, 0.1, 20) + 0.01 * seed).tolist()
                r = c.post(f"/api/v1/studies/{sid}/runs", json={
                    "seed": seed, "repeat": repeat, "determinism": "strict", "stack": {"name": "cpu"},
                    "metrics": {"loss": {"steps": list(range(20)), "values": values}},
                    "step_times": (0.01 + rng.normal(0, 1e-4, 20)).tolist()})
                assert r.status_code == 201
    report = steady(live_server, "report", str(sid)).stdout  # a passing study: exit 0 (checked by steady())
    assert "\n  outcome: PASSED" in report, report
    assert verdicts(report, "1. Repeatability") == ["identical"] and verdicts(report, "2. Seed stability") == ["stable"]
    as_json = steady(live_server, "report", str(sid), "--json").stdout
    assert '"verdicts"' in as_json


def test_token_commands_and_errors(live_server):
    env = live_server.env
    listed = run_cli_in_process("token", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    listed = listed.stdout
    assert "admin" in listed and "worker" in listed and "stdy_" in listed
    assert live_server.tokens["user"] not in listed  # only prefixes are ever shown
    r = httpx.get(live_server.url + "/api/v1/studies", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    no_server = run_cli_in_process("status", "--server", "http://127.0.0.1:9", env=env)
    assert no_server.returncode == 1 and "cannot reach" in no_server.stderr


def test_control_characters_in_names_never_reach_the_terminal(live_server):
    evil = "ok\x1b]0;pwned\x07\x1b[2J\x9b31m\rname"
    with live_server.client() as c:
        sid = c.post("/api/v1/studies", json={"name": evil, "kind": "external",
                                             "metrics": [{"name": "loss"}]}).json()["id"]
        r = c.post(f"/api/v1/studies/{sid}/runs", json={
            "seed": 0, "determinism": "seeded", "stack": {"name": "gpu\x1b[31m"},
            "metrics": {"loss": {"steps": [0, 1], "values": [1.0, 0.5]}}})
        assert r.status_code == 201, r.text
    for out in (steady(live_server, "status").stdout, steady(live_server, "report", str(sid), check=False).stdout):
        assert "okname" in out.replace("]0;pwned", "").replace("[2J", "").replace("31m", "")
        assert not any(ch in out for ch in "\x1b\x07\x9b\r")


def test_calibrate_prints_the_table_and_writes_json_and_the_doc_block(tmp_path):
    import os

    doc = tmp_path / "cal.md"
    doc.write_text("intro\n<!-- calibration-table:start -->\nold\n<!-- calibration-table:end -->\n"
                   "<!-- power-table:start -->\n<!-- power-table:end -->\n"
                   "<!-- blowup-power-table:start -->\n<!-- blowup-power-table:end -->\n"
                   "<!-- shift-power-table:start -->\n<!-- shift-power-table:end -->\nend\n")
    out = run_cli_in_process("calibrate", "--sims", "20", "--rule", "repeatability", "--json", str(tmp_path / "cal.json"),
                             "--power-sims", "10", "--update-doc", str(doc), env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert "repeatability" in out.stdout and "identical-3x500" in out.stdout and "95% CI" in out.stdout
    data = json.loads((tmp_path / "cal.json").read_text())
    rows = {r["scenario"]: r for r in data["rates"]}
    assert rows["identical-3x500"]["k"] == 0 and rows["one-ulp-3x500"]["k"] == 20
    assert [p["seeds"] for p in data["oob_power_offsets"]] == [5, 10, 20]
    text = doc.read_text()
    assert "old" not in text and "| `repeatability` | `identical-3x500` | healthy |" in text and text.endswith("end\n")
    blowup = text.split("<!-- blowup-power-table:start -->")[1].split("<!-- blowup-power-table:end -->")[0]
    assert blowup.count("\n|") >= 3  # the late blow-up's power rows were written (header, rule, rows)
    shift = text.split("<!-- shift-power-table:start -->")[1].split("<!-- shift-power-table:end -->")[0]
    assert "| `10_back_2sd` |" in shift and "before: scored as independent" in shift
    assert {r["scenario"] for r in data["suite_shift_power"]} >= {"10_back_2sd", "50+10_3sd"}
    bad = run_cli_in_process("calibrate", "--rule", "nope", env=dict(os.environ))
    assert bad.returncode == 2 and "no rule named" in bad.stderr


# --- readable at a glance: every failure is one line that says what to do ---------------------


def client_env(server, tmp_path, **extra: str) -> dict[str, str]:
    """The environment of a user who has not pointed the CLI anywhere yet (own config dir, no token file)."""
    env = {k: v for k, v in server.env.items() if not k.startswith("STEADY_")}
    return {**env, "XDG_CONFIG_HOME": str(tmp_path / "config"), "NO_COLOR": "1", **extra}


def run_cli(*args: str, env: dict[str, str], cwd=REPO, input: str | None = None) -> CliResult:
    return run_cli_in_process(*args, env=env, cwd=cwd, input=input)


def verdicts(report: str, section: str) -> list[str]:
    """The verdict column of one numbered section's table in ``steady report``'s text (one per metric and group)."""
    lines = report.split(f"\n{section}", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    rows = [re.match(r"  \S+  \S+ / \S+  +(\S+(?: \S+)*?)  +n=\d+", line) for line in lines]
    return [row.group(1) for row in rows if row]


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def external_study(c, name: str, *, shift: float = 0.0, seed_spread: float = 0.01, max_std: float = 0.5,
                   seeds: int = 6) -> int:
    sid = c.post("/api/v1/studies", json={"name": name, "kind": "external",
                                         "metrics": [{"name": "loss", "max_std": max_std}]}).json()["id"]
    for seed in range(seeds):
        values = (np.linspace(1, 0.1, 20) + shift + seed_spread * seed).tolist()
        r = c.post(f"/api/v1/studies/{sid}/runs", json={
            "seed": seed, "determinism": "seeded", "stack": {"name": "cpu"},
            "metrics": {"loss": {"steps": list(range(20)), "values": values}}})
        assert r.status_code == 201, r.text
    return sid


def test_login_saves_server_and_token_and_every_401_says_how_to_fix_it(live_server, tmp_path):
    env = client_env(live_server, tmp_path)
    cwd = tmp_path  # no .steady/token here
    unauth = run_cli("status", "--server", live_server.url, env=env, cwd=cwd)
    assert unauth.returncode == 1
    line = one_line(unauth.stderr)
    assert "401" in line and "steady login URL" in line and "STEADY_TOKEN" in line and "--token" in line

    refused = run_cli("login", live_server.url, env=env, cwd=cwd, input="wrong\n")
    assert refused.returncode == 1 and "refused" in one_line(refused.stderr)
    assert not (tmp_path / "config" / "steady" / "config.json").exists()

    login = run_cli("login", live_server.url, env=env, cwd=cwd, input=live_server.tokens["user"] + "\n")
    assert login.returncode == 0, login.stderr
    config = tmp_path / "config" / "steady" / "config.json"
    assert config.stat().st_mode & 0o777 == 0o600
    assert json.loads(config.read_text()) == {"default": live_server.url,
                                              "servers": {live_server.url: {"token": live_server.tokens["user"]}}}

    with live_server.client() as c:
        sid = external_study(c, "after login", seeds=1)
    status = run_cli("status", env=env, cwd=cwd)  # the saved server and token
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines()[0].split() == ["ID", "STATUS", "PROGRESS", "NAME"]
    assert status.stdout.splitlines()[1].split()[:2] == [str(sid), "open"]  # newest first

    bad = run_cli("status", "--token", "wrong", env=env, cwd=cwd)
    line = one_line(bad.stderr)
    assert bad.returncode == 1 and "refused the token from --token (401)" in line and "steady login URL" in line
    bad_env = run_cli("status", env={**env, "STEADY_TOKEN": "wrong"}, cwd=cwd)
    assert "from STEADY_TOKEN (401)" in one_line(bad_env.stderr)

    # the login's token only goes to the login's server
    elsewhere = run_cli("status", "--server", "http://127.0.0.1:9", env=env, cwd=cwd)
    assert "cannot reach http://127.0.0.1:9" in one_line(elsewhere.stderr)

    out = run_cli("logout", env=env, cwd=cwd)
    assert out.returncode == 0 and not config.exists()
    after = run_cli("status", "--server", live_server.url, env=env, cwd=cwd)
    assert after.returncode == 1 and "steady login URL" in one_line(after.stderr)


@SQLITE_ONLY
def test_login_keeps_one_entry_per_server_and_each_gets_its_own_token(api, monkeypatch, tmp_path):
    """Two servers on one machine (in this process, told apart by their URLs; the token each request carries is
    recorded): logging in to the second keeps the first, whose token still goes to it with --server; logout
    forgets one server at a time; the one-server file of earlier versions still reads."""
    from fastapi.testclient import TestClient

    sent: list[tuple[str, str]] = []

    def client(base_url, headers, timeout):
        sent.append((base_url, headers.get("Authorization", "").removeprefix("Bearer ")))
        return TestClient(api.app, base_url=base_url, headers=headers)

    monkeypatch.setattr(httpx, "Client", client)
    one, two = "http://one.test", "http://two.test"
    token_one = api.tokens["user"]
    token_two = api.post("/api/v1/tokens", role="admin", json={"name": "second", "role": "user"}).json()["token"]
    env = {"PATH": "/usr/bin:/bin", "XDG_CONFIG_HOME": str(tmp_path / "config"), "NO_COLOR": "1"}
    config = tmp_path / "config" / "steady" / "config.json"

    def status(*args: str) -> tuple[str, str]:
        sent.clear()
        r = run_cli("status", *args, env=env, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        return sent[-1]

    assert run_cli("login", one, "--token", token_one, env=env, cwd=tmp_path).returncode == 0
    second = run_cli("login", two, "--token", token_two, env=env, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert f"logged in to {two} (the default server now)" in second.stdout and f"still saved: {one}" in second.stdout
    saved = json.loads(config.read_text())
    assert saved == {"default": two, "servers": {one: {"token": token_one}, two: {"token": token_two}}}
    assert config.stat().st_mode & 0o777 == 0o600
    assert status() == (two, token_two)  # the default: the last login
    assert status("--server", one) == (one, token_one)  # the first login was kept, with its own token
    assert status("--server", one + "/") == (one, token_one)

    out = run_cli("logout", env=env, cwd=tmp_path)  # the default server's login
    assert out.returncode == 0 and f"forgot the login to {two}" in out.stdout and f"default server now: {one}" in out.stdout
    assert status() == (one, token_one)
    unknown = run_cli("logout", "http://three.test", env=env, cwd=tmp_path)
    assert unknown.returncode == 0 and f"not logged in to http://three.test (saved: {one})" in unknown.stdout
    assert run_cli("logout", one, env=env, cwd=tmp_path).returncode == 0 and not config.exists()
    assert run_cli("logout", env=env, cwd=tmp_path).stdout.strip() == "not logged in"

    config.write_text(json.dumps({"server": one, "token": token_one}))  # the one-server file of earlier versions
    assert status() == (one, token_one)
    assert run_cli("login", two, "--token", token_two, env=env, cwd=tmp_path).returncode == 0
    assert json.loads(config.read_text())["servers"] == {one: {"token": token_one}, two: {"token": token_two}}


@SQLITE_ONLY
def test_status_on_an_empty_server_says_how_to_submit(api, monkeypatch, tmp_path):
    """A fresh server (an app in this process, on its own database): the CLI's HTTP client talks to it directly."""
    from fastapi.testclient import TestClient

    monkeypatch.setattr(httpx, "Client", lambda base_url, headers, timeout: TestClient(api.app, base_url=base_url,
                                                                                      headers=headers))
    env = {"PATH": "/usr/bin:/bin", "XDG_CONFIG_HOME": str(tmp_path / "config"), "NO_COLOR": "1"}
    status = run_cli("status", "--server", "http://steady.test", "--token", api.tokens["user"], env=env, cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert status.stdout.split() == ["no", "studies", "yet:", "steady", "submit", "study.yaml"]
    refused = run_cli("status", "--server", "http://steady.test", "--token", "wrong", env=env, cwd=tmp_path)
    assert refused.returncode == 1 and "refused the token from --token (401)" in one_line(refused.stderr)


def test_the_installed_entry_point_runs_commands(live_server, tmp_path):
    """``steady`` as pip installed it (the console script next to this interpreter), not ``python -m``."""
    exe = Path(sys.executable).with_name("steady")
    assert exe.is_file(), f"no console script at {exe}: `pip install -e .` installs it"
    env = client_env(live_server, tmp_path)
    version = subprocess.run([str(exe), "--version"], env=env, capture_output=True, text=True, timeout=120)
    from steady.server import __version__

    assert version.returncode == 0 and version.stdout.strip() == f"steady {__version__}", version.stderr
    with live_server.client() as c:
        sid = external_study(c, "entry point", seeds=1)
    status = subprocess.run([str(exe), "status", str(sid), "--server", live_server.url, "--token",
                             live_server.tokens["user"]], env=env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines()[1].split()[:2] == [str(sid), "open"]
    usage = subprocess.run([str(exe), "status", "--no-such-option"], env=env, capture_output=True, text=True,
                           timeout=120)
    assert usage.returncode == 2 and "error:" in usage.stderr


def test_global_options_work_before_and_after_the_command(live_server, tmp_path):
    env = client_env(live_server, tmp_path)
    opts = ["--server", live_server.url, "--token", live_server.tokens["user"]]
    for args in ([*opts, "status"], ["status", *opts]):
        r = run_cli(*args, env=env, cwd=tmp_path)
        assert r.returncode == 0, (args, r.stderr)
    for args in (["--data-dir", str(live_server.data_dir), "token", "list"],
                 ["token", "list", "--data-dir", str(live_server.data_dir)],
                 ["token", "--data-dir", str(live_server.data_dir), "list"]):
        r = run_cli(*args, env=env, cwd=tmp_path)
        assert r.returncode == 0 and "admin" in r.stdout, (args, r.stderr)
    from steady.server import __version__

    assert run_cli("--version", env=env).stdout.strip() == f"steady {__version__}"


def test_token_list_in_the_wrong_folder_creates_nothing(live_server, tmp_path):
    env = client_env(live_server, tmp_path)
    r = run_cli("token", "list", env=env, cwd=tmp_path)
    line = one_line(r.stderr)
    assert r.returncode == 1 and str(tmp_path / ".steady" / "steady.db") in line
    assert "STEADY_DATA_DIR" in line and "STEADY_DATABASE_URL" in line
    assert not (tmp_path / ".steady").exists()
    revoke = run_cli("token", "revoke", "1", "--data-dir", str(tmp_path / "elsewhere"), env=env, cwd=tmp_path)
    assert revoke.returncode == 1 and "no Steady database" in one_line(revoke.stderr)
    assert not (tmp_path / "elsewhere").exists()


def test_spec_problems_are_one_line_with_file_line_and_column(live_server, tmp_path):
    spec = tmp_path / "study.yaml"
    spec.write_text("name: x\nseeds: [0, 1]\nworkload: framework: torch\n")
    r = steady(live_server, "submit", str(spec), check=False)
    assert r.returncode == 3  # submit is a gate: could not judge, never 2 (inconclusive)
    assert one_line(r.stderr) == f"steady: {spec}:3:20: mapping values are not allowed here"
    missing = steady(live_server, "submit", str(tmp_path / "nope.yaml"), check=False)
    assert missing.returncode == 3 and one_line(missing.stderr) == f"steady: no such file: {tmp_path / 'nope.yaml'}"
    listing = steady(live_server, "submit", "-", input="- a\n- b\n", check=False)
    assert listing.returncode == 3 and "a study spec is a mapping" in one_line(listing.stderr)


def test_a_closed_pipe_ends_quietly(live_server):
    import os

    with live_server.client() as c:
        external_study(c, "piped", seeds=1)
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the CLI writes a byte, as after `| head` has exited
    env = {**live_server.env, "STEADY_SERVER": live_server.url, "STEADY_TOKEN": live_server.tokens["user"]}
    try:
        proc = subprocess.run([sys.executable, "-m", "steady.server.cli", "status", "--json"], env=env, cwd=REPO,
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120, check=False)
    finally:
        os.close(write_end)
    assert proc.returncode == 141 and proc.stderr == "", proc.stderr


def test_status_header_cancel_compare_and_verdict_exit_codes(live_server, tmp_path):
    spec = tmp_path / "study.yaml"
    spec.write_text("name: to cancel\nworkload: {framework: torch, name: torch_mlp}\nseeds: [0, 1]\n"
                    "determinism: [seeded]\nmetrics: [loss]\n")
    sid = int(steady(live_server, "submit", str(spec)).stdout.split()[2])
    status = steady(live_server, "status").stdout.splitlines()
    assert status[0].split() == ["ID", "STATUS", "PROGRESS", "NAME"]
    assert status[1].split()[:2] == [str(sid), "queued"]
    out = steady(live_server, "cancel", str(sid)).stdout
    assert f"cancelled study {sid} (to cancel): 2 runs cancelled" in out
    assert steady(live_server, "status", str(sid)).stdout.splitlines()[1].split()[1] == "cancelled"
    assert steady(live_server, "cancel", str(sid)).returncode == 0  # cancelling twice is harmless
    missing = steady(live_server, "cancel", "999", check=False)
    assert missing.returncode == 1 and "404" in one_line(missing.stderr)

    with live_server.client() as c:
        base = external_study(c, "base")
        same = external_study(c, "same")
        shifted = external_study(c, "shifted", shift=1.0)
        wide = external_study(c, "wide", seed_spread=0.5, max_std=0.01)
        edge = external_study(c, "edge", seed_spread=0.1, max_std=0.2)
    ok = steady(live_server, "compare", str(base), str(same), "--margin", "0.1", check=False)
    assert ok.returncode == 0, ok.stderr
    lines = ok.stdout.splitlines()
    assert lines[0].startswith(f"baseline  study {base} (base, 6 runs)")
    assert lines[2] == "differs by: nothing recorded (same setup, same stack fingerprint)"
    assert lines[4] == "final loss, margin 0.1 (given): equivalent"
    assert lines[6].split() == ["DETERMINISM", "VERDICT", "RUNS", "WHY"] and lines[7].split()[:2] == ["seeded", "equivalent"]
    far = steady(live_server, "compare", str(base), str(shifted), "--margin", "0.1", check=False)
    assert far.returncode == 1 and "not_equivalent" in far.stdout

    # the seeds' spread (sd 0.19) against a limit of 0.2: the interval covers the limit, so it is not decided
    inconclusive = steady(live_server, "report", str(edge), check=False)
    assert inconclusive.returncode == 2 and "\n  outcome: INCONCLUSIVE" in inconclusive.stdout, inconclusive.stdout
    assert verdicts(inconclusive.stdout, "2. Seed stability") == ["inconclusive"], inconclusive.stdout
    unstable = steady(live_server, "report", str(wide), check=False)
    assert unstable.returncode == 1 and "\n  outcome: FAILED" in unstable.stdout, unstable.stdout
    assert verdicts(unstable.stdout, "2. Seed stability") == ["unstable"], unstable.stdout


def test_ctrl_c_while_waiting_says_the_study_keeps_running(live_server, tmp_path):
    import signal

    spec = tmp_path / "study.yaml"
    spec.write_text("name: waited\nworkload: {framework: torch, name: torch_mlp}\nseeds: [0]\n"
                    "determinism: [seeded]\nmetrics: [loss]\n")
    def as_a_shell_starts_it() -> None:
        # A shell starts a command with SIGINT neither ignored nor blocked, whatever this test process
        # inherited or a library in it changed; Python then turns a SIGINT into KeyboardInterrupt.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = steady_process(live_server, "submit", str(spec), "--wait", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          preexec_fn=as_a_shell_starts_it, env_extra={"PYTHONFAULTHANDLER": "1"})
    try:
        sid = int(proc.stdout.readline().split()[2])  # "submitted study N …"
        first = proc.stderr.readline()  # the first progress line: the CLI is waiting now
        assert first.startswith(f"study {sid} queued"), first
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # say where it hangs: faulthandler prints every thread's stack on SIGABRT
            status = Path(f"/proc/{proc.pid}/status").read_text()
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate(timeout=30)
            raise AssertionError(f"no exit 60 s after SIGINT\n{status}\n{err[-6000:]}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    line = one_line(err)
    assert f"study {sid} keeps running" in line and f"steady status {sid}" in line
    assert f"{live_server.url}/studies/{sid}" in line
    with live_server.client() as c:
        assert c.get(f"/api/v1/studies/{sid}").json()["status"] == "queued"


def test_submit_wait_exits_1_when_a_verdict_fails(live_server, tmp_path):
    from tests.scale.fakeworker import FakeWorker

    spec = tmp_path / "study.yaml"
    spec.write_text("name: spread\nworkload: {framework: torch, name: torch_mlp}\nseeds: [0, 1, 2, 3, 4]\n"
                    "determinism: [seeded]\nmetrics: [{name: loss, max_std: 0.01}]\n")
    proc = steady_process(live_server, "submit", str(spec), "--wait", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        sid = int(proc.stdout.readline().split()[2])
        worker = FakeWorker(live_server.url, live_server.tokens["worker"], "fake", deadline_s=60)
        worker.register()
        stats = worker.work(steps=20, batch=20, max_runs=5, idle_exit_s=5)  # loss = run id + step/1000: seeds far apart
        assert len(stats.completed) == 5
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    # the report's outcome and its one reason (what `steady report` and `steady check` say too)
    assert f"steady: study {sid}: FAILED (1 failing check(s)): loss seeded/default: unstable: std " in err, err
    assert f"(`steady report {sid}`)" in err


JSON_COMMANDS = {
    "status": lambda a, b: ["status", "--json"],
    "status-one": lambda a, b: ["status", str(a), "--json"],
    "runs": lambda a, b: ["runs", str(a), "--json"],
    "report": lambda a, b: ["report", str(a), "--json"],
    "compare": lambda a, b: ["compare", str(a), str(b), "--margin", "0.1", "--json"],
    "alerts": lambda a, b: ["alerts", "--study", str(a), "--json"],
}


@pytest.mark.parametrize("command", JSON_COMMANDS)
def test_json_output_is_one_json_document_and_nothing_else(live_server, command):
    """What a script pipes into jq: stdout parses as one JSON document, nothing on stderr."""
    with live_server.client() as c:
        a, b = external_study(c, "json a"), external_study(c, "json b")
    r = steady(live_server, *JSON_COMMANDS[command](a, b))
    assert r.stderr == ""
    doc = json.loads(r.stdout)
    if command == "status":
        assert {a, b} <= {s["id"] for s in doc}
    elif command == "status-one":
        assert (doc[0]["id"] if isinstance(doc, list) else doc["id"]) == a
    elif command == "runs":
        assert sorted(x["seed"] for x in doc) == list(range(6)) and {x["study_id"] for x in doc} == {a}
    elif command == "report":
        assert doc["study"]["id"] == a and doc["verdicts"]
    elif command == "compare":
        assert "equivalent" in json.dumps(doc)
    else:
        assert doc == []  # no rule, no alert


def test_runs_and_logs_of_an_uploaded_study(live_server):
    with live_server.client() as c:
        sid = external_study(c, "listed", seeds=3)
    runs = steady(live_server, "runs", str(sid)).stdout.splitlines()
    assert runs[0].split() == ["RUN", "STATUS", "ATTEMPT", "SEED", "LEVEL", "STACK", "ERROR"]
    assert sorted(int(line.split()[3]) for line in runs[1:]) == [0, 1, 2]
    first = int(runs[1].split()[0])
    assert steady(live_server, "runs", str(sid), "--status", "failed").stdout.strip() == "no runs"
    logs = steady(live_server, "logs", str(first)).stdout
    assert logs.startswith(f"run {first} (study {sid}, seed "), logs
    missing = steady(live_server, "logs", "999999999", check=False)
    assert missing.returncode == 1 and "404" in one_line(missing.stderr)
    ack = steady(live_server, "alerts", "ack", "999999999", check=False)
    assert ack.returncode == 1 and "404" in one_line(ack.stderr)


def test_status_shows_the_stage_of_an_adaptive_study(live_server, tmp_path):
    spec = tmp_path / "study.yaml"
    spec.write_text("name: adaptive\nworkload: {framework: torch, name: torch_mlp}\nseeds: [0, 1, 2, 3, 4]\n"
                    "determinism: [seeded]\nmetrics: [{name: loss, max_std: 0.1}]\nbudget: {max_seeds: 12}\n")
    sid = int(steady(live_server, "submit", str(spec)).stdout.split()[2])
    out = steady(live_server, "status", str(sid)).stdout
    assert f"study {sid}: adaptive seeds, stage 1 of at most 3 (5 of at most 12 seeds)" in out


def test_check_exits_3_when_it_cannot_judge_and_other_commands_keep_2_for_usage(tmp_path):
    """`steady check` from a shell, no server needed: a typo in the job's command line or spec path
    must not read as "inconclusive" (2), which a CI gate may let pass. `report` and `submit` are gates
    too, with the same codes."""
    env = {"PATH": "/usr/bin:/bin", "XDG_CONFIG_HOME": str(tmp_path / "config"),
           "STEADY_SERVER": "http://127.0.0.1:9", "NO_COLOR": "1"}
    missing = run_cli("check", str(tmp_path / "nope.yaml"), "--junit", str(tmp_path / "j.xml"), env=env, cwd=tmp_path)
    assert missing.returncode == 3 and one_line(missing.stderr) == f"steady: no such file: {tmp_path / 'nope.yaml'}"
    assert not (tmp_path / "j.xml").exists()  # no verdict, no report for the CI to read as one
    (tmp_path / "bad.yaml").write_text("name: [unclosed\n")
    bad = run_cli("check", "bad.yaml", env=env, cwd=tmp_path)
    assert bad.returncode == 3 and "bad.yaml:" in one_line(bad.stderr)
    for args in (["check"], ["check", "1", "--no-such-option"], ["--server", "http://x", "check", "1", "extra"]):
        usage = run_cli(*args, env=env, cwd=tmp_path)
        assert usage.returncode == 3 and "error:" in usage.stderr and "Traceback" not in usage.stderr, (args, usage)
    unreachable = run_cli("check", "12", env=env, cwd=tmp_path)
    assert unreachable.returncode == 3 and "cannot reach" in one_line(unreachable.stderr)
    # the other gates exit 3 as check does; every other command keeps 2 for usage, 1 for no server
    assert run_cli("submit", str(tmp_path / "nope.yaml"), env=env, cwd=tmp_path).returncode == 3
    assert run_cli("submit", "--wait", "--no-such-option", env=env, cwd=tmp_path).returncode == 3
    assert run_cli("report", "12", env=env, cwd=tmp_path).returncode == 3
    assert run_cli("status", "--no-such-option", env=env, cwd=tmp_path).returncode == 2
    assert run_cli("status", env=env, cwd=tmp_path).returncode == 1


# --- every command's own help and usage errors (in process, no server) -------------------------------


def _commands() -> list[str]:
    from steady.server.cli import build_parser

    (sub,) = [a for a in build_parser()._actions if a.dest == "command"]
    return sorted(sub.choices)


COMMANDS = _commands()
GATES = {"bisect", "check", "report", "submit"}  # exit 0 pass (bisect: found), 1 fail, 2 inconclusive, 3 could not judge


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_that_renders(command, tmp_path):
    """``steady CMD --help`` prints that command's usage (a stray % in a help text would raise instead)."""
    r = run_cli(command, "--help", env={"PATH": "/usr/bin:/bin", "XDG_CONFIG_HOME": str(tmp_path)}, cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.startswith("usage: steady") and command in r.stdout.splitlines()[0], r.stdout[:200]
    assert not (tmp_path / ".steady").exists()  # asking for help touches no database


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_refuses_an_unknown_option_with_its_usage_code(command, tmp_path):
    """2 for usage (3 for the gates `check`, `report`, `submit`: "could not judge"), an error line, no
    traceback, nothing on stdout."""
    r = run_cli(command, "--no-such-option", env={"PATH": "/usr/bin:/bin", "XDG_CONFIG_HOME": str(tmp_path)},
                cwd=tmp_path)
    assert r.returncode == (3 if command in GATES else 2), (r.returncode, r.stderr)
    assert "error:" in r.stderr and "Traceback" not in r.stderr and r.stdout == "", r.stderr
    assert not (tmp_path / ".steady").exists()


UNREACHABLE = {
    "status": ["status"], "runs": ["runs", "1"], "logs": ["logs", "1"], "cancel": ["cancel", "1"],
    "report": ["report", "1"], "compare": ["compare", "1", "2", "--margin", "0.1"], "alerts": ["alerts"],
    "alerts-ack": ["alerts", "ack", "1"], "localize": ["localize", "1"],
}


@pytest.mark.parametrize("command", UNREACHABLE)
def test_every_client_command_says_in_one_line_that_the_server_is_unreachable(command, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "XDG_CONFIG_HOME": str(tmp_path / "config"), "NO_COLOR": "1"}
    r = run_cli(*UNREACHABLE[command], "--server", "http://127.0.0.1:9", "--token", "stdy_unused", env=env, cwd=tmp_path)
    assert r.returncode == (3 if command in GATES else 1) and r.stdout == "", (r.returncode, r.stdout)
    assert one_line(r.stderr).startswith("steady: cannot reach http://127.0.0.1:9")


def test_token_create_save_list_and_revoke_in_a_data_dir(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "XDG_CONFIG_HOME": str(tmp_path / "config"), "NO_COLOR": "1"}
    data = str(tmp_path / "data")
    created = run_cli("token", "create", "--role", "user", "--name", "ci", "--save", "--data-dir", data, env=env,
                      cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    token_id, secret = int(created.stdout.split()[1]), created.stdout.split()[3]
    saved = tmp_path / "data" / "token"
    assert saved.read_text() == secret + "\n" and saved.stat().st_mode & 0o777 == 0o600
    assert "shown once" in created.stdout and f"saved to {saved}" in created.stderr
    listed = run_cli("token", "list", "--data-dir", data, env=env, cwd=tmp_path).stdout.splitlines()
    (row,) = [line for line in listed if line.split()[0] == str(token_id)]
    assert row.split()[1:] == ["user", row.split()[2], "active", "ci"] and secret not in row
    assert run_cli("token", "revoke", str(token_id), "--data-dir", data, env=env, cwd=tmp_path).stdout.strip() == \
        f"revoked token {token_id}"
    listed = run_cli("token", "list", "--data-dir", data, env=env, cwd=tmp_path).stdout
    assert f"{token_id:>4}  user    " in listed and "revoked" in listed
    missing = run_cli("token", "revoke", "999", "--data-dir", data, env=env, cwd=tmp_path)
    assert missing.returncode == 1 and missing.stderr.strip() == "no token 999"


def test_migrate_reports_the_head_revision_and_runs_twice(tmp_path):
    from steady.server.kit import migrate

    env = {"PATH": "/usr/bin:/bin", "XDG_CONFIG_HOME": str(tmp_path / "config"), "NO_COLOR": "1"}
    data = str(tmp_path / "data")
    for _ in range(2):  # the second run finds the schema at head and changes nothing
        r = run_cli("migrate", "--data-dir", data, env=env, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == f"database at revision {migrate.head_revision()}"
