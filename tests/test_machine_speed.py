"""scripts/machine-speed (printed by `make test` before the suite): one line with the two reference figures, and
"torch not installed" where the interpreter cannot import it, never a failure."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "machine-speed"


def _speed(python: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--python", str(python), "--loop", "1000"],
                          capture_output=True, text=True, timeout=120, check=False)


def _interpreter(tmp_path: Path, status: int) -> Path:
    """A stand-in interpreter that ends at once with ``status`` (0: the import "worked")."""
    path = tmp_path / f"python-{status}"
    path.write_text(f"#!/bin/sh\nexit {status}\n")
    path.chmod(0o755)
    return path


def test_one_line_with_both_figures(tmp_path):
    out = _speed(_interpreter(tmp_path, 0))
    assert out.returncode == 0, out.stderr
    assert re.fullmatch(r"machine speed: Python loop \(1,000 additions\) \d+\.\d\d CPU-s, import torch \d+\.\d\d CPU-s "
                        r"\(CONTRIBUTING\.md: read suite times as ratios\)\n", out.stdout), out.stdout


def test_an_interpreter_without_torch_is_said_so(tmp_path):
    out = _speed(_interpreter(tmp_path, 1))
    assert out.returncode == 0 and "torch not installed" in out.stdout, out.stdout + out.stderr
