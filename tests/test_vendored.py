"""Only this project's code in the repository: scripts/check-vendored (run by `make lint`) finds
third-party files among the committed ones, scripts/fetch-assets puts the browser assets in place
from the npm lockfile, and tests/fetched.py hands tests a pinned third-party script."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests import fetched
from tests.conftest import REPO


def _load(script: str):
    loader = importlib.machinery.SourceFileLoader(script.replace("-", "_"), str(REPO / "scripts" / script))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


check = _load("check-vendored")
assets = _load("fetch-assets")

# Headers as bundles and copied files carry them; split so that this file does not carry them itself.
MIT = "Permission is hereby granted, " + "free of charge, to any person obtaining a copy"
SAMPLES = {
    "static/lib.js": "/*" + "! lib v1.0 | MIT */\nvar a=1;\n",
    "static/app.js": "/**\n * @lic" + "ense Apache-2.0\n */\nexport const a = 1;\n",
    "static/x.js": "/*" + "! For lic" + "ense information please see x.js.LICENSE.txt */\n!function(){}();\n",
    "vendor/tool.py": f'"""A tool.\n\nCopy{""}right (c) 2019 Jane Doe\n\n{MIT}\n"""\n',
    "vendor/other.py": "# SPDX-License-" + "Identifier: MIT\nx = 1\n",
    "lib/gpl.c": "/* This program is free software under the GNU General " + "Public License v3 */\n",
    "static/long.js": "var a=" + "1+" * 300 + "1;\n",
    "data/blob.txt": "x" * 4001 + "\n",
    "static/chart.min.js": "var a = 1;\n",
    "static/chart.js.map": "{}\n",
    "static/fonts/inter.woff2": "\0\0binary",
    "docs/third/LICENSE": "some text\n",
    "static/swagger-ui.NOTICE": "text\n",
}
OURS = {
    "app/module.py": '"""A module of ours."""\n\nCOPYRIGHT_YEAR = 2026  # mentions copyright, not a header\n',
    "app/static/ours.js": "// SPDX-License-" + "Identifier: Apache-2.0\n// Copy" + "right (c) 2026 the Steady authors\n"
                          "const x = 1;\n",
    "app/static/style.css": ".a { color: red; }\n" * 50,
    "tests/api/openapi.json": '{"a": "' + "y" * 1500 + '"}\n',  # long, but under the limit outside JS/CSS
    "docs/licenses.md": "uPlot is MIT-licensed; see its package.\n",
}


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(text.encode("latin-1"))


def test_third_party_files_are_found_and_ours_are_not(tmp_path):
    _tree(tmp_path, {**SAMPLES, **OURS})
    found = check.findings([*SAMPLES, *OURS], root=tmp_path)
    assert set(found) == set(SAMPLES), found
    assert any("preserved-licence" in f for f in found["static/lib.js"])
    assert any("JSDoc" in f for f in found["static/app.js"])
    assert any("'Jane Doe'" in f for f in found["vendor/tool.py"]) and any("MIT" in f for f in found["vendor/tool.py"])
    assert any("SPDX-License-Identifier MIT" in f for f in found["vendor/other.py"])
    assert any("minified: a line of 608" in f for f in found["static/long.js"])


def test_a_copy_of_a_fetched_file_is_found_by_its_hash(tmp_path):
    tetris = b"def tetris() -> None:\n    pass\n"
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "fetched.py").write_text(f'PINS = {{"x.py": "{hashlib.sha256(tetris).hexdigest()}"}}\n')
    (tmp_path / "package.json").write_text(json.dumps({"dependencies": {"uplot": "1.0.0"}}))
    _tree(tmp_path, {"node_modules/uplot/dist/u.js": "function u(){}\n", "examples/tetris.py": tetris.decode(),
                     "app/static/renamed.js": "function u(){}\n", "app/static/own.js": "function v(){}\n"})
    found = check.findings(["examples/tetris.py", "app/static/renamed.js", "app/static/own.js"], root=tmp_path)
    assert found == {"examples/tetris.py": ["a copy of a file tests/fetched.py fetches from PyPI"],
                     "app/static/renamed.js": ["a copy of node_modules/uplot/dist/u.js (npm)"]}


def test_the_allow_list_is_short_and_says_why():
    assert 0 < len(check.ALLOWED) <= 5 and all(reason for reason in check.ALLOWED.values())
    assert not check.findings(check.ALLOWED, root=REPO)


def test_the_committed_files_pass_and_a_fetched_asset_would_not():
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "check-vendored")], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    # the assets `make setup` fetched are git-ignored; committed, each one would fail the check
    found = check.findings([f"app/dashboard/static/{dest}" for _, _, dest in assets.FILES], root=REPO)
    assert sorted(found) == sorted(f"app/dashboard/static/{dest}" for _, _, dest in assets.FILES), "run `make assets`"
    assert all(reasons[0].startswith("a copy of ") for reasons in found.values()), found


def test_the_served_assets_are_the_locked_packages_with_two_edits():
    # `make setup` put them in place; --check says whether they match package-lock.json and this script
    assert assets.main(["--check"]) == 0, "run `make assets`"
    lock = json.loads((REPO / "package-lock.json").read_text())["packages"]
    stamp = json.loads(assets.STAMP.read_text())
    assert stamp["packages"] == {n: lock[f"node_modules/{n}"]["version"] for n in stamp["packages"]}
    static = REPO / "app" / "dashboard" / "static"
    for pkg, src, dest in assets.FILES:
        published = (REPO / "node_modules" / pkg / src).read_bytes()
        served = (static / dest).read_bytes()
        assert served == assets.edit(dest, published), dest
        if dest == "apidocs/redoc.standalone.js":
            assert b"cdn.redoc.ly" in published and b"cdn.redoc.ly" not in served
        elif not dest.endswith(".css"):
            assert served == published, dest  # everything but the source-map comments and ReDoc's logo
    for dest in ("apidocs/swagger-ui.css", "apidocs/redoc.standalone.js"):
        assert b"sourceMappingURL=" not in (static / dest).read_bytes()[-200:], dest


def test_an_edit_that_no_longer_applies_stops_the_fetch():
    with pytest.raises(assets.AssetError, match="logo URL"):
        assets.edit("apidocs/redoc.standalone.js", b"var a=1;\n//# sourceMappingURL=redoc.standalone.js.map")
    assert assets.edit("a.css", b".a{}\n/*# sourceMappingURL=a.css.map*/") == b".a{}\n"


def _sdist(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"pkg-1.0/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_a_fetched_script_is_checked_extracted_and_cached(tmp_path, monkeypatch):
    script_py, licence = b"print('epoch 1 | loss 1.0')\n", b"MIT\n"
    archive = _sdist({"examples/run.py": script_py, "LICENSE": licence, "setup.py": b""})
    pin = fetched.Script(package="pkg", version="1.0", sdist_sha256=hashlib.sha256(archive).hexdigest(),
                         files={"examples/run.py": hashlib.sha256(script_py).hexdigest(),
                                "LICENSE": hashlib.sha256(licence).hexdigest()})
    downloads = []

    def download(script, dest):
        downloads.append(script)
        (dest / script.sdist).write_bytes(archive)
        return dest / script.sdist

    monkeypatch.setitem(fetched.SCRIPTS, "demo", pin)
    monkeypatch.setattr(fetched, "download_sdist", download)
    folder = fetched.fetch("demo", cache=tmp_path / "cache")
    assert sorted(p.name for p in folder.iterdir()) == ["LICENSE", "run.py"]
    assert (folder / "run.py").read_bytes() == script_py
    assert fetched.fetch("demo", cache=tmp_path / "cache") == folder and len(downloads) == 1  # cached
    (folder / "run.py").write_text("tampered\n")
    fetched.fetch("demo", cache=tmp_path / "cache")  # a changed copy is fetched again
    assert (folder / "run.py").read_bytes() == script_py and len(downloads) == 2
    # an archive whose file is not the pinned one is refused, and nothing is cached
    monkeypatch.setitem(fetched.SCRIPTS, "bad", fetched.Script(
        package="pkg", version="1.0", sdist_sha256=pin.sdist_sha256, files={"examples/run.py": "0" * 64}))
    with pytest.raises(fetched.FetchError, match="pinned sha256"):
        fetched.fetch("bad", cache=tmp_path / "cache")
    assert not (tmp_path / "cache" / "bad").exists()
