"""A user's fresh git folder for tests that drive Steady as a user would: one commit of what is in it."""

from __future__ import annotations

import subprocess
from pathlib import Path


GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]  # an author of its own, no global config


def commit_all(root: Path, message: str = "my script") -> Path:
    """``git init`` in ``root`` and one commit of every file there."""
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    commit_next(root, message)
    return root


def commit_next(root: Path, message: str) -> str:
    """Commit every file of the git folder ``root`` as it is now; the new commit's sha (a planted history is a
    sequence of these)."""
    subprocess.run([*GIT, "add", "-A"], cwd=root, check=True)
    subprocess.run([*GIT, "commit", "-qm", message], cwd=root, check=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, check=True, capture_output=True,
                          text=True).stdout.strip()


def user_env(server, folder: Path) -> dict[str, str]:
    """The environment of a user's CLI in ``folder``: the live server and its user token, no colours, a home
    of its own (no saved login from elsewhere) and a bare PATH."""
    return {"STEADY_SERVER": server.url, "STEADY_TOKEN": server.tokens["user"], "NO_COLOR": "1",
            "HOME": str(folder), "XDG_CONFIG_HOME": str(folder / ".config"), "PATH": "/usr/bin:/bin"}
