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


def user_env(server, folder: Path) -> dict[str, str]:
    """The environment of a user's CLI in ``folder``: the live server and its user token, no colours, a home
    of its own (no saved login from elsewhere) and a bare PATH."""
    return {"STEADY_SERVER": server.url, "STEADY_TOKEN": server.tokens["user"], "NO_COLOR": "1",
            "HOME": str(folder), "XDG_CONFIG_HOME": str(folder / ".config"), "PATH": "/usr/bin:/bin"}
