"""Wheels written by hand for tests that install packages without the internet: a wheel is a zip of the
package's files and a ``NAME-VERSION.dist-info`` folder (METADATA, WHEEL, RECORD), served to pip from a local
folder through ``PIP_FIND_LINKS`` and ``PIP_NO_INDEX``."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def write_wheel(folder: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A pure-Python wheel of ``name`` ``version`` holding ``files`` (path → text) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}.dist-info"
    entries = {**files,
               f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
               f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: steady-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for path, text in entries.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}/RECORD,,")
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in entries.items():
            z.writestr(path, text)
        z.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return wheel
