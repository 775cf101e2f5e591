"""A cached overlay environment: this interpreter's packages, but some of them at pinned versions.

A stack may pin packages (``packages: {numpy: "2.0.2"}``); a worker runs that stack's runs in an overlay
environment: a virtual environment without pip whose ``.pth`` line adds this environment's site-packages as a
site directory (so its packages and their own ``.pth`` files stay importable), with the pinned versions
installed into the overlay's own site-packages by ``pip install --no-deps --target`` (they come first on
``sys.path``). pip is this interpreter's, run with this process's environment: it installs from the index pip
is configured with here (``PIP_INDEX_URL``, ``PIP_EXTRA_INDEX_URL``, ``PIP_FIND_LINKS``, ``PIP_NO_INDEX``,
pip.conf). ``--no-deps``: the pinned packages' dependencies are the base environment's.

An overlay is built once per (pinned packages, Python version, base environment) under ``cache_dir``, under a
file lock (two runs or two processes asking at once build it once), and checked before it is used: each
pinned distribution is the one found first, at its pinned version, and its top-level modules import from the
overlay. A build that fails raises :class:`EnvironmentBuildError` with pip's or the check's reason; nothing
half-built is ever marked ready. ``steady demo --controls`` builds its NumPy environment with the same code.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import subprocess
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path

PIP_TIMEOUT_S = 900.0
_NAME = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)


class EnvironmentBuildError(Exception):
    """The overlay could not be built or is not what was pinned."""


def env_root(packages: Mapping[str, str], cache_dir: str | Path, base_purelib: str) -> Path:
    """Where the overlay pinning ``packages`` over ``base_purelib`` is cached. The base's path is part of the
    key: the overlay reaches the base's packages through a ``.pth`` line, so one built over another (or since
    deleted) virtual environment must not be reused."""
    from packaging.utils import canonicalize_name  # PEP 503, as pip and the spec's check compare names

    pins = sorted((canonicalize_name(n), v) for n, v in packages.items())
    key = json.dumps([pins, os.path.realpath(base_purelib)])
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    readable = "-".join(f"{n}-{v}" for n, v in pins)[:80]
    return Path(cache_dir) / f"{readable}-py{sys.version_info.major}{sys.version_info.minor}-{digest}"


def overlay_python(packages: Mapping[str, str], cache_dir: str | Path) -> str:
    """The interpreter of the overlay environment pinning ``packages`` (``{name: exact version}``), built now if
    it is not cached yet. Raises :class:`EnvironmentBuildError` when it cannot be built."""
    for name in packages:
        if not _NAME.match(name):
            raise EnvironmentBuildError(f"{name!r} is not a package name")
    root = env_root(packages, cache_dir, sysconfig.get_paths()["purelib"])
    python = root / "bin" / "python"
    done = root / ".ready"
    if done.exists():
        return str(python)
    # Two runs (or two processes) must not build the same environment at once: the second waits for the
    # first and then finds it ready.
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return str(python)
        return _build(dict(packages), root, python, done)


def _run(argv: list[str], what: str) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvironmentBuildError(f"{what}: {exc}") from None
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-6:]
        raise EnvironmentBuildError(f"{what} failed (exit {out.returncode}): " + " / ".join(tail))
    return out.stdout


_CHECK = r"""
import importlib, importlib.metadata as md, json, os, sys
site, pins = sys.argv[1], json.loads(sys.argv[2])
site = os.path.realpath(site)
try:
    from packaging.version import Version as same
except ImportError:
    same = str
for name, want in pins.items():
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        print(f"{name} is not installed in the environment"); sys.exit(1)
    where = os.path.realpath(str(dist.locate_file("")))
    if where != site:
        print(f"{name} {dist.version} is found at {where}, before the pinned one"); sys.exit(1)
    if same(dist.version) != same(want):
        print(f"{name} is {dist.version} in the environment, not the pinned {want}"); sys.exit(1)
    # its top-level modules: a package (a folder with __init__.py) or a .py file (not scripts, data, .libs)
    tops = {f.parts[0] for f in dist.files or () if len(f.parts) == 2 and f.parts[1] == "__init__.py"}
    tops |= {f.parts[0][:-3] for f in dist.files or () if len(f.parts) == 1 and f.parts[0].endswith(".py")}
    for mod in sorted(tops):
        if not mod.isidentifier():
            continue
        try:
            m = importlib.import_module(mod)
        except Exception as exc:
            print(f"{name} {want}: import {mod} failed: {type(exc).__name__}: {exc}"); sys.exit(1)
        f = getattr(m, "__file__", None)
        if f and not os.path.realpath(f).startswith(site + os.sep):
            print(f"{name} {want}: {mod} imports from {f}, not from the pinned install"); sys.exit(1)
"""


def _build(packages: dict[str, str], root: Path, python: Path, done: Path) -> str:
    pins = " ".join(f"{n}=={v}" for n, v in sorted(packages.items()))
    _run([sys.executable, "-m", "venv", "--without-pip", "--clear", str(root)], "creating the environment")
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                "reading the environment's site-packages").strip()
    # the base's packages come after the overlay's own site-packages, so the pinned versions win; as a site
    # directory, so the base's own .pth files (editable installs) still apply
    base = sysconfig.get_paths()["purelib"]
    Path(site, "_steady_base_env.pth").write_text(f"import site; site.addsitedir({base!r})\n")
    _run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
          "--target", site, *(f"{n}=={v}" for n, v in sorted(packages.items()))],
         f"pip install {pins} from the worker's package index")
    try:
        check = subprocess.run([str(python), "-c", _CHECK, site, json.dumps(packages)], capture_output=True,
                               text=True, timeout=PIP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvironmentBuildError(f"checking {pins}: {exc}") from None
    if check.returncode != 0:
        why = check.stdout.strip() or (check.stderr.strip().splitlines() or ["no output"])[-1]
        raise EnvironmentBuildError(f"the environment pinning {pins} is not what was pinned: {why}")
    done.write_text(json.dumps(packages, sort_keys=True) + "\n")
    return str(python)
