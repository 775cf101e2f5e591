"""Public third-party scripts the tests run, fetched when a test asks for them (never committed).

Each one is a file inside a pinned source archive on PyPI: ``pip download`` fetches the archive
(through the index pip is configured with), its sha256 is checked against the pin here, and the
file is extracted to ``.cache/fixtures/<name>/`` (git-ignored), where later runs find it. The
file's own sha256 is pinned too, so a test runs exactly the published bytes.

To bump one, change its version and both hashes below (CONTRIBUTING.md, "Assets and fixtures").
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO

CACHE = REPO / ".cache" / "fixtures"


@dataclass(frozen=True)
class Script:
    package: str
    version: str
    sdist_sha256: str
    files: dict[str, str]  # path inside the archive's top folder -> sha256 of the file

    @property
    def sdist(self) -> str:
        return f"{self.package}-{self.version}.tar.gz"


SCRIPTS = {
    # e3nn's tetris example (MIT): an E(3)-equivariant network learns eight tetris shapes, seeds nothing
    "e3nn_tetris": Script(
        package="e3nn", version="0.6.0",
        sdist_sha256="5c2b414e9527aad27d755ae9546596e3f7706f45a21dae71c7deedb6c048e4de",
        files={"examples/tetris.py": "fd2c02c59108f00acf408ae9404d9a496bcb6cac0b4a951fca3844992ed6f4db",
               "LICENSE": "2f875c146f567528415acaf19def2531b65e6dba7fb2485f25d86dd4b3912ad7"}),
}


class FetchError(RuntimeError):
    pass


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _cached(folder: Path, script: Script) -> bool:
    return all((folder / Path(f).name).is_file() and _sha256(folder / Path(f).name) == digest
               for f, digest in script.files.items())


def download_sdist(script: Script, dest: Path) -> Path:
    """The source archive from the configured index, with pip checking it against the pinned hash."""
    req = dest / "requirements.txt"
    req.write_text(f"{script.package}=={script.version} --hash=sha256:{script.sdist_sha256}\n")
    done = subprocess.run(
        # --no-build-isolation: pip reads the archive's metadata with the setuptools already installed here
        # instead of first installing a build environment from the index (1 s instead of minutes)
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
         "--no-build-isolation", "--require-hashes", "--dest", str(dest), "-r", str(req)],
        capture_output=True, text=True, timeout=900, check=False)
    archive = dest / script.sdist
    if done.returncode != 0 or not archive.is_file():
        raise FetchError(f"pip download {script.package}=={script.version} failed: {done.stderr[-2000:]}")
    if _sha256(archive) != script.sdist_sha256:  # pip checked it already; a second look costs nothing
        raise FetchError(f"{script.sdist}: sha256 {_sha256(archive)} is not the pinned {script.sdist_sha256}")
    return archive


def extract(archive: Path, script: Script, dest: Path) -> None:
    """The pinned files from the archive's top folder, flat into dest, each checked against its hash."""
    top = f"{script.package}-{script.version}"
    with tarfile.open(archive) as tar:
        for name, digest in script.files.items():
            member = tar.getmember(f"{top}/{name}")
            source = tar.extractfile(member)
            if source is None:
                raise FetchError(f"{script.sdist}: {name} is not a file")
            data = source.read()
            if hashlib.sha256(data).hexdigest() != digest:
                raise FetchError(f"{script.sdist}: {name} does not have the pinned sha256 {digest}")
            (dest / Path(name).name).write_bytes(data)


def fetch(name: str, cache: Path = CACHE) -> Path:
    """The folder holding the named script's pinned files (fetched on first use, then cached)."""
    script = SCRIPTS[name]
    folder = cache / name
    if _cached(folder, script):
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        work = Path(tmp)
        files = work / "files"
        files.mkdir()
        extract(download_sdist(script, work), script, files)
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(files, folder)  # whole or not at all: a test never sees half a fetch
    return folder
