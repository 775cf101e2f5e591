"""scripts/check-figures (run by `make lint`): a table of measured figures in docs/ names a command of the repository
that regenerates it; a table without one, or naming a script that does not exist, fails it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "check-figures"
TABLE = "| machine | time | share |\n|---|---|---|\n| quiet | 18.5 s | 42% |\n| busy | 24.1 s | 57% |\n"


def check(root: Path, text: str) -> subprocess.CompletedProcess[str]:
    (root / "docs").mkdir(exist_ok=True)
    (root / "bench").mkdir(exist_ok=True)
    (root / "bench" / "speed.py").write_text("")
    (root / "Makefile").write_text("results: bench\n\tpython bench/speed.py\n")
    (root / "docs" / "page.md").write_text(text)
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root)], capture_output=True, text=True,
                          timeout=120)


def test_the_repositorys_docs_pass():
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_figure_table_without_a_command_fails(tmp_path):
    out = check(tmp_path, f"# Speed\n\nMeasured on a quiet day.\n\n{TABLE}")
    assert out.returncode == 1 and out.stdout.startswith("docs/page.md:5:"), out.stdout


def test_a_command_that_does_not_exist_fails(tmp_path):
    out = check(tmp_path, f"# Speed\n\nRegenerate: `python bench/gone.py` or `make nothing`.\n\n{TABLE}")
    assert out.returncode == 1, out.stdout


def test_a_script_a_make_target_or_a_cell_naming_its_command_passes(tmp_path):
    for text in (f"# Speed\n\nRegenerate: `.venv/bin/python bench/speed.py`.\n\n{TABLE}",
                 f"# Speed\n\n{TABLE}\nRegenerate with `make results` (commit `abc1234`).\n",
                 "# Speed\n\n| what | time |\n|---|---|\n| load (`bench/speed.py`) | 1.5 s |\n| read | 2.5 s |\n"
                 "| write | 3.5 s |\n"):
        out = check(tmp_path, text)
        assert out.returncode == 0, text + out.stdout


def test_numbers_that_are_not_measurements_pass_when_marked(tmp_path):
    nominal = "| rule | level |\n|---|---|\n| a | 1% |\n| b | 5% |\n| c | 2.5% |\n"
    assert check(tmp_path, f"# Levels\n\n{nominal}").returncode == 1
    assert check(tmp_path, f"# Levels\n\n<!-- not measured -->\n{nominal}").returncode == 0
