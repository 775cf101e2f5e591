"""Dependency rules: app -> worker.protocol (and the code archive format, worker.codepack) only; worker never imports app; the stats core is pure."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _files(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


def test_worker_never_imports_the_server():
    for path in _files("worker"):
        bad = {n for n in _imports(path) if n.split(".")[0] in {"app", "fastapi", "sqlalchemy", "alembic", "starlette"}}
        assert not bad, f"{path.relative_to(REPO)} imports {bad}"


def test_app_imports_only_the_protocol_of_the_worker():
    # The one CLI dispatches `steady worker` to the worker's own entry point: that is the only exception.
    # worker.codepack is the code archive format (stdlib only): part of the contract like the protocol.
    allowed = {"worker.protocol", "worker.codepack"}
    for path in _files("app"):
        extra = {"worker.cli"} if path == REPO / "app" / "cli.py" else set()
        bad = {n for n in _imports(path) if n.startswith("worker") and n not in allowed | extra}
        assert not bad, f"{path.relative_to(REPO)} imports {bad}"


def test_stats_core_is_pure():
    allowed = {"numpy", "scipy", "math", "dataclasses", "collections", "typing", "functools", "itertools",
               "__future__", "warnings", "statistics", "enum", "bisect", "operator"}
    for path in _files("app/stats"):
        for name in _imports(path):
            root = name.split(".")[0]
            assert root in allowed or name.startswith("app.stats"), f"{path.relative_to(REPO)} imports {name}"


def test_protocol_needs_only_pydantic():
    code = (
        "import sys; import worker.protocol; "
        "bad = [m for m in ('fastapi','sqlalchemy','numpy','torch','tensorflow') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_worker_cli_does_not_import_server_or_frameworks():
    code = (
        "import sys; from app.cli import build_parser; import worker.agent; "
        "bad = [m for m in ('fastapi','sqlalchemy','torch','tensorflow') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
