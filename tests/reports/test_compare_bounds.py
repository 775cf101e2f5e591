"""What ``steady compare`` reads from code archives is bounded and computed once per archive (#51's
findings 2, 4 and 5): which files are specs is found once per archive and kept as small results (never
file bytes) in a cache with a byte budget; a YAML/JSON file over the spec size cap is never parsed; a
deeply nested one is code, not a 500."""

from __future__ import annotations

import json

import pytest

from steady.server.reports import compare as compare_module
from steady.server.reports.differences import SPEC_MAX_BYTES, SPEC_MAX_DEPTH, CodeFiles, is_spec_text
from steady.worker.contract import codepack
from tests.conftest import SQLITE_ONLY

pytestmark = SQLITE_ONLY

SPEC_YAML = "name: x\nworkload: {framework: python, command: [python, t.py]}\n"


def _upload(api, src) -> str:
    packed = codepack.pack(str(src))
    r = api.client.put(f"/api/v1/code/{packed.sha256}", content=packed.data, headers=api.h())
    assert r.status_code == 200, r.text
    return packed.sha256


def _study(api, sha: str) -> int:
    r = api.post("/api/v1/studies", json={"name": "x", "seeds": [0], "determinism": ["seeded"],
                                          "workload": {"framework": "python", "command": ["python", "t.py"]},
                                          "code": {"sha256": sha}})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _compare(api, a: int, b: int) -> dict:
    r = api.get("/api/v1/compare", params={"baseline": a, "candidate": b})
    assert r.status_code == 200, r.text
    return r.json()


def test_nesting_past_the_cap_is_not_a_spec_and_raises_nothing():
    deep = 5000
    assert not is_spec_text("deep.yaml", b"workload: " + b"[" * deep + b"]" * deep)
    assert not is_spec_text("deep.json", b'{"workload": ' + b"[" * deep + b"]" * deep + b"}")
    nested = "workload: " + "[" * SPEC_MAX_DEPTH + "]" * SPEC_MAX_DEPTH  # the top mapping is one level more
    assert not is_spec_text("at.yaml", nested.encode())
    inner = SPEC_MAX_DEPTH - 1
    assert is_spec_text("under.yaml", ("workload: " + "[" * inner + "]" * inner).encode())
    assert is_spec_text("s.json", json.dumps({"workload": {"framework": "python"}}).encode())
    assert not is_spec_text("big.yaml", (SPEC_YAML + "#" * SPEC_MAX_BYTES).encode())


def test_a_deeply_nested_yaml_file_in_the_code_is_compared_as_code(api, tmp_path):
    shas = []
    for i, body in enumerate(["workload: " + "[" * 3000 + "]" * 3000 + "\n", SPEC_YAML]):
        src = tmp_path / f"c{i}"
        src.mkdir()
        (src / "t.py").write_text("print(1)\n")
        (src / "deep.yaml").write_text(body)
        shas.append(_upload(api, src))
    c = _compare(api, _study(api, shas[0]), _study(api, shas[1]))
    assert c["code"]["spec_files"] == ["deep.yaml"]  # a spec on one side: named as a spec file
    assert c["code"]["changed_files"] == []


def test_spec_files_are_found_once_per_archive_and_the_cache_keeps_no_bytes(api, tmp_path, monkeypatch):
    seen: list[str] = []

    def counted(name: str, data: bytes) -> bool:
        seen.append(name)
        return is_spec_text(name, data)

    monkeypatch.setattr(compare_module, "is_spec_text", counted)
    compare_module.code_files_cache.clear()
    shas = []
    for i in range(2):
        src = tmp_path / f"c{i}"
        src.mkdir()
        (src / "t.py").write_text(f"print({i})\n")
        (src / "study.yaml").write_text(SPEC_YAML + f"# {i}\n")
        # over the cap, naming a workload: before, parsed on every compare (a minute of CPU for 20 such)
        (src / "big.yaml").write_text("workload: {a: 1}\nitems: [" + ",".join(["{b: 1}"] * 20000) + "]\n")
        shas.append(_upload(api, src))
    a, b = _study(api, shas[0]), _study(api, shas[1])
    first, second = _compare(api, a, b), _compare(api, a, b)
    assert first == second
    assert first["code"]["spec_files"] == ["study.yaml"] and first["code"]["changed_files"] == ["t.py"]
    assert sorted(seen) == ["study.yaml", "study.yaml"]  # once per archive, and never the file over the cap
    cache = compare_module.code_files_cache
    assert 0 < cache.used <= cache.budget
    for sha in shas:
        files = cache.get(sha, lambda: pytest.fail("computed again"))
        assert isinstance(files, CodeFiles) and not any(isinstance(v, bytes) for v in (files.files or {}).values())


def test_the_cache_stays_within_its_byte_budget():
    def side(i: int, n: int) -> CodeFiles:
        return CodeFiles(f"{i:064x}", {f"file{k}.py": "0" * 64 for k in range(n)}, frozenset())

    one = compare_module.CodeFilesCache.cost(side(0, 100))
    cache = compare_module.CodeFilesCache(budget=3 * one)
    for i in range(10):
        cache.get(f"{i:064x}", lambda i=i: side(i, 100))
        assert cache.used <= cache.budget
    assert [cache.get(f"{i:064x}", lambda: None) is not None for i in (9, 8, 7)] == [True] * 3
    computed = []
    cache.get(f"{0:064x}", lambda: computed.append(0) or side(0, 100))  # the oldest went first
    assert computed == [0]
    cache.get("f" * 64, lambda: side(99, 10_000))  # alone over the budget: answered, not kept
    assert cache.used <= cache.budget
