"""A user's fresh git folder for tests that drive Steady as a user would: one commit of what is in it."""

from __future__ import annotations

import subprocess
from pathlib import Path


def commit_all(root: Path, message: str = "my script") -> Path:
    """``git init`` in ``root`` and one commit of every file there (an author of its own, no global config)."""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", message], cwd=root, check=True)
    return root
