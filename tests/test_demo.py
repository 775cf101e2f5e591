"""The README's main command, end to end: server, local worker, real training, the report."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select

from steady.server.cli.demo.run import open_data_dir
from steady.server.models import Study
from tests.conftest import REPO, free_port, proc_stat, wait_until


def _demo_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEADY_")}
    env["NO_COLOR"] = "1"
    return env


def _add_user_study(data_dir: Path, name: str) -> None:
    """What a user leaves on the demo server: a study of their own (and a file beside it)."""
    engine = create_engine(f"sqlite:///{data_dir / 'steady.db'}")
    with engine.begin() as conn:
        conn.execute(Study.__table__.insert().values(name=name, kind="external", status="completed", spec={}))
    engine.dispose()
    (data_dir / "notes.txt").write_text("mine\n")


def _study_names(data_dir: Path) -> list[str]:
    engine = create_engine(f"sqlite:///{data_dir / 'steady.db'}")
    with engine.connect() as conn:
        names = list(conn.scalars(select(Study.name).order_by(Study.id)))
    engine.dispose()
    return names


def test_a_second_demo_keeps_what_the_first_left(tmp_path):
    data = tmp_path / "demo"
    first_user, _, kept = open_data_dir(data)
    assert kept == 0 and (data / "steady.db").exists()
    _add_user_study(data, "my own study")
    second_user, _, kept = open_data_dir(data)
    assert kept == 1 and _study_names(data) == ["my own study"]
    assert (data / "notes.txt").read_text() == "mine\n"
    assert second_user != first_user and (data / "token").read_text() == second_user + "\n"
    assert (data / "token").stat().st_mode & 0o777 == 0o600


@pytest.mark.slow
def test_demo_runs_a_whole_study(tmp_path):
    # the data folder already holds an earlier demo's database with a study a user submitted: it stays
    open_data_dir(tmp_path / "demo")
    _add_user_study(tmp_path / "demo", "my own study")
    env = _demo_env()
    out = subprocess.run(
        [sys.executable, "-m", "steady.server.cli", "demo", "--quick", "--exit", "--port", str(free_port()),
         "--data-dir", str(tmp_path / "demo")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    for study in ("digits MLP (PyTorch)", "nondeterministic kernels (PyTorch)", "digits MLP (TensorFlow/Keras)"):
        assert f"demo: {study}  [completed]" in text
    assert text.count("1. Repeatability") == 3 and text.count("2. Seed stability") == 3
    assert "source: seeding" in text  # `none` repeats differ from their first step
    assert "strict runs of seed 0 bitwise identical across 2 repeats" in text  # --quick: one seed
    assert "source: numerics" in text  # the kernel workload at `seeded`
    # every level of every demo study met its expectation (none varies, seeded identical or kernel
    # numerics, strict identical): the studies list shows them all as "met expectations"
    expectation_lines = [line for line in text.splitlines() if line.startswith("  ") and " expected " in line
                         and line.split()[0] in ("strict", "seeded", "none")]
    assert len(expectation_lines) == 7 and all(line.endswith(": met") for line in expectation_lines), expectation_lines
    assert "Dashboard: http://127.0.0.1:" in text
    assert (tmp_path / "demo" / "token").stat().st_mode & 0o777 == 0o600
    assert "(kept from an earlier demo: 1 study; this demo adds its own)" in text
    names = _study_names(tmp_path / "demo")
    assert names[0] == "my own study" and len(names) == 4 and (tmp_path / "demo" / "notes.txt").exists()


def _processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) of every live process (zombies excluded)."""
    stats = {int(e): proc_stat(int(e)) for e in os.listdir("/proc") if e.isdigit()}
    return {pid: (s[1], s[2]) for pid, s in stats.items() if s is not None and s[0] != "Z"}


def _descendants(pid: int) -> set[int]:
    procs, found, frontier = _processes(), set(), {pid}
    while frontier:
        frontier = {p for p, (ppid, _) in procs.items() if ppid in frontier} - found
        found |= frontier
    return found


@pytest.mark.slow
def test_sigterm_stops_the_demo_server_and_worker(tmp_path):
    log = tmp_path / "demo.out"
    with open(log, "wb") as out:
        demo = subprocess.Popen(
            [sys.executable, "-m", "steady.server.cli", "demo", "--quick", "--port", str(free_port()),
             "--data-dir", str(tmp_path / "demo")], cwd=REPO, env=_demo_env(), stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "submitted study" in log.read_text() or demo.poll() is not None, 300, what="the demo to start")
        assert demo.poll() is None, log.read_text()
        started = _descendants(demo.pid)  # the server and worker (each leads its own process group) and theirs
        groups = {_processes()[p][1] for p in started if p in _processes()}
        assert len(groups) >= 2, (started, log.read_text())
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(timeout=120) == 0, log.read_text()[-3000:]
        wait_until(lambda: not (started & set(_processes())), 60, what="the demo's server and worker to exit")
        assert not [p for p, (_, g) in _processes().items() if g in groups]
    finally:
        if demo.poll() is None:
            demo.kill()
