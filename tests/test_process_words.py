"""scripts/check-process-words (run by `make lint`): words about how the project's work was organised fail it,
the same words in their ordinary senses pass, and the repository passes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "check-process-words"
# spelled in pieces, so that this file does not fail the check itself
ROUND, SITTING = "wa" "ve", "ses" "sion"


def check(root: Path, *files: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root), *(str(root / f) for f in files)],
                          capture_output=True, text=True, timeout=120)


def test_the_repository_passes():
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


def test_process_words_fail_in_markdown_code_and_tests(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(f"# Speed\n\nMeasured in {ROUND} 3 {SITTING} 11 on a quiet machine.\n")
    (tmp_path / "b.py").write_text(f"x = 1  # the default until the fourth {ROUND}\n")
    (tmp_path / "c.py").write_text(f'"""Run on this {SITTING}\'s machine."""\n')
    out = check(tmp_path, "docs/a.md", "b.py", "c.py")
    assert out.returncode == 1
    lines = out.stdout.splitlines()
    assert [line.split(": ")[0] for line in lines] == ["docs/a.md:3", "docs/a.md:3", "b.py:1", "c.py:1"], lines
    assert f"'{ROUND} 3'" in lines[0] and f"'{SITTING} 11'" in lines[1]


def test_the_same_words_in_their_ordinary_senses_pass(tmp_path):
    (tmp_path / "ok.py").write_text(
        "from sqlalchemy.orm import Session\n"
        f"# the database {SITTING} ends; a {SITTING}-scoped fixture; this {SITTING}'s backend is gone\n"
        f"# a sine {ROUND}form; a {ROUND} of requests hits the server\n")
    out = check(tmp_path, "ok.py")
    assert out.returncode == 0, out.stdout
