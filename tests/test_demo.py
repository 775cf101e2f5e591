"""The README's main command, end to end: server, local worker, real training, the report."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, free_port

pytestmark = pytest.mark.slow


def test_demo_runs_a_whole_study(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEADY_")}
    env["NO_COLOR"] = "1"
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
    assert "strict runs bitwise identical" in text
    assert "source: numerics" in text  # the kernel workload at `seeded`
    # every level of every demo study met its expectation (none varies, seeded identical or kernel
    # numerics, strict identical): the studies list shows them all as "met expectations"
    expectation_lines = [line for line in text.splitlines() if line.startswith("  ") and " expected " in line
                         and line.split()[0] in ("strict", "seeded", "none")]
    assert len(expectation_lines) == 7 and all(line.endswith(": met") for line in expectation_lines), expectation_lines
    assert "Dashboard: http://127.0.0.1:" in text
    assert (tmp_path / "demo" / "token").stat().st_mode & 0o777 == 0o600
