"""Dependency rules (import-linter contracts in pyproject.toml), runtime import checks, migrations as history."""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _package_tree() -> Path:
    """The package as installed, as one folder (scripts/package-tree): steady/ holds only __init__.py in the
    repository, and grimp, like import-linter, finds a package's modules by walking its folder."""
    loader = importlib.machinery.SourceFileLoader("steady_package_tree", str(REPO / "scripts" / "package-tree"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module.ensure()


def _graph():
    """grimp's import graph of ``steady`` read from the package tree (the ``steady`` this process imported is the
    repository's folder, which grimp would walk instead: set aside while grimp looks the package up)."""
    import grimp

    tree = str(_package_tree())
    imported = sys.modules.pop("steady", None)
    sys.path.insert(0, tree)
    try:
        return grimp.build_graph("steady")
    finally:
        sys.path.remove(tree)
        if imported is not None:
            sys.modules["steady"] = imported


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
    lint = [sys.executable, str(REPO / "scripts" / "lint-imports"), "--no-cache"]
    out = subprocess.run(lint, cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "broken" in out.stdout and "0 broken" in out.stdout


def _contracts() -> list[dict]:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _subpackages(container: str) -> set[str]:
    """The packages directly inside ``steady.server`` or ``steady.worker`` (folders with an ``__init__.py``)."""
    folder = _package_tree() / container.replace(".", "/")
    return {p.name for p in folder.iterdir() if (p / "__init__.py").exists()}


def _layer_names(contract: dict) -> set[str]:
    return {name.strip() for layer in contract["layers"] for name in layer.replace(":", "|").split("|")}


def test_contracts_name_packages_only():
    # No hand-kept lists of modules: a contract names a package of steady (a folder with __init__.py), or a
    # third-party distribution; an exception (ignore_imports) names the one import it lets through.
    for contract in _contracts():
        containers = contract.get("containers", [])
        names = [*contract.get("source_modules", []), *contract.get("forbidden_modules", []), *containers]
        names += [f"{c}.{n}" for c in containers for n in _layer_names(contract)] if "layers" in contract else []
        for name in names:
            if name.split(".")[0] != "steady":
                assert "." not in name, f"{contract['name']!r}: {name} is a third party's module, not its package"
                continue
            assert (_package_tree() / Path(*name.split(".")) / "__init__.py").exists(), (
                f"{contract['name']!r} names {name}, which is no package: contracts name packages only")
        assert len(contract.get("forbidden_modules", [])) <= 10, f"{contract['name']!r}: a hand list again?"
        assert len(contract.get("ignore_imports", [])) <= 1, f"{contract['name']!r}: an exception list again?"


def test_every_package_is_on_a_floor():
    # A new package of the server (or a new side of the worker) must take its place in the layers contract.
    for container in ("steady.server", "steady.worker"):
        (contract,) = [c for c in _contracts() if c.get("containers") == [container]]
        assert _layer_names(contract) == _subpackages(container), (
            f"the layers of {container} in pyproject.toml and its packages differ")


def _package_cycles(graph, packages: set[str]) -> list[list[str]]:
    """Cycles (strongly connected components of more than one package) of the package-level graph."""
    edges = {p: {q for q in packages if q != p and graph.direct_import_exists(importer=p, imported=q)}
             for p in packages}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(p: str) -> None:  # Tarjan's algorithm
        index[p] = low[p] = len(index)
        stack.append(p)
        for q in edges[p]:
            if q not in index:
                visit(q)
                low[p] = min(low[p], low[q])
            elif q in stack:
                low[p] = min(low[p], index[q])
        if low[p] == index[p]:
            component = []
            while True:
                q = stack.pop()
                component.append(q)
                if q == p:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for p in sorted(packages):
        if p not in index:
            visit(p)
    return cycles


def test_no_cycle_between_packages():
    # The import graph as grimp reads it (deferred and TYPE_CHECKING imports included): the packages of the
    # server and of the worker import each other in one direction only.
    graph = _graph()
    packages = {f"{c}.{p}" for c in ("steady.server", "steady.worker") for p in _subpackages(c)}
    for package in packages:
        graph.squash_module(package)
    cycles = _package_cycles(graph, packages)
    assert not cycles, f"packages that import each other: {cycles}"


def test_no_cycle_between_modules():
    # Finer still: no two modules import each other, not even through a deferred import inside a function
    # (a cycle hidden that way is still a cycle: neither module can be understood, or moved, alone).
    graph = _graph()
    cycles = _package_cycles(graph, {m for m in graph.modules if m.startswith("steady.")})
    assert not cycles, f"modules that import each other: {cycles}"


def test_the_cycle_finder_finds_a_cycle():
    import grimp

    graph = grimp.ImportGraph()
    for module in ("a", "b", "c"):
        graph.add_module(module)
    graph.add_import(importer="a", imported="b")
    graph.add_import(importer="b", imported="c")
    assert _package_cycles(graph, {"a", "b", "c"}) == []
    graph.add_import(importer="c", imported="a")
    assert _package_cycles(graph, {"a", "b", "c"}) == [["a", "b", "c"]]


def test_protocol_needs_only_pydantic():
    code = (
        "import sys; import steady.worker.contract.protocol; "
        "bad = [m for m in ('fastapi','sqlalchemy','numpy','torch','tensorflow') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_worker_cli_does_not_import_server_or_frameworks():
    code = (
        "import sys; from steady.server.cli import build_parser; build_parser(); import steady.worker.agent.loop; "
        "bad = [m for m in ('fastapi','sqlalchemy','torch','tensorflow') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_the_web_app_imports_scipy_only_where_a_statistic_is_computed():
    # Every server process (each API process, each uvicorn worker, each test's server) imports the app:
    # scipy.stats, optimize and special are a third of that cost and are needed only by a report.
    code = (
        "import sys; import steady.server.web.main; "
        "bad = [m for m in ('scipy.stats','scipy.optimize','scipy.special','scipy.signal') if m in sys.modules]; "
        "assert not bad, bad; "
        "from steady.server.stats.planning import seeds_for_equivalence; seeds_for_equivalence(0.0, 1.0, 0.5); "
        "assert 'scipy.stats' in sys.modules"
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
