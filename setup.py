"""Build hook: a wheel or sdist built from a clone carries the dashboard's browser assets.

They are not in the repository (CONTRIBUTING.md, "Assets and fixtures"): scripts/fetch-assets
puts them into app/dashboard/static from the npm registry at the versions package-lock.json pins.
`make setup` runs it; building a wheel or sdist runs it too when they are missing or stale, so
`pip wheel .` on a fresh clone ships them, and fails with the command to run when it cannot.
An editable install serves the tree in place and leaves that to `make assets`. An sdist already
holds the files (and not the script), so a build from it uses them as they are.
It also lists the packages: pyproject.toml maps steady.server, steady.worker and steady.migrations
onto app/, worker/ and migrations/ (package-dir), and every folder below those is a package of the
same name below them. Everything else about the package is in pyproject.toml.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import tomllib
from pathlib import Path

from setuptools import find_namespace_packages, setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
FETCH = HERE / "scripts" / "fetch-assets"


def _packages() -> list[str]:
    """``steady`` and, for each folder pyproject.toml maps in, its name and every folder below it."""
    mapped = tomllib.loads((HERE / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    packages = ["steady"]
    for name, folder in mapped.items():
        below = find_namespace_packages(where=str(HERE / folder), exclude=["*__pycache__*"])
        packages += [name, *(f"{name}.{p}" for p in below)]
    return packages


def _fetch_assets() -> None:
    if not FETCH.exists():  # building from an sdist: the assets came with it
        return
    loader = importlib.machinery.SourceFileLoader("steady_fetch_assets", str(FETCH))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    try:
        module.ensure()
    except module.AssetError as e:
        raise SystemExit(f"the dashboard's browser assets are not in place: {e}") from None


class BuildPy(build_py):
    def run(self) -> None:
        if not getattr(self, "editable_mode", False):
            _fetch_assets()
            self.__dict__.pop("data_files", None)  # computed lazily: list the fetched files too
        super().run()


class SDist(sdist):
    def run(self) -> None:
        _fetch_assets()
        super().run()


setup(packages=_packages(), cmdclass={"build_py": BuildPy, "sdist": SDist})
