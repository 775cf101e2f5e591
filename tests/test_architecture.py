"""Dependency rules (import-linter contracts in pyproject.toml), runtime import checks, migrations as history."""

from __future__ import annotations

import ast
import os
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


def test_import_contracts_hold():
    # The contracts live in pyproject.toml ([tool.importlinter]): the worker never imports the server,
    # the stats core imports no other part of the app, the server takes only the worker's protocol.
    lint = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "broken" in out.stdout and "0 broken" in out.stdout


def test_every_app_package_is_named_in_the_stats_contract():
    # The purity contract lists the app's packages by name: a new package must join the list.
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    stats = next(c for c in config if c.get("source_modules") == ["steady.server.stats"])
    packages = {f"steady.server.{p.stem}" for p in (REPO / "app").iterdir()
                if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()} - {"steady.server.stats"}
    missing = packages - set(stats["forbidden_modules"])
    assert not missing, f"add {sorted(missing)} to the stats purity contract in pyproject.toml"


def test_protocol_needs_only_pydantic():
    code = (
        "import sys; import steady.worker.protocol; "
        "bad = [m for m in ('fastapi','sqlalchemy','numpy','torch','tensorflow') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_worker_cli_does_not_import_server_or_frameworks():
    code = (
        "import sys; from steady.server.cli import build_parser; import steady.worker.agent; "
        "bad = [m for m in ('fastapi','sqlalchemy','torch','tensorflow') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_migrations_do_not_import_live_code():
    # A migration is history: it must not change when a model or a type in app/ changes later.
    for path in sorted((REPO / "migrations" / "versions").glob("*.py")):
        bad = {n for n in _imports(path) if n.split(".")[0] in {"steady", "app", "worker"}}
        assert not bad, f"{path.relative_to(REPO)} imports {bad}"


def test_plain_alembic_cli_upgrades_the_configured_database(tmp_path):
    # alembic.ini carries no URL: env.py falls back to the server's settings (STEADY_DATA_DIR here).
    env = {**os.environ, "STEADY_DATA_DIR": str(tmp_path / "data")}
    env.pop("STEADY_DATABASE_URL", None)
    alembic = [sys.executable, "-m", "alembic", "-c", str(REPO / "alembic.ini")]
    subprocess.run([*alembic, "upgrade", "head"], check=True, cwd=tmp_path, env=env, capture_output=True)
    out = subprocess.run([*alembic, "current"], check=True, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert "(head)" in out.stdout, out.stdout + out.stderr
